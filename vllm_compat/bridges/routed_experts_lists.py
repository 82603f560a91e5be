"""Stand-in for ``vllm.v1.outputs.RoutedExpertsLists``, removed in vLLM 0.31.0.

Why: in vLLM <= 0.30 it is a two-field NamedTuple (``routing_data``, ``slot_mapping``: numpy arrays); vLLM 0.31
removed it, and vllm-omni 0.24.0 and 0.30.0 import it at module level in ``vllm_omni/core/sched/utils.py``, which
``import vllm_omni`` reaches: both die at import on vLLM 0.31-0.33.
When: vLLM's ``vllm.v1.outputs`` lacks the name and an installed vllm-omni imports it (read from vllm-omni's
files); a vLLM that defines it (<= 0.30) keeps its own. It must be in place before ``import vllm_omni``: the
startup hook (``vllm_compat_startup.pth``) registers the import hook that installs it.
Serves: vllm-omni 0.24.0 and 0.30.0 on vLLM 0.31-0.33 (vLLM <= 0.30 keeps its own).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.v1.outputs.RoutedExpertsLists``.

The definition is the smallest that satisfies the callers, not a copy of vLLM's: ``core/sched/utils.py`` uses it
as an annotation and reads ``.routing_data`` / ``.slot_mapping``; ``worker/gpu_model_runner.py`` builds it with
those two keywords (inside a function, only when routed experts are returned). Nothing in vLLM 0.31+ consumes
it, so returning routed experts (``enable_return_routed_experts``) is not restored by it: only the imports are.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._name_stand_in import NameStandIn

NAME = "RoutedExpertsLists"  # the catalogue row's target, on vllm.v1.outputs
# The vllm-omni files that import it (0.24.0 and 0.30.0): read, never imported.
IMPORTERS = ("vllm_omni/core/sched/utils.py", "vllm_omni/worker/gpu_model_runner.py")


class RoutedExpertsLists(NamedTuple):
    """vLLM 0.30's CPU-side routed experts of one scheduler step (stand-in by vllm_compat)."""

    routing_data: Any  # numpy array (num_scheduled_tokens, num_layers, num_experts_per_tok)
    slot_mapping: Any  # numpy array (num_scheduled_tokens,): the KV-cache slot of each row


# ---- the drift point ----

class RoutedExpertsListsStandIn(NameStandIn):
    importers = IMPORTERS
    removed_in = "0.31"

    def build(self, owner):
        return RoutedExpertsLists


DRIFT_POINT = RoutedExpertsListsStandIn()
