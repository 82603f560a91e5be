"""What the name stand-ins share: the drift-point interface for one object put on a vLLM module that lacks it.

A stand-in module builds one ``NameStandIn`` (its entry, the vllm-omni files that import the name, the vLLM release
that removed it, and what to put there) and binds the interface from it (``NameStandIn.interface``); a stand-in
built on other vLLM objects overrides ``prepare`` to check them, and one with more facts than ``StandInFacts``
composes its own from ``facts_from_files`` / ``facts_from_module``. The rules are the bridges' (``vllm_compat.bridges``):
only where vLLM lacks the name and an installed vllm-omni imports it, never over a name vLLM defines, and what it
puts there carries the entry's mark so that ``uninstall`` removes exactly that.
"""

from __future__ import annotations

from ..errors import PatchRefusedError
from . import (
    HostKind,
    StandInFacts,
    compare_stand_in,
    decide_stand_in,
    host_lookup,
    installed_omni_tree,
    is_ours,
    omni_importers,
    provide,
    withdraw,
)


class NameStandIn:
    """``entry``'s stand-in: ``value`` (or ``build(owner)``, for one made from the target module's own names) at
    ``entry.target_module.entry.target``, for the vllm-omni ``importers`` (files, read and never imported);
    ``removed_in``: the vLLM release that removed the name, for the decision's reason."""

    def __init__(self, entry, importers: tuple[str, ...], removed_in: str, value=None, build=None):
        self.entry, self.importers, self.removed_in = entry, importers, removed_in
        self.name = entry.target
        self._build = build if build is not None else (lambda owner: value)

    def interface(self) -> tuple:
        """``(detect_static, detect_runtime, decide, locate, prepare, install, uninstall, in_place, compare,
        facts_dict)``, bound: what the stand-in module assigns to those names (``vllm_compat.patches``)."""
        return (self.detect_static, self.detect_runtime, self.decide, self.locate, self.prepare, self.install,
                self.uninstall, self.in_place, self.compare, self.facts_dict)

    # ---- facts ----

    def facts_from_files(self, site) -> StandInFacts:
        return StandInFacts(host_lookup(site.vllm_tree, self.entry.target_module, self.name),
                            omni_importers(site.omni_tree, self.importers, self.entry.target_module, self.name))

    def host_in_module(self, module) -> str:
        """The imported module's answer: it lacks the name where nothing, or only ours, is there."""
        current = vars(module).get(self.name)
        return HostKind.LACKS if current is None or is_ours(current, self.entry.id) else HostKind.DEFINES

    def facts_from_module(self, module) -> StandInFacts:
        return StandInFacts(self.host_in_module(module), omni_importers(
            installed_omni_tree(), self.importers, self.entry.target_module, self.name))

    # ---- the drift-point interface ----

    def detect_static(self, site) -> StandInFacts:
        return self.facts_from_files(site)

    def detect_runtime(self, module) -> StandInFacts:
        return self.facts_from_module(module)

    def decide(self, facts: StandInFacts, controls=None):
        return decide_stand_in(self.entry, facts, self.entry.target_path, removed_in=self.removed_in)

    def locate(self, module):
        return module

    def prepare(self, owner, facts):
        """The contract: ``owner`` does not define the name itself (ours may be there already); returns what
        ``install`` puts there (the one already there when it is ours)."""
        current = vars(owner).get(self.name)
        if current is not None and not is_ours(current, self.entry.id):
            raise PatchRefusedError(f"{self.entry.target_path} exists ({current!r}); vllm_compat never replaces a "
                                    "name vLLM defines. Left as it is.")
        return current if current is not None else self._build(owner)

    def install(self, owner, decision, state) -> bool:
        return provide(owner, self.name, state if state is not None else self._build(owner), self.entry.id)

    def uninstall(self, owner) -> bool:
        return withdraw(owner, self.name, self.entry.id)

    def in_place(self, owner):
        return vars(owner).get(self.name) if owner is not None else None

    def compare(self, static: StandInFacts, runtime: StandInFacts) -> list[str]:
        return compare_stand_in(static, runtime, self.entry.target_path)

    def facts_dict(self, facts) -> dict:
        return facts.to_dict()
