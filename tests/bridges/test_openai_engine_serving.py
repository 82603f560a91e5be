"""The ``openai_engine_serving`` bridge on the real wheels (the shared checks: ``serve_stand_in_cases``)."""

from __future__ import annotations

import pytest

from tests.bridges.serve_stand_in_cases import cases
from vllm_compat.bridges import openai_engine_serving as bridge

CASES = cases(bridge)
globals().update(CASES)
STATIC = CASES["STATIC"]
needs_missing = CASES["needs_missing"]


def test_refused_where_the_new_definitions_changed():
    """vLLM 0.30+ edited GenerateBaseServing (other keys): no alias, a refusal naming what changed."""
    from vllm_compat.bridges import HostKind
    from vllm_compat.config import Controls
    from vllm_compat.decide import Action

    facts = bridge.facts_for_table(HostKind.LACKS, ("vllm_omni.entrypoints.openai.serving_speech:29 (module)",),
                                   changed=True)
    decision = bridge.DRIFT_POINT.decide(facts, Controls())
    assert decision.action == Action.REFUSED and "OpenAIServing: changed" in decision.reason


def test_definition_keys_on_this_vllm():
    """On vLLM 0.25.1 the new module holds 0.24's two definitions (renamed class included); elsewhere the facts say
    what was found (read from the files, the keys re-derived here from vLLM 0.24's own source: MOVED)."""
    from vllm_compat.bridges import HostKind

    if STATIC.host != HostKind.LACKS:
        pytest.skip(f"vLLM {STATIC.host} {bridge.OLD_MODULE}")
    states = dict(STATIC.definitions)
    assert set(states) == set(bridge.MOVED)
    from conftest import VLLM_VERSION

    if VLLM_VERSION == "0.25.1":
        assert states == {name: "same" for name in bridge.MOVED}
