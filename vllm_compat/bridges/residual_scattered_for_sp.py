"""Stand-in for ``vllm.v1.worker.utils.is_residual_scattered_for_sp``, removed in vLLM 0.32.0.

Why: vLLM <= 0.31 asks it, on a pipeline-parallel rank that is not the last, whether sequence parallelism scattered
the residual tensor across the tensor-parallel ranks (then the residual must not take ``send_tensor_dict``'s
all-gather shortcut). vLLM 0.32 removed the sequence-parallel compilation pass (``pass_config.enable_sp``) and the
function with it; its own V1 runner now sends without ``all_gather_tensors``. vllm-omni 0.24.0-0.30.0 import the name
at module level in ``vllm_omni/worker/gpu_ar_model_runner.py``, which their AR worker imports: on vLLM 0.32 / 0.33
every LLM / AR stage (multi-stage pipelines, TTS and audio models) dies with ``ImportError: cannot import name
'is_residual_scattered_for_sp'``, offline and served (on 0.34 the V1 runner itself is gone: not bridged).
When: ``vllm.v1.worker.utils`` lacks the name and an installed vllm-omni imports it (read from its files). A vLLM that
defines it (<= 0.31) keeps its own.
Serves: vllm-omni 0.24.0-0.30.0's LLM / AR stages on vLLM 0.32-0.33 (the import; read from the 0.31.0, 0.32.0 and
0.33.0 wheels, not run on a GPU).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.v1.worker.utils.is_residual_scattered_for_sp``.

The definition is vLLM 0.31's, reading the pass's switch where the config still has one: on vLLM 0.32+ there is no
sequence-parallel pass, so the residual is never scattered and the answer is ``False`` (vllm-omni then passes
``{"residual": True}``, the all-gather vLLM 0.32's own runner leaves on by default).
``tests/bridges/test_residual_scattered_for_sp.py`` compares it with vLLM 0.31.0's function, read from its wheel.
"""

from __future__ import annotations

from ._name_stand_in import NameStandIn

NAME = "is_residual_scattered_for_sp"  # the catalogue row's target, on vllm.v1.worker.utils
# The vllm-omni files that import it (0.24.0-0.30.0): read, never imported.
IMPORTERS = ("vllm_omni/worker/gpu_ar_model_runner.py",)


def is_residual_scattered_for_sp(vllm_config, num_input_tokens: int) -> bool:
    """Whether sequence parallelism scatters the residual tensor across the tensor-parallel ranks (vLLM 0.31's
    answer; stand-in by vllm_compat): only with the sequence-parallel pass on (which vLLM 0.32+ no longer has) and
    more than one tensor-parallel rank."""
    compilation = vllm_config.compilation_config
    if not getattr(getattr(compilation, "pass_config", None), "enable_sp", False):
        return False
    tp = vllm_config.parallel_config.tensor_parallel_size
    if tp == 1:
        return False
    assert compilation.use_inductor_graph_partition or not compilation.splitting_ops, (
        "Sequence parallelism requires full-graph compilation")
    # With sequence parallelism num_input_tokens is padded to a multiple of the tensor-parallel size earlier.
    assert num_input_tokens % tp == 0
    return True


class ResidualScatteredForSpStandIn(NameStandIn):
    importers = IMPORTERS
    removed_in = "0.32"

    def build(self, owner):
        return is_residual_scattered_for_sp


DRIFT_POINT = ResidualScatteredForSpStandIn()
