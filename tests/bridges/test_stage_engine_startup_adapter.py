"""The ``wait_for_engine_startup`` call adapter for ``vllm_omni.engine.stage_engine_startup`` on the real wheels.

vllm-omni 0.24.0 makes vLLM <= 0.27's 8-argument call there four times; vLLM 0.28+ takes 6 with a
``CoreEngineLaunch``. Each of the module's startup paths runs here as vllm-omni wrote it, leaving its ``with`` block
into vLLM's real function, against engine processes doing vLLM's own engine-side handshake
(``EngineCoreProc.startup_handshake``, then READY) without loading a model:

- ``connect_remote_diffusion_proc`` and ``connect_remote_engine_cores``: a real ``OmniMasterServer``'s allocation, a
  remote headless engine (no local manager, no coordinator);
- ``launch_stage_replica`` colocated (``get_engine_zmq_addresses``: vLLM's own up to 0.31, the
  ``engine_zmq_addresses`` stand-in on 0.32+) and through a running ``OmniMasterServer`` (registration, then
  ``_launch_omni_core_engines``): a local engine whose manager is vllm-omni's ``StageEngineCoreProcManager`` or vLLM's
  ``CoreEngineProcManager`` with ``__init__`` forking the engine side instead of spawning a model-loading core.

Unpatched on vLLM 0.28+ each raises the TypeError; adapted, each ends as on the native pair (vLLM 0.24.0 + vllm-omni
0.24.0): the engines get the front end's addresses, and a local engine dying during startup fails it with vLLM's
RuntimeError naming the process.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from types import SimpleNamespace

import pytest

import vllm_compat
from conftest import needs_omni
from tests.bridges import engine_startup_cases as cases
from vllm_compat.bridges import is_ours
from vllm_compat.bridges import stage_engine_startup_adapter as adapter
from vllm_compat.bridges._engine_startup_call import ADDRESSES_PARAMS, LAUNCH_PARAMS, NAME, CallShape
from vllm_compat.detect.static import StaticSite

STATIC = adapter.DRIFT_POINT.detect_static(StaticSite.installed())
CALLER = adapter.DRIFT_POINT.entry.target_module
_SHAPES = f"here: vLLM takes {STATIC.callee}, {CALLER} calls {STATIC.caller}"
needs_shapes_to_adapt = pytest.mark.skipif(
    (STATIC.callee, STATIC.caller) != (CallShape.LAUNCH, CallShape.ADDRESSES),
    reason=f"needs vLLM >= 0.28 (launch) with vllm-omni 0.24.0 (the 8-argument calls), e.g. vLLM 0.32; {_SHAPES}",
)
needs_matching_shapes = pytest.mark.skipif(
    STATIC.callee != STATIC.caller or STATIC.callee not in (CallShape.ADDRESSES, CallShape.LAUNCH),
    reason=f"needs a native pair: vLLM <= 0.27 + vllm-omni 0.24.0 (both 8 arguments) or vLLM >= 0.28 + vllm-omni "
           f"0.30.0 (both 6); {_SHAPES}",
)
needs_startup_to_run = pytest.mark.skipif(
    STATIC.caller != CallShape.ADDRESSES or STATIC.callee not in (CallShape.ADDRESSES, CallShape.LAUNCH),
    reason=f"needs vllm-omni 0.24.0's 8-argument calls on a vLLM they run on (natively or adapted); {_SHAPES}",
)
STARTUP_TIMEOUT_S = 60  # a startup still waiting by then would wait forever: the test fails instead
PATHS = ("remote_diffusion", "remote_engines", "colocated_replica", "registered_replica")


@pytest.fixture(scope="module")
def caller():
    return cases.import_caller(adapter.DRIFT_POINT)


# ---- shapes ----

@needs_omni
def test_static_and_runtime_shapes_agree_and_all_four_calls_have_one_shape(caller):
    """vllm-omni 0.24.0 makes the 8-argument call four times, 0.30.0 the 6-argument one at the same four places."""
    import inspect

    runtime = adapter.DRIFT_POINT.detect_runtime(caller)
    assert adapter.DRIFT_POINT.compare(STATIC, runtime) == []
    positional = {CallShape.ADDRESSES: "8 positional", CallShape.LAUNCH: "6 positional"}[runtime.caller]
    assert len(runtime.calls) == 4 and all(positional in call for call in runtime.calls), runtime.calls
    live = tuple(inspect.signature(cases.vllm_function()).parameters)
    assert live == {CallShape.ADDRESSES: ADDRESSES_PARAMS, CallShape.LAUNCH: LAUNCH_PARAMS}[runtime.callee], runtime


def test_both_adapters_share_one_implementation():
    from vllm_compat.bridges import engine_startup_adapter as diffusion_adapter
    from vllm_compat.bridges._engine_startup_call import CallAdapter

    assert type(adapter.DRIFT_POINT).__mro__[1] is type(diffusion_adapter.DRIFT_POINT).__mro__[1] is CallAdapter
    assert adapter.DRIFT_POINT.entry.target == diffusion_adapter.DRIFT_POINT.entry.target == NAME
    assert adapter.DRIFT_POINT.entry.target_module != diffusion_adapter.DRIFT_POINT.entry.target_module


# ---- the engine side, the managers, the startup paths ----

def _close_inherited_tcp_sockets() -> None:
    """An engine runs in a process of its own (a remote one on another host), not a fork of the front end: close
    the TCP sockets this fork inherited. vllm-omni's ``OmniMasterServer`` (0.26.0 on) holds each route port bound (a plain
    socket, its reservation) until just before its ZMQ owner binds it; a forked copy kept it bound, so the front
    end's bind failed with "Address already in use" (remote_diffusion / remote_engines on v0.31-omni0.26). The pipe
    to the test (AF_UNIX) and multiprocessing's sentinel pipe stay open; ``_Engines.start`` waits for the child to
    say it closed them before the front end goes on."""
    import socket
    import stat

    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=fd)
        except (OSError, ValueError):
            continue
        family = sock.family
        sock.detach()
        if family in (socket.AF_INET, socket.AF_INET6):
            os.close(fd)


def _engine_side(handshake_address, local, conn, exit_code):
    """vLLM's engine-side startup handshake (engine index 0): HELLO, the front end's init message, READY; then send
    the addresses received and wait to be let go. With ``exit_code``, die before the handshake instead."""
    if exit_code is not None:
        os._exit(exit_code)
    _close_inherited_tcp_sockets()
    conn.send("forked")  # the front end binds only after this: no port of its is held by the fork any more
    import msgspec
    import zmq
    from vllm.v1.engine.core import EngineCoreProc

    ctx = zmq.Context()
    socket = ctx.socket(zmq.DEALER)
    socket.setsockopt(zmq.IDENTITY, (0).to_bytes(2, "little"))
    socket.connect(handshake_address)
    headless = not local  # remote engines must be headless outside hybrid / external DP load balancing
    addresses = EngineCoreProc.startup_handshake(socket, local_client=local, headless=headless, parallel_config=None)
    socket.send(msgspec.msgpack.encode({"status": "READY", "local": local, "headless": headless}))
    conn.send((list(addresses.inputs), list(addresses.outputs)))
    conn.recv()
    socket.close(linger=0)
    ctx.term()
    os._exit(0)


class _Engines:
    """The forked engine processes of one test, and the pipe each reports on."""

    def __init__(self, exit_code=None) -> None:
        self.exit_code = exit_code
        self.procs, self.conns = [], []

    def start(self, handshake_address, local, name="EngineCore_DP0"):
        parent_conn, child_conn = multiprocessing.Pipe()
        proc = multiprocessing.get_context("fork").Process(
            target=_engine_side, name=name, args=(handshake_address, local, child_conn, self.exit_code))
        proc.start()
        if self.exit_code is None:
            assert parent_conn.poll(60) and parent_conn.recv() == "forked", f"{name} did not start"
        else:
            # dead before the front end waits: its sentinel fires a moment before waitpid can reap it, and vLLM's
            # message names only the processes it could reap
            proc.join(30)
        self.procs.append(proc)
        self.conns.append(parent_conn)
        return proc

    def received(self):
        return [conn.recv() for conn in self.conns]

    def finish(self) -> None:
        for proc, conn in zip(self.procs, self.conns, strict=True):
            if proc.is_alive():
                try:
                    conn.send("done")
                except OSError:
                    pass
            proc.join(10)
            if proc.exitcode is None:  # still in the handshake: the front end gave up on it
                proc.terminate()
                proc.join(10)


def _forking_manager(base: type, engines: _Engines) -> type:
    """``base`` (vLLM's ``CoreEngineProcManager`` or vllm-omni's subclass) with ``__init__`` forking the engine side
    at the handshake address it is given, instead of spawning an engine core that loads a model; ``sentinels`` and
    ``finished_procs`` are the base's, over ``processes``."""

    class ForkingManager(base):
        def __init__(self, *, handshake_address, **kwargs) -> None:
            self.processes = [engines.start(handshake_address, local=True)]

    return ForkingManager


def _vllm_config(**parallel):
    """What these paths read of a ``VllmConfig`` (the real one needs a model and a device): vLLM's own
    ``ParallelConfig`` and ``CacheConfig``; no DP coordinator (DP size 1)."""
    from vllm.config import CacheConfig, ParallelConfig

    return SimpleNamespace(parallel_config=ParallelConfig(**parallel), cache_config=CacheConfig(),
                           needs_dp_coordinator=False)


def _master_server(caller, start=False):
    from vllm.utils.network_utils import get_open_port

    server = caller.OmniMasterServer("127.0.0.1", get_open_port(), [0])
    if start:
        server.start()
    return server


def _run_path(caller, path, engines, monkeypatch):
    """Run one of the module's startup paths to the end of its ``with`` block (vLLM's function), in a thread;
    returns (the addresses it handed out, what it raised or None). Fails the test if it is still waiting after
    ``STARTUP_TIMEOUT_S``."""
    server = None
    if path == "remote_diffusion":
        server = _master_server(caller)
        context = caller.connect_remote_diffusion_proc(server, 0)
        engines.start(server.get_allocation(0).handshake_connect_address, local=False)
    elif path == "remote_engines":
        server = _master_server(caller)
        server.register_stage_config(0, {})  # the remote stage registered: its coordinator addresses are known
        context = caller.connect_remote_engine_cores(_vllm_config(data_parallel_size_local=0), server, 0)
        engines.start(server.get_allocation(0).handshake_connect_address, local=False)
    elif path == "colocated_replica":
        from vllm_omni.engine import stage_engine_core_proc_manager as managers

        monkeypatch.setattr(managers, "StageEngineCoreProcManager",
                            _forking_manager(managers.StageEngineCoreProcManager, engines))
        context = caller.launch_stage_replica(_vllm_config(), None, False, 0)
    else:
        server = _master_server(caller, start=True)
        monkeypatch.setattr(caller, "CoreEngineProcManager", _forking_manager(caller.CoreEngineProcManager, engines))
        context = caller.launch_stage_replica(_vllm_config(), None, False, 0, omni_master_server=server)
    outcome = {}

    def run():
        try:
            with context as resources:
                outcome["addresses"] = resources.addresses
            outcome["raised"] = None
        except BaseException as exc:  # noqa: BLE001 - the outcome under test
            outcome["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(STARTUP_TIMEOUT_S)
    if server is not None and path == "registered_replica":
        server.stop()
    assert "raised" in outcome, f"{path}: the startup was still waiting after {STARTUP_TIMEOUT_S} s"
    return outcome.get("addresses"), outcome["raised"]


# ---- unpatched, adapted, native ----

@needs_omni
@needs_shapes_to_adapt
@pytest.mark.parametrize("path", PATHS)
def test_unpatched_startup_raises_the_type_error(caller, path, monkeypatch):
    engines = _Engines()
    adapter.DRIFT_POINT.uninstall(caller)
    try:
        assert caller.wait_for_engine_startup is cases.vllm_function()  # vLLM's own, unadapted
        _, raised = _run_path(caller, path, engines, monkeypatch)
    finally:
        vllm_compat.apply()
        engines.finish()
    assert isinstance(raised, TypeError), repr(raised)
    assert "wait_for_engine_startup() takes 6 positional arguments but 8 were given" in str(raised)


@needs_omni
@needs_startup_to_run
@pytest.mark.parametrize("path", PATHS)
def test_startup_completes_the_handshake_as_natively(caller, path, monkeypatch):
    """Adapted on vLLM 0.28+ (vLLM's real function gets a ``CoreEngineLaunch`` holding what the old call passed)
    and natively on vLLM 0.24: the engine gets the front end's addresses."""
    seen = []
    if STATIC.callee == CallShape.LAUNCH:
        installed = caller.wait_for_engine_startup
        assert is_ours(installed, adapter.DRIFT_POINT.entry.id) and installed.__wrapped__ is cases.vllm_function()
        real = cases.vllm_function()

        def spy(*args, **kwargs):  # between the adapter and vLLM's real function
            seen.append((args, kwargs))
            return real(*args, **kwargs)

        from vllm.v1.engine import utils

        monkeypatch.setattr(caller, NAME, adapter.DRIFT_POINT.make_adapter(spy, utils.CoreEngineLaunch,
                                                                utils.CoreEngineProcManager))
    engines = _Engines()
    try:
        addresses, raised = _run_path(caller, path, engines, monkeypatch)
        assert raised is None, repr(raised)
        assert engines.received() == [(addresses.inputs, addresses.outputs)]
    finally:
        engines.finish()
    assert [proc.exitcode for proc in engines.procs] == [0]
    if STATIC.callee == CallShape.LAUNCH:
        from vllm.v1.engine.utils import CoreEngine, CoreEngineLaunch, CoreEngineProcManager

        ((args, kwargs),) = seen
        assert kwargs == {} and len(args) == 6
        _, core_engines, _, coordinated_dp, _, launch = args
        local = path.endswith("_replica")
        assert [(type(e), e.local) for e in core_engines] == [(CoreEngine, local)] and coordinated_dp is False
        assert type(launch) is CoreEngineLaunch and launch.addresses is addresses
        assert launch.coordinator is None and launch.tensor_queue is None and launch.watched_frontend_processes == ()
        if local:  # the manager as vllm-omni built it, which vLLM watches
            assert isinstance(launch.engine_manager, CoreEngineProcManager)
            assert launch.engine_manager.sentinels() == [engines.procs[0].sentinel]
        else:
            assert launch.engine_manager is None


@needs_omni
@needs_startup_to_run
@pytest.mark.parametrize("path", ["colocated_replica", "registered_replica"])
def test_a_local_engine_dying_during_startup_fails_it_as_natively(caller, path, monkeypatch):
    engines = _Engines(exit_code=3)
    try:
        _, raised = _run_path(caller, path, engines, monkeypatch)
    finally:
        engines.finish()
    assert isinstance(raised, RuntimeError), repr(raised)
    assert "Engine core initialization failed" in str(raised)
    assert "Failed core proc(s): {'EngineCore_DP0': 3}" in str(raised)


# ---- in place, out of place, uninstall ----

@needs_omni
@needs_shapes_to_adapt
def test_installed_on_import_and_uninstall_restores_the_exact_original(caller):
    cases.check_installed_on_import_and_uninstall_exact(adapter.DRIFT_POINT, caller)


@needs_omni
@needs_shapes_to_adapt
def test_refuses_a_binding_that_is_not_vllms_function(caller, monkeypatch):
    cases.check_refuses_a_binding_that_is_not_vllms_function(adapter.DRIFT_POINT, caller, monkeypatch)


@needs_omni
@needs_matching_shapes
def test_stays_out_where_the_shapes_already_match(caller):
    cases.check_stays_out_where_the_shapes_already_match(adapter.DRIFT_POINT, caller)
