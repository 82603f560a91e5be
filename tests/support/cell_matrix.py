"""The matrix cell's measured facts for tests whose expectation depends on the pair installed.

``cell_unresolved()`` is the cell's ``unresolved`` list in ``matrix/vllm.toml``: the vLLM names that keep
``import vllm_omni`` from working without vllm_compat, measured from the real wheels (``nox -s refresh``), never
from the code under test. A nox cell passes it as ``VLLM_COMPAT_EXPECT_UNRESOLVED``; run outside nox, the cell is
looked up by the installed vLLM and vllm-omni versions. ``names_an_unresolved(text, names)`` says whether ``text``
carries the ImportError of one of them (``No module named 'a.b'`` for a module, ``cannot import name 'N' from
'a.b'`` for a name).
"""

from __future__ import annotations

import os
from pathlib import Path

from vllm_compat.detect.versions import installed_version

MATRIX = Path(__file__).resolve().parents[2] / "matrix" / "vllm.toml"


def cell_unresolved() -> list[str]:
    """The installed pair's ``unresolved`` names ([] where no matrix cell has the pair, or it lists none)."""
    listed = os.environ.get("VLLM_COMPAT_EXPECT_UNRESOLVED")
    if listed is not None:
        return [name for name in listed.split(",") if name]
    import tomllib

    vllm, omni = installed_version("vllm"), installed_version("vllm-omni")
    for cell in tomllib.loads(MATRIX.read_text())["cell"]:
        if cell.get("vllm") == vllm and cell.get("vllm_omni") == omni and "unresolved" in cell:
            return list(cell["unresolved"])
    return []


def names_an_unresolved(text: str, names) -> bool:
    """Whether ``text`` holds the ImportError of one of ``names`` (dotted paths: a module, or a module's name)."""
    for name in names:
        module, _, leaf = name.rpartition(".")
        if f"No module named '{name}'" in text or f"cannot import name '{leaf}' from '{module}'" in text:
            return True
    return False
