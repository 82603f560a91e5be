"""The ``vllm.inputs.preprocess`` stand-in fed real prompts: text and token prompts through a real renderer and a
real (tiny, offline) tokenizer give what vLLM 0.28's own ``InputPreprocessor`` gives for the same prompts.

The oracle is ``input_preprocessor.vllm-0.28.0.json``, recorded from vLLM 0.28.0's class in the v0.28-omni0.24 cell
(``python -m tests.bridges.preprocess_cases OUT.json``); on a vLLM that still has the module, its own class is held
to the same file, so the file stays what vLLM gives. Multimodal prompts are not covered here: a multimodal processor
needs a model's processor files, which no package ships (the stand-in's multimodal path is the renderer's
``_process_multimodal`` on token ids).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json

import pytest

from conftest import needs_vllm
from tests.bridges import preprocess_cases as cases

ORACLE = json.loads(cases.ORACLE.read_text())


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    pytest.importorskip("tokenizers")
    return cases.write_model(tmp_path_factory.mktemp("preprocess") / "model")


def _own_or_stand_in():
    """vLLM's own class where the installed vLLM has the module (<= 0.28), else vllm_compat's stand-in."""
    import vllm.inputs

    path = getattr(vllm.inputs, "__path__", None)
    if path is not None and importlib.machinery.PathFinder.find_spec("vllm.inputs.preprocess", path) is not None:
        return importlib.import_module("vllm.inputs.preprocess").InputPreprocessor
    from vllm_compat.bridges.input_preprocessor import InputPreprocessor

    return InputPreprocessor


@needs_vllm
@pytest.mark.parametrize("case", [c[0] for c in cases.PREPROCESS_CASES + cases.HELPER_CASES])
def test_prompt_gives_what_vllm_0_28_gives(model_folder, case, _results):
    assert _results[case] == ORACLE["cases"][case], case


def _skip_unless_the_oracles_renderer():
    """The oracle's vLLM 0.28 builds its renderer with ``renderer_from_config(config: VllmConfig)``; vLLM 0.16's
    takes a model config (no ``.model_config``), so the oracle's build does not apply there."""
    import inspect

    renderers = pytest.importorskip("vllm.renderers", reason="vLLM < 0.24 has no renderer (the oracle's shape)")
    if not hasattr(renderers, "renderer_from_config"):
        pytest.skip("this vLLM's renderers have no renderer_from_config (the oracle's vLLM 0.28 builds with it)")
    parameter = next(iter(inspect.signature(renderers.renderer_from_config).parameters.values()))
    if "VllmConfig" not in str(parameter.annotation):
        pytest.skip(f"this vLLM's renderer_from_config takes {parameter.annotation}, not the oracle's VllmConfig")


@pytest.fixture(scope="module")
def _results(model_folder):
    _skip_unless_the_oracles_renderer()
    return cases.run_cases(cases.build(_own_or_stand_in(), model_folder))


@needs_vllm
def test_vllm_omni_subclass_on_the_stand_in_tokenizes_text_as_vllm_0_28(model_folder):
    """vllm-omni 0.24.0's ``OmniInputPreprocessor`` overrides ``_process_text`` and calls the base's
    ``_tokenize_prompt``: on the stand-in a text prompt gets the ids vLLM 0.28's class gives."""
    try:
        from vllm_omni.inputs.preprocess import OmniInputPreprocessor
    except Exception as exc:  # noqa: BLE001 - vllm-omni absent, not importable here, or a release without it
        pytest.skip(f"vllm_omni.inputs.preprocess does not import here: {type(exc).__name__}: {exc}")
    _skip_unless_the_oracles_renderer()
    preprocessor = cases.build(OmniInputPreprocessor, model_folder)
    for name in ("text", "text_truncated", "text_no_special", "text_unknown_word"):
        prompt, kwargs = next((p, k) for n, p, k in cases.PREPROCESS_CASES if n == name)
        got = preprocessor.preprocess(prompt, tokenization_kwargs=kwargs)
        assert list(got["prompt_token_ids"]) == ORACLE["cases"][name]["prompt_token_ids"], name
