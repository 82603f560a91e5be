"""Left out: routed-experts capture in vllm-omni's LLM / AR stages on vLLM 0.28-0.30 (``clear_buffer`` is gone).

Why: vLLM <= 0.27's runner zeroed its ``RoutedExpertsCapturer``'s device buffer at the start of every step
(``clear_buffer``); vLLM 0.28 rebuilt the capture (every routed layer overwrites the step's rows, the runner keeps
its own slot mapping) and dropped the method. vllm-omni 0.24.0-0.30.0's ``GPUARModelRunner.execute_model`` and
``GPUGenerationModelRunner.execute_model`` still call ``self.routed_experts_capturer.clear_buffer()`` first thing
whenever capture is on (``enable_return_routed_experts``), so on vLLM 0.28-0.30 every step of such a model dies
with ``AttributeError: 'RoutedExpertsCapturer' object has no attribute 'clear_buffer'``; models without capture
never reach the call. Supplying the method would make the step run, but what it returns then goes through vllm-omni's
copy of vLLM 0.24's scheduler bookkeeping into vLLM 0.28's slot-keyed capture, which nothing here can drive on CPU
(an MoE forward with capture): nothing is installed, and check / doctor name the feature as left out instead of
the scan's unhandled call.
When: vLLM's ``RoutedExpertsCapturer`` (``vllm/model_executor/layers/fused_moe/routed_experts_capturer.py``) defines
no ``clear_buffer``, vLLM's V1 runner still sets up capture itself (its ``gpu_model_runner.py`` assigns
``self.routed_experts_capturer``; vLLM 0.31 moved capture out of the runner, where ``runner_routed_experts_removed``
leaves it out), and a vllm-omni runner under ``vllm_omni/worker`` calls ``self.routed_experts_capturer
.clear_buffer()`` (all read with ``ast``): skipped, naming the feature as left out of the LLM / AR stages.
Serves: vllm-omni 0.24.0-0.30.0 on vLLM 0.28-0.30 (read from the wheels; the failing call reproduced on CPU with
vllm-omni's runners and vLLM's capturer on vLLM 0.29 and 0.30). vllm-omni 0.28.0 and 0.30.0 make the call on their
own vLLM too: a bug native to those pairs, which the scan's subtraction of the native baseline hides by design and
this entry names.
Retire when: the oldest supported vllm-omni no longer calls ``RoutedExpertsCapturer.clear_buffer``.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, replace

from ..decide import Action, Decision
from ..detect.source_tree import parse_source
from ._method import MethodPatch

VLLM_CAPTURER = "vllm/model_executor/layers/fused_moe/routed_experts_capturer.py"
VLLM_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
OMNI_RUNNERS = "vllm_omni/worker"
CAPTURER, CLEAR, HOLDER = "RoutedExpertsCapturer", "clear_buffer", "routed_experts_capturer"
LEAVES_OUT = "routed-experts capture (return of the experts each token was routed to) in the LLM / AR stages"
WHAT_HAPPENS = ("vLLM 0.28+'s RoutedExpertsCapturer has no clear_buffer, which vllm-omni's runners call at every "
                "step where capture is on")


class Kind:
    ABSENT = "absent"  # vLLM's capturer or vllm-omni's runners are not installed
    CLEARS = "clears"  # vLLM's RoutedExpertsCapturer defines clear_buffer (<= 0.27)
    NOT_IN_RUNNER = "not-in-runner"  # vLLM's V1 runner no longer sets up capture (0.31+) or is gone (0.34)
    NO_CLEAR = "no-clear"  # the runner captures, and the capturer has no clear_buffer (0.28-0.30)


@dataclass(frozen=True)
class ClearBufferFacts:
    host: str
    callers: tuple[str, ...] = ()  # "file:line" of each vllm-omni call of self.routed_experts_capturer.clear_buffer()

    def to_dict(self) -> dict:
        return asdict(self)


def vllm_shape(capturer_source: str | None, runner_source: str | None) -> str:
    """``Kind`` of the installed vLLM's capture, read from its capturer's and its V1 runner's files."""
    if capturer_source is None:
        return Kind.ABSENT
    capturer = next((node for node in ast.walk(parse_source(capturer_source))
                     if isinstance(node, ast.ClassDef) and node.name == CAPTURER), None)
    if capturer is None:
        return Kind.ABSENT
    if any(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == CLEAR for item in capturer.body):
        return Kind.CLEARS
    runner_sets_up = runner_source is not None and any(
        isinstance(node, ast.Assign) and any(isinstance(t, ast.Attribute) and t.attr == HOLDER for t in node.targets)
        for node in ast.walk(parse_source(runner_source)))
    return Kind.NO_CLEAR if runner_sets_up else Kind.NOT_IN_RUNNER


def callers_in(source: str | None, path: str) -> tuple[str, ...]:
    """``path:line`` of every ``<x>.routed_experts_capturer.clear_buffer()`` call in ``source``."""
    if source is None or CLEAR not in source:
        return ()
    return tuple(f"{path}:{node.lineno}" for node in ast.walk(parse_source(source))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == CLEAR
                 and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == HOLDER)


def facts_of(vllm_tree, omni_tree) -> ClearBufferFacts:
    host = vllm_shape(vllm_tree.read(VLLM_CAPTURER), vllm_tree.read(VLLM_RUNNER))
    paths = omni_tree.walk_py(OMNI_RUNNERS)
    if host == Kind.ABSENT or not paths:
        return ClearBufferFacts(Kind.ABSENT)
    return ClearBufferFacts(host, tuple(c for p in paths for c in callers_in(omni_tree.read(p), p)))


def is_left_out(facts: ClearBufferFacts) -> bool:
    return facts.host == Kind.NO_CLEAR and bool(facts.callers)


class RoutedExpertsClearBuffer(MethodPatch):
    """Reports the feature left out; installs nothing (the decision is never "patched")."""

    # the scan's finding this decision names in words: vllm-omni's runners calling the method vLLM dropped
    handles_drift = (("call", f"vllm.model_executor.layers.fused_moe.routed_experts_capturer.{CAPTURER}.{CLEAR}",
                      "vllm_omni.worker.*", CLEAR),)

    def detect_static(self, site) -> ClearBufferFacts:
        return facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> ClearBufferFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def decide(self, facts: ClearBufferFacts, controls=None) -> Decision:
        if facts.host == Kind.ABSENT:
            return self.decision(Action.PENDING, "vLLM's RoutedExpertsCapturer or vllm-omni's runners are not "
                                 "installed; decided when they are imported")
        if facts.host == Kind.CLEARS:
            return self.decision(Action.SKIPPED, f"vLLM's {CAPTURER} has {CLEAR}, as vllm-omni's runners expect")
        if facts.host == Kind.NOT_IN_RUNNER:
            return self.decision(Action.SKIPPED, "vLLM's V1 runner no longer sets up routed-experts capture, so "
                                 f"vllm-omni's runners never reach {CLEAR}")
        if not facts.callers:
            return self.decision(Action.SKIPPED, f"vLLM's {CAPTURER} has no {CLEAR}, and no installed vllm-omni "
                                 "runner calls it")
        return replace(self.decision(
            Action.SKIPPED, f"left out: {LEAVES_OUT}. {WHAT_HAPPENS} ({', '.join(facts.callers)}); nothing is "
            "installed"), leaves_out=LEAVES_OUT, leaves_out_of="llm_stage")

    def install(self, owner, decision: Decision, state) -> bool:
        return False  # never decided "patched": there is nothing to install

    def report_lines(self, facts: ClearBufferFacts) -> list[str]:
        return [f"left out: {LEAVES_OUT} ({WHAT_HAPPENS})"] if is_left_out(facts) else []


DRIFT_POINT = RoutedExpertsClearBuffer()
