"""The command line: ``doctor``'s stdout holds the report alone, in every mode, so it can be piped; bad input (an
output file whose folder is missing, a version that is not one, a width under the minimum, a release the index
lacks) is a one- or two-line error with exit 2, before the index is asked and with nothing written; pip's own output
shows with ``--verbose`` only; an env without vLLM or vllm-omni has nothing to judge (exit 3)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import vllm_compat
from conftest import OMNI_VERSION, VLLM_VERSION, omni_importable_or_absent
from tests.support.warm_python import WARM
from vllm_compat import tool_output
from vllm_compat.cli import build_parser, main
from vllm_compat.detect import wheels
from vllm_compat.detect.static import SiteFacts
from vllm_compat.detect.wheels import WheelError
from vllm_compat.errors import ConfigError
from vllm_compat.reporting import MIN_WIDTH, NOTHING_TO_JUDGE_EXIT, Report

ROOT = Path(__file__).resolve().parent.parent
# the doctor of this env: 3 (nothing to judge) where vLLM or vllm-omni is not installed, else 0 or 1
DOCTOR_CODES = (NOTHING_TO_JUDGE_EXIT,) if VLLM_VERSION is None or OMNI_VERSION is None else (0, 1)


@pytest.mark.parametrize(
    "mode", ["static", pytest.param("runtime", marks=omni_importable_or_absent)], ids=["static", "runtime"]
)
def test_doctor_json_stdout_is_only_the_json(mode):
    """``doctor --runtime --json | python -m json.tool`` works: vLLM's log lines go to stderr."""
    args = ["-m", "vllm_compat", "doctor", "--json"] + (["--runtime"] if mode == "runtime" else [])
    result = WARM.run(args, dict(os.environ), os.getcwd(), timeout=600)
    assert result.returncode in DOCTOR_CODES, result.stderr[-2000:]
    data = json.loads(result.stdout)  # the whole stdout, nothing searched for
    assert data["mode"] == mode
    assert [p["name"] for p in data["patches"]] == [e["id"] for e in data["catalogue"]]


def test_doctor_table_lists_every_catalogue_entry():
    from vllm_compat.catalogue import CATALOGUE

    result = subprocess.run([sys.executable, "-m", "vllm_compat", "doctor", "--verbose"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode in DOCTOR_CODES, result.stderr[-2000:]
    for entry in CATALOGUE:
        assert f"  {entry.id} " in result.stdout, entry.id


@omni_importable_or_absent
def test_runtime_doctor_agrees_with_static_doctor_on_every_entrypoint():
    """A bridge whose target is not imported yet when doctor applies the shim (vLLM 0.29+'s openai.engine package,
    whose parent is imported later) is "pending" at run time: it counts as the bridge its hook will install, so the
    runtime verdict says what static doctor and the real server say, with no mismatch between the two detections'
    facts (issue 32: doctor --runtime said `vllm serve --omni` WILL NOT START where it serves)."""
    reports = {}
    for mode in ("static", "runtime"):
        args = ["-m", "vllm_compat", "doctor", "--json"] + (["--runtime"] if mode == "runtime" else [])
        result = WARM.run(args, dict(os.environ), os.getcwd(), timeout=600)
        assert result.returncode in DOCTOR_CODES, result.stderr[-2000:]
        reports[mode] = json.loads(result.stdout)
    static, runtime = reports["static"], reports["runtime"]
    assert runtime["mismatches"] == [] and runtime["runtime_error"] is None
    if static["import_drift"] is not None:
        statuses = {mode: {k: v["status"] for k, v in data["import_drift"]["entrypoints"].items()}
                    for mode, data in reports.items()}
        assert statuses["runtime"] == statuses["static"]
    acting = {p["name"] for p in static["patches"] if p["action"] == "patched"}
    assert not {p["name"] for p in runtime["patches"] if p["action"] == "pending"} & acting
    assert (runtime["exit_code"], runtime["verdict"]["kind"]) == (static["exit_code"], static["verdict"]["kind"])


# ------------------------------------------------------------------------------------------------ bad input


@pytest.fixture
def no_index(monkeypatch):
    """Nothing may ask the index or run pip / uv: every connection and subprocess attempted is recorded and
    refused. Yields the list of attempts (empty at the end of a usage error)."""
    attempts = []

    def refuse(what):
        def refused(*args, **kwargs):
            attempts.append((what, args[1:2] or args[:1]))
            raise OSError(f"{what} during a usage error")
        return refused

    monkeypatch.setattr(socket.socket, "connect", refuse("connect"))
    monkeypatch.setattr(subprocess, "Popen", refuse("subprocess"))
    yield attempts


def _exit(capsys, args) -> tuple[int, str]:
    """(exit code, stderr) of ``vllm-compat ARGS`` in this process: main's return, or argparse's exit."""
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def _short_error(err: str) -> list[str]:
    lines = err.strip().splitlines()
    assert 1 <= len(lines) <= 2, err  # what was wrong and what to do, no traceback, no usage dump
    assert "Traceback" not in err
    return lines


@pytest.mark.parametrize("option", ["--overrides", "--constraints"])
@pytest.mark.parametrize("where", ["missing/out.txt", "missing/deeper/out.txt", "a-file/out.txt", "."])
def test_an_output_file_that_cannot_be_written_is_a_usage_error_before_the_check(capsys, tmp_path, no_index,
                                                                                  option, where):
    """A folder that does not exist (or is a file), or a folder given as the file: exit 2 naming the path and what
    to do, before the index is asked; nothing is created."""
    (tmp_path / "a-file").write_text("")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    target = tmp_path / where
    code, err = _exit(capsys, ["check", "vllm==0.34.0", "vllm-omni==0.24.0", option, str(target)])
    assert code == 2
    (first, *_) = _short_error(err)
    assert option in first and str(target) in first
    assert ("is a folder" in first) if where == "." else ("create it first (mkdir -p" in first)
    assert no_index == [] and sorted(p.name for p in tmp_path.rglob("*")) == before


def test_overrides_and_constraints_are_both_written_or_neither(capsys, tmp_path, monkeypatch):
    """vLLM 0.31.0 + vllm-omni 0.24.0 from their wheel files: override lines exist, but no matrix cell recorded the
    exact versions (an empty tested-sets home), so --constraints cannot be written: exit 2 and neither file."""
    from tests.support.wheels import wheel_or_skip
    from vllm_compat import tested_sets

    vllm, omni = wheel_or_skip("vllm", "0.31.0"), wheel_or_skip("vllm-omni", "0.24.0")
    monkeypatch.setattr(tested_sets, "HOME", tmp_path / "sets")
    (tmp_path / "sets").mkdir()
    overrides, constraints = tmp_path / "overrides.txt", tmp_path / "constraints.txt"
    code, err = _exit(capsys, ["check", str(vllm), str(omni), "--overrides", str(overrides),
                               "--constraints", str(constraints)])
    assert code == 2 and "not written" in err
    assert not overrides.exists() and not constraints.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name != "sets"] == []  # no temporary file left either
    code, err = _exit(capsys, ["check", str(vllm), str(omni), "--overrides", str(overrides)])
    assert code in (0, 1) and overrides.exists() and "written to" in err
    assert oct(overrides.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # as open() creates a file


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@pytest.mark.parametrize(("args", "bad"), [
    (["check", "vllm==abc", "vllm-omni==0.24.0"], "abc"),
    (["check", "vllm==0.34.0", "vllm-omni==latest"], "latest"),
    (["check", "vllm==0.30.*"], "0.30.*"),
    (["check", "vllm_omni==1.0-beta.2x", "vllm==0.34.0"], "1.0-beta.2x"),
    (["plan", "vllm-omni==abc"], "abc"),
    (["plan", "vllm-omni==0.24.0", "--vllm", "0.31.0,x.y"], "x.y"),
], ids=["vllm", "vllm-omni", "wildcard", "omni-first", "plan", "plan-vllm-list"])
def test_a_version_that_is_not_a_version_is_said_without_asking_the_index(capsys, no_index, args, bad):
    code, err = _exit(capsys, args)
    assert code == 2
    (first, *_) = _short_error(err)
    assert f"{bad!r}" in first and "is not a version" in first and "does not exist" not in err
    assert no_index == []


@pytest.mark.parametrize("command", [["doctor"], ["check", "vllm==0.34.0"], ["plan", "vllm-omni==0.24.0"]],
                         ids=["doctor", "check", "plan"])
@pytest.mark.parametrize("width", ["10", "-5", "0", str(MIN_WIDTH - 1), "abc", "12.5"])
def test_a_width_under_the_minimum_says_the_minimum(capsys, no_index, command, width):
    code, err = _exit(capsys, [*command, "--width", width])
    assert code == 2
    (first, *_) = _short_error(err)
    assert "--width" in first and f"{MIN_WIDTH}" in first
    if re.fullmatch(r"-?\d+", width):
        assert f"{width} columns is under the minimum, {MIN_WIDTH}" in first
    assert no_index == []


def test_the_minimum_width_itself_is_taken():
    for command in (["doctor"], ["check", "vllm==0.34.0"], ["plan"]):
        assert build_parser().parse_args([*command, "--width", str(MIN_WIDTH)]).width == MIN_WIDTH
        assert build_parser().parse_args(command).width == 100


# pip's "(from versions: ...)" for vllm-omni, as the index listed it on 2026-12-06 (rcs and finals mixed)
OMNI_LISTED = ("0.11.0rc1, 0.12.0rc1, 0.14.0rc1, 0.14.0, 0.16.0, 0.18.0rc1, 0.18.0, 0.20.0rc1, 0.20.0, 0.21.0rc1, "
               "0.22.0, 0.23.0rc1, 0.24.0rc1, 0.24.0, 0.25.0rc1, 0.26.0rc1, 0.26.0, 0.27.0rc1, 0.28.0rc1, 0.28.0, "
               "0.29.0rc1, 0.30.0rc1, 0.30.0, 0.31.0rc1, 0.32.0rc1")
FAKE_PIP = f"""
import sys
for percent in range(0, 101, 20):
    print(f"Downloading vllm_omni ... {{percent}}%", flush=True)
print("WARNING: Retrying (Retry(total=4, connect=None, read=None)) after connection broken", file=sys.stderr)
print("ERROR: Could not find a version that satisfies the requirement {{0}} (from versions: {OMNI_LISTED})"
      .format(sys.argv[-3]), file=sys.stderr)
print("ERROR: No matching distribution found for " + sys.argv[-3], file=sys.stderr)
sys.exit(1)
"""


@pytest.fixture
def fake_pip(tmp_path, monkeypatch):
    """pip replaced by a script that prints a progress bar, a retry warning and the index's version list."""
    script = tmp_path / "fake_pip.py"
    script.write_text(FAKE_PIP)
    monkeypatch.setattr(wheels, "pip_command", lambda: [sys.executable, str(script)])
    return tmp_path / "cache"


@pytest.mark.parametrize(("version", "nearest"), [
    ("9.9.9", "0.30.0, 0.28.0, 0.26.0, 0.24.0, 0.22.0 (newer pre-releases: 0.32.0rc1, 0.31.0rc1)"),
    ("0.31.0", "0.30.0, 0.28.0, 0.26.0, 0.24.0, 0.22.0 (newer pre-releases: 0.32.0rc1, 0.31.0rc1)"),
    ("0.0.1", "0.22.0, 0.20.0, 0.18.0, 0.16.0, 0.14.0."),
    ("0.25.0", "0.30.0, 0.28.0, 0.26.0, 0.24.0, 0.22.0 (newer pre-releases: 0.32.0rc1, 0.31.0rc1)"),
    ("0.17.0", "0.22.0, 0.20.0, 0.18.0, 0.16.0, 0.14.0."),
])
def test_an_unknown_release_names_the_nearest_final_releases_newest_first(fake_pip, version, nearest):
    """Above every release the nearest are the newest; rcs only after the final releases, where newer."""
    with pytest.raises(WheelError) as raised:
        wheels.fetch_wheel("vllm-omni", version, fake_pip)
    message = str(raised.value)
    assert raised.value.kind == "no_version" and "\n" not in message
    assert message.endswith(f"nearest versions: {nearest}" + ("" if nearest.endswith(".") else "."))


def test_pips_own_output_shows_with_verbose_only(fake_pip, capsys):
    """Without --verbose: no progress bar, no retry warning, no 25-version ERROR, and its error in one line; with
    it, what pip printed."""
    tool_output.show(False)
    with pytest.raises(WheelError) as raised:
        wheels.fetch_wheel("vllm-omni", "9.9.9", fake_pip)
    assert capsys.readouterr().err == ""
    assert "Downloading" not in str(raised.value) and "0.11.0rc1" not in str(raised.value)
    assert tool_output.said("ERROR: Could not find a version that satisfies the requirement x (from versions: "
                            f"{OMNI_LISTED})") == ("ERROR: Could not find a version that satisfies the requirement "
                                                   "x (25 versions listed)")
    long = tool_output.said("ERROR: " + "word " * 100)
    assert len(long) <= tool_output.SAID_LIMIT and long.endswith("...")
    try:
        tool_output.show(True)
        with pytest.raises(WheelError):
            wheels.fetch_wheel("vllm-omni", "9.9.9", fake_pip)
    finally:
        tool_output.show(False)
    err = capsys.readouterr().err
    assert "Downloading vllm_omni ... 100%" in err and "WARNING: Retrying" in err and "0.11.0rc1" in err


@pytest.mark.parametrize("command", [["check", "vllm==0.34.0"], ["plan", "vllm-omni==0.24.0"], ["doctor"]])
def test_verbose_is_what_shows_the_tools_output(monkeypatch, capsys, command):
    """cli.main sets it for each command, from --verbose, and unsets it for the next."""
    seen = []
    for module, name in (("vllm_compat.check", "run_check"), ("vllm_compat.plan", "run_plan")):
        monkeypatch.setattr(f"{module}.{name}", lambda args: seen.append(tool_output.shown()) or 0)
    monkeypatch.setattr("vllm_compat.cli._doctor", lambda args: seen.append(tool_output.shown()) or 0)
    main([*command, "--verbose"])
    main(command)
    assert seen[-2:] == [True, False]


@pytest.mark.parametrize("enabled", [True, False])
def test_a_command_runs_with_the_cyclic_collector_off_and_leaves_it_as_it_was(monkeypatch, enabled):
    """The command's own trees are not traversed again and again (cli._collector_paused); the caller's setting
    comes back, whatever the command returned or raised."""
    import gc

    seen = []

    def handler(args):
        seen.append(gc.isenabled())
        raise ConfigError("bad input")

    monkeypatch.setattr("vllm_compat.check.run_check", handler)
    (gc.enable if enabled else gc.disable)()
    try:
        assert main(["check", "vllm==0.34.0"]) == 2
        assert seen == [False] and gc.isenabled() is enabled
    finally:
        gc.enable()


# ------------------------------------------------------------------------------------------ nothing to judge


@pytest.mark.parametrize(("versions", "absent"), [
    ({"vllm": None, "vllm-omni": None, "torch": None}, "vLLM and vllm-omni are not installed here"),
    ({"vllm": "0.30.0", "vllm-omni": None, "torch": "2.13.0"}, "vllm-omni is not installed here"),
    ({"vllm": None, "vllm-omni": "0.24.0", "torch": None}, "vLLM is not installed here"),
])
def test_a_doctor_without_vllm_or_vllm_omni_has_nothing_to_judge(monkeypatch, capsys, versions, absent):
    """Its own exit code (3; docs/cli.md), its own verdict, on every screen; never WORKS."""
    report = Report(mode="static", static=SiteFacts("static", versions, {}), patches=[], _import_drift=None)
    monkeypatch.setattr(vllm_compat, "report", lambda runtime=False: report)
    for args in ([], ["--verbose"], ["--width", "60"]):
        code = main(["doctor", *args])
        screen = capsys.readouterr().out
        assert code == NOTHING_TO_JUDGE_EXIT == 3
        assert "WORKS" not in screen and f"NOTHING TO JUDGE: {absent}" in " ".join(screen.split())
        assert "vllm-compat check vllm==X vllm-omni==Y" in " ".join(screen.split())
    assert main(["doctor", "--json"]) == 3
    data = json.loads(capsys.readouterr().out)
    assert (data["verdict"]["kind"], data["exit_code"]) == ("nothing_to_judge", 3)


def test_the_exit_codes_are_documented():
    """docs/cli.md's doctor exit codes name 3 as nothing to judge, as the code returns it."""
    text = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    (doctor,) = re.findall(r"- Exit code: 0 it works \(natively or with the shim\);[^\n]*?(?= - |$)", text)[:1] or [""]
    assert f"{NOTHING_TO_JUDGE_EXIT} nothing to judge" in doctor, doctor
    assert "nothing is installed" not in doctor
