"""Aliases for vLLM names and modules that moved: the old import path resolves to the new definition.

Why: vLLM moves internals between releases (``vllm.entrypoints.launcher`` -> ``vllm.entrypoints.launchers.launcher``
in 0.29, ``...serve.utils.api_utils.VLLM_SUBCMD_PARSER_EPILOG`` -> ``...common.startup`` in 0.33, ...); a pinned
vllm-omni still imports the old path and dies with ImportError. Which name went where is data, ``_alias_table.py``,
generated from the release wheels by ``matrix/aliases.py``, which matches definitions by their normalized source,
never by name (the same name can stand for an unrelated class later: vLLM 0.31's
``transformers.multimodal.MultiModalProcessingInfo`` is not 0.30's ``processing.processor`` NamedTuple).
When: per table row, where the installed vLLM lacks the old name, defines the new one with the source the table
recorded (its ``key``, re-read from the installed files), the pair is identical or reviewed "accept", and an
installed vllm-omni imports the old path (read from its files). The hook on ``vllm.env_override`` (the second module
``import vllm`` runs, before any ``vllm.x`` submodule; registered by the startup ``.pth``) puts the mechanism in place:
a post-import hook per old module for names, a meta-path finder for whole modules. Never replaces what vLLM defines:
a name the old module binds, or a module any other finder finds, is left alone.
Serves: vllm-omni 0.24.0, 0.26.0, 0.28.0 and 0.30.0 on vLLM 0.25-0.34, per row of the table (its vllm / omni fields).
Retire when: the oldest supported vllm-omni imports none of the table's old paths (regenerate, the table empties).

A name alias is set on the old module right after it is imported (the new module imported then, or, if it is
itself mid-import, right after it finishes). A module alias is the new module object itself, registered under the
old name by the import system through our finder (its ``__spec__`` left as the new module's). A split module (its
names went to several modules: vLLM 0.29+'s ``openai.engine.protocol``) is a module object of ours whose names are
vLLM's own objects, each looked up in its new home on first access; the packages above a module alias that vLLM
dropped too (``openai.engine``) are created empty, through the same finder, so other bridges' hooks on them run.
Uninstall removes exactly what was added (attributes, ``sys.modules`` entries, the parent attribute the import
system set, the finder) and idles the per-module hooks. This module imports neither torch nor vLLM, and reads the
table only when asked.
"""

from __future__ import annotations

import importlib
import json
import sys
from dataclasses import asdict, dataclass
from typing import NamedTuple

from ..decide import Action, Decision
from ..drift import DriftPoint
from ..errors import PatchRefusedError
from . import HostKind, host_lookup, installed_omni_tree, is_ours, omni_importers


class State:
    ALIAS = "alias"  # installed: the old path resolves to the new definition
    VLLM_HAS_IT = "vllm_has_it"  # the installed vLLM binds the old name: its own is used
    NOT_IMPORTED = "not_imported"  # no installed vllm-omni imports the old path
    NO_MATCH = "no_match"  # no row's new definition is in this vLLM with the recorded source
    UNREVIEWED = "unreviewed"  # the definition changed and no review accepted it
    REJECTED = "rejected"  # the definition changed and the review rejected it
    NO_PARENT = "no_parent"  # an old module (or an old name's module) whose parent package is gone
    UNKNOWN = "unknown"  # vLLM's files cannot tell whether it has the old name


class Alias(NamedTuple):
    """One row of the generated table (``_alias_table.ALIASES``)."""

    old: str  # what vllm-omni imports: a module.name, or a module
    new: str | None  # where that definition is now (a module for kind "module"); None for a split module
    kind: str  # "name", or "module" for a module that moved whole (or split: see moved)
    match: str  # "identical" (same normalized source) or "changed" (edited: installed only with verdict "accept")
    key: str  # source_key of the new definition; for a module, of its names together (re-checked when installed)
    similarity: float  # the least line similarity of a changed definition to the old one (1.0: identical)
    vllm: tuple[str, str]  # first and last vLLM release of the matrix where it was found
    omni: tuple[str, ...]  # vllm-omni releases importing it
    importers: tuple[str, ...]  # their files
    path: str  # "diffusion" when the diffusion path reaches it, else "serving"
    names: tuple[str, ...]  # for a module: the names vllm-omni takes from it
    moved: tuple[tuple[str, str], ...]  # for a split module: (name, "new.module.name") each, from several modules
    verdict: str | None  # the review of a changed row: "accept" | "reject" | None (unreviewed)
    reason: str | None  # the review's one-line reason


@dataclass(frozen=True)
class AliasFact:
    old: str
    new: str | None  # the table row that applies; None when none does (and for a split module: see ``moved``)
    kind: str  # "name" | "module"
    state: str
    importers: tuple[str, ...] = ()
    moved: tuple[tuple[str, str], ...] = ()  # a split module: (name, "new.module.name") each
    parents: tuple[str, ...] = ()  # packages of the old path vLLM lacks too, outermost first: created with it

    @property
    def target(self) -> str:
        """Where the old path resolves to, in words: the new path, or each name's new home."""
        if self.new is not None or not self.moved:
            return str(self.new)
        return "{" + ", ".join(f"{name}: {new}" for name, new in self.moved) + "}"


@dataclass(frozen=True)
class AliasFacts:
    """``host``: ``HostKind.ABSENT`` without vLLM, else ``HostKind.LACKS``; ``aliases``: one fact per old path of the
    table."""

    host: str
    aliases: tuple[AliasFact, ...] = ()

    @property
    def installable(self) -> tuple[AliasFact, ...]:
        return tuple(a for a in self.aliases if a.state == State.ALIAS)

    def to_dict(self) -> dict:
        return asdict(self)


def table() -> tuple[Alias, ...]:
    """The generated rows, one ``Alias`` each."""
    from ._alias_table import ALIASES

    return ALIASES


def old_names() -> tuple[str, ...]:
    """Every old path of the table (what this entry can provide on some vLLM)."""
    return tuple(sorted({row.old for row in table()}))


def provided_packages(facts: AliasFacts) -> tuple[str, ...]:
    """The packages vLLM lacks that the installable module aliases create above their old paths (vLLM 0.29+:
    ``vllm.entrypoints.openai.engine`` for its split ``protocol``), outermost first."""
    return tuple(dict.fromkeys(p for fact in facts.installable for p in fact.parents))


def _split(path: str, kind: str) -> tuple[str, str | None]:
    return (path, None) if kind == "module" else tuple(path.rsplit(".", 1))


def combined_key(keys: dict) -> str:
    """A moved module's key: its names' ``source_key``s together (as ``matrix/aliases.py`` writes it)."""
    import hashlib  # detection only: ~3 ms to import, and the warm doctor reads the facts back

    return hashlib.sha256(json.dumps(sorted(keys.items())).encode()).hexdigest()[:16]


def _new_key(defs, row) -> str | None:
    if row.kind == "module":
        if row.moved:  # a split module: each name's key where it went
            keys = {name: defs.definition_key(*new.rsplit(".", 1)) for name, new in row.moved}
        else:
            keys = {name: defs.definition_key(row.new, name) for name in row.names}
        return None if None in keys.values() else combined_key(keys)
    module, name = row.new.rsplit(".", 1)
    return defs.definition_key(module, name)


def _review_state(row) -> str:
    if row.match == "identical" or row.verdict == "accept":
        return State.ALIAS
    return State.REJECTED if row.verdict == "reject" else State.UNREVIEWED


def _missing_packages(defs, module: str) -> tuple[str, ...] | None:
    """The packages above ``module`` that vLLM's files lack, outermost first (empty when its parent exists); None
    when not even ``vllm`` is there."""
    missing = []
    package = module.rpartition(".")[0]
    while package and defs.index.module_file(package) is None:
        missing.append(package)
        package = package.rpartition(".")[0]
    return tuple(reversed(missing)) if package else None


def _imported_names(omni_tree, files, module: str) -> set:
    """The names the vllm-omni ``files`` of ``omni_tree`` take from ``module`` (``from module import a, b``),
    imports under ``if TYPE_CHECKING`` left out."""
    from ..detect.source_scan import plugin_imports

    names = set()
    for relpath in files:
        for _line, level, imported, found, context in plugin_imports(omni_tree, relpath, "vllm_omni"):
            if level == 0 and imported == module and context != "type_checking":
                names.update(found)
    return names


def _row_holding_imported_names(rows: list, omni_tree, module: str):
    """Of the module rows that match this vLLM (in order), the first whose names hold every name the installed
    vllm-omni takes from ``module``; the first row where none does. The rows of several vllm-omni releases can
    match one vLLM, each with the names its release imports: on vLLM 0.34 vllm-omni 0.28.0's openai.engine.protocol
    row holds 13 names, 0.24.0's 14 (PromptTokenUsageInfo too, which 0.24.0's serving_chat imports); table order
    alone gave 0.24.0 the 13. None when no row matches."""
    if len(rows) < 2:
        return next(iter(rows), None)
    wanted = _imported_names(omni_tree, sorted({f for r in rows for f in r.importers}), module)
    return next((r for r in rows if wanted <= set(r.names)), rows[0])


def detect_facts(vllm_tree, omni_tree) -> AliasFacts:
    """The facts from files: for each old path, what the installed vLLM has and whether vllm-omni imports it."""
    if not vllm_tree.has_package("vllm"):
        return AliasFacts(HostKind.ABSENT)
    from ..detect.definitions import Definitions

    defs = Definitions(vllm_tree)
    rows_by_old: dict[str, list] = {}
    for row in table():
        rows_by_old.setdefault(row.old, []).append(row)
    facts = []
    for old, rows in sorted(rows_by_old.items()):
        kind = rows[0].kind
        module, name = _split(old, kind)
        host = host_lookup(vllm_tree, module, name)
        if host in (HostKind.DEFINES, HostKind.UNKNOWN):
            facts.append(AliasFact(old, None, kind, State.VLLM_HAS_IT if host == HostKind.DEFINES else State.UNKNOWN))
            continue
        # a module alias creates the packages above it that vLLM dropped too (as empty packages); a name needs its module
        parents = _missing_packages(defs, module) if kind == "module" else ()
        if kind == "name" and host == HostKind.NO_MODULE or parents is None:
            facts.append(AliasFact(old, None, kind, State.NO_PARENT))
            continue
        # a whole-module row before a split one of the same key (vLLM's own module object where there is one)
        matching = [r for r in sorted(rows, key=lambda r: bool(r.moved)) if _new_key(defs, r) == r.key]
        row = _row_holding_imported_names(matching, omni_tree, module) if kind == "module" else next(iter(matching), None)
        if row is None:
            facts.append(AliasFact(old, None, kind, State.NO_MATCH))
            continue
        importers = omni_importers(omni_tree, row.importers, module, name)
        state = _review_state(row) if importers else State.NOT_IMPORTED
        facts.append(AliasFact(old, row.new, kind, state, importers, row.moved, parents))
    return AliasFacts(HostKind.LACKS, tuple(facts))


# ---- the mechanism: per-old-module hooks for names, a finder for modules ----

class _AliasLoader:
    """Loads an old module path as the new module object, leaving that object's own spec in place."""

    def __init__(self, new: str):
        self.new = new
        self._spec = None

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        # The import system set our spec on the new module; give it its own back (reload, pickling by name).
        module.__spec__ = self._spec


class _MadeLoader:
    """Makes a module vLLM lacks: an empty package above an aliased old module, or a split module, whose names are
    vLLM's own objects (the stand-ins' ``Moved``), each imported from its new home when first read and kept (the
    old module may be imported while vLLM's packages still import each other). Marked as ``moved_names``'."""

    def __init__(self, moved: tuple[tuple[str, str], ...] = ()):
        self.moved = moved

    def create_module(self, spec):
        return None  # the default module object (a package gets ``__path__`` from the spec)

    def exec_module(self, module):
        from ..drift import mark

        mark(module, DRIFT_POINT.entry.id)
        if self.moved:
            module.__getattr__ = _lazy_members(module, self.moved)


def _lazy_members(module, moved: tuple[tuple[str, str], ...]):
    """A split module's ``__getattr__``: each name vLLM's own object in its new home (the stand-ins' lazy members)."""
    from ._module_stand_in import Moved, lazy_members

    members = {name: Moved(*new.rsplit(".", 1)) for name, new in moved}
    return lazy_members(module, members, f"vllm_compat's alias of a module vLLM split holds only "
                                         f"{', '.join(sorted(members))}")


class AliasFinder:
    """Answers only for the old module paths (and missing packages above them) it was given, and only when no
    other finder finds them."""

    _vllm_compat_alias_finder = True

    def __init__(self):
        self.modules: dict[str, str] = {}  # old module -> new module
        self.split: dict[str, tuple[tuple[str, str], ...]] = {}  # old module -> (name, new path) each
        self.packages: set[str] = set()  # packages vLLM lacks above an old module

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.modules and fullname not in self.split and fullname not in self.packages:
            return None
        for finder in sys.meta_path:
            if finder is self or getattr(finder, "_vllm_compat_finder", False) or not hasattr(finder, "find_spec"):
                continue
            if finder.find_spec(fullname, path, target) is not None:
                return None  # vLLM has the module: never shadow it
        from importlib.machinery import ModuleSpec

        if fullname in self.modules:
            new = self.modules[fullname]
            return ModuleSpec(fullname, _AliasLoader(new), origin=f"vllm_compat alias of {new}")
        if fullname in self.split:
            return ModuleSpec(fullname, _MadeLoader(self.split[fullname]), origin="vllm_compat split-module alias")
        return ModuleSpec(fullname, _MadeLoader(), origin="vllm_compat package above an alias", is_package=True)

    def clear(self) -> None:
        self.modules.clear()
        self.split.clear()
        self.packages.clear()

    def has_paths(self) -> bool:
        return bool(self.modules or self.split or self.packages)


_finder = AliasFinder()
_names: dict[str, dict[str, str]] = {}  # old module -> {old name: "new.module.name"} while installed
_added: list[tuple[object, str, object]] = []  # (owner, attribute, value) we set
_hooks: dict = {}  # old module -> its hook callable (one each: registration dedups)


def _set_names(module) -> None:
    """Put the aliased names on an old module that has just been imported (never over a name it binds)."""
    for name, new in _names.get(module.__name__, {}).items():
        if name in vars(module):
            continue
        new_module, new_name = new.rsplit(".", 1)
        target = sys.modules.get(new_module)
        from ..hooks import _is_initialized, register_post_import_hook

        if target is not None and not _is_initialized(target):
            # The new module is mid-import (it imports the old one): finish once it is done.
            register_post_import_hook(new_module, _hook_for(module.__name__))
            continue
        try:
            target = importlib.import_module(new_module)
            value = getattr(target, new_name)
        except Exception as exc:  # noqa: BLE001 - a failing alias leaves the original ImportError, never a new one
            import logging

            logging.getLogger("vllm_compat").warning("vllm_compat: alias %s.%s -> %s not set: %s: %s",
                                                     module.__name__, name, new, type(exc).__name__, exc)
            continue
        setattr(module, name, value)
        _added.append((module, name, value))


def _hook_for(old_module: str):
    if old_module not in _hooks:
        def on_old_module_imported(_module, old_module=old_module) -> None:
            module = sys.modules.get(old_module)
            if module is not None and old_module in _names:
                _set_names(module)

        on_old_module_imported.__qualname__ = f"alias_hook[{old_module}]"
        _hooks[old_module] = on_old_module_imported
    return _hooks[old_module]


def _is_ours(owner, name: str) -> bool:
    return any(o is owner and n == name and vars(owner).get(name) is v for o, n, v in _added)


# ---- the drift point ----

class MovedNames(DriftPoint):
    """The alias table's old paths, aliased where this vLLM lacks them (the module docstring says when)."""

    def detect_static(self, site) -> AliasFacts:
        return detect_facts(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> AliasFacts:
        """The same facts, from the vLLM that is being imported (its package's own directory) and the installed
        vllm-omni's files; an old module already imported answers from its live namespace, where a name counts as
        vLLM's only if vllm_compat did not put it there: neither one of our aliases nor another bridge's stand-in
        (marked with ``drift.MARK``; ``multimodal_processing_info`` binds an old path of the table). Such a name
        is one vLLM lacks, as its files say, so the fact stays the static one."""
        from pathlib import Path

        from ..detect.static import SourceTree

        package = sys.modules.get("vllm")
        paths = list(getattr(package, "__path__", ()) or ())
        tree = SourceTree(Path(paths[0]).parent) if paths else SourceTree(Path("/nonexistent-vllm-compat-root"))
        facts = detect_facts(tree, installed_omni_tree())
        live = []
        for fact in facts.aliases:
            module, name = _split(fact.old, fact.kind)
            loaded = sys.modules.get(module)
            if (fact.kind == "name" and loaded is not None and name in vars(loaded) and not _is_ours(loaded, name)
                    and not is_ours(vars(loaded)[name])):
                fact = AliasFact(fact.old, None, fact.kind, State.VLLM_HAS_IT)
            live.append(fact)
        return AliasFacts(facts.host, tuple(live))

    def decide(self, facts: AliasFacts, controls) -> Decision:
        """Patched where any old path is installable; ``provides`` names each, and each package created above
        one (``provided_packages``)."""
        if facts.host == HostKind.ABSENT:
            return self.decision(Action.PENDING, "vLLM is not installed; decided when it is imported")
        aliased = facts.installable
        held = [a for a in facts.aliases if a.state in (State.UNREVIEWED, State.REJECTED) and a.importers]
        held_note = (f"; not aliased, the definition changed without an accepted review: "
                     f"{', '.join(f'{a.old} ({a.state})' for a in held)}") if held else ""
        if not aliased:
            return self.decision(Action.SKIPPED, "no moved name of the alias table is both missing from this vLLM and "
                                  f"imported by an installed vllm-omni{held_note}")
        pairs = ", ".join(f"{a.old} -> {a.target}" for a in aliased)
        packages = provided_packages(facts)
        created = f" (with the package(s) vLLM dropped above them: {', '.join(packages)})" if packages else ""
        return self.decision(Action.PATCHED, f"vLLM lacks {len(aliased)} old path(s) vllm-omni imports; aliased to the "
                              f"same definitions' new homes: {pairs}{created}{held_note}",
                              provides=(*packages, *(a.old for a in aliased)))

    def prepare(self, owner, facts: AliasFacts) -> tuple[AliasFact, ...]:
        """The contract: no old module that is to be aliased is in ``sys.modules`` as something that is not ours."""
        for fact in facts.installable:
            if fact.kind == "module":
                for path in (*fact.parents, fact.old):
                    current = sys.modules.get(path)
                    if current is not None and not is_ours(current, self.entry.id) and (
                            path != fact.old or fact.new is None or current is not sys.modules.get(fact.new)):
                        raise PatchRefusedError(f"{path} is imported already ({current!r}); vllm_compat never replaces "
                                                "a module vLLM defines. Left as it is.")
        return facts.installable

    def install(self, owner, decision: Decision, state) -> bool:
        """Register the aliases ``state`` (``prepare``'s list) names; False when all were in place already."""
        from ..hooks import register_post_import_hook

        added = False
        for fact in state or ():
            if fact.kind == "module":
                for package in fact.parents:
                    if package not in _finder.packages:
                        _finder.packages.add(package)
                        added = True
                if fact.moved:
                    if _finder.split.get(fact.old) != fact.moved:
                        _finder.split[fact.old] = fact.moved
                        added = True
                elif _finder.modules.get(fact.old) != fact.new:
                    _finder.modules[fact.old] = fact.new
                    added = True
                continue
            module, name = fact.old.rsplit(".", 1)
            names = _names.setdefault(module, {})
            if names.get(name) != fact.new:
                names[name] = fact.new
                added = True
        if _finder.has_paths() and _finder not in sys.meta_path:
            # After vllm_compat's post-import finder, so an aliased module still gets its hooks.
            hooks = [i for i, f in enumerate(sys.meta_path) if getattr(f, "_vllm_compat_finder", False)]
            sys.meta_path.insert(hooks[0] + 1 if hooks else 0, _finder)
            added = True
        for module in _names:
            register_post_import_hook(module, _hook_for(module))  # already imported: runs now (first time)
            if module in sys.modules:
                _set_names(sys.modules[module])
        return added

    def uninstall(self, owner) -> bool:
        """Remove every attribute, ``sys.modules`` entry and parent attribute the aliases added, and the finder."""
        removed = False
        _names.clear()
        while _added:
            target, name, value = _added.pop()
            if vars(target).get(name) is value:
                delattr(target, name)
                removed = True
        made = [*_finder.split, *sorted(_finder.packages, key=len, reverse=True)]  # innermost first
        for old in [*_finder.modules, *made]:
            module = sys.modules.get(old)
            new = _finder.modules.get(old)
            if module is not None and (module is sys.modules.get(new) if new else is_ours(module, self.entry.id)):
                del sys.modules[old]
                removed = True
                parent, _, leaf = old.rpartition(".")
                parent_module = sys.modules.get(parent)
                if parent_module is not None and vars(parent_module).get(leaf) is module:
                    delattr(parent_module, leaf)
        _finder.clear()
        if _finder in sys.meta_path:
            sys.meta_path.remove(_finder)
            removed = True
        return removed

    def is_installed(self, owner) -> bool:
        return self.in_place(owner) is not None

    def in_place(self, owner):
        """The finder while it is registered, else the names table while any is set (None when nothing is)."""
        if _finder in sys.meta_path:
            return _finder
        return _names or None

    def compare(self, static: AliasFacts, runtime: AliasFacts) -> list[str]:
        if HostKind.ABSENT in (static.host, runtime.host):
            return []
        before = {a.old: a for a in static.aliases}
        differences = []
        for fact in runtime.aliases:
            other = before.get(fact.old)
            if other != fact:
                differences.append(f"{fact.old}: {other and (other.target, other.state, list(other.importers), other.parents)}"
                                   f" (files) != {(fact.target, fact.state, list(fact.importers), fact.parents)} (imported)")
        return differences


DRIFT_POINT = MovedNames()
