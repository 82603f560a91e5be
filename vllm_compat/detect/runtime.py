"""Runtime detection helpers: what drift points use to ask the imported modules the same questions their static
detection asks the files (``detect.static``).

Importing vLLM costs seconds, so drift points call these only inside a post-import hook (where the target is
already loaded), in ``apply()`` and in ``vllm-compat doctor --runtime``.
"""

from __future__ import annotations

import importlib
import inspect

from .model import Param, ParamKind


def import_optional(name: str):
    """Import ``name``; None when the module (or a package above it) does not exist. Any other error while
    importing propagates: a broken install must not read as "not installed"."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            return None
        raise


_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: ParamKind.POSITIONAL,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: ParamKind.POSITIONAL,
    inspect.Parameter.VAR_POSITIONAL: ParamKind.VAR_POSITIONAL,
    inspect.Parameter.KEYWORD_ONLY: ParamKind.KEYWORD_ONLY,
    inspect.Parameter.VAR_KEYWORD: ParamKind.VAR_KEYWORD,
}


def live_params(func) -> tuple[Param, ...]:
    """``func``'s parameters as static detection reports them; a callable without a signature (some builtins)
    counts as ``(*args, **kwargs)``."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return (Param("args", ParamKind.VAR_POSITIONAL), Param("kwargs", ParamKind.VAR_KEYWORD))
    return tuple(Param(p.name, _KINDS[p.kind], p.default is not p.empty) for p in signature.parameters.values())
