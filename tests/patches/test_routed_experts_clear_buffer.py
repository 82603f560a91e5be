"""``routed_experts_clear_buffer``: vLLM 0.28 dropped ``RoutedExpertsCapturer.clear_buffer``, which vllm-omni
0.24.0-0.30.0's runners call at every step where routed-experts capture is on; the feature is reported left out.

The reproduction runs vllm-omni's own ``GPUARModelRunner.execute_model`` and ``GPUGenerationModelRunner
.execute_model`` on the installed vLLM, with capture on and vLLM's own ``RoutedExpertsCapturer`` (its device buffer on
CPU): where the decision says the feature is left out, the step dies on ``clear_buffer``; where vLLM has it, the step
gets past it with the buffer zeroed. Then the decision table on small trees, and what ``check`` says of the wheels
(the feature in words, the scan's finding named once the entry is off).
"""

from __future__ import annotations

import importlib

import pytest

from conftest import needs_omni, needs_v1_model_runner
from tests.support.check_json import check_json
from tests.support.trees import write_tree
from tests.support.wheels import wheel_or_skip
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite
from vllm_compat.patches import routed_experts_clear_buffer as point_module

POINT = point_module.DRIFT_POINT
K = point_module.Kind
RUNNERS = (("vllm_omni.worker.gpu_ar_model_runner", "GPUARModelRunner"),
           ("vllm_omni.worker.gpu_generation_model_runner", "GPUGenerationModelRunner"))


def _step_with_capture_on(module: str, class_name: str):
    """vllm-omni's ``execute_model`` on a runner with capture on (built without ``__init__``: only what the step reads
    before its first model call), holding vLLM's own capturer; returns (the exception it stopped with, the buffer)."""
    import torch
    from vllm.model_executor.layers.fused_moe.routed_experts_capturer import RoutedExpertsCapturer

    capturer = object.__new__(RoutedExpertsCapturer)
    capturer.device_buffer = torch.ones(4, 2, 2, dtype=torch.int32)
    runner = object.__new__(getattr(importlib.import_module(module), class_name))
    runner.execute_model_state = None
    runner.routed_experts_initialized = True
    runner.routed_experts_capturer = capturer
    try:
        runner.execute_model(None)
    except Exception as exc:  # noqa: BLE001 - any later failure is past the call under test
        return exc, capturer.device_buffer
    return None, capturer.device_buffer


@needs_omni
@needs_v1_model_runner
@pytest.mark.parametrize("module, class_name", RUNNERS, ids=[c for _, c in RUNNERS])
def test_a_step_with_capture_on_stops_exactly_where_the_feature_is_left_out(module, class_name):
    facts = POINT.detect_static(StaticSite.installed())
    if facts.host == K.NOT_IN_RUNNER:
        pytest.skip("this vLLM's runner no longer sets up capture (0.31+): runner_routed_experts_removed decides")
    error, buffer = _step_with_capture_on(module, class_name)
    left_out = point_module.is_left_out(facts)
    stopped_on_clear = isinstance(error, AttributeError) and "clear_buffer" in str(error)
    assert stopped_on_clear == left_out, (facts, error)
    assert POINT.decide(facts).leaves_out == (point_module.LEAVES_OUT if left_out else "")
    if not left_out:
        assert int(buffer.sum()) == 0  # vLLM's own clear_buffer ran, as vllm-omni expects


# ------------------------------------------------------------------------------------------- the decision table

CAPTURER_WITH = "class RoutedExpertsCapturer:\n    def capture(self): ...\n    def clear_buffer(self): ...\n"
CAPTURER_WITHOUT = "class RoutedExpertsCapturer:\n    def capture(self): ...\n"
RUNNER_CAPTURES = ("class GPUModelRunner:\n    def init_routed_experts_capturer(self):\n"
                   "        self.routed_experts_capturer = object()\n")
RUNNER_WITHOUT = "class GPUModelRunner:\n    def execute_model(self): ...\n"
OMNI_CALLS = ("class R:\n    def execute_model(self):\n        if self.routed_experts_initialized:\n"
              "            self.routed_experts_capturer.clear_buffer()\n")
OMNI_OTHER = "class R:\n    def execute_model(self):\n        self.cache.clear_buffer()\n"


def _facts(tmp_path, capturer, runner, omni):
    files = {"vllm/__init__.py": ""}
    if capturer is not None:
        files[point_module.VLLM_CAPTURER] = capturer
    if runner is not None:
        files[point_module.VLLM_RUNNER] = runner
    plugin = {"vllm_omni/__init__.py": "", "vllm_omni/worker/runner.py": omni}
    return point_module.facts_of(write_tree(tmp_path / "vllm_root", files), write_tree(tmp_path / "omni_root", plugin))


@pytest.mark.parametrize("capturer, runner, omni, host, left_out", [
    (CAPTURER_WITH, RUNNER_CAPTURES, OMNI_CALLS, K.CLEARS, False),  # vLLM <= 0.27
    (CAPTURER_WITHOUT, RUNNER_CAPTURES, OMNI_CALLS, K.NO_CLEAR, True),  # vLLM 0.28-0.30
    (CAPTURER_WITHOUT, RUNNER_WITHOUT, OMNI_CALLS, K.NOT_IN_RUNNER, False),  # vLLM 0.31-0.33
    (CAPTURER_WITHOUT, None, OMNI_CALLS, K.NOT_IN_RUNNER, False),  # vLLM 0.34: no V1 runner
    (CAPTURER_WITHOUT, RUNNER_CAPTURES, OMNI_OTHER, K.NO_CLEAR, False),  # another object's clear_buffer
    (None, RUNNER_CAPTURES, OMNI_CALLS, K.ABSENT, False),
], ids=["clears", "no-clear", "not-in-runner", "no-v1-runner", "other-caller", "absent"])
def test_the_decision_follows_the_files(tmp_path, capturer, runner, omni, host, left_out):
    facts = _facts(tmp_path, capturer, runner, omni)
    decision = POINT.decide(facts)
    assert facts.host == host
    assert point_module.is_left_out(facts) == left_out
    assert decision.action == (Action.PENDING if host == K.ABSENT else Action.SKIPPED)  # never installs anything
    assert (decision.leaves_out, decision.leaves_out_of) == ((point_module.LEAVES_OUT, "llm_stage") if left_out
                                                             else ("", ""))
    assert decision.accounts_for_drift == left_out
    if left_out:
        assert facts.callers == ("vllm_omni/worker/runner.py:4",)


# ------------------------------------------------------------------------------------------------ what check says

def _of_clear_buffer(findings) -> list[dict]:
    return [f for f in findings if f["vllm_object"].endswith("RoutedExpertsCapturer.clear_buffer")]


def test_check_names_the_feature_in_words_and_the_call_once_the_entry_is_off(capsys, monkeypatch):
    """vLLM 0.30.0 + vllm-omni 0.24.0 (the wheels tests/test_check.py's sweep reads): the verdict says "routed-experts
    capture" where it said "the LLM / AR stages' model runners (it will not start when self.routed_experts_initialized
    ...)"; with the entry off, the scan's finding is back under the LLM / AR stages, unhandled."""
    wheel_or_skip("vllm", "0.30.0")
    wheel_or_skip("vllm-omni", "0.24.0")
    code, on = check_json(capsys, monkeypatch, "0.30.0", "0.24.0")
    assert code == 0 and "routed-experts capture" in on["verdict"]["text"]
    assert {f["handled_by"] for f in _of_clear_buffer(on["import_drift"]["behaviour_drift"]["findings"])} == {POINT.id}
    assert on["import_drift"]["entrypoints"]["llm_stage"]["left_out"][POINT.id] == point_module.LEAVES_OUT
    code_off, off = check_json(capsys, monkeypatch, "0.30.0", "0.24.0", disabled=POINT.id)
    found = _of_clear_buffer(off["import_drift"]["entrypoints"]["llm_stage"]["fails_when_used"])
    assert {f["site"].rsplit(":", 1)[0] for f in found} == {m for m, _ in RUNNERS}
    assert all(f["effect"] == "stops_when" and "routed_experts_initialized" in f["when"] for f in found)
    assert code_off == code and "routed-experts capture" not in off["verdict"]["text"]


def test_the_native_pair_that_shares_the_bug_says_so(capsys, monkeypatch):
    """vllm-omni 0.30.0 calls clear_buffer on its own vLLM 0.30.0: the scan's subtraction of the native baseline hides
    a bug native to the pair by design, and this entry still names the feature."""
    wheel_or_skip("vllm", "0.30.0")
    wheel_or_skip("vllm-omni", "0.30.0")
    code, data = check_json(capsys, monkeypatch, "0.30.0", "0.30.0")
    assert code == 0 and data["verdict"]["kind"] == "works_natively"
    assert "routed-experts capture" in data["verdict"]["text"]
