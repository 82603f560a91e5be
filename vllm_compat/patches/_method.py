"""Replacing a method on a class, the way every method patch in the catalogue does it.

The replacement is a plain function made with ``functools.wraps``, so it binds as the original does, and
``__wrapped__``, ``__name__``, the docstring and ``inspect.signature`` stay the original's; two attributes of its
own mark it as ours and name the variant. ``uninstall`` puts back the exact original object.

Why not ``wrapt.FunctionWrapper`` (the first design): importing wrapt cost a worker 23-50 ms the moment a patch
was installed (after vllm-omni's loader, vLLM 0.30; nothing of vLLM or vllm-omni imports it), and its bound call
put ~20 us on a 0.75 ms loader call on the H200 (gpu/results.md, timing), where a plain function costs what one
extra Python call does.
"""

from __future__ import annotations

import functools
from types import MethodType


def method_owner(module, class_name: str, method_name: str):
    """The class that defines ``method_name`` for ``module.class_name``: the class itself, or, where the module's
    class was replaced by a subclass that inherits the method, the base that defines it. None without a class."""
    cls = getattr(module, class_name, None)
    if not isinstance(cls, type):
        return None
    return next((klass for klass in cls.__mro__ if method_name in vars(klass)), cls)


def is_ours(func) -> bool:
    return getattr(func, "_vllm_compat_installed", False)


def unwrap_ours(func):
    """``func`` without our wrappers (never anyone else's)."""
    while is_ours(func):
        func = func.__wrapped__
    return func


def in_place(owner, method_name: str):
    return vars(owner).get(method_name) if owner is not None else None


def installed_variant(owner, method_name: str) -> str | None:
    """The variant we installed on ``owner`` itself (not inherited), or None."""
    current = in_place(owner, method_name)
    return current._vllm_compat_variant if is_ours(current) else None


def install(owner: type, method_name: str, variant: str, call) -> bool:
    """Replace ``owner.method_name`` with a function calling ``call(wrapped, instance, args, kwargs)`` (``wrapped``:
    the original bound to ``instance``), replacing a wrapper of ours with another variant. Returns False when the
    same variant is already installed (a no-op)."""
    current = installed_variant(owner, method_name)
    if current == variant:
        return False
    if current is not None:
        uninstall(owner, method_name)
    original = vars(owner)[method_name]

    @functools.wraps(original)
    def patched(self, *args, **kwargs):
        return call(MethodType(original, self), self, args, kwargs)

    patched._vllm_compat_installed = True
    patched._vllm_compat_variant = variant
    setattr(owner, method_name, patched)
    return True


def uninstall(owner: type, method_name: str) -> bool:
    """Put back the exact original function object; False when nothing of ours was installed."""
    current = in_place(owner, method_name)
    if not is_ours(current):
        return False
    setattr(owner, method_name, current.__wrapped__)
    return True
