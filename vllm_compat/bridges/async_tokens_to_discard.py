"""Adapter: vllm-omni's ``request.async_tokens_to_discard`` drops in-flight output again (vLLM 0.27 stopped reading it).

Why: under async scheduling a request has output in flight when its turn ends. vllm-omni 0.24.0 / 0.26.0's AR
scheduler then sets ``request.async_tokens_to_discard`` (a streaming session's next input chunk, a resumable
segment's stop), and vLLM <= 0.26's ``AsyncScheduler._update_request_with_output`` dropped that many output frames.
vLLM 0.27 (a0c092ee72) replaced the counter with its own stale-output bookkeeping inside ``update_from_output``, which
vllm-omni's schedulers replace with their copies of vLLM 0.24's; ``Request`` no longer sets the counter. So on vLLM
0.27+ the finished turn's in-flight token silently becomes the next turn's first output (vllm-omni's own AR async
scheduler on CPU: the native pair streams ``100, 101, 102, 104, ...``, vLLM 0.30 ``100, 101, 102, 103, ...``), and
reading the counter on a request that never set it raises ``AttributeError`` (vllm-omni 0.26.0's
``test_resumable_segment_stop_reconciles_async_placeholders[0]``). vllm-omni 0.28.0+ reads the counter in its own
``update_from_output``.
When: vLLM's ``AsyncScheduler`` no longer reads ``async_tokens_to_discard``, an installed vllm-omni scheduler file
assigns it and none reads it (all read from the files with ``ast``): ``OmniARAsyncScheduler`` gets vLLM 0.26's
``_update_request_with_output`` step (drop one frame per pending count, then vLLM's own method), and ``OmniRequest``
the counter's default, 0, as vLLM 0.26's ``Request.__init__`` gave it. Nothing of vLLM's changes: both names are put
only where vllm-omni's class lacks them.
Serves: vllm-omni 0.24.0 / 0.26.0's AR stage under async scheduling on vLLM 0.27+ (measured on CPU on vLLM 0.30).
Retire when: the oldest supported vllm-omni reads ``async_tokens_to_discard`` itself (0.28.0 does).

Not bridged here: vLLM 0.27+ also counts a request's in-flight tokens (``num_in_flight_tokens``) in ``schedule`` and
takes them off in its ``update_from_output``, which vllm-omni's copy does not; vLLM reads the count to free a
sliding-window model's blocks early, so those blocks stay until the request ends.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, provide, withdraw

COUNTER = "async_tokens_to_discard"
CLASS_NAME, METHOD = "OmniARAsyncScheduler", "_update_request_with_output"  # the catalogue row's target
VLLM_ASYNC_SCHEDULER = "vllm/v1/core/sched/async_scheduler.py"
OMNI_SCHEDULERS = "vllm_omni/core/sched"


class Kind:
    ABSENT = "absent"  # vLLM's AsyncScheduler or vllm-omni's schedulers are not installed
    READS = "reads"  # vLLM's AsyncScheduler drops the frames (<= 0.26)
    IGNORES = "ignores"  # it no longer reads the counter (0.27+)


@dataclass(frozen=True)
class DiscardFacts:
    host: str
    setters: tuple[str, ...] = ()  # vllm-omni scheduler files that assign the counter
    readers: tuple[str, ...] = ()  # vllm-omni scheduler files that read it (0.28.0+: they drop frames themselves)

    def to_dict(self) -> dict:
        return asdict(self)


def uses(source: str | None, context: type) -> bool:
    """Whether ``source`` uses ``<...>.async_tokens_to_discard`` as ``context`` (``ast.Store`` or ``ast.Load``; a
    load also as ``getattr(x, "async_tokens_to_discard", ...)``)."""
    if source is None or COUNTER not in source:
        return False
    return any((isinstance(n, ast.Attribute) and n.attr == COUNTER and isinstance(n.ctx, context))
               or (context is ast.Load and isinstance(n, ast.Call) and getattr(n.func, "id", None) == "getattr"
                   and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant) and n.args[1].value == COUNTER)
               for n in ast.walk(parse_source(source)))


def facts_of(vllm_tree, omni_tree) -> DiscardFacts:
    scheduler = vllm_tree.read(VLLM_ASYNC_SCHEDULER)
    paths = omni_tree.walk_py(OMNI_SCHEDULERS)
    if scheduler is None or not paths:
        return DiscardFacts(Kind.ABSENT)
    sources = {path: omni_tree.read(path) for path in paths}
    return DiscardFacts(Kind.READS if uses(scheduler, ast.Load) else Kind.IGNORES,
                        tuple(p for p, s in sources.items() if uses(s, ast.Store)),
                        tuple(p for p, s in sources.items() if uses(s, ast.Load)))


def _update_request_with_output(self, request, new_token_ids, *args, **kwargs):
    """vLLM 0.26's ``AsyncScheduler`` step: while the request has in-flight output frames to discard, drop one per
    call; otherwise vLLM's own method (vllm_compat, ``async_tokens_to_discard``)."""
    pending = getattr(request, COUNTER, 0)
    if pending > 0:
        setattr(request, COUNTER, pending - 1)
        return [], False
    owner = next(klass for klass in type(self).__mro__ if vars(klass).get(METHOD) is _update_request_with_output)
    return getattr(super(owner, self), METHOD)(request, new_token_ids, *args, **kwargs)


class CounterDefault:
    """``OmniRequest.async_tokens_to_discard``: 0 until vllm-omni sets it on the request, as vLLM 0.26's
    ``Request.__init__`` gave it (vllm_compat, ``async_tokens_to_discard``)."""

    def __get__(self, request, owner=None):
        return self if request is None else request.__dict__.get(COUNTER, 0)

    def __set__(self, request, value) -> None:
        request.__dict__[COUNTER] = value


COUNTER_DEFAULT = CounterDefault()  # one object each, so a revert and a second apply put back the same ones


class AsyncTokensToDiscard(DriftPoint):
    handles_drift = (("unread", "*.Request.async_tokens_to_discard", "*", "async_tokens_to_discard"),)

    def detect_static(self, site) -> DiscardFacts:
        return facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> DiscardFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def decide(self, facts: DiscardFacts, controls=None):
        if facts.host == Kind.ABSENT:
            return self.decision(Action.PENDING, "vLLM's AsyncScheduler or vllm-omni's schedulers are not installed; "
                                 "decided when they are imported")
        if facts.host == Kind.READS:
            return self.decision(Action.SKIPPED, f"vLLM's AsyncScheduler drops the in-flight frames {COUNTER} counts")
        if not facts.setters:
            return self.decision(Action.SKIPPED, f"vLLM's AsyncScheduler no longer reads {COUNTER} (0.27+), and no "
                                 "installed vllm-omni scheduler sets it")
        if facts.readers:
            return self.decision(Action.SKIPPED, f"vLLM's AsyncScheduler no longer reads {COUNTER} (0.27+); vllm-omni "
                                 f"reads it itself ({', '.join(facts.readers)})")
        return self.decision(Action.PATCHED, f"vLLM's AsyncScheduler no longer reads {COUNTER} (0.27+), which "
                             f"vllm-omni sets ({', '.join(facts.setters)}) to drop a finished turn's in-flight output; "
                             f"{CLASS_NAME} drops it again, as vLLM 0.26 did")

    def locate(self, module):
        cls = getattr(module, CLASS_NAME, None)
        return cls if isinstance(cls, type) else None

    def in_place(self, owner):
        return vars(owner).get(METHOD) if owner is not None else None

    def prepare(self, owner, facts):
        """vllm-omni's request class, which gets the counter's default (the scheduler module imports it first)."""
        from vllm_omni.request import OmniRequest

        return OmniRequest

    def install(self, owner, decision, state) -> bool:
        added = provide(owner, METHOD, _update_request_with_output, self.id)
        return provide(state, COUNTER, COUNTER_DEFAULT, self.id) or added

    def uninstall(self, owner) -> bool:
        from vllm_omni.request import OmniRequest

        withdrawn = withdraw(owner, METHOD, self.id)
        return withdraw(OmniRequest, COUNTER, self.id) or withdrawn


DRIFT_POINT = AsyncTokensToDiscard()
