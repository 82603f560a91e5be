"""Adapter for ``vllm_omni.entrypoints.async_omni.AsyncOmni``: the abstract methods vLLM's ``EngineClient`` gained.

Why: vllm-omni's ``AsyncOmni`` (the offline async API, and the engine client of ``vllm serve --omni``) derives from
vLLM's abstract ``EngineClient``. vLLM 0.31 declared ``release_kv_cache_memory`` abstract there, and vLLM 0.34
``checkpoint_prepare`` / ``checkpoint_restore`` / ``checkpoint_state``; no vllm-omni release from 0.24.0 to 0.30.0
defines them, so ``AsyncOmni(...)`` raises ``TypeError: Can't instantiate abstract class AsyncOmni with abstract
methods ...``: every module imports, and the server dies when it builds its engine client (measured: vLLM 0.34 +
vllm-omni 0.30.0, ``vllm serve --omni``, after the startup milestones).
When: vLLM's ``EngineClient`` (``vllm/engine/protocol.py``) declares abstract methods that the installed vllm-omni's
``AsyncOmni`` and its vllm-omni base classes do not define (read from both packages' files; at run time, the class's
``__abstractmethods__``): each gets a method that raises ``EngineClientMethodError`` naming the method and the
drift when called, and the class's abstract set is computed again. Nothing vLLM or vllm-omni defines is replaced.
Serves: vllm-omni 0.24.0-0.30.0 on vLLM 0.31-0.34 (release_kv_cache_memory; the checkpoint methods on 0.34).
Retire when: the oldest supported vllm-omni's ``AsyncOmni`` implements every abstract method of the newest
``EngineClient``.

What it leaves out: the features behind those methods (vLLM's KV-cache memory release for RL weight syncing, and
engine checkpoints for fault tolerance) are not available through vllm-omni's ``AsyncOmni``; calling one says so.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, is_ours, provide, withdraw
from ..errors import VllmCompatError

PROTOCOL_FILE = "vllm/engine/protocol.py"
CLIENT_FILE = "vllm_omni/entrypoints/async_omni.py"
ABSENT = "absent"  # a package (or the class) is not there: nothing to judge


class EngineClientMethodError(VllmCompatError, NotImplementedError):
    """Raised by a method vllm_compat put on ``AsyncOmni`` for an abstract method of vLLM's ``EngineClient`` that
    the installed vllm-omni does not implement."""


@dataclass(frozen=True)
class EngineClientFacts:
    """``missing``: the abstract methods of vLLM's ``EngineClient`` that ``AsyncOmni`` does not define, sorted
    (``("absent",)`` where either package or class is not there)."""

    missing: tuple[str, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def abstract_methods(source: str | None, class_name: str = "EngineClient") -> set[str] | None:
    """The methods ``class_name`` declares with ``@abstractmethod`` in ``source``; None when it is not there."""
    if source is None:
        return None
    for node in parse_source(source).body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return {f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                    and any(getattr(d, "id", getattr(d, "attr", None)) == "abstractmethod" for d in f.decorator_list)}
    return None


def defined_methods(tree, relpath: str, class_name: str, seen: set | None = None) -> set[str] | None:
    """The names ``class_name`` in ``relpath`` and its bases defined in the same package bind (methods and
    assignments), following ``from vllm_omni... import Base``; None when the class is not there."""
    seen = set() if seen is None else seen
    source = tree.read(relpath)
    if source is None or (relpath, class_name) in seen:
        return None
    seen.add((relpath, class_name))
    module = parse_source(source)
    imported = {alias.asname or alias.name: (node.module, alias.name) for node in module.body
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm_omni")
                for alias in node.names}
    for node in module.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            names = {s.name for s in node.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))}
            names |= {t.id for s in node.body if isinstance(s, (ast.Assign, ast.AnnAssign))
                      for t in (s.targets if isinstance(s, ast.Assign) else [s.target]) if isinstance(t, ast.Name)}
            for base in node.bases:
                base_name = getattr(base, "id", None)
                if base_name in imported:
                    module_name, original = imported[base_name]
                    path = module_name.replace(".", "/")
                    found = defined_methods(tree, f"{path}.py", original, seen)
                    if found is None:
                        found = defined_methods(tree, f"{path}/__init__.py", original, seen)
                    names |= found or set()
                elif base_name is not None:
                    names |= defined_methods(tree, relpath, base_name, seen) or set()
            return names
    return None


@functools.cache  # one object per method: apply() after revert() puts the same one back
def _raising(name: str, is_async: bool):
    message = (f"vllm-omni's AsyncOmni does not implement EngineClient.{name}, which the installed vLLM declares "
               "abstract (added after this vllm-omni release); vllm_compat defines it only so that AsyncOmni can be "
               f"built. {name} is not available with this vllm-omni: use a vllm-omni release that implements it.")

    if is_async:
        async def method(self, *args, **kwargs):
            raise EngineClientMethodError(message)
    else:
        def method(self, *args, **kwargs):
            raise EngineClientMethodError(message)
    method.__name__ = method.__qualname__ = name
    method.__doc__ = message
    return method


class EngineClientMethods(DriftPoint):
    handles_drift = (("abstract", "*.EngineClient.*", "*.AsyncOmni", "*"),)
    def detect_static(self, site) -> EngineClientFacts:
        declared = abstract_methods(site.vllm_tree.read(PROTOCOL_FILE)) if site.vllm_tree.has_package("vllm") else None
        defined = defined_methods(site.omni_tree, CLIENT_FILE, self.target)
        if declared is None or defined is None:
            return EngineClientFacts((ABSENT,))
        return EngineClientFacts(tuple(sorted(declared - defined)))

    def detect_runtime(self, module) -> EngineClientFacts:
        cls = vars(module).get(self.target)
        if not isinstance(cls, type):
            return EngineClientFacts((ABSENT,))
        ours = {name for name, value in vars(cls).items() if is_ours(value, self.id)}
        return EngineClientFacts(tuple(sorted(set(getattr(cls, "__abstractmethods__", ())) | ours)))

    def decide(self, facts: EngineClientFacts, controls=None):
        if facts.missing == (ABSENT,):
            return self.decision(Action.PENDING, "vLLM or vllm-omni's AsyncOmni is not installed; decided when "
                                 f"{self.target_module} is imported")
        if not facts.missing:
            return self.decision(Action.SKIPPED, "vllm-omni's AsyncOmni implements every abstract method of vLLM's "
                                 "EngineClient")
        return self.decision(Action.PATCHED, f"vLLM's EngineClient declares {', '.join(facts.missing)} abstract and "
                             "vllm-omni's AsyncOmni does not define them (it could not be built); each raises "
                             "EngineClientMethodError naming the method when called")

    def locate(self, module):
        return vars(module).get(self.target)

    def install(self, owner, decision, state) -> bool:
        import abc
        import inspect

        missing = sorted(getattr(owner, "__abstractmethods__", ()))
        changed = False
        for name in missing:
            declared = next((vars(base)[name] for base in owner.__mro__ if name in vars(base)), None)
            changed |= provide(owner, name, _raising(name, inspect.iscoroutinefunction(declared)), self.id)
        abc.update_abstractmethods(owner)
        return changed

    def uninstall(self, owner) -> bool:
        import abc

        if owner is None:
            return False
        removed = [withdraw(owner, name, self.id) for name in list(vars(owner))]
        abc.update_abstractmethods(owner)
        return any(removed)

    def is_installed(self, owner) -> bool:
        return owner is not None and any(is_ours(value, self.id) for value in vars(owner).values())


DRIFT_POINT = EngineClientMethods()
