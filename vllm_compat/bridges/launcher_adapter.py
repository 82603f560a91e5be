"""Adapter for the module ``vllm.entrypoints.launcher`` (``serve_http``, ``terminate_if_errored``), moved and changed in vLLM 0.29.

Why: vLLM 0.29 moved the launcher to ``vllm.entrypoints.launchers.launcher`` and changed ``serve_http``: it runs a
``NoSignalServer`` (uvicorn's own SIGINT / SIGTERM handling removed), so the server stops only through its own
handler, which reads ``app.state.engine_client.vllm_config.shutdown_timeout``. vllm-omni's ``AsyncOmni`` has
``vllm_config`` None without an LLM stage (a pure-diffusion server): the handler raises AttributeError and the
server ignores SIGINT / SIGTERM (the alias reviews reject the move on 0.29-0.33, measured: still serving 18 s after
SIGINT; vLLM 0.24's ``serve_http``, where uvicorn handles the signal, stops). vllm-omni 0.24.0 imports the old path
(``api_server``, ``serving_chat``, ``serving_speech``): ``vllm serve --omni`` dies at import on 0.29+.
When: ``vllm.entrypoints`` is imported without a ``launcher`` submodule, an installed vllm-omni imports it (read from
its files) and vLLM has ``vllm.entrypoints.launchers.launcher`` with ``serve_http`` / ``terminate_if_errored``: a
module object is registered under the old path holding vLLM's own ``terminate_if_errored`` and a ``serve_http`` that
calls vLLM's, first giving a pure-diffusion engine client (``vllm_config`` None) a ``vllm_config`` that carries only
``shutdown_timeout`` (0, vLLM's default: abort), every other attribute forwarded: the fix vllm-omni 0.30.0 made in
its own server (``vllm_omni.entrypoints.utils.PureDiffusionLauncherAdapter``). SIGINT / SIGTERM then stop the
server, and ``engine_client.shutdown(timeout=0)`` stops the engine. A vLLM with the old module keeps it.
Serves: vllm-omni 0.24.0 on vLLM 0.29-0.33 (the launcher alone: its server also needs openai.engine.* there).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.entrypoints.launcher`` (0.30.0 does not).
"""

from __future__ import annotations

import types

from ._module_stand_in import ModuleStandIn, Moved

OLD_MODULE = "vllm.entrypoints.launcher"
NEW_MODULE = "vllm.entrypoints.launchers.launcher"
IMPORTERS = ("vllm_omni/entrypoints/openai/api_server.py", "vllm_omni/entrypoints/openai/serving_chat.py",
             "vllm_omni/entrypoints/openai/serving_speech.py")
SHUTDOWN_TIMEOUT = 0  # vLLM's EngineArgs / VllmConfig default (abort)


class PureDiffusionEngineClient:
    """An engine client whose ``vllm_config`` is None, seen by vLLM 0.29+'s ``serve_http`` with a ``vllm_config``
    that carries only ``shutdown_timeout``; everything else is the wrapped client's (``__wrapped__``)."""

    def __init__(self, engine_client, shutdown_timeout: float = SHUTDOWN_TIMEOUT) -> None:
        object.__setattr__(self, "__wrapped__", engine_client)
        object.__setattr__(self, "_shutdown_timeout", shutdown_timeout)

    def __getattr__(self, name: str):
        return getattr(self.__wrapped__, name)

    def __setattr__(self, name: str, value) -> None:
        setattr(self.__wrapped__, name, value)

    @property
    def vllm_config(self):
        return types.SimpleNamespace(shutdown_timeout=self._shutdown_timeout)


def _state_of(app):
    """``app.state``, through ASGI wrappers that forward attributes (vllm-omni's ``_TimestampMiddleware``)."""
    try:
        return app.state
    except AttributeError:
        return None


async def serve_http(app, sock, *args, **kwargs):
    """vLLM 0.24's ``serve_http(app, sock, enable_ssl_refresh=False, **uvicorn_kwargs)`` on vLLM 0.29+'s: the same
    call, with a pure-diffusion engine client given the ``vllm_config.shutdown_timeout`` the new shutdown path reads."""
    import importlib

    state = _state_of(app)
    client = getattr(state, "engine_client", None) if state is not None else None
    if client is not None and not isinstance(client, PureDiffusionEngineClient) and \
            getattr(client, "vllm_config", None) is None:
        state.engine_client = PureDiffusionEngineClient(client)
    return await importlib.import_module(NEW_MODULE).serve_http(app, sock, *args, **kwargs)


class LauncherAdapter(ModuleStandIn):
    importers = IMPORTERS
    removed_in = "0.29"
    old_module = OLD_MODULE

    def members(self) -> dict:
        return {"serve_http": serve_http, "terminate_if_errored": Moved(NEW_MODULE, "terminate_if_errored")}


DRIFT_POINT = LauncherAdapter()
