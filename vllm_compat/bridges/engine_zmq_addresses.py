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
from dataclasses import asdict, dataclass

from ..decide import Action, Decision
from ..errors import PatchRefusedError
from ..patches.catalogue import CATALOGUE
from . import (
    HostKind,
    StandInFacts,
    host_lookup,
    installed_omni_tree,
    omni_importers,
)
from ._name_stand_in import NameStandIn

ENTRY = next(e for e in CATALOGUE if e.module == __name__)
NAME = ENTRY.target
HOST_FILE = ENTRY.target_module.replace(".", "/") + ".py"
# The vllm-omni files that import it (0.24.0 and 0.30.0): read, never imported.
IMPORTERS = ("vllm_omni/engine/stage_engine_startup.py",)
# vLLM 0.32+'s function and classes the stand-in is built on, with the shapes it relies on.
REPLACEMENT = "get_engine_zmq_bind_addresses"
REPLACEMENT_PARAMS = ("vllm_config", "num_api_servers")  # num_api_servers with a default
BIND_CLASS, BIND_FIELDS = "EngineZmqBindAddresses", ("inputs", "outputs")
ADDRESSES_CLASS, ADDRESSES_REQUIRED = "EngineZmqAddresses", ("inputs", "outputs")  # the rest default to None
CALL_ARGS = ("vllm_config", "num_api_servers")  # what a vllm-omni call may pass, positionally or by name


class Shape:
    KNOWN = "known"
    UNKNOWN = "unknown"  # refused, with the detail
    ABSENT = "absent"  # vLLM not installed, or not yet imported


@dataclass(frozen=True)
class ZmqAddressesFacts:
    """A stand-in's facts (``host``, ``importers``) plus both shapes it is built between: ``replacement``, vLLM's
    0.32+ function and classes; ``callers``, vllm-omni's calls of the old name (``calls``: ``"module:line: ..."``
    each); ``detail`` says what was found where a shape is unknown."""

    host: str
    importers: tuple[str, ...] = ()
    replacement: str = Shape.ABSENT
    callers: str = Shape.ABSENT
    calls: tuple[str, ...] = ()
    detail: str = ""

    @property
    def stand_in(self) -> StandInFacts:
        return StandInFacts(self.host, self.importers)

    def to_dict(self) -> dict:
        return asdict(self)


def get_engine_zmq_addresses(vllm_config, num_api_servers: int = 1):
    """vLLM <= 0.31's frontend ZMQ addresses, with its default deferred TCP ports (stand-in by vllm_compat): vLLM
    0.32+'s ``get_engine_zmq_bind_addresses`` in an ``EngineZmqAddresses``."""
    utils = sys.modules[ENTRY.target_module]
    bind = getattr(utils, REPLACEMENT)(vllm_config, num_api_servers)
    return getattr(utils, ADDRESSES_CLASS)(inputs=list(bind.inputs), outputs=list(bind.outputs))


# ---- shapes: vLLM's replacement (files or live objects) and vllm-omni's calls (files) ----

def _replacement_from_source(source: str | None) -> tuple[str, str]:
    if source is None:
        return Shape.UNKNOWN, f"{HOST_FILE} is unreadable"
    tree = ast.parse(source)
    func = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == REPLACEMENT), None)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}

    def fields(name):  # (required, defaulted) annotated fields, None without the class
        if name not in classes:
            return None
        annotated = [n for n in classes[name].body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
        return (tuple(f.target.id for f in annotated if f.value is None),
                tuple(f.target.id for f in annotated if f.value is not None))

    if func is None:
        return Shape.UNKNOWN, f"{ENTRY.target_module} has neither {NAME} nor {REPLACEMENT}"
    params = tuple(a.arg for a in func.args.posonlyargs + func.args.args)
    extra = func.args.vararg or func.args.kwarg or func.args.kwonlyargs
    return _judge(params, len(func.args.defaults), bool(extra), fields(BIND_CLASS), fields(ADDRESSES_CLASS))


def _replacement_from_module(module) -> tuple[str, str]:
    import dataclasses
    import inspect

    func = vars(module).get(REPLACEMENT)
    if func is None:
        return Shape.UNKNOWN, f"{ENTRY.target_module} has neither {NAME} nor {REPLACEMENT}"
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


def _callers(tree) -> tuple[str, tuple[str, ...], str]:
    """(``Shape``, ``"module:line: ..."`` per call, detail) of vllm-omni's calls of the old name (``from
    vllm.v1.engine.utils import``, aliases followed; a method of the same name, ``self.get_engine_zmq_addresses``,
    is someone else's)."""
    calls, unknown = [], []
    for relpath in IMPORTERS:
        source = tree.read(relpath)
        if source is None:
            continue
        importer = relpath[:-3].replace("/", ".")
        parsed = ast.parse(source)
        bound = {alias.asname or alias.name for node in ast.walk(parsed) if isinstance(node, ast.ImportFrom)
                 and node.module == ENTRY.target_module and not node.level for alias in node.names
                 if alias.name == NAME}
        for node in ast.walk(parsed):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in bound):
                continue
            keywords = [k.arg for k in node.keywords]
            fits = (not any(isinstance(a, ast.Starred) for a in node.args) and None not in keywords
                    and len(node.args) <= len(CALL_ARGS) and set(keywords) <= set(CALL_ARGS[len(node.args):]))
            named = f", keywords {', '.join(keywords)}" if keywords else ""
            call = f"{importer}:{node.lineno}: {len(node.args)} positional{named}"
            calls.append(call)
            if not fits:
                unknown.append(call)
    calls.sort(key=lambda c: (c.split(":")[0], int(c.split(":")[1])))
    if unknown:
        return Shape.UNKNOWN, tuple(calls), (f"vllm-omni calls {NAME} with arguments the stand-in does not take "
                                             f"({'; '.join(unknown)}; it takes {', '.join(CALL_ARGS)})")
    return Shape.KNOWN, tuple(calls), ""


def _facts(host: str, omni_tree, replacement: tuple[str, str]) -> ZmqAddressesFacts:
    importers = omni_importers(omni_tree, IMPORTERS, ENTRY.target_module, NAME)
    callers, calls, caller_detail = _callers(omni_tree)
    detail = "; ".join(d for d in (replacement[1], caller_detail) if d)
    return ZmqAddressesFacts(host, importers, replacement[0], callers, calls, detail)


# ---- the drift-point interface (vllm_compat.patches) ----

STAND_IN = NameStandIn(ENTRY, IMPORTERS, removed_in="0.32", value=get_engine_zmq_addresses)
locate, install, uninstall, in_place, facts_dict = (STAND_IN.locate, STAND_IN.install, STAND_IN.uninstall,
                                                    STAND_IN.in_place, STAND_IN.facts_dict)


def detect_static(site) -> ZmqAddressesFacts:
    host = host_lookup(site.vllm_tree, ENTRY.target_module, NAME)
    needs_replacement = host in (HostKind.LACKS, HostKind.UNKNOWN)
    replacement = _replacement_from_source(site.vllm_tree.read(HOST_FILE)) if needs_replacement else (Shape.ABSENT, "")
    return _facts(host, site.omni_tree, replacement)


def detect_runtime(module) -> ZmqAddressesFacts:
    host = STAND_IN.host_in_module(module)
    replacement = _replacement_from_module(module) if host == HostKind.LACKS else (Shape.ABSENT, "")
    return _facts(host, installed_omni_tree(), replacement)


def decide(facts: ZmqAddressesFacts, controls) -> Decision:
    decision = STAND_IN.decide(facts.stand_in)
    if decision.action != Action.PATCHED:
        return decision
    if Shape.UNKNOWN in (facts.replacement, facts.callers):
        return ENTRY.decision(Action.REFUSED, f"vLLM lacks {ENTRY.target_path} and vllm-omni imports it, but the "
                              f"shapes are not the measured ones ({facts.detail}); left out. Set "
                              f"VLLM_COMPAT_DISABLE_PATCHES={ENTRY.id} to silence this, or upgrade vllm_compat")
    return ENTRY.decision(Action.PATCHED, f"{decision.reason}, over vLLM's {REPLACEMENT}")


def prepare(owner, facts: ZmqAddressesFacts):
    """The contract: the module does not define the name itself (ours may be there already), and its replacement
    has the shape the stand-in calls (checked on the live objects)."""
    value = STAND_IN.prepare(owner, facts.stand_in)
    shape, detail = _replacement_from_module(owner)
    if shape != Shape.KNOWN:
        raise PatchRefusedError(f"{ENTRY.target_path} cannot be provided: {detail}. Left out; set "
                                f"VLLM_COMPAT_DISABLE_PATCHES={ENTRY.id} to silence this, or upgrade vllm_compat.")
    return value




def compare(static: ZmqAddressesFacts, runtime: ZmqAddressesFacts) -> list[str]:
    differences = STAND_IN.compare(static.stand_in, runtime.stand_in)
    if HostKind.ABSENT not in (static.host, runtime.host) and static.replacement != runtime.replacement:
        differences.append(f"{REPLACEMENT} and its classes: {static.replacement} (files) != {runtime.replacement} "
                           f"(imported); {static.detail or runtime.detail}")
    if static.calls != runtime.calls:
        differences.append(f"vllm-omni's calls of {NAME}: {list(static.calls)} != {list(runtime.calls)}")
    return differences
