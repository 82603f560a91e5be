"""The ``vllm.inputs.preprocess`` stand-in's module handling and delegation, in the pytest process.

- The module object: what ``from vllm.inputs.preprocess import InputPreprocessor`` (vllm-omni 0.24.0's import) finds
  once installed on the real ``vllm.inputs``, and the real ``ModuleNotFoundError`` without it (vLLM 0.29+).
- Its host check: which of ``sys.modules``, the parent's attribute and the parent's files holds a ``preprocess``,
  and whether that one is this entry's (scratch parents and a scratch package folder written here; the real
  ``vllm.inputs`` against whether the wheel ships ``vllm/inputs/preprocess.py``).
- ``prepare`` / ``install`` / ``uninstall``: both registrations, each idempotent, never over another's module.
- The class: its renderer check, vLLM's default multimodal registry, the multimodal path (a text prompt is tokenized
  first by the same renderer) and ``preprocess`` through a subclass's ``_prompt_to_llm_inputs``, on a real renderer
  with the tiny offline tokenizer of ``preprocess_cases``.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

from conftest import needs_vllm
from tests.bridges import preprocess_cases as cases
from vllm_compat.bridges import HostKind, StandInFacts
from vllm_compat.bridges import input_preprocessor as ip
from vllm_compat.drift import MARK, is_ours, mark
from vllm_compat.errors import PatchRefusedError

POINT = ip.DRIFT_POINT
MODULE = "vllm.inputs.preprocess"  # the module vLLM 0.29 removed (its release notes / the wheels)
ORACLE = json.loads(cases.ORACLE.read_text())["cases"]  # what vLLM 0.28.0's own InputPreprocessor gave


@pytest.fixture
def no_registration(monkeypatch):
    """``sys.modules`` without a ``vllm.inputs.preprocess`` entry for the test (put back after it)."""
    monkeypatch.delitem(sys.modules, MODULE, raising=False)


def _parent(path=None, **names):
    parent = types.ModuleType("vllm.inputs")
    if path is not None:
        parent.__path__ = [str(path)]
    vars(parent).update(names)
    return parent


# ---- the module object ----

def test_the_stand_in_module_is_one_marked_module_holding_the_class():
    module = ip.stand_in_module()
    assert module is ip.stand_in_module()  # one per process: revert + apply puts the same one back
    assert isinstance(module, types.ModuleType) and module.__name__ == MODULE
    assert module.__spec__.name == MODULE and module.__spec__.origin.startswith("vllm_compat.")
    assert module.InputPreprocessor is ip.InputPreprocessor
    assert getattr(module, MARK) == POINT.id and getattr(ip.InputPreprocessor, MARK) == POINT.id
    assert "0.29" in module.__doc__ and MODULE in module.__doc__


@needs_vllm
def test_the_module_is_made_on_first_use_as_an_importable_module(monkeypatch):
    """A fresh process's first call (the one an import hook makes): the cache emptied for this test, put back after."""
    monkeypatch.setattr(ip, "_stand_in_module", None)
    made = ip.stand_in_module()
    assert made is ip.stand_in_module() and ip._stand_in_module is made
    assert isinstance(made, types.ModuleType) and made.__name__ == MODULE and "0.29" in made.__doc__
    assert made.InputPreprocessor is ip.InputPreprocessor and getattr(made, MARK) == POINT.id
    monkeypatch.setitem(sys.modules, MODULE, made)
    spec = importlib.util.find_spec(MODULE)  # reads the registered module's __spec__
    assert spec.name == MODULE and spec.loader is None and spec.origin == ip.__name__
    namespace = {}
    exec(f"from {MODULE} import InputPreprocessor", namespace)  # noqa: S102 - vllm-omni 0.24.0's statement
    assert namespace["InputPreprocessor"] is ip.InputPreprocessor


@needs_vllm
def test_on_the_real_vllm_inputs_the_import_fails_without_it_and_finds_it_with_it():
    parent = importlib.import_module("vllm.inputs")
    if Path(parent.__file__).with_name("preprocess.py").exists():
        assert POINT.host_in_module(parent) == HostKind.DEFINES
        pytest.skip("this vLLM ships vllm/inputs/preprocess.py (<= 0.28): its own module is used")
    before = (sys.modules.get(MODULE), vars(parent).get("preprocess"))
    try:
        POINT.uninstall(parent)
        assert MODULE not in sys.modules and "preprocess" not in vars(parent)
        assert POINT.host_in_module(parent) == HostKind.LACKS
        with pytest.raises(ModuleNotFoundError, match=MODULE):
            importlib.import_module(MODULE)  # vLLM 0.29+ unpatched: what vllm-omni 0.24.0's import hits
        sys.modules.pop(MODULE, None)
        assert POINT.prepare(parent, StandInFacts(HostKind.LACKS, ())) is None
        assert POINT.install(parent, None, None) is True
        namespace = {}
        exec(f"from {MODULE} import InputPreprocessor", namespace)  # noqa: S102 - vllm-omni 0.24.0's statement
        assert namespace["InputPreprocessor"] is ip.InputPreprocessor
        assert importlib.import_module(MODULE) is ip.stand_in_module() is parent.preprocess
        assert importlib.util.find_spec(MODULE).name == MODULE
        assert POINT.host_in_module(parent) == HostKind.LACKS and POINT.is_installed(parent)
        assert POINT.install(parent, None, None) is False
    finally:
        POINT.uninstall(parent)
        if before[0] is not None:
            sys.modules[MODULE] = before[0]
        if before[1] is not None:
            parent.preprocess = before[1]
    assert (sys.modules.get(MODULE), vars(parent).get("preprocess")) == before


# ---- the host check ----

def test_host_without_any_preprocess(no_registration, tmp_path):
    assert POINT.host_in_module(_parent()) == HostKind.LACKS  # not a package: no submodule possible
    assert POINT.host_in_module(_parent(tmp_path)) == HostKind.LACKS  # a package folder without the file


def test_host_with_the_file_in_the_parent_s_folder(no_registration, tmp_path):
    (tmp_path / "preprocess.py").write_text("class InputPreprocessor: ...\n")
    assert POINT.host_in_module(_parent(tmp_path)) == HostKind.DEFINES
    assert MODULE not in sys.modules  # found without importing it
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert POINT.host_in_module(_parent(other)) == HostKind.LACKS


def test_host_with_registrations(monkeypatch, no_registration, tmp_path):
    ours = ip.stand_in_module()
    foreign = types.ModuleType(MODULE)
    other_entry = mark(types.ModuleType(MODULE), "routed_experts_lists")
    (tmp_path / "preprocess.py").write_text("")
    # ours in both places, or in one: ours (the file on the path is not looked at once something is registered)
    assert POINT.host_in_module(_parent(tmp_path, preprocess=ours)) == HostKind.LACKS
    monkeypatch.setitem(sys.modules, MODULE, ours)
    assert POINT.host_in_module(_parent(tmp_path, preprocess=ours)) == HostKind.LACKS
    assert POINT.host_in_module(_parent()) == HostKind.LACKS
    # anything else in either place: vLLM's (or someone's) module
    assert POINT.host_in_module(_parent(preprocess=foreign)) == HostKind.DEFINES
    assert POINT.host_in_module(_parent(preprocess=other_entry)) == HostKind.DEFINES
    monkeypatch.setitem(sys.modules, MODULE, foreign)
    assert POINT.host_in_module(_parent(preprocess=ours)) == HostKind.DEFINES
    assert POINT.host_in_module(_parent()) == HostKind.DEFINES


def test_prepare_refuses_what_is_not_ours_and_names_it(monkeypatch, no_registration, tmp_path):
    facts = StandInFacts(HostKind.LACKS, ("m:1 (module)",))
    assert POINT.prepare(_parent(), facts) is None
    foreign = types.ModuleType(MODULE)
    with pytest.raises(PatchRefusedError, match=r"vllm\.inputs\.preprocess exists \(<module 'vllm.inputs.preprocess'"):
        POINT.prepare(_parent(preprocess=foreign), facts)
    (tmp_path / "preprocess.py").write_text("")
    with pytest.raises(PatchRefusedError, match="a module file in the installed vLLM"):
        POINT.prepare(_parent(tmp_path), facts)
    monkeypatch.setitem(sys.modules, MODULE, foreign)
    with pytest.raises(PatchRefusedError, match="<module 'vllm.inputs.preprocess'"):
        POINT.prepare(_parent(), facts)
    assert sys.modules[MODULE] is foreign


def test_install_and_uninstall_both_registrations(monkeypatch, no_registration):
    ours = ip.stand_in_module()
    parent = _parent()
    assert POINT.install(parent, None, None) is True
    assert parent.preprocess is ours and sys.modules[MODULE] is ours
    assert POINT.install(parent, None, None) is False
    del sys.modules[MODULE]  # one of the two gone (a test, an import system reset): install puts it back
    assert POINT.install(parent, None, None) is True and sys.modules[MODULE] is ours
    del parent.preprocess
    assert POINT.install(parent, None, None) is True and parent.preprocess is ours
    assert POINT.uninstall(parent) is True
    assert "preprocess" not in vars(parent) and MODULE not in sys.modules
    assert POINT.uninstall(parent) is False
    # only the sys.modules entry is ours: still removed, and reported
    monkeypatch.setitem(sys.modules, MODULE, ours)
    assert POINT.uninstall(parent) is True and MODULE not in sys.modules
    # someone else's entry stays
    foreign = types.ModuleType(MODULE)
    monkeypatch.setitem(sys.modules, MODULE, foreign)
    parent.preprocess = foreign
    assert POINT.uninstall(parent) is False and sys.modules[MODULE] is foreign and parent.preprocess is foreign
    # another entry's module (marked, not this entry's) stays in both places
    other_entry = mark(types.ModuleType(MODULE), "routed_experts_lists")
    monkeypatch.setitem(sys.modules, MODULE, other_entry)
    parent.preprocess = other_entry
    assert POINT.uninstall(parent) is False and sys.modules[MODULE] is other_entry and parent.preprocess is other_entry
    monkeypatch.setitem(sys.modules, MODULE, foreign)
    parent.preprocess = foreign
    # installing beside someone else's sys.modules entry leaves it there
    del parent.preprocess
    POINT.install(parent, None, None)
    assert sys.modules[MODULE] is foreign and parent.preprocess is ours and is_ours(parent.preprocess, POINT.id)
    POINT.uninstall(parent)
    assert sys.modules[MODULE] is foreign


# ---- the class on a real renderer ----

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    pytest.importorskip("tokenizers")
    renderers = pytest.importorskip("vllm.renderers", reason="vLLM < 0.24 has no renderer (the stand-in's base)")
    if not hasattr(renderers, "renderer_from_config"):
        pytest.skip("this vLLM's renderers have no renderer_from_config")
    try:
        return cases.build(ip.InputPreprocessor, cases.write_model(tmp_path_factory.mktemp("layer") / "model"))
    except TypeError as exc:  # the stand-in's own renderer check: a vLLM <= 0.28 renderer (it keeps its own class)
        if "delegates to vLLM's renderer" not in str(exc):
            raise
        pytest.skip(f"this vLLM's renderer is not the 0.29+ one the stand-in is built on: {exc}")
    except AttributeError as exc:  # vLLM <= 0.16's renderer_from_config reads a config field later vLLMs dropped
        if "'VllmConfig' object has no attribute" not in str(exc):
            raise
        pytest.skip(f"this vLLM's renderer_from_config predates the config the stand-in is built on: {exc}")


@needs_vllm
def test_the_defaults_are_vllm_s_renderer_and_registry(built):
    from vllm.multimodal import MULTIMODAL_REGISTRY
    from vllm.renderers import renderer_from_config

    assert built.mm_registry is MULTIMODAL_REGISTRY
    vllm_config = built.renderer.config if hasattr(built.renderer, "config") else None
    if vllm_config is None:
        pytest.skip("this vLLM's renderer does not keep its config")
    again = ip.InputPreprocessor(vllm_config)
    assert type(again.renderer) is type(renderer_from_config(vllm_config))
    assert again.model_config is vllm_config.model_config and again.mm_registry is MULTIMODAL_REGISTRY


@needs_vllm
def test_a_renderer_without_the_api_is_refused_naming_what_lacks(built):
    class Partial:
        default_cmpl_tok_params = None

        def _process_embeds(self, content):
            return content

    config = types.SimpleNamespace(model_config=built.model_config)
    with pytest.raises(TypeError) as raised:
        ip.InputPreprocessor(config, renderer=Partial(), mm_registry=object())
    message = str(raised.value)
    assert "lacks _tokenize_singleton_prompt, _process_multimodal, _process_singleton (" in message, message
    assert "Partial" in message and f"VLLM_COMPAT_DISABLE_PATCHES={POINT.id}" in message
    registry = object()
    whole = ip.InputPreprocessor(config, renderer=built.renderer, mm_registry=registry)
    assert whole.mm_registry is registry and whole.renderer is built.renderer and whole.model_config is built.model_config


@needs_vllm
def test_multimodal_gets_the_renderer_s_token_ids_of_a_text_prompt(built, monkeypatch):
    calls = []

    def record(prompt, mm_data, **kwargs):
        calls.append((prompt, mm_data, kwargs))
        return "processed"

    monkeypatch.setattr(built.renderer, "_process_multimodal", record)
    data, uuids, options = {"image": "an image"}, {"image": ["u1"]}, {"size": 3}
    assert built._process_multimodal("a red cat", data, options, None, mm_uuids=uuids) == "processed"
    assert built._process_multimodal([5, 11, 6], data) == "processed"
    assert built._process_multimodal("the cat sat on the mat", data, None, {"truncate_prompt_tokens": 2}) == "processed"
    # the ids vLLM 0.28's own _tokenize_prompt gave for the same text and kwargs (preprocess_cases' oracle)
    assert calls[0] == (ORACLE["tokenize"], data, {"mm_uuids": uuids, "mm_processor_kwargs": options})
    assert calls[1] == ([5, 11, 6], data, {"mm_uuids": None, "mm_processor_kwargs": None})
    assert calls[2][0] == ORACLE["tokenize_truncated"], calls[2]


@needs_vllm
def test_embeds_go_to_the_renderer(built, monkeypatch):
    seen = []
    monkeypatch.setattr(built.renderer, "_process_embeds", lambda content: seen.append(content) or "embedded")
    content = {"prompt_embeds": "tensor"}
    assert built._process_embeds(content) == "embedded" and seen == [content]


@needs_vllm
def test_preprocess_goes_through_the_subclass_s_prompt_to_llm_inputs(built):
    seen = []

    class Subclass(ip.InputPreprocessor):
        def _prompt_to_llm_inputs(self, prompt, tokenization_kwargs=None):
            seen.append((prompt, tokenization_kwargs))
            return super()._prompt_to_llm_inputs(prompt, tokenization_kwargs=tokenization_kwargs)

    sub = Subclass(types.SimpleNamespace(model_config=built.model_config), renderer=built.renderer)
    out = sub.preprocess("red cat", tokenization_kwargs={"add_special_tokens": False})
    assert list(out["prompt_token_ids"]) == ORACLE["text_no_special"]["prompt_token_ids"]
    assert len(seen) == 1 and seen[0][1] == {"add_special_tokens": False}
    assert seen[0][0]["prompt"] == "red cat"  # parsed into vLLM's prompt dict before the override sees it


@needs_vllm
def test_encoder_decoder_prompts_are_refused(built):
    model_config = types.SimpleNamespace(is_encoder_decoder=True)
    encdec = ip.InputPreprocessor(types.SimpleNamespace(model_config=model_config), renderer=built.renderer)
    with pytest.raises(NotImplementedError, match="decoder-only"):
        encdec.preprocess("hello world")
