"""The ``get_history_tool_calls_cnt`` stand-in on the real wheels: vllm-omni 0.24.0's ``serving_chat`` import of it
fails on vLLM 0.28+ without it (the real ImportError, reproduced first), works with it, and the stand-in counts what
vLLM 0.27.1's own function counts (the oracle: that function, read from vLLM 0.27.1's wheel and run here)."""

from __future__ import annotations

import ast
import importlib

import pytest

from conftest import VLLM_VERSION, needs_startup_hook, needs_vllm
from tests.bridges import name_stand_in_cases as cases
from vllm_compat.bridges import HostKind
from vllm_compat.bridges import history_tool_calls_cnt as bridge
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
TARGET = POINT.entry.target_path
# vllm-omni 0.24.0's own import statement (vllm_omni/entrypoints/openai/serving_chat.py:18), the name it needs
OMNI_IMPORT = f"from {POINT.entry.target_module} import {bridge.NAME}"
needs_missing_name = pytest.mark.skipif(
    STATIC.host != HostKind.LACKS or not STATIC.importers,
    reason=f"needs vLLM >= 0.28 (no {TARGET}) with a vllm-omni that imports it (0.24.0); here: vLLM {STATIC.host} "
    f"it, importers {list(STATIC.importers) or 'none'}")
needs_vllm_defining_it = pytest.mark.skipif(
    STATIC.host != HostKind.DEFINES, reason=f"needs a vLLM that defines {TARGET} (<= 0.27); here: {STATIC.host}")

# Chat histories as vLLM's chat parsing hands them to the serving (ConversationMessage dicts, every one with a
# role; an assistant's tool_calls a list of {"id", "type", "function"} dicts), plus the shapes 0.27's count takes
# by length where 0.28's counts one (a dict, a str: what a malformed history could carry).
CALL = {"id": "functions.get_weather:0", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
HISTORIES = {
    "empty": [],
    "no-assistant": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}],
    "assistant-without-calls": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
    "assistant-calls-none": [{"role": "assistant", "content": "x", "tool_calls": None}],
    "two-turns": [{"role": "user", "content": "a"}, {"role": "assistant", "content": None, "tool_calls": [CALL, CALL]},
                  {"role": "tool", "content": "r", "tool_call_id": "functions.get_weather:0"},
                  {"role": "assistant", "content": None, "tool_calls": [CALL]},
                  {"role": "tool", "content": "r", "tool_call_id": "functions.get_weather:2"}],
    "empty-calls": [{"role": "assistant", "content": "", "tool_calls": []}],
    "non-assistant-calls-ignored": [{"role": "user", "content": "a", "tool_calls": [CALL, CALL, CALL]}],
    "calls-as-tuple": [{"role": "assistant", "content": None, "tool_calls": (CALL, CALL)}],
    "calls-as-dict": [{"role": "assistant", "content": None, "tool_calls": {"a": CALL, "b": CALL}}],
    "calls-as-str": [{"role": "assistant", "content": None, "tool_calls": "abc"}],
}


def oracle():
    """vLLM 0.27.1's own ``get_history_tool_calls_cnt``, compiled from the cached wheel (never from the stand-in)."""
    from vllm_compat.detect.source_tree import SourceTree
    from vllm_compat.detect.wheels import cache_dir, cached_wheel

    wheel = cached_wheel("vllm", "0.27.1", cache_dir())
    if wheel is None:
        pytest.skip(f"vLLM 0.27.1's wheel is not in {cache_dir()} (`vllm-compat check vllm==0.27.1` fetches it)")
    source = SourceTree(wheel).read("vllm/entrypoints/chat_utils.py")
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == bridge.NAME)
    node.args.args[0].annotation = None  # ConversationMessage lives in the rest of the file
    namespace: dict = {}
    exec(compile(ast.Module([node], []), "vllm-0.27.1/vllm/entrypoints/chat_utils.py", "exec"), namespace)
    return namespace[bridge.NAME]


@pytest.mark.parametrize(("facts", "action"), cases.DECISION_CASES, ids=cases.DECISION_IDS)
def test_decision_table(facts, action):
    cases.check_decision(POINT, facts, action)


@pytest.mark.parametrize("history", list(HISTORIES), ids=list(HISTORIES))
def test_the_stand_in_counts_what_vllm_0_27_counts(history):
    conversation = HISTORIES[history]
    assert bridge.get_history_tool_calls_cnt(conversation) == oracle()(conversation)


def test_a_message_without_a_role_fails_as_on_vllm_0_27():
    with pytest.raises(KeyError) as ours:
        bridge.get_history_tool_calls_cnt([{"content": "x"}])
    with pytest.raises(KeyError) as theirs:
        oracle()([{"content": "x"}])
    assert ours.value.args == theirs.value.args


@needs_vllm
def test_vllm_0_28_s_count_is_not_the_old_one():
    """Why a stand-in and not an alias of vLLM 0.28+'s ``count_chat_history_tool_calls``: on a history the old count
    takes by length, the new one gives another number."""
    try:
        from vllm.parser.utils import count_chat_history_tool_calls
    except ImportError:
        pytest.skip(f"vLLM {VLLM_VERSION} has no vllm.parser.utils.count_chat_history_tool_calls (< 0.28)")
    history = HISTORIES["calls-as-dict"]
    assert count_chat_history_tool_calls(history) == 1 and oracle()(history) == 2
    assert count_chat_history_tool_calls(HISTORIES["two-turns"]) == oracle()(HISTORIES["two-turns"]) == 3


@needs_vllm
def test_static_and_runtime_facts_agree():
    try:
        module = importlib.import_module(POINT.entry.target_module)
    except ImportError as exc:  # vLLM 0.32+ without the moved_names alias of the module
        pytest.skip(f"{POINT.entry.target_module} does not import here ({exc})")
    assert POINT.compare(STATIC, POINT.detect_runtime(module)) == []


@needs_missing_name
def test_unpatched_import_fails_with_the_real_import_error():
    """Without the stand-in (the other bridges on), vllm-omni 0.24.0's import statement dies on vLLM 0.28+."""
    cases.check_unpatched_import_fails(POINT, OMNI_IMPORT, bridge.NAME)


@needs_missing_name
@needs_startup_hook
def test_import_works_with_the_stand_in_and_revert_removes_exactly_it():
    out = cases.import_through_the_hook_and_revert(
        POINT, OMNI_IMPORT, bridge.NAME,
        also=f'out.update(count={bridge.NAME}({HISTORIES["two-turns"]!r}))')
    assert out["count"] == oracle()(HISTORIES["two-turns"]) == 3


@needs_missing_name
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    cases.check_install_uninstall_exact(POINT, STATIC, importlib.import_module(POINT.entry.target_module))


@needs_vllm_defining_it
def test_stays_out_where_vllm_defines_it_and_vllm_s_own_counts_the_same():
    own = cases.check_stays_out_where_vllm_defines_it(POINT, importlib.import_module(POINT.entry.target_module))
    assert all(own(h) == bridge.get_history_tool_calls_cnt(h) for h in HISTORIES.values())
