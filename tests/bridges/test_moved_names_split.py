"""The alias bridge's split-module rows on the real wheels: a module vLLM dropped whose names went to several new
modules (vLLM 0.29+: ``vllm.entrypoints.openai.engine.protocol``, with its package ``openai.engine``; vllm-omni
0.24.0's server imports 14 names from it) is put back as a module holding vLLM's own objects.

Unpatched, the import fails with the real ModuleNotFoundError; with the bridge each name is the object vLLM defines
in its new home (``is``; the definitions themselves are held to vLLM 0.24.0's in ``test_moved_names_targets``);
the bridge never answers for a module vLLM has; revert takes out exactly the modules and parent attributes it
added; the decision ``provides`` the old path and each package it creates exactly where the import creates them
(what the import-drift report and ``openai_engine_serving`` read).
"""

from __future__ import annotations

import json

import pytest

from conftest import needs_startup_hook, needs_vllm, run_python
from vllm_compat.bridges import moved_names as bridge
from vllm_compat.detect.static import StaticSite

STATIC = bridge.DRIFT_POINT.detect_static(StaticSite.installed())
SPLIT = [a for a in STATIC.installable if a.moved]
needs_split = pytest.mark.skipif(
    not SPLIT, reason="needs a vLLM that split a module the installed vllm-omni imports (vLLM 0.29+ with vllm-omni "
    f"0.24.0: openai.engine.protocol); here the installable module aliases are "
    f"{[a.old for a in STATIC.installable if a.kind == 'module'] or 'none'}")


def test_split_rows_are_well_formed():
    """Every split row of the generated table: a module, no single new home, names and their new homes agree."""
    for row in bridge.table():
        if not row.moved:
            continue
        assert row.kind == "module" and row.new is None, row.old
        assert tuple(name for name, _ in row.moved) == tuple(sorted(row.names)), row.old
        assert len({new.rpartition(".")[0] for _, new in row.moved}) > 1, f"{row.old}: one new module is no split"


@needs_vllm
def test_never_answers_for_a_module_vllm_has():
    """The finder's rule on a module vLLM ships (``vllm.envs``): given it as a split path or as a package, it
    defers to the finder that finds vLLM's file."""
    import vllm

    finder = bridge.AliasFinder()
    finder.split["vllm.envs"] = (("x", "vllm.envs.x"),)
    finder.packages.add("vllm.v1")
    assert finder.find_spec("vllm.envs", vllm.__path__) is None
    assert finder.find_spec("vllm.v1", vllm.__path__) is None
    assert finder.find_spec("vllm.vllm_compat_no_such_module", vllm.__path__) is None  # not its path at all


@needs_split
@pytest.mark.parametrize("env", [{"VLLM_COMPAT_DISABLE": "1"}, {"VLLM_COMPAT_DISABLE_PATCHES": bridge.DRIFT_POINT.entry.id}],
                         ids=["disabled", "entry-disabled"])
def test_unpatched_split_module_fails_with_the_real_import_error(env):
    fact = SPLIT[0]
    missing = (fact.parents or (fact.old,))[0]
    result = run_python(f"""
        try:
            import {fact.old}
        except ImportError as exc:
            print("IMPORT-ERROR", type(exc).__name__, exc)
        else:
            print("IMPORTED")
        """, env=env, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"IMPORT-ERROR ModuleNotFoundError No module named '{missing}'" in result.stdout, result.stdout[-2000:]


@needs_split
@needs_startup_hook
def test_split_module_holds_vllms_own_objects_and_revert_removes_exactly_it():
    fact = SPLIT[0]
    names = [name for name, _ in fact.moved]
    result = run_python(f"""
        import importlib, json, sys
        import vllm_compat
        from vllm_compat.drift import is_ours
        old = importlib.import_module("{fact.old}")
        out = {{"own": {{}}, "ours": is_ours(old, "moved_names")}}
        for name in {names!r}:
            obj = getattr(old, name)
            home = sys.modules[obj.__module__]  # where vLLM defines it: the object must be that very one
            out["own"][name] = [obj.__module__.startswith("vllm.") and not obj.__module__.startswith(
                "vllm_compat"), getattr(home, obj.__name__, None) is obj]
        made = [m for m in {list(fact.parents)!r} + ["{fact.old}"]]
        out["packages_ours"] = [is_ours(sys.modules[m], "moved_names") for m in made]
        decision = next(d for d in vllm_compat.current_decisions() if d.name == "moved_names")
        out["provided"] = [m in decision.provides for m in made]
        parent, _, leaf = made[0].rpartition(".")
        vllm_compat.revert()
        out["gone"] = [m not in sys.modules for m in made] + [leaf not in vars(sys.modules[parent])]
        try:
            importlib.import_module("{fact.old}")
        except ModuleNotFoundError as exc:
            out["unpatched"] = str(exc)
        vllm_compat.apply()
        again = importlib.import_module("{fact.old}")
        out["back"] = again is not old and getattr(again, {names[0]!r}) is getattr(old, {names[0]!r})
        print("RESULT", json.dumps(out))
        """, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    made = [*fact.parents, fact.old]
    assert out == {"own": {name: [True, True] for name in names}, "ours": True,
                   "packages_ours": [True] * len(made), "provided": [True] * len(made),
                   "gone": [True] * (len(made) + 1), "unpatched": f"No module named '{made[0]}'", "back": True}, out


def _names_vllm_omni_imports(module: str, files: set) -> set:
    """What the installed vllm-omni's ``files`` take from ``module`` (``from module import ...``), read with ast."""
    import ast
    import importlib.util
    from pathlib import Path

    root = Path(importlib.util.find_spec("vllm_omni").origin).parents[1]
    names = set()
    for relpath in files:
        path = root / relpath
        if path.is_file():
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == module:
                    names.update(alias.name for alias in node.names)
    return names


@needs_split
@pytest.mark.parametrize("order", ["table", "reversed"])
def test_split_module_holds_every_name_the_installed_vllm_omni_imports_from_it(monkeypatch, order):
    """Where the rows of several vllm-omni releases match this vLLM (0.29-0.33 and 0.34: vllm-omni 0.28.0's
    13-name openai.engine.protocol row beside 0.24.0 / 0.26.0's 14-name one), the fact holds every name the
    installed vllm-omni imports from the old module, whichever row the table lists first (on vLLM 0.34 + vllm-omni
    0.24.0 the first row gave 13 names: its serving_chat's PromptTokenUsageInfo import failed)."""
    if order == "reversed":
        rows = bridge.table()
        monkeypatch.setattr(bridge, "table", lambda: tuple(reversed(rows)))
    facts = [a for a in bridge.DRIFT_POINT.detect_static(StaticSite.installed()).installable if a.moved]
    assert [a.old for a in facts] == [a.old for a in SPLIT]
    for fact in facts:
        files = {row_file for row in bridge.table() if row.old == fact.old for row_file in row.importers}
        wanted = _names_vllm_omni_imports(fact.old, files)
        assert wanted and wanted <= {name for name, _ in fact.moved}, (fact.old, wanted - {n for n, _ in fact.moved})


@needs_split
def test_static_decision_provides_the_split_module_and_its_packages():
    """Static side of the same fact: the import-drift report (doctor / check) counts the old path as an unresolved
    import bridged by this entry, the decision provides it and each package above it; with the entry disabled,
    nothing of it."""
    from vllm_compat.config import Controls
    from vllm_compat.decide import plan
    from vllm_compat.reporting import Report

    site = StaticSite.installed()
    entry = bridge.DRIFT_POINT.entry.id
    for controls, expected in ((Controls(), entry), (Controls(disabled_patches=frozenset({entry})), None)):
        decisions = [d for _, _, d in plan(site, controls)]
        decision = next(d for d in decisions if d.name == entry)
        drift = Report(mode="static", static=site.environment, patches=decisions).import_drift
        for fact in SPLIT:
            assert fact.old in drift.names, drift.names
            assert drift.bridged_by(fact.old) == expected
            for path in (*fact.parents, fact.old):
                assert (path in decision.provides) == (expected is not None), (path, decision.provides)
