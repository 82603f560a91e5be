"""The startup hook (``vllm_compat_startup.pth``): installed by regular and editable installs, arranges for the
hooks in every interpreter at the cost of ``import vllm_compat``, registers them before anything of vLLM or
vllm-omni is looked up, honours VLLM_COMPAT_DISABLE, never raises."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import needs_startup_hook, run_python
from vllm_compat._startup import PTH_NAME

ROOT = Path(__file__).resolve().parents[1]
PTH = ROOT / PTH_NAME
HEAVY = ["torch", "vllm", "vllm_omni", "wrapt", "logging", "asyncio", "dataclasses", "inspect", "packaging"]
STARTUP_STATE = """
    LOOK_UP = None
    import json, sys
    finder = next((f for f in sys.meta_path if getattr(f, "_vllm_compat_finder", False)), None)
    if LOOK_UP:
        import importlib.util
        importlib.util.find_spec(LOOK_UP)  # what an import of it does first
    print(json.dumps(dict(
        imported="vllm_compat" in sys.modules,
        finders=sum(getattr(f, "_vllm_compat_finder", False) for f in sys.meta_path),
        watching=sorted(getattr(finder, "_vllm_compat_first_import", {})),
        hooked=sorted(getattr(finder, "_vllm_compat_callbacks", {})),
        counted=sorted(getattr(finder, "_vllm_compat_watched", ())),
        heavy=sorted(m for m in sys.modules if m.split(".")[0] in %r),
    )))
""" % HEAVY  # noqa: UP031 - the code below holds braces; % keeps them literal


@needs_startup_hook
def test_installed_pth_is_the_one_in_the_source_tree():
    assert Path(sysconfig.get_paths()["purelib"], PTH_NAME).read_bytes() == PTH.read_bytes()


@needs_startup_hook
def test_startup_watches_the_served_packages_and_imports_nothing_heavy():
    import vllm_compat

    result = run_python(STARTUP_STATE)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    state = json.loads(result.stdout)
    assert state == {"imported": True, "finders": 1, "watching": sorted(vllm_compat.SERVED_PACKAGES), "hooked": [],
                     "counted": [], "heavy": []}


@needs_startup_hook
@pytest.mark.parametrize("package", ["vllm", "vllm_omni"])
def test_looking_up_a_served_package_registers_every_catalogue_hook_first(package):
    from vllm_compat.catalogue import CATALOGUE

    result = run_python(STARTUP_STATE.replace("LOOK_UP = None", f"LOOK_UP = {package!r}"))
    assert result.returncode == 0 and result.stderr == "", result.stderr
    state = json.loads(result.stdout)
    # every target's hook; the served packages' imports are counted as hooked imports (no callback of their own):
    # the one INFO summary waits for the outermost of those to finish
    from vllm_compat import SERVED_PACKAGES

    assert state["hooked"] == sorted({e.target_module for e in CATALOGUE}) and state["heavy"] == []
    assert state["counted"] == sorted(SERVED_PACKAGES)
    assert package not in state["watching"]


@needs_startup_hook
@pytest.mark.parametrize("value", ["1", "true", " Yes ", "ON"])
def test_disable_turns_the_startup_hook_off(value):
    result = run_python(STARTUP_STATE, env={"VLLM_COMPAT_DISABLE": value})
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert json.loads(result.stdout) == {"imported": False, "finders": 0, "watching": [], "hooked": [], "counted": [],
                                           "heavy": []}


def test_pth_line_never_raises_when_vllm_compat_is_broken():
    """A vllm_compat that fails to import (here: blocked in sys.modules) leaves the interpreter silent and alive."""
    result = run_python(
        f"""
        import sys
        sys.modules["vllm_compat"] = None  # `import vllm_compat` now raises ImportError
        for line in open({str(PTH)!r}):
            exec(line)
        print("alive")
        """
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "alive\n", "")


def test_pth_is_one_import_line():
    lines = PTH.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith("import ")  # site.py executes only lines starting so


@pytest.mark.skipif(shutil.which("uv") is None, reason="needs uv to build throwaway venvs")
@pytest.mark.parametrize("editable", [False, True], ids=["regular", "editable"])
def test_install_puts_the_pth_into_site_packages(tmp_path, editable):
    """``uv pip install [-e] .`` (what the nox sessions run), without dependencies: the .pth is in purelib, in
    RECORD (so uninstalling removes it), and a fresh interpreter there has the hooks registered."""
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "-p", f"{sys.version_info.major}.{sys.version_info.minor}", str(venv)],
                   check=True, capture_output=True)
    python = str(venv / "bin" / "python")
    install = ["uv", "pip", "install", "-q", "--no-deps", "-p", python, *(["-e"] if editable else []), str(ROOT)]
    built = subprocess.run(install, capture_output=True, text=True)
    if built.returncode != 0 and "network" in built.stderr.lower():
        pytest.skip(f"uv could not fetch the build backend offline: {built.stderr[-300:]}")
    assert built.returncode == 0, built.stderr
    purelib = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  check=True, capture_output=True, text=True).stdout.strip())
    assert (purelib / PTH_NAME).read_bytes() == PTH.read_bytes()
    record = next(purelib.glob("vllm_compat-*.dist-info")) / "RECORD"
    assert any(line.startswith(f"{PTH_NAME},") for line in record.read_text().splitlines())
    probe = subprocess.run([python, "-c", "import sys; print('vllm_compat' in sys.modules)"],
                           capture_output=True, text=True)
    # --no-deps: packaging is missing, which `import vllm_compat` does not need
    assert (probe.stdout, probe.stderr) == ("True\n", "")
    subprocess.run(["uv", "pip", "uninstall", "-q", "-p", python, "vllm-compat"], check=True, capture_output=True)
    assert not (purelib / PTH_NAME).exists()
