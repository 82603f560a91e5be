"""What the reviewed module aliases share: a module vLLM removed, put back holding vLLM's own moved definitions, each
checked against the sources a review measured.

``ReviewedModuleAlias`` is the base of a bridge for a vLLM module that is gone (``old_module``) while its names moved
elsewhere in vLLM (``new_module``) and vllm-omni imports them from the old path. A subclass names, per old name, the
new name and the definition keys (``detect.definitions.normalized_source``, read under the old name, first 16 hex
digits of its sha256) it may be served for: ``keys[name]`` maps a key to the review that accepts it (``SAME`` for the
old definition itself), ``elsewhere`` the keys another drift point serves (the alias table, for releases where the
move was plain): there it stays out. Any other key is a refusal that says what was found. The module object is the
module stand-in's (``_module_stand_in.ModuleStandIn``): the names are vLLM's own objects, looked up when
first read, never copies. Facts are read from vLLM's files for the static check and for the imported vLLM alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..decide import Action
from . import HostKind, StandInFacts
from ._module_stand_in import ModuleStandIn, Moved

SAME = "the old definition itself (renamed where the name changed)"


@dataclass(frozen=True)
class AliasedModuleFacts(StandInFacts):
    """``host`` / ``importers`` as every stand-in's, plus ``definitions``: for each old name, what vLLM's new
    definition is: ``"same"``, ``"accepted (key)"`` (a review accepts the change), ``"elsewhere (key)"`` (another
    drift point serves that release), ``"changed (key)"`` (unreviewed) or ``"absent"``."""

    definitions: tuple[tuple[str, str], ...] = ()


class ReviewedModuleAlias(ModuleStandIn):
    new_module = ""
    moved_names: dict[str, str] = {}  # old name -> its name in new_module
    keys: dict[str, dict[str, str]] = {}  # old name -> {definition key: the review accepting it, or SAME}
    elsewhere: dict[str, dict[str, str]] = {}  # old name -> {definition key: which drift point serves it}

    def members(self) -> dict:
        return {old: Moved(self.new_module, new) for old, new in self.moved_names.items()}

    # ---- facts ----

    def definition_states(self, vllm_tree) -> tuple[tuple[str, str], ...]:
        """For each old name: what vLLM's new definition is (read from its files), as ``AliasedModuleFacts`` says."""
        import hashlib

        from ..detect.definitions import Definitions, normalized_source

        defs = Definitions(vllm_tree)
        states = []
        for old, new in self.moved_names.items():
            hit = defs.find(self.new_module, new)
            if hit is None:
                states.append((old, "absent"))
                continue
            found = hashlib.sha256(normalized_source(hit[2], rename=old).encode()).hexdigest()[:16]
            review = self.keys.get(old, {}).get(found)
            if review == SAME:
                states.append((old, "same"))
            elif review is not None:
                states.append((old, f"accepted ({found})"))
            elif found in self.elsewhere.get(old, {}):
                states.append((old, f"elsewhere ({found})"))
            else:
                states.append((old, f"changed ({found})"))
        return tuple(states)

    def host_from_files(self, site, facts) -> str:
        """The host the static facts report (the base's answer from vLLM's files; a subclass may refine it)."""
        return facts.host

    def _facts(self, host: str, importers: tuple[str, ...], vllm_tree) -> AliasedModuleFacts:
        states = self.definition_states(vllm_tree) if host == HostKind.LACKS else ()
        return AliasedModuleFacts(host, importers, states)

    def detect_static(self, site) -> AliasedModuleFacts:
        base = self.facts_from_files(site)
        return self._facts(self.host_from_files(site, base), base.importers, site.vllm_tree)

    def detect_runtime(self, module) -> AliasedModuleFacts:
        """As the files say, from the imported parent; where ``sys.modules`` holds vLLM's new module itself under the
        old path and vLLM ships no file for it (the alias table's module alias: vLLM 0.29-0.31 for server_utils),
        vLLM still lacks the old module, as its files say."""
        from ..detect.source_tree import tree_of

        base = self.facts_from_module(module)
        host = HostKind.LACKS if base.host == HostKind.DEFINES and self._is_alias_of_new_module(module) else base.host
        return self._facts(host, base.importers, tree_of("vllm"))

    def _is_alias_of_new_module(self, package) -> bool:
        import sys
        from importlib.machinery import PathFinder

        current = sys.modules.get(self.first_missing)
        if current is None or self.first_missing != self.old_module or getattr(current, "__name__", None) != \
                self.new_module:
            return False
        path = getattr(package, "__path__", None)
        return path is None or PathFinder.find_spec(self.first_missing, path) is None

    # ---- decision ----

    def decide(self, facts: AliasedModuleFacts, controls=None):
        decision = super().decide(facts)
        if decision.action != Action.PATCHED:
            return decision
        states = dict(facts.definitions)
        served = [f"{name}: {state}" for name, state in states.items() if state.startswith("elsewhere")]
        if served:
            return self.decision(Action.SKIPPED, f"vLLM lacks {self.old_module}, and another drift point serves this "
                                 f"vLLM's definitions ({'; '.join(served)}: "
                                 f"{'; '.join(self._elsewhere_reasons(states))})")
        changed = [f"{name}: {state}" for name, state in states.items() if state.split(" ")[0] not in
                   ("same", "accepted")]
        if changed:
            return self.refused(f"vLLM lacks {self.old_module} and vllm-omni imports it, but {self.new_module} holds "
                                f"definitions no review accepted ({'; '.join(changed)}); left out. Set "
                                f"VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, or upgrade vllm_compat")
        names = ", ".join(f"{old} = {new}" if old != new else old for old, new in self.moved_names.items())
        accepted = [name for name, state in states.items() if state.startswith("accepted")]
        how = f"reviewed changes accepted for {', '.join(accepted)}" if accepted else "the same definitions"
        return self.decision(Action.PATCHED, f"vLLM lacks {self.old_module} (gone in {self.removed_in}), and vllm-omni "
                             f"imports it ({', '.join(facts.importers)}); vLLM's own {self.new_module} names served "
                             f"there ({names}; {how})", provides=(self.old_module,))

    def _elsewhere_reasons(self, states: dict) -> list[str]:
        return sorted({self.elsewhere[name][state[len("elsewhere ("):-1]] for name, state in states.items()
                       if state.startswith("elsewhere")})

    def compare(self, static: AliasedModuleFacts, runtime: AliasedModuleFacts) -> list[str]:
        differences = super().compare(static, runtime)
        if static.definitions != runtime.definitions and HostKind.ABSENT not in (static.host, runtime.host):
            differences.append(f"{self.new_module} definitions: {static.definitions} (files) != {runtime.definitions} "
                               "(imported)")
        return differences

    def facts_for_table(self, host: str, importers: tuple[str, ...], state: str = "same") -> AliasedModuleFacts:
        """Facts for a decision-table row (tests): every definition in ``state``."""
        states = tuple((name, state) for name in self.moved_names) if host == HostKind.LACKS else ()
        return AliasedModuleFacts(host, importers, states)
