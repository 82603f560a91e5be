"""``vllm-compat check``'s resolution (``vllm_compat.resolution``): the real ``uv pip compile`` against PyPI, the
real wheels' listings by range requests, the clashes judged by their ``known_clashes`` rows.

No stand-in for the resolver or the index. The oracles are what was measured outside this code:
- ``python-dateutil==2.9.0.post0`` + ``six==1.16.0`` resolve to exactly those two (python-dateutil's only
  requirement is ``six>=1.5``); six's listing equals the zip read from its whole downloaded wheel (11 KB);
- ``six==0.0.99`` was never released;
- opencv-python and opencv-python-headless of one release both ship ``cv2/`` (the known_clashes row's reason,
  measured in two cell envs);
- ``uv pip compile vllm==0.33.0 vllm-omni==0.24.0`` picked cuda-python 12.6.2.post1 beside cuda-bindings 13.5.0
  on 2026-12-04/05, both RECORDs listing the same 28 files (issue 33, read from the installed RECORDs), and
  cuda-python 13.4.4 removes the clash (the serve cells install with it); vLLM 0.34.0 pins
  flashinfer-python==0.7.3, which the index lacks (2026-12-05).
Where today's resolution no longer shows a measured finding, the test skips and says what the resolver picks now.

Tests marked ``network`` skip when PyPI or uv is not reachable here. The suite turns the check's resolution off
(tests/conftest.py, ``VLLM_COMPAT_NO_RESOLVE``); these tests turn it back on.
"""

from __future__ import annotations

import ctypes.util
import io
import json
import shutil
import sys
import urllib.request
import zipfile

import pytest

from vllm_compat.check import NO_RESOLVE_VAR
from vllm_compat.cli import main
from vllm_compat.resolution import compile_pair, resolve_pair


def _pypi_unreachable() -> str | None:
    """Why the real index cannot be used here, or None."""
    if shutil.which("uv") is None:
        return "uv is not on PATH (the resolution runs `uv pip compile`)"
    try:
        with urllib.request.urlopen("https://pypi.org/simple/six/", timeout=15) as response:
            response.read(1)
    except OSError as exc:
        return f"PyPI is not reachable from here ({exc})"
    return None


UNREACHABLE = _pypi_unreachable()


def network(test):
    """Marked ``network`` (``-m "not network"`` leaves it out) and skipped, with the reason, where PyPI or uv is
    not reachable."""
    skip = pytest.mark.skipif(UNREACHABLE is not None, reason=f"network test: {UNREACHABLE}")
    return pytest.mark.network(skip(test))


@pytest.fixture
def resolving(monkeypatch):
    """The check resolves (the suite's conftest turned it off)."""
    monkeypatch.delenv(NO_RESOLVE_VAR, raising=False)


def test_without_uv_the_resolution_is_skipped_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no uv on it
    resolution = resolve_pair(["six==1.16.0"], [], tmp_path)
    assert resolution.status == "skipped" and resolution.findings == [] and resolution.override_lines == []
    assert "uv is not on PATH" in resolution.short_text()
    assert resolution.to_dict()["status"] == "skipped"


@network
def test_uv_resolves_a_small_real_pair_and_its_wheels_are_listed(tmp_path):
    compiled = compile_pair(["python-dateutil==2.9.0.post0", "six==1.16.0"], [], tmp_path)
    assert compiled.status == "resolved", compiled.reason
    assert {name: version for name, version, _ in compiled.packages} == {"python-dateutil": "2.9.0.post0",
                                                                         "six": "1.16.0"}
    six = next(w for w in compiled.wheels if w.name == "six")
    assert six.filename == "six-1.16.0-py2.py3-none-any.whl" and six.url.startswith("https://")
    with urllib.request.urlopen(six.url, timeout=60) as response:
        whole = response.read()
    import hashlib

    assert hashlib.sha256(whole).hexdigest() == six.sha256 and len(whole) == six.size
    expected = {i.filename: i.CRC for i in zipfile.ZipFile(io.BytesIO(whole)).infolist() if not i.is_dir()}
    resolution = resolve_pair(["python-dateutil==2.9.0.post0", "six==1.16.0"], [], tmp_path)
    first = resolution.first
    assert first.listed == 2 and first.unlisted == {} and resolution.findings == []
    cached = json.loads(next((tmp_path / "listings").glob(f"{six.sha256}.json")).read_text())
    assert dict(cached["files"]) == expected  # listed without downloading the wheel
    again = compile_pair(["python-dateutil==2.9.0.post0", "six==1.16.0"], [], tmp_path)
    assert again.cached and again.packages == compiled.packages  # the day's answer, kept
    assert "no file clash" in resolution.short_text()


@network
def test_the_wheel_listed_is_the_one_an_installer_picks(tmp_path):
    # aiohttp 3.14.5 ships a compiled wheel for this CPython and a pure one (py3-none-any); pip and uv install the
    # compiled one (the more specific tag), so that is the one to list
    compiled = compile_pair(["aiohttp==3.14.5"], [], tmp_path)
    assert compiled.status == "resolved", compiled.reason
    (aiohttp,) = [w for w in compiled.wheels if w.name == "aiohttp"]
    assert f"-cp{sys.version_info[0]}{sys.version_info[1]}-" in aiohttp.filename, aiohttp.filename


@network
def test_a_pin_the_index_lacks_is_a_finding(tmp_path):
    compiled = compile_pair(["six==0.0.99"], [], tmp_path)
    assert compiled.status == "unresolvable" and compiled.missing == ["six==0.0.99"]
    assert compiled.reason.startswith("Because") and "\n" not in compiled.reason


@network
def test_two_builds_of_one_package_clash_and_their_row_judges_them(tmp_path):
    pair = ["opencv-python==4.10.0.84", "opencv-python-headless==4.10.0.84"]
    resolution = resolve_pair(pair, [], tmp_path)
    assert resolution.status == "resolved", resolution.first.compiled.reason
    (finding,) = [f for f in resolution.findings
                  if {f.clash.first.name, f.clash.second.name} == {"opencv-python", "opencv-python-headless"}]
    assert finding.clash.count > 1 and all(p.startswith("cv2/") for p in finding.clash.paths)
    assert finding.row is not None and finding.row.needs_library == "GL"
    assert finding.action == ("harmless" if ctypes.util.find_library("GL") else "not_harmless")
    assert resolution.first.fetched_bytes < 2_000_000  # two ~60 MB wheels (and numpy) listed from their ends


# ------------------------------------------------------------------------------------------------ the real pair


@network
def test_vllm_033_with_omni_024_resolves_to_the_cuda_clash_and_its_override_removes_it():
    resolution = resolve_pair(["vllm==0.33.0", "vllm-omni==0.24.0"], [])
    compiled = resolution.first.compiled
    assert compiled.status == "resolved", compiled.reason
    python, bindings = compiled.version_of("cuda-python"), compiled.version_of("cuda-bindings")
    from packaging.version import Version

    if python is None or bindings is None or not (Version(python) < Version("13") <= Version(bindings)):
        pytest.skip(f"today's resolution of vllm==0.33.0 vllm-omni==0.24.0 no longer picks the measured pair "
                    f"(cuda-python 12.6.2.post1 beside cuda-bindings 13.5.0): cuda-python {python}, cuda-bindings "
                    f"{bindings}; the finding cannot be shown today")
    (finding,) = [f for f in resolution.findings
                  if {f.clash.first.name, f.clash.second.name} == {"cuda-python", "cuda-bindings"}]
    assert finding.action == "override" and finding.fix == "cuda-python==13.4.4"
    assert finding.row.first == "cuda-python" and finding.row.second == "cuda-bindings"
    assert finding.clash.count == 28 and any(p.startswith("cuda/bindings/") for p in finding.clash.paths)
    assert resolution.override_lines == ["cuda-python==13.4.4"]
    # checked, not assumed: resolved again with the line, cuda-python is 13.4.4 and nothing clashes but harmless
    assert resolution.fix is not None and resolution.fix_ok(), resolution.fix_text()
    assert resolution.fix.compiled.version_of("cuda-python") == "13.4.4"
    assert all(f.action == "harmless" for f in resolution.fix.findings)


@network
def test_check_names_and_writes_the_clash_override(tmp_path, capsys, resolving):
    target = tmp_path / "overrides.txt"
    code = main(["check", "vllm==0.33.0", "vllm-omni==0.24.0", "--overrides", str(target)])
    screen = capsys.readouterr().out
    lines = screen.splitlines()
    assert len(lines) <= 25 and max(map(len, lines)) <= 100, screen
    (start,) = [i for i, line in enumerate(lines) if line.startswith("  dependencies: ")]
    said = " ".join(" ".join(lines[start:start + 2]).split())  # the dependencies line, wrapped or not
    if "cuda-python==13.4.4" not in said:
        pytest.skip(f"today's resolution names no cuda-python override: {said}")
    assert said.startswith("dependencies: no conflict; uv resolves ")
    assert "packages, 1 file clash -> override cuda-python==13.4.4" in said
    assert "install: uv pip install vllm==0.33.0 vllm-omni==0.24.0 --override overrides.txt" in screen
    written = target.read_text().splitlines()
    assert written[-1] == "cuda-python==13.4.4"
    assert written[-3].startswith("# file clash: cuda-bindings ") and "cuda-python 12." in written[-3]
    assert written[-2].startswith("# known_clashes: the monolithic cuda-python 12.x wheel")
    # the verdict and exit code are those of the check without the resolution (the conflicts' rule)
    code_without = main(["check", "--no-resolve", "vllm==0.33.0", "vllm-omni==0.24.0", "--overrides",
                         str(tmp_path / "plain.txt")])
    plain = capsys.readouterr().out
    assert code == code_without and "uv resolves" not in plain and "  dependencies: no conflict\n" in plain
    assert "cuda-python" not in (tmp_path / "plain.txt").read_text()
    code = main(["check", "--json", "--no-resolve", "vllm==0.33.0", "vllm-omni==0.24.0"])
    assert json.loads(capsys.readouterr().out)["dependency_drift"]["resolution"] is None


@network
def test_check_json_has_the_resolution_and_local_wheels_are_not_resolved(capsys, resolving):
    main(["check", "--json", "vllm==0.33.0", "vllm-omni==0.24.0"])
    data = json.loads(capsys.readouterr().out)
    resolution = data["dependency_drift"]["resolution"]
    assert resolution["status"] == "resolved" and resolution["command"].startswith("uv pip compile")
    assert resolution["requirements"] == ["vllm==0.33.0", "vllm-omni==0.24.0"]
    assert resolution["listed"] + len(resolution["no_wheel"]) + len(resolution["unlisted"]) == resolution["resolved"]
    for key in ("resolve_seconds", "list_seconds", "seconds", "fetched_bytes", "clashes", "fix", "date"):
        assert key in resolution
    inputs = data["inputs"]
    main(["check", "--json", inputs["vllm"]["location"], inputs["vllm_omni"]["location"]])
    offline = json.loads(capsys.readouterr().out)
    assert offline["dependency_drift"] is None or offline["dependency_drift"]["resolution"] is None


@network
def test_vllm_034_pins_a_flashinfer_the_index_lacks(tmp_path):
    resolution = resolve_pair(["vllm==0.34.0", "vllm-omni==0.24.0"], ["huggingface-hub==2.4.0"])
    compiled = resolution.first.compiled
    if compiled.status == "resolved":
        pytest.skip(f"vllm==0.34.0 resolves today (flashinfer-python {compiled.version_of('flashinfer-python')}): "
                    f"the index has its pin now")
    assert compiled.status == "unresolvable" and "flashinfer-python==0.7.3" in compiled.missing
    assert "uv: NO SOLUTION, flashinfer-python==0.7.3 not on the index" in resolution.short_text()
    assert resolution.override_lines == [] and resolution.fix is None  # no cell's line given: nothing to try


@network
def test_a_missing_pin_takes_the_line_a_cell_installs_instead_and_the_pair_then_resolves(tmp_path):
    """vLLM 0.34.0 + vllm-omni 0.30.0 (the matrix's conflict overrides): the index lacks flashinfer-python 0.7.3;
    the cells of the pair install 0.7.4 (index_overrides); with it the pair resolves, and what it resolves to is
    listed and judged like any resolution."""
    tested = {"flashinfer-python==0.7.4": ("v0.34-omni0.30",), "huggingface-hub==2.4.0": ("v0.34-omni0.30",)}
    resolution = resolve_pair(["vllm==0.34.0", "vllm-omni==0.30.0"], ["huggingface-hub==2.4.0",
                                                                       "transformers==5.22.2"], tested=tested)
    if resolution.first.compiled.status == "resolved":
        pytest.skip("vllm==0.34.0 resolves today: the index has flashinfer-python 0.7.3 now")
    assert resolution.override_lines[0] == "flashinfer-python==0.7.4"
    assert resolution.fix is not None and resolution.fix.compiled.version_of("flashinfer-python") == "0.7.4"
    assert resolution.fix.listed > 200 and resolution.fix_ok() is True, resolution.fix_text()
    assert resolution.short_text().startswith("uv: flashinfer-python==0.7.3 not on the index -> overrides "
                                              "flashinfer-python==0.7.4")
    assert resolution.short_text().endswith("(tested)")
    assert "flashinfer-python==0.7.4: tested by matrix cell v0.34-omni0.30" in "\n".join(resolution.render_lines())


# ------------------------------------------------------------------------------------------------ the screen


def test_an_unknown_clash_is_said_on_the_dependencies_line_and_writes_no_override(tmp_path):
    """The judging and the lines, on two real wheels served over HTTP (tests/detect/test_wheel_listing.py's):
    alpha and beta-pkg have no known_clashes row, so the clash is unknown, the dependencies line says so, the
    exit code is not the resolution's business, and --overrides writes no line for it."""
    from tests.detect.test_wheel_listing import ALPHA, BETA, _remote, _Server, _wheel
    from vllm_compat.dependency_drift import DependencyDrift, write_overrides
    from vllm_compat.detect.file_owners import Distribution, find_listing_clashes
    from vllm_compat.detect.wheel_listing import list_wheels
    from vllm_compat.reporting import _dependency_lines
    from vllm_compat.resolution import Compiled, Resolution, Resolved, judge

    root = tmp_path / "index"
    root.mkdir()
    server = _Server(root)
    try:
        wheels = [_remote(server, "alpha", "1.0", _wheel(root / "alpha-1.0-py3-none-any.whl", ALPHA)),
                  _remote(server, "beta-pkg", "2.0", _wheel(root / "beta_pkg-2.0-py3-none-any.whl", BETA))]
        read = list_wheels(wheels, tmp_path / "cache")
    finally:
        server.close()
    clashes = find_listing_clashes([(Distribution(i.wheel.name, i.wheel.version, i.wheel.filename), i.files)
                                    for i in read.listings])
    packages = [(w.name, w.version, w) for w in wheels]
    compiled = Compiled("resolved", ["uv", "pip", "compile"], ["alpha==1.0", "beta-pkg==2.0"], [], packages)
    resolution = Resolution(Resolved(compiled, listed=2, findings=[judge(c) for c in clashes]))
    (finding,) = resolution.findings
    assert finding.action == "unknown" and finding.row is None and resolution.override_lines == []
    drift = DependencyDrift(("alpha", "1.0"), ("beta-pkg", "2.0"), resolution=resolution)
    lines = _dependency_lines(drift, 100)
    assert " ".join(" ".join(lines).split()) == (
        "dependencies: no conflict; uv resolves 2 packages, UNKNOWN file clash alpha 1.0 / beta-pkg 2.0 (4 files)")
    assert all(len(line) <= 100 for line in lines)
    verbose = "\n".join(drift.render_lines())
    assert "-> UNKNOWN clash: which bytes run depends on install order" in verbose
    target = tmp_path / "overrides.txt"
    assert write_overrides(target, drift) == 0 and len(target.read_text().splitlines()) == 1  # the header only
