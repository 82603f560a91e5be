"""Drift points that change vllm-omni's own code: a method replaced on one of its classes.

Each is one module (or one package, for the loader) deriving ``vllm_compat.drift.DriftPoint`` through
``_method.MethodPatch`` and exporting ``DRIFT_POINT``, with one row in ``vllm_compat.catalogue``. Drift-point
modules import neither torch nor vLLM at module level: the static doctor imports them.

The names below are the catalogue's and ``decide``'s, kept importable from here for code written before the
catalogue moved to the top of the package (issue 23); new code imports them from their homes.
"""

# No `from __future__ import annotations`: see vllm_compat/__init__.py.

_MOVED = {"CATALOGUE": "catalogue", "PatchEntry": "catalogue", "Entry": "catalogue", "entry": "catalogue",
          "drift_point": "catalogue", "decide_entry": "decide", "disabled_decision": "decide", "plan": "decide"}


def __getattr__(name):
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"vllm_compat.{home}"), name)
