"""Left out: streaming input sessions in vllm-omni's AR and generation stages (``OmniARScheduler``'s session update).

Why: vLLM 0.31-0.33 moved the bookkeeping of a streaming input session (a resumable request that takes its next
input chunk when its turn stops) into ``Scheduler.update_from_output``, which vllm-omni 0.24.0's ``OmniARScheduler``
and ``OmniGenerationScheduler`` replace with their own copies of vLLM 0.24's: vLLM 0.31 drops the finished turn's
in-flight output there (``drop_stale_output``; from 0.27 vLLM ignores the ``Request.async_tokens_to_discard``
vllm-omni sets: ``async_tokens_to_discard`` restores its effect) and vLLM 0.33 puts the continuing session back in the waiting queue there, no longer in
``_handle_stopped_request``. Driven on CPU through vllm-omni's own schedulers, a session on vLLM 0.33 stops after its
first input chunk: the next chunk is merged into it and it is never scheduled again (the AR and the generation
scheduler, synchronous or async); under async scheduling the finished turn's in-flight token also becomes the next
turn's first output. vLLM 0.33 also changed what ``_update_request_as_session`` keeps (every output token but the
last sampled one, asserting none beyond was computed, where <= 0.32 kept the computed ones) and 0.32 made it read
``self.hash_block_size``. Restoring vLLM 0.24's session would mean carrying vLLM's stale-output and re-queueing logic
into vllm-omni's ``update_from_output`` and undoing vLLM's choice of tokens, replacing vLLM's logic rather than
adapting a call: nothing is installed, and check / doctor say what is left out.
When: vLLM's ``Scheduler._handle_stopped_request`` no longer calls ``_enqueue_waiting_request`` (0.33+) and an
installed vllm-omni scheduler's ``update_from_output`` calls ``_handle_stopped_request`` but never
``_enqueue_waiting_request`` (all read from the files with ``ast``): the decision names the feature as left out
(skipped, with ``leaves_out``) and ``report_lines`` says so. A vLLM that re-queues in ``_handle_stopped_request``
(<= 0.32) is what vllm-omni's schedulers were written against.
Serves: vllm-omni 0.24.0 on vLLM 0.33-0.34 (measured on CPU on vLLM 0.33 against the native pair; on 0.34 its LLM /
AR stages are left out as a whole).
Retire when: the oldest supported vllm-omni resumes streaming sessions in its own ``update_from_output``.

vllm-omni 0.24.0's own tests of this (``tests/core/sched/test_omni_ar_scheduler_streaming.py``, both tests) fail on
vLLM 0.33+: one builds the scheduler without ``__init__`` and vLLM 0.32+'s method reads ``hash_block_size`` from it,
the other pins the kept tokens vLLM 0.33 changed. Not reported here: on vLLM 0.31-0.32 (no cell measured) vLLM's
``_handle_stopped_request`` still re-queues, but marks the finished turn's in-flight output for its own
``update_from_output`` to drop, which vllm-omni's copy does not read.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, replace

from ..decide import Action, Decision
from ..detect.source_tree import parse_source
from ._method import MethodPatch

VLLM_SCHEDULER = "vllm/v1/core/sched/scheduler.py"
OMNI_SCHEDULERS = "vllm_omni/core/sched"
STOPPED, ENQUEUE, UPDATE = "_handle_stopped_request", "_enqueue_waiting_request", "update_from_output"
SESSION_UPDATE = "_update_request_as_session"
LEAVES_OUT = "streaming input sessions in the AR and generation stages"
WHAT_HAPPENS = ("vLLM 0.33+ puts a continuing session back in the waiting queue in its own "
                "Scheduler.update_from_output, which vllm-omni's schedulers replace: a session stops after its first "
                "input chunk")


class Kind:
    ABSENT = "absent"  # vLLM's Scheduler or vllm-omni's schedulers are not installed
    REQUEUES_ON_STOP = "requeues_on_stop"  # _handle_stopped_request re-queues a continuing session (<= 0.32)
    REQUEUES_IN_UPDATE = "requeues_in_update"  # only update_from_output does (0.33+)


@dataclass(frozen=True)
class StreamingSessionFacts:
    host: str
    # what vLLM's _update_request_as_session keeps of the finished turn: "computed" (<= 0.32) or "all_but_last" (0.33+)
    keeps: str = ""
    # "file:Class" of vllm-omni's schedulers whose update_from_output stops sessions but never re-queues them
    replacers: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)


def _methods(tree: ast.AST, name: str):
    """``(class name, method)`` for every class in ``tree`` that defines ``name``."""
    return [(cls.name, item) for cls in ast.walk(tree) if isinstance(cls, ast.ClassDef)
            for item in cls.body if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == name]


def _calls(func: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
               for n in ast.walk(func))


def vllm_shape(scheduler_source: str | None) -> tuple[str, str]:
    """``(kind, keeps)`` of vLLM's ``Scheduler``: where it re-queues a continuing session, and what
    ``_update_request_as_session`` keeps (from 0.33 up to ``session.num_tokens - 1``: all but the last token)."""
    if scheduler_source is None:
        return Kind.ABSENT, ""
    tree = parse_source(scheduler_source)
    stopped = dict(_methods(tree, STOPPED)).get("Scheduler")
    if stopped is None:
        return Kind.ABSENT, ""
    update = dict(_methods(tree, SESSION_UPDATE)).get("Scheduler")
    keeps = "" if update is None else "all_but_last" if any(
        isinstance(n, ast.BinOp) and isinstance(n.op, ast.Sub) and isinstance(n.left, ast.Attribute)
        and n.left.attr == "num_tokens" and isinstance(n.right, ast.Constant) and n.right.value == 1
        for n in ast.walk(update)) else "computed"
    return (Kind.REQUEUES_ON_STOP if _calls(stopped, ENQUEUE) else Kind.REQUEUES_IN_UPDATE), keeps


def replacers_in(source: str | None, path: str) -> tuple[str, ...]:
    """``path:Class`` for each class in ``source`` whose ``update_from_output`` calls ``_handle_stopped_request``
    and never ``_enqueue_waiting_request``."""
    if source is None or UPDATE not in source:
        return ()
    return tuple(f"{path}:{cls}" for cls, func in _methods(parse_source(source), UPDATE)
                 if _calls(func, STOPPED) and not _calls(func, ENQUEUE))


def facts_of(vllm_tree, omni_tree) -> StreamingSessionFacts:
    host, keeps = vllm_shape(vllm_tree.read(VLLM_SCHEDULER))
    paths = omni_tree.walk_py(OMNI_SCHEDULERS)
    if host == Kind.ABSENT or not paths:
        return StreamingSessionFacts(Kind.ABSENT)
    return StreamingSessionFacts(host, keeps, tuple(r for p in paths for r in replacers_in(omni_tree.read(p), p)))


def is_left_out(facts: StreamingSessionFacts) -> bool:
    return facts.host == Kind.REQUEUES_IN_UPDATE and bool(facts.replacers)


class StreamingInputSessions(MethodPatch):
    """Reports the feature left out; installs nothing (the decision is never "patched")."""

    def detect_static(self, site) -> StreamingSessionFacts:
        return facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> StreamingSessionFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def decide(self, facts: StreamingSessionFacts, controls=None) -> Decision:
        if facts.host == Kind.ABSENT:
            return self.decision(Action.PENDING, "vLLM's Scheduler or vllm-omni's schedulers are not installed; "
                                 "decided when they are imported")
        if facts.host == Kind.REQUEUES_ON_STOP:
            return self.decision(Action.SKIPPED, f"vLLM's Scheduler.{STOPPED} puts a continuing streaming session "
                                 "back in the waiting queue, as vllm-omni's schedulers expect")
        if not facts.replacers:
            return self.decision(Action.SKIPPED, f"vLLM re-queues a continuing streaming session in its own "
                                 f"{UPDATE}, and no installed vllm-omni scheduler replaces it without doing so")
        return replace(self.decision(
            Action.SKIPPED, f"left out: {LEAVES_OUT}. {WHAT_HAPPENS} ({', '.join(facts.replacers)}); restoring it "
            "would replace vLLM's logic, so nothing is installed"), leaves_out=LEAVES_OUT, leaves_out_of="llm_stage")

    def install(self, owner, decision: Decision, state) -> bool:
        return False  # never decided "patched": there is nothing to install

    def report_lines(self, facts: StreamingSessionFacts) -> list[str]:
        return [f"left out: {LEAVES_OUT} ({WHAT_HAPPENS})"] if is_left_out(facts) else []


DRIFT_POINT = StreamingInputSessions()
