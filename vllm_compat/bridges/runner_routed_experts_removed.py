"""Stand-in for ``GPUModelRunner.routed_experts_initialized`` (dropped in vLLM 0.31), on ``OmniGPUModelRunner``.

Why: vLLM <= 0.30's ``GPUModelRunner.__init__`` set ``self.routed_experts_initialized = False`` (True only once
routed-experts capture was set up for ``enable_return_routed_experts``, with ``routed_experts_capturer`` and its CPU
buffers); vLLM 0.31 moved that capture out of the runner (an aux-output connector) and dropped the attribute.
vllm-omni 0.24.0-0.30.0's runners still read it unconditionally: ``GPUARModelRunner.execute_model``,
``GPUGenerationModelRunner.execute_model`` / ``sample_tokens`` and ``OmniGPUModelRunner``'s
``_omni_extract_routed_experts`` / ``_omni_routed_experts_d2h``, so on vLLM 0.31+ every LLM / AR and generation step
dies with ``AttributeError: 'GPUARModelRunner' object has no attribute 'routed_experts_initialized'``.
When: no class on the runner's walk in vLLM's files (``GPUModelRunner`` and its mixins) assigns or defines
``routed_experts_initialized`` and a vllm-omni runner reads ``self.routed_experts_initialized`` (both read with
``ast``): ``OmniGPUModelRunner`` gets a class-level ``routed_experts_initialized`` that reads False, what vLLM <=
0.30 gave a runner without routed-experts capture. Every read of the capture's state (``routed_experts_capturer``,
``routed_experts_cpu``, ``routed_experts_slot_mapping_cpu`` / ``_device``) is under it, so none is reached. Left
out: routed-experts capture (the experts each token was routed to) in the LLM / AR stages, which vllm-omni's runners
cannot reach in vLLM's new connector. A vLLM that assigns it (<= 0.30), or a vllm-omni that defines it, keeps its own.
Serves: vllm-omni 0.24.0-0.30.0's LLM / AR and generation runners on vLLM 0.31-0.33 (read from the wheels; measured
on CPU against the native pair); vLLM 0.34 has no V1 runner.
Retire when: the oldest supported vllm-omni no longer reads ``self.routed_experts_initialized``.
"""

from __future__ import annotations

from ._runner_default import RunnerDefault, RunnerDefaultStandIn

NAME = "routed_experts_initialized"  # the catalogue row's target: OmniGPUModelRunner.routed_experts_initialized
STAND_IN = RunnerDefault(False)  # one object, so a revert and a second apply put back the same one
# what vllm-omni reads only where routed_experts_initialized is true: never, with the default
GUARDED = ("routed_experts_capturer", "routed_experts_cpu", "routed_experts_slot_mapping_cpu",
           "routed_experts_slot_mapping_device")
LEAVES_OUT = "routed-experts capture (return of the experts each token was routed to) in the LLM / AR stages"


class RunnerRoutedExpertsRemoved(RunnerDefaultStandIn):
    name, stand_in, removed_in = NAME, STAND_IN, "0.31"
    patched_reason = "what vLLM <= 0.30's __init__ gave a runner without routed-experts capture"
    leaves_out = LEAVES_OUT
    handles_drift = tuple(("attribute", f"vllm.v1.worker.gpu_model_runner.GPUModelRunner.{attribute}",
                           "vllm_omni.worker.*", attribute) for attribute in (NAME, *GUARDED))


DRIFT_POINT = RunnerRoutedExpertsRemoved()
