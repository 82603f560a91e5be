"""vllm_compat: keeps vLLM plugins (vllm-omni first) working while vLLM moves under them.

Importing this package registers a post-import hook for vllm-omni's diffusion loader and nothing else: it
imports no torch, vllm, vllm_omni, wrapt or logging. Everything that touches vLLM runs when the hook fires, or
in ``apply()``, ``revert()`` and ``report()``.

The startup hook (``vllm_compat_startup.pth``, see ``_startup``) imports this package in every interpreter, before
pytest loads our pytest11 plugin; PYTEST_DONT_REWRITE tells pytest not to warn that it cannot rewrite it.
"""

# No `from __future__ import annotations`: it imports __future__, which a bare interpreter has not loaded and
# `import vllm_compat` (the startup hook: every interpreter) must not add; these annotations are valid as they are.

from .activate import apply, current_decisions, install_import_hook, revert

__all__ = ["apply", "revert", "report", "current_decisions", "__version__"]

__version__ = "0.1.0"


def report(runtime: bool = False):
    """A ``Report`` of versions, capabilities, loader shape and decisions; ``.to_dict()`` is JSON-ready.

    Static detection by default (reads files, imports no vLLM). With ``runtime=True`` it imports vLLM and
    vllm-omni's loader, applies the shim and reports the live result next to the static one.
    """
    from .reporting import build_report

    return build_report(runtime=runtime)


install_import_hook()
