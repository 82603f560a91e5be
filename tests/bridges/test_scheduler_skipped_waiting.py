"""``scheduler_skipped_waiting``: vLLM 0.31 removed ``Scheduler.skipped_waiting``, which vllm-omni's schedulers read.

vllm-omni's own scheduler classes on the installed vLLM, on CPU (``tests/patches/_scheduler_runner_worker.py``):
unpatched first (vLLM 0.31+: reading it fails, and vllm-omni 0.28.0 / 0.30.0's ``schedule`` dies on it), then
patched (an empty queue, as vLLM 0.31+ leaves none between steps; the request is scheduled); the facts per installed
version as read from the wheels; the decision table; revert.
"""

from __future__ import annotations

import importlib

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, needs_v1_model_runner
from tests.patches._scheduler_runner_worker import run as run_scheduler
from vllm_compat.bridges import scheduler_skipped_waiting as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
K = bridge.Kind


@pytest.mark.parametrize(("facts", "action"), [
    (bridge.SkippedWaitingFacts(K.LACKS, ("a.py",)), Action.PATCHED),
    (bridge.SkippedWaitingFacts(K.LACKS, ()), Action.SKIPPED),
    (bridge.SkippedWaitingFacts(K.DEFINES, ("a.py",)), Action.SKIPPED),
    (bridge.SkippedWaitingFacts(K.ABSENT), Action.PENDING),
], ids=["lacks+read", "lacks+unread", "defines", "absent"])
def test_decision_table(facts, action):
    assert POINT.decide(facts, Controls()).action == action


def test_reads_and_assignments_are_told_apart():
    assert bridge.reads_it("def f(self):\n    return x in self.skipped_waiting\n")
    assert not bridge.reads_it("def f(self):\n    return getattr(self, 'skipped_waiting', ())\n")
    assert not bridge.reads_it("def f(self):\n    self.skipped_waiting = q\n")
    assert bridge.assigns_it("def __init__(self):\n    self.skipped_waiting = q\n")


@needs_omni
@pytest.mark.skipif(VLLM_VERSION is None or Version(VLLM_VERSION) < Version("0.24"), reason="vLLM 0.24+")
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    """vLLM <= 0.30 assigns it; 0.31-0.34 do not (read from the 0.30.0, 0.31.0, 0.33.0 and 0.34.0 wheels); every
    vllm-omni release from 0.24.0 reads it."""
    assert STATIC.host == (K.LACKS if Version(VLLM_VERSION) >= Version("0.31") else K.DEFINES)
    assert STATIC.readers
    assert POINT.detect_runtime(importlib.import_module(POINT.target_module)) == STATIC


@needs_omni
@needs_v1_model_runner
@pytest.mark.skipif(STATIC.host != K.LACKS, reason=f"needs vLLM 0.31+ (no Scheduler.skipped_waiting); here {STATIC}")
@pytest.mark.parametrize("which", ["ar", "generation"])
def test_vllm_omnis_schedulers_find_the_queue_they_read(which, tmp_path):
    unpatched = run_scheduler(which, tmp_path, {"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
    assert unpatched["skipped_waiting"].startswith("AttributeError") and "skipped_waiting" in unpatched["skipped_waiting"]
    if Version(OMNI_VERSION) >= Version("0.28"):  # their schedule() prunes it every step
        assert "skipped_waiting" in unpatched["schedule_error"]
    patched = run_scheduler(which, tmp_path)
    assert patched["skipped_waiting"] == [] and "schedule_error" not in patched and patched["scheduled"] == ["r0"]


@needs_omni
@pytest.mark.skipif(STATIC.host != K.LACKS, reason=f"needs vLLM 0.31+; here {STATIC}")
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    module = importlib.import_module(POINT.target_module)
    owner = POINT.locate(module)
    had = POINT.is_installed(owner)
    POINT.uninstall(owner)
    assert bridge.NAME not in vars(owner)
    assert POINT.install(owner, None, None) and not POINT.install(owner, None, None)
    assert isinstance(vars(owner)[bridge.NAME], bridge.SkippedWaiting)
    if not had:
        POINT.uninstall(owner)
