"""``generation_runner_prepare_inputs``: vLLM 0.28+'s ``GPUModelRunner._prepare_inputs`` returns 3 values where
vllm-omni 0.24.0 / 0.26.0's ``GPUGenerationModelRunner.execute_model`` unpacks 2.

The same checks as ``tests/bridges/test_ar_runner_prepare_inputs.py`` (its decision table, its regex reading of the
wheels, its scenario: vLLM's real ``_prepare_inputs`` on CPU under vllm-omni's own ``execute_model``), on the
generation runner: unpatched on vLLM 0.28+ every generation step dies at vllm-omni's unpack with the real
``ValueError``; patched the unpack takes vLLM's ``logits_indices`` / ``spec_decode_metadata`` and the step goes on.
"""

from __future__ import annotations

import pytest

from conftest import needs_omni, needs_startup_hook
from tests.bridges.test_ar_runner_prepare_inputs import (
    DECISION_IDS,
    DECISIONS,
    UNPACKED,
    check_decision,
    check_facts,
    check_native,
    check_patched,
    check_unpatched,
)
from vllm_compat.bridges import _runner_return as shared
from vllm_compat.bridges import generation_runner_prepare_inputs as bridge
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
S = shared.Shape
RUNNER = "vllm_omni.worker.gpu_generation_model_runner:GPUGenerationModelRunner"
differs = pytest.mark.skipif(STATIC.shape != S.DIFFERS, reason="needs vLLM 0.28-0.33 under vllm-omni 0.24.0 / 0.26.0 "
                             f"(vLLM's _prepare_inputs returns more than vllm-omni unpacks); here {STATIC}")
same = pytest.mark.skipif(STATIC.shape != S.SAME or STATIC.unpacked != UNPACKED, reason="needs vLLM 0.24-0.27 under "
                          "vllm-omni 0.24.0 / 0.26.0 (the 2 values their runners unpack; the scenario builds those "
                          f"runners); here {STATIC}")


@pytest.mark.parametrize(("facts", "action", "leaves_out"), DECISIONS, ids=DECISION_IDS)
def test_decision_table(facts, action, leaves_out):
    check_decision(POINT, facts, action, leaves_out)


@needs_omni
def test_facts_are_what_the_wheels_say():
    check_facts(POINT)


@needs_omni
@differs
def test_unpatched_every_generation_step_dies_at_vllm_omnis_unpack():
    check_unpatched(POINT, RUNNER)


@needs_omni
@differs
@needs_startup_hook
def test_patched_the_unpack_gets_vllms_logits_indices_and_the_step_goes_on():
    check_patched(POINT, RUNNER)


@needs_omni
@same
@needs_startup_hook
def test_on_the_native_pair_patched_and_unpatched_agree():
    check_native(POINT, RUNNER)
