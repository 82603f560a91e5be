"""The ``RoutedExpertsLists`` stand-in on the real wheels: vllm-omni 0.24.0 / 0.30.0 die at import on vLLM 0.31+
without it (the real ImportError, reproduced first), import with it, and vLLM <= 0.30 keeps its own."""

from __future__ import annotations

import importlib
import json

import pytest

from conftest import STARTUP_HOOK, needs_startup_hook, needs_vllm, run_python
from tests.bridges import name_stand_in_cases as cases
from tests.support.cell_matrix import cell_unresolved, names_an_unresolved
from vllm_compat.bridges import HostKind
from vllm_compat.bridges import routed_experts_lists as bridge
from vllm_compat.config import Controls
from vllm_compat.detect.static import StaticSite

STATIC = bridge.DRIFT_POINT.detect_static(StaticSite.installed())
TARGET = bridge.DRIFT_POINT.entry.target_path
needs_missing_name = pytest.mark.skipif(
    STATIC.host != HostKind.LACKS or not STATIC.importers,
    reason=f"needs vLLM >= 0.31 (no {TARGET}) with a vllm-omni that imports it; here: vLLM {STATIC.host} it, "
    f"importers {list(STATIC.importers) or 'none'}",
)
needs_vllm_defining_it = pytest.mark.skipif(
    STATIC.host != HostKind.DEFINES, reason=f"needs a vLLM that defines {TARGET} (<= 0.30); here: {STATIC.host}"
)
IMPORT_ERROR = "cannot import name 'RoutedExpertsLists' from 'vllm.v1.outputs'"


@pytest.mark.parametrize(("facts", "action"), cases.DECISION_CASES, ids=cases.DECISION_IDS)
def test_decision_table(facts, action):
    cases.check_decision(bridge.DRIFT_POINT, facts, action)


@needs_vllm
def test_static_and_runtime_facts_agree():
    cases.check_static_and_runtime_agree(bridge.DRIFT_POINT, STATIC)


@needs_missing_name
@pytest.mark.parametrize(
    "env", [{"VLLM_COMPAT_DISABLE": "1"}, {"VLLM_COMPAT_DISABLE_PATCHES": bridge.DRIFT_POINT.entry.id}],
    ids=["disabled", "entry-disabled"],
)
def test_unpatched_import_of_vllm_omni_fails_with_the_real_import_error(env):
    """Without the stand-in, ``import vllm_omni`` dies where vllm-omni imports the removed name; with every bridge
    off, at an earlier one where vllm-omni reaches another name the cell's matrix lists as unresolved first
    (vllm-omni 0.26.0: vllm.entrypoints.serve.utils.error_response, imported before the scheduler)."""
    result = run_python(
        """
        try:
            import vllm_omni
        except ImportError as exc:
            print("IMPORT-ERROR", exc)
        else:
            print("IMPORTED")
        """,
        env=env,
        warm=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    if env.get("VLLM_COMPAT_DISABLE") == "1" and f"IMPORT-ERROR {IMPORT_ERROR}" not in result.stdout:
        earlier = [name for name in cell_unresolved() if name != TARGET]
        assert "IMPORT-ERROR" in result.stdout and names_an_unresolved(result.stdout, earlier), (
            earlier, result.stdout[-2000:])
        return
    assert f"IMPORT-ERROR {IMPORT_ERROR}" in result.stdout, result.stdout[-2000:]


@needs_missing_name
@needs_startup_hook
def test_vllm_omni_imports_with_the_stand_in_and_revert_removes_it():
    """The fixed run: a plain ``import vllm_omni`` (the startup hook registered vllm_compat's hooks) works, its own
    helper works on the stand-in, revert() takes out exactly it."""
    result = run_python(
        """
        import json, sys
        import numpy as np
        import vllm_omni
        import vllm_compat
        from vllm_omni.core.sched.utils import omni_routed_experts_for_request, RoutedExpertsLists
        outputs = sys.modules["vllm.v1.outputs"]
        lists = RoutedExpertsLists(routing_data=np.arange(12).reshape(4, 3, 1), slot_mapping=np.array([5, 6, 7, 8]))
        class Request:
            block_table = [6, 8]
        picked = omni_routed_experts_for_request(lists, Request())
        out = dict(
            same=outputs.RoutedExpertsLists is RoutedExpertsLists,
            mark=RoutedExpertsLists._vllm_compat_installed,
            fields=list(RoutedExpertsLists._fields),
            picked=picked.ravel().tolist(),
            decision=[d.action for d in vllm_compat.current_decisions() if d.name == "routed_experts_lists"],
        )
        before = set(vars(outputs))
        vllm_compat.revert()
        out["removed"] = sorted(before - set(vars(outputs)))
        out["added"] = sorted(set(vars(outputs)) - before)
        vllm_compat.apply()
        out["back"] = getattr(outputs, "RoutedExpertsLists", None) is RoutedExpertsLists
        print("RESULT", json.dumps(out))
        """,
        warm=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert out == {
        "same": True, "mark": bridge.DRIFT_POINT.entry.id, "fields": ["routing_data", "slot_mapping"],
        "picked": [3, 4, 5, 9, 10, 11], "decision": ["patched"],
        "removed": ["RoutedExpertsLists"], "added": [], "back": True,
    }


@needs_missing_name
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    module = importlib.import_module(bridge.DRIFT_POINT.entry.target_module)  # vllm_compat's hook (pytest plugin) ran
    cases.check_install_uninstall_exact(bridge.DRIFT_POINT, STATIC, module)


@needs_vllm_defining_it
def test_stays_out_where_vllm_defines_it():
    module = importlib.import_module(bridge.DRIFT_POINT.entry.target_module)
    assert cases.check_stays_out_where_vllm_defines_it(bridge.DRIFT_POINT, module).__module__ == "vllm.v1.outputs"


@needs_missing_name
@pytest.mark.parametrize(
    ("controls", "bridged"),
    [(Controls(), True), (Controls(disabled=True), False),
     (Controls(disabled_patches=frozenset({bridge.DRIFT_POINT.entry.id})), False)],
    ids=["on", "disabled", "entry-disabled"],
)
def test_import_drift_counts_the_name_as_bridged_only_while_the_bridge_acts(controls, bridged):
    from vllm_compat.decide import plan
    from vllm_compat.reporting import Report

    site = StaticSite.installed()
    report = Report(mode="static", static=site.environment, patches=[d for _, _, d in plan(site, controls)])
    drift = report.import_drift
    assert TARGET in drift.blocking_names  # what vLLM lacks, bridged or not
    assert drift.bridged_by(TARGET) == (bridge.DRIFT_POINT.entry.id if bridged else None)
    assert drift.early == STARTUP_HOOK
    assert (TARGET in drift.still_blocking_names) == (not (bridged and STARTUP_HOOK))
    assert report.plugin_will_not_import == bool(drift.still_blocking_names)
    assert report.to_dict()["import_drift"]["bridged"].get(TARGET) == (bridge.DRIFT_POINT.entry.id if bridged else None)
    text = report.render_table()
    assert (f"{TARGET} (in vllm_omni.core.sched.utils:" in text) and (
        (f"bridged by {bridge.DRIFT_POINT.entry.id}" in text) == bridged)
    assert ("WILL NOT IMPORT" in text) == report.plugin_will_not_import
