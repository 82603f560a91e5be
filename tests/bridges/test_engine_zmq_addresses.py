"""The ``get_engine_zmq_addresses`` stand-in on the real wheels.

vLLM 0.32 replaced ``vllm.v1.engine.utils.get_engine_zmq_addresses`` by ``get_engine_zmq_bind_addresses``;
vllm-omni 0.24.0's ``vllm_omni.engine.stage_engine_startup`` imports the old name. Unpatched on vLLM 0.32+ that
module raises ImportError; with the stand-in it imports, and the function returns what vLLM <= 0.31's did for the
same configurations (the oracle: one table of what the old function returned, measured on vLLM 0.24 and 0.31,
checked against vLLM's own function where it has one and against the stand-in where it does not). Where vLLM has the
name the stand-in stays out. The startup paths that call it run in ``test_stage_engine_startup_adapter.py``.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import SimpleNamespace

import pytest
from packaging.version import Version

import vllm_compat
from conftest import VLLM_VERSION, needs_omni, needs_startup_hook, needs_vllm, run_python
from tests.bridges import name_stand_in_cases as cases
from vllm_compat.bridges import HostKind, is_ours
from vllm_compat.bridges import engine_zmq_addresses as stand_in
from vllm_compat.bridges.engine_zmq_addresses import Shape
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite
from vllm_compat.errors import PatchRefusedError

STATIC = stand_in.DRIFT_POINT.detect_static(StaticSite.installed())
IMPORTER = "vllm_omni.engine.stage_engine_startup"
_HERE = f"here: vLLM {STATIC.host} the name; vllm-omni importers {list(STATIC.importers)}"
needs_stand_in = pytest.mark.skipif(
    STATIC.host != HostKind.LACKS or not STATIC.importers,
    reason=f"needs vLLM >= 0.32 (no {stand_in.NAME}) with vllm-omni 0.24.0 (imports it), e.g. vLLM 0.32 + vllm-omni 0.24.0; "
           f"{_HERE}",
)
needs_vllms_own = pytest.mark.skipif(STATIC.host != HostKind.DEFINES,
                                     reason=f"needs vLLM <= 0.31 (defines {stand_in.NAME}), e.g. env e24; {_HERE}")
MASTER_IP = "10.0.0.7"
ORACLE_FLOOR = Version("0.24")
# What vLLM 0.24.0's and 0.31.0's get_engine_zmq_addresses(config, n) returned (measured, both alike), per config:
# inputs / outputs as "ipc" (a fresh ipc:// path each) or the literal address; every other field None.
OLD_RESULTS = {
    ("local", 1): (["ipc"], ["ipc"]),
    ("local", 2): (["ipc", "ipc"], ["ipc", "ipc"]),
    ("dp2_remote", 1): ([f"tcp://{MASTER_IP}:0"], [f"tcp://{MASTER_IP}:0"]),
    ("dp2_remote", 2): ([f"tcp://{MASTER_IP}:0"] * 2, [f"tcp://{MASTER_IP}:0"] * 2),
}


def _config(kind):
    """What the function reads of a ``VllmConfig`` (the real one needs a model and a device): vLLM's own
    ``ParallelConfig``, colocated (DP 1) or with one of two DP ranks on this node (the frontend reaches remote
    engines over TCP)."""
    from vllm.config import ParallelConfig

    if kind == "local":
        return SimpleNamespace(parallel_config=ParallelConfig())
    return SimpleNamespace(parallel_config=ParallelConfig(data_parallel_size=2, data_parallel_size_local=1,
                                                          data_parallel_master_ip=MASTER_IP))


@pytest.fixture(scope="module")
def utils():
    module = importlib.import_module(stand_in.DRIFT_POINT.entry.target_module)
    vllm_compat.apply()
    return module


# ---- decisions and shapes ----

@pytest.mark.parametrize(("facts", "action"), cases.FUNCTION_DECISION_CASES, ids=cases.FUNCTION_DECISION_IDS)
def test_decision_table(facts, action):
    cases.check_decision(stand_in.DRIFT_POINT, facts, action)


def test_shapes_the_stand_in_does_not_know_are_unknown():
    """Shapes no release has (so written here): another replacement signature or return class, an address class
    with more required fields, calls passing what the stand-in does not take."""
    bind = "@dataclass\nclass EngineZmqBindAddresses:\n    inputs: list[str]\n    outputs: list[str]\n"
    addresses = ("@dataclass\nclass EngineZmqAddresses:\n    inputs: list[str]\n    outputs: list[str]\n"
                 "    coordinator_input: str | None = None\n")
    new_def = "def get_engine_zmq_bind_addresses(vllm_config, num_api_servers: int = 1):\n    pass\n"

    def replacement(source):
        return stand_in._replacement_from_source(source)[0]

    assert replacement(bind + addresses + new_def) == Shape.KNOWN
    assert replacement(bind + addresses + new_def.replace(" = 1", "")) == Shape.UNKNOWN
    assert replacement(bind + addresses + new_def.replace("):", ", *, listen=True):")) == Shape.UNKNOWN
    assert replacement(bind.replace("outputs: list[str]", "outputs: list[str]\n    listeners: list") + addresses
                       + new_def) == Shape.UNKNOWN
    assert replacement(bind + addresses.replace("= None", "") + new_def) == Shape.UNKNOWN
    assert replacement(addresses + new_def) == Shape.UNKNOWN  # no bind class
    assert replacement(bind + addresses) == Shape.UNKNOWN  # no function

    class Tree:  # a vllm-omni source tree of one file, for call shapes no release makes
        def __init__(self, body):
            self.body = body

        def read(self, relpath):
            imports = "from vllm.v1.engine.utils import get_engine_zmq_addresses as get\n"
            return imports + self.body if relpath == stand_in.IMPORTERS[0] else None

    assert stand_in.DRIFT_POINT.callers(Tree("get(c)\nget(c, 2)\nget(c, num_api_servers=2)\nself.get(c, 1, 2)\n"))[0] == (
        Shape.KNOWN)
    assert stand_in.DRIFT_POINT.callers(Tree("get(c, defer_api_server_ports=False)\n"))[0] == Shape.UNKNOWN
    assert stand_in.DRIFT_POINT.callers(Tree("get(*args)\n"))[0] == Shape.UNKNOWN
    assert stand_in.DRIFT_POINT.callers(Tree("get(c, 1, True)\n"))[0] == Shape.UNKNOWN


@needs_omni
def test_vllm_omnis_calls_are_the_one_measured():
    assert STATIC.callers == Shape.KNOWN, STATIC
    # one call, get_engine_zmq_addresses(vllm_config) in launch_stage_replica (line 958 in 0.24.0, 1190 in 0.30.0)
    (call,) = STATIC.calls
    assert call.startswith(f"{IMPORTER}:") and call.endswith(": 1 positional"), call
    (importer,) = STATIC.importers  # at module level: line 23 in 0.24.0, 28 in 0.30.0
    assert importer.startswith(f"{IMPORTER}:") and importer.endswith(" (module)"), importer


@needs_vllm
def test_static_and_runtime_facts_agree(utils):
    runtime = stand_in.DRIFT_POINT.detect_runtime(utils)
    assert stand_in.DRIFT_POINT.compare(STATIC, runtime) == []
    if STATIC.host == HostKind.DEFINES:
        expected = Shape.ABSENT  # nothing to stand in for
    else:  # replaced (vLLM 0.32+), or older than both names (vLLM 0.16): no replacement to build on, so refused
        expected = Shape.KNOWN if hasattr(utils, stand_in.REPLACEMENT) else Shape.UNKNOWN
    assert runtime.replacement == expected, runtime


# ---- the oracle: the old function's results, from vLLM's own or from the stand-in ----

@needs_vllm
@pytest.mark.parametrize(("kind", "num_api_servers"), sorted(OLD_RESULTS))
def test_returns_what_the_old_function_returned(utils, kind, num_api_servers):
    if STATIC.host == HostKind.LACKS and not STATIC.importers:
        pytest.skip(f"vLLM lacks {stand_in.NAME} and no installed vllm-omni imports it: nothing provides it; {_HERE}")
    if STATIC.host == HostKind.DEFINES and Version(VLLM_VERSION) < ORACLE_FLOOR:
        pytest.skip(f"the table is what vLLM {ORACLE_FLOOR}-0.31 returned (the vLLMs vllm-omni 0.24.0 was built "
                    f"for); vLLM {VLLM_VERSION}'s own {stand_in.NAME} predates it (it binds real TCP ports)")
    function = utils.get_engine_zmq_addresses
    assert is_ours(function, stand_in.DRIFT_POINT.entry.id) == (STATIC.host == HostKind.LACKS)
    config = _config(kind)
    result = function(config, num_api_servers) if num_api_servers != 1 else function(config)
    assert type(result) is utils.EngineZmqAddresses
    assert (result.coordinator_input, result.coordinator_output, result.frontend_stats_publish_address) == (
        None, None, None)
    inputs, outputs = OLD_RESULTS[(kind, num_api_servers)]
    found = tuple(["ipc" if a.startswith("ipc://") else a for a in side] for side in (result.inputs, result.outputs))
    assert found == (inputs, outputs), result
    ipc = [a for a in result.inputs + result.outputs if a.startswith("ipc://")]
    assert len(set(ipc)) == len(ipc)  # fresh paths, none shared
    result.coordinator_input = "tcp://127.0.0.1:1"  # vllm-omni's master-registered path sets these: mutable


# ---- unpatched, in place, out of place ----

@needs_omni
@needs_stand_in
@needs_startup_hook
def test_unpatched_the_importer_raises_import_error_and_imports_with_the_stand_in():
    """Unpatched, the importer raises the real ImportError on the removed name. With the stand-in in place it
    imports, or stops only where the native pair stops on this machine: vllm-omni 0.30.0's importer goes on, past the
    name, through ``stage_init_utils`` -> ... -> vLLM's qwen2_vl to transformers' image processing, which needs
    torchvision (absent here, the matrix uninstalls it; vllm-omni 0.30.0 on vLLM 0.30 stops there too)."""
    code = (f"import sys, vllm_compat\n"
            f"try:\n    import {IMPORTER} as m\nexcept ImportError as exc:\n    print('ImportError:', exc)\n"
            f"else:\n    print('imported', getattr(m.{stand_in.NAME}, '_vllm_compat_installed', None))\n"
            f"print('in place', getattr(getattr(sys.modules.get({stand_in.DRIFT_POINT.entry.target_module!r}), "
            f"{stand_in.NAME!r}, None), '_vllm_compat_installed', None))\n")
    unpatched = run_python(code, env={"VLLM_COMPAT_DISABLE_PATCHES": stand_in.DRIFT_POINT.entry.id}, timeout=400, warm=True)
    assert unpatched.returncode == 0, unpatched.stderr[-3000:]
    assert (f"ImportError: cannot import name '{stand_in.NAME}' from '{stand_in.DRIFT_POINT.entry.target_module}'"
            in unpatched.stdout), unpatched.stdout[-2000:]
    patched = run_python(code, timeout=400, warm=True)
    assert patched.returncode == 0, patched.stderr[-3000:]
    outcome = [line for line in patched.stdout.splitlines()
               if line.startswith(("imported ", "ImportError:", "in place "))]
    outcomes = [[f"imported {stand_in.DRIFT_POINT.entry.id}", f"in place {stand_in.DRIFT_POINT.entry.id}"]]
    if importlib.util.find_spec("torchvision") is None:
        outcomes.append(["ImportError: No module named 'torchvision'", f"in place {stand_in.DRIFT_POINT.entry.id}"])
    assert outcome in outcomes, patched.stdout[-2000:]


@needs_stand_in
def test_installed_on_import_and_revert_removes_it(utils):
    decisions = {d.name: d for d in vllm_compat.apply()}
    assert decisions[stand_in.DRIFT_POINT.entry.id].action == Action.PATCHED, decisions[stand_in.DRIFT_POINT.entry.id]
    installed = utils.get_engine_zmq_addresses
    assert installed is stand_in.get_engine_zmq_addresses and is_ours(installed, stand_in.DRIFT_POINT.entry.id)
    vllm_compat.apply()
    assert utils.get_engine_zmq_addresses is installed  # idempotent
    try:
        vllm_compat.revert()
        assert stand_in.NAME not in vars(utils)
        assert stand_in.DRIFT_POINT.uninstall(utils) is False
    finally:
        vllm_compat.apply()
    assert utils.get_engine_zmq_addresses is installed


@needs_stand_in
def test_calls_vllms_replacement_at_call_time(utils, monkeypatch):
    calls = []
    real = utils.get_engine_zmq_bind_addresses

    def wrapper(vllm_config, num_api_servers=1):
        calls.append(num_api_servers)
        return real(vllm_config, num_api_servers)

    monkeypatch.setattr(utils, "get_engine_zmq_bind_addresses", wrapper)
    utils.get_engine_zmq_addresses(_config("local"), 2)
    assert calls == [2]


@needs_stand_in
def test_refuses_a_replacement_of_another_shape(utils, monkeypatch):
    monkeypatch.setattr(utils, "get_engine_zmq_bind_addresses", lambda vllm_config: None)
    with pytest.raises(PatchRefusedError, match=r"get_engine_zmq_bind_addresses takes \('vllm_config',\)"):
        stand_in.DRIFT_POINT.prepare(utils, stand_in.DRIFT_POINT.detect_runtime(utils))


@needs_vllms_own
def test_stays_out_where_vllm_has_it(utils):
    cases.check_stays_out_where_vllm_defines_it(stand_in.DRIFT_POINT, utils)
