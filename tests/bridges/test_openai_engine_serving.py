"""The ``openai_engine_serving`` bridge on the real wheels (the shared checks: ``serve_stand_in_cases``)."""

from __future__ import annotations

import pytest

from tests.bridges.serve_stand_in_cases import cases
from vllm_compat.bridges import openai_engine_serving as bridge

CASES = cases(bridge)
globals().update(CASES)
STATIC = CASES["STATIC"]
needs_missing = CASES["needs_missing"]


def test_refused_where_the_new_definitions_changed():
    """vLLM 0.30+ edited GenerateBaseServing (other keys): no alias, a refusal naming what changed."""
    from vllm_compat.bridges import HostKind
    from vllm_compat.config import Controls
    from vllm_compat.decide import Action

    facts = bridge.facts_for_table(HostKind.LACKS, ("vllm_omni.entrypoints.openai.serving_speech:29 (module)",),
                                   changed=True)
    decision = bridge.DRIFT_POINT.decide(facts, Controls())
    assert decision.action == Action.REFUSED and "OpenAIServing: changed" in decision.reason


def test_definition_keys_on_this_vllm():
    """Where the bridge can act, the new module holds 0.24's two definitions or a reviewed later source (the keys
    re-derived from each wheel: KEYS); on vLLM 0.25.1 the very same."""
    from vllm_compat.bridges import HostKind

    if STATIC.host != HostKind.LACKS:
        pytest.skip(f"vLLM {STATIC.host} {bridge.OLD_MODULE}")
    states = dict(STATIC.definitions)
    assert set(states) == set(bridge.MOVED)
    assert states["clamp_prompt_logprobs"] == "same"
    assert states["OpenAIServing"].split(" ")[0] in ("same", "accepted"), states
    from conftest import VLLM_VERSION

    if VLLM_VERSION == "0.25.1":
        assert states == {name: "same" for name in bridge.MOVED}


def test_the_surface_vllm_omni_uses_is_vllm_s_own_on_this_release():
    """What vllm-omni 0.24.0's OpenAIServing subclasses call on the base (read from its files: the constructor,
    engine_client, model_config, _check_model, create_error_response) is there on vLLM's class with the old
    constructor's parameters, and none of vLLM's later methods is one a subclass defines."""
    import importlib
    import inspect

    try:
        new = getattr(importlib.import_module(bridge.NEW_MODULE), bridge.MOVED["OpenAIServing"])
    except ImportError as exc:
        pytest.skip(f"no {bridge.NEW_MODULE} here ({exc})")
    params = list(inspect.signature(new.__init__).parameters.values())
    assert [(p.name, p.kind.name) for p in params] == [
        ("self", "POSITIONAL_OR_KEYWORD"), ("engine_client", "POSITIONAL_OR_KEYWORD"),
        ("models", "POSITIONAL_OR_KEYWORD"), ("request_logger", "KEYWORD_ONLY"),
        ("return_tokens_as_token_ids", "KEYWORD_ONLY")]
    assert all(callable(getattr(new, name, None)) for name in ("_check_model", "create_error_response"))
    try:
        from vllm_omni.entrypoints.openai.serving_audio_generate import OmniOpenAIServingAudioGenerate  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - the rest of the server chain may stop it here
        pytest.skip(f"vllm-omni's serving_audio_generate does not import here: {type(exc).__name__}: {exc}"[:300])
    from vllm_omni.entrypoints.openai.serving_speech import OmniOpenAIServingSpeech

    for cls in (OmniOpenAIServingAudioGenerate, OmniOpenAIServingSpeech):
        assert new in cls.__mro__
        own = set(vars(cls))
        later = {n for n in vars(new) if n.startswith("_get_") or n == "_preflight"}
        assert not own & later, (cls, own & later)
