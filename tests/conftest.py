"""Shared test plumbing: skip conditions with reasons, and a subprocess runner for import-level tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from tests.support.warm_python import WARM
from vllm_compat.detect.versions import installed_version

# `vllm-compat check vllm==X vllm-omni==Y` resolves the pair with uv and lists its wheels over the network
# (vllm_compat/resolution.py): the suite's many checks leave it out; tests/test_resolution.py turns it back on.
os.environ.setdefault("VLLM_COMPAT_NO_RESOLVE", "1")

VLLM_VERSION = installed_version("vllm")
OMNI_VERSION = installed_version("vllm-omni")

needs_vllm = pytest.mark.skipif(VLLM_VERSION is None, reason="vLLM is not installed in this env")
# The startup hook (vllm_compat_startup.pth in site-packages): registers vllm_compat's hooks in every interpreter,
# before `import vllm_omni`; an install of vllm_compat from before it existed lacks it.
from vllm_compat._startup import is_installed as _startup_hook_installed  # noqa: E402

STARTUP_HOOK = _startup_hook_installed()
needs_startup_hook = pytest.mark.skipif(
    not STARTUP_HOOK, reason="vllm_compat_startup.pth is not in this env's site-packages (reinstall vllm_compat)"
)
# "Importable" is decided statically (vllm_compat.detect.import_drift, ~1 s): vllm-omni installed on a vLLM that
# lacks a name its own ``__init__`` reaches (vllm-omni <= 0.30 on vLLM 0.31+: vllm.v1.outputs.RoutedExpertsLists)
# counts as not importable, so a matrix cell with it still runs every test that does not need vllm-omni.
# Names vllm_compat bridges do not count when its startup hook is installed (the bridges are then in place before
# `import vllm_omni` in every interpreter): the same bridged view as doctor's (Report.import_drift).
OMNI_IMPORT_BLOCKERS = []
if OMNI_VERSION is not None and VLLM_VERSION is not None:
    from vllm_compat import report as _report

    _drift = _report().import_drift
    OMNI_IMPORT_BLOCKERS = _drift.still_blocking_names if _drift is not None else []
# Bridged names `import vllm_omni` needs: it imports only where the startup hook put the bridges in place first.
OMNI_NEEDS_STARTUP_BRIDGES = bool(OMNI_VERSION and VLLM_VERSION and _drift is not None and _drift.blocking_names)
_BLOCKED = f"vllm-omni {OMNI_VERSION} will not import on vLLM {VLLM_VERSION}: {', '.join(OMNI_IMPORT_BLOCKERS)} missing"
needs_omni = pytest.mark.skipif(
    OMNI_VERSION is None or bool(OMNI_IMPORT_BLOCKERS),
    reason="vllm-omni is not installed in this env" if OMNI_VERSION is None else _BLOCKED,
)
# For tests that import vLLM and, when it is installed, vllm-omni (runtime detection): fine without vllm-omni,
# meaningless with a vllm-omni that cannot import.
omni_importable_or_absent = pytest.mark.skipif(bool(OMNI_IMPORT_BLOCKERS), reason=_BLOCKED)


def clean_env(env: dict | None = None) -> dict:
    """This process's environment without the ``VLLM_COMPAT_*`` controls (the cell's expectations among them),
    plus ``env``."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_COMPAT_")}
    full_env.update(env or {})
    return full_env


def run_python(code: str, env: dict | None = None, timeout: float = 300, script=None,
               warm: bool = False) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this env (so import hooks and module state start clean).

    With ``script`` (a path), the code is written there and run as a file: multiprocessing's spawn needs
    a real ``__main__`` file to re-import. With ``warm``, a child of the warm server runs it
    (``tests/support/warm_python.py``: vLLM, vllm-omni and vllm_compat imported fresh, the third-party packages
    they pull in already loaded); for code that imports vLLM and looks at nothing those packages decide.
    """
    code = textwrap.dedent(code)
    if warm and script is None:
        return WARM.run(["-c", code], clean_env(env), os.getcwd(), timeout)
    command = [sys.executable, "-c", code]
    if script is not None:
        script.write_text(code)
        command = [sys.executable, str(script)]
    return subprocess.run(command, capture_output=True, text=True, env=clean_env(env), timeout=timeout)


def _static_capabilities():
    from vllm_compat.patches.diffusers_loader.facts import detect_static

    return detect_static().vllm


_CAPS = _static_capabilities()
needs_layerwise_finalize = pytest.mark.skipif(
    not _CAPS.has_compatible_finalize,
    reason="the installed vLLM has no layerwise finalize_layerwise_processing (vLLM < 0.19)",
)
needs_online_processing = pytest.mark.skipif(
    not _CAPS.has_initialize_online_processing,
    reason="the installed vLLM has no initialize_online_processing: online layers are not materialized while "
    "loading (vLLM < 0.19)",
)


def _has_v1_model_runner() -> bool:
    """Whether the installed vLLM ships the V1 model runner (read from its files: nothing imported)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    return spec is not None and any((Path(p) / "v1" / "worker" / "gpu_model_runner.py").is_file()
                                    for p in spec.submodule_search_locations or ())


needs_v1_model_runner = pytest.mark.skipif(
    not _has_v1_model_runner(),
    reason="the installed vLLM has no V1 model runner (vllm.v1.worker.gpu_model_runner, removed in 0.34), which "
    "vllm-omni's LLM / AR and generation stages run on: they do not start here (the verdict names them as left out), "
    "so their schedulers are not run")
