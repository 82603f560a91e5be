"""``runner_cascade_attention_removed``: vLLM 0.32 removed cascade attention (``GPUModelRunner.
_compute_cascade_attn_prefix_lens``, and ``_build_attention_metadata``'s ``cascade_attn_prefix_lens``), which vllm-omni
0.24.0-0.30.0's ``GPUARModelRunner`` / ``GPUGenerationModelRunner.execute_model`` still compute and pass.

- The facts per installed pair, read from the wheels; the decision table; the reader on small sources.
- vllm-omni's own ``execute_model`` of both runners with vLLM's real ``_get_slot_mappings`` and
  ``_build_attention_metadata``, on CPU torch, in a fresh interpreter: the runner built as vllm-omni's own guard test
  builds it (``tests/worker/test_gpu_generation_model_runner.py`` ``_make_guard_runner`` in vllm-omni 0.26.0:
  ``object.__new__``, its stubs), plus what the AR runner reads first, no KV cache groups (so vLLM's methods return at
  once) and the model-side steps stubbed as vllm-omni's tests stub them (``_prepare_inputs``,
  ``_determine_batch_execution_and_padding``); the step stops right after the attention metadata is built. With
  ``cascade_attn_enabled`` true (vLLM's ``disable_cascade_attn=False`` on vLLM <= 0.31) and false (what vLLM 0.32+'s
  ``__init__`` pins). Unpatched on vLLM 0.32 / 0.33 each step dies with the real ``AttributeError`` (enabled) or
  ``TypeError`` (disabled); patched, vLLM's real ``_build_attention_metadata`` is reached (seen through the profiler)
  with the arguments the native pair gives it (``NATIVE``, measured on vLLM 0.24 + vllm-omni 0.24.0, vLLM 0.26 +
  vllm-omni 0.26.0, vLLM 0.30 + vllm-omni 0.30.0 and checked again whenever this file runs in those cells), no
  cascade; prefix lengths that are not None are refused; vLLM's own class is untouched; revert takes both off.
"""

from __future__ import annotations

import json

import pytest

from conftest import OMNI_VERSION, needs_omni, needs_startup_hook, run_python
from vllm_compat.bridges import runner_cascade_attention_removed as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.source_tree import parse_source
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
S = bridge.Shape
F = bridge.CascadeFacts
AR, GEN = "GPUARModelRunner.execute_model", "GPUGenerationModelRunner.execute_model"
# what vllm-omni 0.24.0-0.30.0's runners do (read from their wheels)
CALLERS = (f"{AR}: calls _compute_cascade_attn_prefix_lens", f"{GEN}: calls _compute_cascade_attn_prefix_lens",
           f"{AR}: passes cascade_attn_prefix_lens", f"{GEN}: passes cascade_attn_prefix_lens")
BOTH = ("_compute_cascade_attn_prefix_lens", "_build_attention_metadata")
ATTRIBUTE_ERROR = "AttributeError: '{}' object has no attribute '_compute_cascade_attn_prefix_lens'"
TYPE_ERROR = "TypeError: GPUModelRunner._build_attention_metadata() got an unexpected keyword argument " \
             "'cascade_attn_prefix_lens'"

acts = pytest.mark.skipif(STATIC.shape != S.REMOVED, reason="needs vLLM 0.32-0.33 under a vllm-omni whose runners "
                          f"compute / pass cascade prefix lengths (0.24.0-0.30.0); here {STATIC}")
kept = pytest.mark.skipif(STATIC.shape != S.KEPT, reason=f"needs a vLLM that still has cascade attention (<= 0.31); "
                          f"here {STATIC}")


@pytest.mark.parametrize(("facts", "action"), [
    (F(S.REMOVED, CALLERS, BOTH), Action.PATCHED), (F(S.REMOVED, CALLERS[2:], BOTH[1:]), Action.PATCHED),
    (F(S.REMOVED, CALLERS, BOTH, ("GPUARModelRunner.execute_model calls it with 2 ...",)), Action.REFUSED),
    (F(S.KEPT, CALLERS), Action.SKIPPED), (F(S.NO_CALLER), Action.SKIPPED), (F(S.NO_V1_RUNNER), Action.SKIPPED),
    (F(S.NOT_INSTALLED), Action.PENDING),
], ids=["removed", "keyword-only", "misfit", "kept", "no-caller", "no-v1-runner", "absent"])
def test_decision_table(facts, action):
    decision = POINT.decide(facts, Controls())
    assert decision.action == action, decision
    assert decision.leaves_out == "" and ("Nothing is left out" in decision.reason) == (action == Action.PATCHED)


OMNI_SOURCE = """
class GPUARModelRunner({base}):
    def execute_model(self, so):
        x = self._compute_cascade_attn_prefix_lens({args})
        self._build_attention_metadata(num_tokens=1, cascade_attn_prefix_lens=x)
        self._build_attention_metadata(num_tokens=1)
"""


def test_reader_finds_the_old_shape_calls_and_what_does_not_fit():
    def read(base="OmniGPUModelRunner", args="a, b, c"):
        return bridge.old_shape_calls(parse_source(OMNI_SOURCE.format(base=base, args=args)))

    assert read() == ([AR], [AR], [])
    assert read(args="a, b")[2] == [f"{AR} calls _compute_cascade_attn_prefix_lens with 2 positional arguments and 0 "
                                    "keywords, not vLLM 0.31's 3 positional ones"]
    assert read(args="a, b, c=c")[2][0].endswith("1 keywords, not vLLM 0.31's 3 positional ones")
    assert read(base="GPUModelRunner")[2] == ["GPUARModelRunner does not derive OmniGPUModelRunner, which the adapter "
                                              "gives the methods"]
    takes = "def _build_attention_metadata(self, num_tokens, {}):\n    pass\n"
    assert [bridge.takes_keyword(parse_source(takes.format(p)).body[0]) for p in
            ("cascade_attn_prefix_lens=None", "*, cascade_attn_prefix_lens=None", "**kwargs", "slot_mappings=None")] \
        == [True, True, True, False]


@pytest.mark.skipif(OMNI_VERSION is None, reason="needs vllm-omni")
def test_facts_are_what_the_wheels_say():
    """vLLM <= 0.31 keeps both; 0.32 and 0.33 dropped both (each read in its wheel); 0.34 has no V1 runner; vllm-omni
    0.24.0-0.30.0's two runners compute and pass the prefix lengths."""
    from packaging.version import Version

    from conftest import VLLM_VERSION

    version = Version(VLLM_VERSION)
    if version >= Version("0.34"):
        assert STATIC == F(S.NO_V1_RUNNER)
    elif version >= Version("0.32"):
        assert STATIC == F(S.REMOVED, CALLERS, BOTH)
    else:
        assert STATIC == F(S.KEPT, CALLERS)


SCENARIO = """
import ast, contextlib, inspect, json, sys, textwrap
from types import SimpleNamespace

import numpy as np
import torch

from vllm.config import CacheConfig
from vllm.config.compilation import CUDAGraphMode
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_generation_model_runner import GPUGenerationModelRunner
from vllm_omni.worker.gpu_model_runner import OmniGPUModelRunner
import vllm_compat
from vllm_compat.drift import is_ours

BUILD = vars(GPUModelRunner)["_build_attention_metadata"]  # vLLM's own: its arguments seen through the profiler
COMPUTE, KEYWORD = "_compute_cascade_attn_prefix_lens", "cascade_attn_prefix_lens"
reached = []


def profile(frame, event, arg):
    if event == "call" and frame.f_code is BUILD.__code__:
        code = frame.f_code
        reached.append({n: plain(frame.f_locals[n]) for n in code.co_varnames[1:code.co_argcount]})


def plain(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    return value if value is None or isinstance(value, (bool, int, float, str, list, dict)) else repr(value)


class Stop(Exception):  # raised right after the attention metadata is built: the rest of the step needs a GPU
    pass


def unpacked(cls, name):  # how many values this vllm-omni's execute_model unpacks from self.<name>(...)
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.execute_model)))
    return next(len(n.targets[0].elts) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                and isinstance(n.value, ast.Call) and getattr(n.value.func, "attr", None) == name)


def runner(cls, cascade_enabled, prefix_lens=None):
    r = object.__new__(cls)
    # vllm-omni's own guard runner (its 0.26.0 tests/worker/test_gpu_generation_model_runner.py _make_guard_runner)
    r.execute_model_state = None
    r.routed_experts_initialized = False
    r.speculative_config = None
    r.model_config = SimpleNamespace(async_chunk=False)
    r.cache_config = CacheConfig()
    r.model = object()
    r._update_states = lambda scheduler_output: None
    r.synchronize_input_prep = contextlib.nullcontext
    r.attach_omni_connector_output = lambda result: result
    # what the AR runner reads before: no prefix cache, no KV transfer
    r.omni_prefix_cache = None
    r.kv_transfer_manager = SimpleNamespace(handle_finished_requests_kv_transfer=lambda **kwargs: None)
    r.kv_caches = []
    # the batch and the cascade switch; no KV cache groups, so vLLM's own _get_slot_mappings and
    # _build_attention_metadata return at once
    r.cascade_attn_enabled = cascade_enabled
    r.parallel_config = SimpleNamespace(use_ubatching=False, num_ubatches=1)
    r.input_batch = SimpleNamespace(num_reqs=2, req_ids=["r1", "r2"], num_computed_tokens_cpu=np.array([4, 0]))
    r.kv_cache_config = SimpleNamespace(kv_cache_groups=[])
    r.attn_groups = []
    # the model-side steps stubbed as vllm-omni's tests stub them: logits indices, no spec decode, one sampled token
    prepared = (torch.tensor([0, 2]), None, 1)[:unpacked(cls, "_prepare_inputs")]
    r._prepare_inputs = lambda scheduler_output, num_scheduled_tokens: prepared
    r.seen_cascade = []

    def determine(**kwargs):
        r.seen_cascade.append(kwargs["use_cascade_attn"])
        return CUDAGraphMode.NONE, SimpleNamespace(num_tokens=3, num_reqs=None), False, None, None

    r._determine_batch_execution_and_padding = determine
    if prefix_lens is not None:
        r._compute_cascade_attn_prefix_lens = lambda *args: prefix_lens

    def stop(**kwargs):
        raise Stop(kwargs["attn_metadata"])

    r._maybe_attach_attention_metadata_extensions = stop
    return r


def step(cls, cascade_enabled, prefix_lens=None):
    scheduler_output = SimpleNamespace(
        total_num_scheduled_tokens=3, num_scheduled_tokens={"r1": 1, "r2": 2}, scheduled_spec_decode_tokens={},
        scheduled_encoder_inputs={}, num_common_prefix_blocks=[0], finished_req_ids=set(), kv_connector_metadata=None)
    r = runner(cls, cascade_enabled, prefix_lens)
    reached.clear()
    sys.setprofile(profile)
    try:
        cls.execute_model(r, scheduler_output)
        found = "returned"
    except Stop as stop:
        found = {"attn_metadata": plain(stop.args[0])}
    except Exception as exc:
        found = f"{type(exc).__name__}: {exc}"
    finally:
        sys.setprofile(None)
    return {"step": found, "use_cascade_attn": r.seen_cascade, "vllm_build": list(reached)}


def steps():
    return {f"{cls.__name__}{'' if enabled else '_disabled'}": step(cls, enabled)
            for cls in (GPUARModelRunner, GPUGenerationModelRunner) for enabled in (True, False)}


result = dict(
    steps=steps(),
    prefix_lens=step(GPUGenerationModelRunner, True, [[16]]),
    defaults={name: plain(p.default) for name, p in inspect.signature(BUILD).parameters.items()
              if p.default is not p.empty},
    vllm_untouched=COMPUTE not in vars(GPUModelRunner) or not is_ours(vars(GPUModelRunner)[COMPUTE]),
    vllm_build_is_vllms=vars(GPUModelRunner)["_build_attention_metadata"] is BUILD and not is_ours(BUILD),
    decision=[d.action for d in vllm_compat.current_decisions() if d.name == "runner_cascade_attention_removed"],
)
vllm_compat.revert()
result["reverted"] = not any(name in vars(OmniGPUModelRunner) for name in (COMPUTE, "_build_attention_metadata"))
result["after_revert"] = step(GPUGenerationModelRunner, False)["step"]
print("RESULT", json.dumps(result))
"""

# The arguments vLLM's _build_attention_metadata gets, that are not at its defaults, on the native pair of each
# vllm-omni release (test_the_native_pair_passes_these checks it there): no cascade (vLLM 0.24-0.30's own
# _compute_cascade_attn_prefix_lens ran where enabled and gave None; cascade_attn_prefix_lens=None, its default).
NATIVE_024 = {"num_tokens": 3, "num_reqs": 2, "max_query_len": 2, "logits_indices": [0, 2],
              "num_scheduled_tokens": {"r1": 1, "r2": 2}}
NATIVE = {"0.24.0": NATIVE_024, "0.26.0": NATIVE_024, "0.30.0": {**NATIVE_024, "max_num_sampled_tokens": 1}}
STEPS = ("GPUARModelRunner", "GPUARModelRunner_disabled", "GPUGenerationModelRunner", "GPUGenerationModelRunner_disabled")
native_measured = pytest.mark.skipif(OMNI_VERSION not in NATIVE, reason=f"the native pair's arguments were measured "
                                     f"for vllm-omni {', '.join(NATIVE)}; this env has {OMNI_VERSION}")


def _run(env: dict | None = None) -> dict:
    result = run_python(SCENARIO, env=env, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


def _not_at_default(out, name):
    """The one call of vLLM's _build_attention_metadata in step ``name``: its arguments not at their defaults."""
    (build,) = out["steps"][name]["vllm_build"]
    return {k: v for k, v in build.items() if k not in out["defaults"] or v != out["defaults"][k]}


@needs_omni
@acts
def test_unpatched_every_step_fails_with_the_real_errors():
    out = _run({"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
    for name in STEPS:
        cls = name.split("_")[0]
        expected = TYPE_ERROR if name.endswith("_disabled") else ATTRIBUTE_ERROR.format(cls)
        assert out["steps"][name]["step"] == expected and out["steps"][name]["vllm_build"] == [], (name, out)
    assert out["prefix_lens"]["step"] == TYPE_ERROR, out
    assert out["decision"] == ["disabled"], out


@needs_omni
@acts
@needs_startup_hook
@native_measured
def test_patched_steps_reach_vllms_build_with_what_the_native_pair_passes():
    out = _run()
    for name in STEPS:
        assert out["steps"][name]["step"] == {"attn_metadata": {}}, (name, out)  # vLLM's own: no KV cache groups
        assert out["steps"][name]["use_cascade_attn"] == [False], (name, out)
        assert "cascade_attn_prefix_lens" not in out["steps"][name]["vllm_build"][0], (name, out)
        assert _not_at_default(out, name) == NATIVE[OMNI_VERSION], (name, out)
    refused = out["prefix_lens"]
    assert refused["step"].startswith("CascadeAttentionRemovedError: GPUGenerationModelRunner passed "
                                      "cascade_attn_prefix_lens=[[16]] to vLLM's _build_attention_metadata"), out
    assert refused["vllm_build"] == [], out  # refused before vLLM's method: never silently without cascade
    assert out["vllm_untouched"] and out["vllm_build_is_vllms"], out
    assert out["decision"] == ["patched"] and out["reverted"] is True and out["after_revert"] == TYPE_ERROR, out


@needs_omni
@kept
@native_measured
def test_the_native_pair_passes_these():
    """On a vLLM that still has cascade attention nothing is installed; vLLM's _build_attention_metadata gets
    cascade_attn_prefix_lens=None from both runners (vLLM's own _compute_cascade_attn_prefix_lens where enabled)."""
    out = _run()
    for name in STEPS:
        (build,) = out["steps"][name]["vllm_build"]
        assert build["cascade_attn_prefix_lens"] is None and out["steps"][name]["use_cascade_attn"] == [False], out
        assert _not_at_default(out, name) == NATIVE[OMNI_VERSION], (name, out)
    assert out["prefix_lens"]["vllm_build"][0]["cascade_attn_prefix_lens"] == [[16]], out  # passed through there
    assert out["decision"] == ["skipped"] and out["reverted"] is True, out
