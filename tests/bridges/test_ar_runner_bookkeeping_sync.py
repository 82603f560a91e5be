"""``ar_runner_bookkeeping_sync``: vLLM 0.30-0.33's ``GPUModelRunner._bookkeeping_sync`` returns 8 values (``num_nans``
added second), where vllm-omni 0.24.0's ``GPUARModelRunner.sample_tokens`` unpacks 7.

- The facts per installed pair, read from the wheels; the decision table; the readers on small sources.
- vllm-omni's own ``GPUARModelRunner.sample_tokens`` with vLLM's real ``_bookkeeping_sync``, on CPU torch, in a fresh
  interpreter: the runner built as vllm-omni's own test of ``sample_tokens`` builds it
  (``test_sample_tokens_tail_only_prefix_cache_uses_staged_cpu_hidden_states``: ``object.__new__``, its stubs for the
  model-side methods), minus its stub of ``_bookkeeping_sync``, plus the state vLLM's method reads; CUDA's event and
  stream calls made no-ops under async scheduling. One step of two requests, whose logits hold 3 and 1 NaNs, under
  sync and async scheduling with ``VLLM_COMPUTE_NANS_IN_LOGITS``, and under async scheduling without it. Unpatched on
  vLLM 0.30 / 0.33 every step dies with the real ``ValueError``; patched each gives what the native pair (vLLM 0.24.0
  + vllm-omni 0.24.0) gives for the same step (``NATIVE``, measured there and checked again whenever this file runs in
  that cell), the NaN counts under async scheduling included; outside ``sample_tokens`` the runner's
  ``_bookkeeping_sync`` is vLLM's, unchanged; revert puts back vllm-omni's ``sample_tokens`` and takes ours off.
"""

from __future__ import annotations

import json

import pytest

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, needs_startup_hook, run_python
from vllm_compat.bridges import _runner_return as shared
from vllm_compat.bridges import ar_runner_bookkeeping_sync as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

# what these tests expect was measured with vllm-omni 0.24.0's files (the release its drift is in)
measured_omni = pytest.mark.skipif(OMNI_VERSION != "0.24.0", reason="expectations measured with vllm-omni 0.24.0; "
                                   f"this env has {OMNI_VERSION}")

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
S = shared.Shape
F = shared.ReturnFacts
# vLLM 0.24's return, which vllm-omni 0.24.0 unpacks, and vLLM 0.30's (read from the wheels)
OMNI = ("num_nans_in_logits", "logprobs_lists", "valid_sampled_token_ids", "prompt_logprobs_dict",
        "req_ids_output_copy", "req_id_to_index_output_copy", "invalid_req_indices")
VLLM_030 = OMNI[:1] + ("num_nans",) + OMNI[1:]
PARAMETERS = ("scheduler_output", "sampler_output", "logits", "hidden_states", "num_scheduled_tokens")
RECOUNT = ("num_nans", "num_nans_in_logits", "_get_nans_in_logits", ("logits",))
UNPACK_ERROR = "ValueError: too many values to unpack (expected 7)"

differs = pytest.mark.skipif(STATIC.shape != S.DIFFERS, reason=f"needs vLLM 0.30-0.33 under vllm-omni 0.24.0 (vLLM's "
                             "_bookkeeping_sync returns what vllm-omni's sample_tokens does not unpack); here "
                             f"{STATIC}")
same = pytest.mark.skipif(STATIC.shape != S.SAME, reason=f"needs the native pair (vLLM 0.24 under vllm-omni 0.24.0); "
                          f"here {STATIC}")


@pytest.mark.parametrize(("facts", "action", "leaves_out"), [
    (F(S.DIFFERS, VLLM_030, OMNI, PARAMETERS, (RECOUNT,)), Action.PATCHED, ""),
    (F(S.DIFFERS, VLLM_030, OMNI, PARAMETERS), Action.PATCHED, bridge.FEATURES["num_nans"]),
    (F(S.DIFFERS, OMNI + ("extra",), OMNI, PARAMETERS), Action.PATCHED, "what vLLM's _bookkeeping_sync returns as "
                                                                          "extra in the AR stage"),
    (F(S.DIFFERS, VLLM_030[2:], OMNI, PARAMETERS), Action.REFUSED, ""),  # num_nans_in_logits no longer returned
    (F(S.UNREAD, (), OMNI, PARAMETERS), Action.REFUSED, ""),
    (F(S.SAME, OMNI, OMNI, PARAMETERS), Action.SKIPPED, ""), (F(S.NO_CALLER), Action.SKIPPED, ""),
    (F(S.NO_V1_RUNNER), Action.SKIPPED, ""), (F(S.NOT_INSTALLED), Action.PENDING, ""),
], ids=["recounted", "dropped", "unknown-added", "missing", "unread", "same", "no-caller", "no-v1-runner", "absent"])
def test_decision_table(facts, action, leaves_out):
    decision = POINT.decide(facts, Controls())
    assert (decision.action, decision.leaves_out) == (action, leaves_out), decision


VLLM_SOURCE = """
class GPUModelRunner:
    def _bookkeeping_sync(self, scheduler_output, sampler_output, logits, hidden_states, n):
        num_nans: object | None = None
        num_nans_in_logits = {}
        if envs.COMPUTE:
            if self.use_async_scheduling:
                num_nans = count(logits)
            else:
                num_nans_in_logits = self._get_nans_in_logits(logits)
        def helper():
            return 1
        return (num_nans_in_logits, num_nans, tokens)
"""
OMNI_SOURCE = """
class GPUARModelRunner(Base):
    def sample_tokens(self, grammar_output):
        (a, b) = self._bookkeeping_sync(1, 2)
        {second}
"""


def _unpacked(caller):
    return shared.unpacked_names(caller, bridge.METHOD)


def _vllm_method(source=VLLM_SOURCE):
    return shared._method(shared._class(shared.parse_source(source), "GPUModelRunner"), "_bookkeeping_sync")


def _omni_caller(second: str = ""):
    tree = shared.parse_source(OMNI_SOURCE.format(second=second))
    return shared._method(shared._class(tree, "GPUARModelRunner"), "sample_tokens")


def test_readers_take_one_flat_tuple_of_names_on_each_side_and_find_the_other_branch():
    method = _vllm_method()
    assert shared.returned_names(method) == ("num_nans_in_logits", "num_nans", "tokens")  # the nested return: not its
    assert shared.recounts_of(method, ("num_nans",), ("num_nans_in_logits", "tokens"), ("logits",)) == (
        ("num_nans", "num_nans_in_logits", "_get_nans_in_logits", ("logits",)),)
    assert shared.recounts_of(method, ("num_nans",), ("tokens",), ("logits",)) == ()  # not a value vllm-omni takes
    not_none = VLLM_SOURCE.replace("num_nans: object | None = None", "num_nans = 0")
    assert shared.recounts_of(_vllm_method(not_none), ("num_nans",), ("num_nans_in_logits",), ("logits",)) == ()
    assert shared.returned_names(_vllm_method(VLLM_SOURCE.replace("return (num_nans_in_logits", "return ((x, y)"))) \
        is None
    assert _unpacked(_omni_caller()) == ("a", "b")
    assert _unpacked(_omni_caller("(a, c) = self._bookkeeping_sync(1, 2)")) is None  # two that differ
    assert _unpacked(_omni_caller("x = self._bookkeeping_sync(1, 2)")) is None
    assert _unpacked(_omni_caller("use(self._bookkeeping_sync(1, 2))")) is None
    assert _unpacked(shared._method(shared._class(shared.parse_source(
        "class GPUARModelRunner:\n    def sample_tokens(self):\n        return 1\n"), "GPUARModelRunner"),
        "sample_tokens")) == ()


def test_the_adaptation_picks_by_name_and_recounts_only_when_the_added_value_is_set():
    facts = F(S.DIFFERS, VLLM_030, OMNI, PARAMETERS, (RECOUNT,))
    adaptation = shared.Adaptation.of(facts)
    assert adaptation.picks == (0, 2, 3, 4, 5, 6, 7) and adaptation.width == 8

    class Runner:
        def _get_nans_in_logits(self, logits):
            return {"r": logits}

    values = ({}, None) + tuple(range(6))
    assert adaptation.apply(Runner(), values, ("s", "o", "L", "h", 3), {}) == ({},) + tuple(range(6))
    values = ({}, "on device") + tuple(range(6))
    assert adaptation.apply(Runner(), values, ("s", "o", "L", "h", 3), {}) == ({"r": "L"},) + tuple(range(6))
    assert adaptation.apply(Runner(), values, ("s", "o"), {"logits": "K"})[0] == {"r": "K"}


@pytest.mark.skipif(VLLM_VERSION is None, reason="needs vLLM")
@measured_omni
def test_facts_are_what_the_wheels_say():
    """vLLM 0.24-0.27 return what vllm-omni 0.24.0 unpacks; 0.28-0.33 add num_nans second, set in the async branch of
    the `if` whose sync branch computes num_nans_in_logits with _get_nans_in_logits(logits) (read from the wheels:
    0.28.0 is the first whose _bookkeeping_sync returns it); 0.34 has no V1 runner."""
    from packaging.version import Version

    version = Version(VLLM_VERSION)
    if version >= Version("0.34"):
        assert STATIC == F(S.NO_V1_RUNNER)
    elif version >= Version("0.28"):
        assert STATIC == F(S.DIFFERS, VLLM_030, OMNI, PARAMETERS, (RECOUNT,))
    else:
        assert STATIC == F(S.SAME, OMNI, OMNI, PARAMETERS)


SCENARIO = """
import contextlib, json, os
from types import SimpleNamespace

import numpy as np
import torch


class Event:  # CPU torch: the CUDA event and stream vLLM's async output records and waits on
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args):
        pass

    def synchronize(self):
        pass


torch.cuda.Event = torch.Event = Event
torch.cuda.current_stream = lambda *args, **kwargs: None
torch.cuda.stream = lambda stream: contextlib.nullcontext()

from vllm.v1.sample.logits_processor import LogitsProcessors  # none built: vllm-omni 0.26+ reads the batch's
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm_omni.worker.gpu_ar_model_runner import ExecuteModelState, GPUARModelRunner
import vllm_compat
from vllm_compat.drift import unwrap

sample_tokens = vars(GPUARModelRunner)["sample_tokens"]
# vllm-omni's own test_sample_tokens_tail_only_prefix_cache_uses_staged_cpu_hidden_states: its stubs of the
# model-side methods (not of _bookkeeping_sync: vLLM's real one runs), _sample giving tokens 7 and 9
C = GPUARModelRunner
C._sample = lambda self, logits, spec: SimpleNamespace(sampled_token_ids=torch.tensor([[7], [9]]),
                                                       logprobs_tensors=None)
C._update_states_after_model_execute = lambda *args, **kwargs: None
C.eplb_step = lambda self: None
C._resolve_pooler_payload_req_ids = lambda self, req_ids: ("audio", req_ids)
C._deferred_prefix_cache_mm_keys = lambda self: set()
C._model_needs_full_prefix_hidden_states = lambda self: False
C._maybe_get_combined_prefix_cache_tensors = lambda *args, **kwargs: (None, None)
C._process_additional_information_updates = lambda *args, **kwargs: None
C._should_accumulate_full_payload_output = lambda self: False
C._should_use_async_omni_output = lambda self: False
C.get_omni_connector_output = lambda self: None


def logits():  # request r1's row holds 3 NaNs, r2's 1
    found = torch.zeros((2, 10))
    found[0, :3] = found[1, 5] = float("nan")
    return found


def runner(async_scheduling):
    r = object.__new__(GPUARModelRunner)
    r.execute_model_state = ExecuteModelState(
        SimpleNamespace(total_num_scheduled_tokens=3, num_scheduled_tokens={"r1": 1, "r2": 2}), logits(), None, None,
        torch.zeros((3, 2)), torch.tensor([[1.0, 10.0], [2.0, 20.0], [3.0, 30.0]]), None, None, None, None, {}, None)
    r.kv_connector_output = None
    r.query_start_loc = torch.tensor([0, 1], dtype=torch.long)
    r.omni_prefix_cache = object()
    r.speculative_config = None
    r.routed_experts_initialized = False
    r.supports_mm_inputs = False
    r.use_async_scheduling = async_scheduling
    r._omni_num_scheduled_tokens_np = None
    r.vllm_config = SimpleNamespace(model_config=SimpleNamespace(engine_output_type="audio"))
    r._async_chunk = False
    # what vLLM's _bookkeeping_sync (and vllm-omni's _to_list over it) reads, as GPUModelRunner.__init__ sets it
    r.input_batch = SimpleNamespace(
        req_ids=["r1", "r2"], req_id_to_index={"r1": 0, "r2": 1}, num_reqs=2, generators={}, vocab_size=10,
        sampling_metadata=SimpleNamespace(no_penalties=True, logitsprocs=LogitsProcessors()), num_tokens_no_spec=np.array([4, 5]),
        token_ids_cpu=np.zeros((2, 16), dtype=np.int64), is_token_ids=np.zeros((2, 16), dtype=bool),
        prev_sampled_token_ids=None, set_async_sampled_token_ids=lambda *args: None)
    r.discard_request_mask = SimpleNamespace(np=np.zeros(2, dtype=bool))
    r.sampled_token_ids_pinned_cpu = torch.zeros((4, 1), dtype=torch.int64)
    r.transfer_event = Event()
    r._sampled_token_ids_cpu_override = None
    r.num_prompt_logprobs = {}
    r.max_model_len = 16
    r.requests = {"r1": SimpleNamespace(output_token_ids=[]), "r2": SimpleNamespace(output_token_ids=[])}
    r.async_output_copy_stream = SimpleNamespace(wait_stream=lambda stream: None)
    return r


def step(async_scheduling, count_nans):
    os.environ["VLLM_COMPUTE_NANS_IN_LOGITS"] = "1" if count_nans else "0"  # vllm.envs reads it at each access
    r = runner(async_scheduling)
    try:
        out = GPUARModelRunner.sample_tokens(r, grammar_output=None)
        out = out.get_output() if async_scheduling else out
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return dict(sampled=out.sampled_token_ids, nans=out.num_nans_in_logits, req_ids=out.req_ids,
                token_ids=r.input_batch.token_ids_cpu[:, 4:7].tolist(),
                output_token_ids={rid: req.output_token_ids for rid, req in r.requests.items()})


def outside(method):  # the runner's _bookkeeping_sync after its sample_tokens has run, against vLLM's own
    os.environ["VLLM_COMPUTE_NANS_IN_LOGITS"] = "1"
    r = runner(False)
    scheduler_output = r.execute_model_state[0]
    with contextlib.suppress(ValueError):  # unpatched on vLLM 0.30+: the ValueError
        GPUARModelRunner.sample_tokens(r, grammar_output=None)
    found = method(r, scheduler_output, r._sample(None, None), logits(), torch.zeros((3, 2)), 3)
    return [len(found), found[0], found[-2]]


result = dict(
    steps={f"{mode}{'' if count else '_no_nan_count'}": step(mode == "async", count)
           for mode, count in (("sync", True), ("async", True), ("async", False))},
    outside=outside(lambda r, *args: r._bookkeeping_sync(*args)),
    vllms_own=outside(GPUModelRunner._bookkeeping_sync),
    decision=[d.action for d in vllm_compat.current_decisions() if d.name == "ar_runner_bookkeeping_sync"],
)
vllm_compat.revert()
result["reverted"] = (vars(GPUARModelRunner)["sample_tokens"] is unwrap(sample_tokens, "ar_runner_bookkeeping_sync")
                      and "_bookkeeping_sync" not in vars(GPUARModelRunner))
print("RESULT", json.dumps(result))
"""

# Measured on vLLM 0.24.0 + vllm-omni 0.24.0 (test_the_native_pair_gives_these checks it there): the step's output
# (tokens, NaN counts per request, request order) and what bookkeeping wrote to the batch and the requests (async
# scheduling: the placeholder -1, the real token following from the device).
NATIVE = {
    "sync": {"sampled": [[7], [9]], "nans": {"r1": 3, "r2": 1}, "req_ids": ["r1", "r2"],
             "token_ids": [[7, 0, 0], [0, 9, 0]], "output_token_ids": {"r1": [7], "r2": [9]}},
    "async": {"sampled": [[7], [9]], "nans": {"r1": 3, "r2": 1}, "req_ids": ["r1", "r2"],
              "token_ids": [[-1, 0, 0], [0, -1, 0]], "output_token_ids": {"r1": [-1], "r2": [-1]}},
    "async_no_nan_count": {"sampled": [[7], [9]], "nans": {}, "req_ids": ["r1", "r2"],
                           "token_ids": [[-1, 0, 0], [0, -1, 0]], "output_token_ids": {"r1": [-1], "r2": [-1]}},
}


def _run(env: dict | None = None) -> dict:
    result = run_python(SCENARIO, env=env, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


@needs_omni
@differs
def test_unpatched_every_ar_step_fails_with_the_real_value_error():
    out = _run({"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
    assert out["steps"] == dict.fromkeys(NATIVE, UNPACK_ERROR), out
    assert out["outside"] == out["vllms_own"] and out["vllms_own"][0] == 8, out  # vLLM's own: all 8
    assert out["decision"] == ["disabled"], out


@needs_omni
@differs
@needs_startup_hook
def test_patched_steps_give_what_the_native_pair_gives_and_vllms_own_callers_keep_all_eight():
    """The NaN counts under async scheduling included: vLLM 0.30+ leaves them on the device in num_nans, which vllm-omni
    does not take; its _get_nans_in_logits (its sync branch) gives them as vLLM 0.24 did."""
    out = _run()
    assert out["steps"] == NATIVE, out
    assert out["outside"] == out["vllms_own"] == [8, {"r1": 3, "r2": 1}, {"r1": 0, "r2": 1}], out
    assert out["decision"] == ["patched"] and out["reverted"] is True, out


@needs_omni
@same
@measured_omni
def test_the_native_pair_gives_these():
    out = _run()
    assert out["steps"] == NATIVE, out
    assert out["outside"] == out["vllms_own"] and out["vllms_own"][0] == 7, out
    assert out["decision"] == ["skipped"] and out["reverted"] is True, out
