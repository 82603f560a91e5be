"""What every name stand-in's tests check (tests/bridges/test_fp8_copy_missing_attrs.py, test_routed_experts_lists.py,
test_multimodal_processing_info.py, test_history_tool_calls_cnt.py, and the function stand-ins'
test_engine_zmq_addresses.py and test_kv_cache_configs.py call these with their bridge): the decision table and the
two detections agreeing, install / uninstall exact, and staying out where vLLM defines the name, on the real wheels;
test_history_tool_calls_cnt.py and test_residual_scattered_for_sp.py also run vllm-omni's own import statement,
unpatched and through the startup hook)."""

from __future__ import annotations

import json

import pytest

from conftest import run_python
from tests.bridges.module_stand_in_cases import check_static_and_runtime_agree  # noqa: F401 - the same check
from vllm_compat.bridges import HostKind, StandInFacts, is_ours
from vllm_compat.bridges._name_stand_in import FunctionStandInFacts, Shape
from vllm_compat.config import Controls
from vllm_compat.decide import Action, decide_entry
from vllm_compat.errors import PatchRefusedError

IMPORTER = ("vllm_omni.some.module:1 (module)",)
DECISION_CASES = [
    (StandInFacts(HostKind.LACKS, IMPORTER), Action.PATCHED),
    (StandInFacts(HostKind.LACKS, ()), Action.SKIPPED),
    (StandInFacts(HostKind.DEFINES, IMPORTER), Action.SKIPPED),
    (StandInFacts(HostKind.NO_MODULE, IMPORTER), Action.SKIPPED),
    (StandInFacts(HostKind.ABSENT, ()), Action.PENDING),
    (StandInFacts(HostKind.UNKNOWN, IMPORTER), Action.PENDING),
]
DECISION_IDS = ["lacks+imported", "lacks+unused", "defines", "no-module", "no-vllm", "unknown"]

# A function stand-in is built between two shapes (vLLM's replacement, vllm-omni's calls): either unknown refuses.
FUNCTION_DECISION_CASES = [
    (FunctionStandInFacts(HostKind.LACKS, IMPORTER, Shape.KNOWN, Shape.KNOWN), Action.PATCHED),
    (FunctionStandInFacts(HostKind.DEFINES, IMPORTER), Action.SKIPPED),
    (FunctionStandInFacts(HostKind.LACKS, (), Shape.KNOWN, Shape.KNOWN), Action.SKIPPED),
    (FunctionStandInFacts(HostKind.NO_MODULE, IMPORTER), Action.SKIPPED),
    (FunctionStandInFacts(HostKind.LACKS, IMPORTER, Shape.UNKNOWN, Shape.KNOWN), Action.REFUSED),
    (FunctionStandInFacts(HostKind.LACKS, IMPORTER, Shape.KNOWN, Shape.UNKNOWN), Action.REFUSED),
    (FunctionStandInFacts(HostKind.ABSENT, IMPORTER), Action.PENDING),
    (FunctionStandInFacts(HostKind.UNKNOWN, IMPORTER), Action.PENDING),
]
FUNCTION_DECISION_IDS = ["provide", "vllm-has-it", "no-importer", "no-module", "unknown-replacement",
                         "unknown-calls", "no-vllm", "files-cannot-tell"]


def check_decision(point, facts, action):
    """``facts`` decide ``action`` under the default controls; disabling the entry makes any facts DISABLED."""
    assert point.decide(facts, Controls()).action == action
    assert decide_entry(point.entry, facts, Controls(disabled_patches=frozenset({point.id}))).action == Action.DISABLED


def check_install_uninstall_exact(point, static, module, while_installed=None):
    """On vLLM's ``module`` that lacks the name: uninstall; install twice (the second a no-op) adds exactly the
    entry's marked object (``while_installed(obj)`` checks it further); uninstall removes exactly it; what was there
    before is put back."""
    had = vars(module).get(point.name)
    try:
        point.uninstall(module)
        names = set(vars(module))
        decision = point.decide(point.detect_runtime(module), Controls())
        assert decision.action == Action.PATCHED, decision
        assert point.install(module, decision, point.prepare(module, static)) is True
        assert point.install(module, decision, point.prepare(module, static)) is False  # already there: a no-op
        installed = vars(module)[point.name]
        assert set(vars(module)) - names == {point.name} and is_ours(installed, point.id)
        if while_installed is not None:
            while_installed(installed)
        assert point.uninstall(module) is True and set(vars(module)) == names
        assert point.uninstall(module) is False
    finally:
        if had is not None:
            setattr(module, point.name, had)


def check_stays_out_where_vllm_defines_it(point, module):
    """Skipped, vLLM's own object left in place, never replaced (prepare refuses), uninstall a no-op. Returns
    vLLM's own object, for the bridge's differential checks against it."""
    import vllm_compat

    decision = {d.name: d for d in vllm_compat.apply()}[point.id]
    assert decision.action == Action.SKIPPED and "its own is used" in decision.reason, decision
    own = vars(module)[point.name]
    assert not is_ours(own) and own.__module__ == module.__name__
    with pytest.raises(PatchRefusedError, match="never replaces a name vLLM defines"):
        point.prepare(module, point.detect_runtime(module))
    assert point.uninstall(module) is False and vars(module)[point.name] is own
    return own


def check_unpatched_import_fails(point, omni_import: str, name: str):
    """Without this stand-in (the other bridges on), vllm-omni's import statement dies with the real ImportError."""
    result = run_python(f"""
        try:
            {omni_import}
        except ImportError as exc:
            print("IMPORT-ERROR", exc)
        else:
            print("IMPORTED")
        """, env={"VLLM_COMPAT_DISABLE_PATCHES": point.entry.id}, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"IMPORT-ERROR cannot import name '{name}' from " in result.stdout, result.stdout[-2000:]


def import_through_the_hook_and_revert(point, omni_import: str, name: str, also: str = "") -> dict:
    """vllm-omni's import statement through the startup hook, then ``vllm_compat.revert()``: the stand-in's mark,
    the decision, what revert removed from and added to vLLM's module, and ``also`` (code setting more keys of
    ``out``, run while the stand-in is in place). The stand-in must be marked ours, patched, and removed exactly."""
    result = run_python(f"""
        import json, sys
        {omni_import}
        import vllm_compat
        module = sys.modules["{point.entry.target_module}"]
        out = dict(mark=getattr({name}, "_vllm_compat_installed", None),
                   decision=[d.action for d in vllm_compat.current_decisions() if d.name == "{point.entry.id}"])
        {also}
        before = set(vars(module))
        vllm_compat.revert()
        out["removed"] = sorted(n for n in before - set(vars(module)) if not n.startswith("__"))
        out["added"] = sorted(set(vars(module)) - before)
        print("RESULT", json.dumps(out))
        """, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert out["mark"] == point.entry.id and out["decision"] == ["patched"]
    assert out["removed"] == [name] and out["added"] == []
    return out
