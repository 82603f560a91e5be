"""The static doctor's on-disk cache of the installed pair's facts (detect.fact_cache), and versions read without
importlib.metadata (detect.versions)."""

from __future__ import annotations

import os
from importlib import metadata

import pytest

from conftest import needs_vllm
from vllm_compat.detect import fact_cache
from vllm_compat.detect.versions import installed_metadata, installed_version, metadata_stamp


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


@pytest.mark.parametrize("distribution", ["vllm", "vllm-omni", "torch", "packaging", "PyYAML", "vllm-compat",
                                          "no-such-distribution"])
def test_installed_metadata_is_importlib_metadatas(distribution):
    try:
        expected = metadata.distribution(distribution).read_text("METADATA")
    except metadata.PackageNotFoundError:
        expected = None
    assert installed_metadata(distribution) == expected


def test_a_metadata_stamp_changes_with_what_is_installed(tmp_path, monkeypatch):
    """What the doctor keeps its dependency drift under: "-" while a distribution is absent, its METADATA's path,
    size and mtime once installed, another stamp when that file changes."""
    import sys

    monkeypatch.setattr(sys, "path", [str(tmp_path), *sys.path])
    assert metadata_stamp("vllm-compat-test-dist") == "-"
    info = tmp_path / "vllm_compat_test_dist-1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-compat-test-dist\nVersion: 1.2\n\n")
    stamp = metadata_stamp("vllm-compat-test-dist")
    assert stamp.startswith(str(info / "METADATA") + ":")
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-compat-test-dist\nVersion: 1.2\nRequires-Dist: x\n\n")
    assert metadata_stamp("vllm-compat-test-dist") != stamp


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    """A fact cache directory holding the installed pair's facts, decisions and dependency drift (one cold report:
    what a first doctor writes); tests copy it, so each changes its own."""
    from vllm_compat.reporting import build_report

    folder = tmp_path_factory.mktemp("warm-facts")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_COMPAT_CACHE_DIR", str(folder))
        report = build_report()
        report.render_short()
    if not list((folder / "facts").glob("*.pickle")):
        pytest.skip("vllm, vllm-omni or torch is not installed from a distribution here: nothing is cached")
    return folder


def _use_copy(cache, tmp_path, monkeypatch):
    import shutil

    shutil.copytree(cache, tmp_path / "cache")
    monkeypatch.setenv("VLLM_COMPAT_CACHE_DIR", str(tmp_path / "cache"))


def _drift_fields(drift):
    return None if drift is None else (drift.host, drift.plugin, drift.conflicts, drift.pinned_read, drift.unread)


@needs_vllm
def test_warm_doctor_reads_the_dependency_drift_back_until_a_stamp_changes(warm_cache, tmp_path, monkeypatch):
    """The installed pair's dependency drift comes back from the cache while every METADATA it read has the stamp
    it had (no Requires-Dist parsed); one changed stamp (a pinned package reinstalled) computes it again."""
    from vllm_compat import dependency_drift
    from vllm_compat.detect import versions
    from vllm_compat.detect.static import StaticSite

    _use_copy(warm_cache, tmp_path, monkeypatch)
    computed = []
    compute = dependency_drift.installed_dependency_drift
    monkeypatch.setattr(dependency_drift, "installed_dependency_drift",
                        lambda **kw: computed.append(1) or compute(**kw))
    expected = _drift_fields(compute())
    assert _drift_fields(StaticSite.installed().installed_dependency_drift()) == expected
    assert computed == []
    stamp = versions.metadata_stamp
    monkeypatch.setattr(versions, "metadata_stamp", lambda name: "changed" if name == "vllm" else stamp(name))
    assert _drift_fields(StaticSite.installed().installed_dependency_drift()) == expected
    assert computed == [1]


@needs_vllm
def test_warm_doctor_decides_from_the_cache_per_controls(warm_cache, tmp_path, monkeypatch):
    """Decisions come back from the cache under the controls they were made under; other controls decide again
    (and are kept too). Each equals what plan() decides from the facts."""
    from vllm_compat import decide
    from vllm_compat.config import Controls
    from vllm_compat.detect.static import StaticSite

    _use_copy(warm_cache, tmp_path, monkeypatch)
    site = StaticSite.installed()
    default, disabled = Controls(), Controls(disabled=True)
    expected = {c: [d for _, _, d in decide.plan(site, c)] for c in (default, disabled)}
    plan = decide.plan
    planned = []
    monkeypatch.setattr(decide, "plan", lambda *a: planned.append(1) or plan(*a))
    assert decide.decided(StaticSite.installed(), default)[0] == expected[default]
    assert planned == []  # the cold report kept them
    assert decide.decided(StaticSite.installed(), disabled)[0] == expected[disabled]
    assert planned == [1]
    assert decide.decided(StaticSite.installed(), disabled)[0] == expected[disabled]
    assert planned == [1]


def test_the_kept_patterns_judge_findings_as_the_drift_points_do():
    """``decide.decided``'s ``{entry id: handles_drift}``, given to ``bridges.drift_handler``, names the same drift
    point for a finding as asking the imported drift points does: for a finding made to match each pattern of
    each drift point that has any, and one none matches."""
    from vllm_compat.bridges import drift_handler
    from vllm_compat.catalogue import CATALOGUE
    from vllm_compat.decide import Action
    from vllm_compat.detect.behaviour_findings import Finding
    from vllm_compat.drift import DriftPoint

    patched = [entry.decision(Action.PATCHED, "test") for entry in CATALOGUE]
    handles = {e.id: e.point.handles_drift for e in CATALOGUE if type(e.point).handles is DriftPoint.handles}
    findings = [Finding(kind, vllm.replace("*", "x"), plugin.replace("*", "x"), "m", 1, "d", (name.replace("*", "x"),))
                for e in CATALOGUE for kind, vllm, plugin, name in e.point.handles_drift]
    findings.append(Finding("call", "vllm.nothing", "vllm_omni.nothing", "m", 1, "d", ("nothing",)))
    assert len(findings) > 1
    asked, kept = drift_handler(patched), drift_handler(patched, handles)
    assert [kept(f) for f in findings] == [asked(f) for f in findings]
    assert kept(findings[-1]) is None and all(kept(f) is not None for f in findings[:-1])


def test_key_keeps_across_a_reinstall_of_the_same_vllm_compat(tmp_path, monkeypatch):
    """``pip install .`` of the same version writes the same bytes at new mtimes (and maybe another path): the
    key stays, so the warm answer does (issue 39: 12.3 s after a reinstall when the key held the mtimes)."""
    import shutil

    roots = _installed_like(tmp_path)
    key = fact_cache.installed_key(roots)
    copy = tmp_path / "reinstalled" / "vllm_compat"
    shutil.copytree(fact_cache._OWN_ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    for path in copy.rglob("*.py"):
        os.utime(path, ns=(1, 1_000_000_000))  # another install's mtimes
    monkeypatch.setattr(fact_cache, "_OWN_ROOT", str(copy))
    assert fact_cache.installed_key(roots) == key
    assert fact_cache.files_key("wheel-pair", "x", "y") == fact_cache.files_key("wheel-pair", "x", "y")
    first = next(copy.rglob("*.py"))
    first.write_bytes(first.read_bytes() + b"# edited\n")
    assert fact_cache.installed_key(roots) != key
