"""What the module stand-ins share: the drift point for a vLLM module that is gone while vllm-omni imports it.

``ModuleStandIn`` is the base of a stand-in for a module vLLM removed, ``old_module``: by default the catalogue row's
``target_module.target`` (a submodule, as ``vllm.v1.sample.sampler``); a subclass names a deeper path where vLLM
removed a whole package (``vllm.entrypoints.serve.render.serving`` below the row's ``vllm.entrypoints.serve`` /
``render``). The row's ``target_module`` is the deepest package of that path vLLM still has (its import triggers the
bridge) and ``target`` the first missing component. A subclass names the vllm-omni files that import the old module
(``importers``, read and never imported), the vLLM release that removed it (``removed_in``) and what the module holds,
each the smallest definition its callers in vllm-omni need: ``raises`` ({name: why}: a class that can be imported,
annotated with and subclassed, whose construction raises ``RemovedByVLLMError`` naming the removal, then ``why``) and ``members()`` (our own
objects, and ``Moved(module, name)`` for vLLM's own object that moved elsewhere, imported when first read). Where the
members are built on a vLLM function, ``built_on`` names its file, its name and its parameters, and
``replacement_from_source(read)`` judges them (``(Shape, detail)`` from a reader of vLLM's files: the same function
for the wheel and for the installed package; a subclass may check more of the def).

``install`` registers the module (and the missing packages above it, outermost first) in ``sys.modules`` and on its
parent, each marked with the entry id (``drift.MARK``); one module object per process, so revert and apply put the
same one back. Any other name of the old module raises ``AttributeError`` saying that vLLM removed it and vllm_compat
does not provide it (a stand-in is not a copy of the old file). The rules are the bridges' (``vllm_compat.bridges``):
only where vLLM lacks the module and an installed vllm-omni imports it, never over a module vLLM has (a file of the
installed vLLM, or anything another finder registered: a refusal saying what was found), and ``uninstall`` removes
exactly what was put there.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from ..decide import Action
from ..detect.source_tree import parse_source
from ..drift import is_ours, mark, provide, withdraw
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
from ._name_stand_in import NameStandIn, Shape


class RemovedByVLLMError(VllmCompatError, NotImplementedError):
    """A vllm-omni feature reached an object of a module vLLM removed, which vllm_compat provides for the import
    only: the import works (so the rest of vllm-omni does), the feature fails loudly, naming the module, the vLLM
    release and what to do."""


def removed_class(name: str, module: str, message: str, doc: str | None = None) -> type:
    """A class named ``name`` (in ``module``) that can be imported, used as an annotation or an ``isinstance`` target
    and subclassed, and whose construction raises ``RemovedByVLLMError(message)``; ``doc`` defaults to ``message``."""

    def __init__(self, *args, **kwargs):
        raise RemovedByVLLMError(message)

    return type(name, (), {"__init__": __init__, "__doc__": doc or message, "__module__": module,
                           "__qualname__": name})


class Moved:
    """A member that is vLLM's own object ``module.name``, imported when vllm-omni first reads it (PEP 562) and kept
    on the stand-in from then on: the hook that registers the stand-in runs while vLLM's packages are still importing
    each other, and importing the new module there would enter a cycle (vLLM 0.25: ``openai.engine`` is imported from
    inside ``chat_completion.protocol``, which ``generate.base.serving`` imports)."""

    __slots__ = ("module", "name")

    def __init__(self, module: str, name: str) -> None:
        self.module, self.name = module, name


def lazy_members(module, moved: dict, message: str):
    """A module's ``__getattr__`` (PEP 562) for ``moved`` ({name: ``Moved``}): each vLLM's own object, imported when
    first read and kept on the module; any other name an ``AttributeError`` ending with ``message``."""

    def __getattr__(name: str):
        found = moved.get(name)
        if found is None:
            raise AttributeError(name if name.startswith("__") else
                                 f"module {module.__name__!r} has no attribute {name!r}: {message}")
        import importlib

        value = getattr(importlib.import_module(found.module), found.name)
        setattr(module, name, value)
        return value

    return __getattr__


@dataclass(frozen=True)
class ModuleStandInFacts(StandInFacts):
    """``host`` / ``importers`` as every stand-in's (``StandInFacts``), plus ``replacement``: the shape of the vLLM
    files the module's members are built on (``Shape``; ``absent`` where it needs none, or where vLLM has the module)
    and ``detail``, what was found where that shape is unknown."""

    replacement: str = Shape.ABSENT
    detail: str = ""


def vllm_function(read, relpath: str, name: str, params: str):
    """The module-level ``def name`` in vLLM's file ``relpath`` (``read(relpath)``: its text, or None) where it takes
    exactly ``params`` (the names as a def lists them, defaults left out: ``"a, b, *, c"``), as ``(node, "")``;
    ``(None, what was found)`` where the file, the def or those parameters are not there."""
    import ast

    module = relpath[:-3].replace("/", ".")
    source = read(relpath)
    if source is None:
        return None, f"{relpath} is missing or unreadable"
    func = next((n for n in parse_source(source).body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if func is None:
        return None, f"{module} has no {name}"
    args = func.args
    found = [a.arg for a in args.posonlyargs + args.args]
    if args.vararg or args.kwonlyargs:
        found.append(f"*{args.vararg.arg}" if args.vararg else "*")
    found += [a.arg for a in args.kwonlyargs] + ([f"**{args.kwarg.arg}"] if args.kwarg else [])
    if ", ".join(found) != params:
        return None, f"{module}.{name} takes ({', '.join(found)}), not ({params})"
    return func, ""


def init_shape(source: str | None, relpath: str, cls_name: str, positional: tuple[str, ...],
               keywords: tuple[str, ...], built: tuple[str, ...] = ()) -> tuple[str, str]:
    """(``Shape``, detail) of ``cls_name.__init__`` in vLLM's file ``relpath`` (``source``, or None where it is
    missing) for an adapter that makes the old call on it: known where it takes exactly ``positional`` first, no
    ``*args`` / ``**kwargs``, every name of ``keywords`` (the old call's), and requires no other keyword than those
    and ``built`` (the ones the adapter builds)."""
    module = relpath[:-3].replace("/", ".")
    if source is None:
        return Shape.UNKNOWN, f"{relpath} is missing or unreadable"
    import ast

    cls = next((n for n in parse_source(source).body if isinstance(n, ast.ClassDef) and n.name == cls_name), None)
    init = cls and next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is None:
        return Shape.UNKNOWN, f"{module} has no {cls_name}.__init__"
    args = init.args
    found = tuple(a.arg for a in args.posonlyargs + args.args)
    if found != positional or args.vararg or args.kwarg:
        return Shape.UNKNOWN, f"{module}.{cls_name}.__init__ takes ({', '.join(found)}, ...), not " \
                              f"({', '.join(positional)}, *, ...)"
    names = [a.arg for a in args.kwonlyargs]
    required = [a.arg for a, default in zip(args.kwonlyargs, args.kw_defaults, strict=True) if default is None]
    missing = [k for k in keywords if k not in names]
    unknown = [k for k in required if k not in keywords + built]
    if missing or unknown:
        return Shape.UNKNOWN, f"{module}.{cls_name}.__init__ lacks {missing} / requires {unknown}"
    return Shape.KNOWN, ""


def init_fits(cls: type, positional: tuple[str, ...], keywords: tuple[str, ...], built: tuple[str, ...] = ()) -> bool:
    """``init_shape`` of the imported class ``cls`` (its live signature)."""
    import inspect

    params = inspect.signature(cls.__init__).parameters
    return tuple(params)[:len(positional)] == positional and all(k in params for k in keywords) and all(
        p.default is not p.empty or name in keywords + built
        for name, p in params.items() if p.kind == p.KEYWORD_ONLY)


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


class ModuleStandIn(NameStandIn):
    """A stand-in module for ``old_module``, put on the catalogue row's ``target_module`` as ``target`` (a
    ``NameStandIn`` whose name is a submodule, also registered in ``sys.modules``)."""

    raises: dict[str, str] = {}  # name -> why vllm-omni cannot use it here, and what to do (RemovedByVLLMError's end)
    leaves_out: str = ""  # the feature those ``raises`` classes stop, for the report (``Decision.leaves_out``)
    built_on: tuple[str, str, str] = ()  # (vLLM file, def, its parameters): what the members call (vllm_function)

    def __init__(self) -> None:
        super().__init__()
        self._module = None  # the outermost module object of the chain, made on first use

    @property
    def old_module(self) -> str:
        """The removed module's path (a subclass names a deeper one as a class attribute)."""
        return self.target_path

    @property
    def first_missing(self) -> str:
        """The first module of ``old_module`` that vLLM lacks: ``target_module.target``."""
        return self.target_path

    def chain(self) -> list[str]:
        """The modules registered, outermost first: ``first_missing`` down to ``old_module``."""
        names = [self.first_missing]
        for part in self.old_module[len(self.first_missing):].split(".")[1:]:
            names.append(f"{names[-1]}.{part}")
        return names

    def members(self) -> dict:
        """The module's own definitions beside ``raises`` (``Moved`` for vLLM's own objects); called where the hook
        runs, so it may not import vLLM modules that are still loading."""
        return {}

    @property
    def needs_replacement(self) -> bool:
        """Whether the members are built on vLLM files that ``replacement_from_source`` judges."""
        return bool(self.built_on)

    def replacement_from_source(self, read) -> tuple[str, str]:
        """``(Shape, detail)`` of what the members are built on, from ``read(relpath)`` (source text or None):
        known where ``built_on``'s def has its parameters."""
        func, detail = vllm_function(read, *self.built_on)
        return (Shape.KNOWN, "") if func is not None else (Shape.UNKNOWN, detail)

    # ---- the module objects ----

    def build(self, owner=None):
        """The outermost module object of the chain, every inner one set on its parent, all marked as ours (made on
        first use; the same object afterwards)."""
        if self._module is not None:
            return self._module
        import importlib.machinery
        import types

        members = {name: removed_class(name, self.old_module, self.removed_message(name, why), f"vllm_compat's stand-in"
                                       f" for {self.old_module}.{name} (removed in vLLM {self.removed_in}), for "
                                       "vllm-omni's imports only: constructing it raises RemovedByVLLMError.")
                   for name, why in self.raises.items()} | self.members()
        modules = []
        for name in self.chain():
            module = types.ModuleType(name, f"vllm_compat's stand-in for {name} (removed in vLLM {self.removed_in}); "
                                            f"see {type(self).__module__}.")
            is_package = name != self.old_module
            module.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=type(self).__module__,
                                                             is_package=is_package)
            if is_package:
                module.__path__ = []
            if modules:
                setattr(modules[-1], name.rpartition(".")[2], module)
            modules.append(mark(module, self.id))
        leaf = modules[-1]
        vars(leaf).update({key: value for key, value in members.items() if not isinstance(value, Moved)})
        leaf.__getattr__ = self._lazy_getattr(leaf, members)
        self._module = modules[0]
        return self._module

    def removed_message(self, name: str, why: str) -> str:
        """What constructing the ``raises`` class ``name`` says: the removal, that the name is there for the import
        only, and ``why`` (the bridge's reason and remedy)."""
        return (f"vLLM {self.removed_in} removed {self.old_module}, and vllm_compat provides {name} only so that "
                f"vllm-omni imports: {why}")

    def _lazy_getattr(self, module, members: dict):
        """The old module's ``__getattr__`` (``lazy_members``), its error naming the removal and what it holds."""
        return lazy_members(module, {key: value for key, value in members.items() if isinstance(value, Moved)},
                            f"vLLM {self.removed_in} removed {self.old_module}, and vllm_compat's stand-in provides "
                            f"only what vllm-omni imports from it ({', '.join(sorted(members))}).")

    def _inner(self, top, name: str):
        module = top
        for part in name[len(top.__name__):].split(".")[1:]:
            module = getattr(module, part)
        return module

    # ---- facts ----

    def importers_in(self, tree) -> tuple[str, ...]:
        """The running imports of the old module in the vllm-omni ``importers`` files of ``tree``: ``import a.b.c``
        / ``from a.b.c import x``, and ``from a.b import c``."""
        parent, _, leaf = self.old_module.rpartition(".")
        return (*omni_importers(tree, self.importers, self.old_module, None),
                *omni_importers(tree, self.importers, parent, leaf))

    def facts(self, host: str, omni_tree, read) -> ModuleStandInFacts:
        if self.needs_replacement and host in (HostKind.LACKS, HostKind.UNKNOWN):
            shape, detail = self.replacement_from_source(read)
        else:
            shape, detail = Shape.ABSENT, ""
        return ModuleStandInFacts(host, self.importers_in(omni_tree), shape, detail)

    def facts_from_files(self, site) -> ModuleStandInFacts:
        return self.facts(host_lookup(site.vllm_tree, self.target_module, self.target), site.omni_tree,
                          site.vllm_tree.read)

    def host_in_module(self, module) -> str:
        """The imported parent's answer: vLLM lacks the module where neither ``sys.modules``, the parent nor a file
        of the parent package has it (ours does not count)."""
        found = [m for m in (sys.modules.get(self.first_missing), vars(module).get(self.target)) if m is not None]
        if found:  # either one that is not ours is vLLM's
            return HostKind.LACKS if all(is_ours(m, self.id) for m in found) else HostKind.DEFINES
        path = getattr(module, "__path__", None)
        if path is None:  # not a package: it cannot have the submodule
            return HostKind.LACKS
        from importlib.machinery import PathFinder  # finds the file without importing it

        return HostKind.DEFINES if PathFinder.find_spec(self.first_missing, path) is not None else HostKind.LACKS

    def facts_from_module(self, module) -> ModuleStandInFacts:
        return self.facts(self.host_in_module(module), installed_omni_tree(), files_of_installed_vllm)

    def decide(self, facts: StandInFacts, controls=None):
        """Every stand-in's decision table (``bridges.decide_stand_in``), refused where what the members are built
        on is not the measured shape; a patched decision ``provides`` the old module's path (the import-drift
        report's unresolved target), not only the row's first missing package."""
        decision = decide_stand_in(self.entry, facts.stand_in, self.old_module, removed_in=self.removed_in)
        if decision.action != Action.PATCHED:
            return decision
        if self.needs_replacement and facts.replacement == Shape.UNKNOWN:
            return self.refused(f"vLLM lacks {self.old_module} and vllm-omni imports it, but what the stand-in is "
                                f"built on is not the measured shape ({facts.detail})")
        return dataclasses.replace(decision, provides=(self.old_module,), leaves_out=self.leaves_out)

    def compare(self, static: StandInFacts, runtime: StandInFacts) -> list[str]:
        differences = compare_stand_in(static.stand_in, runtime.stand_in, self.old_module)
        if self.needs_replacement and HostKind.ABSENT not in (static.host, runtime.host) and \
                static.replacement != runtime.replacement:
            differences.append(f"what {self.old_module} is built on: {static.replacement} (files) != "
                               f"{runtime.replacement} (imported); {static.detail or runtime.detail}")
        return differences

    # ---- install ----

    def prepare(self, owner, facts):
        """The contract: vLLM has no ``first_missing`` (ours may be there already), and what the members are built
        on has the measured shape; returns the module chain."""
        if self.host_in_module(owner) != HostKind.LACKS:
            current = sys.modules.get(self.first_missing) or vars(owner).get(self.target)
            found = repr(current) if current is not None else "a module file in the installed vLLM"
            raise PatchRefusedError(f"{self.first_missing} exists ({found}); vllm_compat never replaces a module "
                                    "vLLM defines. Left as it is.")
        if self.needs_replacement:
            shape, detail = self.replacement_from_source(files_of_installed_vllm)
            if shape != Shape.KNOWN:
                raise PatchRefusedError(f"{self.old_module} cannot be provided: {detail or shape}. Left out; set "
                                        f"VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, or upgrade "
                                        "vllm_compat.")
        return self.build(owner)

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
        """Remove the parent attribute and the ``sys.modules`` entries where they are ours; False when none was."""
        removed = False
        for name in reversed(self.chain()):
            if is_ours(sys.modules.get(name), self.id):
                del sys.modules[name]
                removed = True
        return withdraw(owner, self.target, self.id) or removed


class ModuleAdapter(ModuleStandIn):
    """A module stand-in whose one member ``adapted`` is an adapter class: vLLM's class of ``new_file`` taking the old
    call, made by the drift-point module's PEP 562 ``__getattr__`` (``Moved``). Where that class is not the measured
    shape (``shape``, read from its file), the member is a class whose construction raises ``message``: never a
    refusal, as the import it serves is one every server depends on; the verdict names ``leaves_out_unknown``."""

    adapted: str  # the old class name the module provides
    new_module: str  # vLLM's module of the class it adapts
    new_file: str
    message: str  # why the raising class cannot serve, and what to do
    leaves_out_unknown: str = ""  # what the raising class stops, for the report

    def shape(self, source: str | None) -> tuple[str, str]:
        """``(Shape, detail)`` of vLLM's class in its file (``source``, or None where it is missing)."""
        raise NotImplementedError

    def facts(self, host: str, omni_tree, read) -> ModuleStandInFacts:
        facts = super().facts(host, omni_tree, read)
        if facts.host not in (HostKind.LACKS, HostKind.UNKNOWN):
            return facts
        return ModuleStandInFacts(facts.host, facts.importers, *self.shape(read(self.new_file)))

    def decide(self, facts, controls=None):
        decision = super().decide(facts, controls)
        if decision.action != Action.PATCHED:
            return decision
        if facts.replacement == Shape.KNOWN:
            return dataclasses.replace(decision, reason=f"{decision.reason}; {self.adapted} adapted to vLLM's "
                                                        f"{self.new_module}")
        return dataclasses.replace(decision, leaves_out=self.leaves_out_unknown, reason=(
            f"{decision.reason}; {self.adapted} raises: vLLM's {self.new_module} is not the measured shape "
            f"({facts.detail})"))

    def compare(self, static, runtime) -> list[str]:
        differences = super().compare(static, runtime)
        if HostKind.ABSENT not in (static.host, runtime.host) and static.replacement != runtime.replacement:
            differences.append(f"vLLM's {self.new_module}: {static.replacement} (files) != {runtime.replacement} "
                               f"(imported); {static.detail or runtime.detail}")
        return differences

    def members(self) -> dict:
        shape, detail = self.shape(files_of_installed_vllm(self.new_file))
        if shape == Shape.KNOWN:
            return {self.adapted: Moved(type(self).__module__, self.adapted)}
        return {self.adapted: removed_class(self.adapted, self.old_module, self.removed_message(
            self.adapted, f"{self.message} ({detail})"))}


def adapter_facts(host: str, importers: tuple[str, ...], known: bool = True) -> ModuleStandInFacts:
    """Facts for a ``ModuleAdapter``'s decision table: ``host`` / ``importers``, vLLM's class the measured shape or
    not."""
    return ModuleStandInFacts(host, importers, Shape.KNOWN if known else Shape.UNKNOWN, "" if known else "(a test)")
