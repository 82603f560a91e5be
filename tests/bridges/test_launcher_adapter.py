"""The ``launcher_adapter`` bridge on the real wheels: the shared module checks (``serve_stand_in_cases``: the old
module's real ModuleNotFoundError without it on vLLM 0.29+, the import with it, revert exact, out where vLLM 0.24-0.28
has it), and the behaviour vllm-omni relies on, as a differential test: a server started with
``vllm.entrypoints.launcher.serve_http`` on an app whose engine client has ``vllm_config`` None (what vllm-omni's
pure-diffusion ``AsyncOmni`` has) stops on SIGINT, with vLLM 0.24's own launcher and with the adapter on 0.29+; vLLM
0.29+'s ``serve_http`` itself does not (the unpatched reproduction).

The engine client is a stand-in object with the attributes the launchers read (``vllm_config``, ``errored``,
``is_running``, ``should_keep_api_server_alive``, ``shutdown``): building vllm-omni's real ``AsyncOmni`` needs a
stage that does not start on a CPU-only machine (tests/serve). Loopback, port 0, bounded waits."""

from __future__ import annotations

import json

import pytest

from conftest import VLLM_VERSION, needs_vllm, run_python
from tests.bridges.serve_stand_in_cases import cases
from vllm_compat.bridges import HostKind
from vllm_compat.bridges import launcher_adapter as bridge

CASES = cases(bridge, probe=bridge.OLD_MODULE)
globals().update(CASES)
STATIC = CASES["STATIC"]
needs_missing = CASES["needs_missing"]

SIGINT_SCRIPT = """
import asyncio, importlib, importlib.util, json, os, signal, socket, sys, time
from fastapi import FastAPI
serve_http = importlib.import_module(sys.argv[1]).serve_http
# vLLM's launcher imported before the clock starts (the adapter imports it on its first call, which took over 25 s
# of this loaded machine's time and held the loop; vllm-omni's server has long imported it by then)
importlib.import_module("vllm.entrypoints.launchers.launcher" if importlib.util.find_spec(
    "vllm.entrypoints.launchers") else "vllm.entrypoints.launcher")

class PureDiffusionClient:
    vllm_config = None
    errored = False
    is_running = True
    dead_error = None
    should_keep_api_server_alive = False
    shutdowns = []
    def shutdown(self, timeout=None):
        self.shutdowns.append(timeout)

app = FastAPI()
client = PureDiffusionClient()
app.state.engine_client = client
sock = socket.socket(); sock.bind(("127.0.0.1", 0)); port = sock.getsockname()[1]
out = {}

def give_up():  # still serving 25 s after the SIGINT: report and leave (the loop may be wedged)
    import threading
    print("RESULT", json.dumps({"stopped_s": None, "engine_shutdowns": client.shutdowns}), flush=True)
    os._exit(0)

import threading
threading.Timer(27.0, give_up).start()

async def main():
    loop = asyncio.get_running_loop()
    loop.call_later(2.0, lambda: (out.__setitem__("sent", time.monotonic()), os.kill(os.getpid(), signal.SIGINT)))
    shutdown = await serve_http(app, sock=sock, host="127.0.0.1", port=port, log_level="warning")
    out["stopped_s"] = round(time.monotonic() - out["sent"], 2)
    await shutdown

try:
    asyncio.run(main())
except KeyboardInterrupt:
    out.setdefault("stopped_s", round(time.monotonic() - out["sent"], 2))
out["engine_shutdowns"] = client.shutdowns
print("RESULT", json.dumps(out), flush=True)
os._exit(0)
"""


def sigint_run(module: str, env: dict | None = None) -> dict:
    result = run_python(SIGINT_SCRIPT.replace("sys.argv[1]", repr(module)), env=env, timeout=900)  # vLLM's import: minutes here
    assert "RESULT " in result.stdout, result.stdout[-2000:] + result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1].splitlines()[0])


@needs_vllm
@pytest.mark.skipif(STATIC.host != HostKind.DEFINES, reason=f"needs vLLM's own {bridge.OLD_MODULE} (0.24-0.28); here "
                    f"vLLM {STATIC.host} it")
def test_native_launcher_stops_a_pure_diffusion_server_on_sigint():
    """The behaviour vllm-omni 0.24.0 was written against (vLLM 0.24's launcher: uvicorn handles the signal)."""
    from importlib.metadata import version

    if not version("vllm").startswith("0.24."):
        pytest.skip(f"measured on vLLM 0.24 only; vLLM {version('vllm')}'s own launcher did not stop within the "
                    "window in the v0.28-omni0.30 cell (2026-12-03, beside another cell's run): not yet understood")
    out = sigint_run(bridge.OLD_MODULE)
    assert out["stopped_s"] is not None and out["stopped_s"] < 10, out


@needs_missing
def test_new_launcher_alone_ignores_sigint_with_a_pure_diffusion_client():
    """The unpatched reproduction: vLLM 0.29+'s own serve_http, the same app: still serving 20 s after SIGINT."""
    out = sigint_run(bridge.NEW_MODULE)
    assert out["stopped_s"] is None, f"vLLM {VLLM_VERSION}'s serve_http stopped: {out}"


@needs_missing
def test_adapter_stops_a_pure_diffusion_server_on_sigint_and_stops_the_engine():
    out = sigint_run(bridge.OLD_MODULE)
    assert out["stopped_s"] is not None and out["stopped_s"] < 10, out
    assert out["engine_shutdowns"] == [bridge.SHUTDOWN_TIMEOUT], out
