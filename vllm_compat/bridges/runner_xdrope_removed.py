"""Stand-in for vLLM's ``GPUModelRunner.uses_xdrope_dim`` (dropped in vLLM 0.30), on vllm-omni's ``OmniGPUModelRunner``.

Why: vLLM <= 0.29's ``GPUModelRunner.__init__`` set ``self.uses_xdrope_dim = model_config.uses_xdrope_dim`` (the
XD-RoPE section count, 0 for every model without XD-RoPE); vLLM 0.30 removed XD-RoPE from the runner and the
attribute with it. vllm-omni 0.24.0-0.28.0's ``OmniGPUModelRunner`` still reads it unconditionally: in
``_update_states`` for every new request (``if self.uses_xdrope_dim > 0: self._init_xdrope_positions(...)``), in
``_preprocess`` and in ``_dummy_run`` (its AR and generation runners derive it), so on vLLM 0.30+ every LLM / AR or
generation step with a new request dies with ``AttributeError: 'GPUARModelRunner' object has no attribute
'uses_xdrope_dim'``.
When: no class on the runner's walk in vLLM's files (``GPUModelRunner`` and its mixins) assigns or defines
``uses_xdrope_dim`` and a vllm-omni runner reads ``self.uses_xdrope_dim`` (both read with ``ast``):
``OmniGPUModelRunner`` gets a class-level ``uses_xdrope_dim`` that reads 0. Nothing is left out: vLLM 0.30+ runs no
XD-RoPE model at all, so 0 is what vLLM's own ``__init__`` would have said for every model it can run, and the reads
that follow only under ``uses_xdrope_dim > 0`` (``self.xdrope_positions``, ``self._init_xdrope_positions``) are never
reached, as on vLLM 0.29 for a model without XD-RoPE. A vLLM that assigns it (<= 0.29), or a vllm-omni that defines
it, keeps its own.
Serves: vllm-omni 0.24.0-0.28.0's LLM / AR and generation runners on vLLM 0.30-0.33 (read from the wheels;
``_preprocess`` measured on CPU against the native pair); vLLM 0.34 has no V1 runner.
Retire when: the oldest supported vllm-omni no longer reads ``self.uses_xdrope_dim`` (0.30.0 does not).
"""

from __future__ import annotations

from ._runner_default import RunnerDefault, RunnerDefaultStandIn

NAME = "uses_xdrope_dim"  # the catalogue row's target: OmniGPUModelRunner.uses_xdrope_dim
STAND_IN = RunnerDefault(0)  # one object, so a revert and a second apply put back the same one
# what vllm-omni reads only where uses_xdrope_dim > 0: never, with the default
GUARDED = ("xdrope_positions", "_init_xdrope_positions")


class RunnerXDRoPERemoved(RunnerDefaultStandIn):
    name, stand_in, removed_in = NAME, STAND_IN, "0.30"
    patched_reason = ("what vLLM <= 0.29's __init__ gave every model without XD-RoPE; nothing is left out, as vLLM "
                      "0.30 itself dropped XD-RoPE models")
    handles_drift = tuple(("attribute", f"vllm.v1.worker.gpu_model_runner.GPUModelRunner.{attribute}",
                           "vllm_omni.worker.*", attribute) for attribute in (NAME, *GUARDED))


DRIFT_POINT = RunnerXDRoPERemoved()
