"""The ``setup_server_call`` adapter on the real wheels: the shapes read from the installed files (vLLM 0.25+'s
``setup_server(args, *, reuse_port)``, vllm-omni 0.24.0's ``setup_openai_server(args)``), the decision table, and on
the imported server module: unpatched, vllm-omni's call raises vLLM's real TypeError; with the adapter it makes the
socket vLLM 0.24 made (SO_REUSEPORT on, loopback); revert puts back exactly vLLM's function. tests/serve runs the
whole server through it."""

from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import needs_startup_hook, run_python
from vllm_compat.bridges import setup_server_call as bridge
from vllm_compat.bridges.setup_server_call import SetupServerFacts, Shape
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

STATIC = bridge.DRIFT_POINT.detect_static(StaticSite.installed())
needs_drift = pytest.mark.skipif(
    (STATIC.callee, STATIC.caller) != (Shape.REQUIRES_REUSE_PORT, Shape.ARGS_ONLY)
    or any(importlib.util.find_spec(m) is None for m in ("torchvision", "torchaudio")),
    reason=f"needs vLLM 0.25+'s setup_server(args, *, reuse_port), vllm-omni 0.24.0's call and torchvision / "
    f"torchaudio (vllm-omni's server imports them); here {STATIC}")


@pytest.mark.parametrize(("callee", "caller", "action"), [
    (Shape.REQUIRES_REUSE_PORT, Shape.ARGS_ONLY, Action.PATCHED), (Shape.FITS, Shape.ARGS_ONLY, Action.SKIPPED),
    (Shape.REQUIRES_REUSE_PORT, Shape.FITS, Action.SKIPPED), (Shape.REQUIRES_REUSE_PORT, Shape.ABSENT, Action.SKIPPED),
    (Shape.ABSENT, Shape.ARGS_ONLY, Action.PENDING), (Shape.UNKNOWN, Shape.ARGS_ONLY, Action.REFUSED),
    (Shape.REQUIRES_REUSE_PORT, Shape.UNKNOWN, Action.REFUSED),
    (Shape.UNKNOWN, Shape.ABSENT, Action.SKIPPED), (Shape.MISSING, Shape.ARGS_ONLY, Action.SKIPPED),
    (Shape.MISSING, Shape.ABSENT, Action.SKIPPED),
])
def test_decision_table(callee, caller, action):
    assert bridge.DRIFT_POINT.decide(SetupServerFacts(callee, caller), Controls()).action == action


def test_the_files_give_the_shape_the_imported_function_has():
    """The static shape of ``setup_server`` (what doctor and check decide from) is the imported function's: vLLM 0.33+
    defines it in ``vllm.entrypoints.launchers.launcher`` and re-exports it from the api server module."""
    if STATIC.callee == Shape.ABSENT:
        pytest.skip("vLLM is not installed here")
    result = run_python("""
        import vllm.entrypoints.openai.api_server as module
        from vllm_compat.bridges.setup_server_call import callee_shape_from_function
        print("SHAPE", callee_shape_from_function(module.setup_server)[0])
    """, env={"VLLM_COMPAT_DISABLE": "1"}, timeout=1200)
    if "SHAPE " not in result.stdout:
        pytest.skip(f"vLLM's api server module does not import here: {result.stderr.strip().splitlines()[-1:]}")
    assert STATIC.callee == result.stdout.split("SHAPE ", 1)[1].split()[0], STATIC


@needs_drift
@needs_startup_hook
def test_unpatched_call_fails_and_the_adapter_gives_vllm_024s_socket():
    # vLLM's argument parser cannot be built on a machine without a GPU (its defaults infer the device), so the
    # args are a Namespace with what setup_server reads, and its logging / validation helpers (which read the
    # parser's defaults) are no-ops here; the socket is vLLM's own create_server_socket.
    code = """
        import argparse, json, socket, sys
        import vllm_omni.entrypoints.openai.api_server as server
        import vllm.entrypoints.openai.api_server as vllm_server
        import vllm_compat
        home = sys.modules[vllm_server.setup_server.__module__]  # vLLM 0.33+ defines it elsewhere and re-exports it
        for helper in ("log_version_and_model", "log_non_default_args", "validate_api_server_args"):
            setattr(home, helper, lambda *a, **k: None)
        class Args(argparse.Namespace):  # every other flag unset (None), as parsed defaults would mostly be
            def __getattr__(self, name):
                return None
        args = Args(model="tiny", host="127.0.0.1", port=0)
        out = {}
        try:
            address, sock = server.setup_openai_server(args)
            out["reuse_port"] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
            out["reuse_addr"] = sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR)
            out["host"] = sock.getsockname()[0]
            sock.close()
        except TypeError as exc:
            out["error"] = str(exc)
        out["ours"] = server.setup_openai_server is not vllm_server.setup_server
        vllm_compat.revert()
        out["reverted"] = server.setup_openai_server is vllm_server.setup_server
        print("RESULT", json.dumps(out))
    """
    unpatched = run_python(code, env={"VLLM_COMPAT_DISABLE_PATCHES": bridge.DRIFT_POINT.id}, timeout=1200)
    assert "RESULT " in unpatched.stdout, unpatched.stderr[-3000:]
    out = json.loads(unpatched.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert out["error"] == "setup_server() missing 1 required keyword-only argument: 'reuse_port'" and not out["ours"]
    fixed = run_python(code, timeout=1200)
    assert "RESULT " in fixed.stdout, fixed.stderr[-3000:]
    out = json.loads(fixed.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert out["ours"] and out["reverted"] and out["host"] == "127.0.0.1"
    assert out["reuse_port"] == 1 and out["reuse_addr"] == 1  # vLLM 0.24's create_server_socket set both
