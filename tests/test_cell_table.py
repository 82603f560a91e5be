"""The README's table of every matrix cell is generated from ``matrix/vllm.toml`` and is not stale;
``python matrix/cell_table.py`` regenerates it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading matrix/vllm.toml needs Python >= 3.11 (tomllib)")

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("matrix_cell_table", ROOT / "matrix" / "cell_table.py")
cell_table = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cell_table)


def _cells() -> list[dict]:
    return tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]


def test_readme_lists_every_cell_as_the_matrix_says():
    readme = (ROOT / "README.md").read_text()
    assert cell_table.readme_text(readme, _cells()) == readme, "run python matrix/cell_table.py"
    table = readme.split(cell_table.BEGIN, 1)[1].split(cell_table.END, 1)[0]
    assert [line.split(" | ")[0].removeprefix("| ") for line in table.splitlines() if line.startswith("| v")] == \
        [cell["id"] for cell in _cells()]


def test_a_changed_cell_makes_the_table_stale():
    """The check can fail: a cell whose serve entrypoint no longer starts, or that leaves the rotation, shows."""
    readme = (ROOT / "README.md").read_text()
    cells = _cells()
    cell = next(c for c in cells if c.get("entrypoints", {}).get("serve") == "works_with_vllm_compat")
    cell["entrypoints"] = dict(cell["entrypoints"], serve="will_not_start")
    assert cell_table.readme_text(readme, cells) != readme
    assert f"| {cell['id']} |" in readme and "**will not start**" in cell_table.readme_text(readme, cells)
    cells = _cells()
    next(c for c in cells if not c.get("default") and c.get("rotation") is not False)["rotation"] = False
    assert cell_table.readme_text(readme, cells) != readme
