"""Drift points: one module per upstream change vllm_compat absorbs, listed in ``catalogue.CATALOGUE``.

Every drift-point module answers the same small interface; nothing outside it names its target:

``ENTRY``                              its catalogue row (``catalogue.PatchEntry``)
``detect_static(site) -> facts``       the facts it decides on, from files only (``detect.static.StaticSite``)
``detect_runtime(module) -> facts``    the same facts from the imported target module; must agree with the
                                       static ones on the same install (``compare``)
``decide(facts, controls) -> Decision``  pure; "disabled" controls are handled here, before it is called
``locate(module) -> owner | None``     the object that holds the target (a class, or the module itself)
``prepare(owner, facts) -> state``     the pre-install contract check (raises ``PatchRefusedError`` with what
                                       was expected and found) and what the install needs
``install(owner, decision, state)``    idempotent; marks what it put in place as ours
``uninstall(owner) -> bool``           puts back exactly what was there; False when nothing of ours was
``in_place(owner)``                    the object now on the owner (activation's "already settled?" check)
``compare(static, runtime) -> list``   human-readable differences between the two detections
``facts_dict(facts) -> dict``          the facts for reports (``--json``)

Drift-point modules import neither torch nor vLLM at module level: the static doctor imports them.
"""

# No `from __future__ import annotations`: see vllm_compat/__init__.py.

from .catalogue import CATALOGUE, PatchEntry

__all__ = ["CATALOGUE", "PatchEntry", "decide_entry", "disabled_decision", "drift_point", "entry", "plan"]


def entry(entry_id: str) -> PatchEntry:
    """The catalogue entry with ``entry_id``; ``KeyError`` naming the known ids otherwise."""
    for candidate in CATALOGUE:
        if candidate.id == entry_id:
            return candidate
    raise KeyError(f"no catalogue entry {entry_id!r}; known: {', '.join(e.id for e in CATALOGUE)}")


def drift_point(patch_entry: PatchEntry):
    """The module implementing ``patch_entry`` (imported on first use)."""
    import importlib

    return importlib.import_module(patch_entry.module)


def disabled_decision(patch_entry: PatchEntry, controls):
    """The "disabled" Decision when ``VLLM_COMPAT_DISABLE`` or ``VLLM_COMPAT_DISABLE_PATCHES`` turns the entry off,
    else None."""
    from ..decide import DISABLED_REASON, Action

    if controls.disabled:
        return patch_entry.decision(Action.DISABLED, DISABLED_REASON)
    if patch_entry.id in controls.disabled_patches:
        return patch_entry.decision(Action.DISABLED, f"{patch_entry.id} is listed in VLLM_COMPAT_DISABLE_PATCHES")
    return None


def decide_entry(patch_entry: PatchEntry, facts, controls):
    """The entry's decision: "disabled" when the controls say so, else what its module decides from ``facts``."""
    return disabled_decision(patch_entry, controls) or drift_point(patch_entry).decide(facts, controls)


def plan(site, controls) -> list:
    """``(entry, static facts, Decision)`` for every catalogue entry, from files only (``site`` is a
    ``detect.static.StaticSite``): what the hooks will do once the targets are imported."""
    planned = []
    for patch_entry in CATALOGUE:
        # site.facts: the installed site answers from its on-disk cache when the files are those it read before
        facts = site.facts(patch_entry.id, drift_point(patch_entry).detect_static)
        planned.append((patch_entry, facts, decide_entry(patch_entry, facts, controls)))
    site.save()
    return planned
