"""Adapter for the module ``vllm.entrypoints.serve.disagg.serving`` (``ServingTokens``), moved and changed in vLLM 0.25.

Why: vLLM 0.25 moved the tokens-in / tokens-out serving of ``/inference/v1/generate`` to
``vllm.entrypoints.scale_out.token_in_token_out.serving.ServingTokens`` (base ``GenerateBaseServing``) and changed its
call: the third parameter is an ``OnlineRenderer`` where vllm-omni 0.24.0 passes its ``OpenAIServingRender`` (gone
since 0.25), 0.33 adds a required ``online_derenderer=``, and from 0.28 ``serve_tokens`` calls
``engine_client.generate(..., session_id=)``, which vllm-omni 0.24.0's ``AsyncOmni.generate`` does not take (a
``TypeError`` on every request). vllm-omni 0.24.0's ``vllm_omni/entrypoints/openai/api_server.py`` imports the old
module at module level, so ``vllm serve --omni`` dies at import (``No module named 'vllm.entrypoints.serve.disagg'``)
on 0.25+; its ``omni_init_app_state`` builds ``ServingTokens(engine_client, models, openai_serving_render,
request_logger=, return_tokens_as_token_ids=, enable_prompt_tokens_details=, enable_log_outputs=,
force_no_detokenize=)`` for every server with an LLM stage whose engine supports "generate" (never for a
pure-diffusion one), and vLLM's own router calls its ``serve_tokens`` for ``POST /inference/v1/generate``.
When: ``vllm.entrypoints.serve`` is imported without a ``disagg`` subpackage and an installed vllm-omni imports the
module (read from its files): the package and module are registered with a ``ServingTokens`` that is a subclass of
vLLM's new one taking the old call. Its renderer is the third argument where that is vLLM's ``OnlineRenderer``,
otherwise vLLM's ``OnlineRenderer`` (and, where the new class takes one, ``OnlineDerenderer``) built on the model
config and renderer of that argument or of the engine client, as vLLM's server builds them, without chat template,
tool or reasoning parser (tokens in / tokens out uses none). Where the engine client's ``generate`` (its live
signature) takes neither a keyword vLLM's ``serve_tokens`` passes and vLLM 0.24's did not (``session_id``,
``reasoning_ended``, ``reasoning_parser_kwargs``) nor ``**kwargs``, that keyword is dropped, as vLLM 0.24 never
passed it. Where vLLM's new ``__init__`` is not the measured shape (read from its file), ``ServingTokens`` is a class
whose construction raises ``RemovedByVLLMError`` naming that (the import, and the pure-diffusion server, still work).
A vLLM with the module keeps it.
Serves: vllm-omni 0.24.0 on vLLM 0.25-0.34 (the class; measured against vLLM 0.24's on CPU).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.entrypoints.serve.disagg.serving``.

What the client sees differs from vLLM 0.24 only where 0.24 was broken or had nothing: 0.24's non-streaming response
passed ``id=request_id`` to a ``GenerateResponse`` whose field is ``request_id`` (pydantic ignored it, so the
response carried a fresh random ``request_id``, and its ``model`` / ``created`` / ``usage`` were dropped as well);
vLLM's new class returns the request's own id and those fields. Every field 0.24 returned keeps its name and value
(``tests/bridges/test_serve_disagg_serving.py`` compares with vLLM 0.24's class). A session header is ignored, as
on 0.24. Not restored: what vLLM itself changed in the route's output for every client, its own too: from 0.32 the
logprobs are ``{"token_id", "logprob", "rank", "top_logprobs"}`` (0.24: ``{"token": "token_id:N", "logprob",
"bytes"}``, a stream's top entries cut at ``max(logprobs, 1)``), an unknown model's error message names the valid
ones, and the response class is ``GenerateTokensResponse`` (the same JSON); read from the wheels, measured on 0.33 / 0.34.
"""

from __future__ import annotations

import functools

from ._module_stand_in import ModuleAdapter, adapter_facts, init_fits, removed_class
from ._module_stand_in import init_shape as module_init_shape

OLD_MODULE = "vllm.entrypoints.serve.disagg.serving"
NEW_MODULE = "vllm.entrypoints.scale_out.token_in_token_out.serving"
NEW_FILE = "vllm/entrypoints/scale_out/token_in_token_out/serving.py"
IMPORTERS = ("vllm_omni/entrypoints/openai/api_server.py",)
# vLLM 0.24's ServingTokens.__init__, the call vllm-omni 0.24.0 makes: three positional, these keywords.
OLD_KEYWORDS = ("request_logger", "force_no_detokenize", "return_tokens_as_token_ids", "enable_prompt_tokens_details",
                "enable_log_outputs")
NEW_POSITIONAL = ("self", "engine_client", "models", "online_renderer")  # vLLM 0.25-0.34
BUILT_KEYWORDS = ("online_derenderer",)  # required keywords of the new __init__ the adapter builds (0.33+)
# Keywords vLLM's serve_tokens passes to engine_client.generate that vLLM 0.24's did not: session_id (0.28),
# reasoning_ended / reasoning_parser_kwargs (0.32). Dropped where the engine client's generate does not take them.
NEW_GENERATE_KEYWORDS = ("session_id", "reasoning_ended", "reasoning_parser_kwargs")
MESSAGE = ("/inference/v1/generate with an LLM stage cannot be served by this vLLM's ServingTokens (vLLM 0.25 moved "
           "vLLM 0.24's ServingTokens(engine_client, models, openai_serving_render, ...) to " + NEW_MODULE +
           " and changed it; vllm_compat adapts the measured shapes of vLLM 0.25-0.34 only). Use vLLM 0.24 for it, or "
           "a vllm-omni built for this vLLM")


def init_shape(source: str | None) -> tuple[str, str]:
    """(``Shape``, detail) of ``ServingTokens.__init__`` in vLLM's new file (``source``, or None where it is missing):
    known where it takes ``(self, engine_client, models, online_renderer, *, ...)`` with every keyword of the old call,
    and any other keyword without a default is one the adapter builds (``BUILT_KEYWORDS``)."""
    return module_init_shape(source, NEW_FILE, "ServingTokens", NEW_POSITIONAL, OLD_KEYWORDS, BUILT_KEYWORDS)


def keywords_not_taken(generate) -> tuple[str, ...]:
    """The ``NEW_GENERATE_KEYWORDS`` that ``generate`` (a live callable) does not take; none where it takes
    ``**kwargs`` or has no signature to read."""
    import inspect

    try:
        params = inspect.signature(generate).parameters
    except (TypeError, ValueError):
        return ()
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return ()
    return tuple(name for name in NEW_GENERATE_KEYWORDS if name not in params)


class GenerateKeywordsDropped:
    """An engine client whose ``generate`` drops the keywords in ``dropped`` (ones it does not take); everything
    else, reads and writes, is the wrapped client's (``__wrapped__``)."""

    def __init__(self, engine_client, dropped: tuple[str, ...]) -> None:
        object.__setattr__(self, "__wrapped__", engine_client)
        object.__setattr__(self, "_dropped", dropped)

    def __getattr__(self, name: str):
        return getattr(self.__wrapped__, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self.__wrapped__, name, value)

    def generate(self, *args, **kwargs):
        for name in self._dropped:
            kwargs.pop(name, None)
        return self.__wrapped__.generate(*args, **kwargs)


def online_renderer_for(cls, render, engine_client, request_logger):
    """vLLM's ``cls`` (``OnlineRenderer`` / ``OnlineDerenderer``) for the old call's third argument ``render``:
    ``render`` itself where it is one; otherwise a new one on the model config and renderer of ``render`` (vLLM 0.24's
    ``OpenAIServingRender`` has both) or else of the engine client, with the request logger and no chat template."""
    if isinstance(render, cls):
        return render
    model_config = getattr(render, "model_config", None) or engine_client.model_config
    renderer = getattr(render, "renderer", None) or engine_client.renderer
    return cls(model_config, renderer, request_logger=request_logger, chat_template=None,
               chat_template_content_format="auto")


@functools.cache
def serving_tokens_class() -> type:
    """The adapter class (made when vllm-omni first reads ``ServingTokens``: vLLM's serving modules are still
    importing each other when the hook registers the module): vLLM's new ``ServingTokens`` taking vLLM 0.24's call,
    or, where the imported class is not the measured shape, a class whose construction raises."""
    import importlib
    import inspect

    base = importlib.import_module(NEW_MODULE).ServingTokens
    params = inspect.signature(base.__init__).parameters
    if not init_fits(base, NEW_POSITIONAL, OLD_KEYWORDS, BUILT_KEYWORDS):
        return removed_class("ServingTokens", OLD_MODULE, DRIFT_POINT.removed_message(
            "ServingTokens", f"{MESSAGE} (found ServingTokens.__init__{inspect.signature(base.__init__)})"))
    from vllm.renderers.online_renderer import OnlineRenderer

    takes_derenderer = "online_derenderer" in params

    class ServingTokens(base):
        """vLLM 0.24's ``ServingTokens(engine_client, models, openai_serving_render, *, request_logger, ...)`` on
        vLLM's new class (vllm_compat's adapter, ``vllm_compat.bridges.serve_disagg_serving``)."""

        def __init__(self, engine_client, models, openai_serving_render, *, request_logger,
                     force_no_detokenize: bool = False, return_tokens_as_token_ids: bool = False,
                     enable_prompt_tokens_details: bool = False, enable_log_outputs: bool = False):
            extra = {}
            if takes_derenderer:
                from vllm.renderers.online_derenderer import OnlineDerenderer

                extra["online_derenderer"] = online_renderer_for(OnlineDerenderer, openai_serving_render,
                                                                 engine_client, request_logger)
            super().__init__(engine_client, models,
                             online_renderer_for(OnlineRenderer, openai_serving_render, engine_client,
                                                 request_logger),
                             request_logger=request_logger, force_no_detokenize=force_no_detokenize,
                             return_tokens_as_token_ids=return_tokens_as_token_ids,
                             enable_prompt_tokens_details=enable_prompt_tokens_details,
                             enable_log_outputs=enable_log_outputs, **extra)
            self.openai_serving_render = openai_serving_render  # vLLM 0.24's attribute
            dropped = keywords_not_taken(engine_client.generate)
            if dropped:
                self.engine_client = GenerateKeywordsDropped(engine_client, dropped)

    ServingTokens.__module__, ServingTokens.__qualname__ = OLD_MODULE, "ServingTokens"
    return ServingTokens


def __getattr__(name: str):
    """``ServingTokens`` (PEP 562), read by the stand-in module's lazy member; nothing else."""
    if name == "ServingTokens":
        return serving_tokens_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ServeDisaggServingAdapter(ModuleAdapter):
    importers = IMPORTERS
    removed_in = "0.25"
    old_module = OLD_MODULE
    adapted = "ServingTokens"
    # the class vllm-omni builds is the adapter, which supplies what vLLM's new __init__ requires (0.33+)
    handles_drift = (("call", "*.ServingTokens.__init__", "*.omni_init_app_state", "online_derenderer"),)
    new_module, new_file, message = NEW_MODULE, NEW_FILE, MESSAGE

    def shape(self, source: str | None) -> tuple[str, str]:
        return init_shape(source)


DRIFT_POINT = ServeDisaggServingAdapter()
facts_for_table = adapter_facts
