"""Bridges: names vLLM removed or moved that an installed vllm-omni still imports.

Each bridge is a drift point like the patches (one module deriving ``vllm_compat.drift.DriftPoint``, one catalogue
row), of kind "stand-in" (our own smallest definition of a removed name), "alias" or "adapter". A bridge is
installed only where the installed vLLM lacks the name and only while an installed vllm-omni imports it; it never
replaces a name vLLM defines, and what it puts in place carries vllm_compat's one mark (``drift.MARK``, the entry
id) so that uninstall removes exactly that and nothing else.

This module holds what the bridges share: reading which vllm-omni files import a name (files only, never
``import vllm_omni``: the hook that asks runs while vllm-omni is being imported), where vLLM has a name, and the
stand-ins' decision table. Providing / withdrawing a marked object is the install primitive's (``drift.provide`` /
``drift.withdraw``, re-exported here). Like every drift-point module, it imports neither torch nor vLLM.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..detect.source_tree import parse_source
from ..drift import MARK, is_ours, provide, withdraw  # noqa: F401 - the install primitive, re-exported


class HostKind:
    DEFINES = "defines"  # vLLM has the name: the bridge stays out
    LACKS = "lacks"  # the module exists without the name (or with ours in its place)
    NO_MODULE = "no_module"  # the module itself is gone
    ABSENT = "absent"  # vLLM is not installed
    UNKNOWN = "unknown"  # the files cannot tell (lazy __getattr__, compiled module)


@dataclass(frozen=True)
class StandInFacts:
    """What a stand-in decides on: whether vLLM has the name, and which vllm-omni imports of it run (each
    ``"module:line (context)"``; contexts as ``detect.import_drift`` names them, TYPE_CHECKING ones left out)."""

    host: str
    importers: tuple[str, ...] = ()

    @property
    def stand_in(self) -> StandInFacts:
        """These two facts alone (what every stand-in's decision table reads; a subclass adds its shapes)."""
        return StandInFacts(self.host, self.importers)

    def to_dict(self) -> dict:
        return asdict(self)


def omni_importers(tree, files: tuple[str, ...], module: str, name: str | None) -> tuple[str, ...]:
    """The imports of ``module`` (``from module import name``, or ``import module`` / any name from it when
    ``name`` is None) in the vllm-omni ``files`` of ``tree`` (a ``detect.static.SourceTree``), except those under
    ``if TYPE_CHECKING``: those that run, at import or when a function runs."""
    from ..detect.source_scan import plugin_imports

    found = []
    for relpath in files:
        importer = relpath[:-3].replace("/", ".").removesuffix(".__init__")
        package = importer if relpath.endswith("__init__.py") else importer.rpartition(".")[0]
        for line, level, imported, names, context in plugin_imports(tree, relpath, "vllm_omni"):
            if context == "type_checking":
                continue
            if level == -1:  # import a.b
                hit = name is None and module in names
            else:
                if level:  # a relative import cannot reach vLLM, but resolve it for completeness
                    base = package.split(".")[: len(package.split(".")) - (level - 1)]
                    imported = ".".join(base + ([imported] if imported else []))
                hit = imported == module and (name is None or name in names)
            if hit:
                found.append(f"{importer}:{line} ({context})")
    return tuple(found)


def calls_of(source: str, module: str, name: str) -> list:
    """The calls of ``name`` in ``source`` where the name comes from ``from module import name`` (aliases followed),
    as parsed ``ast.Call`` nodes in source order; a method or attribute of the same name is someone else's.
    ``SyntaxError`` propagates."""
    import ast

    tree = parse_source(source)
    bound = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == module and not node.level for alias in node.names if alias.name == name}
    calls = [node for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in bound]
    return sorted(calls, key=lambda node: (node.lineno, node.col_offset)) if bound else []


def imports_name(source: str, module: str, name: str) -> bool:
    """Whether ``source`` binds ``name`` with ``from module import name`` (``SyntaxError`` propagates)."""
    import ast

    return any(isinstance(node, ast.ImportFrom) and node.module == module and not node.level
               and any(alias.name == name for alias in node.names) for node in ast.walk(parse_source(source)))


def installed_omni_tree():
    """The installed vllm-omni's files (a ``SourceTree``), found without importing ``vllm_omni``."""
    from ..detect.source_tree import tree_of

    return tree_of("vllm_omni")


def host_lookup(vllm_tree, module: str, name: str | None) -> str:
    """``HostKind`` of ``module.name`` in a vLLM tree, from its files."""
    if not vllm_tree.has_package("vllm"):
        return HostKind.ABSENT
    from ..detect.host_index import host_index

    answer = host_index(vllm_tree).lookup(module, name)
    return {"yes": HostKind.DEFINES, "no": HostKind.LACKS, "no_module": HostKind.NO_MODULE}.get(answer,
                                                                                               HostKind.UNKNOWN)


def provided_by_decisions(decisions) -> dict[str, str]:
    """{``module.name``: entry id} for every bridge decided "patched" among ``decisions``: what the import-drift
    report counts as bridged (an entry's one target, and the many an alias decision names). Disabled, skipped or
    refused bridges provide nothing."""
    from ..catalogue import entry as catalogue_entry

    provided = {}
    for decision in decisions:
        if decision.action != "patched":
            continue
        try:
            patch_entry = catalogue_entry(decision.name)
        except KeyError:
            continue
        provided.update(dict.fromkeys((*patch_entry.provides, *decision.provides), patch_entry.id))
    return provided


def drift_handler(decisions, handles: dict | None = None):
    """``handler(finding) -> entry id | None``: the first drift point among ``decisions`` that accounts for its drift
    (``Decision.accounts_for_drift``: it acts, or it names what the drift leaves out) and handles the behavioural-drift
    finding (``DriftPoint.handles``). ``handles``: ``{entry id: handles_drift}`` where the patterns are known without
    importing the drift point (``decide.decided``); the entries it does not name are imported and asked, at the
    first finding (a pair without behavioural drift imports none)."""
    from ..catalogue import entry as catalogue_entry

    patched = []
    for decision in decisions:
        if decision.accounts_for_drift:
            try:
                patched.append(catalogue_entry(decision.name))
            except KeyError:
                continue
    handles = handles or {}
    acting = None  # [(entry id, finding -> bool)], made at the first finding

    def handler(finding) -> str | None:
        nonlocal acting
        if acting is None:
            acting = []
            for e in patched:
                if e.id in handles:
                    if handles[e.id]:
                        acting.append((e.id, lambda f, patterns=handles[e.id]: any(f.matches(*p) for p in patterns)))
                elif e.point.handles_drift:
                    acting.append((e.id, e.point.handles))
        return next((entry_id for entry_id, fits in acting if fits(finding)), None)

    return handler


def stage_left_out_by_decisions(decisions) -> tuple[tuple[str, str, str], ...]:
    """(entrypoint id, entry id, feature) for every decision that leaves a behaviour of an entrypoint out
    (``Decision.leaves_out_of``), whatever it installs: the feature fails there, and the verdict says so."""
    return tuple((d.leaves_out_of, d.name, d.leaves_out) for d in decisions
                 if d.leaves_out and d.leaves_out_of and d.action != "disabled")


def left_out_by_decisions(decisions) -> dict[str, str]:
    """{entry id: what it leaves out} for every bridge decided "patched" whose stand-in provides a name for the
    import only (``Decision.leaves_out``)."""
    return {d.name: d.leaves_out for d in decisions if d.action == "patched" and d.leaves_out}


def decide_stand_in(patch_entry, facts: StandInFacts, provided: str, removed_in: str):
    """The decision table every stand-in shares: pending while vLLM's files cannot tell, skipped where vLLM has
    ``provided`` (a name or a module), where even its module is gone, or where no installed vllm-omni imports it;
    patched otherwise. ``removed_in`` names the vLLM release that removed it, for the reason."""
    from ..decide import Action

    by_host = {
        HostKind.ABSENT: (Action.PENDING, "vLLM is not installed; decided when it is imported"),
        HostKind.UNKNOWN: (Action.PENDING, f"{patch_entry.target_module}'s files cannot tell whether it has "
                                           f"{provided}; decided when it is imported"),
        HostKind.DEFINES: (Action.SKIPPED, f"vLLM has {provided}; its own is used"),
        HostKind.NO_MODULE: (Action.SKIPPED, f"this vLLM has no {patch_entry.target_module} at all; a stand-in for "
                                             f"{provided} cannot help"),
    }
    if facts.host in by_host:
        return patch_entry.decision(*by_host[facts.host])
    if not facts.importers:
        return patch_entry.decision(Action.SKIPPED, f"vLLM lacks {provided}, but no installed vllm-omni imports it")
    return patch_entry.decision(Action.PATCHED, f"vLLM lacks {provided} (removed in {removed_in}), and vllm-omni "
                                f"imports it ({', '.join(facts.importers)}); provided by a stand-in")


def compare_stand_in(static: StandInFacts, runtime: StandInFacts, provided: str) -> list[str]:
    """Static against runtime facts of a stand-in (an absent vLLM on either side is no disagreement)."""
    differences = []
    if static.host != runtime.host and HostKind.ABSENT not in (static.host, runtime.host):
        differences.append(f"{provided}: vLLM {static.host} (files) != {runtime.host} (imported)")
    if static.importers != runtime.importers:
        differences.append(f"vllm-omni importers of {provided}: {list(static.importers)} != "
                           f"{list(runtime.importers)}")
    return differences
