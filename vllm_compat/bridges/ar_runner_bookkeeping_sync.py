"""Adapter for vllm-omni's ``GPUARModelRunner.sample_tokens``: the tuple vLLM 0.30-0.33's ``_bookkeeping_sync`` returns.

Why: vllm-omni 0.24.0's AR runner (``vllm_omni/worker/gpu_ar_model_runner.py``) has its own ``sample_tokens``, which
unpacks the 7 values vLLM 0.24's ``GPUModelRunner._bookkeeping_sync`` returns. vLLM 0.30 added an eighth, second in
the tuple: ``num_nans``, the per-row NaN counts of the logits left on the device (set only with
``VLLM_COMPUTE_NANS_IN_LOGITS`` under async scheduling; vLLM's own ``sample_tokens`` hands it to
``AsyncGPUModelRunnerOutput``, which turns it into ``num_nans_in_logits``). So every AR step dies on vLLM 0.30-0.33 with
``ValueError: too many values to unpack (expected 7)``.
When: vLLM's return statement and vllm-omni's unpack targets (both read from the files with ``ast``) name different
values, every one vllm-omni unpacks being among vLLM's. For the length of vllm-omni's ``sample_tokens`` on that runner,
``_bookkeeping_sync`` (a method put on vllm-omni's class, calling vLLM's) gives the values vllm-omni names, in its
order; everywhere else it is vLLM's, unchanged (vLLM's own callers expect all 8). Where vLLM's method sets the added
value in the branch of an ``if`` whose other branch computes a value vllm-omni takes with a method of vLLM's
(0.30-0.33: ``num_nans`` under async scheduling, ``num_nans_in_logits = self._get_nans_in_logits(logits)`` under
sync), and the added value is set, that method gives vllm-omni its value: the NaN counts reach the AR stage's output,
as on vLLM 0.24. An added value without such a branch is dropped, and the decision names what it leaves out. Same
names: nothing to do (0.24); an unpack or a return that is not a flat tuple of names, or a name vllm-omni unpacks
that vLLM no longer returns: refused.
Serves: vllm-omni 0.24.0's AR runner on vLLM 0.30-0.33 (read from the 0.24, 0.30, 0.33 and 0.34 wheels; 0.34 has no
V1 model runner, so that stage is left out there).
Retire when: the oldest supported vllm-omni unpacks what vLLM's ``_bookkeeping_sync`` returns.

Why not replace ``_bookkeeping_sync`` for every caller: vLLM's own ``GPUModelRunner.sample_tokens`` calls it too and
unpacks all 8, and a subclass of vllm-omni's runner may reach vLLM's; the shared base (``_runner_return``) adapts only
vllm-omni's call. A ``_bookkeeping_sync`` a test sets on the class or the instance (vllm-omni's own
``test_sample_tokens_tail_only_prefix_cache_uses_staged_cpu_hidden_states`` does, returning 7) takes precedence, as
before. Not concerned: vllm-omni's NPU AR runner (``platforms/npu/worker/npu_ar_model_runner.py``) unpacks 6 values
from a ``_bookkeeping_sync`` called with 6 arguments: vllm-ascend's own method (its runner overrides vLLM's), which
follows vllm-ascend's releases, not vLLM's, and no env here installs.
"""

from __future__ import annotations

from ._runner_return import RunnerReturnAdapter, adapted_method

METHOD, CALLER = "_bookkeeping_sync", "sample_tokens"  # vLLM's method; vllm-omni's (the catalogue row's target)
# What dropping an added value leaves out, in users' words, where vLLM's method gives no way to recompute it.
FEATURES = {"num_nans": "NaN counting in the AR stage's logits under async scheduling (VLLM_COMPUTE_NANS_IN_LOGITS)"}


class ARRunnerBookkeepingSync(RunnerReturnAdapter):
    omni_runner, omni_class = "vllm_omni/worker/gpu_ar_model_runner.py", "GPUARModelRunner"
    method, caller, stage, features = METHOD, CALLER, "the AR stage", FEATURES
    adapted = adapted_method(METHOD, __name__)


DRIFT_POINT = ARRunnerBookkeepingSync()
