"""``request_token_buffer_clear``: vLLM 0.34 keeps ``Request._all_token_ids`` in a ``TokenBuffer`` without
``clear()``, which vllm-omni 0.24.0 calls to replace a request's tokens.

vllm-omni's own classes on the installed vLLM, on CPU: its ``OmniGenerationScheduler`` (built as
``tests/patches/_scheduler_runner_worker.py`` builds it) takes a streaming session's next input chunk, and its
``OmniSchedulingCoordinator`` resizes one generation-stage prompt and replaces another with the codes the previous
stage sent. Unpatched first (vLLM 0.34: the ``AttributeError``), then patched: the tokens each call leaves, against
what vllm-omni's code says it does (the update's prompt replaces every token; a resized prompt is zeros; codes are
flattened), which the native pair gives unpatched. Then the facts per installed version, the decision table, the
buffer's class and revert.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, run_python
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite
from vllm_compat.patches import request_token_buffer_clear as patch

# what these tests expect was measured with vllm-omni 0.24.0's files (the release its drift is in)
measured_omni = pytest.mark.skipif(OMNI_VERSION != "0.24.0", reason="expectations measured with vllm-omni 0.24.0; "
                                   f"this env has {OMNI_VERSION}")

POINT = patch.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
K = patch.Kind
WORKER = Path(__file__).with_name("_scheduler_runner_worker.py")

# Runs in a fresh interpreter: vllm-omni imported first (it puts OmniRequest in place of vLLM's Request), then its
# generation scheduler and coordinator take what vLLM's engine hands them. Prints one JSON line: per call, the
# request's state afterwards or the exception.
SCRIPT = r"""
import inspect, json, runpy, sys
import vllm_omni  # noqa: F401 - puts OmniRequest in place of vLLM's Request, as in every vllm-omni engine
from vllm.sampling_params import SamplingParams
from vllm.v1.request import Request, RequestStatus

worker = runpy.run_path(sys.argv[1])
scheduler, _ = worker["build_scheduler"](sys.argv[2], worker["scheduler_class_of"](worker["SCHEDULERS"]["generation"]))
from vllm_omni.core.sched.omni_scheduling_coordinator import OmniSchedulingCoordinator


def request(request_id, prompt, outputs=(), resumable=False):
    made = Request(request_id=request_id, prompt_token_ids=list(prompt), sampling_params=SamplingParams(max_tokens=8),
                   pooling_params=None, resumable=resumable)
    made.append_output_token_ids(list(outputs))
    return made


def state(req):
    return {"all": list(req.all_token_ids), "prompt": list(req.prompt_token_ids), "outputs": list(req.output_token_ids),
            "num_prompt_tokens": req.num_prompt_tokens, "num_computed_tokens": req.num_computed_tokens,
            "buffer_class": f"{type(req._all_token_ids).__module__}.{type(req._all_token_ids).__name__}"}


def attempt(call, req):
    try:
        call()
    except AttributeError as exc:
        return f"AttributeError: {exc}"
    return state(req)


out = {}
# A streaming session whose first turn stopped and now waits for input (what vLLM's _handle_stopped_request leaves),
# then the next input chunk arrives: vLLM's add_request hands it to vllm-omni's _update_request_as_session.
session = request("s", [1, 2, 3], resumable=True)
scheduler.add_request(session)
session.append_output_token_ids([7, 8])
session.num_computed_tokens = 4
session.status = RequestStatus.WAITING_FOR_STREAMING_REQ
scheduler.num_waiting_for_streaming_input += 1
out["session"] = attempt(lambda: scheduler.add_request(request("s", [40, 41, 42], resumable=True)), session)
# vllm-omni 0.26.0's coordinator takes no scheduler_max_num_seqs
taken = inspect.signature(OmniSchedulingCoordinator).parameters
coordinator = OmniSchedulingCoordinator(**{k: v for k, v in dict(scheduler_max_num_seqs=4, stage_id=1).items()
                                            if k in taken})
resized = request("r", [9], outputs=())
out["resized"] = attempt(lambda: coordinator.update_request_metadata(
    {"r": resized}, {"r": {"next_stage_prompt_len": 5}}, model_mode="ar"), resized)
codes = request("c", [9], outputs=[8])
out["codes"] = attempt(lambda: coordinator.update_request_metadata(
    {"c": codes}, {"c": {"code_predictor_codes": [[1, 2], [3, 4]]}}, model_mode="generation"), codes)
print("RESULT" + json.dumps(out))
"""

# What vllm-omni 0.24.0's code says each call leaves (omni_generation_scheduler.py, omni_scheduling_coordinator.py):
# the update's prompt replaces every token, outputs gone, nothing computed; a resized prompt is that many zeros; a
# generation stage's prompt is the previous stage's codes, flattened.
EXPECTED = {
    "session": {"all": [40, 41, 42], "prompt": [40, 41, 42], "outputs": [], "num_prompt_tokens": 3,
                "num_computed_tokens": 0},
    "resized": {"all": [0] * 5, "prompt": [0] * 5, "outputs": [], "num_prompt_tokens": 5, "num_computed_tokens": 0},
    "codes": {"all": [1, 2, 3, 4], "prompt": [1, 2, 3, 4], "outputs": [], "num_prompt_tokens": 4,
              "num_computed_tokens": 0},
}


def _run(tmp_path, env=None) -> dict:
    script = SCRIPT.replace("sys.argv[1]", repr(str(WORKER))).replace("sys.argv[2]", repr(str(tmp_path / "lm")))
    done = run_python(script, env=env, warm=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT", 1)[1])


@pytest.mark.parametrize(("facts", "action"), [
    (patch.TokenBufferFacts(K.LACKS, ("a.py",)), Action.PATCHED),
    (patch.TokenBufferFacts(K.LACKS, ()), Action.SKIPPED),
    (patch.TokenBufferFacts(K.HAS_CLEAR, ("a.py",)), Action.SKIPPED),
    (patch.TokenBufferFacts(K.LIST, ("a.py",)), Action.SKIPPED),
    (patch.TokenBufferFacts(K.ABSENT), Action.PENDING),
], ids=["lacks+called", "lacks+uncalled", "has_clear", "list", "absent"])
def test_decision_table(facts, action):
    decision = POINT.decide(facts, Controls())
    assert decision.action == action
    assert (decision.variant == patch.VARIANT) == (action == Action.PATCHED)


def test_the_readers_tell_the_shapes_apart():
    assert patch.calls_clear("def f(r):\n    r._all_token_ids.clear()\n")
    assert not patch.calls_clear("def f(r):\n    r._output_token_ids.clear()\n    del r._all_token_ids[:]\n")
    assert patch.builds_token_buffer("class Request:\n    def __init__(self):\n"
                                     "        self._all_token_ids: list[int] = TokenBuffer([0])\n")
    assert not patch.builds_token_buffer("class Request:\n    def __init__(self):\n"
                                         "        self._all_token_ids = self.prompt_token_ids.copy()\n")
    typed_as_list = ("if TYPE_CHECKING:\n    class TokenBuffer(list[int]):\n        pass\n"
                     "else:\n    class TokenBuffer(array):\n        def copy(self):\n            pass\n")
    assert not patch.buffer_has_clear(typed_as_list)  # vLLM 0.34's file: the runtime class is the array one
    assert patch.buffer_has_clear(typed_as_list.replace("def copy", "def clear"))


@needs_omni
@pytest.mark.skipif(VLLM_VERSION is None or Version(VLLM_VERSION) < Version("0.24"), reason="vLLM 0.24+")
@measured_omni
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    """vLLM <= 0.33 keeps a list, 0.34 a TokenBuffer without clear() (read from the 0.24.0, 0.30.0, 0.33.0 and
    0.34.0 wheels); vllm-omni 0.24.0 calls it in its generation scheduler and its scheduling coordinator."""
    assert STATIC.host == (K.LACKS if Version(VLLM_VERSION) >= Version("0.34") else K.LIST)
    assert set(STATIC.callers) >= {"vllm_omni/core/sched/omni_generation_scheduler.py",
                                   "vllm_omni/core/sched/omni_scheduling_coordinator.py"}
    assert POINT.detect_runtime(importlib.import_module(POINT.target_module)) == STATIC


@needs_omni
def test_vllm_omnis_scheduler_and_coordinator_replace_a_requests_tokens(tmp_path):
    """Unpatched (vLLM 0.34: each call dies on the buffer's missing clear()), then patched: the tokens vllm-omni's
    code says, which vLLM <= 0.33's list gives unpatched (the native pair among them)."""
    unpatched = _run(tmp_path, {"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
    patched = _run(tmp_path)
    for call, expected in EXPECTED.items():
        if STATIC.host == K.LACKS:
            assert unpatched[call] == "AttributeError: 'TokenBuffer' object has no attribute 'clear'"
            assert patched[call]["buffer_class"] == f"{patch.__name__}.TokenBuffer"  # the same buffer, with clear()
        else:
            assert unpatched[call] == patched[call] and patched[call]["buffer_class"] == "builtins.list"
        assert {k: v for k, v in patched[call].items() if k != "buffer_class"} == expected, call


@needs_omni
@pytest.mark.skipif(STATIC.host != K.LACKS, reason=f"needs vLLM 0.34+ (a TokenBuffer without clear()); here {STATIC}")
def test_the_buffer_stays_vllms_and_install_is_idempotent_and_reverts_exactly():
    from vllm.v1.token_buffer import TokenBuffer

    owner = POINT.locate(importlib.import_module(POINT.target_module))
    original = POINT.original(owner)
    state = POINT.prepare(owner, STATIC)
    decision = POINT.decide(STATIC, Controls())
    had = POINT.is_installed(owner)
    POINT.uninstall(owner)
    assert vars(owner)["__init__"] is original
    assert POINT.install(owner, decision, state) and not POINT.install(owner, decision, state)
    buffer = TokenBuffer([1, 2, 3])
    buffer.__class__ = state[1]
    buffer.clear()
    buffer.extend([4])
    assert isinstance(buffer, TokenBuffer) and buffer == [4] and not hasattr(TokenBuffer, "clear")
    import pickle

    assert type(pickle.loads(pickle.dumps(buffer, protocol=5))) is TokenBuffer  # workers get vLLM's own class
    if not had:
        POINT.uninstall(owner)
        assert vars(owner)["__init__"] is original
