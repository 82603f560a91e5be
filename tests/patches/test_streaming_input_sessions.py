"""``streaming_input_sessions``: vLLM 0.33 re-queues a continuing streaming session in its own
``Scheduler.update_from_output``, which vllm-omni 0.24.0's schedulers replace; the feature is reported left out.

vllm-omni's own AR (sync and async) and generation schedulers on the installed vLLM, on CPU (built as
``tests/patches/_scheduler_runner_worker.py`` builds them), take a streaming session of two input chunks in vLLM's
engine order (``step_with_batch_queue``; each scheduled request samples the next token of a counter, the model's
stand-in). Recorded: the prompt each turn is scheduled with. On the native pair (and any vLLM that re-queues in
``_handle_stopped_request``) the second turn runs with the prompt vllm-omni's code builds; on vLLM 0.33+ it never
runs, and that is exactly where the decision says the feature is left out (nothing is installed anywhere). vLLM
0.34, whose LLM / AR stages are left out as a whole, runs the rest only. Then the facts per installed version, the
readers and the decision table.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, needs_v1_model_runner, run_python
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite
from vllm_compat.patches import streaming_input_sessions as point_module

# what these tests expect was measured with vllm-omni 0.24.0's files (the release its drift is in)
measured_omni = pytest.mark.skipif(OMNI_VERSION != "0.24.0", reason="expectations measured with vllm-omni 0.24.0; "
                                   f"this env has {OMNI_VERSION}")

POINT = point_module.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
K = point_module.Kind
WORKER = Path(__file__).with_name("_scheduler_runner_worker.py")
PROMPT, CHUNK = list(range(8)), [50, 51]

# Runs in a fresh interpreter with vllm_compat as users get it. Prints one JSON line: the prompt of each turn the
# scheduler sends as a new request, and the tokens it returned.
SCRIPT = r"""
import json, runpy, sys
from collections import deque
import vllm_omni  # noqa: F401 - puts OmniRequest in place of vLLM's Request, as in every vllm-omni engine
from vllm.sampling_params import SamplingParams
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm_omni.outputs import OmniModelRunnerOutput

worker_file, model_dir, which, prompt, chunk = sys.argv[1:6]
worker = runpy.run_path(worker_file)
module = "vllm_omni.core.sched." + ("omni_generation_scheduler" if which == "generation" else "omni_ar_scheduler")
name = {"ar": "OmniARScheduler", "ar_async": "OmniARAsyncScheduler", "generation": "OmniGenerationScheduler"}[which]
scheduler, config = worker["build_scheduler"](model_dir, worker["scheduler_class_of"]((module, name)),
                                              async_scheduling=which == "ar_async")


def turn(prompt_ids, resumable=True):
    return Request(request_id="s", prompt_token_ids=prompt_ids, pooling_params=None, resumable=resumable,
                   sampling_params=SamplingParams(max_tokens=3, ignore_eos=True))


# The session, its next input chunk and its end, all sent up front (queued on the session, as a client streams).
for request in (turn(json.loads(prompt)), turn(json.loads(chunk)), turn([1], resumable=False)):
    scheduler.add_request(request)
queue_size = config.max_concurrent_batches if which == "ar_async" else 1
batches, turns, tokens, next_token = deque(), [], [], 100
for _ in range(40):  # vLLM's step_with_batch_queue: schedule, queue, hand back the oldest when full
    if scheduler.has_requests():
        out = scheduler.schedule()
        turns += [list(r.prompt_token_ids) for r in out.scheduled_new_reqs]
        batches.appendleft(out)
        if len(batches) < queue_size and out.total_num_scheduled_tokens > 0:
            continue
    elif not batches:
        break
    out = batches.pop()
    ids = list(out.num_scheduled_tokens)
    sampled = [[] if which == "generation" else [next_token] for _ in ids]
    next_token += bool(ids)
    result = OmniModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                   sampled_token_ids=sampled)
    if not hasattr(result, "routed_experts"):
        # vllm-omni's update_from_output reads it at every stop; vLLM 0.31+ dropped the field (another drift, not
        # this one's): a runner without routed experts, as vLLM 0.30's default said
        result.routed_experts = None
    for outputs in scheduler.update_from_output(out, result).values():
        for output in outputs.outputs:
            tokens += list(output.new_token_ids)
print("RESULT" + json.dumps({"turns": turns, "tokens": tokens}))
"""


def _expected_second_turn(which: str) -> list[int]:
    """vllm-omni 0.24.0's code: the AR stage extends the prompt with the first turn's outputs but the last sampled
    one (three tokens of a counter from 100: [100, 101]) and the chunk; the generation stage replaces it."""
    return CHUNK if which == "generation" else PROMPT + [100, 101] + CHUNK


@pytest.mark.parametrize(("facts", "left_out"), [
    (point_module.StreamingSessionFacts(K.REQUEUES_IN_UPDATE, "all_but_last", ("a.py:S",)), True),
    (point_module.StreamingSessionFacts(K.REQUEUES_IN_UPDATE, "all_but_last", ()), False),
    (point_module.StreamingSessionFacts(K.REQUEUES_ON_STOP, "computed", ("a.py:S",)), False),
], ids=["requeues_in_update+replaced", "requeues_in_update+not_replaced", "requeues_on_stop"])
def test_decision_table(facts, left_out):
    decision = POINT.decide(facts, Controls())
    assert decision.action == Action.SKIPPED  # never patched: nothing is installed
    assert decision.leaves_out == (point_module.LEAVES_OUT if left_out else "")
    assert bool(POINT.report_lines(facts)) == left_out
    assert POINT.decide(point_module.StreamingSessionFacts(K.ABSENT), Controls()).action == Action.PENDING


def test_the_readers_tell_the_shapes_apart():
    old = ("class Scheduler:\n    def _handle_stopped_request(self, r):\n        self._enqueue_waiting_request(r)\n"
           "    def _update_request_as_session(self, s, u):\n"
           "        n = s.num_computed_tokens\n        b = s.num_tokens\n")
    new = ("class Scheduler:\n    def _handle_stopped_request(self, r):\n        return False\n"
           "    def _update_request_as_session(self, s, u):\n        keep_end = s.num_tokens - 1\n")
    assert point_module.vllm_shape(old) == (K.REQUEUES_ON_STOP, "computed")
    assert point_module.vllm_shape(new) == (K.REQUEUES_IN_UPDATE, "all_but_last")
    omni = ("class A:\n    def update_from_output(self, o):\n        self._handle_stopped_request(r)\n"
            "class B:\n    def update_from_output(self, o):\n        self._handle_stopped_request(r)\n"
            "        self._enqueue_waiting_request(r)\n")
    assert point_module.replacers_in(omni, "x.py") == ("x.py:A",)


@needs_omni
@pytest.mark.skipif(VLLM_VERSION is None or Version(VLLM_VERSION) < Version("0.24"), reason="vLLM 0.24+")
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    """vLLM <= 0.32 re-queues in _handle_stopped_request and keeps the computed tokens, 0.33+ neither (read from
    the 0.24.0, 0.30.0, 0.31.0, 0.32.0, 0.33.0 and 0.34.0 wheels); both of vllm-omni 0.24.0's schedulers replace
    update_from_output without re-queueing."""
    new = Version(VLLM_VERSION) >= Version("0.33")
    assert (STATIC.host, STATIC.keeps) == ((K.REQUEUES_IN_UPDATE, "all_but_last") if new
                                           else (K.REQUEUES_ON_STOP, "computed"))
    assert set(STATIC.replacers) >= {"vllm_omni/core/sched/omni_ar_scheduler.py:OmniARScheduler",
                                     "vllm_omni/core/sched/omni_generation_scheduler.py:OmniGenerationScheduler"}
    assert POINT.detect_runtime(importlib.import_module(POINT.target_module)) == STATIC


@needs_omni
@needs_v1_model_runner
@pytest.mark.parametrize("which", ["ar", "ar_async", "generation"])
@measured_omni
def test_a_session_takes_its_next_chunk_exactly_where_the_feature_is_not_left_out(which, tmp_path):
    argv = ["session", str(WORKER), str(tmp_path / "lm"), which, json.dumps(PROMPT), json.dumps(CHUNK)]
    done = run_python(f"import sys; sys.argv = {argv!r}; exec(compile({SCRIPT!r}, 'session', 'exec'))", warm=True)
    assert done.returncode == 0, done.stderr[-3000:]
    turns = json.loads(done.stdout.split("RESULT", 1)[1])["turns"]
    decision = POINT.decide(STATIC, Controls())
    if point_module.is_left_out(STATIC):  # vLLM 0.33+: the session stops after its first chunk
        assert turns == [PROMPT] and decision.leaves_out == point_module.LEAVES_OUT
    else:  # the native pair's behaviour
        assert turns == [PROMPT, _expected_second_turn(which)] and not decision.leaves_out
    owner = POINT.locate(importlib.import_module(POINT.target_module))
    assert not POINT.is_installed(owner)
