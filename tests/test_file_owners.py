"""The file-owner finder (``vllm_compat.detect.file_owners``) and the known-clash rows, on small fake site-packages
built in tmp_path: two ``*.dist-info`` whose RECORDs share a file. Fakes because no installed release in these CPU
cell envs has a clash with a known fix (the cuda-python 12.x / cuda-bindings 13 pair was measured on a GPU
install); the real envs are read by tests/test_installed_env.py.

Expected values come from how each fake is built (its RECORD text, the bytes written, hashlib on them), never
from the code under test.
"""

from __future__ import annotations

import base64
import hashlib
import re

import pytest

from vllm_compat.dependency_drift import DependencyDrift, file_clash_lines, file_clashes_dict
from vllm_compat.detect.file_owners import find_file_clashes, site_dirs
from vllm_compat.known_clashes import KNOWN_CLASHES, known_clash


def _sha(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _dist(site, dist_info: str, files: dict, on_disk: bool = True, extra_lines=()):
    """A ``dist_info`` in ``site`` whose RECORD lists ``files`` ({path: bytes}) with their sha256 and size; the
    bytes are written where the path lands when ``on_disk``. Returns the RECORD lines."""
    meta = site / dist_info
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\n")
    lines = []
    for path, data in files.items():
        lines.append(f"{path},{_sha(data)},{len(data)}")
        if on_disk:
            target = (site / path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    lines += list(extra_lines)
    lines += [f"{dist_info}/METADATA,,", f"{dist_info}/RECORD,,", f"{dist_info}/INSTALLER,,"]
    (meta / "RECORD").write_text("\n".join(lines) + "\n")
    return lines


@pytest.fixture
def site(tmp_path):
    path = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    path.mkdir(parents=True)
    return path


def test_a_file_two_distributions_own_is_one_clash_with_the_bytes_on_disk(site):
    _dist(site, "alpha-1.0.dist-info", {"shared/mod.py": b"alpha\n", "alpha/own.py": b"a\n",
                                        "../../../bin/tool": b"#!alpha\n"},
          extra_lines=["shared/__pycache__/mod.cpython-311.pyc,,", "shared/old.pyc,,"])
    _dist(site, "beta_pkg-2.0.post1.dist-info", {"shared/mod.py": b"beta, longer\n", "beta/own.py": b"b\n",
                                                 "../../../bin/tool": b"#!beta, longer\n"},
          extra_lines=["shared/__pycache__/mod.cpython-311.pyc,,", "shared/old.pyc,,"])
    # beta installed last: its bytes of both shared files are on disk (the fixture wrote in order)
    owners = find_file_clashes([str(site)])
    assert owners.distributions == 2 and owners.unread == {}
    (clash,) = owners.clashes
    assert (clash.first.name, clash.first.version) == ("alpha", "1.0")
    assert (clash.second.name, clash.second.version) == ("beta-pkg", "2.0.post1")
    # the .py and the command in bin/ (../ normalized); no .pyc, no __pycache__, no dist-info file
    assert clash.count == 2 and clash.differing == 2
    assert clash.paths == tuple(sorted([str((site / "../../../bin/tool").resolve()), "shared/mod.py"]))
    assert clash.on_disk == "beta-pkg" and clash.probe == "shared/mod.py"  # the smaller of the two
    assert "beta-pkg's bytes are on disk" in clash.on_disk_text()


def test_the_first_installed_bytes_and_modified_bytes(site):
    _dist(site, "alpha-1.0.dist-info", {"shared/mod.py": b"alpha\n"})
    _dist(site, "beta-2.0.dist-info", {"shared/mod.py": b"beta\n"}, on_disk=False)
    (clash,) = find_file_clashes([str(site)]).clashes
    assert clash.on_disk == "alpha"
    (site / "shared" / "mod.py").write_bytes(b"edited by hand\n")
    (clash,) = find_file_clashes([str(site)]).clashes
    assert clash.on_disk == "neither" and "modified after install" in clash.on_disk_text()
    (site / "shared" / "mod.py").unlink()
    (clash,) = find_file_clashes([str(site)]).clashes
    assert clash.on_disk is None and "not decided" in clash.on_disk_text()


def test_identical_bytes_are_reported_as_such(site):
    _dist(site, "alpha-1.0.dist-info", {"shared/LICENSE": b"same\n", "shared/a.py": b"a\n"})
    _dist(site, "beta-2.0.dist-info", {"shared/LICENSE": b"same\n", "shared/b.py": b"b\n"})
    (clash,) = find_file_clashes([str(site)]).clashes
    assert (clash.count, clash.differing, clash.paths) == (1, 0, ("shared/LICENSE",))
    assert clash.on_disk is None and clash.on_disk_text() == "same bytes either way"


def test_no_shared_file_no_clash_and_pyc_dist_info_entries_do_not_count(site):
    _dist(site, "alpha-1.0.dist-info", {"alpha/__init__.py": b""},
          extra_lines=["ns/__pycache__/x.cpython-311.pyc,,", "other-9.dist-info/RECORD,,", "ns/y.pyc,,"])
    _dist(site, "beta-2.0.dist-info", {"beta/__init__.py": b""},
          extra_lines=["ns/__pycache__/x.cpython-311.pyc,,", "other-9.dist-info/RECORD,,", "ns/y.pyc,,"])
    owners = find_file_clashes([str(site)])
    assert owners.distributions == 2 and owners.clashes == []


def test_quoted_paths_and_three_owners(site):
    data = b"x\n"
    for name in ("a-1.dist-info", "b-1.dist-info", "c-1.dist-info"):
        _dist(site, name, {"pkg/plain.py": data}, extra_lines=[f'"pkg/with,comma.py",{_sha(data)},{len(data)}'])
    clashes = find_file_clashes([str(site)]).clashes
    assert [(c.first.name, c.second.name) for c in clashes] == [("a", "b"), ("a", "c"), ("b", "c")]
    assert all(c.count == 2 and c.paths == ("pkg/plain.py", "pkg/with,comma.py") for c in clashes)


def test_site_dirs_and_distributions_without_a_record(site, tmp_path):
    _dist(site, "alpha-1.0.dist-info", {"alpha/__init__.py": b""})
    egg = site / "legacy-0.1-py3.11.egg-info"
    egg.mkdir()
    (egg / "top_level.txt").write_text("legacy\nlegacy_ext\n")
    broken = site / "gone-1.0.dist-info"
    broken.mkdir()
    source = tmp_path / "src"
    (source / "proj.egg-info").mkdir(parents=True)  # a source tree with its develop metadata: not a site
    assert site_dirs([str(source), str(site), str(site), str(tmp_path / "missing"), "/nonexistent.zip"]) \
        == [str(site.resolve())]
    owners = find_file_clashes([str(site)])
    assert owners.distributions == 1
    assert owners.unread == {str(egg.resolve()): "an egg-info has no RECORD; top-level names: legacy, legacy_ext",
                             str(broken.resolve()): "no RECORD"}


# ---- the known-clash rows (vllm_compat.known_clashes) ----

def _cuda_site(site, python_version: str):
    runtime = "cuda/bindings/runtime.cpython-311-x86_64-linux-gnu.so"
    _dist(site, "cuda_bindings-13.5.0.dist-info", {runtime: b"13.5 runtime\n", "cuda/bindings/__init__.py": b"13\n"})
    _dist(site, f"cuda_python-{python_version}.dist-info", {runtime: b"12.6 runtime\n",
                                                            "cuda/bindings/__init__.py": b"12\n"})
    return find_file_clashes([str(site)])


def test_the_known_cuda_python_clash_names_its_override(site):
    owners = _cuda_site(site, "12.6.2.post1")
    (clash,) = owners.clashes
    assert (clash.first.label, clash.second.label) == ("cuda-bindings 13.5.0", "cuda-python 12.6.2.post1")
    assert clash.on_disk == "cuda-python"  # installed last here
    lines = "\n".join(file_clash_lines(owners))
    assert "-> override: cuda-python==13.4.4 (the monolithic cuda-python 12.x wheel ships" in lines
    data = file_clashes_dict(owners)
    assert data["overrides"] == ["cuda-python==13.4.4"]
    assert data["clashes"][0]["override"] == "cuda-python==13.4.4" and data["clashes"][0]["harmless"] is False


def test_a_clash_outside_a_rows_range_is_unknown(site):
    owners = _cuda_site(site, "13.4.4")  # no 13.x release has the clash; a made-up one is not the row's
    (clash,) = owners.clashes
    assert known_clash(clash) is None
    assert "-> unknown clash" in "\n".join(file_clash_lines(owners))
    assert file_clashes_dict(owners)["overrides"] == []


@pytest.mark.parametrize("installed_last, harmless", [("cu13", True), ("base", False)])
def test_an_overlay_is_harmless_only_while_its_bytes_are_on_disk(site, installed_last, harmless):
    row = next(r for r in KNOWN_CLASHES if r.wins)
    layer = {"base": (row.first if row.wins == row.second else row.second), "cu13": row.wins}
    order = ["base", "cu13"] if installed_last == "cu13" else ["cu13", "base"]
    for which in order:
        _dist(site, f"{layer[which].replace('-', '_')}-4.5.2.dist-info", {"pkg/lib.py": which.encode()})
    (clash,) = find_file_clashes([str(site)]).clashes
    assert clash.on_disk == layer[installed_last]
    assert known_clash(clash) is row and row.is_harmless_for(clash) is harmless
    lines = "\n".join(file_clash_lines(find_file_clashes([str(site)])))
    assert ("-> known, harmless" if harmless else "-> known, NOT harmless here") in lines
    fix = None if harmless else f"{row.wins}==4.5.2"  # the overlay, reinstalled, puts its bytes back
    assert file_clashes_dict(find_file_clashes([str(site)]))["reinstall"] == ([fix] if fix else [])
    assert (f"-> fix: uv pip install --reinstall --no-deps {fix}" in lines) is bool(fix)


def test_every_row_is_well_formed():
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    for row in KNOWN_CLASHES:
        SpecifierSet(row.first_range), SpecifierSet(row.second_range)
        assert row.first != row.second and re.search(r"\b20\d\d-\d\d-\d\d\b", row.reason), "say when it was measured"
        assert (row.override is None) == row.harmless, f"{row.first}/{row.second}: a fix or harmless, not both"
        if row.override:
            assert Requirement(row.override).name in (row.first, row.second)
            assert "==" in row.override  # an exact release, as every override (docs/dependency-drift.md)
        assert row.wins in (None, row.first, row.second)


# ---- wiring: the doctor's dependency report ----

def test_the_dependency_report_carries_the_clashes_and_reads_them_only_when_shown(site):
    _cuda_site(site, "12.6.2.post1")
    calls = []

    def finder():
        calls.append(1)
        return find_file_clashes([str(site)])

    drift = DependencyDrift(("vllm", "0.33.0"), ("vllm-omni", "0.30.0"), _file_clashes=finder)
    assert drift.ok and drift.override_lines == [] and not calls  # what the short screen reads
    lines = drift.render_lines()
    assert calls == [1]
    assert lines[0] == "  dependencies: no conflict (Requires-Dist of vllm 0.33.0, vllm-omni 0.30.0)"
    assert lines[1].startswith("  files: 1 pair(s) of distributions install the same files")
    assert "    -> override: cuda-python==13.4.4 (" in "\n".join(lines)
    assert drift.to_dict()["file_clashes"]["overrides"] == ["cuda-python==13.4.4"] and calls == [1]
    assert DependencyDrift(("vllm", "0.33.0"), ("vllm-omni", "0.30.0")).to_dict()["file_clashes"] is None


def test_no_clash_says_what_was_read(site):
    _dist(site, "alpha-1.0.dist-info", {"alpha/__init__.py": b""})
    assert file_clash_lines(find_file_clashes([str(site)])) == [
        "  files: no two distributions install the same file (RECORDs of 1 distributions)"]
