"""What every module stand-in's tests check, on the real wheels (tests/bridges/test_v1_*.py,
test_error_response_engine_text.py and serve_stand_in_cases.py call these with their bridge): the decision table,
the two detections agreeing, the real ImportError without the bridge, install / uninstall exact, and staying out where
vLLM ships the module."""

from __future__ import annotations

import importlib
import sys

import pytest

from conftest import run_python
from vllm_compat.bridges import HostKind, StandInFacts, is_ours
from vllm_compat.bridges._module_stand_in import ModuleStandInFacts
from vllm_compat.config import Controls
from vllm_compat.decide import Action, decide_entry

IMPORTER = ("vllm_omni.some.module:1 (module)",)
DECISION_CASES = [
    (ModuleStandInFacts(HostKind.LACKS, IMPORTER), Action.PATCHED),
    (ModuleStandInFacts(HostKind.LACKS, ()), Action.SKIPPED),
    (ModuleStandInFacts(HostKind.DEFINES, IMPORTER), Action.SKIPPED),
    (ModuleStandInFacts(HostKind.NO_MODULE, IMPORTER), Action.SKIPPED),
    (ModuleStandInFacts(HostKind.ABSENT, ()), Action.PENDING),
    (ModuleStandInFacts(HostKind.UNKNOWN, IMPORTER), Action.PENDING),
]
DECISION_IDS = ["lacks+imported", "lacks+unused", "defines", "no-module", "no-vllm", "unknown"]


def check_decision(point, facts, action):
    if point.needs_replacement and facts.host == HostKind.LACKS:  # built on vLLM files of the measured shape
        facts = ModuleStandInFacts(facts.host, facts.importers, "known")
    decision = point.decide(facts, Controls())
    assert decision.action == action
    # A stand-in whose classes raise says, once it acts, what that leaves out (the report's "left out" lines).
    assert bool(decision.leaves_out) == (action == Action.PATCHED and bool(point.raises))
    assert decide_entry(point.entry, facts, Controls(disabled_patches=frozenset({point.id}))).action == Action.DISABLED
    if point.needs_replacement and facts.host == HostKind.LACKS and facts.importers:
        unknown = ModuleStandInFacts(HostKind.LACKS, IMPORTER, "unknown", "what was found")
        refused = point.decide(unknown, Controls())
        assert refused.action == Action.REFUSED and "what was found" in refused.reason


def check_static_and_runtime_agree(point, static):
    try:
        module = importlib.import_module(point.target_module)
    except ModuleNotFoundError as exc:  # the package the row hooks is not in this vLLM (0.16: no serve.utils)
        assert static.host in (HostKind.NO_MODULE, HostKind.ABSENT), (static, exc)
        return
    assert point.compare(static, point.detect_runtime(module)) == []


def unpatched_import_error(statement: str, entry_id: str) -> str:
    """``"<exception type> <message>"`` of the ImportError that ``statement`` (one import) raises in a fresh
    interpreter with ``entry_id`` disabled and the other bridges on (the bug as reported), or ``"imported"``."""
    result = run_python(f"""
        try:
            {statement}
        except ImportError as exc:
            print("IMPORT-ERROR", type(exc).__name__, exc)
        else:
            print("IMPORT-ERROR imported")
        """, env={"VLLM_COMPAT_DISABLE_PATCHES": entry_id}, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "IMPORT-ERROR " in result.stdout, result.stdout[-2000:]
    return result.stdout.split("IMPORT-ERROR ", 1)[1].splitlines()[0]


def check_install_uninstall_exact(point):
    """uninstall; install twice (the second a no-op); uninstall removes exactly the package attribute and the
    sys.modules entries of the chain; what was there before is put back."""
    owner = importlib.import_module(point.target_module)  # vllm_compat's hook (pytest plugin) ran
    had_attr, had = vars(owner).get(point.target), {n: sys.modules.get(n) for n in point.chain()}
    try:
        point.uninstall(owner)
        names, modules = set(vars(owner)), set(sys.modules)
        decision = point.decide(point.detect_runtime(owner), Controls())
        assert decision.action == Action.PATCHED, decision.reason
        assert point.old_module in decision.provides
        assert point.install(owner, decision, point.prepare(owner, point.detect_runtime(owner))) is True
        assert point.install(owner, decision, None) is False  # already there: a no-op
        assert set(vars(owner)) - names == {point.target} and set(sys.modules) - modules == set(point.chain())
        assert all(is_ours(sys.modules[n], point.id) for n in point.chain())
        assert sys.modules[point.first_missing] is getattr(owner, point.target)
        assert point.uninstall(owner) is True and set(vars(owner)) == names and set(sys.modules) == modules
        assert point.uninstall(owner) is False
    finally:
        if had_attr is not None:
            setattr(owner, point.target, had_attr)
        for name, module in had.items():
            if module is not None:
                sys.modules[name] = module


def check_stays_out(point):
    """Where vLLM ships the module: skipped, vLLM's own module in place, prepare refuses, uninstall touches nothing."""
    import vllm_compat

    own = importlib.import_module(point.old_module)
    decisions = {d.name: d for d in vllm_compat.apply()}
    assert decisions[point.id].action == Action.SKIPPED, decisions[point.id].reason
    assert not is_ours(own) and own.__file__ and "vllm_compat" not in own.__file__ and sys.modules[point.old_module] is own
    owner = importlib.import_module(point.target_module)
    with pytest.raises(Exception, match="never replaces a module vLLM defines"):
        point.prepare(owner, point.detect_runtime(owner))
    assert point.uninstall(owner) is False and sys.modules[point.old_module] is own


def stand_in_facts(static) -> StandInFacts:
    return static.stand_in
