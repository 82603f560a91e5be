"""Replacing a method on a class, the way every method patch in the catalogue does it (``MethodPatch``).

The replacement is a plain function made with ``functools.wraps``, so it binds as the original does, and
``__wrapped__``, ``__name__``, the docstring and ``inspect.signature`` stay the original's; it carries the one
mark of everything vllm_compat installs (``drift.MARK``, the entry id) and the variant (``drift.VARIANT_MARK``).
``uninstall`` puts back the exact original object (``drift.restore``).

Why not ``wrapt.FunctionWrapper`` (the first design): importing wrapt cost a worker 23-50 ms the moment a patch
was installed (after vllm-omni's loader, vLLM 0.30; nothing of vLLM or vllm-omni imports it), and its bound call
put ~20 us on a 0.75 ms loader call on the H200 (gpu/results.md, timing), where a plain function costs what one
extra Python call does.
"""

from __future__ import annotations

import functools
from types import MethodType

from ..drift import DriftPoint, is_ours, replace, restore, unwrap, variant_of


def method_owner(module, class_name: str, method_name: str):
    """The class that defines ``method_name`` for ``module.class_name``: the class itself, or, where the module's
    class was replaced by a subclass that inherits the method, the base that defines it. None without a class."""
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        return None
    return next((klass for klass in cls.__mro__ if method_name in vars(klass)), cls)


def in_place(owner, method_name: str):
    return vars(owner).get(method_name) if owner is not None else None


def installed_variant(owner, method_name: str) -> str | None:
    """The variant we installed on ``owner`` itself (not inherited), or None."""
    return variant_of(in_place(owner, method_name))


def install(owner: type, method_name: str, variant: str, call, entry_id: str) -> bool:
    """Replace ``owner.method_name`` with a function calling ``call(wrapped, instance, args, kwargs)`` (``wrapped``:
    the original bound to ``instance``), replacing a wrapper of ours with another variant. Returns False when the
    same variant is already installed (a no-op)."""

    def make(original):
        @functools.wraps(original)
        def patched(self, *args, **kwargs):
            return call(MethodType(original, self), self, args, kwargs)

        return patched

    return replace(owner, method_name, make, entry_id, variant)


def uninstall(owner: type, method_name: str, entry_id: str) -> bool:
    """Put back the exact original function object; False when nothing of ours was installed."""
    return restore(owner, method_name, entry_id)


def unwrap_ours(func):
    """``func`` without our wrappers (never anyone else's)."""
    return unwrap(func)


class MethodPatch(DriftPoint):
    """A drift point that replaces ``Class.method`` (its catalogue ``target``) in its target module; subclasses
    define the facts, the decision, ``prepare`` and ``call(wrapped, instance, args, kwargs)`` through
    ``install_call``."""

    @property
    def class_name(self) -> str:
        return self.target.split(".")[0]

    @property
    def method_name(self) -> str:
        return self.target.split(".")[1]

    def locate(self, module):
        return method_owner(module, self.class_name, self.method_name)

    def in_place(self, owner):
        return in_place(owner, self.method_name)

    def installed_variant(self, owner) -> str | None:
        return installed_variant(owner, self.method_name)

    def install_call(self, owner, variant: str, call) -> bool:
        return install(owner, self.method_name, variant, call, self.id)

    def uninstall(self, owner) -> bool:
        return uninstall(owner, self.method_name, self.id)

    def original(self, owner):
        """The method as vllm-omni defined it on ``owner`` (our wrapper taken off)."""
        return unwrap(self.in_place(owner))


__all__ = ["MethodPatch", "in_place", "install", "installed_variant", "is_ours", "method_owner", "uninstall",
           "unwrap_ours"]
