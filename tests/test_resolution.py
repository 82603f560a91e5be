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
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

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


def overrides_file(path) -> tuple[list[str], dict[str, list[str]]]:
    """(the header comments, ``{line: [its comment lines]}``) of a file ``check --overrides`` wrote, comments
    without their "# "; the header is the first two comments (the pair; verified or not, and why)."""
    comments = [text[2:] for text in path.read_text().splitlines()[:2]]
    assert all(path.read_text().splitlines()[i].startswith("# ") for i in range(2)), path.read_text()
    found: dict[str, list[str]] = {}
    pending: list[str] = []
    for text in path.read_text().splitlines()[2:]:
        if text.startswith("# "):
            pending.append(text[2:])
        elif text.strip():
            found[text.strip()], pending = pending, []
    return comments, found


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
    header, written = overrides_file(target)
    assert list(written) == ["cuda-python==13.4.4"] and header[1].startswith("verified: uv resolved the pair")
    (clash, row, cell) = written["cuda-python==13.4.4"]
    assert clash.startswith("file clash: cuda-bindings ") and "cuda-python 12." in clash
    assert row.startswith("known_clashes: the monolithic cuda-python 12.x wheel")
    assert cell.startswith("matrix: vLLM's pinned CUDA torch")  # the serve cell's own reason for the line
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
    tested = {"flashinfer-python==0.7.4": ("v0.34-omni0.30",), "huggingface-hub==2.4.0": ("v0.34-omni0.30",),
              "cuda-python==13.4.4": ("v0.34-omni0.30-serve",)}
    resolution = resolve_pair(["vllm==0.34.0", "vllm-omni==0.30.0"], ["huggingface-hub==2.4.0",
                                                                       "transformers==5.22.2"], tested=tested)
    if resolution.first.compiled.status == "resolved":
        pytest.skip("vllm==0.34.0 resolves today: the index has flashinfer-python 0.7.3 now")
    assert resolution.override_lines[0] == "flashinfer-python==0.7.4"
    assert resolution.fix is not None and resolution.fix.compiled.version_of("flashinfer-python") == "0.7.4"
    assert resolution.fix.listed > 200 and resolution.fix_ok() is True, resolution.fix_text()
    # the round with flashinfer-python==0.7.4 showed the cuda-python / cuda-bindings clash on 2026-12-06: its line
    # is the round after's, and both are said (each line of every round, issue 39)
    clash = ", 1 file clash" if "cuda-python==13.4.4" in resolution.override_lines else ""
    assert resolution.short_text().startswith(f"uv: flashinfer-python==0.7.3 not on the index{clash} -> overrides "
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
    assert write_overrides(target, drift) == 0
    header, written = overrides_file(target)  # the header only, saying the install is not verified
    assert written == {} and header[1] == "UNVERIFIED: a file clash is left: alpha 1.0 / beta-pkg 2.0 (unknown)"


def test_the_clashes_of_a_set_of_wheels_are_kept_and_a_changed_wheel_is_listed_again(tmp_path, monkeypatch):
    """A second resolution picking the same wheels (the next round, the next check, any day) reads their clashes as
    kept instead of reading and keying every listing again (a warm check of vLLM 0.34.0 + vllm-omni 0.24.0: 0.5 s
    of 0.8); a wheel with other bytes is another set, listed again."""
    from tests.detect.test_wheel_listing import ALPHA, BETA, _remote, _Server, _wheel
    from vllm_compat import resolution
    from vllm_compat.detect import wheel_listing
    from vllm_compat.resolution import Compiled, resolve_and_list

    root = tmp_path / "index"
    root.mkdir()
    server = _Server(root)
    listed = []
    list_wheels = wheel_listing.list_wheels

    def counted(wheels, directory=None, *args, **kwargs):
        listed.append([w.filename for w in wheels])
        return list_wheels(wheels, directory, *args, **kwargs)

    def resolved_as(wheels):
        packages = [(w.name, w.version, w) for w in wheels]
        monkeypatch.setattr(resolution, "compile_pair", lambda *a, **k: Compiled(
            "resolved", ["uv"], ["alpha==1.0", "beta-pkg==2.0"], [], packages))  # ours: uv's step, not vLLM's
        return resolve_and_list(["alpha==1.0", "beta-pkg==2.0"], [], tmp_path / "cache")

    monkeypatch.setattr(wheel_listing, "list_wheels", counted)
    try:
        alpha = _remote(server, "alpha", "1.0", _wheel(root / "alpha-1.0-py3-none-any.whl", ALPHA))
        beta = _remote(server, "beta-pkg", "2.0", _wheel(root / "beta_pkg-2.0-py3-none-any.whl", BETA))
        first = resolved_as([alpha, beta])
        again = resolved_as([beta, alpha])  # the same set, in another order
        # beta rebuilt with alpha's shared/mod.py: same file name, other bytes (sha256)
        rebuilt = _remote(server, "beta-pkg", "2.0", _wheel(root / "beta_pkg-2.0-py3-none-any.whl",
                                                             {**BETA, "shared/mod.py": ALPHA["shared/mod.py"]}))
        changed = resolved_as([alpha, rebuilt])
    finally:
        server.close()
    assert len(listed) == 2  # the first set and the changed one; not the second asking
    (clash,) = [f.clash for f in first.findings]
    assert (clash.count, clash.differing) == (4, 3)  # as tests/detect/test_wheel_listing.py counts them
    assert [f.to_dict() for f in again.findings] == [f.to_dict() for f in first.findings]
    assert again.listed == first.listed == 2 and again.listings_cached == 2 and again.requests == 0
    (changed_clash,) = [f.clash for f in changed.findings]
    assert (changed_clash.count, changed_clash.differing) == (4, 2)  # shared/mod.py now the same bytes


# ------------------------------------------------------------------- the overrides file: every line, each with why

# vLLM 0.34.0 + vllm-omni 0.24.0 as uv resolved it on 2026-12-06 (issue 39): with huggingface-hub==2.4.0 alone,
# no solution (flashinfer-python==0.7.3 not on the index); with flashinfer-python==0.7.4 too, cuda-python
# 12.6.2.post1 beside cuda-bindings 13.5.0 (28 shared files); with cuda-python==13.4.4 too, no clash.
HUB, FLASHINFER, CUDA = "huggingface-hub==2.4.0", "flashinfer-python==0.7.4", "cuda-python==13.4.4"
PAIR_034_024 = ["vllm==0.34.0", "vllm-omni==0.24.0"]


def _rounds_of_034_024(last_status: str = "resolved"):
    """``resolution.resolve_and_list`` answering as uv and the listings did for the pair, by override lines."""
    from vllm_compat.detect.file_owners import Distribution, find_listing_clashes
    from vllm_compat.resolution import Compiled, Resolved, judge

    shared = {f"cuda/bindings/runtime{i}.so": i for i in range(28)}
    clashes = find_listing_clashes([
        (Distribution("cuda-python", "12.6.2.post1", "cuda_python-12.6.2.post1-cp311-cp311-manylinux.whl"), shared),
        (Distribution("cuda-bindings", "13.5.0", "cuda_bindings-13.5.0-cp311-cp311-manylinux.whl"),
         {path: crc + 1 for path, crc in shared.items()})])
    seen = []

    def resolve_and_list(requirements, overrides, directory=None, cache_only=None):
        seen.append(list(overrides))
        if FLASHINFER not in overrides:
            return Resolved(Compiled("unresolvable", ["uv"], requirements, overrides, missing=[
                "flashinfer-python==0.7.3"], reason="Because there is no version of flashinfer-python==0.7.3 ...",
                date="2026-12-06"))
        if CUDA not in overrides:
            return Resolved(Compiled("resolved", ["uv"], requirements, overrides, date="2026-12-06"), listed=261,
                            findings=[judge(c) for c in clashes])
        if last_status != "resolved":
            return Resolved(Compiled(last_status, ["uv"], requirements, overrides, reason="uv said no",
                                     date="2026-12-06"))
        return Resolved(Compiled("resolved", ["uv"], requirements, overrides, date="2026-12-06"), listed=261)

    return resolve_and_list, seen


def _compiled_ahead(monkeypatch) -> dict:
    """``resolution.compile_pair`` as ``compile_ahead`` calls it, recorded: {frozenset(lines added): whether its
    answer was done}; each takes a moment, so a round that did not wait for it finds it not done."""
    import time

    from vllm_compat import resolution as resolution_module

    done = {}

    def compile_pair(requirements, overrides, directory=None, **kwargs):
        lines = frozenset(overrides) - {HUB}
        done[lines] = False
        time.sleep(0.2)
        done[lines] = True
        return resolution_module.Compiled("resolved", ["uv"], requirements, overrides, date="2026-12-06")

    monkeypatch.setattr(resolution_module, "compile_pair", compile_pair)
    monkeypatch.setattr(resolution_module, "uv_path", lambda: "/usr/bin/uv")
    return done


def test_the_rounds_uv_answers_are_compiled_while_the_first_round_runs(monkeypatch):
    """Each combination of the pair's tested lines not among the conflict overrides is compiled from the start,
    beside the first round; a round waits for its own before it resolves (reading it from the day's cache)."""
    from vllm_compat import resolution as resolution_module

    done = _compiled_ahead(monkeypatch)
    fake, seen = _rounds_of_034_024()
    found_done = []

    def resolve_and_list(requirements, overrides, directory=None, cache_only=None):
        found_done.append(done.get(frozenset(overrides) - {HUB}))
        return fake(requirements, overrides, directory, cache_only)

    monkeypatch.setattr(resolution_module, "resolve_and_list", resolve_and_list)
    resolution = resolve_pair(PAIR_034_024, [HUB], tested={HUB: ("c",), FLASHINFER: ("c",), CUDA: ("c",)})
    assert seen == [[HUB], [HUB, FLASHINFER], [HUB, FLASHINFER, CUDA]]
    assert set(done) == {frozenset({FLASHINFER}), frozenset({CUDA}), frozenset({FLASHINFER, CUDA})}
    assert found_done == [None, True, True]  # the first round compiles itself; the others waited for theirs
    assert resolution.override_lines == [FLASHINFER, CUDA]
    assert resolution_module.compile_ahead(PAIR_034_024, [HUB], {HUB: ("c",)}) == {}  # nothing to add: none


def _drift_034_024(resolution):
    from vllm_compat.dependency_drift import Conflict, DependencyDrift, Want, tested_reasons

    hub = Conflict("huggingface-hub", Want("vllm 0.34.0", ">=2.0.0"),
                   (Want("diffusers 0.38.0 (pinned by vllm-omni 0.24.0)", "<2.0,>=0.34.0"),), override=HUB,
                   override_range=">=2.0.0", source="tested", proven_by=("v0.34-omni0.24",))
    return DependencyDrift(("vllm", "0.34.0"), ("vllm-omni", "0.24.0"), conflicts=[hub], resolution=resolution,
                           for_install=True, cell_reasons=tested_reasons(("vllm", "0.34.0"), ("vllm-omni", "0.24.0")))


def test_the_overrides_file_holds_every_line_the_verifying_resolution_used(tmp_path, monkeypatch):
    """The file ``check --overrides`` wrote for vLLM 0.34.0 + vllm-omni 0.24.0 held huggingface-hub and flashinfer
    but not cuda-python==13.4.4, the line of the middle round, although the last round was resolved with it; an
    env installed from it got both cuda wheels (25 files differing) and its serving CLI died at import."""
    from vllm_compat import resolution as resolution_module
    from vllm_compat.dependency_drift import write_overrides
    from vllm_compat.reporting import _dependency_lines

    fake, seen = _rounds_of_034_024()
    monkeypatch.setattr(resolution_module, "resolve_and_list", fake)
    _compiled_ahead(monkeypatch)
    resolution = resolve_pair(PAIR_034_024, [HUB], tested={HUB: ("v0.34-omni0.24",),
                                                          FLASHINFER: ("v0.34-omni0.24-serve",),
                                                          CUDA: ("v0.34-omni0.24-serve",)})
    assert seen == [[HUB], [HUB, FLASHINFER], [HUB, FLASHINFER, CUDA]]  # three rounds, as uv needed them
    drift = _drift_034_024(resolution)
    target = tmp_path / "overrides.txt"
    assert write_overrides(target, drift) == 3
    header, written = overrides_file(target)
    assert list(written) == [HUB, FLASHINFER, CUDA] == resolution.last.compiled.overrides
    assert header[1].startswith("verified: uv resolved the pair with these lines (2026-12-06)")
    assert written[HUB][0].startswith("huggingface-hub: vllm 0.34.0 needs >=2.0.0")
    assert written[FLASHINFER][0].startswith("not on the index: flashinfer-python==0.7.3")
    assert written[FLASHINFER][1].startswith("matrix: vLLM 0.34.0 pins flashinfer-python==0.7.3")
    assert written[CUDA][0].startswith("file clash: cuda-bindings 13.5.0 and cuda-python 12.6.2.post1")
    assert written[CUDA][1].startswith("known_clashes: the monolithic cuda-python 12.x wheel")
    assert written[CUDA][2].startswith("matrix: vLLM's pinned CUDA torch")
    said = " ".join(" ".join(_dependency_lines(drift, 100)).split())
    assert "flashinfer-python==0.7.3 not on the index, 1 file clash -> overrides flashinfer-python==0.7.4, " \
           "cuda-python==13.4.4 (tested)" in said
    assert "install: uv pip install vllm==0.34.0 vllm-omni==0.24.0 --override overrides.txt" in said
    data = drift.to_dict()["install"]
    assert data["overrides"] == [HUB, FLASHINFER, CUDA] and data["verified"] is True
    assert [line["kind"] for line in data["lines"]] == ["conflict", "missing pin", "file clash"]


def test_an_install_that_does_not_resolve_is_said_unverified_and_so_is_its_file(tmp_path, monkeypatch):
    from vllm_compat import resolution as resolution_module
    from vllm_compat.dependency_drift import write_overrides
    from vllm_compat.reporting import _dependency_lines

    fake, _ = _rounds_of_034_024(last_status="unresolvable")
    monkeypatch.setattr(resolution_module, "resolve_and_list", fake)
    _compiled_ahead(monkeypatch)
    drift = _drift_034_024(resolve_pair(PAIR_034_024, [HUB], tested={FLASHINFER: ("v0.34-omni0.24",)}))
    write_overrides(tmp_path / "o.txt", drift)
    header, written = overrides_file(tmp_path / "o.txt")
    assert header[1].startswith("UNVERIFIED: uv finds no solution") and list(written) == [HUB, FLASHINFER, CUDA]
    said = " ".join(" ".join(_dependency_lines(drift, 100)).split())
    assert "install, UNVERIFIED (uv finds no solution): uv pip install vllm==0.34.0 vllm-omni==0.24.0 " \
           "--override overrides.txt" in said


def test_a_pair_never_resolved_says_its_install_is_unverified_and_names_no_file_without_lines():
    """No resolution (--no-resolve, local wheels, no uv and nothing cached): the install line says UNVERIFIED;
    ``--override overrides.txt`` only where there are lines to write."""
    from vllm_compat.dependency_drift import DependencyDrift
    from vllm_compat.reporting import _dependency_lines

    drift = DependencyDrift(("vllm", "0.31.0"), ("vllm-omni", "0.24.0"), for_install=True,
                            not_resolved="the resolution was turned off")
    lines = _dependency_lines(drift, 100)
    assert [line.strip() for line in lines] == [
        "dependencies: no conflict", "install, UNVERIFIED (not resolved): uv pip install vllm==0.31.0 vllm-omni==0.24.0"]
    unverified = _drift_034_024(None)
    said = " ".join(" ".join(_dependency_lines(unverified, 100)).split())
    assert "install, UNVERIFIED (not resolved): uv pip install vllm==0.34.0 vllm-omni==0.24.0 --override " \
           "overrides.txt" in said
    # the doctor's drift (an installed pair): no install line without lines, as before
    doctor = DependencyDrift(("vllm", "0.31.0"), ("vllm-omni", "0.24.0"))
    assert [line.strip() for line in _dependency_lines(doctor, 100)] == ["dependencies: no conflict"]


# ------------------------------------------------------------------- offline: the answer of an earlier day

def _unreachable_index(monkeypatch):
    """Every request of uv and pip goes to a port nobody listens on: the index cannot be reached."""
    for var in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "https_proxy", "http_proxy", "all_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)


def _next_day(date: str) -> str:
    from datetime import date as day
    from datetime import timedelta

    return (day.fromisoformat(date) + timedelta(days=1)).isoformat()


@network
def test_offline_the_newest_earlier_answer_is_given_with_its_day(tmp_path, monkeypatch):
    from vllm_compat import resolution as resolution_module

    online = compile_pair(["six==1.16.0"], [], tmp_path)
    assert online.status == "resolved" and online.stale is None, online.reason
    later = _next_day(online.date)  # a second day's answer: the newer of the two is the one given
    monkeypatch.setattr(resolution_module, "_today", lambda: later)
    assert compile_pair(["six==1.16.0"], [], tmp_path).date == later
    monkeypatch.setattr(resolution_module, "_today", lambda: _next_day(later))
    _unreachable_index(monkeypatch)
    offline = compile_pair(["six==1.16.0"], [], tmp_path)
    assert offline.status == "resolved" and offline.cached and offline.date == later
    assert offline.packages == online.packages
    assert offline.stale.startswith("the index could not be reached (Failed to fetch")
    never = compile_pair(["six==1.15.0"], [], tmp_path)  # never resolved: uv's failure, nothing to fall back on
    assert never.status == "failed" and never.stale is None and never.reason.startswith("the index could not")


@network
def test_offline_check_gives_the_answer_it_gave_online_and_says_from_when(tmp_path, capsys, monkeypatch, resolving):
    """Issue 39: with the index unreachable, vLLM 0.34.0 + vllm-omni 0.24.0 lost its flashinfer line ("resolution
    not checked") and still printed the install line with ``--override overrides.txt``, exit 0. Checked before, it
    now gives the online answer from the cache with its day; never resolved (another index: another key), it says
    UNVERIFIED and writes only what it knows."""
    from tests.support.wheels import wheel_or_skip
    from vllm_compat import resolution as resolution_module

    wheel_or_skip("vllm", "0.34.0")
    wheel_or_skip("vllm-omni", "0.24.0")
    code = main(["check", "--json", *PAIR_034_024])
    online = json.loads(capsys.readouterr().out)["dependency_drift"]
    if not online["install"]["verified"]:
        pytest.skip(f"the pair's install is not verified online today: {online['install']['text']}")
    monkeypatch.setattr(resolution_module, "_today", lambda: _next_day(online["install"]["date"]))
    _unreachable_index(monkeypatch)
    target = tmp_path / "overrides.txt"
    assert main(["check", *PAIR_034_024, "--overrides", str(target)]) == code
    captured = capsys.readouterr()
    said = " ".join(captured.out.split())
    assert f"as resolved on {online['install']['date']} (from the cache" in said
    assert "resolution not checked" not in said
    assert "install: uv pip install vllm==0.34.0 vllm-omni==0.24.0 --override overrides.txt" in said
    header, written = overrides_file(target)
    assert list(written) == online["install"]["overrides"] and FLASHINFER in written and CUDA in written
    assert header[1].startswith(f"verified: uv resolved the pair with these lines ({online['install']['date']}, "
                                "from the cache: the index could not be reached")
    # never resolved against this index: unverified, and only the conflicts' lines are written
    monkeypatch.setenv("UV_INDEX_URL", "http://127.0.0.1:9/simple")
    assert main(["check", *PAIR_034_024, "--overrides", str(target)]) == code
    said = " ".join(capsys.readouterr().out.split())
    assert "install, UNVERIFIED (not resolved): uv pip install vllm==0.34.0 vllm-omni==0.24.0" in said
    header, written = overrides_file(target)
    assert header[1].startswith("UNVERIFIED: the pair was not resolved (the index could not be reached")
    assert list(written) == [HUB]


# ------------------------------------------------------------------- installing from the file: no clash left

def _compile_with(requirements: list[str], override: Path | None, work: Path) -> dict:
    """``uv pip compile`` run here, not through vllm_compat: the pylock.toml of ``requirements`` with ``override``."""
    tomllib = pytest.importorskip("tomllib", reason="reading pylock.toml needs Python >= 3.11")
    work.mkdir(parents=True, exist_ok=True)
    (work / "requirements.in").write_text("\n".join(requirements) + "\n")
    command = ["uv", "pip", "compile", "requirements.in", "--format", "pylock.toml", "-o", "pylock.toml",
               "--python", sys.executable, "--no-header", "--no-progress", "--color", "never"]
    if override is not None:
        command += ["--override", str(override)]
    result = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr
    return tomllib.loads((work / "pylock.toml").read_text())


def _clashes(pylock: dict, cache: Path) -> list:
    """The clashes of the wheels an installer picks for this interpreter, listed by range requests and compared
    by the project's clash detector (``detect.file_owners.find_listing_clashes``)."""
    from vllm_compat.detect.file_owners import Distribution, find_listing_clashes
    from vllm_compat.detect.wheel_listing import list_wheels
    from vllm_compat.resolution import _best_wheel, _canonical

    wheels = [w for p in pylock["packages"] if (w := _best_wheel(_canonical(p["name"]), str(p["version"]),
                                                                 p.get("wheels") or []))]
    read = list_wheels(wheels, cache)
    assert not read.errors, read.errors
    return find_listing_clashes([(Distribution(i.wheel.name, i.wheel.version, i.wheel.filename), i.files)
                                 for i in read.listings])


@network
def test_installing_034_024_from_the_written_file_leaves_no_clashing_files(tmp_path, capsys, resolving):
    """Issue 39: an env built from the file check wrote for vLLM 0.34.0 + vllm-omni 0.24.0 (vLLM's pinned CUDA
    torch) got cuda-bindings 13.5.0 beside cuda-python 12.6.2.post1. Resolved here from the file check writes now,
    by uv directly: no two wheels install one file but the known harmless pairs; the same without the file's
    cuda-python line shows the clash (the test can fail)."""
    from tests.support.wheels import wheel_or_skip
    from vllm_compat.detect.wheels import cache_dir
    from vllm_compat.known_clashes import known_clash

    wheel_or_skip("vllm", "0.34.0")
    wheel_or_skip("vllm-omni", "0.24.0")
    target = tmp_path / "overrides.txt"
    main(["check", *PAIR_034_024, "--overrides", str(target)])
    capsys.readouterr()
    header, written = overrides_file(target)
    assert header[1].startswith("verified"), header
    pylock = _compile_with(PAIR_034_024, target, tmp_path / "with")
    versions = {p["name"]: str(p["version"]) for p in pylock["packages"]}
    assert versions.get("cuda-python") == "13.4.4" and versions.get("flashinfer-python") == "0.7.4"
    left = [c for c in _clashes(pylock, cache_dir()) if not (known_clash(c) and known_clash(c).harmless)]
    assert left == [], [c.describe() for c in left]
    without = tmp_path / "without-cuda.txt"
    without.write_text("".join(f"{line}\n" for line in written if not line.startswith("cuda-python")))
    before = _compile_with(PAIR_034_024, without, tmp_path / "without")
    old = {p["name"]: str(p["version"]) for p in before["packages"]}
    if not old.get("cuda-python", "13").startswith("12."):
        pytest.skip(f"today uv resolves cuda-python {old.get('cuda-python')} without the line: the clash the file "
                    "prevents does not show today")
    names = [{c.first.name, c.second.name} for c in _clashes(before, cache_dir())]
    assert {"cuda-python", "cuda-bindings"} in names
