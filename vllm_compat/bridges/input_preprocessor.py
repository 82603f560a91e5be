"""Stand-in for the module ``vllm.inputs.preprocess`` (class ``InputPreprocessor``), removed in vLLM 0.29.0.

Why: in vLLM <= 0.28 ``InputPreprocessor`` turns a raw prompt into an engine input, as a thin layer over the
renderer (``vllm.renderers.BaseRenderer``); vLLM 0.29 removed the module (the renderer does the whole job). vllm-omni
0.24.0 subclasses it at module level in ``vllm_omni/inputs/preprocess.py`` (``OmniInputPreprocessor``), which
``vllm_omni.engine.stage_init_utils`` imports, so its diffusion worker, executor and stage clients die with
``ModuleNotFoundError: No module named 'vllm.inputs.preprocess'`` on vLLM 0.29-0.33 while ``import vllm_omni`` works.
When: ``vllm.inputs`` is imported without a ``preprocess`` submodule and an installed vllm-omni imports it (read
from vllm-omni's files); a vLLM that has the module (<= 0.28) keeps its own. vllm-omni 0.30.0 no longer imports it.
Serves: vllm-omni 0.24.0 on vLLM 0.29-0.33 (vLLM <= 0.28 keeps its own; vllm-omni 0.30.0 does not import it).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.inputs.preprocess`` (0.30.0 does not).

The whole module is gone, so the target is the parent: on ``import vllm.inputs`` a module object holding our class
is registered as ``sys.modules["vllm.inputs.preprocess"]`` and as the parent's attribute (both marked
``_vllm_compat_stand_in``). The class is the smallest base that vllm-omni's source needs, not a copy of 0.28's:
``OmniInputPreprocessor`` is built as ``(vllm_config=..., renderer=...)`` (``build_stage0_input_processor``),
overrides ``_prompt_to_llm_inputs`` / ``_process_text`` / ``_process_tokens`` / ``_process_embeds`` and calls
``_tokenize_prompt``, ``_truncate_inputs``, ``_process_multimodal`` and ``super()._process_embeds``. Each of those
delegates to vLLM 0.29+'s renderer, as 0.28's did; ``preprocess`` (decoder-only) runs the prompt through
``_prompt_to_llm_inputs``, so a subclass's overrides apply. Differences from 0.28, all off the diffusion path (which
only imports the module; vLLM 0.29+'s ``InputProcessor`` never calls a preprocessor): a text prompt with multimodal
data is tokenized before the multimodal processor runs, as vLLM 0.29+'s renderer does for every prompt (its
processor takes token ids only); encoder-decoder prompts raise ``NotImplementedError``; ``tokenizer`` /
``get_tokenizer`` are left out (no caller).
"""

from __future__ import annotations

import sys

from ..decide import Decision
from ..drift import mark, provide, withdraw
from ..errors import PatchRefusedError
from . import HostKind, is_ours
from ._name_stand_in import NameStandIn

ENTRY_ID = "input_preprocessor"
PARENT, NAME = "vllm.inputs", "preprocess"  # the catalogue row's target: the submodule's name on its parent
MODULE = f"{PARENT}.{NAME}"  # the module vLLM removed
# The vllm-omni files that import it (0.24.0; 0.30.0 imports it nowhere): read, never imported.
IMPORTERS = ("vllm_omni/inputs/preprocess.py", "vllm_omni/entrypoints/async_omni.py")
# What the class delegates to, on vLLM 0.29-0.33's renderer (checked when one is built).
RENDERER_API = ("default_cmpl_tok_params", "_tokenize_singleton_prompt", "_process_multimodal", "_process_embeds",
                "_process_singleton")


class InputPreprocessor:
    """vLLM 0.28's prompt -> engine-input preprocessor, on vLLM 0.29+'s renderer (stand-in by vllm_compat)."""

    def __init__(self, vllm_config, renderer=None, mm_registry=None) -> None:
        super().__init__()
        self.model_config = vllm_config.model_config
        if renderer is None:
            from vllm.renderers import renderer_from_config

            renderer = renderer_from_config(vllm_config)
        if mm_registry is None:  # 0.28's default, looked up here: this module imports no vLLM
            from vllm.multimodal import MULTIMODAL_REGISTRY

            mm_registry = MULTIMODAL_REGISTRY
        missing = [name for name in RENDERER_API if not hasattr(type(renderer), name)]
        if missing:
            raise TypeError(
                f"vllm_compat's stand-in for {MODULE}.InputPreprocessor delegates to vLLM's renderer, but "
                f"{type(renderer).__qualname__} lacks {', '.join(missing)} (vLLM 0.29-0.33's BaseRenderer has them). "
                f"Set VLLM_COMPAT_DISABLE_PATCHES={ENTRY_ID} and use a vllm-omni that does not import {MODULE}.")
        self.renderer = renderer
        self.mm_registry = mm_registry

    def _tokenize_prompt(self, prompt: str, tokenization_kwargs: dict | None = None) -> list[int]:
        """The token ids of a text prompt, with the renderer's completion defaults and ``tokenization_kwargs``."""
        params = self.renderer.default_cmpl_tok_params.with_kwargs(**(tokenization_kwargs or {}))
        return self.renderer._tokenize_singleton_prompt({"prompt": prompt}, params)["prompt_token_ids"]

    def _truncate_inputs(self, inputs: list[int], tokenization_kwargs: dict | None = None) -> list[int]:
        """Token ids as the renderer's token pipeline leaves them (truncation, padding)."""
        params = self.renderer.default_cmpl_tok_params.with_kwargs(**(tokenization_kwargs or {}))
        return self.renderer._tokenize_singleton_prompt({"prompt_token_ids": inputs}, params)["prompt_token_ids"]

    def _process_multimodal(self, prompt, mm_data, mm_processor_kwargs=None, tokenization_kwargs=None, *,
                            mm_uuids=None):
        """The renderer's multimodal processing of ``prompt`` (token ids, or a text tokenized first: vLLM 0.29+'s
        processor takes token ids only, and ``tokenization_kwargs`` then apply to that tokenization)."""
        if isinstance(prompt, str):
            prompt = self._tokenize_prompt(prompt, tokenization_kwargs)
        return self.renderer._process_multimodal(prompt, mm_data, mm_uuids=mm_uuids,
                                                 mm_processor_kwargs=mm_processor_kwargs)

    def _process_embeds(self, parsed_content):
        return self.renderer._process_embeds(parsed_content)

    def _prompt_to_llm_inputs(self, prompt, tokenization_kwargs: dict | None = None):
        """One prompt through the renderer's own 0.29+ pipeline (tokenize, then process); subclasses override it."""
        params = self.renderer.default_cmpl_tok_params.with_kwargs(**(tokenization_kwargs or {}))
        return self.renderer._process_singleton(self.renderer._tokenize_singleton_prompt(prompt, params))

    def preprocess(self, prompt, tokenization_kwargs: dict | None = None):
        """The engine input of a decoder-only prompt (a string or a prompt dict), through ``_prompt_to_llm_inputs``."""
        if self.model_config.is_encoder_decoder:
            raise NotImplementedError(
                f"vllm_compat's stand-in for {MODULE}.InputPreprocessor handles decoder-only models only; pass "
                "encoder-decoder prompts through vLLM's renderer (render_cmpl, then process_for_engine).")
        from vllm.renderers.inputs.preprocess import parse_dec_only_prompt

        return self._prompt_to_llm_inputs(parse_dec_only_prompt(prompt), tokenization_kwargs=tokenization_kwargs)


mark(InputPreprocessor, ENTRY_ID)
_stand_in_module = None  # one module object per process: revert + apply puts the same one back


def stand_in_module():
    """The module object registered as ``vllm.inputs.preprocess`` (made on first use, marked as ours)."""
    global _stand_in_module
    if _stand_in_module is None:
        import importlib.machinery
        import types

        module = types.ModuleType(MODULE, f"vllm_compat's stand-in for {MODULE} (removed in vLLM 0.29.0); see "
                                          f"{__name__}.")
        module.__spec__ = importlib.machinery.ModuleSpec(MODULE, None, origin=__name__)
        module.InputPreprocessor = InputPreprocessor
        mark(module, ENTRY_ID)
        _stand_in_module = module
    return _stand_in_module


# ---- the drift point ----

class InputPreprocessorStandIn(NameStandIn):
    """A stand-in module rather than a name: its host is the parent package, and ``sys.modules`` holds it too."""

    importers = IMPORTERS
    removed_in = "0.29"
    provides_module = True

    def build(self, owner):
        return stand_in_module()

    def host_in_module(self, module) -> str:
        """The module in ``sys.modules`` or on the parent is vLLM's unless it is ours; neither there: vLLM ships
        the submodule when its file is on the parent's path."""
        found = [m for m in (sys.modules.get(MODULE), vars(module).get(NAME)) if m is not None]
        if found:
            return HostKind.LACKS if all(is_ours(m, self.id) for m in found) else HostKind.DEFINES
        path = getattr(module, "__path__", None)
        if path is None:  # not a package: it cannot have the submodule
            return HostKind.LACKS
        from importlib.machinery import (
            PathFinder,  # finds the file without importing it (nor touching sys.modules)
        )

        return HostKind.DEFINES if PathFinder.find_spec(MODULE, path) is not None else HostKind.LACKS

    def prepare(self, owner, facts) -> None:
        """The contract: neither ``sys.modules`` nor the parent holds a ``preprocess`` that is not ours, and vLLM
        ships no such file (ours may be in place already)."""
        if self.host_in_module(owner) != HostKind.LACKS:
            current = sys.modules.get(MODULE) or vars(owner).get(NAME)
            found = repr(current) if current is not None else "a module file in the installed vLLM"
            raise PatchRefusedError(f"{MODULE} exists ({found}); vllm_compat never replaces a module vLLM defines. "
                                    "Left as it is.")

    def install(self, owner, decision: Decision, state) -> bool:
        """Register the stand-in module in ``sys.modules`` and on the parent; False when both are there already."""
        module = stand_in_module()
        added = provide(owner, NAME, module, self.id)
        if sys.modules.get(MODULE) is None:
            sys.modules[MODULE] = module
            added = True
        return added

    def uninstall(self, owner) -> bool:
        """Remove the parent attribute and the ``sys.modules`` entry where they are ours; False when neither was."""
        removed = withdraw(owner, NAME, self.id)
        if is_ours(sys.modules.get(MODULE), self.id):
            del sys.modules[MODULE]
            removed = True
        return removed


DRIFT_POINT = InputPreprocessorStandIn()
