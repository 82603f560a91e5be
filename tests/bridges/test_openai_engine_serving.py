"""The ``openai_engine_serving`` bridge on the real wheels (the shared checks: ``serve_stand_in_cases``)."""

from __future__ import annotations

import json

import pytest

from conftest import needs_startup_hook, run_python
from tests.bridges.serve_stand_in_cases import SERVER, cases
from vllm_compat.bridges import openai_engine_serving as bridge

CASES = cases(bridge)
globals().update(CASES)
STATIC = CASES["STATIC"]
needs_missing = CASES["needs_missing"]
POINT = bridge.DRIFT_POINT


@needs_missing
@needs_startup_hook
def test_server_imports_with_the_bridge_and_revert_removes_exactly_it():
    """The shared check, where the parent package may be moved_names' (vLLM 0.29+): revert() takes ``serving`` off it
    (this row comes first) and moved_names takes the package itself out, so the old path then fails on the first
    module missing; after apply() the next import of the old path runs the hooks again and it is back."""
    result = run_python(f"""
        import json, sys
        import {SERVER}
        import vllm_compat
        parent = sys.modules["{POINT.target_module}"]
        chain = {POINT.chain()!r}
        out = dict(marks=[getattr(sys.modules[n], "_vllm_compat_installed", None) for n in chain],
                   attribute=getattr(parent, "{POINT.target}") is sys.modules[chain[0]],
                   decision=[d.action for d in vllm_compat.current_decisions() if d.name == "{POINT.id}"])
        modules = set(sys.modules)
        vllm_compat.revert()
        out["serving_left_on_parent"] = "{POINT.target}" in vars(parent)
        out["modules_removed"] = sorted(modules - set(sys.modules))
        try:
            import {POINT.old_module}
        except ImportError as exc:
            out["after_revert"] = str(exc)
        vllm_compat.apply()
        import {POINT.old_module} as again
        out["back"] = all(n in sys.modules for n in chain) and again.OpenAIServing.__name__
        print("RESULT", json.dumps(out))
        """, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert out["marks"] == [POINT.id] * len(POINT.chain()) and out["attribute"] and out["decision"] == ["patched"]
    assert not out["serving_left_on_parent"] and set(POINT.chain()) <= set(out["modules_removed"])
    assert out["after_revert"] in (f"No module named '{POINT.first_missing}'",
                                   f"No module named '{POINT.target_module}'"), out["after_revert"]
    assert out["back"] == bridge.MOVED["OpenAIServing"]


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
