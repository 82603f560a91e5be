"""The patch catalogue, as data. One entry per drift point; ``tests/patches/test_catalogue.py`` keeps this
list and the modules in this package in sync (no entry without a module, no module without an entry)."""

from __future__ import annotations


class PatchEntry:
    """One catalogue row. A plain slotted class, not a dataclass: this module is imported by
    ``import vllm_compat``, which must stay nearly free (dataclasses pulls in ``inspect``)."""

    __slots__ = ("id", "module", "target_module", "target", "why", "how", "upstream", "retire_when")

    def __init__(self, *, id, module, target_module, target, why, how, upstream, retire_when):
        self.id = id  # stable name used in reports
        self.module = module  # the vllm_compat module that implements the patch
        self.target_module = target_module  # the upstream module whose import triggers the patch
        self.target = target  # qualified name of the patched attribute inside target_module
        self.why = why
        self.how = how
        self.upstream = upstream
        self.retire_when = retire_when

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    @property
    def target_path(self) -> str:
        return f"{self.target_module}.{self.target}"


DIFFUSERS_LOADER = PatchEntry(
    id="diffusers_loader_meta_device",
    module="vllm_compat.patches.diffusers_loader",
    target_module="vllm_omni.diffusion.model_loader.diffusers_loader",
    target="DiffusersPipelineLoader._process_weights_after_loading",
    why=(
        "vLLM online quantization (uses_meta_device=True) leaves straggler layers on `meta`; vllm-omni <= 0.24.0 "
        "moves each quant module with module.to(), which raises 'Cannot copy out of meta tensor'. The first "
        "upstream fix moved params one by one via .data and broke FSDP/HSDP DTensor params."
    ),
    how=(
        "Replace the method (wrapt, keeping name, signature and __wrapped__) with the variant the decision "
        "table picks: legacy (0.24.0 semantics) or meta_safe (finalize where vLLM has it, skip processed "
        "layers, never move meta params, module-level moves for DTensor/tensor-subclass params)."
    ),
    upstream="vllm-omni 0.26.0 gated fix (meta-safe path only when online quant is in use)",
    retire_when="the oldest vllm-omni you support is >= 0.26.0 (its loader classifies as 'gated')",
)

CATALOGUE: tuple[PatchEntry, ...] = (DIFFUSERS_LOADER,)
