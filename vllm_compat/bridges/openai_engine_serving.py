"""Alias for the module ``vllm.entrypoints.openai.engine.serving`` (``OpenAIServing``, ``clamp_prompt_logprobs``), gone in vLLM 0.25.

Why: vLLM 0.25 moved the generation servings' base class out of ``vllm/entrypoints/openai/engine/serving.py`` into
``vllm/entrypoints/generate/base/serving.py`` and renamed it ``GenerateBaseServing`` (0.25-0.27: the body unchanged),
and moved ``clamp_prompt_logprobs`` beside it unchanged (to 0.34). vllm-omni 0.24.0's server subclasses
``OpenAIServing`` (``serving_speech``, ``serving_audio_generate``) and imports ``clamp_prompt_logprobs``
(``serving_chat``), so ``import vllm_omni.entrypoints.openai.api_server`` (``vllm serve --omni``) dies with
ModuleNotFoundError on 0.25+. The alias table cannot say it: the class changed its name while its module went away.
When: ``vllm.entrypoints.openai.engine`` is imported without a ``serving`` submodule, an installed vllm-omni imports
it (read from its files), and vLLM's ``generate.base.serving`` holds both definitions with 0.24's source or one of
the reviewed later sources (``KEYS``): then a module object holding vLLM's own two objects is registered under the
old path. vLLM 0.29+ has no ``openai.engine`` package at all: there the bridge acts on the package ``moved_names``
provides for vllm-omni's ``openai.engine.protocol`` import (the static facts count the parent as present where its
decision provides a path below it), never creating the package itself. Anywhere else (a vLLM that has the module,
an unreviewed definition) it stays out, saying why.
Serves: vllm-omni 0.24.0 on vLLM 0.25-0.34 (measured on 0.25.1, 0.30.0 and 0.33.0 in the pinned-torch serve cells).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.entrypoints.openai.engine.serving``.

What vllm-omni 0.24.0 relies on, read from its files: the constructor ``(engine_client, models, *, request_logger,
return_tokens_as_token_ids=False)`` (``OmniOpenAIServingAudioGenerate``, built by ``init_app_state`` for a pure
diffusion server too; ``OmniOpenAIServingSpeech.for_diffusion`` bypasses it) and the inherited ``engine_client``,
``model_config``, ``_check_model`` and ``create_error_response``. vLLM 0.28-0.34's ``GenerateBaseServing`` keeps that
constructor's source and all four (from ``BaseServing``), and every other method of 0.24's class: 0.28 adds
``_get_session_id_from_headers`` / ``_get_session_id`` / ``_get_priority``, 0.29 ``_preflight`` (no vllm-omni 0.24.0
subclass defines a method of those names); 0.32 moves ``_get_trace_headers`` to ``BaseServing`` (still inherited;
it no longer asks the engine whether tracing is on); 0.33 hands the exception itself to
``create_streaming_error_response`` (which takes ``str | Exception`` since 0.24); 0.34 drops the ``request_id_prefix``
class annotation (never read by vllm-omni). So vLLM's own class is served, not an adapter around it: what vLLM
changed in ``BaseServing`` (``_check_model`` logging request bodies, the "Valid aliases" text) is what vLLM's own
servings do on that release.
"""

from __future__ import annotations

from . import HostKind
from ._reviewed_module_alias import SAME, ReviewedModuleAlias

OLD_MODULE = "vllm.entrypoints.openai.engine.serving"
NEW_MODULE = "vllm.entrypoints.generate.base.serving"
PARENT = "vllm.entrypoints.openai.engine"  # the catalogue row's target module; gone from vLLM's files on 0.29+
MOVED = {"OpenAIServing": "GenerateBaseServing", "clamp_prompt_logprobs": "clamp_prompt_logprobs"}
# Definition keys (normalized source under the old name, detect.definitions), re-derived from each vLLM wheel.
KEYS = {
    "OpenAIServing": {
        "d642c3b9606e16c4": SAME,  # vLLM 0.24's OpenAIServing; 0.25-0.27's GenerateBaseServing
        "c896d94b2536cf1e": "0.28: adds _get_session_id_from_headers, _get_session_id, _get_priority",
        "f770345777901282": "0.29-0.31: adds _preflight",
        "78eb8c267df380fd": "0.32: _get_trace_headers moved to BaseServing",
        "1a2886b79967aed4": "0.33: _convert_generation_error_to_streaming_response passes the exception",
        "6fd3e46d748db567": "0.34: no request_id_prefix class annotation",
    },
    "clamp_prompt_logprobs": {"7cc1571c314ddd19": SAME},  # vLLM 0.24-0.34
}
IMPORTERS = ("vllm_omni/entrypoints/openai/serving_speech.py", "vllm_omni/entrypoints/openai/serving_audio_generate.py",
             "vllm_omni/entrypoints/openai/serving_chat.py")


def parent_provided_by_aliases(site) -> bool:
    """Whether ``moved_names``' static decision makes a module below ``PARENT`` importable (its parent package with
    it) in this site: the package the bridge then acts on."""
    from .moved_names import DRIFT_POINT as aliases

    try:
        facts = aliases.detect_static(site)
    except Exception:  # noqa: BLE001 - no alias facts: no parent either
        return False
    return any(fact.old.startswith(PARENT + ".") for fact in getattr(facts, "installable", ()))


class OpenAIEngineServingAlias(ReviewedModuleAlias):
    importers = IMPORTERS
    removed_in = "0.25"
    old_module = OLD_MODULE
    new_module = NEW_MODULE
    moved_names = MOVED
    keys = KEYS

    def host_from_files(self, site, facts) -> str:
        """vLLM 0.29+'s files have no ``PARENT``: the host lacks the module where ``moved_names`` provides the
        package (the runtime hook then sees that package without ``serving``), and has no module otherwise."""
        if facts.host == HostKind.NO_MODULE and parent_provided_by_aliases(site):
            return HostKind.LACKS
        return facts.host


DRIFT_POINT = OpenAIEngineServingAlias()


def facts_for_table(host: str, importers: tuple[str, ...], changed: bool = False):
    """Facts for a decision-table row (tests): every definition the old one, or an unreviewed change."""
    return DRIFT_POINT.facts_for_table(host, importers, "changed (0000000000000000)" if changed else "same")
