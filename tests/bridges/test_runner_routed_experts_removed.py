"""``runner_routed_experts_removed``: vLLM 0.31 dropped ``GPUModelRunner.routed_experts_initialized``, which vllm-omni
0.24.0-0.30.0's AR and generation runners read on every step.

- The facts per installed pair, read from the wheels; the decision table, with what is left out; every read of the
  capture's state (``routed_experts_capturer``, ``routed_experts_cpu``, ...) is under ``routed_experts_initialized``
  in the installed vllm-omni.
- vllm-omni's own runners on CPU torch in a fresh interpreter, built as vllm-omni's own tests build them
  (``object.__new__`` plus the state the method reads; ``tests/worker/test_gpu_generation_model_runner.py`` for
  ``GPUGenerationModelRunner.sample_tokens``, minus its ``routed_experts_initialized = False``, which is what vLLM's
  ``__init__`` used to set): one generation step and ``_omni_extract_routed_experts`` / ``_omni_routed_experts_d2h``
  on the AR runner. Unpatched on vLLM 0.31+ each dies with the real ``AttributeError``; patched each gives what the
  native pair (vLLM 0.24.0 + vllm-omni 0.24.0) gives where the runner holds the value vLLM 0.24's ``__init__``
  assigns (the literal read from its file): ``NATIVE``, measured there and checked again whenever this file runs in
  that cell. Revert takes the stand-in off.
"""

from __future__ import annotations

import ast
import importlib
import json

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, needs_startup_hook, run_python
from tests.bridges.runner_default_cases import guarded_reads
from vllm_compat.bridges import _runner_default as shared
from vllm_compat.bridges import runner_routed_experts_removed as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
K, F = shared.Kind, shared.RunnerDefaultFacts
acts = pytest.mark.skipif(POINT.decide(STATIC, Controls()).action != Action.PATCHED,
                          reason=f"acts where vLLM's runner no longer assigns routed_experts_initialized (0.31-0.33) "
                                 f"and vllm-omni's runners read it (0.24.0-0.30.0); here {STATIC}")
native = pytest.mark.skipif(STATIC.shape != K.VLLM_ASSIGNS or OMNI_VERSION != "0.24.0",
                            reason=f"needs the native pair (vLLM 0.24 assigns it) with vllm-omni 0.24.0; here "
                                   f"{STATIC}, vllm-omni {OMNI_VERSION}")
# vllm-omni 0.24.0-0.30.0's readers (grep of the wheels; the AR runner's _should_return_omni_routed_experts reads it
# through getattr with a default, which is no read)
READERS = ("GPUARModelRunner.execute_model", "GPUGenerationModelRunner.execute_model",
           "GPUGenerationModelRunner.sample_tokens", "OmniGPUModelRunner._omni_extract_routed_experts",
           "OmniGPUModelRunner._omni_routed_experts_d2h")
LEAVES_OUT = "routed-experts capture (return of the experts each token was routed to) in the LLM / AR stages"


@pytest.mark.parametrize(("facts", "action"), [
    (F(K.LACKS, READERS), Action.PATCHED), (F(K.VLLM_ASSIGNS), Action.SKIPPED), (F(K.OMNI_DEFINES), Action.SKIPPED),
    (F(K.NOT_READ), Action.SKIPPED), (F(K.NO_V1_RUNNER), Action.SKIPPED),
    (F(K.UNREAD, unread=("Mixin",)), Action.REFUSED), (F(K.ABSENT), Action.PENDING),
], ids=["lacks", "native", "omni-defines", "not-read", "no-v1-runner", "unread", "absent"])
def test_decision_table_names_what_is_left_out_where_it_acts(facts, action):
    decision = POINT.decide(facts, Controls())
    assert decision.action == action, decision
    acted = action == Action.PATCHED
    assert (decision.leaves_out, decision.leaves_out_of) == ((LEAVES_OUT, "llm_stage") if acted else ("", ""))


@pytest.mark.skipif(VLLM_VERSION is None or OMNI_VERSION is None, reason="needs vLLM and vllm-omni")
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    """vLLM 0.24-0.30's GPUModelRunner assigns it, 0.31-0.33 do not, 0.34 has no V1 runner; vllm-omni 0.24.0-0.30.0
    read it in READERS."""
    version = Version(VLLM_VERSION)
    if version >= Version("0.34"):
        assert STATIC == F(K.NO_V1_RUNNER)
        return
    assert STATIC == (F(K.VLLM_ASSIGNS) if version < Version("0.31") else F(K.LACKS, READERS))
    if STATIC.shape == K.LACKS or OMNI_VERSION == "0.24.0":
        assert POINT.detect_runtime(importlib.import_module(POINT.target_module)) == STATIC


@needs_omni
@acts
@pytest.mark.parametrize("name", bridge.GUARDED[:3])  # routed_experts_slot_mapping_device: under hasattr too
def test_the_captures_state_is_read_only_under_routed_experts_initialized(name):
    """Why handles_drift covers them: with routed_experts_initialized False, vllm-omni never reaches these reads."""
    from vllm_compat.detect.source_tree import tree_of

    tree = tree_of("vllm_omni")
    reads = {path: guarded_reads(tree.read(path), name, bridge.NAME) for path in tree.walk_py("vllm_omni/worker")}
    reads = {path: found for path, found in reads.items() if found}
    assert reads, f"vllm-omni {OMNI_VERSION} reads no {name}"
    assert all(guarded for found in reads.values() for _, guarded in found), reads


SCENARIO = """
import ast, inspect, json
from types import SimpleNamespace

import torch

import vllm_compat
from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner
from vllm_omni.worker.gpu_generation_model_runner import ExecuteModelState, GPUGenerationModelRunner
from vllm_omni.worker.gpu_model_runner import OmniGPUModelRunner

AS_VLLM_INIT = {as_vllm_init}


def vllm_init_value():  # the literal vLLM <= 0.30's GPUModelRunner.__init__ assigns, read from its file
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    init = ast.parse(inspect.getsource(GPUModelRunner)).body[0]
    init = next(n for n in init.body if getattr(n, "name", None) == "__init__")
    return next(ast.literal_eval(n.value) for n in ast.walk(init) if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "attr", None) == "routed_experts_initialized")


def as_vllm_left_it(runner):
    if AS_VLLM_INIT:
        runner.routed_experts_initialized = vllm_init_value()
    return runner


def generation_step():  # vllm-omni's test_sample_tokens_tensor_output, its runner minus routed_experts_initialized
    r = object.__new__(GPUGenerationModelRunner)
    r.execute_model_state = ExecuteModelState(*[None] * 10, torch.ones(1, 2, 3), None)
    r.kv_connector_output = None
    r.input_batch = SimpleNamespace(req_ids=["req-1"], req_id_to_index={{"req-1": 0}}, num_reqs=1, vocab_size=10)
    r.use_async_scheduling = False
    r.device = torch.device("cpu")
    r.supports_mm_inputs = False
    r.speculative_config = None
    r._async_chunk = False
    as_vllm_left_it(r)
    try:
        out = GPUGenerationModelRunner.sample_tokens(r)
    except Exception as exc:
        return f"{{type(exc).__name__}}: {{exc}}"
    return dict(req_ids=out.req_ids, shape=list(out.multimodal_outputs[0]["model_outputs"].shape),
                routed_experts=out.routed_experts)


def ar_runner(method):
    r = as_vllm_left_it(object.__new__(GPUARModelRunner))
    try:
        return method(r, SimpleNamespace(total_num_scheduled_tokens=3))
    except Exception as exc:
        return f"{{type(exc).__name__}}: {{exc}}"


result = dict(generation_step=generation_step(), extract=ar_runner(GPUARModelRunner._omni_extract_routed_experts),
              d2h=ar_runner(GPUARModelRunner._omni_routed_experts_d2h),
              decision=[d.action for d in vllm_compat.current_decisions()
                        if d.name == "runner_routed_experts_removed"])
vllm_compat.revert()
result["after_revert"] = "routed_experts_initialized" in vars(OmniGPUModelRunner)
print("RESULT", json.dumps(result))
"""

# Measured on vLLM 0.24.0 + vllm-omni 0.24.0 (test_the_native_pair_gives_these checks it there): the generation
# step's output without routed experts; neither AR helper captures anything.
NATIVE = {"generation_step": {"req_ids": ["req-1"], "shape": [2, 3], "routed_experts": None}, "extract": None,
          "d2h": None}


def _unpatched(cls: str) -> str:
    return f"AttributeError: '{cls}' object has no attribute 'routed_experts_initialized'"


def _run(env: dict | None = None, as_vllm_init: bool = False) -> dict:
    result = run_python(SCENARIO.format(as_vllm_init=as_vllm_init), env=env, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


def _outcome(out: dict) -> dict:
    return {key: out[key] for key in NATIVE}


@needs_omni
@acts
def test_unpatched_every_reader_fails_with_the_real_attribute_error():
    out = _run({"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
    assert _outcome(out) == {"generation_step": _unpatched("GPUGenerationModelRunner"),
                             "extract": _unpatched("GPUARModelRunner"), "d2h": _unpatched("GPUARModelRunner")}, out
    assert out["decision"] == ["disabled"], out


@needs_omni
@acts
@needs_startup_hook
def test_patched_runners_give_what_the_native_pair_gives():
    out = _run()
    assert _outcome(out) == NATIVE, out
    assert out["decision"] == ["patched"] and out["after_revert"] is False, out


@needs_omni
@native
def test_the_native_pair_gives_these():
    out = _run(as_vllm_init=True)
    assert _outcome(out) == NATIVE and out["decision"] == ["skipped"], out


@needs_omni
@acts
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    owner = POINT.locate(importlib.import_module(POINT.target_module))
    had = POINT.is_installed(owner)
    POINT.uninstall(owner)
    assert bridge.NAME not in vars(owner)
    POINT.prepare(owner, STATIC)
    assert POINT.install(owner, None, None) and not POINT.install(owner, None, None)
    runner = object.__new__(owner)
    assert runner.routed_experts_initialized is False
    runner.routed_experts_initialized = True  # set on the instance (capture set up): it wins
    assert runner.routed_experts_initialized is True and object.__new__(owner).routed_experts_initialized is False
    assert POINT.uninstall(owner) and bridge.NAME not in vars(owner) and not POINT.uninstall(owner)
    if had:
        POINT.install(owner, None, None)


def test_the_default_is_vllm_030s_literal():
    """vLLM 0.30's GPUModelRunner.__init__ (the last that had it) assigns the literal False, read from its wheel."""
    import glob
    import zipfile
    from pathlib import Path

    wheels = glob.glob(str(Path.home() / ".cache/vllm-compat/wheels/vllm-0.30.0-*.whl"))
    if not wheels:
        pytest.skip("vLLM 0.30.0's wheel is not in ~/.cache/vllm-compat/wheels")
    source = zipfile.ZipFile(wheels[0]).read(shared.VLLM_RUNNER).decode()
    runner = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == "GPUModelRunner")
    init = next(n for n in runner.body if getattr(n, "name", None) == "__init__")
    assigned = [n.value.value for n in ast.walk(init) if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "attr", None) == bridge.NAME]
    assert assigned == [False] and POINT.default is False
