"""The static doctor's on-disk cache of the installed pair's facts (detect.fact_cache), and versions read without
importlib.metadata (detect.versions)."""

from __future__ import annotations

import os
from importlib import metadata

import pytest

from conftest import needs_vllm
from vllm_compat.detect import fact_cache
from vllm_compat.detect.versions import installed_version


@needs_vllm
def test_warm_doctor_reads_every_fact_back_and_reports_the_same(tmp_path, monkeypatch):
    """A second report on the same installed files parses nothing (no entry's detect_static, no scan, no import
    drift) and equals the first; a corrupted cache file is ignored and rewritten."""
    from vllm_compat.catalogue import CATALOGUE, drift_point
    from vllm_compat.detect import import_drift
    from vllm_compat.reporting import build_report

    monkeypatch.setenv("VLLM_COMPAT_CACHE_DIR", str(tmp_path))
    fresh = build_report().to_dict()
    files = list((tmp_path / "facts").glob("*.pickle"))
    if not files:
        pytest.skip("vllm, vllm-omni or torch is not installed from a distribution here: nothing is cached")
    assert len(files) == 1

    def not_again(*args, **kwargs):
        raise AssertionError("recomputed on a warm run")

    for entry in CATALOGUE:
        monkeypatch.setattr(drift_point(entry), "detect_static", not_again)
    monkeypatch.setattr(import_drift, "detect_import_drift", not_again)
    assert build_report().to_dict() == fresh

    monkeypatch.undo()
    monkeypatch.setenv("VLLM_COMPAT_CACHE_DIR", str(tmp_path))
    files[0].write_bytes(b"not a pickle")
    assert build_report().to_dict() == fresh
    assert files[0].read_bytes() != b"not a pickle"  # rewritten


def _installed_like(tmp_path, packages=fact_cache.PACKAGES):
    roots = {}
    for package in packages:
        root = tmp_path / package
        (root / f"{package}-1.0.dist-info").mkdir(parents=True)
        (root / f"{package}-1.0.dist-info" / "RECORD").write_text("a,,\n")
        roots[package] = str(root)
    return roots


def test_key_changes_with_any_record_and_is_none_without_one(tmp_path):
    roots = _installed_like(tmp_path)
    key = fact_cache.installed_key(roots)
    assert key is not None and key == fact_cache.installed_key(roots)
    for package in fact_cache.PACKAGES:
        record = os.path.join(roots[package], f"{package}-1.0.dist-info", "RECORD")
        stat = os.stat(record)
        os.utime(record, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
        assert fact_cache.installed_key(roots) != key, package
        key = fact_cache.installed_key(roots)
    assert fact_cache.installed_key({**roots, "vllm_omni": None}) is None  # absent: nothing cached
    assert fact_cache.installed_key({**roots, "torch": str(tmp_path)}) is None  # no RECORD there


def test_key_changes_with_vllm_compat_files(tmp_path, monkeypatch):
    """An edited vllm_compat (an editable install's RECORD never changes) makes a new key."""
    own = tmp_path / "own"
    (own / "sub").mkdir(parents=True)
    (own / "sub" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(fact_cache, "_OWN_ROOT", str(own))
    roots = _installed_like(tmp_path)
    key = fact_cache.installed_key(roots)
    (own / "sub" / "a.py").write_text("x = 22\n")
    assert fact_cache.installed_key(roots) != key


def test_a_cache_written_under_another_key_is_not_read(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_COMPAT_CACHE_DIR", str(tmp_path))
    fact_cache.store("key one", {"facts": {"x": 1}})
    assert fact_cache.load("key one") == {"facts": {"x": 1}}
    other = "key two"
    os.replace(fact_cache._path("key one"), fact_cache._path(other))  # the same file name, another key inside
    assert fact_cache.load(other) == {}
    assert fact_cache.load(None) == {}


@pytest.mark.parametrize("distribution", ["vllm", "vllm-omni", "vllm_omni", "torch", "wrapt", "packaging",
                                          "PyYAML", "typing-extensions", "vllm-compat", "no-such-distribution"])
def test_installed_version_is_importlib_metadatas(distribution):
    try:
        expected = metadata.version(distribution)
    except metadata.PackageNotFoundError:
        expected = None
    assert installed_version(distribution) == expected


def test_installed_version_sees_a_distribution_installed_meanwhile(tmp_path, monkeypatch):
    """Listings are kept per directory mtime (apply() asks on every call): a new dist-info is seen at once."""
    import sys

    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert installed_version("vllm-compat-test-dist") is None
    info = tmp_path / "vllm_compat_test_dist-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-compat-test-dist\nVersion: 1.2\n\n")
    assert installed_version("vllm-compat-test-dist") == "1.2" == metadata.version("vllm-compat-test-dist")
