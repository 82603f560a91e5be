"""Decisions: what vllm_compat does about one catalogue entry, and why.

Each drift point decides itself (``DriftPoint.decide``), as a pure function of its facts and the user's controls:
no I/O, no imports, so the static doctor and the live hook reach the same answer from the same facts.
``decide_entry`` applies the controls every entry shares first; ``plan`` decides every catalogue entry from files.
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
    # entry's); empty for every other entry, whose catalogue row names its one target (``catalogue.Entry.provides``).
    provides: tuple[str, ...] = ()
    # What still fails where a patched bridge provides a name for the import only (a raising stand-in): the feature,
    # in words users know, for the entrypoint lines and the verdict; empty where nothing is left out.
    leaves_out: str = ""
    # The entrypoint (``entrypoints.Entrypoint.id``) whose feature ``leaves_out`` names, where the drift point leaves a
    # behaviour out rather than a name: the verdict names it under that entrypoint, whatever the import drift says.
    leaves_out_of: str = ""

    @property
    def accounts_for_drift(self) -> bool:
        """Whether the behavioural drift this entry handles (``DriftPoint.handles_drift``) is accounted for: it acts
        ("patched"), or it names the feature the drift leaves out of an entrypoint (``leaves_out_of``), so the
        verdict says it in words instead of as an unhandled finding."""
        return self.action == Action.PATCHED or bool(self.leaves_out and self.leaves_out_of
                                                     and self.action != Action.DISABLED)

    def to_dict(self) -> dict:
        data = asdict(self)
        if not self.provides:
            del data["provides"]  # the shape every report had before alias entries
        else:
            data["provides"] = list(self.provides)
        if not self.leaves_out:
            del data["leaves_out"]
        if not self.leaves_out_of:
            del data["leaves_out_of"]
        return data


def disabled_decision(entry, controls):
    """The "disabled" Decision when ``VLLM_COMPAT_DISABLE`` or ``VLLM_COMPAT_DISABLE_PATCHES`` turns ``entry`` (a
    catalogue row) off, else None."""
    if controls.disabled:
        return entry.decision(Action.DISABLED, DISABLED_REASON)
    if entry.id in controls.disabled_patches:
        return entry.decision(Action.DISABLED, f"{entry.id} is listed in VLLM_COMPAT_DISABLE_PATCHES")
    return None


def decide_entry(entry, facts, controls):
    """``entry``'s decision: "disabled" when the controls say so, else what its drift point decides from ``facts``."""
    return disabled_decision(entry, controls) or entry.point.decide(facts, controls)


def plan(site, controls) -> list:
    """``(entry, static facts, Decision)`` for every catalogue entry, from files only (``site`` is a
    ``detect.static.StaticSite``): what the hooks will do once the targets are imported."""
    from .catalogue import CATALOGUE

    planned = []
    for entry in CATALOGUE:
        # site.facts: the installed site answers from its on-disk cache when the files are those it read before
        facts = site.facts(entry.id, entry.point.detect_static)
        planned.append((entry, facts, decide_entry(entry, facts, controls)))
    site.save()
    return planned


def decided(site, controls) -> tuple[list, dict]:
    """Every catalogue entry's Decision under ``controls``, as ``plan`` decides them, without the facts: what the
    static doctor reports; and ``{entry id: handles_drift}`` of each entry that accounts for its drift
    (``Decision.accounts_for_drift``) whose drift point matches behavioural drift by those patterns alone
    (``DriftPoint.handles`` as the base class has it): what the verdict asks of the acting drift points
    (``bridges.drift_handler``). An installed site keeps both with its facts, by controls (``StaticSite.decisions``),
    so a warm doctor neither reads the facts back nor imports a drift point."""

    def decide():
        from .drift import DriftPoint

        planned = plan(site, controls)
        handles = {entry.id: entry.point.handles_drift for entry, _, decision in planned
                   if decision.accounts_for_drift and type(entry.point).handles is DriftPoint.handles}
        return [decision for _, _, decision in planned], handles

    decisions, handles = site.decisions(controls, decide)
    return list(decisions), dict(handles)
