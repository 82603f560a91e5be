"""Decide, per patch target, what to do with the environment detection found.

The decision table for vllm-omni's diffusion loader (``DiffusersPipelineLoader._process_weights_after_loading``):

==========================  ==============================  ========================================
loader shape                meta params possible?           action (variant)
==========================  ==============================  ========================================
any, VLLM_COMPAT_DISABLE=1  -                               disabled
absent                      -                               pending (the import hook waits for it)
legacy                      no                              patched (legacy)
legacy                      yes                             patched (meta_safe)
ungated                     any                             patched (meta_safe)
gated                       any                             skipped: already fixed upstream
unknown                     any                             refused (warning; error under STRICT)
gated / unknown, forced     any                             patched (the forced variant)
legacy / ungated, forced    any                             patched (the forced variant)
==========================  ==============================  ========================================

"Meta params possible" means the installed vLLM's ``QuantizeMethodBase`` has ``uses_meta_device`` or
vllm-omni ships its own quant classes that set it. Decisions are pure functions of (environment, controls):
no I/O, no imports, so the static doctor and the live hook reach the same answer from the same facts.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .config import Controls
from .detect.model import Environment, LoaderKind

DISABLED_REASON = "VLLM_COMPAT_DISABLE is set; nothing is patched"


class Action:
    PATCHED = "patched"
    SKIPPED = "skipped"
    PENDING = "pending"
    DISABLED = "disabled"
    REFUSED = "refused"


@dataclass(frozen=True)
class Decision:
    name: str
    target: str
    action: str
    variant: str | None
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def decide_loader_patch(env: Environment, controls: Controls, name: str, target: str) -> Decision:
    """Return the decision for the diffusion-loader patch; each path says why in ``reason``."""

    def decision(action: str, variant: str | None, reason: str) -> Decision:
        return Decision(name=name, target=target, action=action, variant=variant, reason=reason)

    kind = env.loader.kind
    if controls.disabled:
        return decision(Action.DISABLED, None, DISABLED_REASON)
    if kind == LoaderKind.ABSENT:
        return decision(Action.PENDING, None, f"{env.loader.detail}; patched when it is imported")
    if controls.is_forced:
        return decision(
            Action.PATCHED,
            controls.loader_variant,
            f"VLLM_COMPAT_LOADER_VARIANT={controls.loader_variant} forces it over the {kind} loader",
        )
    if kind == LoaderKind.GATED:
        return decision(Action.SKIPPED, None, "vllm-omni's loader already has the gated meta-safe fix")
    if kind == LoaderKind.UNKNOWN:
        return decision(
            Action.REFUSED,
            None,
            f"loader shape not recognized ({env.loader.detail}); left unpatched. Set "
            f"VLLM_COMPAT_LOADER_VARIANT=meta_safe to force the patch if you have checked it",
        )
    if kind == LoaderKind.UNGATED:
        return decision(
            Action.PATCHED, "meta_safe", "ungated loader breaks FSDP/HSDP-sharded params; meta-safe keeps them"
        )
    if env.can_create_meta_params:
        source = "vLLM (uses_meta_device)" if env.vllm.has_uses_meta_device else "vllm-omni's own quant methods"
        return decision(
            Action.PATCHED,
            "meta_safe",
            f"legacy loader, and {source} can leave params on meta; module.to() would crash on them",
        )
    return decision(Action.PATCHED, "legacy", "legacy loader, and no installed quant method creates meta params")
