"""The shared base of the adapters for a vLLM runner method whose returned tuple grew under vllm-omni's unpack.

vllm-omni's model runners copy vLLM's ``execute_model`` / ``sample_tokens`` and unpack what vLLM's
``GPUModelRunner`` helpers return (``_prepare_inputs``, ``_bookkeeping_sync``). When vLLM adds a value to such a tuple,
every step of vllm-omni's runner dies with ``ValueError: too many values to unpack``. The adapter gives vllm-omni,
inside its own caller on that runner only, the values it unpacks in its order; everywhere else vLLM's method is
vLLM's, unchanged (vLLM's own callers expect the longer tuple).

How: a method of the same name is put on vllm-omni's class (``provide``; it calls vLLM's through ``super()``) and
vllm-omni's caller is wrapped (``replace``) to mark the runner it runs on (a context variable, reset in ``finally``:
one step at a time per worker thread). A method a test sets on the class or the instance takes precedence, as before.

The facts come from the files (``ast``): the names vLLM's return gives (an element that is not a name is named by
vLLM's own callers' unpack at that position: ``int(num_sampled_tokens.max())`` is ``max_num_sampled_tokens``), the
names vllm-omni unpacks, and where vLLM sets an added value in one branch of an ``if`` whose other branch computes a
value vllm-omni takes with a method of vLLM's (the recount: vLLM 0.30's ``num_nans`` against
``num_nans_in_logits = self._get_nans_in_logits(logits)``). An added value without a recount is dropped, and the
decision names what that leaves out. Each drift point is one small subclass naming its method, caller and runner.
"""

from __future__ import annotations

import ast
import contextvars
import functools
from dataclasses import asdict, dataclass
from dataclasses import replace as with_fields

from ..decide import Action
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, provide, replace, restore, withdraw

VLLM_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
VLLM_CLASS = "GPUModelRunner"


class Shape:
    NOT_INSTALLED = "not-installed"  # vLLM or vllm-omni not installed
    NO_V1_RUNNER = "no-v1-runner"  # vLLM has no V1 GPUModelRunner method of that name (0.34 removed the V1 runner)
    NO_CALLER = "no-caller"  # vllm-omni's caller does not call it
    UNREAD = "unread"  # a return or an unpack that is not one flat tuple the files name
    SAME = "same"  # vllm-omni unpacks the names vLLM returns, in its order
    DIFFERS = "differs"  # they differ: vLLM added values


@dataclass(frozen=True)
class ReturnFacts:
    shape: str
    returned: tuple[str, ...] = ()  # the names in vLLM's return statement
    unpacked: tuple[str, ...] = ()  # vllm-omni's unpack targets
    parameters: tuple[str, ...] = ()  # vLLM's method's parameters after self
    # (added name, name vllm-omni unpacks, vLLM's method computing it, the parameters it is called with): the branch
    # not taken where the added value is set
    recounts: tuple[tuple[str, str, str, tuple[str, ...]], ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def added(self) -> tuple[str, ...]:
        return tuple(name for name in self.returned if name not in self.unpacked)

    @property
    def missing(self) -> tuple[str, ...]:
        """What vllm-omni unpacks that vLLM does not return."""
        return tuple(name for name in self.unpacked if name not in self.returned)

    @property
    def dropped(self) -> tuple[str, ...]:
        """The added values no recount stands in for: what the adapter drops."""
        recounted = {added for added, *_ in self.recounts}
        return tuple(name for name in self.added if name not in recounted)


# ---- reading the files ----

def _class(tree, name: str):
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _method(cls, name: str):
    return next((n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name),
                None) if cls is not None else None


def _own_nodes(function):
    """The nodes of ``function``'s body, not descending into nested functions, lambdas or classes."""
    nested = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
    stack = [node for node in function.body if not isinstance(node, nested)]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(child for child in ast.iter_child_nodes(node) if not isinstance(child, nested))


def _names(node) -> tuple[str, ...] | None:
    """The names of a flat tuple (or list) of names; None for anything else."""
    if isinstance(node, (ast.Tuple, ast.List)) and all(isinstance(e, ast.Name) for e in node.elts):
        names = tuple(e.id for e in node.elts)
        return names if len(set(names)) == len(names) else None
    return None


def _one(shapes: list) -> tuple[str, ...] | None:
    """The one shape all of ``shapes`` have; None where one is unread or they differ."""
    return shapes[0] if shapes and None not in shapes and len(set(shapes)) == 1 else None


def _self_method(node) -> str | None:
    """``name`` where ``node`` is a call ``self.<name>(...)``, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"):
        return node.func.attr
    return None


def unpacked_names(caller, method: str) -> tuple[str, ...] | None:
    """The targets ``caller`` unpacks ``self.<method>(...)`` into; ``()`` where it does not call it; None where a call
    is not unpacked into one flat tuple of names, or two unpacks differ."""
    calls = [n for n in _own_nodes(caller) if _self_method(n) == method]
    if not calls:
        return ()
    unpacks = [n for n in _own_nodes(caller) if isinstance(n, ast.Assign) and _self_method(n.value) == method]
    if len(unpacks) != len(calls) or any(len(n.targets) != 1 for n in unpacks):
        return None
    return _one([_names(n.targets[0]) for n in unpacks])


def callers_unpack(cls, method: str) -> tuple[str, ...] | None:
    """The one flat tuple of names ``cls``'s own methods unpack ``self.<method>(...)`` into (None where they differ,
    or none does)."""
    shapes = [_names(n.targets[0]) for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
              for n in _own_nodes(m) if isinstance(n, ast.Assign) and len(n.targets) == 1
              and _self_method(n.value) == method]
    return _one([s for s in shapes if s is not None])


def returned_names(method, own_unpack: tuple[str, ...] | None = None) -> tuple[str, ...] | None:
    """The names vLLM's ``method`` returns; an element that is not a name takes the name ``own_unpack`` (vLLM's own
    callers' targets) gives that position. None where a return is not one flat tuple so named, or two differ."""
    shapes = []
    for node in _own_nodes(method):
        if not isinstance(node, ast.Return):
            continue
        elements = node.value.elts if isinstance(node.value, (ast.Tuple, ast.List)) else None
        if elements is None or (own_unpack is not None and len(own_unpack) != len(elements)):
            shapes.append(None)
            continue
        names = tuple(e.id if isinstance(e, ast.Name) else own_unpack[i] if own_unpack else None
                      for i, e in enumerate(elements))
        shapes.append(names if None not in names and len(set(names)) == len(names) else None)
    return _one(shapes)


def _assigned(statements) -> dict[str, ast.AST]:
    """{name: value} of the plain ``name = value`` statements among ``statements`` (not nested)."""
    found = {}
    for stmt in statements:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            found[stmt.targets[0].id] = stmt.value
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.value is not None:
            found[stmt.target.id] = stmt.value
    return found


def recounts_of(method, added, unpacked, parameters) -> tuple[tuple[str, str, str, tuple[str, ...]], ...]:
    """Where vLLM's ``method`` starts an ``added`` value at None and sets it in one branch of an ``if`` whose other
    branch sets a value vllm-omni unpacks to ``self.<method>(<parameters>)``: ``(added, unpacked name, method,
    parameters)``. When the added value is set, that other branch did not run; calling its method gives vllm-omni
    the value it would have given (vLLM 0.30-0.33: ``num_nans_in_logits = self._get_nans_in_logits(logits)``)."""
    starts_none = {name for name, value in _assigned(method.body).items()
                   if isinstance(value, ast.Constant) and value.value is None}
    found = []
    for node in _own_nodes(method):
        if not isinstance(node, ast.If):
            continue
        for here, there in ((node.body, node.orelse), (node.orelse, node.body)):
            for name in [n for n in _assigned(here) if n in added and n in starts_none]:
                for target, value in _assigned(there).items():
                    called = _self_method(value)
                    if (target in unpacked and called is not None and not value.keywords
                            and all(isinstance(a, ast.Name) and a.id in parameters for a in value.args)):
                        found.append((name, target, called, tuple(a.id for a in value.args)))
    return tuple(dict.fromkeys(found))


# ---- what is installed ----

@dataclass(frozen=True)
class Adaptation:
    """vLLM's tuple as vllm-omni unpacks it: ``width`` values from vLLM; ``picks``, their indexes in vllm-omni's
    order; ``recounts``, (index of the added value, index in ``picks`` of the value it replaces, vLLM's method,
    (parameter position, name) of each argument)."""

    width: int
    picks: tuple[int, ...]
    recounts: tuple[tuple[int, int, str, tuple[tuple[int, str], ...]], ...] = ()

    @classmethod
    def of(cls, facts: ReturnFacts) -> Adaptation:
        position = {name: i for i, name in enumerate(facts.parameters)}
        return cls(len(facts.returned), tuple(facts.returned.index(name) for name in facts.unpacked), tuple(
            (facts.returned.index(added), facts.unpacked.index(kept), method, tuple((position[a], a) for a in args))
            for added, kept, method, args in facts.recounts))

    def apply(self, runner, result, args, kwargs) -> tuple:
        values = [result[i] for i in self.picks]
        for added, kept, method, arguments in self.recounts:
            if result[added] is not None:  # vLLM took the branch that sets it; vllm-omni's value is the other's
                values[kept] = getattr(runner, method)(
                    *(kwargs[name] if name in kwargs else args[i] for i, name in arguments))
        return tuple(values)


def adapted_method(name: str, module: str):
    """The method put on vllm-omni's class: vLLM's ``name``; inside vllm-omni's wrapped caller on this runner, its
    values as that caller unpacks them. One function object per drift point module, made at its import, so
    ``apply()`` after ``revert()`` puts the same one back; its context variable is the caller's mark."""
    running: contextvars.ContextVar = contextvars.ContextVar(f"vllm_compat_{name}", default=None)

    def method(self, *args, **kwargs):
        owner = next(k for k in type(self).__mro__ if vars(k).get(name) is method)
        result = getattr(super(owner, self), name)(*args, **kwargs)
        inside = running.get()
        if inside is None or inside[0] is not self or not isinstance(result, tuple):
            return result
        adaptation = inside[1]
        return adaptation.apply(self, result, args, kwargs) if len(result) == adaptation.width else result

    method.__name__ = method.__qualname__ = name
    method.__module__ = module
    method.__doc__ = (f"vLLM's GPUModelRunner.{name}; inside vllm-omni's caller on this runner, its values as that "
                      f"caller unpacks them (vllm_compat's adapter, {module}).")
    method.running = running
    return method


# ---- the drift point ----

class RunnerReturnAdapter(DriftPoint):
    """One subclass per (vllm-omni runner, caller, vLLM method): the class attributes below name them."""

    omni_runner: str  # vllm-omni's file, e.g. "vllm_omni/worker/gpu_ar_model_runner.py"
    omni_class: str  # its runner class there
    method: str  # vLLM's GPUModelRunner method whose tuple grew
    caller: str  # vllm-omni's method unpacking it (the catalogue row's target)
    stage: str  # the stage in users' words, for what a dropped value leaves out
    features: dict[str, str] = {}  # added value -> what dropping it leaves out, in users' words
    adapted = None  # adapted_method(method, module), made in the subclass's module

    @property
    def handles_drift(self):
        return (("unpack", f"*.{VLLM_CLASS}.{self.method}", f"*.{self.omni_class}.{self.caller}", "*"),)

    def facts_of(self, vllm_tree, omni_tree) -> ReturnFacts:
        if not (vllm_tree.has_package("vllm") and omni_tree.has_package("vllm_omni")):
            return ReturnFacts(Shape.NOT_INSTALLED)
        runner = vllm_tree.read(VLLM_RUNNER)
        vllm_class = _class(parse_source(runner), VLLM_CLASS) if runner is not None else None
        method = _method(vllm_class, self.method)
        if method is None:
            return ReturnFacts(Shape.NO_V1_RUNNER)
        omni_runner = omni_tree.read(self.omni_runner)
        caller = _method(_class(parse_source(omni_runner), self.omni_class), self.caller) \
            if omni_runner is not None else None
        unpacked = unpacked_names(caller, self.method) if caller is not None else ()
        if unpacked == ():
            return ReturnFacts(Shape.NO_CALLER)
        returned = returned_names(method, callers_unpack(vllm_class, self.method))
        parameters = tuple(a.arg for a in method.args.posonlyargs + method.args.args)[1:]
        if unpacked is None or returned is None:
            return ReturnFacts(Shape.UNREAD, returned or (), unpacked or (), parameters)
        if returned == unpacked:
            return ReturnFacts(Shape.SAME, returned, unpacked, parameters)
        added = tuple(name for name in returned if name not in unpacked)
        return ReturnFacts(Shape.DIFFERS, returned, unpacked, parameters,
                           recounts_of(method, added, unpacked, parameters))

    def detect_static(self, site) -> ReturnFacts:
        return self.facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> ReturnFacts:
        from ..detect.source_tree import tree_of

        return self.facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def leaves_out(self, facts: ReturnFacts) -> str:
        return "; ".join(self.features.get(name, f"what vLLM's {self.method} returns as {name} in {self.stage}")
                         for name in facts.dropped)

    def decide(self, facts: ReturnFacts, controls=None):
        what = f"vLLM's {VLLM_CLASS}.{self.method}"
        caller = f"{self.omni_class}.{self.caller}"
        if facts.shape == Shape.NOT_INSTALLED:
            return self.decision(Action.PENDING, "vLLM or vllm-omni is not installed; decided when vllm-omni's "
                                 f"{self.omni_class} is imported")
        if facts.shape == Shape.NO_V1_RUNNER:
            return self.decision(Action.SKIPPED, f"vLLM has no V1 {VLLM_CLASS}.{self.method} ({VLLM_RUNNER} is "
                                 f"absent, removed in 0.34): vllm-omni's {self.omni_class} does not run on this vLLM")
        if facts.shape == Shape.NO_CALLER:
            return self.decision(Action.SKIPPED, f"the installed vllm-omni's {caller} does not call {self.method}")
        if facts.shape == Shape.SAME:
            return self.decision(Action.SKIPPED, f"vllm-omni's {caller} unpacks the {len(facts.returned)} values "
                                 f"{what} returns")
        if facts.shape == Shape.UNREAD:
            returned = facts.returned or "something other than one tuple the files name"
            unpacked = facts.unpacked or "it other than into one tuple of names"
            return self.refused(f"{what} returns {returned} and vllm-omni's {self.caller} unpacks {unpacked}; the "
                                "adapter knows one flat tuple of names on each side")
        if facts.missing:
            return self.refused(f"vllm-omni's {self.caller} unpacks {', '.join(facts.missing)}, which {what} no "
                                f"longer returns (it returns {', '.join(facts.returned)})")
        recounted = "".join(f"; when {added} is set, {kept} comes from vLLM's {method}({', '.join(args)}), as vLLM's "
                            "other branch computes it" for added, kept, method, args in facts.recounts)
        dropped = f"; {', '.join(facts.dropped)} dropped" if facts.dropped else ""
        leaves_out = self.leaves_out(facts)
        return with_fields(self.decision(
            Action.PATCHED, f"{what} returns {len(facts.returned)} values ({', '.join(facts.returned)}) where "
            f"vllm-omni's {caller} unpacks {len(facts.unpacked)}; inside it, {self.method} gives them in vllm-omni's "
            f"order{recounted}{dropped}"), leaves_out=leaves_out, leaves_out_of="llm_stage" if leaves_out else "")

    def locate(self, module):
        cls = getattr(module, self.omni_class, None)
        return cls if isinstance(cls, type) else None

    def in_place(self, owner):
        return vars(owner).get(self.caller) if owner is not None else None

    def prepare(self, owner, facts: ReturnFacts) -> Adaptation:
        """The contract on the imported class: vllm-omni's own caller (never vLLM's is wrapped), no method of that
        name of its own, vLLM's the one it inherits, and the methods a recount calls there."""
        from ..errors import PatchRefusedError

        name = self.omni_class
        if owner is None or not callable(vars(owner).get(self.caller)):
            raise PatchRefusedError(f"{name} defines no {self.caller} of its own ({owner!r}); vLLM's is never "
                                    "wrapped, so it is left as it is.")
        own = vars(owner).get(self.method)
        if own is not None and own is not type(self).adapted:
            raise PatchRefusedError(f"{name} defines its own {self.method} ({own!r}), which the files did not show; "
                                    "left as it is.")
        inherited = next((vars(k)[self.method] for k in owner.__mro__[1:] if self.method in vars(k)), None)
        if getattr(inherited, "__qualname__", None) != f"{VLLM_CLASS}.{self.method}":
            raise PatchRefusedError(f"{name} inherits {self.method} from {inherited!r}, not from vLLM's "
                                    f"{VLLM_CLASS}; left as it is.")
        absent = [method for _, _, method, _ in facts.recounts if not callable(getattr(owner, method, None))]
        if absent:
            raise PatchRefusedError(f"{name} has no {', '.join(absent)}, which the files showed on vLLM's "
                                    f"{VLLM_CLASS}; left as it is.")
        return Adaptation.of(facts)

    def install(self, owner, decision, state: Adaptation) -> bool:
        running = type(self).adapted.running

        def make_wrapper(original):
            @functools.wraps(original)
            def caller(self, *args, **kwargs):
                token = running.set((self, state))
                try:
                    return original(self, *args, **kwargs)
                finally:
                    running.reset(token)

            return caller

        provided = provide(owner, self.method, type(self).adapted, self.id)
        return replace(owner, self.caller, make_wrapper, self.id) or provided

    def uninstall(self, owner) -> bool:
        withdrawn = withdraw(owner, self.method, self.id)
        return restore(owner, self.caller, self.id) or withdrawn
