"""Drift points that change vllm-omni's own code: a method replaced on one of its classes.

Each is one module (or one package, for the loader) deriving ``vllm_compat.drift.DriftPoint`` through
``_method.MethodPatch`` and exporting ``DRIFT_POINT``, with one row in ``vllm_compat.catalogue``. Drift-point
modules import neither torch nor vLLM at module level: the static doctor imports them.
"""
