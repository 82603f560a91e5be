"""``ar_scheduler_v1_runner`` / ``generation_scheduler_v1_runner``: vllm-omni's schedulers agree with the V1 model
runner their workers force (``vllm_compat/patches/_scheduler_runner.py``).

The drift, as measured on the H200 (``gpu/results/serve_r5``): on vLLM 0.25.1 a one-AR-stage server of vllm-omni
0.24.0 dies at its first request (``KeyError`` in the V1 runner's ``_update_states``) without the AR patch, and
answers as the native pair does with it. Here, on CPU: vllm-omni's own scheduler classes on the installed vLLM, with
vLLM's config saying V2 (``_scheduler_runner_worker.py``), unpatched and patched; the facts against what was read
from the wheels, per installed version; and the decision table.
"""

from __future__ import annotations

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, needs_v1_model_runner
from tests.patches._scheduler_runner_worker import run as run_scheduler
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite
from vllm_compat.patches import ar_scheduler_v1_runner, generation_scheduler_v1_runner
from vllm_compat.patches._scheduler_runner import Agreement, RunnerAgreement

POINTS = {"ar": ar_scheduler_v1_runner.DRIFT_POINT, "generation": generation_scheduler_v1_runner.DRIFT_POINT}
BOTH_OFF = {"VLLM_COMPAT_DISABLE_PATCHES": ",".join(point.id for point in POINTS.values())}


@pytest.mark.parametrize(("kind", "action"), [
    (Agreement.FOLLOWS_CONFIG, Action.PATCHED), (Agreement.AGREES, Action.SKIPPED),
    (Agreement.NO_FLAG, Action.SKIPPED), (Agreement.V1_DEFAULT, Action.SKIPPED),
    (Agreement.ABSENT, Action.PENDING),
])
@pytest.mark.parametrize("which", POINTS)
def test_decision_table(which, kind, action):
    decision = POINTS[which].decide(RunnerAgreement(kind, "detail"), Controls())
    assert decision.action == action
    assert (decision.variant == "v1_runner") == (action == Action.PATCHED)


def _expected_kind() -> str:
    """What the wheels say for the installed pair (read from vLLM 0.24.0, 0.25.1, 0.26.0, 0.28.0, 0.29.0, 0.31.0,
    0.34.0 and vllm-omni 0.24.0, 0.26.0, 0.28.0, 0.30.0): vLLM 0.34 removed the V1 runner and the scheduler's flag;
    vLLM 0.25-0.33 say V2 for dense models; 0.24 keeps them on V1; vllm-omni 0.30.0's schedulers set the flag."""
    vllm, omni = Version(VLLM_VERSION), Version(OMNI_VERSION)
    if vllm >= Version("0.34"):
        return Agreement.NO_FLAG
    if vllm < Version("0.25"):
        return Agreement.V1_DEFAULT
    return Agreement.AGREES if omni >= Version("0.30") else Agreement.FOLLOWS_CONFIG


@needs_omni
@pytest.mark.skipif(VLLM_VERSION is None or Version(VLLM_VERSION) < Version("0.24"),
                    reason="vllm-omni's releases run on vLLM 0.24+")
@pytest.mark.parametrize("which", POINTS)
def test_facts_are_what_the_wheels_say_and_agree_at_run_time(which):
    point = POINTS[which]
    static = point.detect_static(StaticSite.installed())
    assert static.kind == _expected_kind(), static.detail
    import importlib

    assert point.detect_runtime(importlib.import_module(point.target_module)) == static


@needs_omni
@needs_v1_model_runner
@pytest.mark.parametrize("which", POINTS)
def test_the_scheduler_schedules_for_the_v1_runner_its_worker_runs(which, tmp_path):
    """Unpatched first (the drift reproduced: the config's V2 reaches vllm-omni's scheduler, and the AR one skips
    the V1 bookkeeping of last step's requests), then patched: V1's shape, as vllm-omni 0.30.0's own schedulers.
    Where the patch stays out, nothing of ours is on the class."""
    point = POINTS[which]
    decision = point.decide(point.detect_static(StaticSite.installed()), Controls())
    unpatched = run_scheduler(which, tmp_path, BOTH_OFF)
    patched = run_scheduler(which, tmp_path)
    assert unpatched["config_says_v2"] and patched["config_says_v2"]
    assert not unpatched["wrapped"]
    if decision.action != Action.PATCHED:
        assert not patched["wrapped"] and patched == unpatched
        return
    assert unpatched["scheduler_v2"] and patched["wrapped"] and not patched["scheduler_v2"]
    assert patched["scheduled"] == unpatched["scheduled"] == ["r0"]
    assert patched["prev_step_scheduled"] == ["r0"]
    if which == "ar":
        assert unpatched["prev_step_scheduled"] == []  # what the V1 runner's resumed requests then lack


@needs_omni
@pytest.mark.skipif(VLLM_VERSION is None or OMNI_VERSION is None or Version(OMNI_VERSION) < Version("0.30")
                    or not Version("0.25") <= Version(VLLM_VERSION) < Version("0.34"),
                    reason="the oracle: vllm-omni 0.30.0's own schedulers on a vLLM whose config says V2 (0.25-0.33)")
def test_vllm_omni_030_schedulers_do_what_the_patch_does(tmp_path):
    for which in POINTS:
        native = run_scheduler(which, tmp_path, BOTH_OFF)
        assert native["config_says_v2"] and not native["scheduler_v2"] and not native["wrapped"]
        assert native["prev_step_scheduled"] == ["r0"]
