"""Call adapter for ``wait_for_engine_startup`` in ``vllm_omni.engine.stage_engine_startup``.

Why: the vLLM 0.28.0 change ``engine_startup_launch`` adapts (``wait_for_engine_startup`` from 8 arguments with
``addresses`` / ``proc_manager`` / ``coord_process`` to 6 with ``launch: CoreEngineLaunch``) also breaks vllm-omni
0.24.0's other caller module: ``launch_stage_replica`` (colocated LLM stage replicas, the default LLM stage
startup, and master-registered ones through ``_launch_omni_core_engines``), ``connect_remote_engine_cores`` and
``connect_remote_diffusion_proc`` make the 8-argument call on leaving their ``with`` block, so on vLLM 0.28-0.33 the
stage startup raises ``TypeError: wait_for_engine_startup() takes 6 positional arguments but 8 were given``.
When: the installed vLLM's function takes ``launch`` (its source and live signature) and every call in the installed
module is the 8-argument form (its source, read with ``ast``); where both agree (vLLM <= 0.27 with vllm-omni 0.24.0,
or vllm-omni 0.30.0 on vLLM 0.28+) it stays out. On vLLM 0.32+ the module imports only with the
``engine_zmq_addresses`` stand-in in place (it also imports ``get_engine_zmq_addresses``).
Serves: vllm-omni 0.24.0 on vLLM 0.28-0.33 (vLLM <= 0.27 takes the old call; vllm-omni 0.30.0 makes the new).
Retire when: the oldest supported vllm-omni calls the 6-argument form (0.30.0 does).

How: the shared adapter (``bridges._engine_startup_call``). This module's managers are vLLM's
``CoreEngineProcManager`` or vllm-omni's subclass of it (``StageEngineCoreProcManager``), passed as they are; the
remote calls pass no manager and no coordinator (``launch.engine_manager`` / ``launch.coordinator`` stay ``None``, as
vllm-omni 0.30.0 builds them); a coordinator's process goes in through the view of a ``DPCoordinator``.
"""

from __future__ import annotations

from ._engine_startup_call import CallAdapter


class StageEngineLaunch(CallAdapter):
    """The adapter on this caller module's binding (its catalogue row's target module)."""


DRIFT_POINT = StageEngineLaunch()
