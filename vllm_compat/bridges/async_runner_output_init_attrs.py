"""Adapter for vllm-omni's ``OmniAsyncGPUModelRunnerOutput.get_output``: the state vLLM 0.25-0.33's ``__init__`` sets.

Why: vllm-omni 0.24.0's ``OmniAsyncGPUModelRunnerOutput`` (the AR stage's output under async scheduling with
``async_chunk``) derives vLLM's ``AsyncGPUModelRunnerOutput`` but never runs its ``__init__``: it sets the
attributes vLLM 0.24's ``__init__`` set, then its ``get_output`` calls vLLM's. vLLM has since added the EP fault
check (0.25: ``self._has_fault``) and NaN counting (0.28: ``self._num_nans``, ``self._num_nans_cpu``) to the class,
set in ``__init__``, read or deleted by ``get_output``, so every AR step of that path dies on vLLM 0.25-0.33 with
``AttributeError: 'OmniAsyncGPUModelRunnerOutput' object has no attribute '_num_nans_cpu'`` (``'_has_fault'`` before
0.28; vllm-omni's own ``test_omni_async_gpu_model_runner_output_builds_lazily_once`` fails on it).
When: vLLM's ``__init__`` sets attributes its other methods read that vllm-omni's subclass, not calling that
``__init__``, never sets (all read from the files with ``ast``): vllm-omni's ``get_output`` first gives the object
each one it lacks, with the value vLLM's ``__init__`` would give it called as vllm-omni is (the parameters vllm-omni
does not take at their defaults: ``num_nans=None``, ``check_ep_fault=False``, so all three None: no NaN counts ride
the copy and no EP fault is checked, as vllm-omni's runner passes neither), then runs vllm-omni's own. Nothing is
set where vLLM's ``__init__`` adds nothing the subclass lacks (0.24) or vllm-omni's calls it; a value the files do
not tell is refused.
Serves: vllm-omni 0.24.0 on vLLM 0.25-0.33 (read from the 0.24.0, 0.25.0, 0.25.1, 0.30, 0.33 and 0.34 wheels;
reproduced on CPU on 0.25.1 and 0.30; 0.34 has no V1 model runner, so that stage is left out there).
Retire when: the oldest supported vllm-omni's ``OmniAsyncGPUModelRunnerOutput`` calls vLLM's ``__init__`` or sets
what it sets.

The attributes go on the instance (not the class), before vllm-omni's ``get_output`` runs: vLLM's deletes
``self._num_nans``, which a class default would not survive, and vllm-omni's own tests build the object with
``object.__new__``, so a wrapped ``__init__`` would not reach them. vllm-omni's generation runner and its NPU runners
build vLLM's own class (its ``__init__`` runs): nothing to do there.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, replace, restore

VLLM_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
OMNI_RUNNER = "vllm_omni/worker/gpu_ar_model_runner.py"
VLLM_CLASS = "AsyncGPUModelRunnerOutput"
CLASS_NAME, METHOD = "OmniAsyncGPUModelRunnerOutput", "get_output"  # the catalogue row's target
UNKNOWN = "<not told by the files>"  # a value the reading of vLLM's __init__ cannot tell


class Shape:
    NOT_INSTALLED = "not-installed"  # vLLM or vllm-omni not installed
    NO_V1_RUNNER = "no-v1-runner"  # vLLM has no V1 gpu_model_runner / AsyncGPUModelRunnerOutput (0.34 removed it)
    NO_SUBCLASS = "no-subclass"  # vllm-omni's AR runner defines no subclass of it
    CALLS_INIT = "calls-init"  # vllm-omni's subclass runs vLLM's __init__
    FITS = "fits"  # it sets everything vLLM's methods read (vLLM 0.24)
    LACKS = "lacks"  # it lacks attributes vLLM's __init__ sets and its methods read (vLLM 0.30, 0.33)


@dataclass(frozen=True)
class InitAttrsFacts:
    shape: str
    fills: tuple[tuple[str, object], ...] = ()  # (attribute, value vLLM's __init__ gives it called as vllm-omni is)
    own_get_output: bool = True  # vllm-omni's subclass defines get_output (what is wrapped)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def unknown(self) -> tuple[str, ...]:
        return tuple(name for name, value in self.fills if value == UNKNOWN)


# ---- reading the files ----

def find_class(tree, name: str | None = None, base: str | None = None):
    """The top-level class named ``name``, or the first deriving a class named ``base``; None otherwise."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and (node.name == name or base in {
                getattr(b, "id", None) or getattr(b, "attr", None) for b in node.bases}):
            return node
    return None


def methods(cls) -> dict:
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def self_attributes(nodes, contexts) -> set[str]:
    """The ``self.<name>`` attributes under ``nodes`` used in ``contexts`` (``ast.Store`` / ``Load`` / ``Del``)."""
    return {n.attr for node in nodes for n in ast.walk(node) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == "self" and isinstance(n.ctx, contexts)}


def calls_base_init(init) -> bool:
    """Whether ``init`` calls ``super().__init__(...)`` or ``<base>.__init__(...)``."""
    return init is not None and any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                                    and n.func.attr == "__init__" for n in ast.walk(init))


def taken_parameters(init) -> set[str]:
    """The parameters vllm-omni's ``__init__`` takes: its named ones and the keys it pops from ``**kwargs``."""
    if init is None:
        return set()
    args = init.args
    taken = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
    if args.kwarg is not None:
        taken |= {c.args[0].value for c in ast.walk(init) if isinstance(c, ast.Call)
                  and isinstance(c.func, ast.Attribute) and c.func.attr in ("pop", "get")
                  and getattr(c.func.value, "id", None) == args.kwarg.arg
                  and c.args and isinstance(c.args[0], ast.Constant)}
    return taken


def init_values(init, taken: set[str]) -> dict[str, object]:
    """What vLLM's ``__init__`` assigns to each ``self.<name>`` when called as vllm-omni is: its parameters vllm-omni
    does not take at their (literal) defaults, the ones it takes unknown. Follows plain assignments, ``with`` blocks,
    ``if`` on a known test, conditional expressions and ``is (not) None``; anything else is ``UNKNOWN``."""
    args = init.args
    positional = args.posonlyargs + args.args
    params = dict.fromkeys((a.arg for a in positional + args.kwonlyargs), UNKNOWN)
    defaults = list(zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True))
    defaults += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None]
    for arg, default in defaults:
        if arg.arg not in taken and isinstance(default, ast.Constant):
            params[arg.arg] = default.value
    values: dict[str, object] = {}

    def value(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return params.get(node.id, UNKNOWN)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return values.get(node.attr, UNKNOWN)
        if isinstance(node, ast.IfExp):
            test = value(node.test)
            return UNKNOWN if test == UNKNOWN else value(node.body if test else node.orelse)
        if (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.Is, ast.IsNot))
                and isinstance(node.comparators[0], ast.Constant) and node.comparators[0].value is None):
            left = value(node.left)
            return UNKNOWN if left == UNKNOWN else (left is None) == isinstance(node.ops[0], ast.Is)
        return UNKNOWN

    def run(body, known=True):
        for stmt in body:
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
                found = value(stmt.value) if known else UNKNOWN
                for name in self_attributes(stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target], ast.Store):
                    values[name] = found
            elif isinstance(stmt, ast.If):
                test = value(stmt.test) if known else UNKNOWN
                if test == UNKNOWN:
                    run(stmt.body, False)
                    run(stmt.orelse, False)
                else:
                    run(stmt.body if test else stmt.orelse, known)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                run(stmt.body, known)
            else:  # a loop, a try, ...: what it assigns is not told
                for name in self_attributes([stmt], ast.Store):
                    values[name] = UNKNOWN

    run(init.body)
    return values


def facts_of(vllm_tree, omni_tree) -> InitAttrsFacts:
    if not (vllm_tree.has_package("vllm") and omni_tree.has_package("vllm_omni")):
        return InitAttrsFacts(Shape.NOT_INSTALLED)
    runner = vllm_tree.read(VLLM_RUNNER)
    base = find_class(parse_source(runner), name=VLLM_CLASS) if runner is not None else None
    base_init = methods(base).get("__init__") if base is not None else None
    if base_init is None:
        return InitAttrsFacts(Shape.NO_V1_RUNNER)
    omni_runner = omni_tree.read(OMNI_RUNNER)
    cls = find_class(parse_source(omni_runner), base=VLLM_CLASS) if omni_runner is not None else None
    if cls is None:
        return InitAttrsFacts(Shape.NO_SUBCLASS)
    own = methods(cls)
    if calls_base_init(own.get("__init__")):
        return InitAttrsFacts(Shape.CALLS_INIT)
    readers = [node for name, node in methods(base).items() if name != "__init__"]
    needed = self_attributes(readers, (ast.Load, ast.Del)) & self_attributes([base_init], ast.Store)
    missing = sorted(needed - self_attributes([cls], ast.Store))
    if not missing:
        return InitAttrsFacts(Shape.FITS)
    values = init_values(base_init, taken_parameters(own.get("__init__")))
    return InitAttrsFacts(Shape.LACKS, tuple((name, values.get(name, UNKNOWN)) for name in missing), METHOD in own)


# ---- the drift point ----

class AsyncRunnerOutputInitAttrs(DriftPoint):
    handles_drift = (("attribute", "*.AsyncGPUModelRunnerOutput.*", "*.OmniAsyncGPUModelRunnerOutput", "*"),)

    def detect_static(self, site) -> InitAttrsFacts:
        return facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> InitAttrsFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def decide(self, facts: InitAttrsFacts, controls=None):
        if facts.shape == Shape.NOT_INSTALLED:
            return self.decision(Action.PENDING, "vLLM or vllm-omni is not installed; decided when vllm-omni's AR "
                                 "runner is imported")
        if facts.shape == Shape.NO_V1_RUNNER:
            return self.decision(Action.SKIPPED, f"vLLM has no V1 {VLLM_CLASS} ({VLLM_RUNNER} is absent, removed in "
                                 "0.34): vllm-omni's AR runner does not run on this vLLM, so there is nothing to fill")
        if facts.shape == Shape.NO_SUBCLASS:
            return self.decision(Action.SKIPPED, f"the installed vllm-omni's AR runner defines no {VLLM_CLASS} "
                                 "subclass")
        if facts.shape == Shape.CALLS_INIT:
            return self.decision(Action.SKIPPED, f"vllm-omni's {CLASS_NAME} runs vLLM's __init__")
        if facts.shape == Shape.FITS:
            return self.decision(Action.SKIPPED, f"vllm-omni's {CLASS_NAME} sets everything vLLM's {VLLM_CLASS} "
                                 "methods read (as on vLLM 0.24)")
        if facts.unknown or not facts.own_get_output:
            return self.refused(f"vllm-omni's {CLASS_NAME} lacks {', '.join(n for n, _ in facts.fills)}, but "
                                + (f"the value vLLM's __init__ gives {', '.join(facts.unknown)} is not told by its "
                                   "file" if facts.unknown else f"it defines no {METHOD} of its own to fill them in"))
        fills = ", ".join(f"{name}={value!r}" for name, value in facts.fills)
        return self.decision(Action.PATCHED, f"vLLM's {VLLM_CLASS}.__init__ sets what its methods read and vllm-omni's "
                             f"{CLASS_NAME} (not running it) lacks; its {METHOD} first sets {fills}, as vLLM's "
                             "__init__ does called as vllm-omni is")

    def locate(self, module):
        cls = getattr(module, CLASS_NAME, None)
        return cls if isinstance(cls, type) else None

    def in_place(self, owner):
        return vars(owner).get(METHOD) if owner is not None else None

    def prepare(self, owner, facts: InitAttrsFacts):
        """The contract: vllm-omni's class defines its own ``get_output`` (never vLLM's is wrapped) and no class-level
        value of the attributes filled in; returns the ``(name, value)`` pairs to fill."""
        from ..errors import PatchRefusedError

        if owner is None or not callable(vars(owner).get(METHOD)):
            raise PatchRefusedError(f"{CLASS_NAME} defines no {METHOD} of its own ({owner!r}); vLLM's is never "
                                    "wrapped, so it is left as it is.")
        defined = [name for name, _ in facts.fills if hasattr(owner, name)]
        if defined:
            raise PatchRefusedError(f"{CLASS_NAME} has {', '.join(defined)} at class level, which the files did not "
                                    "show; left as it is.")
        return facts.fills

    def install(self, owner, decision, state) -> bool:
        fills = tuple(state)

        def make_wrapper(original):
            @functools.wraps(original)
            def get_output(self, *args, **kwargs):
                attributes = self.__dict__
                for name, value in fills:  # on the instance: vLLM's get_output deletes some of them
                    if name not in attributes:
                        attributes[name] = value
                return original(self, *args, **kwargs)

            return get_output

        return replace(owner, METHOD, make_wrapper, self.id)

    def uninstall(self, owner) -> bool:
        return restore(owner, METHOD, self.id)


DRIFT_POINT = AsyncRunnerOutputInitAttrs()
