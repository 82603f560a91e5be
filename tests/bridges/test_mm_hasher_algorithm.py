"""``mm_hasher_algorithm``: vLLM 0.27.1+'s ``MultiModalHasher.hash_kwargs`` requires the algorithm, which vllm-omni
0.24.0's ``AsyncOmniEngine._ensure_stage_replica_mm_uuids`` does not pass.

- The facts, read from the installed wheels (vLLM 0.24's ``hash_kwargs`` chooses the algorithm itself, 0.30-0.34's
  require it; vllm-omni 0.24.0 omits it), agree at run time; the decision table; the readers on small sources.
- vllm-omni's own method, unpatched on the drifted vLLM: the real ``TypeError``.
- Patched, an engine as vllm-omni's tests build it (``object.__new__``), its stage-0 model config holding vLLM's own
  ``MultiModalConfig`` with each algorithm vLLM allows: the scoped UUIDs are ``stage0:rep1:`` + vLLM's own content
  hash of the item (``ProcessorInputs.get_mm_hashes``, the path vLLM's multimodal processor hashes a request with)
  under that algorithm; a user's UUID and a missing item are scoped as vllm-omni scopes them; an engine without a
  model config gets the hash of ``EngineArgs``' default algorithm.
- The native pair (vLLM 0.24): vllm-omni's own method, unpatched, gives vLLM's own content hash the same way: the
  behaviour the adapter restores.
- Uninstall puts back vllm-omni's exact function.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import SimpleNamespace
from unittest import mock

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni
from vllm_compat.bridges import mm_hasher_algorithm as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite
from vllm_compat.drift import unwrap

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
S = bridge.Shape
F = bridge.HasherAlgorithmFacts
MODEL = "test-model"

acts = pytest.mark.skipif(POINT.decide(STATIC, Controls()).action != Action.PATCHED,
                          reason=f"acts where vLLM's hash_kwargs requires the algorithm (0.27.1+) and vllm-omni omits "
                                 f"it (0.24.0); here {STATIC}")
native = pytest.mark.skipif(STATIC.vllm != S.CHOOSES or STATIC.omni != S.OMITS,
                            reason=f"the native pair's shape (vLLM <= 0.27.0 under vllm-omni 0.24.0); here {STATIC}")


@pytest.mark.parametrize(("facts", "action"), [
    (F(S.REQUIRES, S.OMITS), Action.PATCHED), (F(S.CHOOSES, S.OMITS), Action.SKIPPED),
    (F(S.REQUIRES, S.PASSES), Action.SKIPPED), (F(S.REQUIRES, S.ABSENT), Action.SKIPPED),
    (F(S.ABSENT, S.OMITS), Action.SKIPPED), (F(S.UNKNOWN, S.OMITS), Action.REFUSED),
    (F(S.REQUIRES, S.UNKNOWN), Action.REFUSED),
])
def test_decision_table(facts, action):
    assert POINT.decide(facts, Controls()).action == action


def test_shapes_are_read_from_the_files():
    hasher = "class MultiModalHasher:\n    @classmethod\n    def hash_kwargs(cls, {}) -> str:\n        pass\n"
    assert bridge.vllm_shape_from_source(hasher.format("algorithm, /, **kwargs")) == S.REQUIRES
    assert bridge.vllm_shape_from_source(hasher.format("**kwargs")) == S.CHOOSES
    assert bridge.vllm_shape_from_source(hasher.format("algorithm='blake3', /, **kwargs")) == S.CHOOSES
    assert bridge.vllm_shape_from_source("class Other:\n    pass\n") == S.ABSENT
    engine = ("class AsyncOmniEngine:\n    def _ensure_stage_replica_mm_uuids(self, prompt, *, stage_id, replica_id):"
              "\n        from vllm.multimodal.hasher import MultiModalHasher\n"
              "        return MultiModalHasher.hash_kwargs({}model_id=m, **{{k: v}})\n")
    assert bridge.omni_shape_from_source(engine.format("")) == S.OMITS
    assert bridge.omni_shape_from_source(engine.format("self.algorithm, ")) == S.PASSES
    assert bridge.omni_shape_from_source(engine.replace("hash_kwargs", "hash_other").format("")) == S.ABSENT
    assert bridge.omni_shape_from_source(None) == S.ABSENT


def _engine_module():
    try:
        return importlib.import_module(POINT.entry.target_module)
    except ImportError as exc:
        pytest.skip(f"{POINT.entry.target_module} does not import here ({exc})")


@needs_omni
@pytest.mark.skipif(VLLM_VERSION is None or OMNI_VERSION is None, reason="needs vLLM and vllm-omni")
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    """vLLM 0.24's hash_kwargs(**kwargs) reads VLLM_MM_HASHER_ALGORITHM; 0.30, 0.33 and 0.34's take
    ``(algorithm, /, **kwargs)`` (read from the wheels); vllm-omni 0.24.0 calls it with keywords only."""
    assert STATIC.vllm == (S.REQUIRES if Version(VLLM_VERSION) >= Version("0.27.1") else S.CHOOSES)
    if Version(OMNI_VERSION) == Version("0.24.0"):
        assert STATIC.omni == S.OMITS
    assert POINT.detect_runtime(_engine_module()) == STATIC


# ---- vllm-omni's own method, on an engine built as vllm-omni's tests build it ----

def _image(colour):
    from PIL import Image

    return Image.new("RGB", (8, 8), colour)


def _engine(input_processor=None):
    engine = object.__new__(_engine_module().AsyncOmniEngine)
    engine.model = MODEL
    if input_processor is not None:
        engine.input_processor = input_processor
    return engine


def _with_algorithm(algorithm):
    """A stage-0 input processor whose model config holds vLLM's own MultiModalConfig with ``algorithm`` (where
    vLLM's processor reads it: ``InputProcessor.model_config.multimodal_config``)."""
    from vllm.config.multimodal import MultiModalConfig

    config = MultiModalConfig(mm_hasher_algorithm=algorithm)
    return SimpleNamespace(model_config=SimpleNamespace(multimodal_config=config))


def _prompt(first, second):
    return {"prompt": "describe", "multi_modal_data": {"image": [first, second, None]},
            "multi_modal_uuids": {"image": [None, "user-uuid"]}}


def vllm_content_hash(item, *algorithm) -> str:
    """vLLM's own hash of an image request's item: ``ProcessorInputs.get_mm_hashes``, as vLLM's multimodal
    processor calls it (0.27.1+: with ``mm_config.mm_hasher_algorithm``; before: the algorithm it chooses itself)."""
    from vllm.multimodal.parse import MultiModalDataParser
    from vllm.multimodal.processing.inputs import ProcessorInputs

    items = MultiModalDataParser().parse_mm_data({"image": item})
    return ProcessorInputs(prompt=[], mm_data_items=items).get_mm_hashes(MODEL, *algorithm)["image"][0]


def _scoped(method, engine, prompt):
    method(engine, prompt, stage_id=0, replica_id=1)
    return prompt["multi_modal_uuids"]["image"]


def _vllm_omnis_own():
    return unwrap(vars(_engine_module().AsyncOmniEngine)[bridge.METHOD])


@pytest.fixture
def patched_method():
    """The method as the startup hook leaves it (installed here where the hook is absent, and taken off after)."""
    owner = POINT.locate(_engine_module())
    installed_here = not POINT.is_installed(owner)
    if installed_here:
        POINT.install(owner, None, POINT.prepare(owner, STATIC))
    yield vars(owner)[bridge.METHOD]
    if installed_here:
        POINT.uninstall(owner)


@needs_omni
@acts
def test_unpatched_method_fails_on_vllms_hasher():
    with pytest.raises(TypeError, match=r"hash_kwargs\(\) missing 1 required positional argument: 'algorithm'"):
        _scoped(_vllm_omnis_own(), _engine(_with_algorithm("blake3")), _prompt(_image("red"), _image("blue")))


def _vllm_algorithms():
    import typing

    from vllm.config.multimodal import MMHasherAlgorithm

    return typing.get_args(MMHasherAlgorithm)


@needs_omni
@acts
@pytest.mark.parametrize("algorithm", ["blake3", "sha256", "sha512"])
def test_scoped_uuids_are_vllms_own_hash_under_the_engines_algorithm(patched_method, algorithm):
    assert algorithm in _vllm_algorithms()
    red, blue = _image("red"), _image("blue")
    scoped = _scoped(patched_method, _engine(_with_algorithm(algorithm)), _prompt(red, blue))
    assert scoped == [f"stage0:rep1:{vllm_content_hash(red, algorithm)}", "stage0:rep1:user-uuid", None]
    others = {vllm_content_hash(red, other) for other in _vllm_algorithms() if other != algorithm}
    assert scoped[0].removeprefix("stage0:rep1:") not in others  # the engine's algorithm, not another


@needs_omni
@acts
@pytest.mark.parametrize("input_processor", [mock.Mock(), SimpleNamespace(model_config=SimpleNamespace(
    multimodal_config=None)), None], ids=["mock", "text-only", "none"])
def test_an_engine_without_an_algorithm_gets_vllms_default(patched_method, input_processor):
    """vllm-omni's tests build the engine with a Mock input processor; a text-only model config has no multimodal
    config: the hash of the algorithm an engine started without ``--mm-hasher-algorithm`` uses (EngineArgs')."""
    from vllm.engine.arg_utils import EngineArgs

    field = {f.name: f for f in dataclasses.fields(EngineArgs)}["mm_hasher_algorithm"]
    # EngineArgs' own field: a default (vLLM 0.30+) or a factory (0.27.1-0.29: the deprecated env variable, else blake3)
    default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
    red = _image("red")
    scoped = _scoped(patched_method, _engine(input_processor), {"multi_modal_data": {"image": red}})
    assert scoped == [f"stage0:rep1:{vllm_content_hash(red, default)}"]


@needs_omni
@acts
def test_prompts_vllm_omni_leaves_alone_are_left_alone(patched_method):
    engine = _engine(_with_algorithm("sha256"))
    for prompt in ({"prompt": "text only"}, {"multi_modal_data": {}}, {"multi_modal_data": {"image": []}}):
        before = dict(prompt)
        patched_method(engine, prompt, stage_id=0, replica_id=1)
        assert prompt == before


@needs_omni
@native
def test_native_pair_scopes_vllms_own_hash():
    """What the adapter restores: on its own vLLM, vllm-omni 0.24.0's method scopes vLLM's own content hash."""
    red, blue = _image("red"), _image("blue")
    scoped = _scoped(_vllm_omnis_own(), _engine(mock.Mock()), _prompt(red, blue))
    assert scoped == [f"stage0:rep1:{vllm_content_hash(red)}", "stage0:rep1:user-uuid", None]
    assert not POINT.is_installed(POINT.locate(_engine_module()))


@needs_omni
@acts
def test_uninstall_puts_back_vllm_omnis_function(patched_method):
    owner = POINT.locate(_engine_module())
    original = _vllm_omnis_own()
    assert patched_method.__wrapped__ is original
    assert POINT.uninstall(owner) and vars(owner)[bridge.METHOD] is original
    assert POINT.install(owner, None, POINT.prepare(owner, STATIC)) and not POINT.install(owner, None, None)
    assert unwrap(vars(owner)[bridge.METHOD]) is original
