"""A minimal post-import hook: run callbacks right after a named module finishes executing.

Why not wrapt's ``when_imported``: importing wrapt costs tens of milliseconds, and this hook is registered on
``import vllm_compat`` in every worker. This module imports nothing beyond ``sys`` and ``_thread`` (the
built-in behind ``threading``, which alone would cost a few milliseconds).

A meta-path finder answers only for registered names: it asks the other finders for the real spec and wraps
its loader so that, after ``exec_module``, the real loader is put back on the module and the callbacks run.
``importlib.reload`` goes through the finders again, so a reloaded module is hooked again. A module that is
already imported when a hook is registered gets the callback at once, outside the registry lock.

While any hooked module is executing (its body and its callbacks, in any thread), a hooked import is in
progress; when the last one ends, the imports-settled hooks run: ``vllm_compat`` logs its one summary line
there, so that the line names everything one import installed, however deep the targets were.

A first-import hook runs before anything of a package is looked up (the package or any submodule), once per
process: ``vllm_compat`` registers its post-import hooks from there, so that an interpreter that never imports
vLLM does not pay for loading the catalogue. Every module costs a new interpreter about 0.4 ms, whatever it holds
(bench/results.md, section 1).
"""

# No `from __future__ import annotations`: see vllm_compat/__init__.py.

import _thread
import sys

_finder_lock = _thread.allocate_lock()


def _is_initialized(module) -> bool:
    # A module is in sys.modules before its body has run; `_initializing` is set by importlib meanwhile.
    return not getattr(getattr(module, "__spec__", None), "_initializing", False)


class _HookedLoader:
    """Delegates to the real loader; after it has executed the module, runs the callbacks."""

    def __init__(self, loader, fullname: str, finder):
        self._vllm_compat_loader = loader
        self._vllm_compat_fullname = fullname
        self._vllm_compat_finder = finder

    def create_module(self, spec):
        return self._vllm_compat_loader.create_module(spec)

    def exec_module(self, module):
        loader = self._vllm_compat_loader
        finder = self._vllm_compat_finder
        finder.enter_import()
        try:
            loader.exec_module(module)
            # Give introspection (inspect.getsource, reload) the real loader back before anyone sees the module.
            module.__loader__ = loader
            if module.__spec__ is not None and module.__spec__.loader is self:
                module.__spec__.loader = loader
            finder.run_callbacks(self._vllm_compat_fullname, module)
        finally:
            finder.leave_import()

    def __getattr__(self, name):
        return getattr(self._vllm_compat_loader, name)


class PostImportFinder:
    """The one finder per process. Its registry lives on the instance, so a second copy of vllm_compat (after
    ``sys.modules`` was purged) finds and shares it instead of installing a finder the first copy never sees."""

    _vllm_compat_finder = True

    def __init__(self):
        self._vllm_compat_lock = _thread.allocate_lock()
        self._vllm_compat_callbacks: dict[str, list] = {}  # module name -> callables taking the module
        self._vllm_compat_resolving = _thread._local()  # per thread: names whose spec is being resolved
        self._vllm_compat_shared: dict = {}  # process-wide state of vllm_compat, see shared_state()
        self._vllm_compat_first_import: dict[str, list] = {}  # top-level package -> callables taking its name
        self._vllm_compat_watched: set = set()  # modules hooked for the import count alone, without callbacks
        self._vllm_compat_importing = 0  # hooked modules executing now, all threads together
        self._vllm_compat_settled: list = []  # callables run when that count falls back to zero

    def find_spec(self, fullname, path=None, target=None):
        resolving = self._vllm_compat_resolving
        if self._vllm_compat_first_import:
            package = fullname.partition(".")[0]
            if package in self._vllm_compat_first_import:
                self._run_first_import_callbacks(package)
        hooked = fullname in self._vllm_compat_callbacks or fullname in self._vllm_compat_watched
        if not hooked or getattr(resolving, fullname, False):
            return None
        setattr(resolving, fullname, True)
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
            setattr(resolving, fullname, False)
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _HookedLoader(spec.loader, fullname, self)
        return spec

    def _run_first_import_callbacks(self, package: str) -> None:
        # importlib calls finders under the interpreter's import lock: a lookup in another thread waits until
        # these callbacks have run. A callback that imports the package itself comes back here: the flag stops it.
        running = self._vllm_compat_resolving
        flag = f"first import of {package}"
        callbacks = self._vllm_compat_first_import.get(package)
        if not callbacks or getattr(running, flag, False):
            return
        setattr(running, flag, True)
        try:
            for callback in list(callbacks):
                callback(package)
        finally:
            setattr(running, flag, False)
            self._vllm_compat_first_import.pop(package, None)

    def run_callbacks(self, fullname: str, module) -> None:
        with self._vllm_compat_lock:
            callbacks = list(self._vllm_compat_callbacks.get(fullname, ()))
        for callback in callbacks:
            callback(module)

    def enter_import(self) -> None:
        with self._vllm_compat_lock:
            self._vllm_compat_importing += 1

    def leave_import(self) -> None:
        with self._vllm_compat_lock:
            self._vllm_compat_importing -= 1
            settled = list(self._vllm_compat_settled) if self._vllm_compat_importing == 0 else []
        for callback in settled:  # outside the lock, as every callback here
            callback()


def _finder():
    with _finder_lock:
        for finder in sys.meta_path:
            if getattr(finder, "_vllm_compat_finder", False):
                return finder
        finder = PostImportFinder()
        sys.meta_path.insert(0, finder)
        return finder


def register_post_import_hook(fullname: str, callback) -> None:
    """Call ``callback(module)`` after ``fullname`` is imported (each time: reloads too), or now if it already
    is. Registering the same callback twice is a no-op."""
    finder = _finder()
    with finder._vllm_compat_lock:
        callbacks = finder._vllm_compat_callbacks.setdefault(fullname, [])
        if callback in callbacks:
            return
        callbacks.append(callback)
    module = sys.modules.get(fullname)
    if module is not None and _is_initialized(module):
        callback(module)


def register_first_import_hook(package: str, callback) -> None:
    """Call ``callback(package)`` once, before the first module of top-level ``package`` (itself or any
    submodule) is looked up, or now if it is already imported. Registering the same callback twice is a no-op;
    an exception from the callback propagates to that import, as from any finder."""
    finder = _finder()
    with finder._vllm_compat_lock:
        if package not in sys.modules:
            callbacks = finder._vllm_compat_first_import.setdefault(package, [])
            if callback not in callbacks:
                callbacks.append(callback)
            return
    callback(package)


def shared_state(name: str, factory):
    """Process-wide state that every copy of vllm_compat in this process shares (kept on the one finder), e.g.
    the set of decisions already logged, so a re-imported copy does not log them again."""
    finder = _finder()
    with finder._vllm_compat_lock:
        return finder._vllm_compat_shared.setdefault(name, factory())


def register_imports_settled_hook(callback, watched: tuple = ()) -> None:
    """Call ``callback()`` each time the last hooked import in progress ends (see the module docstring); the
    modules in ``watched`` count as hooked imports too. Registering the same callback twice is a no-op."""
    finder = _finder()
    with finder._vllm_compat_lock:
        finder._vllm_compat_watched.update(watched)
        if callback not in finder._vllm_compat_settled:
            finder._vllm_compat_settled.append(callback)


def hooked_import_in_progress() -> bool:
    """Whether a hooked module is executing now, in any thread."""
    return _finder()._vllm_compat_importing > 0
