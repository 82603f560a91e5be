"""Stand-in for the module ``vllm.entrypoints.serve.render.serving`` (``OpenAIServingRender``), removed in vLLM 0.25.

Why: vLLM 0.25 split vLLM 0.24's ``OpenAIServingRender`` (one class rendering chat / completion requests for every
serving) into ``vllm.renderers.online_renderer.OnlineRenderer`` / ``OnlineDerenderer`` with other constructors, and
every vLLM serving that took ``openai_serving_render=`` now takes ``online_renderer=``. vllm-omni 0.24.0's
``vllm_omni/entrypoints/openai/api_server.py`` imports the class at module level, so ``vllm serve --omni`` dies at
import (``No module named 'vllm.entrypoints.serve.render'``) on 0.25+, for every model. Only its LLM-stage branch
(``omni_init_app_state`` past the pure-diffusion return) builds one, and passes it to vLLM's own servings, whose
0.25 constructors no longer take it: that branch cannot be bridged by a name.
When: ``vllm.entrypoints.serve`` is imported without a ``render`` subpackage and an installed vllm-omni imports the
module (read from its files): the package and module are registered with an ``OpenAIServingRender`` whose
construction raises ``RemovedByVLLMError`` naming the drift. The import works, a pure-diffusion server starts and
serves; an LLM-stage server stops at startup with that message instead of at import. A vLLM with the module keeps it.
Serves: vllm-omni 0.24.0 on vLLM 0.25-0.34 (its pure-diffusion server; measured on 0.25.1).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.entrypoints.serve.render.serving``.

Why a stop and not an adapter (measured on an H200, ``gpu/results.md``, "LLM stage"): with the class adapted on
``OnlineRenderer`` and the servings' keyword renamed (commit 1015f58), a one-AR-stage server of vllm-omni 0.24.0 on
vLLM 0.25.1 starts, and its ``/v1/completions`` answer equals the native pair's, but only with the stage's async
scheduling off: with vLLM's default (on), vllm-omni 0.24.0's AR model runner dies at the first request (``KeyError``
in its ``_update_states``: vLLM 0.25 made Model Runner V2 the default for dense models, vllm-omni's AR worker forces
its V1 runner, and the scheduler still follows the config, read from the wheels), and chat completions fail on the
attribute ``tool_call_id_type`` that vLLM 0.25's chat serving no longer sets. A server that reports healthy and fails
every request is worse than this stop at startup.
"""

from __future__ import annotations

from ._module_stand_in import ModuleStandIn

OLD_MODULE = "vllm.entrypoints.serve.render.serving"
IMPORTERS = ("vllm_omni/entrypoints/openai/api_server.py",)
MESSAGE = (
    "pure-diffusion servers start, an LLM stage does not (vLLM 0.25 replaced vLLM 0.24's OpenAIServingRender by "
    "vllm.renderers.online_renderer.OnlineRenderer, and its servings take online_renderer= instead). Serve this model "
    "with vLLM 0.24 (vllm-omni 0.24.0's own), or with a vllm-omni built for this vLLM.")


class ServeRenderServingStandIn(ModuleStandIn):
    importers = IMPORTERS
    removed_in = "0.25"
    old_module = OLD_MODULE
    raises = {"OpenAIServingRender": MESSAGE}
    leaves_out = ("a server whose model has an LLM stage (vllm-omni's multi-stage pipelines, e.g. Qwen2.5-Omni) stops at "
                  "startup; pure-diffusion models serve")


DRIFT_POINT = ServeRenderServingStandIn()
