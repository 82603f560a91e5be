"""A warm interpreter for the suite's subprocess checks: a fork server that has imported the third-party packages
vLLM and vllm-omni pull in (torch, transformers, diffusers, scipy, ...), and nothing of vLLM, vllm-omni or
vllm_compat.

Why: a check that must start clean (import hooks, the startup ``.pth``, ``VLLM_COMPAT_*`` read at import,
``import vllm_omni`` after vllm_compat) ran in a new interpreter, and about 80% of each start was importing
those packages again (``-X importtime``: 11.5 of 14.4 s for vllm-omni's loader). A forked child starts with them
loaded and imports vLLM, vllm-omni and vllm_compat itself, as a new interpreter does: its environment is the
request's, the startup hook line of ``vllm_compat_startup.pth`` runs in it (as ``site`` runs it) before the code,
and ``-c CODE`` / ``-m MODULE`` get the ``__main__``, ``sys.argv`` and ``sys.path[0]`` a new interpreter gives them.

What differs from a new interpreter, so a check that depends on it asks for one (``run_python(..., warm=False)``,
the default): the preloaded packages are already in ``sys.modules`` (a check of what an import loads), and they
were imported before anything the code sets (an environment variable such a package reads when imported).

The preload list is what a new interpreter of this env loads for ``import vllm_omni``'s loader (or ``import
vllm`` without vllm-omni), minus vLLM, vllm-omni, vllm_compat and the tests, measured by a forked child of the
server before the server imports it. If the server cannot start, or its preload pulled in vLLM, the client runs
every check in a new interpreter and says why once on stderr. ``VLLM_COMPAT_TESTS_COLD=1`` does the same on purpose.

    python -m tests.support.warm_python SOCKET   (the server; started by ``WarmPython``)
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OURS = ("vllm", "vllm_omni", "vllm_compat", "tests", "__main__")
PRELOAD_TARGETS = ("vllm_omni.diffusion.model_loader.diffusers_loader", "vllm")
READY = "WARM-PYTHON-READY"


def _is_ours(name: str) -> bool:
    return name.split(".", 1)[0] in OURS


# ---- the server (runs in its own interpreter, started with VLLM_COMPAT_DISABLE=1: the .pth imports nothing) ----

def _measure_preload() -> list[str]:
    """The modules a new interpreter loads for the first importable target, in the order it loaded them, as a
    forked child of this (still bare) interpreter measures them."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.dup2(2, 1)  # nothing it prints may reach the server's stdout, where the client waits for READY
        os.environ.pop("VLLM_COMPAT_DISABLE", None)
        line = _startup_hook_line()
        if line is not None:
            exec(line, {})  # noqa: S102 - with the bridges, vllm-omni imports as far as a worker's would
        names: list[str] = []
        for target in PRELOAD_TARGETS:
            try:
                __import__(target)
            except BaseException:
                continue
            names = [name for name in sys.modules if not _is_ours(name)]
            break
        with os.fdopen(write, "w") as pipe:
            pipe.write("\n".join(names))
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        names = pipe.read().split()
    os.waitpid(pid, 0)
    return names


def _preload() -> None:
    import importlib

    for name in _measure_preload():
        if name not in sys.modules:
            try:
                importlib.import_module(name)
            except BaseException:  # a module its importer expected to fail, or one only a parent can load
                pass
    leaked = sorted({name.split(".", 1)[0] for name in sys.modules if _is_ours(name)} - {"__main__", "tests"})
    if leaked:
        raise SystemExit(f"the preload imported {leaked}: a warm child would not import them fresh")


def _startup_hook_line() -> str | None:
    """The ``import`` line of this env's ``vllm_compat_startup.pth`` (what ``site`` execs at startup)."""
    import site

    for directory in [*site.getsitepackages(), site.getusersitepackages()]:
        path = Path(directory, "vllm_compat_startup.pth")
        if path.is_file():
            return next((line for line in path.read_text().splitlines() if line.startswith("import")), None)
    return None


def _exit_code(error: SystemExit) -> int:
    code = error.code
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _run_child(request: dict, stdout: int, stderr: int) -> None:
    """Become the requested interpreter; never returns."""
    import runpy
    import threading
    import traceback
    import types

    os.setpgid(0, 0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    for name in [name for name in sys.modules if _is_ours(name)]:
        del sys.modules[name]  # the server's own modules (tests.support.warm_python): the code imports them afresh
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))  # what the preloaded torch read from its env at import
    code = 0
    try:
        line = _startup_hook_line()
        if line is not None:
            exec(line, {})  # noqa: S102 - what site.addpackage does with the .pth's import line
        argv = request["argv"]
        if argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)  # noqa: S102
        else:
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    except SystemExit as error:
        code = _exit_code(error)
    except BaseException as error:
        # The traceback a new interpreter prints: from the code's own frame on, without this function's.
        traceback.print_exception(type(error), error, error.__traceback__.tb_next)
        code = 1
    try:
        threading._shutdown()  # what interpreter shutdown does: wait for non-daemon threads
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def _handle(conn: socket.socket) -> None:
    """Run one request in a grandchild; send back its exit status and output; never returns."""
    import signal

    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    with conn.makefile("rb") as reader:
        request = json.loads(reader.readline())
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_child(request, out.fileno(), err.fileno())
    deadline = time.monotonic() + request["timeout"]
    timed_out = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            timed_out = True
            os.killpg(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            break
        time.sleep(0.02)
    try:
        os.killpg(pid, signal.SIGKILL)  # what the run left behind (its own children), as a finished process leaves none
    except ProcessLookupError:
        pass
    out.seek(0)
    err.seek(0)
    reply = {"returncode": os.waitstatus_to_exitcode(status), "timed_out": timed_out,
             "stdout": out.read().decode(errors="replace"), "stderr": err.read().decode(errors="replace")}
    conn.sendall(json.dumps(reply).encode())
    conn.close()
    os._exit(0)


def serve(path: str) -> None:
    import signal

    _preload()
    parent = os.getppid()
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(64)
    server.settimeout(2.0)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    print(READY, json.dumps(sorted({name.split(".", 1)[0] for name in sys.modules})), flush=True)
    sys.stderr.flush()
    while os.getppid() == parent:  # the test session went away: so does the server
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        if os.fork() == 0:
            server.close()
            _handle(conn)
        conn.close()


# ---- the client (in the pytest process) ----

class WarmPython:
    """Runs ``python -c CODE`` / ``python -m MODULE`` checks in children of one warm server, started on first use."""

    def __init__(self, root: Path):
        self.root = root
        self._server: subprocess.Popen | None = None
        self.preloaded: list[str] = []  # the top-level packages the server has loaded, once it runs
        self._path: str | None = None
        self.cold_reason: str | None = "disabled by VLLM_COMPAT_TESTS_COLD" if os.environ.get(
            "VLLM_COMPAT_TESTS_COLD") == "1" else None

    def ensure_server(self) -> bool:
        """Start the server unless it runs; False (and ``cold_reason`` says why) where checks run cold."""
        if self.cold_reason is not None:
            return False
        if self._server is not None:
            return True
        self._path = os.path.join(tempfile.mkdtemp(prefix="warm-python-"), "socket")
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_COMPAT_")}
        env["VLLM_COMPAT_DISABLE"] = "1"
        log = Path(self._path).with_name("server.log")
        with open(log, "w") as stderr:  # a file, not a pipe: a full pipe would block the server
            server = subprocess.Popen([sys.executable, "-m", "tests.support.warm_python", self._path],
                                      cwd=self.root, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                      stdin=subprocess.DEVNULL)
        line = server.stdout.readline().strip()
        if not line.startswith(READY + " "):
            server.kill()
            server.wait()
            self.cold_reason = f"the warm server did not start ({line!r}): {log.read_text()[-2000:]}"
            print(f"tests.support.warm_python: {self.cold_reason}; running checks in new interpreters",
                  file=sys.stderr)
            return False
        self._server = server
        self.preloaded = json.loads(line.split(" ", 1)[1])
        atexit.register(self.close)
        return True

    def start(self, argv: list[str], env: dict, cwd: Path | str, timeout: float) -> Running:
        if not self.ensure_server():
            return Running.cold(argv, env, cwd, timeout)
        conn = socket.socket(socket.AF_UNIX)
        conn.connect(self._path)
        request = {"argv": argv, "env": env, "cwd": str(cwd), "timeout": timeout}
        conn.sendall(json.dumps(request).encode() + b"\n")
        return Running(argv, conn=conn, timeout=timeout)

    def run(self, argv: list[str], env: dict, cwd: Path | str, timeout: float) -> subprocess.CompletedProcess:
        return self.start(argv, env, cwd, timeout).wait()

    def close(self) -> None:
        if self._server is not None:
            self._server.kill()
            self._server.wait()
            self._server = None


class Running:
    """A started check: ``wait()`` gives its ``CompletedProcess`` (``TimeoutExpired`` past its timeout)."""

    def __init__(self, argv, conn=None, process=None, timeout=300.0):
        self.argv, self.conn, self.process, self.timeout = argv, conn, process, timeout

    @classmethod
    def cold(cls, argv, env, cwd, timeout) -> Running:
        process = subprocess.Popen([sys.executable, *argv], cwd=cwd, env=env, text=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        return cls(argv, process=process, timeout=timeout)

    def wait(self) -> subprocess.CompletedProcess:
        command = [sys.executable, *self.argv]
        if self.process is not None:
            try:
                stdout, stderr = self.process.communicate(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.communicate()
                raise
            return subprocess.CompletedProcess(command, self.process.returncode, stdout, stderr)
        chunks = []
        with self.conn:
            while chunk := self.conn.recv(1 << 20):
                chunks.append(chunk)
        reply = json.loads(b"".join(chunks))
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(command, self.timeout, reply["stdout"], reply["stderr"])
        return subprocess.CompletedProcess(command, reply["returncode"], reply["stdout"], reply["stderr"])


# The suite's one client (per pytest process: an xdist worker has its own server).
WARM = WarmPython(Path(__file__).resolve().parents[2])

if __name__ == "__main__":
    serve(sys.argv[1])
