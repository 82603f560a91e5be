"""What the name stand-ins share: the drift point for one object put on a vLLM module that lacks it.

``NameStandIn`` is the base of a stand-in: a subclass names the vllm-omni files that import the name
(``importers``), the vLLM release that removed it (``removed_in``) and what to put there (``build(owner)``); a
stand-in built on other vLLM objects overrides ``prepare`` to check them. ``FunctionStandIn`` adds what the
stand-ins built on a new vLLM function share: the scan of vllm-omni's calls of the old name (``call_args``), the
shape of vLLM's replacement (``replacement_from_files`` / ``replacement_from_module``), the refusal when either is
not the measured one, and the comparison of both detections. The rules are the bridges' (``vllm_compat.bridges``):
only where vLLM lacks the name and an installed vllm-omni imports it, never over a name vLLM defines, and what it
puts there carries the entry's mark so that ``uninstall`` removes exactly that.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..decide import Action
from ..drift import DriftPoint, is_ours, provide, withdraw
from ..errors import PatchRefusedError
from . import (
    HostKind,
    StandInFacts,
    calls_of,
    compare_stand_in,
    decide_stand_in,
    host_lookup,
    installed_omni_tree,
    omni_importers,
)


class NameStandIn(DriftPoint):
    """A stand-in for the catalogue row's ``target`` on its ``target_module``, for the vllm-omni ``importers``
    (files, read and never imported); ``removed_in``: the vLLM release that removed the name, for the reason."""

    importers: tuple[str, ...] = ()
    removed_in = ""
    provides_module = False  # the target is a submodule of target_module, which vllm-omni imports as a module

    def build(self, owner):
        """What to put on ``owner`` (the target module)."""
        raise NotImplementedError(f"{type(self).__qualname__} must define build(owner)")

    @property
    def name(self) -> str:
        return self.target

    # ---- facts ----

    def importers_in(self, tree) -> tuple[str, ...]:
        """The running imports of the target in the vllm-omni ``importers`` files of ``tree``."""
        if self.provides_module:
            return omni_importers(tree, self.importers, self.target_path, None)
        return omni_importers(tree, self.importers, self.target_module, self.name)

    def facts_from_files(self, site) -> StandInFacts:
        return StandInFacts(host_lookup(site.vllm_tree, self.target_module, self.name), self.importers_in(site.omni_tree))

    def host_in_module(self, module) -> str:
        """The imported module's answer: it lacks the name where nothing, or only ours, is there."""
        current = vars(module).get(self.name)
        return HostKind.LACKS if current is None or is_ours(current, self.id) else HostKind.DEFINES

    def facts_from_module(self, module) -> StandInFacts:
        return StandInFacts(self.host_in_module(module), self.importers_in(installed_omni_tree()))

    # ---- the drift-point interface ----

    def detect_static(self, site) -> StandInFacts:
        return self.facts_from_files(site)

    def detect_runtime(self, module) -> StandInFacts:
        return self.facts_from_module(module)

    def decide(self, facts: StandInFacts, controls=None):
        return decide_stand_in(self.entry, facts, self.target_path, removed_in=self.removed_in)

    def prepare(self, owner, facts):
        """The contract: ``owner`` does not define the name itself (ours may be there already); returns what
        ``install`` puts there (the one already there when it is ours)."""
        current = vars(owner).get(self.name)
        if current is not None and not is_ours(current, self.id):
            raise PatchRefusedError(f"{self.target_path} exists ({current!r}); vllm_compat never replaces a name "
                                    "vLLM defines. Left as it is.")
        return current if current is not None else self.build(owner)

    def install(self, owner, decision, state) -> bool:
        return provide(owner, self.name, state if state is not None else self.build(owner), self.id)

    def uninstall(self, owner) -> bool:
        return withdraw(owner, self.name, self.id)

    def compare(self, static: StandInFacts, runtime: StandInFacts) -> list[str]:
        return compare_stand_in(static, runtime, self.target_path)


class Shape:
    KNOWN = "known"
    UNKNOWN = "unknown"  # refused, with the detail
    ABSENT = "absent"  # vLLM not installed, or it defines the name (nothing to build on)


@dataclass(frozen=True)
class FunctionStandInFacts(StandInFacts):
    """A stand-in's facts (``host``, ``importers``) plus both shapes it is built between: ``replacement``, vLLM's
    new function(s) it calls; ``callers``, vllm-omni's calls of the old name (``calls``: ``"module:line: ..."``
    each); ``detail`` says what was found where a shape is unknown."""

    replacement: str = Shape.ABSENT
    callers: str = Shape.ABSENT
    calls: tuple[str, ...] = ()
    detail: str = ""


class FunctionStandIn(NameStandIn):
    """A stand-in function for an old vLLM function, built on the new one(s): ``call_args`` are the arguments it
    takes (all required when ``all_required``, else the first positionally and the rest by keyword, each optional
    past the first), ``built_on`` names what it calls (for reasons and differences). Subclasses say how vLLM's
    replacement is judged, from its files (``replacement_from_files``) and in the imported module
    (``replacement_from_module``), each returning ``(Shape, detail)``."""

    call_args: tuple[str, ...] = ()
    all_required = False
    built_on = ""

    def replacement_from_files(self, site) -> tuple[str, str]:
        raise NotImplementedError

    def replacement_from_module(self, module) -> tuple[str, str]:
        raise NotImplementedError

    # ---- vllm-omni's calls of the old name ----

    def call_fits(self, positional: int, keywords: list) -> bool:
        if None in keywords or positional > len(self.call_args) or len(keywords) != len(set(keywords)):
            return False
        rest = set(self.call_args[positional:])
        return set(keywords) == rest if self.all_required else set(keywords) <= rest

    def callers(self, tree) -> tuple[str, tuple[str, ...], str]:
        """(``Shape``, ``"module:line: ..."`` per call, detail) of vllm-omni's calls of the old name in the
        ``importers`` files of ``tree``."""
        import ast

        calls, unknown = [], []
        for relpath in self.importers:
            source = tree.read(relpath)
            if source is None:
                continue
            importer = relpath[:-3].replace("/", ".")
            for node in calls_of(source, self.target_module, self.name):
                keywords = [k.arg for k in node.keywords]
                starred = any(isinstance(a, ast.Starred) for a in node.args)
                named = f", keywords {', '.join(str(k) for k in keywords)}" if keywords else ""
                call = f"{importer}:{node.lineno}: {len(node.args)} positional{named}"
                calls.append(call)
                if starred or not self.call_fits(len(node.args), keywords):
                    unknown.append(call)
        if unknown:
            return Shape.UNKNOWN, tuple(calls), (f"vllm-omni calls {self.name} with arguments the stand-in does not "
                                                 f"take ({'; '.join(unknown)}; it takes {', '.join(self.call_args)})")
        return Shape.KNOWN, tuple(calls), ""

    def facts(self, host: str, omni_tree, replacement: tuple[str, str]) -> FunctionStandInFacts:
        importers = self.importers_in(omni_tree)
        callers, calls, caller_detail = self.callers(omni_tree)
        detail = "; ".join(d for d in (replacement[1], caller_detail) if d)
        return FunctionStandInFacts(host, importers, replacement[0], callers, calls, detail)

    # ---- the drift-point interface ----

    def detect_static(self, site) -> FunctionStandInFacts:
        host = host_lookup(site.vllm_tree, self.target_module, self.name)
        needs_replacement = host in (HostKind.LACKS, HostKind.UNKNOWN)
        replacement = self.replacement_from_files(site) if needs_replacement else (Shape.ABSENT, "")
        return self.facts(host, site.omni_tree, replacement)

    def detect_runtime(self, module) -> FunctionStandInFacts:
        host = self.host_in_module(module)
        replacement = self.replacement_from_module(module) if host == HostKind.LACKS else (Shape.ABSENT, "")
        return self.facts(host, installed_omni_tree(), replacement)

    def decide(self, facts: FunctionStandInFacts, controls=None):
        decision = super().decide(facts.stand_in)
        if decision.action != Action.PATCHED:
            return decision
        if Shape.UNKNOWN in (facts.replacement, facts.callers):
            return self.decision(Action.REFUSED, f"vLLM lacks {self.target_path} and vllm-omni imports it, but the "
                                 f"shapes are not the measured ones ({facts.detail}); left out. Set "
                                 f"VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, or upgrade vllm_compat")
        return self.decision(Action.PATCHED, f"{decision.reason}, over vLLM's {self.built_on}")

    def prepare(self, owner, facts: FunctionStandInFacts):
        """The contract: the module does not define the name itself (ours may be there already), and vLLM's
        replacement has the shape the stand-in calls (checked where the import runs it)."""
        value = super().prepare(owner, facts.stand_in)
        shape, detail = self.replacement_from_module(owner)
        if shape != Shape.KNOWN:
            raise PatchRefusedError(f"{self.target_path} cannot be provided: {detail}. Left out; set "
                                    f"VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, or upgrade vllm_compat.")
        return value

    def compare(self, static: FunctionStandInFacts, runtime: FunctionStandInFacts) -> list[str]:
        differences = super().compare(static.stand_in, runtime.stand_in)
        if HostKind.ABSENT not in (static.host, runtime.host) and static.replacement != runtime.replacement:
            differences.append(f"vLLM's {self.built_on}: {static.replacement} (files) != {runtime.replacement} "
                               f"(imported); {static.detail or runtime.detail}")
        if static.calls != runtime.calls:
            differences.append(f"vllm-omni's calls of {self.name}: {list(static.calls)} != {list(runtime.calls)}")
        return differences
