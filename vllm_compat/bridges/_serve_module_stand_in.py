"""The serving-layer module stand-ins: a whole vLLM module that is gone, put back as a module object (nested ones too).

``ModuleStandIn`` is the base of a bridge whose target is a module vLLM removed (``old_module``), where vllm-omni
imports names from it. The catalogue row's ``target_module`` is the deepest package of that path vLLM still has (its
import triggers the bridge) and ``target`` the first missing component; a subclass names the vllm-omni files that
import the old module (``importers``), the vLLM release that removed it (``removed_in``) and the names the module
holds (``members()``, called where the hook runs: it may import vLLM). ``install`` registers the missing packages and
the module in ``sys.modules`` and on their parents, each marked with the entry id (``drift.MARK``), and
``uninstall`` removes exactly those. Never over a module vLLM has (a file of the installed vLLM, or anything another
finder registered): that is a refusal saying what was found.
"""

from __future__ import annotations

import sys

from ..drift import is_ours, mark, provide, withdraw
from ..errors import PatchRefusedError
from . import (
    HostKind,
    StandInFacts,
    compare_stand_in,
    decide_stand_in,
    host_lookup,
    installed_omni_tree,
    omni_importers,
)
from ._name_stand_in import NameStandIn


class Moved:
    """A member that is vLLM's own object ``module.name``, imported when vllm-omni first asks for it (PEP 562): the
    hook that registers the stand-in runs while vLLM's packages are still importing each other, and importing the
    new module there would enter a cycle (vLLM 0.25: ``openai.engine`` is imported from inside
    ``chat_completion.protocol``, which ``generate.base.serving`` imports)."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


def _lazy_getattr(module, lazy: dict):
    def __getattr__(name: str):
        moved = lazy.get(name)
        if moved is None:
            raise AttributeError(f"module {module.__name__!r} has no attribute {name!r} (vllm_compat's stand-in "
                                 f"holds only {', '.join(sorted(lazy))})")
        import importlib

        value = getattr(importlib.import_module(moved.module), moved.name)
        setattr(module, name, value)
        return value

    return __getattr__


class ModuleStandIn(NameStandIn):
    """A stand-in module for ``old_module`` below the catalogue row's ``target_module``."""

    old_module = ""

    def members(self) -> dict:
        """The names the stand-in module holds (what vllm-omni imports from it)."""
        raise NotImplementedError(f"{type(self).__qualname__} must define members()")

    def check_members(self, members: dict) -> None:
        """The contract on what ``members()`` built on (``PatchRefusedError`` saying what was found); default: none."""

    # ---- the module chain ----

    @property
    def first_missing(self) -> str:
        """The first module of ``old_module`` that vLLM lacks: ``target_module.target``."""
        return f"{self.target_module}.{self.target}"

    def chain(self) -> list[str]:
        """The modules registered, outermost first: ``first_missing`` down to ``old_module``."""
        rest = self.old_module[len(self.first_missing):].strip(".").split(".") if self.old_module != \
            self.first_missing else []
        names = [self.first_missing]
        for part in rest:
            names.append(f"{names[-1]}.{part}")
        return names

    def build(self, owner):
        """The outermost module object of the chain, every inner one set on its parent (all marked as ours)."""
        import importlib.machinery
        import types

        members = self.members()
        self.check_members(members)
        modules = []
        for name in self.chain():
            module = types.ModuleType(name, f"vllm_compat's stand-in for {name} (gone in vLLM {self.removed_in}); "
                                            f"see {type(self).__module__}.")
            is_package = name != self.old_module
            module.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=type(self).__module__,
                                                             is_package=is_package)
            if is_package:
                module.__path__ = []
            mark(module, self.id)
            if modules:
                setattr(modules[-1], name.rpartition(".")[2], module)
            modules.append(module)
        lazy = {key: value for key, value in members.items() if isinstance(value, Moved)}
        for key, value in members.items():
            if key not in lazy:
                setattr(modules[-1], key, value)
        if lazy:
            modules[-1].__getattr__ = _lazy_getattr(modules[-1], lazy)
        return modules[0]

    @staticmethod
    def _inner(top, name: str):
        module = top
        for part in name[len(top.__name__):].strip(".").split(".") if name != top.__name__ else []:
            module = getattr(module, part)
        return module

    # ---- facts ----

    def facts_from_files(self, site) -> StandInFacts:
        return StandInFacts(host_lookup(site.vllm_tree, self.target_module, self.target),
                            omni_importers(site.omni_tree, self.importers, self.old_module, None))

    def host_in_module(self, module) -> str:
        """The imported parent's answer: vLLM lacks the module where neither ``sys.modules``, the parent nor a file
        of the parent package has it (ours does not count)."""
        found = [m for m in (sys.modules.get(self.first_missing), vars(module).get(self.target)) if m is not None]
        if found:  # either one that is not ours is vLLM's
            return HostKind.LACKS if all(is_ours(m, self.id) for m in found) else HostKind.DEFINES
        path = getattr(module, "__path__", None)
        if path is None:
            return HostKind.LACKS
        from importlib.machinery import PathFinder  # finds the file without importing it

        return HostKind.DEFINES if PathFinder.find_spec(self.first_missing, path) is not None else HostKind.LACKS

    def facts_from_module(self, module) -> StandInFacts:
        return StandInFacts(self.host_in_module(module), omni_importers(installed_omni_tree(), self.importers,
                                                                        self.old_module, None))

    def decide(self, facts: StandInFacts, controls=None):
        """Every stand-in's decision table (``bridges.decide_stand_in``); a patched decision ``provides`` the old
        module's path (the import-drift report's unresolved target), not only the row's first missing package."""
        import dataclasses

        from ..decide import Action

        decision = decide_stand_in(self.entry, facts, self.old_module, removed_in=self.removed_in)
        if decision.action == Action.PATCHED:
            decision = dataclasses.replace(decision, provides=(self.old_module,))
        return decision

    def compare(self, static: StandInFacts, runtime: StandInFacts) -> list[str]:
        return compare_stand_in(static, runtime, self.old_module)

    # ---- install ----

    def prepare(self, owner, facts):
        """The contract: vLLM has no ``first_missing`` (ours may be there already); returns the module chain."""
        if self.host_in_module(owner) != HostKind.LACKS:
            current = sys.modules.get(self.first_missing) or vars(owner).get(self.target)
            found = repr(current) if current is not None else "a module file in the installed vLLM"
            raise PatchRefusedError(f"{self.first_missing} exists ({found}); vllm_compat never replaces a module "
                                    "vLLM defines. Left as it is.")
        current = vars(owner).get(self.target)
        return current if current is not None else self.build(owner)

    def install(self, owner, decision, state) -> bool:
        """Put the chain on the parent and in ``sys.modules``; False when all of it was there already."""
        top = state if state is not None else self.build(owner)
        added = provide(owner, self.target, top, self.id)
        for name in self.chain():
            if sys.modules.get(name) is None:
                sys.modules[name] = self._inner(top, name)
                added = True
        return added

    def uninstall(self, owner) -> bool:
        removed = False
        for name in reversed(self.chain()):
            if is_ours(sys.modules.get(name), self.id):
                del sys.modules[name]
                removed = True
        return withdraw(owner, self.target, self.id) or removed


class RemovedServingError(NotImplementedError):
    """Raised when vllm-omni builds a serving object whose vLLM original is gone and that vllm_compat bridges for
    the import only: the server module imports (so a pure-diffusion server starts), the path that needs the old
    object fails at once, naming the drift."""


def raising_class(qualname: str, module: str, message: str):
    """A class named ``qualname`` (in ``module``) whose construction raises ``RemovedServingError(message)``; it
    can still be imported, annotated with and subclassed."""

    def __init__(self, *args, **kwargs):
        raise RemovedServingError(message)

    return type(qualname, (), {"__init__": __init__, "__module__": module, "__doc__": message})
