"""Decisions: what vllm_compat does about one catalogue entry, and why.

Each drift point decides in its own module (``vllm_compat.patches.<module>.decide``), as a pure function of its
facts and the user's controls: no I/O, no imports, so the static doctor and the live hook reach the same
answer from the same facts. ``patches.decide_entry`` applies the controls every entry shares first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

DISABLED_REASON = "VLLM_COMPAT_DISABLE is set; nothing is patched"


class Action:
    PATCHED = "patched"  # installed (a method replaced, a name provided, a call adapted)
    SKIPPED = "skipped"  # nothing to do: fixed upstream, or not needed here
    PENDING = "pending"  # the target is not imported (or not installed) yet; its hook decides when it is
    DISABLED = "disabled"  # turned off by VLLM_COMPAT_DISABLE / VLLM_COMPAT_DISABLE_PATCHES
    REFUSED = "refused"  # the target's shape is not one we know: left alone, with the reason


@dataclass(frozen=True)
class Decision:
    name: str
    target: str
    action: str
    variant: str | None
    reason: str
    # The ``module.name`` paths this decision makes importable, where they depend on the installed vLLM (an alias
    # entry's); empty for every other entry, whose catalogue row names its one target (``PatchEntry.provides``).
    provides: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        data = asdict(self)
        if not self.provides:
            del data["provides"]  # the shape every report had before alias entries
        else:
            data["provides"] = list(self.provides)
        return data
