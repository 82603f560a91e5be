"""What every name stand-in's tests check (tests/bridges/test_fp8_copy_missing_attrs.py, test_routed_experts_lists.py,
test_multimodal_processing_info.py, test_history_tool_calls_cnt.py, and the function stand-ins'
test_engine_zmq_addresses.py and test_kv_cache_configs.py call these with their bridge): the decision table and the
two detections agreeing on the real wheels."""

from __future__ import annotations

from tests.bridges.module_stand_in_cases import check_static_and_runtime_agree  # noqa: F401 - the same check
from vllm_compat.bridges import HostKind, StandInFacts
from vllm_compat.bridges._name_stand_in import FunctionStandInFacts, Shape
from vllm_compat.config import Controls
from vllm_compat.decide import Action, decide_entry

IMPORTER = ("vllm_omni.some.module:1 (module)",)
DECISION_CASES = [
    (StandInFacts(HostKind.LACKS, IMPORTER), Action.PATCHED),
    (StandInFacts(HostKind.LACKS, ()), Action.SKIPPED),
    (StandInFacts(HostKind.DEFINES, IMPORTER), Action.SKIPPED),
    (StandInFacts(HostKind.NO_MODULE, IMPORTER), Action.SKIPPED),
    (StandInFacts(HostKind.ABSENT, ()), Action.PENDING),
    (StandInFacts(HostKind.UNKNOWN, IMPORTER), Action.PENDING),
]
DECISION_IDS = ["lacks+imported", "lacks+unused", "defines", "no-module", "no-vllm", "unknown"]

# A function stand-in is built between two shapes (vLLM's replacement, vllm-omni's calls): either unknown refuses.
FUNCTION_DECISION_CASES = [
    (FunctionStandInFacts(HostKind.LACKS, IMPORTER, Shape.KNOWN, Shape.KNOWN), Action.PATCHED),
    (FunctionStandInFacts(HostKind.DEFINES, IMPORTER), Action.SKIPPED),
    (FunctionStandInFacts(HostKind.LACKS, (), Shape.KNOWN, Shape.KNOWN), Action.SKIPPED),
    (FunctionStandInFacts(HostKind.NO_MODULE, IMPORTER), Action.SKIPPED),
    (FunctionStandInFacts(HostKind.LACKS, IMPORTER, Shape.UNKNOWN, Shape.KNOWN), Action.REFUSED),
    (FunctionStandInFacts(HostKind.LACKS, IMPORTER, Shape.KNOWN, Shape.UNKNOWN), Action.REFUSED),
    (FunctionStandInFacts(HostKind.ABSENT, IMPORTER), Action.PENDING),
    (FunctionStandInFacts(HostKind.UNKNOWN, IMPORTER), Action.PENDING),
]
FUNCTION_DECISION_IDS = ["provide", "vllm-has-it", "no-importer", "no-module", "unknown-replacement",
                         "unknown-calls", "no-vllm", "files-cannot-tell"]


def check_decision(point, facts, action):
    """``facts`` decide ``action`` under the default controls; disabling the entry makes any facts DISABLED."""
    assert point.decide(facts, Controls()).action == action
    assert decide_entry(point.entry, facts, Controls(disabled_patches=frozenset({point.id}))).action == Action.DISABLED
