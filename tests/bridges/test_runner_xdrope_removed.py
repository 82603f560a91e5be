"""``runner_xdrope_removed``: vLLM 0.30 dropped ``GPUModelRunner.uses_xdrope_dim``, which vllm-omni 0.24.0-0.28.0's
``OmniGPUModelRunner`` reads for every new request and in ``_preprocess`` / ``_dummy_run``.

- The facts per installed pair, read from the wheels; the decision table; every read of what XD-RoPE alone uses
  (``xdrope_positions``, ``_init_xdrope_positions``) is under ``uses_xdrope_dim > 0`` in the installed vllm-omni.
- vllm-omni's own ``OmniGPUModelRunner._preprocess`` on CPU torch in a fresh interpreter, the runner built as
  vllm-omni's own tests build it (``object.__new__`` plus the state the method reads: a text model on its token-id
  path, two requests, 3 tokens padded to 4). Unpatched on vLLM 0.30+ it dies with the real ``AttributeError``;
  patched it gives what the native pair (vLLM 0.24.0 + vllm-omni 0.24.0) gives, where the runner holds what vLLM
  0.24's ``__init__`` sets (``model_config.uses_xdrope_dim``, vLLM's own property, for a Llama config): ``NATIVE``,
  measured there and checked again whenever this file runs in that cell. Revert takes the stand-in off.
"""

from __future__ import annotations

import ast
import importlib
import json

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, needs_startup_hook, run_python
from tests.bridges.runner_default_cases import check_guard_reader, guarded_reads
from vllm_compat.bridges import _runner_default as shared
from vllm_compat.bridges import runner_xdrope_removed as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite
from vllm_compat.errors import PatchRefusedError

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
K, F = shared.Kind, shared.RunnerDefaultFacts
acts = pytest.mark.skipif(POINT.decide(STATIC, Controls()).action != Action.PATCHED,
                          reason=f"acts where vLLM's runner no longer assigns uses_xdrope_dim (0.30-0.33) and "
                                 f"vllm-omni's runners read it (0.24.0-0.28.0); here {STATIC}")
native = pytest.mark.skipif(STATIC.shape != K.VLLM_ASSIGNS or OMNI_VERSION != "0.24.0",
                            reason=f"needs the native pair (vLLM 0.24 assigns it) with vllm-omni 0.24.0; here "
                                   f"{STATIC}, vllm-omni {OMNI_VERSION}")
# vllm-omni 0.24.0-0.28.0's readers (grep of the wheels: gpu_model_runner.py, gpu_generation_model_runner.py)
READERS = ("GPUGenerationModelRunner._dummy_run", "OmniGPUModelRunner._dummy_run", "OmniGPUModelRunner._preprocess",
           "OmniGPUModelRunner._update_states")


@pytest.mark.parametrize(("facts", "action"), [
    (F(K.LACKS, READERS), Action.PATCHED), (F(K.VLLM_ASSIGNS), Action.SKIPPED), (F(K.OMNI_DEFINES), Action.SKIPPED),
    (F(K.NOT_READ), Action.SKIPPED), (F(K.NO_V1_RUNNER), Action.SKIPPED), (F(K.UNREAD, unread=("Mixin",)),
                                                                            Action.REFUSED),
    (F(K.ABSENT), Action.PENDING),
], ids=["lacks", "native", "omni-defines", "not-read", "no-v1-runner", "unread", "absent"])
def test_decision_table(facts, action):
    decision = POINT.decide(facts, Controls())
    assert decision.action == action, decision
    assert decision.leaves_out == "" and (action != Action.PATCHED or "dropped XD-RoPE models" in decision.reason)


def test_a_read_is_an_attribute_load_on_self():
    function = ast.parse("def f(self, other):\n    if self.uses_xdrope_dim > 0:\n        pass\n").body[0]
    assert shared.reads_self(function, bridge.NAME)
    for body in ("other.uses_xdrope_dim", "getattr(self, 'uses_xdrope_dim', 0)", "self.uses_xdrope_dim = 0"):
        assert not shared.reads_self(ast.parse(f"def f(self, other):\n    {body}\n").body[0], bridge.NAME), body


@pytest.mark.skipif(VLLM_VERSION is None or OMNI_VERSION is None, reason="needs vLLM and vllm-omni")
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    """vLLM 0.24-0.29's GPUModelRunner.__init__ assigns it, 0.30-0.33 do not, 0.34 has no V1 runner; vllm-omni
    0.24.0-0.28.0 read it in READERS, 0.30.0 does not."""
    version = Version(VLLM_VERSION)
    if version >= Version("0.34"):
        assert STATIC == F(K.NO_V1_RUNNER)
        return
    if version < Version("0.30"):
        assert STATIC == F(K.VLLM_ASSIGNS)
    else:
        assert STATIC == (F(K.LACKS, READERS) if Version(OMNI_VERSION) < Version("0.30") else F(K.NOT_READ))
    if STATIC.shape == K.LACKS or OMNI_VERSION == "0.24.0":
        assert POINT.detect_runtime(importlib.import_module(POINT.target_module)) == STATIC


@needs_omni
@acts
@pytest.mark.parametrize("name", bridge.GUARDED)
def test_what_xdrope_alone_uses_is_read_only_under_uses_xdrope_dim(name):
    """Why handles_drift covers them: with uses_xdrope_dim 0, vllm-omni never reaches these reads."""
    from vllm_compat.detect.source_tree import tree_of

    tree = tree_of("vllm_omni")
    reads = {path: guarded_reads(tree.read(path), name, bridge.NAME) for path in tree.walk_py("vllm_omni/worker")}
    reads = {path: found for path, found in reads.items() if found}
    assert reads, f"vllm-omni {OMNI_VERSION} reads no {name}"
    assert all(guarded for found in reads.values() for _, guarded in found), reads


def test_the_guard_reader_tells_guarded_from_unguarded_reads():
    check_guard_reader()


SCENARIO = """
import json
from types import SimpleNamespace

import torch

import vllm_compat
from vllm_omni.worker import gpu_model_runner as module
from vllm_omni.worker.gpu_model_runner import OmniGPUModelRunner

AS_VLLM_INIT = {as_vllm_init}
# one pipeline rank, as a single-GPU stage runs: no process group to ask
module.get_pp_group = lambda: SimpleNamespace(is_first_rank=True, is_last_rank=True)


def runner():
    r = object.__new__(OmniGPUModelRunner)
    r.model_config = SimpleNamespace(is_encoder_decoder=False)
    r.vllm_config = SimpleNamespace(model_config=SimpleNamespace(async_chunk=False))
    r.supports_mm_inputs = r.enable_prompt_embeds = r.is_pooling_model = r.uses_mrope = False
    r.lookback_token_ids = None  # vLLM 0.30+'s _init_model_kwargs reads it
    r.model = SimpleNamespace()  # a text model: no preprocess hook
    r.input_ids = SimpleNamespace(gpu=torch.tensor([11, 12, 13, 99, 0, 0]))
    r.positions = torch.tensor([5, 0, 1, 7, 7, 7])
    r.input_batch = SimpleNamespace(req_ids=["r1", "r2"], num_reqs=2)
    if AS_VLLM_INIT:  # what vLLM <= 0.29's GPUModelRunner.__init__ sets: model_config.uses_xdrope_dim
        from transformers import LlamaConfig
        from vllm.config import ModelConfig

        r.uses_xdrope_dim = ModelConfig.uses_xdrope_dim.fget(SimpleNamespace(hf_config=LlamaConfig()))
    return r


def preprocess():
    r = runner()
    scheduler_output = SimpleNamespace(total_num_scheduled_tokens=3, num_scheduled_tokens={{"r1": 1, "r2": 2}})
    try:
        found = OmniGPUModelRunner._preprocess(r, scheduler_output, 4)
    except Exception as exc:
        return f"{{type(exc).__name__}}: {{exc}}"
    input_ids, inputs_embeds, positions, intermediate_tensors, model_kwargs, ec_output = found
    return dict(input_ids=input_ids.tolist(), inputs_embeds=inputs_embeds, positions=positions.tolist(),
                padding_zeroed=r.positions.tolist(), intermediate_tensors=intermediate_tensors,
                model_kwargs=model_kwargs, ec_output=ec_output,
                num_scheduled_tokens=r._omni_num_scheduled_tokens_np.tolist(), uses_xdrope_dim=r.uses_xdrope_dim)


result = dict(preprocess=preprocess(),
              decision=[d.action for d in vllm_compat.current_decisions() if d.name == "runner_xdrope_removed"])
vllm_compat.revert()
result["after_revert"] = "uses_xdrope_dim" in vars(OmniGPUModelRunner)
print("RESULT", json.dumps(result))
"""

# Measured on vLLM 0.24.0 + vllm-omni 0.24.0 (test_the_native_pair_gives_these checks it there): the token ids, the
# 1-D positions (the padding slot zeroed), no embeddings, no kwargs.
NATIVE = {"input_ids": [11, 12, 13, 99], "inputs_embeds": None, "positions": [5, 0, 1, 0],
          "padding_zeroed": [5, 0, 1, 0, 7, 7], "intermediate_tensors": None, "model_kwargs": {}, "ec_output": None,
          "num_scheduled_tokens": [1, 2], "uses_xdrope_dim": 0}
UNPATCHED = "AttributeError: 'OmniGPUModelRunner' object has no attribute 'uses_xdrope_dim'"


def _run(env: dict | None = None, as_vllm_init: bool = False) -> dict:
    result = run_python(SCENARIO.format(as_vllm_init=as_vllm_init), env=env, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


@needs_omni
@acts
def test_unpatched_preprocess_fails_with_the_real_attribute_error():
    out = _run({"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
    assert out["preprocess"] == UNPATCHED and out["decision"] == ["disabled"], out


@needs_omni
@acts
@needs_startup_hook
def test_patched_preprocess_gives_what_the_native_pair_gives():
    out = _run()
    assert out["preprocess"] == NATIVE, out
    assert out["decision"] == ["patched"] and out["after_revert"] is False, out


@needs_omni
@native
def test_the_native_pair_gives_these():
    out = _run(as_vllm_init=True)
    assert out["preprocess"] == NATIVE and out["decision"] == ["skipped"], out


# ---- install, uninstall, the contract check ----

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
    assert runner.uses_xdrope_dim == 0 and type(runner.uses_xdrope_dim) is int
    runner.uses_xdrope_dim = 2  # a value set on the instance wins, as over a plain class attribute
    assert runner.uses_xdrope_dim == 2 and object.__new__(owner).uses_xdrope_dim == 0
    assert POINT.uninstall(owner) and bridge.NAME not in vars(owner) and not POINT.uninstall(owner)
    if had:
        POINT.install(owner, None, None)


def test_prepare_refuses_where_a_class_on_the_walk_has_it():
    base = type("GPUModelRunner", (), {bridge.NAME: 3})
    with pytest.raises(PatchRefusedError, match=r"GPUModelRunner.uses_xdrope_dim exists \(3\)"):
        POINT.prepare(type("OmniGPUModelRunner", (base,), {}), STATIC)
    POINT.prepare(type("OmniGPUModelRunner", (type("GPUModelRunner", (), {}),), {}), STATIC)
