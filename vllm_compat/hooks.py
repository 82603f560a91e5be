"""A minimal post-import hook: run callbacks right after a named module finishes executing.

Why not wrapt's ``when_imported``: importing wrapt costs tens of milliseconds, and this hook is registered on
``import vllm_compat`` in every worker. This module imports nothing beyond ``sys`` and ``_thread`` (the
built-in behind ``threading``, which alone would cost a few milliseconds).

A meta-path finder answers only for registered names: it asks the other finders for the real spec and wraps
its loader so that, after ``exec_module``, the real loader is put back on the module and the callbacks run.
``importlib.reload`` goes through the finders again, so a reloaded module is hooked again. A module that is
already imported when a hook is registered gets the callback at once, outside the registry lock.
"""

from __future__ import annotations

import _thread
import sys

_lock = _thread.allocate_lock()
_callbacks: dict[str, list] = {}  # module name -> callables taking the module
_resolving = _thread._local()  # per-thread: names whose spec this finder is resolving now


def _is_initialized(module) -> bool:
    # A module is in sys.modules before its body has run; `_initializing` is set by importlib meanwhile.
    return not getattr(getattr(module, "__spec__", None), "_initializing", False)


class _HookedLoader:
    """Delegates to the real loader; after it has executed the module, runs the callbacks."""

    def __init__(self, loader, fullname: str):
        self._vllm_compat_loader = loader
        self._vllm_compat_fullname = fullname

    def create_module(self, spec):
        return self._vllm_compat_loader.create_module(spec)

    def exec_module(self, module):
        loader = self._vllm_compat_loader
        loader.exec_module(module)
        # Give introspection (inspect.getsource, reload) the real loader back before anyone sees the module.
        module.__loader__ = loader
        if module.__spec__ is not None and module.__spec__.loader is self:
            module.__spec__.loader = loader
        run_callbacks(self._vllm_compat_fullname, module)

    def __getattr__(self, name):
        return getattr(self._vllm_compat_loader, name)


class PostImportFinder:
    _vllm_compat_finder = True

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _callbacks or getattr(_resolving, fullname, False):
            return None
        setattr(_resolving, fullname, True)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            setattr(_resolving, fullname, False)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, fullname)
        return spec


def _ensure_finder() -> None:
    if not any(getattr(f, "_vllm_compat_finder", False) for f in sys.meta_path):
        sys.meta_path.insert(0, PostImportFinder())


def run_callbacks(fullname: str, module) -> None:
    with _lock:
        callbacks = list(_callbacks.get(fullname, ()))
    for callback in callbacks:
        callback(module)


def register_post_import_hook(fullname: str, callback) -> None:
    """Call ``callback(module)`` after ``fullname`` is imported (each time: reloads too), or now if it already
    is. Registering the same callback twice is a no-op."""
    with _lock:
        _ensure_finder()
        callbacks = _callbacks.setdefault(fullname, [])
        if callback in callbacks:
            return
        callbacks.append(callback)
    module = sys.modules.get(fullname)
    if module is not None and _is_initialized(module):
        callback(module)
