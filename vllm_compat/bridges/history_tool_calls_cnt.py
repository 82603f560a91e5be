"""Stand-in for ``vllm.entrypoints.chat_utils.get_history_tool_calls_cnt``, removed in vLLM 0.28.0.

Why: vLLM <= 0.27 counts the tool calls of a chat history's assistant messages with it; vLLM 0.28 removed it for
``vllm.parser.utils.count_chat_history_tool_calls``, which counts differently (a ``dict`` or ``str`` as one call,
not by its length; non-dict messages skipped, not a ``KeyError``). vllm-omni 0.24.0 imports the old name at module
level in ``vllm_omni/entrypoints/openai/serving_chat.py``, which its server module imports: ``vllm serve --omni``
dies with ``ImportError: cannot import name 'get_history_tool_calls_cnt'`` on vLLM 0.28+.
When: vLLM's ``vllm.entrypoints.chat_utils`` lacks the name and an installed vllm-omni imports it (read from its
files). On vLLM 0.32+ that module is gone and ``moved_names`` aliases it to ``vllm.renderers.chat_utils``; the
stand-in goes onto that module object (what the old path resolves to), where it is equally missing. A vLLM that
defines it (<= 0.27) keeps its own.
Serves: vllm-omni 0.24.0 on vLLM 0.28-0.34 (vllm-omni 0.26.0+ import vLLM's ``count_chat_history_tool_calls``).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.entrypoints.chat_utils.get_history_tool_calls_cnt``.

The definition is vLLM 0.27's own behaviour, not vLLM 0.28's function under the old name: vllm-omni 0.24.0 calls it
with the chat ``conversation`` (``list[ConversationMessage]``, every message with a ``role``) only where the model's
tool-call id type is ``kimi_k2``, to number the ids of new tool calls after the history's; the count must stay the
one vllm-omni 0.24.0 was written against (``tests/bridges/test_history_tool_calls_cnt.py`` compares it with vLLM
0.27.1's function, read from its wheel).
"""

from __future__ import annotations

from ._name_stand_in import NameStandIn

NAME = "get_history_tool_calls_cnt"  # the catalogue row's target, on vllm.entrypoints.chat_utils
# The old module's home on vLLM 0.32+ (the module the moved_names alias resolves the old path to): where the static
# facts look for the name once vLLM's files have no vllm/entrypoints/chat_utils.py.
ALIASED_HOME = "vllm.renderers.chat_utils"
# The vllm-omni files that import it (0.24.0): read, never imported.
IMPORTERS = ("vllm_omni/entrypoints/openai/serving_chat.py",)


def get_history_tool_calls_cnt(conversation) -> int:
    """The number of tool calls in the assistant messages of ``conversation`` (vLLM <= 0.27's count; stand-in by
    vllm_compat): ``len(list(tool_calls))`` of each assistant message that has them."""
    count = 0
    for message in conversation:
        if message["role"] == "assistant":
            tool_calls = message.get("tool_calls")
            count += len(list(tool_calls)) if tool_calls is not None else 0
    return count


# ---- the drift point ----

class HistoryToolCallsCntStandIn(NameStandIn):
    importers = IMPORTERS
    removed_in = "0.28"

    def build(self, owner):
        return get_history_tool_calls_cnt

    def facts_from_files(self, site):
        """As every name stand-in's, except where vLLM's files have no ``vllm/entrypoints/chat_utils.py`` (0.32+): the
        host is then the aliased home's answer (``ALIASED_HOME``), the module the old path resolves to at runtime."""
        from . import HostKind, StandInFacts, host_lookup

        facts = super().facts_from_files(site)
        if facts.host != HostKind.NO_MODULE:
            return facts
        return StandInFacts(host_lookup(site.vllm_tree, ALIASED_HOME, self.name), facts.importers)


DRIFT_POINT = HistoryToolCallsCntStandIn()
