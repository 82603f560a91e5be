"""Drives one of vllm-omni's own AR schedulers on CPU through one request, step by step, in the order vLLM's
``EngineCore.step_with_batch_queue`` runs them under async scheduling (vLLM's default), and records, per scheduler
output, what vllm-omni's V1 model runner would look up: the first-request ``KeyError`` of ``ar_scheduler_v1_runner``
(issue 35), without a GPU.

What is real: vLLM's config, its ``Scheduler`` / ``AsyncScheduler`` under vllm-omni's ``OmniARScheduler`` /
``OmniARAsyncScheduler`` (the class a stage config names), the requests, ``update_from_output`` and vLLM's
``ModelRunnerOutput`` / ``EMPTY_MODEL_RUNNER_OUTPUT``. What is not: the model (each scheduled request samples the next
token of a counter) and the runner, which needs a GPU; its persistent-batch rule is applied as vllm-omni's
``OmniGPUModelRunner._update_states`` states it (``vllm_omni/worker/gpu_model_runner.py``, read by
``runner_reads_all_token_ids``): a request not scheduled in a step leaves the persistent batch; one scheduled again
outside it with output tokens, under async scheduling, is looked up in ``scheduled_cached_reqs.all_token_ids`` --
``req_data.all_token_ids[req_id]``, a ``KeyError`` when the scheduler left it out.

The engine loop, as vLLM 0.25-0.33's ``step_with_batch_queue`` (queue size ``vllm_config.max_concurrent_batches``,
2 with async scheduling): schedule (the runner sees every output, an empty one too: vllm-omni's AR runner calls
``_update_states`` before its empty-batch return), queue it, and only when the queue is full (or nothing more can be
scheduled) pop the oldest and hand the scheduler its output. A sync scheduler class under async scheduling then
schedules nothing in every other step (it keeps no output placeholders), so its request leaves the runner's batch and
comes back with an output token: the V1 runner's resumed path.

    python _scheduler_steps_worker.py MODEL_DIR {ar|ar_async|generation} [MAX_TOKENS]

Prints one JSON line. Run (``run``) by ``tests/patches/test_scheduler_v1_runner_steps.py``.
"""

import ast
import json
import runpy
import sys
from collections import deque
from pathlib import Path

SCHEDULERS = {"ar": ("vllm_omni.core.sched.omni_ar_scheduler", "OmniARScheduler"),
              "ar_async": ("vllm_omni.core.sched.omni_ar_scheduler", "OmniARAsyncScheduler"),
              "generation": ("vllm_omni.core.sched.omni_generation_scheduler", "OmniGenerationScheduler")}
PATCHED_CLASSES = ("OmniARScheduler", "OmniGenerationScheduler")  # whose __init__ the two scheduler patches wrap
RUNNER_FILE = "vllm_omni/worker/gpu_model_runner.py"
PROMPT_TOKENS = 8


def runner_reads_all_token_ids(source: str) -> bool:
    """Whether the runner file reads ``req_data.all_token_ids[req_id]`` under a test naming ``use_async_scheduling``
    and ``num_output_tokens`` (the V1 runner's resumed path), and removes the unscheduled requests from its batch."""
    tree = ast.parse(source)
    guarded = False
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        names = {n.attr if isinstance(n, ast.Attribute) else getattr(n, "id", None) for n in ast.walk(node.test)}
        if not {"use_async_scheduling", "num_output_tokens"} <= names:
            continue
        guarded |= any(isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute)
                       and n.value.attr == "all_token_ids" for stmt in node.body for n in ast.walk(stmt))
    removes = any(isinstance(n, ast.Name) and n.id == "unscheduled_req_ids" for n in ast.walk(tree))
    return guarded and removes


def main(model_dir: str, which: str, max_tokens: int = 6) -> None:

    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
    from vllm.v1.request import Request

    from vllm_compat.drift import is_ours

    # The same tiny dense model, config and construction as the scheduler test's worker (by path: this file also
    # runs as a script); async scheduling on, vLLM's default on a GPU.
    worker = runpy.run_path(str(Path(__file__).with_name("_scheduler_runner_worker.py")))
    scheduler_class = worker["scheduler_class_of"](SCHEDULERS[which])
    scheduler, config = worker["build_scheduler"](model_dir, scheduler_class, async_scheduling=True)
    scheduler.add_request(Request(request_id="r0", prompt_token_ids=list(range(PROMPT_TOKENS)),
                                  sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                                  pooling_params=None))

    queue_size = config.max_concurrent_batches
    queue: deque = deque()
    batch: set[str] = set()  # the runner's persistent batch
    steps, missing, tokens, finished = [], [], [], False
    next_token = 100
    for step in range(8 * max_tokens + 16):
        if scheduler.has_requests():
            out = scheduler.schedule()
            cached = out.scheduled_cached_reqs
            scheduled = set(out.num_scheduled_tokens)
            # The runner's _update_states: finished and unscheduled requests leave its batch, new ones join it.
            unscheduled = batch - (scheduled - set(getattr(cached, "resumed_req_ids", ()) or ()))
            batch -= unscheduled | set(out.finished_req_ids)
            batch |= {r.req_id for r in out.scheduled_new_reqs}
            lookups = []
            for i, req_id in enumerate(cached.req_ids):
                if req_id not in batch:
                    if cached.num_output_tokens[i] > 0:  # use_async_scheduling: on here
                        lookups.append(req_id)
                        if req_id not in (cached.all_token_ids or {}):
                            missing.append([step, req_id])
                    batch.add(req_id)
            steps.append({"step": step, "scheduled": sorted(scheduled), "left_batch": sorted(unscheduled),
                          "all_token_ids_lookups": lookups, "all_token_ids_sent": sorted(cached.all_token_ids or {})})
            executed = out.total_num_scheduled_tokens > 0
            queue.appendleft((out, executed))
            if len(queue) < queue_size and (executed or scheduler.has_requests()):
                continue
        elif not queue:
            break
        out, executed = queue.pop()
        if executed:
            ids = list(out.num_scheduled_tokens)
            output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                       sampled_token_ids=[[next_token] for _ in ids])
            next_token += 1
        else:
            output = EMPTY_MODEL_RUNNER_OUTPUT
        for engine_outputs in scheduler.update_from_output(out, output).values():
            for o in engine_outputs.outputs:
                tokens.extend(o.new_token_ids)
                finished |= o.finish_reason is not None
    print(json.dumps({
        "scheduler": scheduler_class.__name__,
        "wrapped": is_ours(vars(_init_owner(scheduler_class))["__init__"]),
        "config_says_v2": bool(config.use_v2_model_runner),
        "scheduler_v2": bool(scheduler.use_v2_model_runner),
        "async_scheduling": bool(config.scheduler_config.async_scheduling),
        "queue_size": queue_size,
        "missing_all_token_ids": missing,
        "tokens": tokens,
        "finished": finished,
        "steps": steps,
    }))


def _init_owner(cls):
    """The class whose ``__init__`` the scheduler patches wrap (the async AR class inherits ``OmniARScheduler``'s)."""
    return next(c for c in cls.__mro__ if c.__name__ in PATCHED_CLASSES)


def run(which: str, tmp_path: Path, env: dict | None = None, max_tokens: int = 6) -> dict:
    """What ``main`` prints, run in a fresh interpreter of the tests' env (``conftest.run_python``, warm)."""
    from conftest import run_python  # the tests' helper; the script itself runs without it

    done = run_python(f"import runpy, sys; sys.argv = ['w', {str(tmp_path / 'lm')!r}, {which!r}, '{max_tokens}']; "
                      f"runpy.run_path({__file__!r}, run_name='__main__')", env=env, warm=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 6)
