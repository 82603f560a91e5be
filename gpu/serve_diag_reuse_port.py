"""DIAGNOSTIC ONLY (gpu/serve_run.sh phase `diag`), not part of vllm_compat: how far `vllm serve --omni` gets on
vLLM 0.25.1 + vllm-omni 0.24.0 with vllm_compat once the next stop is out of the way.

With vllm_compat's serving bridges the chain imports on vLLM 0.25.1, and the server then stops in
vllm_omni.entrypoints.openai.api_server.omni_run_server: `setup_server(args)` -> TypeError: setup_server() missing 1
required keyword-only argument: 'reuse_port' (vLLM 0.25 made it keyword-only and required; 0.24.0's setup_server
always set SO_REUSEPORT on the socket). This module, loaded by a .pth line in the API-server interpreter, wraps vLLM's
setup_server once vllm.entrypoints.openai.api_server is imported so that a call without reuse_port gets
reuse_port=True (0.24.0's behaviour). It stands in for the adapter a bridge would provide, to see what comes after.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys

TARGET = "vllm.entrypoints.openai.api_server"


def _wrap(module) -> None:
    orig = getattr(module, "setup_server", None)
    if orig is None or getattr(orig, "_serve_diag", False):
        return

    @functools.wraps(orig)
    def setup_server(args, **kwargs):
        kwargs.setdefault("reuse_port", True)
        return orig(args, **kwargs)

    setup_server._serve_diag = True
    module.setup_server = setup_server
    print("serve_diag_reuse_port: wrapped", TARGET + ".setup_server", file=sys.stderr, flush=True)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_wrap(module):
            exec_module(module)
            _wrap(module)

        spec.loader.exec_module = exec_and_wrap
        return spec


sys.meta_path.insert(0, _Finder())
