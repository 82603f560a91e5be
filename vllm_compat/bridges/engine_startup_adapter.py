"""Call adapter for ``wait_for_engine_startup`` in ``vllm_omni.diffusion.stage_diffusion_proc``.

Why: vLLM 0.28.0 kept ``vllm.v1.engine.utils.wait_for_engine_startup`` but changed its call from 8 arguments
``(handshake_socket, addresses, core_engines, parallel_config, coordinated_dp, cache_config, proc_manager,
coord_process)`` to 6, ``(handshake_socket, core_engines, parallel_config, coordinated_dp, cache_config, launch)``,
with addresses, engine manager and coordinator in one ``CoreEngineLaunch``. vllm-omni 0.24.0's diffusion stage
(``StageDiffusionProcManager._wait_until_started``, the default stage startup) calls the 8-argument form, so on
vLLM 0.28-0.33 it raises ``TypeError: wait_for_engine_startup() takes 6 positional arguments but 8 were given``.
When: the installed vLLM's function takes ``launch`` (read from its source, and from its live signature) and
the installed vllm-omni module calls the 8-argument form (read from its source with ``ast``); where both agree
(vLLM <= 0.27 with vllm-omni 0.24.0, or vllm-omni 0.30.0 on vLLM 0.28+) it stays out.
Serves: vllm-omni 0.24.0 on vLLM 0.28-0.33 (vLLM <= 0.27 takes the old call; vllm-omni 0.30.0 makes the new).
Retire when: the oldest supported vllm-omni calls the 6-argument form (0.30.0 does).

How: the module's binding ``wait_for_engine_startup`` is rebound to the old-signature adapter of
``bridges._engine_startup_call`` (shared with ``stage_engine_startup_launch``, the adapter for vllm-omni 0.24.0's
other caller module). ``StageDiffusionProcManager`` is not a ``CoreEngineProcManager``, so it reaches vLLM's body
through the view that forwards ``sentinels`` / ``finished_procs``: a diffusion process dying during startup fails it
as on vLLM 0.24 (``RuntimeError: Engine core initialization failed ...``). (vllm-omni 0.30.0 instead lists its
process in ``watched_frontend_processes``, which reports it as a front-end failure.)
"""

from __future__ import annotations

from ._engine_startup_call import (  # noqa: F401 - re-exported: this entry's tests and callers read them here
    ADDRESSES_PARAMS,
    LAUNCH_PARAMS,
    NAME,
    VARIANT,
    CallAdapter,
    CallShape,
    CallShapes,
    callee_from_module_source,
    classify_caller,
)


class DiffusionStageLaunch(CallAdapter):
    """The adapter on this caller module's binding (its catalogue row's target module)."""


DRIFT_POINT = DiffusionStageLaunch()
