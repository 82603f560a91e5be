"""The catalogue and the drift-point modules stay in sync, and only a drift point's own module names its target."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import vllm_compat
from vllm_compat.patches import CATALOGUE, PatchEntry, drift_point

PACKAGE = Path(vllm_compat.__file__).parent
INTERFACE = ("ENTRY", "detect_static", "detect_runtime", "decide", "locate", "prepare", "install", "uninstall",
             "in_place", "compare", "facts_dict")
KINDS = {"patch", "stand-in", "alias", "adapter"}
# Layers that must never name a target: they iterate the catalogue. detect/ describes what the installed
# packages can do (the loader's shape is a capability doctor shows), so it reads vllm-omni's files by path.
GENERIC_MODULES = ("activate.py", "reporting.py", "cli.py", "config.py", "decide.py", "hooks.py",
                   "pytest_plugin.py", "__init__.py", "check.py", "patches/__init__.py", "patches/_method.py")
DRIFT_POINT_PACKAGES = ("vllm_compat.patches", "vllm_compat.bridges")


def _drift_point_modules() -> set[str]:
    found = set()
    for package_name in DRIFT_POINT_PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except ImportError:
            continue
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_") and info.name != "catalogue":
                found.add(f"{package_name}.{info.name}")
    return found


def test_ids_are_unique_and_every_field_is_filled():
    ids = [entry.id for entry in CATALOGUE]
    assert len(ids) == len(set(ids)), ids
    for entry in CATALOGUE:
        assert entry.kind in KINDS, entry.id
        assert all(getattr(entry, name) for name in PatchEntry.__slots__), entry.to_dict()
        assert re.fullmatch(r"[a-z0-9_]+", entry.id), entry.id


def test_every_target_lives_in_a_served_package():
    """The catalogue's hooks are registered on the first lookup of a served package: a target outside them would
    be imported before its hook exists."""
    assert {entry.target_module.split(".")[0] for entry in CATALOGUE} <= set(vllm_compat.SERVED_PACKAGES)


def test_every_entry_has_a_module_and_every_module_an_entry():
    assert {entry.module for entry in CATALOGUE} == _drift_point_modules()


@pytest.mark.parametrize("entry", CATALOGUE, ids=[e.id for e in CATALOGUE])
def test_every_module_answers_the_whole_interface_and_opens_with_why_when_retire(entry):
    module = drift_point(entry)
    missing = [name for name in INTERFACE if not hasattr(module, name)]
    assert missing == [], f"{entry.module} lacks {missing}"
    assert module.ENTRY is entry
    doc = module.__doc__ or ""
    for heading in ("Why:", "When:", "Retire when:"):
        assert heading in doc, f"{entry.module}'s docstring has no {heading!r}"


@pytest.mark.parametrize("entry", CATALOGUE, ids=[e.id for e in CATALOGUE])
def test_no_generic_module_names_a_target(entry):
    needles = {entry.target_module, entry.target, entry.target.rsplit(".", 1)[-1], entry.module.rsplit(".", 1)[-1]}
    for relpath in GENERIC_MODULES:
        path = PACKAGE / relpath
        if not path.exists():
            continue
        text = path.read_text()
        named = sorted(needle for needle in needles if needle in text)
        assert named == [], f"vllm_compat/{relpath} names {named}, the target of {entry.id}"


def test_drift_point_modules_import_neither_torch_nor_vllm(tmp_path):
    """The static doctor imports every drift point: none may pull in torch, vLLM or vllm-omni."""
    from conftest import run_python

    result = run_python(
        "import sys\n"
        "from vllm_compat.patches import CATALOGUE, drift_point\n"
        "[drift_point(e) for e in CATALOGUE]\n"
        "print(sorted(m for m in ('torch', 'vllm', 'vllm_omni', 'wrapt') if m in sys.modules))\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"


def test_readme_catalogue_table_lists_every_entry():
    readme = (PACKAGE.parent / "README.md").read_text()
    for entry in CATALOGUE:
        assert f"| `{entry.id}` | {entry.kind} |" in readme, f"README's catalogue table lacks {entry.id}"
