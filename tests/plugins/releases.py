"""A plugin release's file for a test: found in the check's wheel cache (``detect.wheels.cache_dir``: the
``VLLM_COMPAT_WHEEL_CACHE``, else ``~/.cache/vllm-compat/wheels``), or a skip that says how to put it there. Nothing is
downloaded here: the plugins' wheels are platform wheels (vllm-metal is macOS arm64 only, lmcache and vllm-ascend
carry CUDA / NPU builds) that ``pip download`` would refuse on this machine, and kvcached publishes sdists only."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_compat.detect.wheels import cache_dir

# "1": fetch a release that is not cached (a plugin's wheel with pip, vLLM's members by range requests) instead of
# skipping; CI sets it in the one cell whose matrix/vllm.toml row says plugin_tests = true (noxfile._cell_env)
FETCH = "VLLM_COMPAT_FETCH_PLUGIN_RELEASES"


def fetching() -> bool:
    import os

    return os.environ.get(FETCH) == "1"

HOW = ("put it there from https://pypi.org/project/{name}/{version}/#files (any wheel of that version, or the "
       "sdist where there is no wheel)")


def release_path(name: str, version: str) -> Path | None:
    """The cached wheel (preferred) or sdist of ``name==version``; None when neither is cached."""
    from packaging.utils import (
        InvalidSdistFilename,
        InvalidWheelFilename,
        canonicalize_name,
        parse_sdist_filename,
        parse_wheel_filename,
    )
    from packaging.version import Version

    directory = cache_dir()
    if not directory.is_dir():
        return None
    found = []
    for path in directory.iterdir():
        try:
            if path.name.endswith(".whl"):
                found_name, found_version = parse_wheel_filename(path.name)[:2]
            elif path.name.endswith(".tar.gz"):
                found_name, found_version = parse_sdist_filename(path.name)
            else:
                continue
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
        if found_name == canonicalize_name(name) and found_version == Version(version):
            found.append(path)
    return sorted(found, key=lambda p: (not p.name.endswith(".whl"), p.name))[0] if found else None


def release_or_skip(name: str, version: str) -> Path:
    from vllm_compat.detect.wheels import WheelError, fetch_wheel

    path = release_path(name, version)
    if path is None and fetching():
        try:
            path = fetch_wheel(name, version)[0]
        except WheelError as exc:  # an sdist-only release (kvcached), a wheel of another platform (vllm-metal)
            pytest.skip(f"{name}=={version}: no wheel pip can fetch for this machine ({exc.kind})")
    if path is None:
        pytest.skip(f"{name}=={version} is not in {cache_dir()}: " + HOW.format(name=name, version=version))
    return path


def vllm_wheel_or_skip(version: str) -> Path | str:
    """vLLM ``version`` for ``check``: its cached wheel, else ``vllm==VERSION`` where the members ``check`` reads of it
    (``detect.wheel_members``) are cached; a skip otherwise."""
    path = release_path("vllm", version)
    if path is not None and path.name.endswith(".whl"):
        return path
    members = cache_dir() / "members"
    if fetching() or members.is_dir() and any(m.name.startswith(f"vllm-{version}-") for m in members.iterdir()):
        return f"vllm=={version}"  # check reads (or fetches) the members
    pytest.skip(f"vllm=={version} is not in {cache_dir()} (`vllm-compat check vllm=={version} ...` puts it there)")


def vllm_tree_or_skip(version: str):
    """vLLM ``version``'s tree: its cached wheel, else the members ``check`` reads of it (fetched where
    ``fetching()``); a skip otherwise."""
    from vllm_compat.detect.source_tree import SourceTree
    from vllm_compat.detect.wheel_members import open_release

    found = vllm_wheel_or_skip(version)
    return SourceTree(found) if isinstance(found, Path) else open_release("vllm", version).tree
