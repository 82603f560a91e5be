"""``ar_runner_prepare_inputs``: vLLM 0.28+'s ``GPUModelRunner._prepare_inputs`` returns 3 values
(``max_num_sampled_tokens`` added) where vllm-omni 0.24.0 / 0.26.0's ``GPUARModelRunner.execute_model`` unpacks 2.

- The decision table; the facts per installed pair against what a regex reads in the wheels' text (how many values
  vLLM's ``return (logits_indices, spec_decode_metadata, ...)`` has, what vLLM's own caller and vllm-omni unpack).
- The reproduction, in a fresh interpreter with the startup hook: vllm-omni's own ``execute_model`` on a runner built
  as vllm-omni's own tests build one (``_make_guard_runner`` of its generation runner test: ``object.__new__``, its
  ``_update_states`` stub), plus the state vLLM's real ``_prepare_inputs`` reads, made with vLLM's own classes on CPU
  (``InputBatch``, ``CachedRequestState``, ``CpuGpuBuffer`` as ``GPUModelRunner.__init__`` makes them). One step of two
  requests in prefill (prompts of 3 and 5 tokens). ``sys.settrace`` on vllm-omni's frame records what its
  ``_prepare_inputs`` call returned, what the unpack took, and the line an exception left it at. Unpatched on vLLM
  0.28+ the step dies at vllm-omni's unpack with the real ``ValueError``; patched the unpack takes vLLM's
  ``logits_indices`` / ``spec_decode_metadata`` (those vLLM's own method gives for the same state, called directly)
  and the step goes on past it; outside ``execute_model`` the runner's ``_prepare_inputs`` is vLLM's (3 values); revert
  puts vllm-omni's ``execute_model`` back and takes ours off. On the native pair both agree with 2 values.

The batch has no KV cache group (``InputBatch(block_sizes=[])``, as vLLM's ``may_reinitialize_input_batch`` makes it
for a KV cache config without attention groups): with one, ``_prepare_inputs`` calls
``MultiGroupBlockTable.compute_slot_mapping``, whose per-group Triton kernel (``block_table.py``:
``_COMPUTE_SLOT_MAPPING_KERNEL`` on vLLM 0.30+, ``_compute_slot_mapping_kernel[...]`` on 0.24) cannot run without a GPU
driver (vLLM disables Triton: "0 active driver(s)"). Everything else in the method runs as on a GPU worker.

``tests/bridges/test_generation_runner_prepare_inputs.py`` runs the same scenario on the generation runner.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import VLLM_VERSION, needs_omni, needs_startup_hook, run_python
from vllm_compat.bridges import _runner_return as shared
from vllm_compat.bridges import ar_runner_prepare_inputs as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
S, F = shared.Shape, shared.ReturnFacts
UNPACKED = ("logits_indices", "spec_decode_metadata")  # vLLM 0.24-0.27's return, which vllm-omni unpacks
RETURNED_028 = UNPACKED + ("max_num_sampled_tokens",)
PARAMETERS = ("scheduler_output", "num_scheduled_tokens")
UNPACK_ERROR = "ValueError: too many values to unpack (expected 2)"
# The step: prompts of 3 and 5 tokens, all scheduled. The logits are taken at each request's last token (2 and 3+5-1);
# positions restart per request; the input ids are the prompts, one after the other.
PROMPTS = {"r1": [11, 12, 13], "r2": [21, 22, 23, 24, 25]}
LOGITS_INDICES = [2, 7]
POSITIONS = [0, 1, 2, 0, 1, 2, 3, 4]
INPUT_IDS = PROMPTS["r1"] + PROMPTS["r2"]
FAST_PREFILL = "KV-sharing fast prefill"  # what dropping max_num_sampled_tokens leaves out, in users' words

DECISIONS = [
    (F(S.SAME, UNPACKED, UNPACKED, PARAMETERS), Action.SKIPPED, ""),
    (F(S.DIFFERS, RETURNED_028, UNPACKED, PARAMETERS), Action.PATCHED, FAST_PREFILL),
    (F(S.DIFFERS, RETURNED_028[1:], UNPACKED, PARAMETERS), Action.REFUSED, ""),  # logits_indices no longer returned
    (F(S.UNREAD, (), UNPACKED, PARAMETERS), Action.REFUSED, ""),
    (F(S.NO_CALLER), Action.SKIPPED, ""), (F(S.NO_V1_RUNNER), Action.SKIPPED, ""),
    (F(S.NOT_INSTALLED), Action.PENDING, ""),
]
DECISION_IDS = ["same", "differs", "missing", "unread", "no-caller", "no-v1-runner", "not-installed"]


def check_decision(point, facts, action, leaves_out):
    decision = point.decide(facts, Controls())
    assert decision.action == action, decision
    assert (leaves_out in decision.leaves_out) if leaves_out else decision.leaves_out == "", decision


@pytest.mark.parametrize(("facts", "action", "leaves_out"), DECISIONS, ids=DECISION_IDS)
def test_decision_table(facts, action, leaves_out):
    check_decision(POINT, facts, action, leaves_out)


# ---- the facts, as the wheels' text says them ----

def _installed(package: str, relative: str) -> Path | None:
    spec = importlib.util.find_spec(package)  # a top-level package: found, not imported
    paths = [Path(p) / relative for p in (spec.submodule_search_locations or ())] if spec is not None else []
    return next((p for p in paths if p.is_file()), None)


def _unpacks(text: str) -> list[tuple[str, ...]]:
    """The targets of each ``a, b = self._prepare_inputs(`` (or ``a, b = (\\n self._prepare_inputs(``) in ``text``."""
    return [tuple(n.strip() for n in found.split(","))
            for found in re.findall(r"\n\s+([\w, ]+?) = \(?\s*self\._prepare_inputs\(", text)]


def wheels_say(omni_runner: str) -> F:
    """The facts for vllm-omni's ``omni_runner`` on the installed vLLM, read with regexes from the files' text."""
    vllm_file = _installed("vllm", "v1/worker/gpu_model_runner.py")
    omni_file = _installed("vllm_omni", omni_runner.removeprefix("vllm_omni/"))
    if vllm_file is None:
        return F(S.NO_V1_RUNNER)
    text = vllm_file.read_text()
    method = re.search(r"\n    def _prepare_inputs\((.*?)\n    def ", text, re.S).group(1)
    parameters = tuple(re.findall(r"(\w+):", method.split(") ->", 1)[0]))
    returned = re.search(r"\n        return \((.*?)\n        \)", method, re.S).group(1)
    elements = [line.strip().rstrip(",") for line in returned.strip().splitlines()]
    (own,) = set(_unpacks(text))  # vLLM's own execute_model names each value it takes
    assert len(own) == len(elements), (own, elements)
    assert all(e == n for e, n in zip(elements, own, strict=True) if e.isidentifier()), (own, elements)
    (unpacked,) = set(_unpacks(omni_file.read_text()))
    if own == unpacked:
        return F(S.SAME, own, unpacked, parameters)
    return F(S.DIFFERS, own, unpacked, parameters)  # no recount: vLLM sets max_num_sampled_tokens on every path


def check_facts(point):
    static = point.detect_static(StaticSite.installed())
    assert static == wheels_say(point.omni_runner)
    version = Version(VLLM_VERSION)
    if version >= Version("0.34"):
        assert (static.shape, point.decide(static).action) == (S.NO_V1_RUNNER, Action.SKIPPED), static
    elif version >= Version("0.28") and static.unpacked == UNPACKED:  # vllm-omni 0.24.0 / 0.26.0's 2-value unpack
        assert (static.shape, static.returned, static.unpacked) == (S.DIFFERS, RETURNED_028, UNPACKED), static
        assert point.decide(static).action == Action.PATCHED
    else:  # vLLM 0.24-0.27, or a vllm-omni (0.28.0+) unpacking vLLM's 3
        assert static.shape == S.SAME and static.returned == static.unpacked, static
        assert point.decide(static).action == Action.SKIPPED
    assert point.detect_runtime(None) == static  # the runtime reading of the imported packages' files


@needs_omni
def test_facts_are_what_the_wheels_say():
    """vLLM 0.24-0.27 returns what vllm-omni unpacks; 0.28-0.33 add max_num_sampled_tokens; 0.34 has no V1 runner."""
    check_facts(POINT)


# ---- the reproduction ----

SCENARIO = r"""
import dataclasses, importlib, inspect, json, os, sys

import numpy as np
import torch

# vLLM's CPU platform has no pinned memory (CpuPlatform.is_pin_memory_available() is False); these CPU-torch envs
# resolve to vLLM's unspecified platform, which says True, and torch then refuses pinned tensors. vLLM's module-level
# answer is set as its CPU platform gives it, in each of its modules that copied it.
import vllm.utils.torch_utils
vllm.utils.torch_utils.PIN_MEMORY = False
from vllm import SamplingParams
from vllm.config import CacheConfig
from vllm.v1.core.sched.output import CachedRequestData, SchedulerOutput
from vllm.v1.utils import CpuGpuBuffer
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
for module in list(sys.modules.values()):
    if getattr(module, "__name__", "").startswith("vllm.") and getattr(module, "PIN_MEMORY", None) is True:
        module.PIN_MEMORY = False
from vllm_omni.distributed.omni_connectors.kv_transfer_manager import OmniKVCacheConfig, OmniKVTransferManager
import vllm_compat
from vllm_compat.drift import unwrap
from vllm_compat.detect.static import StaticSite

MODULE, CLASS = os.environ["SCENARIO_RUNNER"].split(":")
POINT_MODULE = importlib.import_module(os.environ["SCENARIO_POINT"])
POINT = POINT_MODULE.DRIFT_POINT.id
Runner = getattr(importlib.import_module(MODULE), CLASS)
execute_model = vars(Runner)["execute_model"]
PROMPTS = json.loads(os.environ["SCENARIO_PROMPTS"])
MAX_REQS, MAX_TOKENS, MAX_LEN = 4, 16, 32
CPU = torch.device("cpu")


def accepted(function, **kwargs):  # the arguments the installed vLLM's signature takes
    names = inspect.signature(function).parameters
    return {k: v for k, v in kwargs.items() if k in names}


def buffer(*size, dtype, numpy=True):  # GPUModelRunner._make_buffer's CpuGpuBuffer, unpinned on CPU
    return CpuGpuBuffer(*size, dtype=dtype, device=CPU, pin_memory=False, with_numpy=numpy)


def runner():
    r = object.__new__(Runner)
    # vllm-omni's own tests' runner (_make_guard_runner): no state of a step yet, its _update_states stub (the batch
    # is filled below with vLLM's InputBatch.add_request), no connector
    r.execute_model_state = None
    r.routed_experts_initialized = False
    r.speculative_config = None
    r.model = object()
    r.model_config = type("ModelConfig", (), {"async_chunk": False})()
    r.cache_config = CacheConfig()
    r._update_states = lambda scheduler_output: None
    r.omni_prefix_cache = None
    r.kv_transfer_manager = OmniKVTransferManager(OmniKVCacheConfig())
    r.kv_caches = []
    r.num_prompt_logprobs = {}
    r.cascade_attn_enabled = False
    # what vLLM's _prepare_inputs reads, as GPUModelRunner.__init__ makes it (device cpu, no LoRA / M-RoPE / prompt
    # embeds / spec decode / async scheduling / mamba)
    r.device = CPU
    r.max_num_reqs, r.max_num_tokens, r.max_model_len = MAX_REQS, MAX_TOKENS, MAX_LEN
    r.lora_config = None
    r.enable_prompt_embeds = False
    r.uses_mrope = False
    r.uses_xdrope_dim = 0
    r.use_async_scheduling = False
    r.prepare_inputs_event = None
    r._pp_recv_work = None
    r.num_spec_tokens = r.prev_num_spec_tokens = 0
    r.use_async_spec_decode = False
    r.valid_sampled_token_count_gpu = None
    r._draft_token_ids = None
    r.num_accepted_tokens_event = None
    r.mamba_state_idx = {}
    r.mamba_prev_last_scheduled_idx = None
    r.input_ids = buffer(MAX_TOKENS, dtype=torch.int32)
    r.positions = torch.zeros(MAX_TOKENS, dtype=torch.int64, device=CPU)
    r.query_start_loc = buffer(MAX_REQS + 1, dtype=torch.int32)
    r.seq_lens = torch.zeros(MAX_REQS, dtype=torch.int32, device=CPU)
    r.optimistic_seq_lens_cpu = torch.zeros(MAX_REQS, dtype=torch.int32)
    r.num_computed_tokens = torch.zeros(MAX_REQS, dtype=torch.int32, device=CPU)
    r.prev_num_draft_tokens = buffer(MAX_REQS, dtype=torch.int32)
    r.req_indices = buffer(MAX_TOKENS, dtype=torch.int64)
    r.prev_positions = buffer(MAX_REQS, dtype=torch.int64)
    r.num_scheduled_tokens = buffer(MAX_REQS, dtype=torch.int32)
    r.inputs_embeds = buffer(MAX_TOKENS, 8, dtype=torch.float32, numpy=False)
    r.is_token_ids = buffer(MAX_TOKENS, dtype=torch.bool)
    r.discard_request_mask = buffer(MAX_REQS, dtype=torch.bool)
    r.num_decode_draft_tokens = buffer(MAX_REQS, dtype=torch.int32)
    r.num_accepted_tokens = buffer(MAX_REQS, dtype=torch.int32)
    arange = max(MAX_REQS + 1, MAX_TOKENS)
    r.arange_np = np.arange(arange, dtype=np.int64)
    r.query_pos = buffer(arange, dtype=torch.int64)
    r._arange_scratch = np.empty(arange, dtype=np.int64)
    # no KV cache group: a group's slot mapping is a Triton kernel, which needs a GPU driver (the module docstring)
    r.input_batch = InputBatch(**accepted(
        InputBatch.__init__, max_num_reqs=MAX_REQS, max_model_len=MAX_LEN, max_num_batched_tokens=MAX_TOKENS,
        device=CPU, vocab_size=64, block_sizes=[], kernel_block_sizes=[], max_num_blocks_per_req=[]))
    r.requests = {}
    for rid, prompt in PROMPTS.items():
        state = CachedRequestState(**accepted(
            CachedRequestState, req_id=rid, prompt_token_ids=prompt, mm_features=[],
            sampling_params=SamplingParams(max_tokens=4), generator=None, block_ids=(), num_computed_tokens=0,
            output_token_ids=[]))
        r.requests[rid] = state
        r.input_batch.add_request(state)
    return r


def scheduler_output():  # one step: every prompt token of both requests
    values = dict(scheduled_new_reqs=[], scheduled_cached_reqs=CachedRequestData.make_empty(),
                  num_scheduled_tokens={rid: len(p) for rid, p in PROMPTS.items()},
                  total_num_scheduled_tokens=sum(map(len, PROMPTS.values())), scheduled_spec_decode_tokens={},
                  scheduled_encoder_inputs={}, num_common_prefix_blocks=[], finished_req_ids=set(),
                  free_encoder_mm_hashes=[])
    return SchedulerOutput(**accepted(SchedulerOutput, **values))


def scheduled():
    return np.array([len(p) for p in PROMPTS.values()], dtype=np.int32)


def shown(value):
    return [len(value), value[0].tolist(), *value[1:]] if isinstance(value, tuple) else repr(value)


OMNI_FILE = sys.modules[MODULE].__file__
with open(OMNI_FILE) as f:  # vllm-omni's unpack, found in its text
    UNPACK = next(n for n, line in enumerate(f, 1)
                  if "logits_indices, spec_decode_metadata = self._prepare_inputs(" in line)


def step():
    # vllm-omni's execute_model on a fresh runner, and what its frame saw: the value its _prepare_inputs call
    # returned, the logits_indices / spec_decode_metadata it unpacked, the line an exception left it at
    r, seen = runner(), {}

    def in_execute_model(frame, event, arg):
        if event == "exception" and "stopped_at" not in seen:
            seen["stopped_at"], seen["error"] = frame.f_lineno, f"{arg[0].__name__}: {arg[1]}"
        elif event == "line" and "logits_indices" in frame.f_locals and "unpacked" not in seen:
            seen["unpacked"] = [frame.f_locals["logits_indices"].tolist(), frame.f_locals["spec_decode_metadata"]]
        return in_execute_model

    def returned(frame, event, arg):
        if event == "return":
            seen["returned"] = shown(arg)

    def tracer(frame, event, arg):
        if frame.f_code.co_filename == OMNI_FILE and frame.f_code.co_name == "execute_model":
            return in_execute_model
        caller = frame.f_back  # the call vllm-omni's unpack takes its values from
        if (caller is not None and caller.f_code.co_filename == OMNI_FILE
                and caller.f_code.co_name == "execute_model" and UNPACK <= caller.f_lineno <= UNPACK + 3):
            return returned
        return None

    sys.settrace(tracer)
    try:
        Runner.execute_model(r, scheduler_output())
        seen["stopped_at"] = None
    except Exception:
        pass
    finally:
        sys.settrace(None)
    seen["positions"] = r.positions[:8].tolist()
    seen["input_ids"] = r.input_ids.cpu[:8].tolist()
    return seen


result = dict(
    unpack_line=UNPACK, step=step(),
    # vLLM's own method on the same state, called directly; the runner's, outside vllm-omni's execute_model
    vllms_own=shown(GPUModelRunner._prepare_inputs(runner(), scheduler_output(), scheduled())),
    outside=shown(runner()._prepare_inputs(scheduler_output(), scheduled())),
    runtime=POINT_MODULE.DRIFT_POINT.detect_runtime(sys.modules[MODULE]).to_dict(),
    static=POINT_MODULE.DRIFT_POINT.detect_static(StaticSite.installed()).to_dict(),
    decision=[d.action for d in vllm_compat.current_decisions() if d.name == POINT],
)
vllm_compat.revert()
result["reverted"] = vars(Runner)["execute_model"] is unwrap(execute_model, POINT) and "_prepare_inputs" not in vars(
    Runner)
print("RESULT", json.dumps(result, default=str))
"""


@functools.cache
def run_scenario(point_module: str, runner: str, disabled: bool = False) -> dict:
    """The scenario on vllm-omni's ``runner`` ("module:Class"), with ``point_module``'s drift point on or disabled."""
    env = {"SCENARIO_RUNNER": runner, "SCENARIO_POINT": point_module, "SCENARIO_PROMPTS": json.dumps(PROMPTS)}
    if disabled:
        env["VLLM_COMPAT_DISABLE_PATCHES"] = importlib.import_module(point_module).DRIFT_POINT.id
    result = run_python(SCENARIO, env=env, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


def unpack_line(point) -> int:  # vllm-omni's unpack, in the installed file's text
    text = _installed("vllm_omni", point.omni_runner.removeprefix("vllm_omni/")).read_text()
    return text[:text.index("logits_indices, spec_decode_metadata = self._prepare_inputs(")].count("\n") + 1


def check_unpatched(point, runner):
    out = run_scenario(point.__module__, runner, disabled=True)
    assert out["unpack_line"] == unpack_line(point), out
    step = out["step"]
    # vLLM's real _prepare_inputs ran (positions and input ids of the two prompts) and gave its 3 values
    assert (step["positions"], step["input_ids"]) == (POSITIONS, INPUT_IDS), out
    assert step["returned"] == out["vllms_own"] == [3, LOGITS_INDICES, None, 1], out
    assert (step["stopped_at"], step["error"]) == (out["unpack_line"], UNPACK_ERROR), out
    assert "unpacked" not in step and out["decision"] == ["disabled"], out


def check_patched(point, runner):
    out = run_scenario(point.__module__, runner)
    step = out["step"]
    assert (step["positions"], step["input_ids"]) == (POSITIONS, INPUT_IDS), out
    assert out["vllms_own"] == [3, LOGITS_INDICES, None, 1], out  # vLLM's own: 3 values
    assert step["returned"] == [2] + out["vllms_own"][1:3], out  # the first two, to vllm-omni's unpack
    assert step["unpacked"] == out["vllms_own"][1:3], out
    # the step went on past the unpack, to where this runner's missing model state stops it
    assert step["stopped_at"] > out["unpack_line"] + 3 and step["error"] != UNPACK_ERROR, out
    assert out["outside"] == out["vllms_own"], out  # vLLM's own callers keep all 3
    assert out["runtime"] == out["static"], out
    assert out["decision"] == ["patched"] and out["reverted"] is True, out


def check_native(point, runner):
    patched, unpatched = run_scenario(point.__module__, runner), run_scenario(point.__module__, runner, disabled=True)
    for out in patched, unpatched:
        assert out["vllms_own"] == out["outside"] == out["step"]["returned"] == [2, LOGITS_INDICES, None], out
        assert out["step"]["unpacked"] == [LOGITS_INDICES, None], out
        assert out["step"]["stopped_at"] > out["unpack_line"] + 3 and out["step"]["error"] != UNPACK_ERROR, out
        assert out["reverted"] is True and out["runtime"] == out["static"], out
    assert patched["step"] == unpatched["step"], (patched, unpatched)
    assert (patched["decision"], unpatched["decision"]) == (["skipped"], ["disabled"])


def shape_marks(point):
    """(differs, same): the skip marks of the scenario's tests, from ``point``'s facts on the installed pair."""
    static = point.detect_static(StaticSite.installed())
    differs = pytest.mark.skipif(static.shape != S.DIFFERS, reason="needs vLLM 0.28-0.33 under vllm-omni 0.24.0 / "
                                 f"0.26.0 (vLLM's _prepare_inputs returns more than vllm-omni unpacks); here {static}")
    same = pytest.mark.skipif(static.shape != S.SAME or static.unpacked != UNPACKED, reason="needs vLLM 0.24-0.27 "
                              "under vllm-omni 0.24.0 / 0.26.0 (the 2 values their runners unpack; the scenario builds "
                              f"those runners); here {static}")
    return differs, same


RUNNER = "vllm_omni.worker.gpu_ar_model_runner:GPUARModelRunner"
differs, same = shape_marks(POINT)


@needs_omni
@differs
def test_unpatched_every_ar_step_dies_at_vllm_omnis_unpack():
    check_unpatched(POINT, RUNNER)


@needs_omni
@differs
@needs_startup_hook
def test_patched_the_unpack_gets_vllms_logits_indices_and_the_step_goes_on():
    check_patched(POINT, RUNNER)


@needs_omni
@same
@needs_startup_hook
def test_on_the_native_pair_patched_and_unpatched_agree():
    check_native(POINT, RUNNER)
