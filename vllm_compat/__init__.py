"""vllm_compat: keeps vLLM plugins (vllm-omni first) working while vLLM moves under them.

Importing this package loads two modules (this one and ``hooks``) and arranges for the post-import hooks of every
catalogue entry to be registered before the first module of vLLM or vllm-omni is looked up: the catalogue and
activation load then, in the processes that import vLLM, not in every interpreter the startup hook runs in. It
imports no torch, vllm, vllm_omni, wrapt or logging. Everything that touches vLLM runs when a hook fires, or in
``apply()``, ``revert()`` and ``report()``.

The startup hook (``vllm_compat_startup.pth``, see ``_startup``) imports this package in every interpreter, before
pytest loads our pytest11 plugin; PYTEST_DONT_REWRITE tells pytest not to warn that it cannot rewrite it.
"""

# No `from __future__ import annotations`: it imports __future__, which a bare interpreter has not loaded and
# `import vllm_compat` (the startup hook: every interpreter) must not add; these annotations are valid as they are.

from .hooks import register_first_import_hook

__all__ = ["apply", "revert", "report", "current_decisions", "__version__"]

__version__ = "0.1.0"

# The top-level packages every catalogue entry's target module lives in (tests/patches/test_catalogue.py holds
# the catalogue to it): the first import of either registers the catalogue's hooks.
SERVED_PACKAGES = ("vllm", "vllm_omni")

_FROM_ACTIVATE = ("apply", "revert", "current_decisions", "install_import_hook")


def report(runtime: bool = False):
    """A ``Report`` of versions, capabilities, loader shape and decisions; ``.to_dict()`` is JSON-ready.

    Static detection by default (reads files, imports no vLLM). With ``runtime=True`` it imports vLLM and
    vllm-omni's loader, applies the shim and reports the live result next to the static one.
    """
    from .reporting import build_report

    return build_report(runtime=runtime)


def __getattr__(name):
    # apply(), revert() and the rest load activation (and the catalogue) on first use, not at import.
    if name in _FROM_ACTIVATE:
        from . import activate

        return getattr(activate, name)
    raise AttributeError(f"module 'vllm_compat' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_FROM_ACTIVATE])


def _register_catalogue_hooks(package: str) -> None:
    try:
        from .activate import install_import_hook

        install_import_hook()
    except Exception:  # noqa: BLE001 - never let the shim kill the import it runs before
        import logging

        logging.getLogger("vllm_compat").exception(
            "vllm_compat: could not register its hooks before importing %s; nothing is patched "
            "(`vllm-compat doctor` says what is wrong)", package)


for _package in SERVED_PACKAGES:
    register_first_import_hook(_package, _register_catalogue_hooks)
del _package
