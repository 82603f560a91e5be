"""What the module stand-ins share: the drift point for a whole vLLM module that is gone while vllm-omni imports it.

``ModuleStandIn`` is the base of a stand-in for a removed submodule (``target`` on the package ``target_module``):
a subclass names the vllm-omni files that import it (``importers``), the vLLM release that removed it
(``removed_in``), what the module holds (``names(owner)``: each the smallest definition its callers in vllm-omni
need; ``moved``: names whose definition moved elsewhere in vLLM, served as vLLM's own object, looked up when first
read) and, where those are built on other vLLM files, how those files are judged (``replacement_from_source``:
``(Shape, detail)`` from a reader of vLLM's files, the same function for the wheel and for the installed package).
On ``import <target_module>`` a module object holding them is registered as ``sys.modules[<module>]`` and as the
package's attribute, both marked; any other name of the old module raises ``AttributeError`` saying that vLLM
removed it and vllm_compat does not provide it (a stand-in is not a copy of the old file). The rules are the
bridges' (``vllm_compat.bridges``): only where vLLM lacks the module and an installed vllm-omni imports it, never over
a module vLLM ships, and ``uninstall`` removes exactly what was put there.

``RemovedByVLLMError`` is what a raising stand-in's objects raise when the feature behind them is used: the import
works (so the rest of vllm-omni does), the feature fails loudly, naming the drift.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from ..decide import Action
from ..drift import DriftPoint, is_ours, mark, provide, withdraw
from ..errors import PatchRefusedError, VllmCompatError
from . import (
    HostKind,
    StandInFacts,
    compare_stand_in,
    decide_stand_in,
    host_lookup,
    installed_omni_tree,
    omni_importers,
)
from ._name_stand_in import Shape


class RemovedByVLLMError(VllmCompatError, NotImplementedError):
    """A vllm-omni feature reached an object of a module vLLM removed, which vllm_compat provides for the import
    only (the message names the module, the vLLM release and what to do)."""


@dataclass(frozen=True)
class ModuleStandInFacts(StandInFacts):
    """``host`` / ``importers`` as every stand-in's (``StandInFacts``), plus ``replacement``: the shape of the vLLM
    files the module's names are built on (``Shape``; ``absent`` where it needs none, or where vLLM has the module)
    and ``detail``, what was found where that shape is unknown."""

    replacement: str = Shape.ABSENT
    detail: str = ""


def files_of_installed_vllm(relpath: str) -> str | None:
    """The source of ``relpath`` (``vllm/...``) in the imported vLLM (``sys.modules['vllm']``), read, not imported:
    the hook runs while vLLM's packages are still loading. None when vLLM is not imported or the file is missing."""
    vllm = sys.modules.get("vllm")
    path = getattr(vllm, "__file__", None)
    if not path:
        return None
    try:
        return (Path(path).parent.parent / relpath).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


class ModuleStandIn(DriftPoint):
    importers: tuple[str, ...] = ()
    removed_in = ""
    needs_replacement = False  # whether the names are built on vLLM files that replacement_from_source judges
    moved: dict[str, str] = {}  # name -> the vLLM module it moved to: vLLM's own object, looked up when first read

    def __init__(self) -> None:
        super().__init__()
        self._module = None  # one module object per process: revert + apply puts the same one back
        self._names_provided: tuple[str, ...] = ()

    @property
    def module_name(self) -> str:
        return self.target_path

    def names(self, owner) -> dict:
        """The module's own definitions (owner: the imported parent package), beside the ``moved`` names."""
        return {}

    def replacement_from_source(self, read) -> tuple[str, str]:
        """``(Shape, detail)`` of what the names are built on, from ``read(relpath)`` (source text or None)."""
        return Shape.ABSENT, ""

    def missing_name_message(self, name: str) -> str:
        return (f"module {self.module_name!r} has no attribute {name!r}: vLLM {self.removed_in} removed "
                f"{self.module_name}, and vllm_compat's stand-in provides only what vllm-omni imports from it "
                f"({', '.join(sorted(self._names_provided))}).")

    # ---- the module object ----

    def stand_in_module(self, owner):
        """The module object registered as ``module_name`` (made on first use, marked as ours)."""
        if self._module is None:
            import importlib.machinery
            import types

            module = types.ModuleType(self.module_name, f"vllm_compat's stand-in for {self.module_name} (removed in "
                                                        f"vLLM {self.removed_in}); see {type(self).__module__}.")
            module.__spec__ = importlib.machinery.ModuleSpec(self.module_name, None, origin=type(self).__module__)
            names = self.names(owner)
            self._names_provided = (*names, *self.moved)
            vars(module).update(names)
            stand_in = self

            def __getattr__(name):
                if name in stand_in.moved:
                    import importlib

                    return getattr(importlib.import_module(stand_in.moved[name]), name)
                if name.startswith("__"):
                    raise AttributeError(name)
                raise AttributeError(stand_in.missing_name_message(name))

            module.__getattr__ = __getattr__
            self._module = mark(module, self.id)
        return self._module

    # ---- facts ----

    def facts(self, host: str, omni_tree, read) -> ModuleStandInFacts:
        importers = (*omni_importers(omni_tree, self.importers, self.module_name, None),  # import a.b.c, from a.b.c
                     *omni_importers(omni_tree, self.importers, self.target_module, self.target))  # from a.b import c
        if self.needs_replacement and host in (HostKind.LACKS, HostKind.UNKNOWN):
            shape, detail = self.replacement_from_source(read)
        else:
            shape, detail = Shape.ABSENT, ""
        return ModuleStandInFacts(host, importers, shape, detail)

    def host_in_module(self, module) -> str:
        current = sys.modules.get(self.module_name) or vars(module).get(self.target)
        if current is not None:
            return HostKind.LACKS if is_ours(current, self.id) else HostKind.DEFINES
        path = getattr(module, "__path__", None)
        if path is None:  # not a package: it cannot have the submodule
            return HostKind.LACKS
        from importlib.machinery import PathFinder  # finds the file without importing it

        return HostKind.DEFINES if PathFinder.find_spec(self.module_name, path) is not None else HostKind.LACKS

    def detect_static(self, site) -> ModuleStandInFacts:
        return self.facts(host_lookup(site.vllm_tree, self.target_module, self.target), site.omni_tree,
                          site.vllm_tree.read)

    def detect_runtime(self, module) -> ModuleStandInFacts:
        return self.facts(self.host_in_module(module), installed_omni_tree(), files_of_installed_vllm)

    def decide(self, facts: ModuleStandInFacts, controls=None):
        decision = decide_stand_in(self.entry, facts.stand_in, self.module_name, removed_in=self.removed_in)
        if decision.action == Action.PATCHED and facts.replacement == Shape.UNKNOWN:
            return self.refused(f"vLLM lacks {self.module_name} and vllm-omni imports it, but what the stand-in is "
                                f"built on is not the measured shape ({facts.detail})")
        return decision

    # ---- install ----

    def prepare(self, owner, facts):
        """The contract: neither ``sys.modules`` nor the package holds a ``target`` that is not ours, vLLM ships no
        such file (ours may be in place already), and what the names are built on has the measured shape."""
        host = self.host_in_module(owner)
        if host != HostKind.LACKS:
            current = sys.modules.get(self.module_name) or vars(owner).get(self.target)
            found = repr(current) if current is not None else "a module file in the installed vLLM"
            raise PatchRefusedError(f"{self.module_name} exists ({found}); vllm_compat never replaces a module vLLM "
                                    "defines. Left as it is.")
        if self.needs_replacement:
            shape, detail = self.replacement_from_source(files_of_installed_vllm)
            if shape != Shape.KNOWN:
                raise PatchRefusedError(f"{self.module_name} cannot be provided: {detail or shape}. Left out; set "
                                        f"VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, or upgrade "
                                        "vllm_compat.")

    def install(self, owner, decision, state) -> bool:
        """Register the module in ``sys.modules`` and on the package; False when both are there already."""
        module = self.stand_in_module(owner)
        added = provide(owner, self.target, module, self.id)
        if sys.modules.get(self.module_name) is None:
            sys.modules[self.module_name] = module
            added = True
        return added

    def uninstall(self, owner) -> bool:
        """Remove the package attribute and the ``sys.modules`` entry where they are ours; False when neither was."""
        removed = withdraw(owner, self.target, self.id)
        if is_ours(sys.modules.get(self.module_name), self.id):
            del sys.modules[self.module_name]
            removed = True
        return removed

    def compare(self, static: ModuleStandInFacts, runtime: ModuleStandInFacts) -> list[str]:
        differences = compare_stand_in(static.stand_in, runtime.stand_in, self.module_name)
        if HostKind.ABSENT not in (static.host, runtime.host) and static.replacement != runtime.replacement:
            differences.append(f"what {self.module_name} is built on: {static.replacement} (files) != "
                               f"{runtime.replacement} (imported); {static.detail or runtime.detail}")
        return differences


def removed_class(name: str, module: str, message: str, doc: str) -> type:
    """A class named ``name`` (in ``module``) that can be used as an annotation or an ``isinstance`` target, and
    whose construction raises ``RemovedByVLLMError`` with ``message``."""

    def __init__(self, *args, **kwargs):
        raise RemovedByVLLMError(message)

    return type(name, (), {"__init__": __init__, "__doc__": doc, "__module__": module, "__qualname__": name})
