"""Installed distribution versions, read from metadata only (never by importing the package)."""

from __future__ import annotations

from importlib import metadata

from packaging.version import InvalidVersion, Version

# The vLLM releases the matrix (matrix/vllm.toml) proves. Used for reporting only, never as a gate:
# decisions come from detected capabilities.
TESTED_VLLM_RANGE = ("0.16.0", "0.33.0")


def installed_version(distribution: str) -> str | None:
    """Return the installed version string of ``distribution``, or None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def is_tested_vllm(version: str | None) -> bool | None:
    """Whether ``version`` lies in ``TESTED_VLLM_RANGE`` (release part only, so dev builds of a tested
    release count as tested). None when the version is missing or unparseable."""
    if version is None:
        return None
    try:
        release = Version(version).release
    except InvalidVersion:
        return None
    low, high = (Version(v).release for v in TESTED_VLLM_RANGE)
    return low <= release[: len(high)] <= high
