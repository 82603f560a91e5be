"""Adapter: ``OmniARScheduler.update_from_output`` feeds the grammar only what follows the end of reasoning again.

Why: vLLM 0.25 added ``StructuredOutputManager.trim_reasoning_for_advance`` and made ``should_advance`` answer True in
the step where reasoning ends (0.25-0.26: under speculative decoding with a structural tag; 0.27-0.29: always), recording
where the end marker lies; vLLM's own ``Scheduler`` then feeds the grammar only the tokens after it ("feeding them to
accept_tokens makes the grammar reject the marker and kills the request", vLLM #44006). vllm-omni 0.24.0 and 0.26.0's
AR scheduler, a copy of vLLM 0.24's ``update_from_output``, asks ``should_advance`` and feeds the grammar the whole
step.
Driven on CPU with vllm-omni's own ``OmniARScheduler`` and vLLM's ``StructuredOutputManager`` (xgrammar, the
``deepseek_r1`` parser), every structured-output request that reasons dies at its ``</think>`` on vLLM 0.27.1 and
0.29.0 ("Unexpected: grammar rejected tokens [3] ... Terminating request.", finish reason ``error``), and on vLLM
0.25.1 with vllm-omni 0.24.0 and 0.26.0 with vllm-omni 0.26.0 one whose reasoning ends inside a speculative step with
a structural tag, where vLLM's own ``Scheduler`` carries both on.
When: vLLM's ``StructuredOutputManager`` defines both ``should_advance`` and ``trim_reasoning_for_advance`` and the
installed vllm-omni's ``OmniARScheduler.update_from_output`` calls ``structured_output_manager.should_advance`` and
never the trim (all read from the files with ``ast``): for the duration of each call the scheduler sees vLLM's
manager through a view whose ``should_advance`` is vLLM's own; in the one step where it ends reasoning with True, the
request's grammar is lent for that step's single ``accept_tokens`` to a stand-in that passes it
``trim_reasoning_for_advance(request, tokens)``, as vLLM's ``Scheduler`` does (nothing fed when nothing is left).
Nothing of vLLM's is replaced; vLLM <= 0.24 (no trim: it answers False there) and 0.30+ (no ``should_advance``:
``structured_output_should_advance`` answers as vLLM 0.24 did) need nothing.
Serves: vllm-omni 0.24.0 / 0.26.0's AR stage with structured output and a reasoning parser on vLLM 0.25-0.29
(measured on CPU against vLLM's own ``Scheduler``: 0.24.0 on 0.25.1, 0.27.1 and 0.29.0, 0.26.0 on 0.26.0).
Retire when: the oldest supported vllm-omni trims the reasoning itself or no longer asks ``should_advance`` (0.30.0
asks nothing), or no supported vLLM has ``trim_reasoning_for_advance`` beside ``should_advance``.

vllm-omni's ``OmniGenerationScheduler`` makes the same call but ignores the grammar's answer, and its requests stop
at their first output: the grammar rejects the marker and logs it, nothing else changes, so it is not adapted. Not
bridged either: vLLM 0.27+'s ``Scheduler`` passes the step's tokens to ``should_advance`` (#43388: under async
scheduling with speculative decoding a rejected draft leaves placeholders that shift where the step starts), where
vllm-omni's call lets vLLM fall back to its own reckoning.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ..patches._method import MethodPatch

MANAGER_FILE, MANAGER_CLASS = "vllm/v1/structured_output/__init__.py", "StructuredOutputManager"
ASK, TRIM = "should_advance", "trim_reasoning_for_advance"  # vLLM's question, and 0.25+'s trim that goes with it
MANAGER = "structured_output_manager"  # the scheduler's attribute vllm-omni asks through
OMNI_SCHEDULERS = "vllm_omni/core/sched"
UPDATE = "update_from_output"
# the catalogue row's target: the one caller whose answer matters (the generation scheduler ignores it)
TARGET = "vllm_omni/core/sched/omni_ar_scheduler.py:OmniARScheduler"


class Kind:
    ABSENT = "absent"  # vLLM's structured-output manager is not installed
    NO_TRIM = "no_trim"  # should_advance without the trim (vLLM <= 0.24: False where reasoning ends)
    TRIMS = "trims"  # both (vLLM 0.25-0.29: True where reasoning ends, the caller trims)
    NO_ASK = "no_ask"  # no should_advance (vLLM 0.30+)


@dataclass(frozen=True)
class TrimFacts:
    host: str
    # "file:Class" of vllm-omni's schedulers whose update_from_output asks should_advance and never trims
    untrimmed: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


def _calls(node: ast.AST, name: str, through: str | None = None) -> bool:
    """Whether ``node`` calls ``<...>.name(...)`` (``<...>.through.name(...)`` where ``through`` is given)."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
               and (through is None or (isinstance(n.func.value, ast.Attribute) and n.func.value.attr == through))
               for n in ast.walk(node))


def manager_shape(source: str | None) -> str:
    """Which of ``should_advance`` and ``trim_reasoning_for_advance`` vLLM's manager class in ``source`` defines."""
    cls = None if source is None else next(
        (n for n in parse_source(source).body if isinstance(n, ast.ClassDef) and n.name == MANAGER_CLASS), None)
    if cls is None:
        return Kind.ABSENT
    methods = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return Kind.NO_ASK if ASK not in methods else Kind.TRIMS if TRIM in methods else Kind.NO_TRIM


def untrimmed_in(source: str | None, path: str) -> tuple[str, ...]:
    """``path:Class`` for each class in ``source`` whose ``update_from_output`` asks
    ``structured_output_manager.should_advance`` and never calls ``trim_reasoning_for_advance``."""
    if source is None or ASK not in source:
        return ()
    return tuple(f"{path}:{cls.name}" for cls in ast.walk(parse_source(source)) if isinstance(cls, ast.ClassDef)
                 for func in cls.body if isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef))
                 and func.name == UPDATE and _calls(func, ASK, MANAGER) and not _calls(func, TRIM))


def facts_of(vllm_tree, omni_tree) -> TrimFacts:
    host = manager_shape(vllm_tree.read(MANAGER_FILE))
    paths = omni_tree.walk_py(OMNI_SCHEDULERS)
    return TrimFacts(host, tuple(u for p in paths for u in untrimmed_in(omni_tree.read(p), p)))


class AfterReasoning:
    """A request's grammar, lent for one ``accept_tokens``: it puts the grammar back, then feeds it the tokens that
    follow the end of reasoning (``trim_reasoning_for_advance``'s) and answers as vLLM's ``Scheduler`` reads it:
    True when nothing is left to feed (vllm_compat, ``structured_output_reasoning_trim``)."""

    __slots__ = ("_manager", "_request", "_grammar")

    def __init__(self, manager, request, grammar):
        self._manager, self._request, self._grammar = manager, request, grammar

    def accept_tokens(self, request_id, tokens) -> bool:
        self._request.structured_output_request.grammar = self._grammar
        advance = self._manager.trim_reasoning_for_advance(self._request, tokens)
        return not advance or self._grammar.accept_tokens(request_id, advance)

    def __getattr__(self, name):
        return getattr(self._grammar, name)


class TrimmingView:
    """vLLM's ``StructuredOutputManager`` as ``OmniARScheduler.update_from_output`` sees it: the same object, but
    where ``should_advance`` ends reasoning with True, the request's grammar is lent to ``AfterReasoning`` until the
    call returns (vllm_compat, ``structured_output_reasoning_trim``)."""

    __slots__ = ("_manager", "_lent")

    def __init__(self, manager):
        self._manager, self._lent = manager, []

    def __getattr__(self, name):
        return getattr(self._manager, name)

    def should_advance(self, request, *args, **kwargs) -> bool:
        structured = getattr(request, "structured_output_request", None)  # vllm-omni's tests pass bare requests
        had_ended = structured is not None and getattr(structured, "reasoning_ended", None) is True
        if not self._manager.should_advance(request, *args, **kwargs):
            return False
        # vLLM records where reasoning ends only in the step that ends it; later steps need no trim
        if not had_ended and getattr(structured, "reasoning_end_token_index", None) is not None:
            grammar = structured.grammar
            structured.grammar = AfterReasoning(self._manager, request, grammar)
            self._lent.append((structured, grammar))
        return True

    def take_back(self) -> None:
        """Every lent grammar back where it was (a no-op for those ``accept_tokens`` already put back)."""
        for structured, grammar in self._lent:
            structured.grammar = grammar
        self._lent.clear()


def update_with_trim(wrapped, scheduler, args, kwargs):
    """``OmniARScheduler.update_from_output`` with its manager seen through ``TrimmingView`` for the call."""
    manager = vars(scheduler).get(MANAGER)
    if getattr(manager, TRIM, None) is None:  # not vLLM's manager as Scheduler.__init__ sets it: nothing to trim with
        return wrapped(*args, **kwargs)
    view = TrimmingView(manager)
    setattr(scheduler, MANAGER, view)
    try:
        return wrapped(*args, **kwargs)
    finally:
        setattr(scheduler, MANAGER, manager)
        view.take_back()


class StructuredOutputReasoningTrim(MethodPatch):

    def detect_static(self, site) -> TrimFacts:
        return facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> TrimFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def decide(self, facts: TrimFacts, controls=None):
        if facts.host == Kind.ABSENT:
            return self.decision(Action.PENDING, f"vLLM's {MANAGER_CLASS} is not installed; decided when it is "
                                 "imported")
        if facts.host == Kind.NO_TRIM:
            return self.decision(Action.SKIPPED, f"vLLM's {MANAGER_CLASS} has no {TRIM}: its {ASK} keeps the step "
                                 "that ends reasoning from the grammar, as vllm-omni's schedulers expect")
        if facts.host == Kind.NO_ASK:
            return self.decision(Action.SKIPPED, f"vLLM's {MANAGER_CLASS} has no {ASK} (0.30+); vllm-omni's calls "
                                 "get vLLM 0.24's answers, which need no trim")
        if TARGET not in facts.untrimmed:
            return self.decision(Action.SKIPPED, f"vLLM's {ASK} answers True where reasoning ends and leaves the "
                                 f"trim to the caller, but the installed {TARGET} does not ask it without trimming")
        return self.decision(Action.PATCHED, f"vLLM's {ASK} answers True where reasoning ends and leaves the trim "
                             f"to the caller ({TRIM}), which {TARGET}.{UPDATE} never calls: its grammar is fed the "
                             "reasoning-end marker and the request is terminated; the grammar now gets the trimmed "
                             "tokens, as vLLM's Scheduler feeds it")

    def prepare(self, owner, facts):
        """The contract on the imported classes: vllm-omni's method is there, and vLLM's manager has both methods
        and its structured-output request the field the view reads."""
        from vllm.v1.structured_output import StructuredOutputManager
        from vllm.v1.structured_output.request import StructuredOutputRequest

        found = {f"{owner.__name__ if owner else None}.{UPDATE}": callable(getattr(owner, UPDATE, None)),
                 f"{MANAGER_CLASS}.{ASK}": callable(getattr(StructuredOutputManager, ASK, None)),
                 f"{MANAGER_CLASS}.{TRIM}": callable(getattr(StructuredOutputManager, TRIM, None)),
                 "StructuredOutputRequest.reasoning_end_token_index":
                     "reasoning_end_token_index" in getattr(StructuredOutputRequest, "__dataclass_fields__", {})}
        missing = [name for name, there in found.items() if not there]
        if missing:
            from ..errors import PatchRefusedError

            raise PatchRefusedError(f"the reasoning trim adapter needs {', '.join(found)}; missing here: "
                                    f"{', '.join(missing)}. Set VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, "
                                    "or upgrade vllm_compat.")
        return None

    def install(self, owner, decision, state) -> bool:
        return self.install_call(owner, decision.variant if decision is not None else None, update_with_trim)


DRIFT_POINT = StructuredOutputReasoningTrim()
