"""Stand-in for the module ``vllm.entrypoints.serve.disagg.serving`` (``ServingTokens``), moved and changed in vLLM 0.25.

Why: vLLM 0.25 moved the disaggregated ``/inference/v1/generate`` serving to
``vllm.entrypoints.scale_out.token_in_token_out.serving.ServingTokens`` and changed it: its third parameter is an
``OnlineRenderer`` where vllm-omni 0.24.0 passes its ``OpenAIServingRender`` (gone since 0.25), the response renamed
``id`` to ``request_id``, and from 0.28 it calls ``engine_client.generate(..., session_id=)``, which vllm-omni's
``AsyncOmni.generate`` does not take (the alias reviews reject the move on every release). vllm-omni 0.24.0's
``vllm_omni/entrypoints/openai/api_server.py`` imports it at module level, so ``vllm serve --omni`` dies at import
(``No module named 'vllm.entrypoints.serve.disagg'``) on 0.25+. It is built only on the LLM-stage branch, after
``OpenAIServingRender`` (``serve_render_serving``), whose stand-in stops that branch first.
When: ``vllm.entrypoints.serve`` is imported without a ``disagg`` subpackage and an installed vllm-omni imports the
module (read from its files): the package and module are registered with a ``ServingTokens`` whose construction
raises ``RemovedByVLLMError`` naming the drift (the old call cannot be served: vLLM's new class needs the renderer
vllm-omni 0.24.0 cannot build). A vLLM with the module keeps it.
Serves: vllm-omni 0.24.0 on vLLM 0.25-0.33 (its pure-diffusion server; measured on 0.25.1).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.entrypoints.serve.disagg.serving``.
"""

from __future__ import annotations

from ._module_stand_in import ModuleStandIn

OLD_MODULE = "vllm.entrypoints.serve.disagg.serving"
IMPORTERS = ("vllm_omni/entrypoints/openai/api_server.py",)
MESSAGE = (
    "pure-diffusion servers start, /inference/v1/generate with an LLM stage does not (vLLM 0.25 moved vLLM 0.24's "
    "ServingTokens(engine_client, models, openai_serving_render, ...) to "
    "vllm.entrypoints.scale_out.token_in_token_out.serving and changed it: an OnlineRenderer instead of the render "
    "serving, generate(session_id=) from 0.28, the response's id renamed request_id). Use vLLM 0.24 for it, or a "
    "vllm-omni built for this vLLM.")


class ServeDisaggServingStandIn(ModuleStandIn):
    importers = IMPORTERS
    removed_in = "0.25"
    old_module = OLD_MODULE
    raises = {"ServingTokens": MESSAGE}


DRIFT_POINT = ServeDisaggServingStandIn()
