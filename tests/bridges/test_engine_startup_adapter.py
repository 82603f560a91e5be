"""The ``wait_for_engine_startup`` call adapter on the real wheels.

vllm-omni 0.24.0's diffusion stage startup (``StageDiffusionProcManager._wait_until_started``) makes vLLM <= 0.27's
8-argument call; vLLM 0.28+ takes 6 with a ``CoreEngineLaunch``. The startup runs here with vllm-omni's own code on
both sides of the handshake: the front end is the real ``_wait_until_started``, the engine side a forked process
running the diffusion proc's real startup handshake (``StageDiffusionProc._open_startup_handshake`` /
``_send_startup_ready``, over vLLM's ``EngineCoreProc.startup_handshake``) without loading a model. Unpatched on
vLLM 0.30 it raises the TypeError; adapted, it ends as on the native pair (vLLM 0.24.0 + vllm-omni 0.24.0):
the handshake completes and the engine gets the front end's addresses, or a process dying during startup fails
it with vLLM's RuntimeError naming the process.
"""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest

import vllm_compat
from conftest import needs_omni
from tests.bridges import engine_startup_cases as cases
from vllm_compat.bridges import engine_startup_adapter as adapter
from vllm_compat.bridges import is_ours
from vllm_compat.bridges.engine_startup_adapter import CallShape, CallShapes
from vllm_compat.config import Controls
from vllm_compat.decide import Action, decide_entry
from vllm_compat.detect.static import StaticSite

STATIC = adapter.DRIFT_POINT.detect_static(StaticSite.installed())
CALLER = adapter.DRIFT_POINT.entry.target_module
_SHAPES = f"here: vLLM takes {STATIC.callee}, {CALLER} calls {STATIC.caller}"
needs_shapes_to_adapt = pytest.mark.skipif(
    (STATIC.callee, STATIC.caller) != (CallShape.LAUNCH, CallShape.ADDRESSES),
    reason=f"needs vLLM >= 0.28 (launch) with vllm-omni 0.24.0 (the 8-argument call), e.g. env e30o24; {_SHAPES}",
)
needs_matching_old_shapes = pytest.mark.skipif(
    (STATIC.callee, STATIC.caller) != (CallShape.ADDRESSES, CallShape.ADDRESSES),
    reason=f"needs the native pair vLLM <= 0.27 + vllm-omni 0.24.0 (both 8 arguments), e.g. env e24; {_SHAPES}",
)
needs_startup_to_run = pytest.mark.skipif(
    STATIC.caller != CallShape.ADDRESSES or STATIC.callee not in (CallShape.ADDRESSES, CallShape.LAUNCH),
    reason=f"needs vllm-omni 0.24.0's 8-argument caller on a vLLM it runs on (natively or adapted); {_SHAPES}",
)
STARTUP_TIMEOUT_S = 60  # a startup that is still waiting by then would wait forever: the test fails instead


@pytest.fixture(scope="module")
def caller():
    return cases.import_caller(adapter.DRIFT_POINT)


# ---- decisions and shapes ----

@pytest.mark.parametrize(
    ("callee", "caller_shape", "action"),
    [
        (CallShape.LAUNCH, CallShape.ADDRESSES, Action.PATCHED),
        (CallShape.ADDRESSES, CallShape.ADDRESSES, Action.SKIPPED),
        (CallShape.LAUNCH, CallShape.LAUNCH, Action.SKIPPED),
        (CallShape.LAUNCH, CallShape.NO_CALL, Action.SKIPPED),
        (CallShape.ADDRESSES, CallShape.LAUNCH, Action.REFUSED),
        (CallShape.UNKNOWN, CallShape.ADDRESSES, Action.REFUSED),
        (CallShape.LAUNCH, CallShape.UNKNOWN, Action.REFUSED),
        (CallShape.ABSENT, CallShape.ADDRESSES, Action.PENDING),
        (CallShape.LAUNCH, CallShape.ABSENT, Action.PENDING),
    ],
    ids=["adapt", "both-old", "both-new", "no-call", "new-caller-old-vllm", "unknown-callee", "unknown-caller",
         "no-vllm", "no-omni"],
)
def test_decision_table(callee, caller_shape, action):
    shapes = CallShapes(callee, caller_shape)
    decision = adapter.DRIFT_POINT.decide(shapes, Controls())
    assert decision.action == action
    assert (decision.variant == adapter.VARIANT) == (action == Action.PATCHED)
    assert decide_entry(adapter.DRIFT_POINT.entry, shapes, Controls(disabled_patches=frozenset({adapter.DRIFT_POINT.entry.id}))).action == (
        Action.DISABLED)


def test_shapes_the_adapter_does_not_know_are_unknown():
    """Shapes no release has (so written here): another signature, a launch the body uses beyond what the adapter
    fills, calls by unpacking or with mixed shapes."""
    def callee(source):
        return adapter.callee_from_module_source(source)[0]

    launch_cls = ("class CoreEngineLaunch:\n    engine_manager: object\n    coordinator: object\n"
                  "    addresses: object\n    tensor_queue: object\n")
    new_def = "def wait_for_engine_startup(handshake_socket, core_engines, parallel_config, coordinated_dp, " \
              "cache_config, launch):\n"
    assert callee(launch_cls + new_def + "    launch.coordinator.proc\n") == CallShape.LAUNCH
    assert callee(launch_cls + new_def + "    launch.stats_address\n") == CallShape.UNKNOWN
    assert callee(launch_cls + new_def + "    launch.coordinator.shutdown()\n") == CallShape.UNKNOWN
    assert callee(launch_cls + new_def + "    helper(launch)\n") == CallShape.UNKNOWN
    assert callee(new_def + "    pass\n") == CallShape.UNKNOWN  # no CoreEngineLaunch
    assert callee(launch_cls.replace("tensor_queue", "queue") + new_def + "    pass\n") == CallShape.UNKNOWN
    assert callee("def wait_for_engine_startup(handshake_socket, launch):\n    pass\n") == CallShape.UNKNOWN
    imports = "from vllm.v1.engine.utils import wait_for_engine_startup as wait\n"
    assert adapter.classify_caller(imports + "wait(*args)\n")[0] == CallShape.UNKNOWN
    assert adapter.classify_caller(imports + "wait(1, 2, 3, 4, 5, 6)\nwait(1, 2, 3, 4, 5, 6, 7, 8)\n")[0] == (
        CallShape.UNKNOWN)
    assert adapter.classify_caller(imports + "wait(1, 2, 3, 4, 5, 6, proc_manager=7, coord_process=8)\n")[0] == (
        CallShape.ADDRESSES)
    assert adapter.classify_caller("import os\n")[0] == CallShape.NO_CALL


@needs_omni
def test_static_and_runtime_shapes_agree_and_match_the_live_signature(caller):
    import ast
    import inspect

    runtime = adapter.DRIFT_POINT.detect_runtime(caller)
    assert adapter.DRIFT_POINT.compare(STATIC, runtime) == []
    # the installed vllm-omni's own calls, read with ast: 8 positional arguments (vLLM <= 0.27's signature) in
    # vllm-omni 0.24.0 / 0.26.0, 6 (with a CoreEngineLaunch) in 0.28.0
    counts = {len(node.args) for node in ast.walk(ast.parse(inspect.getsource(caller)))
              if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == adapter.NAME}
    assert len(counts) == 1 and next(iter(counts)) in (6, 8), counts
    positional = counts.pop()
    assert runtime.caller == {8: CallShape.ADDRESSES, 6: CallShape.LAUNCH}[positional], runtime
    assert runtime.calls and all(f"{positional} positional" in call for call in runtime.calls), runtime.calls
    live = tuple(inspect.signature(cases.vllm_function()).parameters)
    expected = {CallShape.ADDRESSES: adapter.ADDRESSES_PARAMS, CallShape.LAUNCH: adapter.LAUNCH_PARAMS}
    assert live == expected[runtime.callee], (live, runtime)


# ---- the startup, unpatched, adapted and native ----

def _engine_side(handshake_address, conn, exit_code):
    """The diffusion proc's startup handshake (vllm-omni's own steps, no model): HELLO, the front end's init
    message, READY; then report the addresses received and wait to be let go (so that its exit cannot race the
    READY). With ``exit_code``, die before the handshake instead."""
    if exit_code is not None:
        os._exit(exit_code)
    from vllm_omni.diffusion.stage_diffusion_proc import StageDiffusionProc

    ctx, socket, addresses = StageDiffusionProc._open_startup_handshake(handshake_address, local_client=True,
                                                                          headless=False)
    StageDiffusionProc._send_startup_ready(socket, local_client=True, headless=False)
    conn.send((list(addresses.inputs), list(addresses.outputs)))
    conn.recv()
    socket.close(linger=0)
    ctx.term()
    os._exit(0)


def _start_stage(caller, exit_code=None):
    """A ``StageDiffusionProcManager`` as its ``__init__`` leaves it (same attributes, same process name), owning a
    forked engine side instead of a model-loading diffusion proc; returns (manager, handshake address, pipe)."""
    from vllm.utils.network_utils import get_open_zmq_ipc_path
    from vllm.v1.engine.utils import EngineZmqAddresses

    handshake_address = get_open_zmq_ipc_path()
    parent_conn, child_conn = multiprocessing.Pipe()
    proc = multiprocessing.get_context("fork").Process(
        target=_engine_side, name="StageDiffusionProc", args=(handshake_address, child_conn, exit_code))
    proc.start()
    manager = caller.StageDiffusionProcManager.__new__(caller.StageDiffusionProcManager)
    manager.proc = proc
    manager.addresses = EngineZmqAddresses(inputs=[get_open_zmq_ipc_path()], outputs=[get_open_zmq_ipc_path()])
    manager.manager_stopped = False
    manager.failed_proc_name = None
    return manager, handshake_address, parent_conn


def _wait_until_started(manager, handshake_address):
    """Run vllm-omni's real ``_wait_until_started``; returns the exception it raised (None: it returned). Fails
    the test if it is still waiting after ``STARTUP_TIMEOUT_S``."""
    outcome = {}

    def run():
        try:
            manager._wait_until_started(handshake_address, STARTUP_TIMEOUT_S)
            outcome["raised"] = None
        except BaseException as exc:  # noqa: BLE001 - the outcome under test
            outcome["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(STARTUP_TIMEOUT_S)
    assert "raised" in outcome, f"the stage startup was still waiting after {STARTUP_TIMEOUT_S} s"
    return outcome["raised"]


def _finish(manager, conn):
    if manager.proc.is_alive():
        conn.send("done")
    manager.proc.join(30)
    assert manager.proc.exitcode is not None


@needs_omni
@needs_shapes_to_adapt
def test_unpatched_stage_startup_raises_the_type_error(caller):
    adapter.DRIFT_POINT.uninstall(caller)
    try:
        assert caller.wait_for_engine_startup is cases.vllm_function()  # vLLM 0.30's own, unpatched
        manager, address, conn = _start_stage(caller)
        raised = _wait_until_started(manager, address)
        assert isinstance(raised, TypeError), raised
        assert "wait_for_engine_startup() takes 6 positional arguments but 8 were given" in str(raised)
        manager.proc.join(30)  # vllm-omni shuts its process down on the failure
        assert manager.proc.exitcode is not None
    finally:
        vllm_compat.apply()


@needs_omni
@needs_startup_to_run
def test_stage_startup_completes_the_handshake_as_natively(caller, monkeypatch):
    """Adapted on vLLM 0.28+ (vLLM's real function gets a ``CoreEngineLaunch`` of the right types) and natively on
    vLLM 0.24: the same outcome, the engine side gets the front end's addresses."""
    seen = []
    if STATIC.callee == CallShape.LAUNCH:
        installed = caller.wait_for_engine_startup
        assert is_ours(installed, adapter.DRIFT_POINT.entry.id) and installed.__wrapped__ is cases.vllm_function()
        real = cases.vllm_function()

        def spy(*args, **kwargs):  # between the adapter and vLLM's real function
            seen.append((args, kwargs))
            return real(*args, **kwargs)

        from vllm.v1.engine import utils

        monkeypatch.setattr(caller, adapter.NAME, adapter.DRIFT_POINT.make_adapter(spy, utils.CoreEngineLaunch,
                                                                        utils.CoreEngineProcManager))
    manager, address, conn = _start_stage(caller)
    try:
        raised = _wait_until_started(manager, address)
        assert raised is None, repr(raised)
        assert conn.recv() == (manager.addresses.inputs, manager.addresses.outputs)
    finally:
        _finish(manager, conn)
    assert manager.proc.exitcode == 0
    if STATIC.callee == CallShape.LAUNCH:
        from vllm.v1.engine.utils import CoreEngine, CoreEngineLaunch, CoreEngineProcManager

        ((args, kwargs),) = seen
        assert kwargs == {} and len(args) == 6
        _, core_engines, parallel_config, coordinated_dp, cache_config, launch = args
        assert [type(e) for e in core_engines] == [CoreEngine] and coordinated_dp is False and cache_config is None
        assert parallel_config.data_parallel_size_local == 1
        assert type(launch) is CoreEngineLaunch
        assert isinstance(launch.engine_manager, CoreEngineProcManager)
        assert launch.engine_manager.sentinels() == manager.sentinels() == [manager.proc.sentinel]
        assert launch.coordinator is None and launch.tensor_queue is None and launch.watched_frontend_processes == ()
        assert launch.addresses is manager.addresses


@needs_omni
@needs_startup_to_run
def test_a_process_dying_during_startup_fails_it_as_natively(caller):
    """vLLM 0.24's RuntimeError naming the process and its exit code, adapted as natively; passed as is, the
    manager (not a CoreEngineProcManager) would not be watched by vLLM 0.28+ and the startup would wait forever."""
    manager, address, conn = _start_stage(caller, exit_code=3)
    manager.proc.join(30)
    raised = _wait_until_started(manager, address)
    _finish(manager, conn)
    assert isinstance(raised, RuntimeError), repr(raised)
    assert "Engine core initialization failed" in str(raised)
    assert "Failed core proc(s): {'StageDiffusionProc': 3}" in str(raised)


def _real_stage_startup(caller, model_dir):
    """vllm-omni's real ``StageDiffusionProcManager(...)``: it starts the real diffusion proc (``run_diffusion_proc``),
    which handshakes and then fails to find a model in the empty ``model_dir``; returns what it raised."""
    from vllm_omni.diffusion.data import OmniDiffusionConfig

    outcome = {}

    def run():
        try:
            caller.StageDiffusionProcManager(model=str(model_dir), od_config=OmniDiffusionConfig(model=str(model_dir)),
                                             stage_init_timeout=STARTUP_TIMEOUT_S)
            outcome["raised"] = None
        except BaseException as exc:  # noqa: BLE001 - the outcome under test
            outcome["raised"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(STARTUP_TIMEOUT_S)
    assert "raised" in outcome, f"the stage startup was still waiting after {STARTUP_TIMEOUT_S} s"
    return outcome["raised"]


@needs_omni
@needs_shapes_to_adapt
def test_unpatched_real_stage_startup_raises_the_type_error(caller, tmp_path):
    adapter.DRIFT_POINT.uninstall(caller)
    try:
        raised = _real_stage_startup(caller, tmp_path)
    finally:
        vllm_compat.apply()
    assert isinstance(raised, TypeError), repr(raised)
    assert "wait_for_engine_startup() takes 6 positional arguments but 8 were given" in str(raised)


@needs_omni
@needs_startup_to_run
def test_real_stage_startup_without_a_model_fails_as_natively(caller, tmp_path):
    """As far as the native pair gets on this machine: the diffusion proc handshakes, finds no model and dies; the
    front end raises vLLM's RuntimeError, adapted (vLLM 0.28+) as natively (vLLM 0.24)."""
    raised = _real_stage_startup(caller, tmp_path)
    assert isinstance(raised, RuntimeError), repr(raised)
    assert str(raised).startswith("Engine core initialization failed. See root cause above. Failed core proc(s):")


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
@needs_matching_old_shapes
def test_stays_out_where_the_shapes_already_match(caller):
    cases.check_stays_out_where_the_shapes_already_match(adapter.DRIFT_POINT, caller)
