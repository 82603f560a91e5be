"""Patch ``vllm_omni.core.sched.omni_generation_scheduler.OmniGenerationScheduler.__init__``: schedule for the V1 runner the generation worker runs.

Why: as ``ar_scheduler_v1_runner``, for the generation stages (e.g. a code2wav stage): vllm-omni <= 0.28.0's
``GPUGenerationWorker`` forces the V1 runner while ``OmniGenerationScheduler`` follows vLLM's config, which says V2
for dense models since vLLM 0.25; the scheduler then takes its V2 branch (new requests with their prefill token
ids, resumed ones as new) for a V1 runner. vllm-omni 0.30.0 makes its schedulers agree with their workers; this
does the same (``patches/_scheduler_runner.py``).
When: vllm-omni's generation worker assigns ``self.use_v2_model_runner = False``, no file of its schedulers assigns
the flag, and vLLM's ``Scheduler`` reads it from the config (all from files): after
``OmniGenerationScheduler.__init__``, the flag is False.
Serves: vllm-omni 0.24.0-0.28.0 on vLLM 0.25+ (read from the wheels; no generation stage was run on a GPU).
Retire when: the oldest supported vllm-omni is 0.30.0.
"""

from __future__ import annotations

from ._scheduler_runner import SchedulerRunnerPatch


class GenerationSchedulerV1Runner(SchedulerRunnerPatch):
    worker_file = "vllm_omni/worker/gpu_generation_worker.py"
    scheduler_file = "vllm_omni/core/sched/omni_generation_scheduler.py"


DRIFT_POINT = GenerationSchedulerV1Runner()
