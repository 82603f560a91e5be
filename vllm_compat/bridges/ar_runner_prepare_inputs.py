"""Adapter for vllm-omni's ``GPUARModelRunner.execute_model``: the tuple vLLM 0.28+'s ``_prepare_inputs`` returns.

Why: vllm-omni 0.24.0 and 0.26.0's AR runner (``vllm_omni/worker/gpu_ar_model_runner.py``) has its own
``execute_model``, which unpacks the 2 values vLLM 0.24-0.27's ``GPUModelRunner._prepare_inputs`` returns
(``logits_indices, spec_decode_metadata``). vLLM 0.28 added a third, ``max_num_sampled_tokens`` (vLLM's own
``execute_model`` hands it to ``_build_attention_metadata``, which reads it only for KV-sharing fast prefill). So every
AR step dies on vLLM 0.28-0.33 with ``ValueError: too many values to unpack (expected 2)``, while the stage starts.
When: vLLM's return (its third element named by vLLM's own ``execute_model``'s unpack) and vllm-omni's unpack targets
(both read from the files with ``ast``) name different values, every one vllm-omni unpacks being among vLLM's. For the
length of vllm-omni's ``execute_model`` on that runner, ``_prepare_inputs`` gives the values vllm-omni names, in its
order (the shared base, ``_runner_return``); everywhere else it is vLLM's, unchanged. The added value is dropped:
vllm-omni's call of ``_build_attention_metadata`` does not pass it, so KV-sharing fast prefill gets vLLM's default
(None) there, and the decision names it as left out. Same names: nothing to do (0.24-0.27); vllm-omni 0.28.0+ unpacks 3.
Serves: vllm-omni 0.24.0 / 0.26.0's AR runner on vLLM 0.28-0.33 (read from the 0.24-0.34 wheels; 0.34 has no V1 model
runner, so that stage is left out there).
Retire when: the oldest supported vllm-omni unpacks what vLLM's ``_prepare_inputs`` returns (vllm-omni 0.28.0 does).
"""

from __future__ import annotations

from ._runner_return import RunnerReturnAdapter, adapted_method

METHOD = "_prepare_inputs"
# What dropping an added value leaves out, in users' words.
FEATURES = {"max_num_sampled_tokens": "KV-sharing fast prefill (kv_sharing_fast_prefill) in the LLM / AR stages"}


class ARRunnerPrepareInputs(RunnerReturnAdapter):
    omni_runner, omni_class = "vllm_omni/worker/gpu_ar_model_runner.py", "GPUARModelRunner"
    method, caller, stage, features = METHOD, "execute_model", "the AR stage", FEATURES
    adapted = adapted_method(METHOD, __name__)


DRIFT_POINT = ARRunnerPrepareInputs()
