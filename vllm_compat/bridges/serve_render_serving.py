"""Adapter for the module ``vllm.entrypoints.serve.render.serving`` (``OpenAIServingRender``), removed in vLLM 0.25.

Why: vLLM 0.25 split vLLM 0.24's ``OpenAIServingRender`` (one class rendering chat / completion requests for every
serving) into ``vllm.renderers.online_renderer.OnlineRenderer`` / ``OnlineDerenderer``. vllm-omni 0.24.0's
``vllm_omni/entrypoints/openai/api_server.py`` imports the class at module level, so ``vllm serve --omni`` dies at
import (``No module named 'vllm.entrypoints.serve.render'``) on 0.25+, for every model. Its LLM-stage branch
(``omni_init_app_state`` past the pure-diffusion return) builds ``OpenAIServingRender(model_config, renderer,
model_registry, *, request_logger=, chat_template=, ...)`` and hands it to vLLM's servings (their keyword is
``online_renderer=`` since 0.25: ``openai_serving_render_keyword``); vllm-omni's chat serving calls its
``validate_chat_template`` and ``_make_request_with_harmony``, which ``OnlineRenderer`` has with the same parameters.
When: ``vllm.entrypoints.serve`` is imported without a ``render`` subpackage and an installed vllm-omni imports the
module (read from its files): the package and module are registered with an ``OpenAIServingRender`` that is a
subclass of vLLM's ``OnlineRenderer`` taking the old call (``model_registry`` kept as the attribute 0.24 had). Where
``OnlineRenderer.__init__`` is not the measured shape (read from its file), ``OpenAIServingRender`` is a class whose
construction raises ``RemovedByVLLMError`` naming that: the import, and the pure-diffusion server, still work, and the
verdict says what that leaves out. A vLLM with the module keeps it.
Serves: vllm-omni 0.24.0 on vLLM 0.25-0.34 (``OnlineRenderer`` read from the 0.25.1, 0.31 and 0.34 wheels; on an
H200 with vLLM 0.25.1, a one-AR-stage server answers chat and completion requests as the native pair does, with
``openai_serving_render_keyword`` and ``ar_scheduler_v1_runner``: ``gpu/results.md``, "LLM stage").
Retire when: the oldest supported vllm-omni no longer imports ``vllm.entrypoints.serve.render.serving``.

Not restored: 0.24's ``render_chat_request`` / ``render_completion_request`` / ``derender_*`` (the ``/v1/*/render``
routes; vLLM 0.25 serves them from ``vllm.entrypoints.scale_out``); vllm-omni 0.24.0 calls none of them.
"""

from __future__ import annotations

import functools

from ._module_stand_in import ModuleAdapter, adapter_facts, init_fits, init_shape, removed_class

OLD_MODULE = "vllm.entrypoints.serve.render.serving"
NEW_MODULE = "vllm.renderers.online_renderer"
NEW_FILE = "vllm/renderers/online_renderer.py"
IMPORTERS = ("vllm_omni/entrypoints/openai/api_server.py",)
# vLLM 0.24's OpenAIServingRender.__init__: (model_config, renderer, model_registry, *, these keywords).
OLD_KEYWORDS = ("request_logger", "chat_template", "chat_template_content_format", "trust_request_chat_template",
                "enable_auto_tools", "exclude_tools_when_tool_choice_none", "tool_parser", "reasoning_parser",
                "default_chat_template_kwargs", "log_error_stack")
NEW_POSITIONAL = ("self", "model_config", "renderer")  # OnlineRenderer, vLLM 0.25-0.34
MESSAGE = ("pure-diffusion servers start, an LLM stage does not (vLLM 0.25 replaced vLLM 0.24's OpenAIServingRender by "
           f"{NEW_MODULE}.OnlineRenderer, and this vLLM's is not the shape vllm_compat adapts). Serve this model with "
           "vLLM 0.24 (vllm-omni 0.24.0's own), or with a vllm-omni built for this vLLM.")
LEAVES_OUT = ("a server whose model has an LLM stage (vllm-omni's multi-stage pipelines, e.g. Qwen2.5-Omni) stops at "
              "startup; pure-diffusion models serve")


def renderer_shape(source: str | None) -> tuple[str, str]:
    """(``Shape``, detail) of vLLM's ``OnlineRenderer.__init__`` (``source``: its file, or None)."""
    return init_shape(source, NEW_FILE, "OnlineRenderer", NEW_POSITIONAL, OLD_KEYWORDS)


@functools.cache
def serving_render_class() -> type:
    """The adapter class (made when vllm-omni first reads it: vLLM's serving modules are still importing each other
    when the hook registers the module): vLLM's ``OnlineRenderer`` taking vLLM 0.24's call, or, where the imported
    class is not the measured shape, a class whose construction raises."""
    import importlib

    base = importlib.import_module(NEW_MODULE).OnlineRenderer
    if not init_fits(base, NEW_POSITIONAL, OLD_KEYWORDS):
        import inspect

        return removed_class("OpenAIServingRender", OLD_MODULE, DRIFT_POINT.removed_message(
            "OpenAIServingRender", f"{MESSAGE} (found OnlineRenderer.__init__{inspect.signature(base.__init__)})"))

    class OpenAIServingRender(base):
        """vLLM 0.24's ``OpenAIServingRender(model_config, renderer, model_registry, *, ...)`` on vLLM's
        ``OnlineRenderer`` (vllm_compat's adapter, ``vllm_compat.bridges.serve_render_serving``)."""

        def __init__(self, model_config, renderer, model_registry, **keywords):
            super().__init__(model_config, renderer, **keywords)
            self.model_registry = model_registry  # vLLM 0.24's attribute

    OpenAIServingRender.__module__, OpenAIServingRender.__qualname__ = OLD_MODULE, "OpenAIServingRender"
    return OpenAIServingRender


def __getattr__(name: str):
    """``OpenAIServingRender`` (PEP 562), read by the stand-in module's lazy member; nothing else."""
    if name == "OpenAIServingRender":
        return serving_render_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class ServeRenderServingAdapter(ModuleAdapter):
    importers = IMPORTERS
    removed_in = "0.25"
    old_module = OLD_MODULE
    adapted = "OpenAIServingRender"
    new_module, new_file, message, leaves_out_unknown = NEW_MODULE, NEW_FILE, MESSAGE, LEAVES_OUT

    def shape(self, source: str | None) -> tuple[str, str]:
        return renderer_shape(source)


DRIFT_POINT = ServeRenderServingAdapter()
facts_for_table = adapter_facts
