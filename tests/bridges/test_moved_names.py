"""The alias bridge on the real wheels: an old import path vLLM moved fails unpatched with the real ImportError and
resolves to the new definition with the bridge; the bridge stays out where vLLM has the name; uninstall removes
what it added; and the generator matches by source (a same-named, unrelated definition is never aliased)."""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

import pytest

from conftest import needs_startup_hook, needs_vllm, run_python
from vllm_compat.bridges import MARK, HostKind, is_ours, provided_by_decisions
from vllm_compat.bridges import moved_names as bridge
from vllm_compat.config import Controls, read_controls
from vllm_compat.decide import Action, decide_entry, plan
from vllm_compat.detect.static import SourceTree, StaticSite

ROOT = Path(__file__).resolve().parents[2]
STATIC = bridge.DRIFT_POINT.detect_static(StaticSite.installed())
NAME_ALIASES = [a for a in STATIC.installable if a.kind == "name"]
MODULE_ALIASES = [a for a in STATIC.installable if a.kind == "module"]
WHOLE_MODULE_ALIASES = [a for a in MODULE_ALIASES if not a.moved]  # split modules: test_moved_names_split.py
HAS_IT = [a for a in STATIC.aliases if a.state == bridge.State.VLLM_HAS_IT]
needs_name_alias = pytest.mark.skipif(
    not NAME_ALIASES, reason="needs a vLLM that moved a name the installed vllm-omni imports (identical or accepted "
    f"in the alias table); here: {sorted({a.state for a in STATIC.aliases}) or STATIC.host}")
needs_module_alias = pytest.mark.skipif(
    not WHOLE_MODULE_ALIASES, reason="needs a vLLM that moved a whole module the installed vllm-omni imports (identical or "
    "accepted in the alias table)")
# Old paths of the table another bridge provides here (a stand-in; vLLM 0.31-0.33 + vllm-omni 0.30.0:
# processing.processor.MultiModalProcessingInfo, a rejected row, by multimodal_processing_info).
STOOD_IN = {old: entry for old, entry in provided_by_decisions(
    d for _, _, d in plan(StaticSite.installed(), read_controls())).items() if entry != bridge.DRIFT_POINT.entry.id}
STOOD_IN_FACTS = [a for a in STATIC.aliases if a.kind == "name" and a.old in STOOD_IN]
WHEELS = Path("/tmp/vc-wheels")


def _wheel(pattern: str) -> Path | None:
    for directory in (WHEELS, Path.home() / ".cache" / "vllm-compat" / "wheels"):
        found = sorted(directory.glob(pattern)) if directory.is_dir() else []
        if found:
            return found[0]
    return None


def test_decision_table():
    fact = bridge.AliasFact("vllm.a.b", "vllm.c.b", "name", bridge.State.ALIAS, ("vllm_omni.x:1 (module)",))
    held = bridge.AliasFact("vllm.a.c", "vllm.c.c", "name", bridge.State.UNREVIEWED, ("vllm_omni.x:2 (module)",))
    patched = bridge.DRIFT_POINT.decide(bridge.AliasFacts(HostKind.LACKS, (fact, held)), Controls())
    assert patched.action == Action.PATCHED and patched.provides == ("vllm.a.b",)
    assert "vllm.a.c (unreviewed)" in patched.reason
    assert bridge.DRIFT_POINT.decide(bridge.AliasFacts(HostKind.LACKS, (held,)), Controls()).action == Action.SKIPPED
    assert bridge.DRIFT_POINT.decide(bridge.AliasFacts(HostKind.ABSENT), Controls()).action == Action.PENDING
    assert decide_entry(bridge.DRIFT_POINT.entry, bridge.AliasFacts(HostKind.LACKS, (fact,)),
                        Controls(disabled_patches=frozenset({bridge.DRIFT_POINT.entry.id}))).action == Action.DISABLED


def test_table_rows_are_well_formed_and_no_unreviewed_changed_pair_is_installable():
    for row in bridge.table():
        assert row.match in ("identical", "changed"), row
        assert row.kind in ("name", "module"), row
        assert (row.new is None) == bool(row.moved), row  # one new home, or a split module's per-name homes
        if row.match == "identical":
            assert row.verdict is None
        else:
            assert row.verdict in (None, "accept", "reject") and (row.verdict is None) == (row.reason is None)
            state = bridge._review_state(row)
            assert state == (bridge.State.ALIAS if row.verdict == "accept" else
                             bridge.State.REJECTED if row.verdict == "reject" else bridge.State.UNREVIEWED)


@needs_vllm
def test_static_and_runtime_facts_agree():
    importlib.import_module(bridge.DRIFT_POINT.entry.target_module)
    assert bridge.DRIFT_POINT.compare(STATIC, bridge.DRIFT_POINT.detect_runtime(sys.modules[bridge.DRIFT_POINT.entry.target_module])) == []


def test_runtime_counts_another_bridges_stand_in_as_a_name_vllm_lacks(monkeypatch):
    """The rule on its own, in every cell: an old path bound by an object marked ``_vllm_compat_installed`` keeps the
    facts vLLM's files give (the static view); one bound by an unmarked object is vLLM's own."""
    fact = bridge.AliasFact("vllm_compat_test_old.Name", "vllm_compat_test_new.Name", "name", bridge.State.REJECTED,
                            ("vllm_omni.x:1 (module)",))
    facts = bridge.AliasFacts(HostKind.LACKS, (fact,))
    monkeypatch.setattr(bridge, "detect_facts", lambda vllm_tree, omni_tree: facts)
    module = types.ModuleType("vllm_compat_test_old")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    module.Name = type("Name", (), {MARK: "multimodal_processing_info"})
    assert bridge.DRIFT_POINT.detect_runtime(module).aliases == (fact,)
    module.Name = type("Name", (), {})
    assert bridge.DRIFT_POINT.detect_runtime(module).aliases == (
        bridge.AliasFact(fact.old, None, "name", bridge.State.VLLM_HAS_IT),)


@needs_vllm
@pytest.mark.skipif(not STOOD_IN_FACTS, reason="no other bridge provides an old path of the alias table here (vLLM "
                    "0.31-0.33 with vllm-omni 0.30.0: multimodal_processing_info)")
def test_an_old_path_another_bridge_stands_in_for_keeps_its_static_facts():
    """Imported and applied, the old module binds the other bridge's stand-in; the runtime facts still say what vLLM's
    files say (vLLM lacks the name), so static and runtime detection agree (the v0.33-omni0.30 cell's mismatch)."""
    import vllm_compat

    vllm_compat.apply()
    for fact in STOOD_IN_FACTS:
        module, name = fact.old.rsplit(".", 1)
        assert fact.state != bridge.State.VLLM_HAS_IT
        assert is_ours(vars(importlib.import_module(module)).get(name), STOOD_IN[fact.old]), fact.old
    runtime = {a.old: a for a in bridge.DRIFT_POINT.detect_runtime(sys.modules[bridge.DRIFT_POINT.entry.target_module]).aliases}
    assert [runtime[a.old] for a in STOOD_IN_FACTS] == STOOD_IN_FACTS


@needs_vllm
@pytest.mark.skipif(not HAS_IT, reason="the installed vLLM binds none of the table's old paths")
def test_stays_out_where_vllm_has_the_name():
    """Where vLLM still binds an old path (vLLM 0.24 for every row), its own object is what the import gives."""
    import vllm_compat

    decisions = {d.name: d for d in vllm_compat.apply()}
    decision = decisions[bridge.DRIFT_POINT.entry.id]
    for fact in HAS_IT:
        assert fact.old not in decision.provides
    fact = next((a for a in HAS_IT if a.kind == "name"), None)
    if fact is None:
        pytest.skip("only whole modules are still there")
    module, name = fact.old.rsplit(".", 1)
    try:
        loaded = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - an optional dependency of that vLLM module, not the bridge
        pytest.skip(f"{module} does not import here: {type(exc).__name__}: {exc}")
    assert name in vars(loaded) and not bridge._is_ours(loaded, name)
    assert name not in bridge._names.get(module, {})  # no hook will ever set it


@needs_name_alias
@pytest.mark.parametrize("env", [{"VLLM_COMPAT_DISABLE": "1"}, {"VLLM_COMPAT_DISABLE_PATCHES": bridge.DRIFT_POINT.entry.id}],
                         ids=["disabled", "entry-disabled"])
def test_unpatched_old_name_fails_with_the_real_import_error(env):
    fact = NAME_ALIASES[0]
    module, name = fact.old.rsplit(".", 1)
    result = run_python(f"""
        try:
            from {module} import {name}
        except ImportError as exc:
            print("IMPORT-ERROR", exc)
        else:
            print("IMPORTED")
        """, env=env, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"IMPORT-ERROR cannot import name '{name}' from '{module}'" in result.stdout, result.stdout[-2000:]


@needs_name_alias
@needs_startup_hook
def test_old_name_resolves_to_the_new_definition_and_revert_removes_exactly_it():
    fact = NAME_ALIASES[0]
    module, name = fact.old.rsplit(".", 1)
    new_module, new_name = fact.new.rsplit(".", 1)
    result = run_python(f"""
        import json, sys
        from {module} import {name} as old
        import {new_module} as new_home
        import vllm_compat
        host = sys.modules["{module}"]
        out = dict(same=old is new_home.{new_name},
                   decision=[d.action for d in vllm_compat.current_decisions() if d.name == "{bridge.DRIFT_POINT.entry.id}"],
                   provides="{fact.old}" in [p for d in vllm_compat.current_decisions() for p in d.provides])
        # other stand-ins may live in the same module (fp8_copy_missing_attrs beside CopyNumelCounter): revert
        # removes exactly what vllm_compat provided there, and nothing vLLM defines.
        ours = sorted(p.rsplit(".", 1)[1] for d in vllm_compat.current_decisions() if d.action == "patched"
                      for p in (list(d.provides) or [d.target]) if p.rsplit(".", 1)[0] == "{module}")
        before = set(vars(host))
        vllm_compat.revert()
        out["removed"], out["ours"] = sorted(before - set(vars(host))), ours
        vllm_compat.apply()
        out["back"] = getattr(host, "{name}", None) is new_home.{new_name}
        print("RESULT", json.dumps(out))
        """, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert name in out["removed"] and out.pop("removed") == out.pop("ours")
    assert out == {"same": True, "decision": ["patched"], "provides": True, "back": True}


@needs_name_alias
def test_import_drift_names_the_alias_entry_for_each_aliased_name():
    from vllm_compat.decide import plan
    from vllm_compat.reporting import Report

    site = StaticSite.installed()
    for controls, bridged in ((Controls(), True), (Controls(disabled_patches=frozenset({bridge.DRIFT_POINT.entry.id})), False)):
        report = Report(mode="static", static=site.environment, patches=[d for _, _, d in plan(site, controls)])
        drift = report.import_drift
        for fact in NAME_ALIASES + MODULE_ALIASES:  # a moved or split module is one unresolved target too
            if fact.old in drift.names:
                assert drift.bridged_by(fact.old) == (bridge.DRIFT_POINT.entry.id if bridged else None)
                assert report.to_dict()["import_drift"]["bridged"].get(fact.old) == (
                    bridge.DRIFT_POINT.entry.id if bridged else None)


@needs_module_alias
@needs_startup_hook
def test_old_module_path_is_the_new_module_and_revert_removes_it():
    fact = WHOLE_MODULE_ALIASES[0]
    result = run_python(f"""
        import json, sys
        import vllm_compat
        import {fact.old} as old
        import {fact.new} as new
        parent, _, leaf = "{fact.old}".rpartition(".")
        out = dict(same=old is new, spec=new.__spec__.name)
        vllm_compat.revert()
        out["gone"] = "{fact.old}" not in sys.modules and leaf not in vars(sys.modules[parent])
        try:
            import {fact.old}
        except ImportError as exc:
            out["unpatched"] = type(exc).__name__
        print("RESULT", json.dumps(out))
        """, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert out == {"same": True, "spec": fact.new, "gone": True, "unpatched": "ModuleNotFoundError"}


@needs_vllm
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    owner = importlib.import_module(bridge.DRIFT_POINT.entry.target_module)
    facts = bridge.DRIFT_POINT.detect_runtime(owner)
    bridge.DRIFT_POINT.uninstall(owner)
    meta_path, modules = list(sys.meta_path), set(sys.modules)
    try:
        decision = bridge.DRIFT_POINT.decide(facts, Controls())
        state = bridge.DRIFT_POINT.prepare(owner, facts)
        bridge.DRIFT_POINT.install(owner, decision, state)
        assert bridge.DRIFT_POINT.install(owner, decision, state) is False  # in place already: a no-op
        assert (bridge._finder in sys.meta_path) == any(a.kind == "module" for a in state)
        bridge.DRIFT_POINT.uninstall(owner)
        assert sys.meta_path == meta_path and set(sys.modules) <= modules | {
            m for m in sys.modules if not any(m == a.old for a in state)}
        assert bridge.DRIFT_POINT.uninstall(owner) is False
    finally:
        import vllm_compat

        vllm_compat.apply()


# ---- the generator (matrix/aliases.py) on the real wheels ----

def _generator():
    sys.path.insert(0, str(ROOT / "matrix"))
    try:
        import aliases
    finally:
        sys.path.pop(0)
    return aliases


@pytest.mark.skipif(not (_wheel("vllm-0.30.0-*.whl") and _wheel("vllm-0.31.0-*.whl")),
                    reason="needs the vLLM 0.30.0 and 0.31.0 wheels (in /tmp/vc-wheels or vllm_compat's wheel cache)")
def test_generator_never_aliases_a_same_named_unrelated_definition(tmp_path):
    """vLLM 0.31 dropped the NamedTuple ``processing.processor.MultiModalProcessingInfo`` (vllm-omni 0.30.0's
    diffusion worker imports it); 0.31 still has a class of that name, ``transformers.multimodal``'s
    ``BaseProcessingInfo`` subclass: a name match, not the definition. The generator must not pair them."""
    from vllm_compat.detect.definitions import Definitions

    aliases = _generator()
    base, new = SourceTree(_wheel("vllm-0.30.0-*.whl")), SourceTree(_wheel("vllm-0.31.0-*.whl"))
    old_module = "vllm.multimodal.processing.processor"
    unrelated = "vllm.model_executor.models.transformers.multimodal"
    new_defs = Definitions(new)
    assert new_defs.find(unrelated, "MultiModalProcessingInfo") is not None  # the same name is there
    matcher = aliases.Matcher(Definitions(base), new_defs, aliases.tree_index(_wheel("vllm-0.31.0-*.whl"), aliases.DEFAULT_CACHE))
    found = matcher.match_name(old_module, "MultiModalProcessingInfo")
    assert found.get("new") != f"{unrelated}.MultiModalProcessingInfo", found
    assert found["status"] != "identical"
    rows = [r for r in bridge.table() if r.old == f"{old_module}.MultiModalProcessingInfo"]
    assert all(r.new != f"{unrelated}.MultiModalProcessingInfo" for r in rows)
    assert all(bridge._review_state(r) != bridge.State.ALIAS for r in rows)  # the rename added a required field

    # an identical definition that moved is found by source (the table's identical rows re-checked)
    identical = [r for r in bridge.table() if r.match == "identical" and r.kind == "name"
                 and r.vllm[0] == r.vllm[1] == "0.33.0"]
    new33 = _wheel("vllm-0.33.0-*.whl")
    if identical and new33 and _wheel("vllm-0.24.0-*.whl"):
        row = identical[0]
        module, name = row.old.rsplit(".", 1)
        matcher = aliases.Matcher(Definitions(SourceTree(_wheel("vllm-0.24.0-*.whl"))), Definitions(SourceTree(new33)),
                                  aliases.tree_index(new33, aliases.DEFAULT_CACHE))
        assert matcher.match_name(module, name)["new"] == row.new


def test_source_key_ignores_docstrings_and_layout_but_not_code():
    import ast

    from vllm_compat.detect.definitions import source_key

    a = ast.parse('def f(x):\n    """doc"""\n    return x + 1\n').body[0]
    b = ast.parse("def f(x):  # moved\n\n    return (x\n            + 1)\n").body[0]
    c = ast.parse("def f(x):\n    return x + 2\n").body[0]
    assert source_key(a) == source_key(b) != source_key(c)
