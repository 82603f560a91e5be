"""What the ``wait_for_engine_startup`` call adapters share: one per vllm-omni module that makes the old call.

vLLM 0.28.0 kept ``vllm.v1.engine.utils.wait_for_engine_startup`` but changed its call from 8 arguments
``(handshake_socket, addresses, core_engines, parallel_config, coordinated_dp, cache_config, proc_manager,
coord_process)`` to 6, ``(handshake_socket, core_engines, parallel_config, coordinated_dp, cache_config, launch)``,
with addresses, engine manager and coordinator in one ``CoreEngineLaunch``. vllm-omni 0.24.0 makes the old call in
more than one module; each such module is its own catalogue entry (its own import hook, decision and binding), and
its drift-point module derives ``CallAdapter``, built here, so the shape checks, the launch object and
the adapter are written once.

How: the caller module's own binding ``wait_for_engine_startup`` (from its ``from vllm.v1.engine.utils import``) is
rebound to an adapter with the old signature that builds the ``CoreEngineLaunch`` as vLLM 0.28+'s
``launch_core_engines`` does: ``engine_manager`` the proc manager, ``coordinator`` the coordinator (the old call
passes only its process; the new body reads ``launch.coordinator.proc`` and nothing else of it), ``addresses``,
``tensor_queue=None`` (the old call has none, and the body never reads it), and calls vLLM's function. The new
body watches the engine manager's processes only when it ``isinstance`` of ``CoreEngineProcManager``; a manager
that is not one (vllm-omni 0.24.0's ``StageDiffusionProcManager``: vLLM 0.24 just called ``sentinels()``) passed
as is would leave the front end polling forever when an engine process dies during startup, so it goes through a
``CoreEngineProcManager`` subclass view that forwards ``sentinels`` / ``finished_procs`` (all the body calls), and
fails as on vLLM 0.24: ``RuntimeError: Engine core initialization failed ...``. ``None`` (remote engines, no local
processes) stays ``None``, as ``launch_core_engines`` leaves it for zero local engines. Before installing, the new
body's reads of ``launch`` must be what the adapter fills; uninstall puts back the exact original binding.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import textwrap
from dataclasses import asdict, dataclass

from ..decide import Action, Decision
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, mark, replace, restore, unwrap
from ..errors import PatchRefusedError
from . import calls_of

NAME = "wait_for_engine_startup"  # vLLM's function, and each caller module's binding of it
CALLEE_MODULE = "vllm.v1.engine.utils"
CALLEE_FILE = "vllm/v1/engine/utils.py"
LAUNCH_CLASS = "CoreEngineLaunch"
PROC_MANAGER_CLASS = "CoreEngineProcManager"
# vLLM <= 0.27.
ADDRESSES_PARAMS = ("handshake_socket", "addresses", "core_engines", "parallel_config", "coordinated_dp",
                    "cache_config", "proc_manager", "coord_process")
# vLLM >= 0.28 (CoreEngineLaunch, "Resources and startup barrier for launched engine processes").
LAUNCH_PARAMS = ("handshake_socket", "core_engines", "parallel_config", "coordinated_dp", "cache_config", "launch")
# What the adapter puts in the launch object, and what of the objects in it the new body may use.
LAUNCH_FILLED = ("engine_manager", "coordinator", "addresses", "tensor_queue")
LAUNCH_READS = {"engine_manager": {"sentinels", "finished_procs"}, "coordinator": {"proc"}, "addresses": set(),
                "tensor_queue": set(), "watched_frontend_processes": set()}  # the last keeps its default, ()
VARIANT = "core_engine_launch"  # named by the upstream call shape it serves


class CallShape:
    ADDRESSES = "addresses"  # the 8-argument call (vLLM <= 0.27)
    LAUNCH = "launch"  # the 6-argument call with a CoreEngineLaunch (vLLM >= 0.28)
    NO_CALL = "no_call"  # the vllm-omni module does not call it
    ABSENT = "absent"  # the package (or the module file) is not installed
    UNKNOWN = "unknown"  # a shape the adapter does not know: refused


@dataclass(frozen=True)
class CallShapes:
    """Both sides of the call: the callee's shape (vLLM's function), the caller's (the vllm-omni module's calls,
    each ``"line N: shape"``), and what was found where a side is not a known shape."""

    callee: str
    caller: str
    calls: tuple[str, ...] = ()
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


# ---- shapes, from source (the static and the runtime detection share these) ----

def _launch_reads(func: ast.FunctionDef) -> list[str]:
    """``launch`` uses in ``func`` that the adapter's launch object does not provide (empty: all are provided)."""
    parents = {child: node for node in ast.walk(func) for child in ast.iter_child_nodes(node)}
    unprovided = []
    for node in ast.walk(func):
        if not (isinstance(node, ast.Name) and node.id == "launch" and isinstance(node.ctx, ast.Load)):
            continue
        attribute = parents.get(node)
        if not isinstance(attribute, ast.Attribute) or attribute.attr not in LAUNCH_READS:
            unprovided.append(f"launch.{attribute.attr}" if isinstance(attribute, ast.Attribute) else "launch itself")
            continue
        outer = parents.get(attribute)
        if isinstance(outer, ast.Attribute) and outer.attr not in LAUNCH_READS[attribute.attr]:
            unprovided.append(f"launch.{attribute.attr}.{outer.attr}")
    return sorted(set(unprovided))


def _launch_fields(module_tree: ast.Module) -> tuple[list[str], list[str]] | None:
    """(fields without default, fields with one) of the ``CoreEngineLaunch`` class in ``module_tree``."""
    cls = next((n for n in module_tree.body if isinstance(n, ast.ClassDef) and n.name == LAUNCH_CLASS), None)
    if cls is None:
        return None
    fields = [n for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    return [f.target.id for f in fields if f.value is None], [f.target.id for f in fields if f.value is not None]


def classify_callee(func: ast.FunctionDef | None, module_tree: ast.Module | None = None) -> tuple[str, str]:
    """(``CallShape``, detail) of vLLM's function; for the launch shape, ``module_tree`` (vLLM's module) must
    define ``CoreEngineLaunch`` with the fields the adapter fills, and the body may read only what it fills."""
    if func is None:
        return CallShape.UNKNOWN, f"{CALLEE_MODULE} has no function {NAME}"
    params = tuple(a.arg for a in func.args.posonlyargs + func.args.args)
    extra = func.args.vararg or func.args.kwarg or func.args.kwonlyargs
    if params == ADDRESSES_PARAMS and not extra:
        return CallShape.ADDRESSES, f"{NAME}({', '.join(params)})"
    if params != LAUNCH_PARAMS or extra:
        return CallShape.UNKNOWN, f"{NAME}({ast.unparse(func.args)}) is neither known signature"
    fields = _launch_fields(module_tree) if module_tree is not None else None
    if fields is None:
        return CallShape.UNKNOWN, f"{NAME} takes launch, but {CALLEE_MODULE} defines no {LAUNCH_CLASS}"
    required, _ = fields
    unfilled = [name for name in required if name not in LAUNCH_FILLED]
    unprovided = _launch_reads(func)
    if unfilled or unprovided or not set(LAUNCH_FILLED) <= set(fields[0] + fields[1]):
        return CallShape.UNKNOWN, (f"{NAME} takes launch, but {LAUNCH_CLASS} has required fields {required} (the "
                                   f"adapter fills {list(LAUNCH_FILLED)}) and the body uses "
                                   f"{unprovided or 'nothing else'} beyond what it fills")
    return CallShape.LAUNCH, f"{NAME}({', '.join(params)}: {LAUNCH_CLASS})"


def _fits(call: ast.Call, params: tuple[str, ...]) -> bool:
    keywords = [k.arg for k in call.keywords]
    return len(call.args) <= len(params) and sorted(keywords) == sorted(params[len(call.args):])


def classify_caller(source: str) -> tuple[str, tuple[str, ...], str]:
    """(``CallShape``, ``"line N: shape"`` per call, detail) of the calls of vLLM's function in a vllm-omni
    module's ``source``; the name must come from ``from vllm.v1.engine.utils import`` (aliases followed)."""
    from . import imports_name

    try:
        found = calls_of(source, CALLEE_MODULE, NAME)
    except SyntaxError as exc:
        return CallShape.UNKNOWN, (), f"source does not parse: {exc.msg} (line {exc.lineno})"
    if not found and not imports_name(source, CALLEE_MODULE, NAME):
        return CallShape.NO_CALL, (), f"it does not import {NAME} from {CALLEE_MODULE}"
    calls, shapes = [], set()
    for node in found:
        starred = any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords)
        fits = {shape for shape, params in ((CallShape.ADDRESSES, ADDRESSES_PARAMS),
                                            (CallShape.LAUNCH, LAUNCH_PARAMS)) if _fits(node, params)}
        shape = fits.pop() if len(fits) == 1 and not starred else CallShape.UNKNOWN
        shapes.add(shape)
        calls.append(f"line {node.lineno}: {shape} ({len(node.args)} positional"
                     f"{', keywords ' + ', '.join(str(k.arg) for k in node.keywords) if node.keywords else ''})")
    calls.sort(key=lambda c: int(c.split(":")[0].split()[1]))
    if not calls:
        return CallShape.NO_CALL, (), f"it imports {NAME} but never calls it"
    if len(shapes) == 1:
        return shapes.pop(), tuple(calls), ""
    return CallShape.UNKNOWN, tuple(calls), "its calls have different or unrecognized shapes"


def callee_from_module_source(source: str | None) -> tuple[str, str]:
    if source is None:
        return CallShape.UNKNOWN, f"{CALLEE_FILE} is unreadable"
    tree = parse_source(source)
    func = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == NAME), None)
    return classify_callee(func, tree)


def _shapes(callee: tuple[str, str], caller: tuple[str, tuple[str, ...], str]) -> CallShapes:
    details = [f"callee: {callee[1]}" if callee[1] else "", f"caller: {caller[2]}" if caller[2] else ""]
    return CallShapes(callee[0], caller[0], caller[1], "; ".join(d for d in details if d))


# ---- the adapter ----

class _CoordinatorView:
    """What the launch-shaped body reads of a ``DPCoordinator`` (``.proc``), around the process the old call passes."""

    __slots__ = ("proc",)

    def __init__(self, proc) -> None:
        self.proc = proc


@functools.cache
def _proc_manager_view_type(proc_manager_cls: type, entry_id: str) -> type:
    class ProcManagerView(proc_manager_cls):
        """A ``CoreEngineProcManager`` for the launch-shaped body's ``isinstance`` test, forwarding the two methods
        it calls to a proc manager that is not one (vLLM <= 0.27 duck-typed it). Built without the base's
        ``__init__``, which would start engine processes."""

        def __init__(self, manager) -> None:  # noqa: D107 - never calls the base: it launches processes
            self._vllm_compat_manager = manager

        def sentinels(self):
            return self._vllm_compat_manager.sentinels()

        def finished_procs(self):
            return self._vllm_compat_manager.finished_procs()

    return mark(ProcManagerView, entry_id)


def as_launch(launch_cls: type, proc_manager_cls: type, addresses, proc_manager, coord_process, entry_id: str):
    """The ``CoreEngineLaunch`` vLLM 0.28+'s ``launch_core_engines`` would have built for the old call's values."""
    if proc_manager is not None and not isinstance(proc_manager, proc_manager_cls):
        proc_manager = _proc_manager_view_type(proc_manager_cls, entry_id)(proc_manager)
    coordinator = _CoordinatorView(coord_process) if coord_process is not None else None
    return launch_cls(engine_manager=proc_manager, coordinator=coordinator, addresses=addresses, tensor_queue=None)


def make_adapter(original, launch_cls: type, proc_manager_cls: type, entry_id: str, caller_module: str):
    """A function with the 8-argument signature that calls ``original`` (the 6-argument one) with a launch object,
    marked as ``entry_id``'s."""

    def adapter(handshake_socket, addresses, core_engines, parallel_config, coordinated_dp, cache_config,
                proc_manager, coord_process):
        launch = as_launch(launch_cls, proc_manager_cls, addresses, proc_manager, coord_process, entry_id)
        return original(handshake_socket, core_engines, parallel_config, coordinated_dp, cache_config, launch)

    adapter.__name__, adapter.__qualname__ = original.__name__, original.__qualname__
    adapter.__doc__ = (f"vllm_compat's adapter ({entry_id}): {caller_module}'s vLLM <= 0.27 call of "
                       f"{CALLEE_MODULE}.{NAME}, forwarded to the 0.28+ one with a {LAUNCH_CLASS}.")
    adapter.__wrapped__ = original
    adapter.__signature__ = inspect.Signature(  # the call it takes, not the wrapped one's
        [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD) for name in ADDRESSES_PARAMS])
    return mark(adapter, entry_id)


@dataclass(frozen=True)
class _Target:
    original: object  # the caller module's binding: vLLM's function
    launch_cls: type
    proc_manager_cls: type


class CallAdapter(DriftPoint):
    """The drift point for one caller module: the catalogue row's ``target_module`` is the vllm-omni module whose
    binding of ``wait_for_engine_startup`` is adapted. Each caller module's drift-point module defines a subclass
    (its row is found by the subclass's module) and exports one instance."""

    @property
    def caller_file(self) -> str:
        return self.target_module.replace(".", "/") + ".py"

    @property
    def handles_drift(self):
        return (("call", f"*.{NAME}", f"{self.target_module}.*", "*"),)

    def make_adapter(self, original, launch_cls: type, proc_manager_cls: type):
        return make_adapter(original, launch_cls, proc_manager_cls, self.id, self.target_module)

    def detect_static(self, site) -> CallShapes:
        if not site.vllm_tree.has_package("vllm"):
            callee = (CallShape.ABSENT, "vLLM is not installed")
        else:
            callee = callee_from_module_source(site.vllm_tree.read(CALLEE_FILE))
        caller_source = site.omni_tree.read(self.caller_file)
        if caller_source is None:
            caller = (CallShape.ABSENT, (), f"{self.caller_file} is not installed")
        else:
            caller = classify_caller(caller_source)
        return _shapes(callee, caller)

    def detect_runtime(self, module) -> CallShapes:
        """The caller's shape from the module's source file; the callee's from the live function's source, which
        must agree with its ``inspect.signature``."""
        try:
            caller = classify_caller(inspect.getsource(module))
        except (OSError, TypeError) as exc:
            caller = (CallShape.UNKNOWN, (), f"source of {module.__name__} is unavailable ({exc})")
        vllm_utils = sys.modules.get(CALLEE_MODULE)
        func = getattr(vllm_utils, NAME, None) if vllm_utils is not None else None
        if func is None:
            return _shapes((CallShape.UNKNOWN, f"{CALLEE_MODULE}.{NAME} is not loaded"), caller)
        func = unwrap(func)
        try:
            callee_tree = ast.parse(inspect.getsource(vllm_utils))
            parsed = next(iter(ast.parse(textwrap.dedent(inspect.getsource(func))).body), None)
        except (OSError, TypeError, SyntaxError) as exc:
            return _shapes((CallShape.UNKNOWN, f"source of {CALLEE_MODULE}.{NAME} is unavailable ({exc})"), caller)
        callee = classify_callee(parsed if isinstance(parsed, ast.FunctionDef) else None, callee_tree)
        live = tuple(inspect.signature(func, follow_wrapped=False).parameters)
        expected = {CallShape.ADDRESSES: ADDRESSES_PARAMS, CallShape.LAUNCH: LAUNCH_PARAMS}.get(callee[0], live)
        if live != expected:
            callee = (CallShape.UNKNOWN, f"the live {NAME} takes {live}, its source {expected}")
        return _shapes(callee, caller)

    def decide(self, shapes: CallShapes, controls) -> Decision:
        if CallShape.ABSENT in (shapes.callee, shapes.caller):
            return self.decision(Action.PENDING, f"{shapes.detail}; decided when {self.target_module} is imported")
        if CallShape.UNKNOWN in (shapes.callee, shapes.caller):
            return self.decision(Action.REFUSED, f"call shapes not recognized ({shapes.detail}; calls: "
                                  f"{list(shapes.calls) or 'none'}); left unadapted. Set "
                                  f"VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, or upgrade vllm_compat")
        if shapes.caller == CallShape.NO_CALL:
            return self.decision(Action.SKIPPED, f"{self.target_module}: {shapes.detail.removeprefix('caller: ')}")
        if shapes.caller == shapes.callee:
            return self.decision(Action.SKIPPED, f"vllm-omni calls {NAME} the way this vLLM takes it "
                                  f"({shapes.callee})")
        if shapes.caller == CallShape.ADDRESSES:
            return self.decision(Action.PATCHED, f"vllm-omni calls {NAME} with 8 arguments (addresses, "
                                  f"proc_manager, coord_process); this vLLM takes 6 with a {LAUNCH_CLASS}; adapted",
                                  VARIANT)
        return self.decision(Action.REFUSED, f"vllm-omni calls {NAME} with a {LAUNCH_CLASS} (vLLM >= "
                              f"0.28), but this vLLM takes the 8-argument form; vllm_compat adapts only old callers "
                              f"to new vLLMs. Use vLLM >= 0.28 with this vllm-omni")

    def prepare(self, owner, shapes: CallShapes) -> _Target:
        """The contract: the module's binding is vLLM's live function (or our adapter around it), that function
        takes ``launch``, and vLLM defines the classes the adapter builds on. Returns what ``install`` needs."""
        from dataclasses import MISSING, fields, is_dataclass

        vllm_utils = sys.modules.get(CALLEE_MODULE)
        live = getattr(vllm_utils, NAME, None)
        bound = unwrap(vars(owner).get(NAME))
        launch_cls = getattr(vllm_utils, LAUNCH_CLASS, None)
        proc_manager_cls = getattr(vllm_utils, PROC_MANAGER_CLASS, None)
        problems = []
        if bound is None or bound is not live:
            problems.append(f"{owner.__name__}.{NAME} is {bound!r}, not {CALLEE_MODULE}.{NAME} ({live!r})")
        if live is not None and tuple(inspect.signature(live, follow_wrapped=False).parameters) != LAUNCH_PARAMS:
            problems.append(f"{CALLEE_MODULE}.{NAME}{inspect.signature(live, follow_wrapped=False)} does not take "
                            f"({', '.join(LAUNCH_PARAMS)})")
        if not (isinstance(launch_cls, type) and is_dataclass(launch_cls)):
            problems.append(f"{CALLEE_MODULE}.{LAUNCH_CLASS} is {launch_cls!r}, not a dataclass")
        else:
            names = {f.name: f for f in fields(launch_cls)}
            required = [n for n, f in names.items() if f.default is MISSING and f.default_factory is MISSING]
            if not set(LAUNCH_FILLED) <= set(names) or not set(required) <= set(LAUNCH_FILLED):
                problems.append(f"{LAUNCH_CLASS} has fields {list(names)} (required {required}); the adapter fills "
                                f"{list(LAUNCH_FILLED)}")
        if not isinstance(proc_manager_cls, type):
            problems.append(f"{CALLEE_MODULE}.{PROC_MANAGER_CLASS} is {proc_manager_cls!r}, not a class")
        if problems:
            raise PatchRefusedError(f"{self.target_path} cannot be adapted: {'; '.join(problems)}. Left as it is; "
                                    f"set VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, or upgrade "
                                    f"vllm_compat.")
        return _Target(live, launch_cls, proc_manager_cls)

    def install(self, owner, decision: Decision, target: _Target) -> bool:
        """Rebind the module's name to the adapter; False when ours is already there."""
        return replace(owner, NAME, lambda original: self.make_adapter(target.original, target.launch_cls,
                                                                       target.proc_manager_cls), self.id)

    def uninstall(self, owner) -> bool:
        """Put back the exact object the module had bound; False when the binding is not this entry's adapter."""
        return restore(owner, NAME, self.id)

    def compare(self, static: CallShapes, runtime: CallShapes) -> list[str]:
        differences = []
        if static.callee != runtime.callee and CallShape.ABSENT not in (static.callee, runtime.callee):
            differences.append(f"{CALLEE_MODULE}.{NAME}: {static.callee} (files) != {runtime.callee} (imported)")
        if static.caller != runtime.caller or static.calls != runtime.calls:
            differences.append(f"{self.target_module}'s calls: {static.caller} {list(static.calls)} (files) != "
                               f"{runtime.caller} {list(runtime.calls)} (imported)")
        return differences

