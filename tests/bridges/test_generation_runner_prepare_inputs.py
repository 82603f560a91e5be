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
    check_decision,
    check_facts,
    check_native,
    check_patched,
    check_unpatched,
    shape_marks,
)
from vllm_compat.bridges import generation_runner_prepare_inputs as bridge

POINT = bridge.DRIFT_POINT
RUNNER = "vllm_omni.worker.gpu_generation_model_runner:GPUGenerationModelRunner"
differs, same = shape_marks(POINT)


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
