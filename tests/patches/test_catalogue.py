"""The catalogue and the drift-point modules stay in sync, and only a drift point's own module names its target."""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from pathlib import Path

import pytest

import vllm_compat
from vllm_compat.bridges._module_stand_in import ModuleStandIn
from vllm_compat.catalogue import CATALOGUE, KINDS, Entry, drift_point
from vllm_compat.drift import DriftPoint

PACKAGE = Path(vllm_compat.__file__).parent
# Layers that must never name a target nor a target's facts: they iterate the catalogue, or describe what every
# drift point reads (detect/).
GENERIC_MODULES = ("activate.py", "reporting.py", "cli.py", "config.py", "decide.py", "hooks.py", "drift.py",
                   "pytest_plugin.py", "__init__.py", "check.py", "patches/__init__.py", "patches/_method.py",
                   *sorted(str(p.relative_to(PACKAGE)) for p in (PACKAGE / "detect").glob("*.py")
                           # measured data, not a layer: the behavioural scan's findings on the native pairs
                           if p.name != "behaviour_baselines.py"))
# The loader drift point's facts, its variants and its switch: its package's alone.
LOADER_FACTS = ("uses_meta_device", "finalize", "DiffusersPipelineLoader", "meta_safe", "legacy", "diffusers_loader",
                "LOADER_VARIANT", "loader_variant", "meta_device")
DRIFT_POINT_PACKAGES = ("vllm_compat.patches", "vllm_compat.bridges")


def _drift_point_modules() -> set[str]:
    found = set()
    for package_name in DRIFT_POINT_PACKAGES:
        package = importlib.import_module(package_name)
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_") and info.name != "catalogue":
                found.add(f"{package_name}.{info.name}")
    return found


def test_ids_are_unique_and_every_field_is_filled():
    ids = [entry.id for entry in CATALOGUE]
    assert len(ids) == len(set(ids)), ids
    for entry in CATALOGUE:
        assert entry.kind in KINDS, entry.id
        assert all(getattr(entry, name) for name in Entry.__slots__), entry.to_dict()
        assert re.fullmatch(r"[a-z0-9_]+", entry.id), entry.id


def test_every_target_lives_in_a_served_package():
    """The catalogue's hooks are registered on the first lookup of a served package: a target outside them would
    be imported before its hook exists."""
    assert {entry.target_module.split(".")[0] for entry in CATALOGUE} <= set(vllm_compat.SERVED_PACKAGES)


def test_every_entry_has_a_module_and_every_module_an_entry():
    assert {entry.module for entry in CATALOGUE} == _drift_point_modules()


@pytest.mark.parametrize("entry", CATALOGUE, ids=[e.id for e in CATALOGUE])
def test_every_module_exports_one_drift_point_that_finds_its_own_row(entry):
    point = drift_point(entry)
    assert isinstance(point, DriftPoint), f"{entry.module}.DRIFT_POINT is {point!r}"
    assert type(point).__module__ == entry.module, "the drift point's class is defined in its own module"
    assert point.entry is entry
    for name in ("detect_static", "detect_runtime", "decide", "install", "uninstall"):
        assert getattr(type(point), name) is not getattr(DriftPoint, name), f"{entry.id} leaves {name} undefined"


@pytest.mark.parametrize("entry", CATALOGUE, ids=[e.id for e in CATALOGUE])
def test_drift_point_modules_do_not_import_the_catalogue(entry):
    """The catalogue names the drift points by string; a drift point finds its row through ``DriftPoint.entry``."""
    source = Path(importlib.import_module(entry.module).__file__).read_text()
    imported = {node.module for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ImportFrom)}
    assert not {m for m in imported if m and m.endswith("catalogue")}, f"{entry.module} imports the catalogue"


@pytest.mark.parametrize("entry", CATALOGUE, ids=[e.id for e in CATALOGUE])
def test_no_generic_module_names_a_target(entry):
    # The full path always; the attribute and the module's name where they are distinctive (a module stand-in's
    # target is a plain word such as "metadata", which generic code may well say).
    distinctive = [entry.target, entry.target.rsplit(".", 1)[-1], entry.module.rsplit(".", 1)[-1]]
    needles = {entry.target_path, *(n for n in distinctive if "_" in n.strip("_") or n[:1].isupper())}
    if isinstance(drift_point(entry), ModuleStandIn):  # a removed submodule ("metadata"): its path is its name
        needles = {entry.target_module, entry.target_path, entry.module.rsplit(".", 1)[-1]}
    for relpath in GENERIC_MODULES:
        path = PACKAGE / relpath
        if not path.exists():
            continue
        text = path.read_text()
        named = sorted(needle for needle in needles if needle in text)
        assert named == [], f"vllm_compat/{relpath} names {named}, the target of {entry.id}"


def test_no_generic_module_names_the_loaders_facts():
    for relpath in GENERIC_MODULES:
        text = (PACKAGE / relpath).read_text()
        named = sorted(fact for fact in LOADER_FACTS if fact.lower() in text.lower())
        assert named == [], f"vllm_compat/{relpath} names {named}, facts of the loader drift point"


def test_drift_point_modules_import_neither_torch_nor_vllm(tmp_path):
    """The static doctor imports every drift point: none may pull in torch, vLLM or vllm-omni."""
    from conftest import run_python

    result = run_python(
        "import sys\n"
        "from vllm_compat.catalogue import CATALOGUE, drift_point\n"
        "[drift_point(e) for e in CATALOGUE]\n"
        "print(sorted(m for m in ('torch', 'vllm', 'vllm_omni', 'wrapt') if m in sys.modules))\n"
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
