"""A release wheel for a test: fetched as ``vllm-compat check`` fetches it (the shared cache first), or a skip
that says why when the index cannot be reached (never a failure of the code under test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_compat.detect.wheels import WheelError, fetch_wheel


def wheel_or_skip(distribution: str, version: str) -> Path:
    try:
        return fetch_wheel(distribution, version)[0]
    except WheelError as exc:
        if exc.kind in ("no_network", "no_wheel", "no_pip"):
            pytest.skip(f"cannot fetch {distribution}=={version}: {exc}")
        raise
