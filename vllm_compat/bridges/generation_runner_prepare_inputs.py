"""Adapter for vllm-omni's ``GPUGenerationModelRunner.execute_model``: the tuple vLLM 0.28+'s ``_prepare_inputs`` returns.

Why: as ``ar_runner_prepare_inputs``, for vllm-omni 0.24.0 and 0.26.0's generation runner
(``vllm_omni/worker/gpu_generation_model_runner.py``: the code2wav / generation stages of TTS and omni pipelines), whose
own ``execute_model`` unpacks the 2 values of vLLM 0.24-0.27's ``GPUModelRunner._prepare_inputs`` where vLLM 0.28+
returns 3 (``max_num_sampled_tokens`` added): every generation step dies with ``ValueError``.
When: the same facts, read from the generation runner's file; the same adaptation inside its ``execute_model`` only
(the shared base, ``_runner_return``); the added value dropped and KV-sharing fast prefill named as left out.
Serves: vllm-omni 0.24.0 / 0.26.0's generation runner on vLLM 0.28-0.33 (read from the 0.24-0.34 wheels).
Retire when: the oldest supported vllm-omni unpacks what vLLM's ``_prepare_inputs`` returns (vllm-omni 0.28.0 does).
"""

from __future__ import annotations

from ._runner_return import RunnerReturnAdapter, adapted_method
from .ar_runner_prepare_inputs import FEATURES, METHOD


class GenerationRunnerPrepareInputs(RunnerReturnAdapter):
    omni_runner, omni_class = "vllm_omni/worker/gpu_generation_model_runner.py", "GPUGenerationModelRunner"
    method, caller, stage, features = METHOD, "execute_model", "the generation stage", FEATURES
    adapted = adapted_method(METHOD, __name__)


DRIFT_POINT = GenerationRunnerPrepareInputs()
