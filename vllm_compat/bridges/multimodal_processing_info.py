"""Stand-in for ``vllm.multimodal.processing.processor.MultiModalProcessingInfo``, removed in vLLM 0.31.0.

Why: in vLLM <= 0.30 it is a three-field NamedTuple (``kwargs``, ``hashes``, ``prompt_updates``) that
``BaseMultiModalProcessor._cached_apply_hf_processor`` returns; vLLM 0.31 replaced it by ``MultiModalProcessingResult``,
which adds a required first field ``prompt_ids`` (so an alias would be wrong: vllm-omni's three-keyword construction
raises TypeError on it). vllm-omni 0.30.0 imports it at module level in
``vllm_omni/model_executor/models/qwen2_5_omni/qwen2_5_omni_thinker.py``, which its diffusion worker reaches
(``diffusion_worker`` -> ``engine.stage_init_utils`` -> ... -> ``config.pipeline_registry`` -> ``models.auk`` ->
``qwen2_5_omni``), so on vLLM 0.31-0.33 the diffusion worker does not start.
When: vLLM's processor module lacks the name and an installed vllm-omni imports it (read from vllm-omni's files); a
vLLM that defines it (<= 0.30) keeps its own. Installed by the hook on the processor module, before the thinker's
import of it runs.
Serves: vllm-omni 0.30.0's diffusion worker import chain on vLLM 0.31-0.33 (vLLM <= 0.30 keeps its own; vllm-omni
0.24.0 does not import it).
Retire when: the oldest supported vllm-omni no longer imports it (it moves to ``MultiModalProcessingResult``).

What it does and does not bridge: it lets the thinker module, and so the import chain and the diffusion worker, load.
The Qwen2.5-Omni thinker's own multimodal processing on vLLM 0.31+ is NOT bridged: vllm-omni 0.30.0 overrides
``_cached_apply_hf_processor`` (and ``_maybe_apply_prompt_updates``) in vLLM 0.30's shapes. vLLM 0.31-0.33's
``BaseMultiModalProcessor.apply`` calls ``self._cached_apply_hf_processor(inputs, timing_ctx)``, and vllm-omni's
override fails at its first line, loudly, before it builds a ``MultiModalProcessingInfo``: ``cache = self.cache``
raises ``AttributeError`` (0.31 moved the cache to ``inputs.cache`` and its ``__init__`` no longer sets
``self.cache``); past that, ``self._get_hf_mm_data`` (gone in 0.31, now ``_get_hf_mm_inputs``) raises
``AttributeError``, and vLLM's ``self._maybe_apply_prompt_updates(mm_items=..., mm_res=...)`` meets vllm-omni's
four-argument override and raises ``TypeError``. Nothing there returns a wrong result silently. Should a stand-in
value still reach vLLM's code (which reads ``mm_res.prompt_ids``, the token ids it would otherwise have to guess),
its ``prompt_ids`` raises ``AttributeError`` saying so, never a default.

The definition is vLLM 0.30's NamedTuple (field names, order and no defaults), built when the hook runs: its field
types are the installed processor module's ``MultiModalKwargsOptionalItems``, ``MultiModalHashes`` and
``MultiModalPromptUpdates`` where that module has them (vLLM 0.31-0.33 all do), ``typing.Any`` otherwise.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ._name_stand_in import NameStandIn

NAME = "MultiModalProcessingInfo"  # the catalogue row's target, on vllm.multimodal.processing.processor
# The vllm-omni file that imports it (0.30.0; 0.24.0 does not): read, never imported.
IMPORTERS = ("vllm_omni/model_executor/models/qwen2_5_omni/qwen2_5_omni_thinker.py",)
# vLLM 0.30's fields, in order, each with the name of its annotation in the processor module.
FIELDS = (("kwargs", "MultiModalKwargsOptionalItems"), ("hashes", "MultiModalHashes"),
          ("prompt_updates", "MultiModalPromptUpdates"))
_BUILT: dict = {}  # processor module name -> (annotations, the class built on them)


def _prompt_ids(self):
    raise AttributeError(
        f"{NAME} (vllm_compat's stand-in for vLLM 0.30's) has no prompt_ids: vLLM 0.31+ reads the prompt's token ids "
        "from MultiModalProcessingResult, which vllm-omni 0.30.0's Qwen2.5-Omni thinker processor does not build. That "
        "processor's multimodal processing is not bridged on this vLLM; use vLLM <= 0.30 with vllm-omni 0.30.0 for it.")


def build_stand_in(owner) -> type:
    """vLLM 0.30's ``MultiModalProcessingInfo`` NamedTuple, its annotations resolved from ``owner`` (the processor
    module; a name it lacks is ``typing.Any``), and a ``prompt_ids`` property that raises ``AttributeError``."""
    namespace = vars(owner) if owner is not None else {}
    types = tuple(namespace.get(annotation, Any) for _, annotation in FIELDS)
    key = namespace.get("__name__")
    built = _BUILT.get(key)
    if built is not None and all(a is b for a, b in zip(built[0], types, strict=True)):
        return built[1]  # the one built before on the same annotations: revert(); apply() puts back the same class
    info = NamedTuple(NAME, list(zip((field for field, _ in FIELDS), types, strict=True)))
    info.__module__ = DRIFT_POINT.target_module
    info.__qualname__ = NAME
    info.__doc__ = ("vLLM 0.30's result of BaseMultiModalProcessor._cached_apply_hf_processor (stand-in by "
                    "vllm_compat): lets vllm-omni 0.30.0's Qwen2.5-Omni thinker import; its processing is not "
                    "bridged, and prompt_ids raises AttributeError.")
    info.prompt_ids = property(_prompt_ids)
    _BUILT[key] = (types, info)
    return info


# ---- the drift point ----

class MultiModalProcessingInfoStandIn(NameStandIn):
    importers = IMPORTERS
    removed_in = "0.31"

    def build(self, owner):
        return build_stand_in(owner)


DRIFT_POINT = MultiModalProcessingInfoStandIn()
