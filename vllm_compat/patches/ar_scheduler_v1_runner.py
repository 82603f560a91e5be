"""Patch ``vllm_omni.core.sched.omni_ar_scheduler.OmniARScheduler.__init__``: schedule for the V1 runner the AR worker runs.

Why: vLLM 0.25 made Model Runner V2 the default for dense models (``VllmConfig._is_default_v2_model_runner_model``:
``or not model_config.is_moe``). vllm-omni <= 0.28.0's ``GPUARWorker`` forces the V1 runner, while
``OmniARScheduler`` keeps vLLM's ``use_v2_model_runner`` from the config and leaves out what the V1 runner reads:
an LLM / AR stage dies at its first requests (``KeyError`` in the runner's ``_update_states``; H200,
``gpu/results.md``, "LLM stage"). vllm-omni 0.30.0 makes its schedulers agree with their workers; this does the
same (``patches/_scheduler_runner.py``).
When: vllm-omni's AR worker assigns ``self.use_v2_model_runner = False``, no file of its schedulers assigns the flag,
and vLLM's ``Scheduler`` reads it from the config (all from files): after ``OmniARScheduler.__init__`` (and so
``OmniARAsyncScheduler``'s), the flag is False. Where vLLM's config already says V1 it changes nothing.
Serves: vllm-omni 0.24.0-0.28.0 on vLLM 0.25+ (0.24.0 measured on 0.25.1, H200).
Retire when: the oldest supported vllm-omni is 0.30.0.
"""

from __future__ import annotations

from ._scheduler_runner import SchedulerRunnerPatch


class ARSchedulerV1Runner(SchedulerRunnerPatch):
    worker_file = "vllm_omni/worker/gpu_ar_worker.py"
    scheduler_file = "vllm_omni/core/sched/omni_ar_scheduler.py"


DRIFT_POINT = ARSchedulerV1Runner()
