"""The warm server's children start as a new interpreter would, in everything the suite's warm checks rely on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from conftest import STARTUP_HOOK, VLLM_VERSION, clean_env, run_python
from tests.support.warm_python import WARM

pytestmark = pytest.mark.skipif(os.environ.get("VLLM_COMPAT_TESTS_COLD") == "1",
                                reason="VLLM_COMPAT_TESTS_COLD=1: every check runs in a new interpreter")


def test_the_server_starts_and_preloads_without_vllm():
    """Else every warm check silently runs cold (correct, and slow): the server must come up, and where vLLM is
    installed, its preload must hold torch and no vLLM, vllm-omni or vllm_compat."""
    assert WARM.ensure_server(), WARM.cold_reason
    if VLLM_VERSION is not None:
        assert "torch" in WARM.preloaded, WARM.preloaded
    assert not {"vllm", "vllm_omni", "vllm_compat"} & set(WARM.preloaded), WARM.preloaded

STATE = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(), "name": __name__, "marker": os.environ.get("MARKER"),
    "ours": sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("vllm", "vllm_omni", "vllm_compat")}),
    "hooked": any(getattr(f, "_vllm_compat_finder", False) for f in sys.meta_path),
}))
"""


def _state(warm: bool, env: dict | None = None) -> dict:
    result = run_python(STATE, env={"MARKER": "m", **(env or {})}, warm=warm)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


@pytest.mark.parametrize("disable", ["", "1"], ids=["hook", "disabled"])
def test_a_child_starts_as_a_new_interpreter_does(disable):
    """Same argv, path, cwd, environment, ``__main__``, and the startup hook's state (on, or off under
    VLLM_COMPAT_DISABLE=1); vLLM, vllm-omni and vllm_compat beyond the hook are not preloaded."""
    env = {"VLLM_COMPAT_DISABLE": disable} if disable else {}
    assert _state(True, env) == _state(False, env)
    if STARTUP_HOOK:
        assert _state(True, env)["hooked"] is not bool(disable)


def test_exit_codes_output_and_tracebacks_are_a_new_interpreters():
    for code in ("print('out'); import sys; print('err', file=sys.stderr)", "raise SystemExit(3)",
                 "raise SystemExit('bye')", "1/0", "import os; os._exit(7)"):
        warm, cold = run_python(code, warm=True), run_python(code)
        assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout), code
        assert warm.stderr.splitlines()[-1:] == cold.stderr.splitlines()[-1:], (code, warm.stderr, cold.stderr)
        assert "warm_python" not in warm.stderr, warm.stderr


def test_a_module_runs_as_with_dash_m(tmp_path):
    args = ["-m", "json.tool", "--sort-keys"]
    source = tmp_path / "in.json"
    source.write_text('{"b": 1, "a": 2}')
    warm = WARM.run([*args, str(source)], clean_env(), tmp_path, timeout=60)
    cold = subprocess.run([sys.executable, *args, str(source)], capture_output=True, text=True, cwd=tmp_path)
    assert (warm.returncode, warm.stdout) == (cold.returncode, cold.stdout) == (0, cold.stdout)


def test_non_daemon_threads_and_atexit_run_before_the_exit():
    code = ("import atexit, threading, time\natexit.register(lambda: print('atexit'))\n"
            "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n")
    assert run_python(code, warm=True).stdout.split() == ["thread", "atexit"] == run_python(code).stdout.split()


def test_a_run_past_its_timeout_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "pid"
    code = (f"import subprocess, sys, time\nchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])"
            f"\nopen({str(pid_file)!r}, 'w').write(str(child.pid))\ntime.sleep(60)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(code, timeout=5, warm=True)
    pid = int(pid_file.read_text())
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"the run's own child {pid} outlived the timeout")


def test_omp_threads_asked_for_are_what_the_preloaded_torch_uses():
    if "torch" not in WARM.preloaded:
        pytest.skip("torch is not among the preloaded packages here")
    code = "import torch; print(torch.get_num_threads())"
    assert run_python(code, env={"OMP_NUM_THREADS": "1"}, warm=True).stdout.split() == ["1"]
    assert os.cpu_count() is None or os.cpu_count() < 2 or run_python(code, warm=True).stdout.split() != ["1"]
