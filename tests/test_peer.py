"""peer/: vllm-omni's own tests stored unchanged, and the runner that judges a cell against the native pair.

The stored files are checked against the git blob ids recorded at copy time (an edited or added file fails), the
native record against the stored suite, and peer/run.py's reading of pytest's junit and its verdict on real pytest
runs of small files (the verdict's inputs are built here; its expected outputs follow from them).
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

PEER = Path(__file__).resolve().parent.parent / "peer"
RELEASES = sorted(p.name.removeprefix("vllm-omni-") for p in PEER.glob("vllm-omni-*/"))


def _load_runner():
    spec = importlib.util.spec_from_file_location("peer_run", PEER / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


run = _load_runner()


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_a_release_is_stored():
    assert "0.24.0" in RELEASES


@pytest.mark.parametrize("release", RELEASES)
def test_stored_files_are_upstream_bytes(release):
    tree = PEER / f"vllm-omni-{release}"
    provenance = tomllib.loads((tree / "PROVENANCE.toml").read_text())
    assert len(provenance["commit"]) == 40
    for path, blob in provenance["blobs"].items():
        assert git_blob_id((tree / path).read_bytes()) == blob, f"{path} differs from upstream blob {blob}"
    stored = {p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert stored - {"PROVENANCE.toml"} == set(provenance["blobs"]), "files not copied by peer/collect.py"
    for suite in ("core", "server"):
        assert provenance[suite] and set(provenance[suite]) <= set(provenance["blobs"])


@pytest.mark.parametrize("release", RELEASES)
def test_stored_tests_are_the_releases_own(release):
    """The commit's vllm_omni/ equals the release's wheel, file for file, but for _version.py (written at build
    time): peer/collect.py's evidence, recorded from the wheel."""
    provenance = run.provenance(release)
    assert provenance["identical"] == provenance["wheel_files"] - 1
    assert provenance["only_in_wheel"] == ["vllm_omni/_version.py"]
    assert provenance["differing"] == provenance["only_in_tree"] == []


def test_every_stored_release_has_a_native_record():
    assert RELEASES == sorted(r for r in RELEASES if (PEER / f"vllm-omni-{r}.native.toml").is_file())


@pytest.mark.parametrize("release", RELEASES)
def test_native_record_names_stored_tests_with_reasons(release):
    record = run.native_record(release)
    provenance = run.provenance(release)
    assert record["passed"] > 0
    for test_id, reason in record["env_failures"].items():
        assert test_id.split("::")[0] in provenance["core"], test_id
        assert len(reason) > 20 and "TODO" not in reason, test_id
    for cell, tests in record.get("left_out", {}).items():
        for test_id, reason in tests.items():
            assert test_id.split("::")[0] in provenance["core"] and reason, (cell, test_id)


SAMPLE = '''
import pytest

def test_ok():
    pass

def test_broken():
    raise KeyError("all_token_ids")

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass

class TestGroup:
    @pytest.mark.parametrize("n", [1, 2])
    def test_param(self, n):
        assert n == 1
'''


def _junit(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / "tests" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / name).write_text(text)
    (tmp_path / "tests" / "__init__.py").write_text("")
    # the layout's own config file, as the stored upstream pyproject.toml is in a real run: without one pytest takes
    # the first config above tmp_path (this repository's, where the tmp folder lies inside it) and names tests from there
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    junit = tmp_path / "junit.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:vllm_compat",
                    "--continue-on-collection-errors",
                    "-o", "junit_family=xunit1", "--junitxml", str(junit), "tests"], cwd=tmp_path,
                   capture_output=True)
    return junit


def test_outcomes_read_pytest_junit(tmp_path):
    junit = _junit(tmp_path, {"engine/__init__.py": "", "engine/test_sample.py": SAMPLE,
                              "test_uncollectable.py": "import not_a_module_anywhere\n"})
    results = run.outcomes(junit)
    assert results["tests/engine/test_sample.py::test_ok"] == ("passed", "")
    assert results["tests/engine/test_sample.py::test_broken"][0] == "failed"
    assert "all_token_ids" in results["tests/engine/test_sample.py::test_broken"][1]
    assert results["tests/engine/test_sample.py::test_skipped"][0] == "skipped"
    assert results["tests/engine/test_sample.py::TestGroup::test_param[1]"][0] == "passed"
    assert results["tests/engine/test_sample.py::TestGroup::test_param[2]"][0] == "failed"
    assert results["tests/test_uncollectable.py"][0] == "failed"


RECORD = {"passed": 3, "env_failures": {"tests/a.py::test_net": "reads the hub"},
          "left_out": {"v0.34-omni0.24": {"tests/a.py::test_v1": "vLLM 0.34 removed the V1 runner"}}}


def test_bridged_cell_reports_only_new_failures():
    results = {"tests/a.py::test_ok": ("passed", ""), "tests/a.py::test_net": ("failed", "no network"),
               "tests/a.py::test_v1": ("failed", "ModuleNotFoundError"), "tests/a.py::test_new": ("failed", "TypeError: x")}
    lines, problems = run.judge(results, RECORD, "v0.34-omni0.24", native=False)
    assert problems == ["tests/a.py::test_new: TypeError: x"]
    assert any("vLLM 0.34 removed the V1 runner" in line for line in lines)
    _, elsewhere = run.judge(results, RECORD, "v0.33-omni0.24", native=False)  # left out only where named
    assert sorted(elsewhere) == ["tests/a.py::test_new: TypeError: x", "tests/a.py::test_v1: ModuleNotFoundError"]


def test_native_pair_must_match_its_record():
    same = {"tests/a.py::test_ok": ("passed", ""), "tests/a.py::test_net": ("failed", "no network")}
    assert run.judge(same, RECORD, "v0.24-omni0.24", native=True)[1] == []
    unrecorded = {**same, "tests/a.py::test_other": ("failed", "boom")}
    assert run.judge(unrecorded, RECORD, "v0.24-omni0.24", native=True)[1] == [
        "fails natively, not in the record: tests/a.py::test_other: boom"]
    healed = {**same, "tests/a.py::test_net": ("passed", "")}  # said, not failed: some fail on load only
    lines, problems = run.judge(healed, RECORD, "v0.24-omni0.24", native=True)
    assert problems == [] and "  recorded as failing natively, passes here: tests/a.py::test_net" in lines


def test_only_judged_cells_and_the_native_pair_fail():
    record = {"judged_cells": ["v0.30-omni0.24"]}
    assert run.is_judged(record, "v0.30-omni0.24", native=False)
    assert not run.is_judged(record, "v0.31-omni0.24", native=False)  # measured later: printed, not failed
    assert run.is_judged(record, "v0.24-omni0.24", native=True)
    for release in RELEASES:  # a judged cell is a real matrix cell of the release
        for cell in run.native_record(release).get("judged_cells", ()):
            assert cell.endswith(f"-omni{release.rsplit('.', 1)[0]}"), cell
