"""Shared test plumbing: skip conditions with reasons, and a subprocess runner for import-level tests."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from vllm_compat.detect.versions import installed_version

VLLM_VERSION = installed_version("vllm")
OMNI_VERSION = installed_version("vllm-omni")

needs_vllm = pytest.mark.skipif(VLLM_VERSION is None, reason="vLLM is not installed in this env")
needs_omni = pytest.mark.skipif(OMNI_VERSION is None, reason="vllm-omni is not installed in this env")


def run_python(code: str, env: dict | None = None, timeout: float = 300, script=None) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this env (so import hooks and module state start clean).

    With ``script`` (a path), the code is written there and run as a file: multiprocessing's spawn needs
    a real ``__main__`` file to re-import.
    """
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_COMPAT_")}
    full_env.update(env or {})
    command = [sys.executable, "-c", textwrap.dedent(code)]
    if script is not None:
        script.write_text(textwrap.dedent(code))
        command = [sys.executable, str(script)]
    return subprocess.run(
        command,
        capture_output=True, text=True, env=full_env, timeout=timeout,
    )
