"""Stand-in for ``StructuredOutputManager.should_advance`` (``vllm.v1.structured_output``), removed in vLLM 0.30.

Why: vLLM 0.30 folded ``should_advance(request)`` into ``accept_tokens(request, new_token_ids)``, which advances the
grammar itself past the reasoning part of the tokens, and removed it. vllm-omni 0.24.0's ``OmniARScheduler`` and
``OmniGenerationScheduler`` still call ``self.structured_output_manager.should_advance(request)`` in
``update_from_output`` whenever a request produced tokens, and then advance the grammar themselves
(``grammar.accept_tokens(req_id, new_token_ids)``); on vLLM 0.30+ every AR or generation stage dies at its first
output (``AttributeError: 'StructuredOutputManager' object has no attribute 'should_advance'``, reproduced on CPU with
vllm-omni's own schedulers on vLLM 0.30 and 0.33; 0.34 lacks the method too, but stops those stages anyway by removing
the V1 model runner), with structured output or without.
When: vLLM's ``StructuredOutputManager`` defines no ``should_advance`` and an installed vllm-omni file calls it (both
read from the files with ``ast``): the class gets vLLM 0.24's method back, rebuilt on what the new manager still
offers (``_get_reasoner``, ``enable_in_reasoning``, the reasoning parser's ``is_reasoning_end`` /
``is_reasoning_end_streaming``); refused where those are gone. A vLLM that defines it keeps its own.
Serves: vllm-omni 0.24.0's AR and generation schedulers on vLLM 0.30-0.34 (measured on CPU on 0.30 and 0.33 against
vLLM 0.24.0's own method for the same requests; on 0.34 the method alone).
Retire when: the oldest supported vllm-omni no longer calls ``structured_output_manager.should_advance``.

Why vLLM 0.24's answers and not 0.25-0.29's: those answer True in the step that ends reasoning and rely on the caller
to feed the grammar only what follows the end marker (``trim_reasoning_for_advance``, which vLLM's own ``Scheduler``
calls and vllm-omni's schedulers do not); without that trim the grammar is fed ``</think>`` and the request is
terminated, as vllm-omni 0.24.0's AR scheduler on vLLM 0.27.1 and 0.29.0 shows on CPU
(``structured_output_reasoning_trim`` adds the trim there). vLLM 0.30+'s manager has no such trim, so the stand-in
keeps that step from the grammar, as 0.24 did.

The semantics are vLLM 0.24's, case by case: False without structured output (the common case); True for structured
output without a reasoning parser, with ``enable_in_reasoning`` or once reasoning has ended; with a parser and
reasoning not yet ended, reproduced rather than left out, since everything 0.24's code read is still there: it latches
``reasoning_ended`` when this step's tokens end reasoning and defers the grammar to the next step (False; True only
for a structural tag under speculative decoding, as 0.24 did). One piece of 0.24 lived elsewhere: its
``grammar_bitmask`` set ``reasoning_ended`` from the prompt (``should_fill_bitmask``) before any output, where 0.30+
leaves it unset when the prompt already ends reasoning; the stand-in sets it the same way when it finds it unset.
Where reasoning ends on an end token that is the step's last (every one-token step of a parser with an explicit end,
such as ``</think>``), this gives the grammar the tokens vLLM 0.30+'s own ``accept_tokens`` would (checked on CPU
against vLLM 0.30's ``Scheduler``). What it leaves out: a step in which reasoning ends before its last token
(speculative decoding) or on a token that is itself content (vLLM 0.33+'s implicit reasoning ends, e.g. a tool-call
start). vLLM 0.30+'s bitmask constrains that step's content tokens while 0.24's answer keeps them from the grammar, and
no yes/no answer can hand it only part of a step, so the grammar falls behind the output. The decision names it
(``leaves_out``), and the stand-in logs a warning the first time a request meets it.
"""

from __future__ import annotations

import ast
import itertools
import logging
from dataclasses import asdict, dataclass, replace

from ..decide import Action
from ..detect.source_tree import parse_source
from ._class_stand_in import ClassAttributeStandIn

CLASS_NAME, NAME = "StructuredOutputManager", "should_advance"  # the catalogue row's target
MANAGER_FILE = "vllm/v1/structured_output/__init__.py"
CALLER = "structured_output_manager"  # vllm-omni calls it as self.structured_output_manager.should_advance(...)
# What the stand-in reads from the manager: a method, and an attribute its __init__ assigns.
NEEDS_METHOD, NEEDS_ATTRIBUTE = "_get_reasoner", "enable_in_reasoning"
LEAVES_OUT = ("structured output after reasoning (where reasoning ends inside a step's tokens under speculative "
              "decoding, or on a content token as vLLM 0.33+'s implicit reasoning ends do, the AR stage's grammar "
              "misses that step's content tokens)")


class Kind:
    ABSENT = "absent"  # vLLM's structured-output manager not installed
    LACKS = "lacks"  # it defines no should_advance (vLLM 0.30+)
    DEFINES = "defines"  # it does (vLLM <= 0.29)


@dataclass(frozen=True)
class ShouldAdvanceFacts:
    host: str
    callers: tuple[str, ...] = ()  # vllm-omni files that call structured_output_manager.should_advance
    missing: tuple[str, ...] = ()  # what the stand-in reads that the manager no longer has

    def to_dict(self) -> dict:
        return asdict(self)


def calls_it(source: str | None) -> bool:
    """Whether ``source`` calls ``<...>.structured_output_manager.should_advance(...)``."""
    return source is not None and NAME in source and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == NAME
        and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == CALLER
        for n in ast.walk(parse_source(source)))


def manager_shape(source: str | None) -> tuple[str, tuple[str, ...]]:
    """``(kind, missing)`` for the manager class in ``source``: whether it defines ``should_advance``, and which of
    the method and the ``self.`` attribute the stand-in reads it lacks."""
    cls = None if source is None else next(
        (n for n in parse_source(source).body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME), None)
    if cls is None:
        return Kind.ABSENT, ()
    methods = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assigned = {t.attr for n in ast.walk(cls) if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    missing = tuple(name for name, found in ((NEEDS_METHOD, NEEDS_METHOD in methods),
                                             (NEEDS_ATTRIBUTE, NEEDS_ATTRIBUTE in assigned)) if not found)
    return (Kind.DEFINES if NAME in methods else Kind.LACKS), missing


def facts_of(vllm_tree, omni_tree) -> ShouldAdvanceFacts:
    host, missing = manager_shape(vllm_tree.read(MANAGER_FILE))
    callers = tuple(path for path in omni_tree.walk_py("vllm_omni") if calls_it(omni_tree.read(path)))
    return ShouldAdvanceFacts(host, callers, missing if host == Kind.LACKS else ())


def _goes_on_past_the_end(reasoner, all_token_ids, start: int) -> bool:
    """Whether this step's tokens (``all_token_ids[start:]``, reasoning ending in them) go on past the end of
    reasoning, or end on a token that is itself content: the case this stand-in leaves out."""
    delta = list(itertools.islice(all_token_ids, start, None))
    if delta and delta[-1] in getattr(reasoner, "implicit_reasoning_end_token_ids", ()):  # vLLM 0.33+
        return True
    return len(delta) > 1 and reasoner.is_reasoning_end_streaming(list(all_token_ids)[:-1], delta[:-1])


_warned: list[bool] = []  # once per process: one line where it happens, not one per step


def should_advance(self, request) -> bool:
    """vLLM 0.24's ``StructuredOutputManager.should_advance``: whether the grammar of ``request`` takes this step's
    new tokens (vllm_compat's stand-in, ``vllm_compat.bridges.structured_output_should_advance``)."""
    if not request.use_structured_output:
        return False
    reasoner = self._get_reasoner(request)
    if reasoner is None or self.enable_in_reasoning:
        return True
    structured_req = request.structured_output_request
    if structured_req.reasoning_ended is None:  # vLLM 0.24's grammar_bitmask had set it by now, from the prompt
        structured_req.reasoning_ended = reasoner.is_reasoning_end(request.prompt_token_ids or [])
    if structured_req.reasoning_ended:
        return True
    # Does reasoning end in this step's tokens? (vLLM 0.24's own reading of them)
    delta_from = request.num_computed_tokens - request.num_output_placeholders
    all_token_ids = request.all_token_ids
    start = delta_from if delta_from >= 0 else max(len(all_token_ids) + delta_from, 0)
    if not reasoner.is_reasoning_end_streaming(all_token_ids, itertools.islice(all_token_ids, start, None)):
        return False
    structured_req.reasoning_ended = True
    if not _warned and _goes_on_past_the_end(reasoner, all_token_ids, start):
        _warned.append(True)
        logging.getLogger("vllm_compat").warning(
            "vllm_compat: request %s ends reasoning inside a step; vllm-omni's scheduler advances its grammar from "
            "the next step, as on vLLM 0.24, so the structured output may not hold (left out: %s).",
            request.request_id, LEAVES_OUT)
    # Defer the grammar to the next step; vLLM 0.24's one exception: a structural tag under speculative decoding.
    from vllm.v1.structured_output.backend_types import StructuredOutputOptions

    return (self.vllm_config.speculative_config is not None
            and structured_req.structured_output_key[0] == StructuredOutputOptions.STRUCTURAL_TAG)


class StructuredOutputShouldAdvance(ClassAttributeStandIn):
    # the behavioural scan's finding: vllm-omni's schedulers call a method vLLM's manager no longer has
    handles_drift = (("call", f"*.{CLASS_NAME}.{NAME}", "*", NAME),)
    class_name, name, stand_in = CLASS_NAME, NAME, should_advance

    def detect_static(self, site) -> ShouldAdvanceFacts:
        return facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> ShouldAdvanceFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def decide(self, facts: ShouldAdvanceFacts, controls=None):
        if facts.host == Kind.ABSENT:
            return self.decision(Action.PENDING, f"vLLM's {CLASS_NAME} is not installed; decided when it is imported")
        if facts.host == Kind.DEFINES:
            return self.decision(Action.SKIPPED, f"vLLM's {CLASS_NAME} has {NAME}; its own is used")
        if not facts.callers:
            return self.decision(Action.SKIPPED, f"vLLM's {CLASS_NAME} has no {NAME} (removed in 0.30), but no "
                                 "installed vllm-omni calls it")
        if facts.missing:
            return self.refused(f"vLLM's {CLASS_NAME} has no {NAME} and vllm-omni calls it, but the stand-in reads "
                                f"{' and '.join(facts.missing)}, which this vLLM's {CLASS_NAME} lacks")
        return replace(self.decision(
            Action.PATCHED, f"vLLM's {CLASS_NAME} has no {NAME} (removed in 0.30) and vllm-omni calls it "
            f"({', '.join(facts.callers)}); vLLM 0.24's method is put back"), leaves_out=LEAVES_OUT,
            leaves_out_of="llm_stage")

    def report_lines(self, facts: ShouldAdvanceFacts) -> list[str]:
        acts = facts.host == Kind.LACKS and facts.callers and not facts.missing
        return [f"left out: {LEAVES_OUT}"] if acts else []

    def prepare(self, owner, facts):
        """The contract on the imported class: the method the stand-in calls is there."""
        if not callable(getattr(owner, NEEDS_METHOD, None)):
            from ..errors import PatchRefusedError

            raise PatchRefusedError(f"{CLASS_NAME}.{NEEDS_METHOD} is not a method here (found "
                                    f"{getattr(owner, NEEDS_METHOD, None)!r}); the {NAME} stand-in calls it. Set "
                                    f"VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, or upgrade vllm_compat.")
        return None


DRIFT_POINT = StructuredOutputShouldAdvance()
