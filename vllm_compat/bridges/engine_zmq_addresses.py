"""Stand-in for ``vllm.v1.engine.utils.get_engine_zmq_addresses``, replaced in vLLM 0.32.0.

Why: vLLM <= 0.31 has ``get_engine_zmq_addresses(vllm_config, num_api_servers=1, *, defer_api_server_ports=True)
-> EngineZmqAddresses``; vLLM 0.32 replaced it by ``get_engine_zmq_bind_addresses(vllm_config, num_api_servers=1)
-> EngineZmqBindAddresses`` (``inputs`` / ``outputs`` only, the frontend binds them). vllm-omni 0.24.0 and 0.30.0
(the latter installed with vLLM's transformers range, as the matrix does) import the old name at module level in
``vllm_omni/engine/stage_engine_startup.py``, so on vLLM 0.32-0.33 that module, and every LLM stage startup and
remote-engine connection in it, dies with ``ImportError: cannot import name 'get_engine_zmq_addresses'``.
When: vLLM's ``vllm.v1.engine.utils`` lacks the name and an installed vllm-omni imports it (read from its files);
installed only where vllm-omni's calls pass ``vllm_config`` / ``num_api_servers`` and nothing else, and vLLM's
0.32+ function and both address classes have the shapes below (otherwise refused). A vLLM that defines it (<= 0.31)
keeps its own. It must be in place before that module is imported: the hook on ``vllm.v1.engine.utils`` (registered
by the startup ``.pth``) installs it.
Serves: vllm-omni 0.24.0 and 0.30.0 (installed with vLLM's transformers range) on vLLM 0.32-0.33 (vLLM <= 0.31 keeps
its own).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.v1.engine.utils.get_engine_zmq_addresses``.

The definition is the smallest that satisfies the callers: vllm-omni 0.24.0 calls it once,
``get_engine_zmq_addresses(vllm_config)`` in ``launch_stage_replica`` (colocated LLM replicas), then sets nothing
on the result and hands it to the engine handshake (``wait_for_engine_startup`` sends it in
``EngineHandshakeMetadata``) and to the stage client. Measured by calling the real functions (vLLM 0.24 / 0.31 old,
0.32 new; 0.33's, read from its wheel, has 0.32's signature and classes and differs only in when elastic EP forces
TCP; ``tests/bridges/test_engine_zmq_addresses.py``): with the default ``defer_api_server_ports=True`` the old
function returns an ``EngineZmqAddresses`` with ``num_api_servers`` addresses in ``inputs`` and in ``outputs``
(``coordinator_*`` and ``frontend_stats_publish_address`` left ``None``), the addresses the new one returns in its
``EngineZmqBindAddresses``: fresh ``ipc://`` paths where the frontend talks to colocated engines only, else
``tcp://<data_parallel_master_ip>:0`` placeholders. So the stand-in calls vLLM's ``get_engine_zmq_bind_addresses``
(looked up at each call, so a later wrapper of it is the one called) and copies its lists into vLLM's own
``EngineZmqAddresses``, the mutable class the handshake encodes. ``defer_api_server_ports`` is not taken (no
vllm-omni release passes it; ``False`` asked for pre-picked TCP ports, which vLLM 0.32+ no longer offers).
``revert()`` takes it off vLLM's module; a vllm-omni module that imported it already keeps its own reference, as
with every stand-in.
"""

from __future__ import annotations

import ast
import sys

from ..detect.source_tree import parse_source
from ._name_stand_in import FunctionStandIn, FunctionStandInFacts, Shape

MODULE, NAME = "vllm.v1.engine.utils", "get_engine_zmq_addresses"  # the catalogue row's target
HOST_FILE = MODULE.replace(".", "/") + ".py"
# The vllm-omni files that import it (0.24.0 and 0.30.0): read, never imported.
IMPORTERS = ("vllm_omni/engine/stage_engine_startup.py",)
# vLLM 0.32+'s function and classes the stand-in is built on, with the shapes it relies on.
REPLACEMENT = "get_engine_zmq_bind_addresses"
REPLACEMENT_PARAMS = ("vllm_config", "num_api_servers")  # num_api_servers with a default
BIND_CLASS, BIND_FIELDS = "EngineZmqBindAddresses", ("inputs", "outputs")
ADDRESSES_CLASS, ADDRESSES_REQUIRED = "EngineZmqAddresses", ("inputs", "outputs")  # the rest default to None
CALL_ARGS = ("vllm_config", "num_api_servers")  # what a vllm-omni call may pass, positionally or by name
ZmqAddressesFacts = FunctionStandInFacts


def get_engine_zmq_addresses(vllm_config, num_api_servers: int = 1):
    """vLLM <= 0.31's frontend ZMQ addresses, with its default deferred TCP ports (stand-in by vllm_compat): vLLM
    0.32+'s ``get_engine_zmq_bind_addresses`` in an ``EngineZmqAddresses``."""
    utils = sys.modules[MODULE]
    bind = getattr(utils, REPLACEMENT)(vllm_config, num_api_servers)
    return getattr(utils, ADDRESSES_CLASS)(inputs=list(bind.inputs), outputs=list(bind.outputs))


# ---- shapes: vLLM's replacement (files or live objects) and vllm-omni's calls (files) ----

def _replacement_from_source(source: str | None) -> tuple[str, str]:
    if source is None:
        return Shape.UNKNOWN, f"{HOST_FILE} is unreadable"
    tree = parse_source(source)
    func = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == REPLACEMENT), None)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def fields(name):  # (required, defaulted) annotated fields, None without the class
        if name not in classes:
            return None
        annotated = [n for n in classes[name].body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
        return (tuple(f.target.id for f in annotated if f.value is None),
                tuple(f.target.id for f in annotated if f.value is not None))

    if func is None:
        return Shape.UNKNOWN, f"{MODULE} has neither {NAME} nor {REPLACEMENT}"
    params = tuple(a.arg for a in func.args.posonlyargs + func.args.args)
    extra = func.args.vararg or func.args.kwarg or func.args.kwonlyargs
    return _judge(params, len(func.args.defaults), bool(extra), fields(BIND_CLASS), fields(ADDRESSES_CLASS))


def _replacement_from_module(module) -> tuple[str, str]:
    import dataclasses
    import inspect

    func = vars(module).get(REPLACEMENT)
    if func is None:
        return Shape.UNKNOWN, f"{MODULE} has neither {NAME} nor {REPLACEMENT}"
    parameters = list(inspect.signature(func).parameters.values())
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    extra = len(positional) != len(parameters)

    def fields(name):
        cls = vars(module).get(name)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            return None
        missing = dataclasses.MISSING
        found = dataclasses.fields(cls)
        return (tuple(f.name for f in found if f.default is missing and f.default_factory is missing),
                tuple(f.name for f in found if f.default is not missing or f.default_factory is not missing))

    defaults = sum(p.default is not p.empty for p in positional)
    return _judge(tuple(p.name for p in positional), defaults, extra, fields(BIND_CLASS), fields(ADDRESSES_CLASS))


def _judge(params, defaults: int, extra: bool, bind_fields, addresses_fields) -> tuple[str, str]:
    problems = []
    if params != REPLACEMENT_PARAMS or defaults != 1 or extra:
        problems.append(f"{REPLACEMENT} takes {params} ({defaults} with a default{', and more' if extra else ''}), "
                        f"not ({REPLACEMENT_PARAMS[0]}, {REPLACEMENT_PARAMS[1]}=1)")
    if bind_fields is None or bind_fields != (BIND_FIELDS, ()):
        problems.append(f"{BIND_CLASS} has fields {bind_fields} (required, defaulted), not {BIND_FIELDS}")
    if addresses_fields is None or addresses_fields[0] != ADDRESSES_REQUIRED:
        problems.append(f"{ADDRESSES_CLASS} has fields {addresses_fields} (required, defaulted); the stand-in fills "
                        f"{ADDRESSES_REQUIRED} only")
    if problems:
        return Shape.UNKNOWN, "; ".join(problems)
    return Shape.KNOWN, ""


# ---- the drift point ----

class EngineZmqAddressesStandIn(FunctionStandIn):
    importers = IMPORTERS
    removed_in = "0.32"
    call_args = CALL_ARGS
    built_on = REPLACEMENT

    def build(self, owner):
        return get_engine_zmq_addresses

    def replacement_from_files(self, site) -> tuple[str, str]:
        return _replacement_from_source(site.vllm_tree.read(HOST_FILE))

    def replacement_from_module(self, module) -> tuple[str, str]:
        return _replacement_from_module(module)


DRIFT_POINT = EngineZmqAddressesStandIn()
