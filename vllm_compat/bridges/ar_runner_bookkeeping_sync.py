"""Adapter for vllm-omni's ``GPUARModelRunner.sample_tokens``: the tuple vLLM 0.30-0.33's ``_bookkeeping_sync`` returns.

Why: vllm-omni 0.24.0's AR runner (``vllm_omni/worker/gpu_ar_model_runner.py``) has its own ``sample_tokens``, which
unpacks the 7 values vLLM 0.24's ``GPUModelRunner._bookkeeping_sync`` returns. vLLM 0.30 added an eighth, second in
the tuple: ``num_nans``, the per-row NaN counts of the logits left on the device (set only with
``VLLM_COMPUTE_NANS_IN_LOGITS`` under async scheduling; vLLM's own ``sample_tokens`` hands it to
``AsyncGPUModelRunnerOutput``, which turns it into ``num_nans_in_logits``). So every AR step dies on vLLM 0.30-0.33 with
``ValueError: too many values to unpack (expected 7)``.
When: vLLM's return statement and vllm-omni's unpack targets (both read from the files with ``ast``) name different
values, every one vllm-omni unpacks being among vLLM's. For the length of vllm-omni's ``sample_tokens`` on that runner,
``_bookkeeping_sync`` (a method put on vllm-omni's class, calling vLLM's) gives the values vllm-omni names, in its
order; everywhere else it is vLLM's, unchanged (vLLM's own callers expect all 8). Where vLLM's method sets the added
value in the branch of an ``if`` whose other branch computes a value vllm-omni takes with a method of vLLM's
(0.30-0.33: ``num_nans`` under async scheduling, ``num_nans_in_logits = self._get_nans_in_logits(logits)`` under
sync), and the added value is set, that method gives vllm-omni its value: the NaN counts reach the AR stage's output,
as on vLLM 0.24. An added value without such a branch is dropped, and the decision names what it leaves out. Same
names: nothing to do (0.24); an unpack or a return that is not a flat tuple of names, or a name vllm-omni unpacks
that vLLM no longer returns: refused.
Serves: vllm-omni 0.24.0's AR runner on vLLM 0.30-0.33 (read from the 0.24, 0.30, 0.33 and 0.34 wheels; 0.34 has no
V1 model runner, so that stage is left out there).
Retire when: the oldest supported vllm-omni unpacks what vLLM's ``_bookkeeping_sync`` returns.

Why not replace ``_bookkeeping_sync`` for every caller: vLLM's own ``GPUModelRunner.sample_tokens`` calls it too and
unpacks all 8, and a subclass of vllm-omni's runner may reach vLLM's. So the wrapped ``sample_tokens`` marks the runner
it runs on (a context variable, reset in ``finally``: one step at a time per worker thread), and only that runner's
call inside it is adapted. A ``_bookkeeping_sync`` a test sets on the class or the instance (vllm-omni's own
``test_sample_tokens_tail_only_prefix_cache_uses_staged_cpu_hidden_states`` does, returning 7) takes precedence, as
before. Not concerned: vllm-omni's NPU AR runner (``platforms/npu/worker/npu_ar_model_runner.py``) unpacks 6 values
from a ``_bookkeeping_sync`` called with 6 arguments: vllm-ascend's own method (its runner overrides vLLM's), which
follows vllm-ascend's releases, not vLLM's, and no env here installs.
"""

from __future__ import annotations

import ast
import contextvars
import functools
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, provide, replace, restore, withdraw

VLLM_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
OMNI_RUNNER = "vllm_omni/worker/gpu_ar_model_runner.py"
VLLM_CLASS, OMNI_CLASS = "GPUModelRunner", "GPUARModelRunner"
METHOD, CALLER = "_bookkeeping_sync", "sample_tokens"  # vLLM's method; vllm-omni's (the catalogue row's target)
# What dropping an added value leaves out, in users' words, where vLLM's method gives no way to recompute it.
FEATURES = {"num_nans": "NaN counting in the AR stage's logits under async scheduling (VLLM_COMPUTE_NANS_IN_LOGITS)"}


class Shape:
    NOT_INSTALLED = "not-installed"  # vLLM or vllm-omni not installed
    NO_V1_RUNNER = "no-v1-runner"  # vLLM has no V1 GPUModelRunner._bookkeeping_sync (0.34 removed the V1 runner)
    NO_CALLER = "no-caller"  # vllm-omni's GPUARModelRunner.sample_tokens does not call it
    UNREAD = "unread"  # a return or an unpack that is not one flat tuple of names
    SAME = "same"  # vllm-omni unpacks the names vLLM returns, in its order (vLLM 0.24)
    DIFFERS = "differs"  # they differ (vLLM 0.30-0.33: num_nans added)


@dataclass(frozen=True)
class BookkeepingFacts:
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

    @property
    def leaves_out(self) -> str:
        return "; ".join(FEATURES.get(name, f"what vLLM's {METHOD} returns as {name} in the AR stage")
                         for name in self.dropped)


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


def unpacked_names(caller) -> tuple[str, ...] | None:
    """The targets vllm-omni's ``caller`` unpacks ``self._bookkeeping_sync(...)`` into; ``()`` where it does not call
    it; None where a call is not unpacked into one flat tuple of names, or two unpacks differ."""
    calls = [n for n in _own_nodes(caller) if _self_method(n) == METHOD]
    if not calls:
        return ()
    unpacks = [n for n in _own_nodes(caller) if isinstance(n, ast.Assign) and _self_method(n.value) == METHOD]
    if len(unpacks) != len(calls) or any(len(n.targets) != 1 for n in unpacks):
        return None
    return _one([_names(n.targets[0]) for n in unpacks])


def returned_names(method) -> tuple[str, ...] | None:
    """The names vLLM's ``method`` returns; None where a return is not one flat tuple of names, or two differ."""
    return _one([_names(n.value) for n in _own_nodes(method) if isinstance(n, ast.Return)])


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


def facts_of(vllm_tree, omni_tree) -> BookkeepingFacts:
    if not (vllm_tree.has_package("vllm") and omni_tree.has_package("vllm_omni")):
        return BookkeepingFacts(Shape.NOT_INSTALLED)
    runner = vllm_tree.read(VLLM_RUNNER)
    method = _method(_class(parse_source(runner), VLLM_CLASS), METHOD) if runner is not None else None
    if method is None:
        return BookkeepingFacts(Shape.NO_V1_RUNNER)
    omni_runner = omni_tree.read(OMNI_RUNNER)
    caller = _method(_class(parse_source(omni_runner), OMNI_CLASS), CALLER) if omni_runner is not None else None
    unpacked = unpacked_names(caller) if caller is not None else ()
    if unpacked == ():
        return BookkeepingFacts(Shape.NO_CALLER)
    returned = returned_names(method)
    parameters = tuple(a.arg for a in method.args.posonlyargs + method.args.args)[1:]
    if unpacked is None or returned is None:
        return BookkeepingFacts(Shape.UNREAD, returned or (), unpacked or (), parameters)
    if returned == unpacked:
        return BookkeepingFacts(Shape.SAME, returned, unpacked, parameters)
    added = tuple(name for name in returned if name not in unpacked)
    return BookkeepingFacts(Shape.DIFFERS, returned, unpacked, parameters,
                            recounts_of(method, added, unpacked, parameters))


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
    def of(cls, facts: BookkeepingFacts) -> Adaptation:
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


# The runner whose vllm-omni sample_tokens is running in this thread, and how its _bookkeeping_sync is adapted.
_SAMPLING: contextvars.ContextVar = contextvars.ContextVar("vllm_compat_ar_runner_sampling", default=None)


def _bookkeeping_sync(self, *args, **kwargs):
    """vLLM's ``GPUModelRunner._bookkeeping_sync``; inside vllm-omni's ``sample_tokens`` on this runner, its values as
    that ``sample_tokens`` unpacks them (vllm_compat's adapter, ``vllm_compat.bridges.ar_runner_bookkeeping_sync``).
    One function object for every install, so ``apply()`` after ``revert()`` puts the same one back."""
    owner = next(k for k in type(self).__mro__ if vars(k).get(METHOD) is _bookkeeping_sync)
    result = getattr(super(owner, self), METHOD)(*args, **kwargs)
    sampling = _SAMPLING.get()
    if sampling is None or sampling[0] is not self or not isinstance(result, tuple):
        return result
    adaptation = sampling[1]
    return adaptation.apply(self, result, args, kwargs) if len(result) == adaptation.width else result


# ---- the drift point ----

class ARRunnerBookkeepingSync(DriftPoint):
    handles_drift = (("unpack", "*.GPUModelRunner._bookkeeping_sync", "*.GPUARModelRunner.sample_tokens", "*"),)

    def detect_static(self, site) -> BookkeepingFacts:
        return facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> BookkeepingFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def decide(self, facts: BookkeepingFacts, controls=None):
        what = f"vLLM's {VLLM_CLASS}.{METHOD}"
        if facts.shape == Shape.NOT_INSTALLED:
            return self.decision(Action.PENDING, "vLLM or vllm-omni is not installed; decided when vllm-omni's AR "
                                 "runner is imported")
        if facts.shape == Shape.NO_V1_RUNNER:
            return self.decision(Action.SKIPPED, f"vLLM has no V1 {VLLM_CLASS}.{METHOD} ({VLLM_RUNNER} is absent, "
                                 "removed in 0.34): vllm-omni's AR runner does not run on this vLLM")
        if facts.shape == Shape.NO_CALLER:
            return self.decision(Action.SKIPPED, f"the installed vllm-omni's {OMNI_CLASS}.{CALLER} does not call "
                                 f"{METHOD}")
        if facts.shape == Shape.SAME:
            return self.decision(Action.SKIPPED, f"vllm-omni's {OMNI_CLASS}.{CALLER} unpacks the {len(facts.returned)} "
                                 f"values {what} returns (as on vLLM 0.24)")
        if facts.shape == Shape.UNREAD:
            returned = facts.returned or "something other than one tuple of names"
            unpacked = facts.unpacked or "it other than into one tuple of names"
            return self.refused(f"{what} returns {returned} and vllm-omni's {CALLER} unpacks {unpacked}; the adapter "
                                "knows one flat tuple of names on each side")
        if facts.missing:
            return self.refused(f"vllm-omni's {CALLER} unpacks {', '.join(facts.missing)}, which {what} no longer "
                                f"returns (it returns {', '.join(facts.returned)})")
        recounted = "".join(f"; when {added} is set, {kept} comes from vLLM's {method}({', '.join(args)}), as vLLM's "
                            "other branch computes it" for added, kept, method, args in facts.recounts)
        dropped = f"; {', '.join(facts.dropped)} dropped" if facts.dropped else ""
        from dataclasses import replace as with_fields

        return with_fields(self.decision(
            Action.PATCHED, f"{what} returns {len(facts.returned)} values ({', '.join(facts.returned)}) where "
            f"vllm-omni's {OMNI_CLASS}.{CALLER} unpacks {len(facts.unpacked)}; inside it, {METHOD} gives them in "
            f"vllm-omni's order{recounted}{dropped}"), leaves_out=facts.leaves_out,
            leaves_out_of="llm_stage" if facts.leaves_out else "")

    def locate(self, module):
        cls = getattr(module, OMNI_CLASS, None)
        return cls if isinstance(cls, type) else None

    def in_place(self, owner):
        return vars(owner).get(CALLER) if owner is not None else None

    def prepare(self, owner, facts: BookkeepingFacts) -> Adaptation:
        """The contract on the imported class: vllm-omni's own ``sample_tokens`` (never vLLM's is wrapped), no
        ``_bookkeeping_sync`` of its own, vLLM's the one it inherits, and the methods a recount calls there."""
        from ..errors import PatchRefusedError

        if owner is None or not callable(vars(owner).get(CALLER)):
            raise PatchRefusedError(f"{OMNI_CLASS} defines no {CALLER} of its own ({owner!r}); vLLM's is never "
                                    "wrapped, so it is left as it is.")
        own = vars(owner).get(METHOD)
        if own is not None and own is not _bookkeeping_sync:
            raise PatchRefusedError(f"{OMNI_CLASS} defines its own {METHOD} ({own!r}), which the files did not show; "
                                    "left as it is.")
        inherited = next((vars(k)[METHOD] for k in owner.__mro__[1:] if METHOD in vars(k)), None)
        if getattr(inherited, "__qualname__", None) != f"{VLLM_CLASS}.{METHOD}":
            raise PatchRefusedError(f"{OMNI_CLASS} inherits {METHOD} from {inherited!r}, not from vLLM's "
                                    f"{VLLM_CLASS}; left as it is.")
        absent = [method for _, _, method, _ in facts.recounts if not callable(getattr(owner, method, None))]
        if absent:
            raise PatchRefusedError(f"{OMNI_CLASS} has no {', '.join(absent)}, which the files showed on vLLM's "
                                    f"{VLLM_CLASS}; left as it is.")
        return Adaptation.of(facts)

    def install(self, owner, decision, state: Adaptation) -> bool:
        def make_wrapper(original):
            @functools.wraps(original)
            def sample_tokens(self, *args, **kwargs):
                token = _SAMPLING.set((self, state))
                try:
                    return original(self, *args, **kwargs)
                finally:
                    _SAMPLING.reset(token)

            return sample_tokens

        provided = provide(owner, METHOD, _bookkeeping_sync, self.id)
        return replace(owner, CALLER, make_wrapper, self.id) or provided

    def uninstall(self, owner) -> bool:
        withdrawn = withdraw(owner, METHOD, self.id)
        return restore(owner, CALLER, self.id) or withdrawn


DRIFT_POINT = ARRunnerBookkeepingSync()
