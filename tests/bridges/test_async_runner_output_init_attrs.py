"""``async_runner_output_init_attrs``: vLLM 0.25-0.33's ``AsyncGPUModelRunnerOutput.get_output`` reads state its
``__init__`` sets, which vllm-omni 0.24.0's ``OmniAsyncGPUModelRunnerOutput`` (never running that ``__init__``) lacks.

- The facts per installed pair, read from the wheels; the decision table; the reading of ``__init__`` on small sources.
- vllm-omni's and vLLM's own classes on CPU torch (CUDA's stream and event calls made no-ops, the copies being CPU to
  CPU), in a fresh interpreter: vLLM's own object, built through its real ``__init__`` with the arguments vllm-omni's
  AR runner passes, is the oracle (its ``get_output`` result, and the values its ``__init__`` gives what the bridge
  fills in); vllm-omni's object built through its ``__init__`` (the runner's ``async_chunk`` path) and as vllm-omni's
  own test builds it (``object.__new__``): unpatched, the real ``AttributeError``; patched, vLLM's own result; revert
  puts back vllm-omni's ``get_output``. On the native pair both give vLLM's result with nothing installed.
"""

from __future__ import annotations

import json

import pytest

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, needs_startup_hook, run_python
from vllm_compat.bridges import async_runner_output_init_attrs as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

# what these tests expect was measured with vllm-omni 0.24.0's files (the release its drift is in)
measured_omni = pytest.mark.skipif(OMNI_VERSION != "0.24.0", reason="expectations measured with vllm-omni 0.24.0; "
                                   f"this env has {OMNI_VERSION}")

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
S = bridge.Shape
F = bridge.InitAttrsFacts
NAN_STATE = ("_has_fault", "_num_nans", "_num_nans_cpu")  # vLLM 0.28-0.33's (0.25's EP fault, 0.28's NaN count)

lacks = pytest.mark.skipif(STATIC.shape != S.LACKS, reason=f"needs vLLM 0.25-0.33 under vllm-omni 0.24.0 (vLLM's "
                           f"__init__ sets what vllm-omni's subclass lacks); here {STATIC}")
fits = pytest.mark.skipif(STATIC.shape != S.FITS, reason=f"needs the native pair (vLLM 0.24 under vllm-omni 0.24.0); "
                          f"here {STATIC}")


@pytest.mark.parametrize(("facts", "action"), [
    (F(S.LACKS, (("_num_nans", None),)), Action.PATCHED),
    (F(S.LACKS, (("_num_nans", bridge.UNKNOWN),)), Action.REFUSED),
    (F(S.LACKS, (("_num_nans", None),), own_get_output=False), Action.REFUSED),
    (F(S.FITS), Action.SKIPPED), (F(S.CALLS_INIT), Action.SKIPPED), (F(S.NO_SUBCLASS), Action.SKIPPED),
    (F(S.NO_V1_RUNNER), Action.SKIPPED), (F(S.NOT_INSTALLED), Action.PENDING),
], ids=["lacks", "unknown-value", "no-own-get_output", "fits", "calls-init", "no-subclass", "no-v1-runner", "absent"])
def test_decision_table(facts, action):
    assert POINT.decide(facts, Controls()).action == action


INIT = """
class Base:
    def __init__(self, out, stream, n: int = 3, nans=None, check=False, *, flag=True):
        self._out = out
        self._nans = nans
        self._fault: object | None = None
        with ctx(stream):
            self._nans_cpu = self._nans.to("cpu") if self._nans is not None else None
            if check:
                self._fault = query()
        self._n = n
        self._flag = flag
        self._call = make()
        for x in out:
            self._loop = x
"""


def test_init_values_follow_the_parameters_vllm_omni_does_not_take():
    init = bridge.methods(bridge.find_class(bridge.parse_source(INIT), name="Base"))["__init__"]
    assert bridge.init_values(init, {"out", "stream", "n"}) == {
        "_out": bridge.UNKNOWN, "_nans": None, "_fault": None, "_nans_cpu": None, "_n": bridge.UNKNOWN,
        "_flag": True, "_call": bridge.UNKNOWN, "_loop": bridge.UNKNOWN}
    taken = bridge.init_values(init, {"out", "stream", "nans", "check"})
    assert taken["_nans"] == taken["_nans_cpu"] == taken["_fault"] == bridge.UNKNOWN and taken["_n"] == 3


def test_what_vllm_omnis_subclass_takes_and_whether_it_runs_the_base_init():
    source = ("class Sub(Base):\n    def __init__(self, *, builder, device=None, **kwargs):\n"
              "        a = kwargs.pop('a')\n        b = kwargs.pop('b', None)\n        self.x = a\n")
    init = bridge.methods(bridge.find_class(bridge.parse_source(source), base="Base"))["__init__"]
    assert bridge.taken_parameters(init) == {"self", "builder", "device", "a", "b"}
    assert not bridge.calls_base_init(init)
    assert bridge.calls_base_init(bridge.parse_source("def __init__(self):\n    super().__init__()\n").body[0])


@pytest.mark.skipif(VLLM_VERSION is None, reason="needs vLLM")
@measured_omni
def test_facts_are_what_the_wheels_say():
    """vLLM 0.24's __init__ sets nothing vllm-omni 0.24.0's subclass lacks; 0.25-0.27 add the EP-fault state its
    get_output reads, 0.28-0.33 the NaN state too, each None for vllm-omni's arguments; 0.34 has no V1 model runner
    (read from the wheels)."""
    from packaging.version import Version

    version = Version(VLLM_VERSION)
    if version >= Version("0.34"):
        assert STATIC == F(S.NO_V1_RUNNER)
    elif version >= Version("0.28"):
        assert STATIC == F(S.LACKS, tuple((name, None) for name in NAN_STATE))
    elif version >= Version("0.25"):
        assert STATIC == F(S.LACKS, (("_has_fault", None),))
    else:
        assert STATIC.shape in (S.FITS, S.NO_SUBCLASS)


SCENARIO = f"""
import contextlib, json, torch
from types import SimpleNamespace


class Event:  # CPU torch: the CUDA event both __init__s record and get_output waits on
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args):
        pass

    def synchronize(self):
        pass


torch.cuda.Event = torch.Event = Event
torch.cuda.current_stream = lambda *args, **kwargs: None
torch.cuda.stream = lambda stream: contextlib.nullcontext()

from vllm.v1.worker.gpu_model_runner import AsyncGPUModelRunnerOutput
from vllm_omni.outputs import OmniModelRunnerOutput
from vllm_omni.worker.gpu_ar_model_runner import OmniAsyncGPUModelRunnerOutput
import vllm_compat


def model_output():
    return OmniModelRunnerOutput(req_ids=["r1", "r2"], req_id_to_index={{"r1": 0, "r2": 1}})


def kwargs():  # what vllm-omni's AR runner passes both classes (its async_output_kwargs)
    return dict(sampled_token_ids=torch.tensor([[7], [9]]), logprobs_tensors=None, invalid_req_indices=[1],
                async_output_copy_stream=SimpleNamespace(wait_stream=lambda stream: None), vocab_size=10)


def as_vllm_omnis_test_builds_it():  # tests/worker/test_gpu_ar_model_runner.py: what vLLM 0.24's __init__ set
    out = object.__new__(OmniAsyncGPUModelRunnerOutput)
    out._model_runner_output, out._model_runner_output_builder = None, model_output
    out._invalid_req_indices, out.vocab_size = [1], 10
    out.sampled_token_ids_cpu = out._sampled_token_ids = torch.tensor([[7], [9]])
    out.async_copy_ready_event = Event()
    out._logprobs_tensors = out._logprobs_tensors_cpu = out._routed_experts = out._routed_experts_cpu = None
    return out


def outcome(make):
    try:
        out = make().get_output()
    except Exception as exc:
        return f"{{type(exc).__name__}}: {{exc}}"
    return [out.sampled_token_ids, out.logprobs, out.num_nans_in_logits]


own = AsyncGPUModelRunnerOutput(model_runner_output=model_output(), **kwargs())
get_output = vars(OmniAsyncGPUModelRunnerOutput)["get_output"]
result = dict(
    init={{name: repr(vars(own).get(name, "unset")) for name in {NAN_STATE!r}}},
    vllm=outcome(lambda: AsyncGPUModelRunnerOutput(model_runner_output=model_output(), **kwargs())),
    omni=outcome(lambda: OmniAsyncGPUModelRunnerOutput(model_runner_output_builder=model_output, **kwargs())),
    omni_test=outcome(as_vllm_omnis_test_builds_it),
    decision=[d.action for d in vllm_compat.current_decisions() if d.name == "{POINT.id}"],
)
vllm_compat.revert()
result["reverted_to"] = vars(OmniAsyncGPUModelRunnerOutput)["get_output"] is getattr(get_output, "__wrapped__", 0)
print("RESULT", json.dumps(result))
"""


def _run(env: dict | None = None) -> dict:
    result = run_python(SCENARIO, env=env, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


def _no_attribute(message, name: str) -> bool:
    return message == f"AttributeError: 'OmniAsyncGPUModelRunnerOutput' object has no attribute '{name}'"


@needs_omni
@lacks
def test_unpatched_get_output_fails_with_the_real_attribute_error():
    out = _run({"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
    assert out["vllm"] == [[[7], []], None, None], out  # vLLM's own object: the invalid request's token cleared
    from packaging.version import Version

    # the first attribute vLLM's get_output reads: the NaN count's from 0.28 on, the EP fault's (0.25-0.27) before (wheels)
    first = "_num_nans_cpu" if Version(VLLM_VERSION) >= Version("0.28") else "_has_fault"
    assert _no_attribute(out["omni"], first) and _no_attribute(out["omni_test"], first), out
    assert out["decision"] == ["disabled"]


@needs_omni
@lacks
@needs_startup_hook
def test_patched_get_output_is_vllms_own_and_revert_puts_vllm_omnis_back():
    """What is filled is what vLLM's own __init__ sets for vllm-omni's arguments, and vllm-omni's object (both ways it
    is built) then gives what vLLM's own object gives for the same step."""
    out = _run()
    filled = {name: repr(value) for name, value in STATIC.fills}  # vllm-omni 0.26.0 sets _has_fault itself
    assert filled and set(filled) <= set(NAN_STATE) and {name: out["init"][name] for name in filled} == filled, out
    assert out["omni"] == out["omni_test"] == out["vllm"] == [[[7], []], None, None], out
    assert out["decision"] == ["patched"] and out["reverted_to"] is True, out


@needs_omni
@fits
@measured_omni
def test_the_native_pair_needs_nothing():
    out = _run()
    assert out["init"] == {name: repr("unset") for name in NAN_STATE}, out  # vLLM 0.24's __init__ sets none of it
    assert out["omni"] == out["omni_test"] == out["vllm"] == [[[7], []], None, None], out
    assert out["decision"] == ["skipped"], out
