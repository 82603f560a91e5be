"""Stand-in for vLLM's ``Scheduler.skipped_waiting`` (removed in vLLM 0.31), on vllm-omni's ``OmniSchedulerMixin``.

Why: vLLM <= 0.30's ``Scheduler`` kept a second waiting queue, ``self.skipped_waiting``, for requests it could not
schedule yet and carried them across steps; vLLM 0.31 keeps them in a local deque for one step only and put them
back in ``waiting`` before ``schedule`` returns, and dropped the attribute. vllm-omni's schedulers (all of them
derive ``OmniSchedulerMixin``) read and prune it: vllm-omni 0.28.0 / 0.30.0 on every ``schedule`` (their
``_drop_aborted_queued_requests``), 0.24.0 / 0.26.0 on preemption and streaming-session paths. On vLLM 0.31+ an LLM /
AR or generation stage of 0.28.0 / 0.30.0 dies at its first step (``AttributeError: 'OmniARScheduler' object has no
attribute 'skipped_waiting'``, reproduced on CPU with vllm-omni 0.30.0 on vLLM 0.33), 0.24.0 / 0.26.0 on those paths.
When: vLLM's ``Scheduler.__init__`` assigns no ``self.skipped_waiting`` and a file of vllm-omni's schedulers reads it
(both read from the files): ``OmniSchedulerMixin`` gets a ``skipped_waiting`` descriptor giving each scheduler its
own request queue (vLLM's ``create_request_queue(self.policy)``, made on first read). vLLM 0.31+ never leaves a
request skipped across steps, so between steps the queue is empty, as vllm-omni finds it there: it only reads and
removes from it. A vLLM that assigns it (<= 0.30) keeps its own.
Serves: vllm-omni 0.24.0-0.30.0's schedulers on vLLM 0.31+ (read from the wheels; vllm-omni 0.30.0's AR and
generation schedulers measured on CPU on vLLM 0.33).
Retire when: the oldest supported vllm-omni no longer reads ``self.skipped_waiting``.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ._class_stand_in import ClassAttributeStandIn

CLASS_NAME, NAME = "OmniSchedulerMixin", "skipped_waiting"  # the catalogue row's target
VLLM_SCHEDULER = "vllm/v1/core/sched/scheduler.py"
OMNI_SCHEDULERS = "vllm_omni/core/sched"
SLOT = "_vllm_compat_skipped_waiting"  # where a scheduler keeps its own queue


class Kind:
    ABSENT = "absent"  # vLLM or vllm-omni's schedulers not installed
    LACKS = "lacks"  # vLLM's Scheduler has no skipped_waiting (0.31+)
    DEFINES = "defines"  # vLLM's Scheduler assigns it (<= 0.30)


@dataclass(frozen=True)
class SkippedWaitingFacts:
    host: str
    readers: tuple[str, ...] = ()  # vllm-omni's scheduler files that read self.skipped_waiting

    def to_dict(self) -> dict:
        return asdict(self)


def reads_it(source: str | None) -> bool:
    """Whether ``source`` reads ``self.skipped_waiting`` (an attribute load, not ``getattr`` with a default)."""
    return source is not None and any(
        isinstance(n, ast.Attribute) and n.attr == NAME and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Name)
        and n.value.id == "self" for n in ast.walk(parse_source(source)))


def assigns_it(source: str | None) -> bool:
    return source is not None and any(
        isinstance(n, ast.Attribute) and n.attr == NAME and isinstance(n.ctx, ast.Store) for n in ast.walk(parse_source(source)))


def facts_of(vllm_tree, omni_tree) -> SkippedWaitingFacts:
    scheduler = vllm_tree.read(VLLM_SCHEDULER)
    if scheduler is None or omni_tree.read(f"{OMNI_SCHEDULERS}/omni_scheduler_mixin.py") is None:
        return SkippedWaitingFacts(Kind.ABSENT)
    readers = tuple(path for path in omni_tree.walk_py(OMNI_SCHEDULERS) if reads_it(omni_tree.read(path)))
    return SkippedWaitingFacts(Kind.DEFINES if assigns_it(scheduler) else Kind.LACKS, readers)


class SkippedWaiting:
    """vLLM <= 0.30's ``Scheduler.skipped_waiting`` for vllm-omni's reads: each scheduler's own request queue, made
    empty on first read (vllm_compat's stand-in, ``vllm_compat.bridges.scheduler_skipped_waiting``)."""

    def __get__(self, scheduler, owner=None):
        if scheduler is None:
            return self
        queue = scheduler.__dict__.get(SLOT)
        if queue is None:
            from vllm.v1.core.sched.request_queue import create_request_queue

            queue = scheduler.__dict__[SLOT] = create_request_queue(scheduler.policy)
        return queue

    def __set__(self, scheduler, queue) -> None:
        scheduler.__dict__[SLOT] = queue


STAND_IN = SkippedWaiting()  # one object, so a revert and a second apply put back the same one


class SchedulerSkippedWaiting(ClassAttributeStandIn):
    class_name, name, stand_in = CLASS_NAME, NAME, STAND_IN
    handles_drift = (("attribute", f"*.Scheduler.{NAME}", "*", NAME),)

    def detect_static(self, site) -> SkippedWaitingFacts:
        return facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> SkippedWaitingFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def decide(self, facts: SkippedWaitingFacts, controls=None):
        if facts.host == Kind.ABSENT:
            return self.decision(Action.PENDING, "vLLM or vllm-omni's schedulers are not installed; decided when "
                                 "they are imported")
        if facts.host == Kind.DEFINES:
            return self.decision(Action.SKIPPED, "vLLM's Scheduler has skipped_waiting; its own is used")
        if not facts.readers:
            return self.decision(Action.SKIPPED, "vLLM's Scheduler has no skipped_waiting (removed in 0.31), but no "
                                 "installed vllm-omni scheduler reads it")
        return self.decision(Action.PATCHED, "vLLM's Scheduler has no skipped_waiting (removed in 0.31) and vllm-omni's "
                             f"schedulers read it ({', '.join(facts.readers)}); each gets an empty request queue")


DRIFT_POINT = SchedulerSkippedWaiting()
