"""``vllm-compat plan vllm-omni==X``: one row per vLLM release, each what ``vllm-compat check`` says of that pair.

On the REAL release wheels through the check's cache (``wheel_or_skip``: VLLM_COMPAT_WHEEL_CACHE, else the per-user
cache). Every cell checks vLLM 0.31.0 + vllm-omni 0.24.0 (the pair tests/test_check.py reads there anyway); the
rows over more vLLM wheels run where test_check's sweep runs (outside nox, or its first default cell). The oracles
are the single check of each pair and the matrix's measured entrypoints (matrix/vllm.toml), never the plan itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.wheels import wheel_or_skip
from vllm_compat import plan as plan_module
from vllm_compat.cli import main
from vllm_compat.detect import wheels
from vllm_compat.detect.wheels import WheelError

tomllib = pytest.importorskip("tomllib", reason="reading matrix/vllm.toml needs Python >= 3.11 (tomllib)")

ROOT = Path(__file__).resolve().parent.parent
CELLS = tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]
SWEEP_CELL = next(c["id"] for c in CELLS if c.get("default"))
more_wheels_here = pytest.mark.skipif(
    os.environ.get("VLLM_COMPAT_CELL") not in (None, SWEEP_CELL),
    reason=f"reads vLLM wheels beyond 0.31.0: runs where test_check's sweep does (nox cell {SWEEP_CELL})",
)


def _json(capsys, *args) -> tuple[int, dict]:
    code = main([*map(str, args), "--json"])
    return code, json.loads(capsys.readouterr().out)


def _cell(vllm: str, omni: str) -> dict:
    """The matrix cell of the pair that states its entrypoints (measured by importing them in that env)."""
    return next(c for c in CELLS if c["vllm"] == vllm and c.get("vllm_omni") == omni and "entrypoints" in c)


def _assert_rows_are_single_checks(capsys, omni: str, versions: list[str]) -> dict:
    for version in versions:
        wheel_or_skip("vllm", version)
    wheel_or_skip("vllm-omni", omni)
    code, planned = _json(capsys, "plan", f"vllm-omni=={omni}", "--vllm", ",".join(versions))
    assert code == 0, planned
    assert [r["vllm"] for r in planned["rows"]] == versions
    for row in planned["rows"]:
        check_code, checked = _json(capsys, "check", f"vllm=={row['vllm']}", f"vllm-omni=={omni}")
        entrypoints = checked["import_drift"]["entrypoints"]
        assert row["entrypoints"] == {i: e["status"] for i, e in entrypoints.items()}, row["vllm"]
        assert row["import_ok"] == checked["import_drift"]["import_ok"]
        assert row["drift_points"] == [p["name"] for p in checked["patches"] if p["action"] == "patched"]
        assert row["overrides"] == checked["dependency_drift"]["overrides"]
        assert (row["verdict"], row["exit_code"]) == (checked["verdict"]["kind"], check_code)
        cell = _cell(row["vllm"], omni)  # the measured answer, not derived from the code under test
        assert row["entrypoints"] == cell["entrypoints"], row["vllm"]
        assert cell["id"] in row["cells"] and row["tested"]
    return planned


def test_a_row_is_what_check_says_of_the_pair(capsys):
    planned = _assert_rows_are_single_checks(capsys, "0.24.0", ["0.31.0"])
    assert planned["own_vllm"] == "0.24.0"
    row = planned["rows"][0]
    assert row["everything_starts"] and "routed_experts_lists" in row["drift_points"]  # RoutedExpertsLists: gone in 0.31
    assert planned["newest_everything_starts"] == planned["newest_diffusion_stage_starts"] == "0.31.0"


@more_wheels_here
def test_rows_over_several_vllm_releases_are_single_checks(capsys):
    _assert_rows_are_single_checks(capsys, "0.28.0", ["0.28.0", "0.29.0", "0.30.0"])


@more_wheels_here
def test_a_vllm_older_than_vllm_omnis_own_starts_nothing_and_the_summary_skips_it(capsys):
    """vllm-omni 0.30.0 needs names vLLM 0.28 never had (README, Scope): that row imports nothing; the newest vLLM
    where everything starts is then the newer one, and the screen says NO IMPORT."""
    for version in ("0.28.0", "0.31.0"):
        wheel_or_skip("vllm", version)
    wheel_or_skip("vllm-omni", "0.30.0")
    code, planned = _json(capsys, "plan", "vllm-omni==0.30.0", "--vllm", "0.28.0,0.31.0")
    assert code == 0
    old, new = planned["rows"]
    assert not old["import_ok"] and not old["everything_starts"] and not any(old["starts"].values())
    assert old["cells"] == [] and not old["tested"]
    assert new["entrypoints"] == _cell("0.31.0", "0.30.0")["entrypoints"]
    assert planned["newest_everything_starts"] == planned["newest_diffusion_stage_starts"] == "0.31.0"
    assert main(["plan", "vllm-omni==0.30.0", "--vllm", "0.28.0,0.31.0"]) == 0
    screen = capsys.readouterr().out
    old_line = next(line for line in screen.splitlines() if line.startswith("  0.28.0 "))
    # one NO IMPORT per entrypoint column: the offline API, the server, the diffusion stage, the LLM / AR stages
    assert old_line.count("NO IMPORT") == 4 and "untested" in old_line
    assert "newest vLLM where everything starts: 0.31.0" in screen
    assert "newest where the diffusion stage starts: 0.31.0" in screen


# ------------------------------------------------------------------- one answer: plan = check --overrides

PAIRS = sorted({(c["vllm"], c["vllm_omni"]) for c in CELLS if c.get("vllm_omni")})
# the lines a cell on vLLM's pinned CUDA torch (what users install) passed with: its overrides, breakage and index
# lines; measured in the cell's install, not derived from the check
PINNED_LINES = {(c["vllm"], c["vllm_omni"]): sorted([*c.get("overrides", ()), *(o["line"] for key in (
    "breakage_overrides", "index_overrides") for o in c.get(key, ()))])
    for c in CELLS if c.get("vllm_omni") and c.get("torch") == "pinned"}


def _written(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


@more_wheels_here
@pytest.mark.parametrize("omni", sorted({o for _, o in PAIRS}))
def test_every_matrix_pair_plans_what_check_writes(capsys, tmp_path, monkeypatch, omni):
    """Issue 39: plan's override column disagreed with ``check --overrides`` on 4 of 7 pairs (0.33.0 + 0.24.0:
    0 against cuda-python==13.4.4; 0.32.0 + 0.30.0: 1 against 2; 0.34.0 + 0.30.0: 2 against 3; 0.34.0 + 0.24.0: 1
    against 2). With the resolution on, as a user runs both, every matrix pair's row is the check: its statuses,
    verdict and exit code, and exactly the lines ``check --overrides`` writes, verified or not alike. Where a cell
    of the pair ran vLLM's pinned CUDA torch and the check verified its install, the lines are that cell's
    (0.34.0 + 0.24.0: huggingface-hub, flashinfer-python and cuda-python). The resolution is uv's against the index,
    or, offline, the cached answer of an earlier day; a pair never resolved is unverified on both sides."""
    from vllm_compat.check import NO_RESOLVE_VAR

    monkeypatch.delenv(NO_RESOLVE_VAR, raising=False)
    versions = [v for v, o in PAIRS if o == omni]
    for vllm in versions:
        wheel_or_skip("vllm", vllm)
    wheel_or_skip("vllm-omni", omni)
    code, planned = _json(capsys, "plan", f"vllm-omni=={omni}", "--vllm", ",".join(versions))
    assert code == 0 and [r["vllm"] for r in planned["rows"]] == versions, planned
    unverified = []
    for row in planned["rows"]:
        pair = (row["vllm"], omni)
        target = tmp_path / f"{row['vllm']}-{omni}.txt"
        check_code, checked = _json(capsys, "check", f"vllm=={row['vllm']}", f"vllm-omni=={omni}",
                                    "--overrides", target)
        assert (row["verdict"], row["exit_code"]) == (checked["verdict"]["kind"], check_code), pair
        assert row["entrypoints"] == {i: e["status"] for i, e in checked["import_drift"]["entrypoints"].items()}
        assert row["drift_points"] == [p["name"] for p in checked["patches"] if p["action"] == "patched"]
        install = checked["dependency_drift"]["install"]
        assert row["overrides"] == _written(target) == install["overrides"], pair
        assert row["install_verified"] == install["verified"], pair
        resolution = checked["dependency_drift"]["resolution"]
        if install["status"] == "not resolved":  # no uv, no index and nothing cached: unverified on both sides
            unverified.append(f"{pair}: {install['text']}")
            continue
        # the matrix's cells installed every pair: where uv answered, the lines check names install it
        assert install["verified"], f"{pair}: {install['text']}"
        last = resolution["fix"] or resolution  # every line the verifying resolution was resolved with is written
        assert sorted(_written(target)) == sorted(last["overrides"]), pair
        if pair in PINNED_LINES:  # what the cell on vLLM's CUDA torch installed with
            assert sorted(row["overrides"]) == PINNED_LINES[pair], pair
    if len(unverified) == len(versions):
        pytest.skip("no pair could be resolved here (no uv, no index, nothing cached): the rows equal the checks, "
                    "but no verified install was compared: " + "; ".join(unverified))


# ----------------------------------------------------------------------------- which vLLM releases


def test_the_newest_patch_of_each_minor_from_vllm_omnis_own_up():
    index = ["0.23.0", "0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.1", "0.27.0", "0.28.0", "0.34.0"]
    assert plan_module.select_releases(index, "0.24.0") == ["0.24.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.34.0"]
    assert plan_module.select_releases(index, "0.25.0", upto="0.27") == ["0.25.1", "0.26.0", "0.27.1"]
    assert plan_module.select_releases(index, "0.25.0", upto="0.27.0") == ["0.25.1", "0.26.0", "0.27.1"]
    assert plan_module.select_releases(index, "0.35.0") == []


PIP_INDEX = """vllm (0.34.0)
Available versions: 0.34.0, 0.33.0, 0.25.1, 0.25.0, 0.24.0, 0.10.1.1, 0.8.5.post1, 0.8.5
"""


def test_release_versions_are_the_indexs_final_releases_oldest_first(monkeypatch):
    def fake_run(command, **kwargs):
        assert command[-4:] == ["versions", "--only-binary", ":all:", "vllm"]
        return subprocess.CompletedProcess(command, 0, PIP_INDEX.replace("0.33.0", "0.33.0, 0.33.1.dev2"), "")

    monkeypatch.setattr(wheels, "pip_command", lambda: ["pip"])
    monkeypatch.setattr(wheels.subprocess, "run", fake_run)
    # pip's answer, as for an index that is no http(s) one (an http index's page is read directly:
    # tests/detect/test_wheel_members.py)
    monkeypatch.setattr("vllm_compat.detect.wheel_members.index_versions", lambda distribution: None)
    assert wheels.release_versions("vllm") == ["0.8.5", "0.8.5.post1", "0.10.1.1", "0.24.0", "0.25.0", "0.25.1",
                                               "0.33.0", "0.34.0"]
    assert wheels.newest_version("vllm") == "0.34.0"


def test_upto_asks_the_index_and_stops_at_that_minor(capsys):
    """The index path, kept to vllm-omni 0.30.0's own minor: one pip call, then the newest 0.30.x only."""
    try:
        available = wheels.release_versions("vllm")
    except WheelError as exc:
        pytest.skip(f"the index cannot be asked: {exc}")
    expected = [v for v in available if v.startswith("0.30.")][-1:]
    if not expected:
        pytest.skip("this index lists no vLLM 0.30.x")
    wheel_or_skip("vllm", expected[0])
    wheel_or_skip("vllm-omni", "0.30.0")
    code, planned = _json(capsys, "plan", "vllm-omni==0.30.0", "--upto", "0.30")
    assert code == 0 and [r["vllm"] for r in planned["rows"]] == expected
    assert planned["rows"][0]["entrypoints"] == _cell(expected[0], "0.30.0")["entrypoints"]


# ------------------------------------------------------------------------------------------ usage


@pytest.mark.parametrize(("args", "message"), [
    (["plan", "vllm==0.31.0"], "not 'vllm==0.31.0'"),
    (["plan", "vllm-omni==0.24.0", "--vllm", "0.31.0,latest"], "'latest' is not a version"),
    (["plan", "vllm-omni==0.24.0", "--upto", "newest"], "'newest' is not a version"),
])
def test_usage_errors_exit_2_before_any_download(capsys, monkeypatch, args, message):
    def no_fetch(*a, **k):
        raise AssertionError("nothing may be fetched for a usage error")

    monkeypatch.setattr(wheels, "fetch_wheel", no_fetch)
    monkeypatch.setattr("vllm_compat.check.fetch_wheel", no_fetch)
    assert main(args) == 2
    assert message in capsys.readouterr().err


def test_progress_goes_to_a_terminal_only(monkeypatch, capsys):
    """Quiet when piped: one stderr line per vLLM only when stderr is a terminal."""
    wheel_or_skip("vllm", "0.31.0")
    wheel_or_skip("vllm-omni", "0.24.0")
    assert main(["plan", "vllm-omni==0.24.0", "--vllm", "0.31.0"]) == 0
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert main(["plan", "vllm-omni==0.24.0", "--vllm", "0.31.0"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("vllm-compat plan: vLLM 0.31.0 (1/1) everything starts")


# ------------------------------------------------------------------------------------------ the screen


class _Omni:
    version, location = "0.24.0", "vllm_omni-0.24.0-py3-none-any.whl"


ALL = {"offline": "works", "serve": "works", "diffusion_stage": "works", "llm_stage": "works"}
SCREEN_ROWS = [
    plan_module.Row("0.24.0", import_ok=True, statuses=ALL, acting=("a", "b"), conflicts=0,
                    cells=("v0.24-omni0.24",), verdict="works_natively", exit_code=0),
    plan_module.Row("0.30.0", import_ok=True, statuses={
        "offline": "works_with_vllm_compat", "serve": "will_not_start", "diffusion_stage": "fails_on_request",
        "llm_stage": "left_out"}, acting=tuple(f"drift_point_{i}" for i in range(26)),
        overrides=("huggingface-hub==2.4.0", "cuda-python==13.4.4"), conflicts=3, without_override=1,
        cells=("v0.30-omni0.24",), verdict="will_not_start", exit_code=1),
    plan_module.Row("0.31.0", error="vllm 0.31.0 does not exist on the index (no wheel of it for this machine); "
                                    "nearest versions: 0.30.0, 0.28.0, 0.26.0, 0.24.0, 0.22.0."),
    plan_module.Row("0.32.0", import_ok=False, statuses={"offline": "will_not_start"}, conflicts=None,
                    verdict="will_not_start", exit_code=1),
]
# every status a row can have, as `check` words it, and the narrow table's word with its legend
SAYS = {"works": ("works", "works"), "works_with_vllm_compat": ("with vllm_compat", "starts with vllm_compat"),
        "will_not_start": ("WILL NOT START", "will not start"),
        "fails_on_request": ("FAILS ON REQUEST", "starts, fails on request"), "left_out": ("LEFT OUT", "LEFT OUT")}


@pytest.mark.parametrize("width", [40, 60, 72, 100, 132, 200])
@pytest.mark.parametrize("verbose", [False, True], ids=["short", "verbose"])
def test_the_plan_fits_the_width_and_says_every_row(width, verbose):
    """No line wider than ``width``, whatever layout fits it (the table, its narrow form, a block per vLLM); every
    vLLM, every status (in words, or a short word with its legend), a row's error whole."""
    screen = plan_module.render(plan_module.Plan(_Omni(), "0.24.0", SCREEN_ROWS), width, verbose)
    lines = screen.splitlines()
    assert not [line for line in lines if len(line) > width], screen
    flat = " ".join(screen.split())
    for row in SCREEN_ROWS:
        assert row.vllm in flat
    assert " ".join(SCREEN_ROWS[2].error.split()) in flat  # cut nowhere
    for status, (word, legend) in SAYS.items():
        assert word in flat or legend in flat, (status, screen)
    assert "NO IMPORT" in flat
    assert ("drift_point_25" in flat) == verbose and ("cuda-python==13.4.4" in flat) == verbose
    if width >= 100:  # a table: one line per vLLM, from its version to its matrix cell
        for row in SCREEN_ROWS:
            if not row.error:
                (line,) = [line for line in lines if line.startswith(f"  {row.vllm}  ")]
                assert line.endswith(row.cells[0] if row.cells else "untested"), line


def test_the_default_plan_is_100_columns_whatever_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")
    screen = plan_module.render(plan_module.Plan(_Omni(), "0.24.0", SCREEN_ROWS))
    assert max(len(line) for line in screen.splitlines()) <= 100
    assert plan_module.render(plan_module.Plan(_Omni(), "0.24.0", SCREEN_ROWS), 100) == screen


def test_a_real_plan_fits_and_verbose_names_what_json_lists(capsys):
    wheel_or_skip("vllm", "0.31.0")
    wheel_or_skip("vllm-omni", "0.24.0")
    args = ["plan", "vllm-omni==0.24.0", "--vllm", "0.31.0"]
    code, planned = _json(capsys, *args)
    for extra, width in (([], 100), (["--verbose"], 100), (["--width", "60"], 60), (["--verbose", "--width", "48"], 48)):
        assert main([*args, *extra]) == code == 0
        screen = capsys.readouterr().out
        assert not [line for line in screen.splitlines() if len(line) > width], screen
        flat = "".join(screen.split())
        assert ("".join(planned["rows"][0]["drift_points"]) in flat.replace(",", "")) == ("--verbose" in extra)
