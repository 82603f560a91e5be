"""``vllm-compat plan PLUGIN==Y`` for plugins other than vllm-omni (issue 40): ``check`` on each vLLM release, one
row each, on the real cached releases. Expected values come from plugins/breakage_reports.toml (a report's vLLM stops
the release on its ``failing_name``; a ``[[known_good]]`` pair starts; a declared range), never from the code under
test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plugins.releases import release_or_skip, vllm_wheel_or_skip
from vllm_compat.cli import main

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+; the reports table is read on 3.11+ only")

DATA = tomllib.loads((Path(__file__).resolve().parents[2] / "plugins" / "breakage_reports.toml").read_text())
REPORTS = {r["id"]: r for r in DATA["report"]}


def _plan_good_and_reported(capsys, report_id: str) -> tuple[dict, dict, str, dict]:
    """``(report, its release's [[known_good]] pair, the plugin spec, plan --json's rows by vLLM)`` of ``plan`` over
    the known-good vLLM and the report's."""
    report = REPORTS[report_id]
    good = next(g for g in DATA["known_good"] if g["plugin"] == report["plugin"]
                and g["plugin_version"] == report["plugin_version"])
    for version in (good["vllm"], report["vllm"]):
        vllm_wheel_or_skip(version)
    release_or_skip(report["plugin"], report["plugin_version"])
    spec = f"{report['plugin']}=={report['plugin_version']}"
    assert main(["plan", spec, "--vllm", f"{good['vllm']},{report['vllm']}", "--json"]) == 0
    return report, good, spec, json.loads(capsys.readouterr().out)


def test_plan_rows_say_where_a_plugin_release_stops(capsys):
    """tpu-inference 0.28.0 was built and tested against vLLM 0.28.0 ([[known_good]]) and stops on 0.29.0's missing
    ``get_kv_cache_layout`` (tpu-inference#3485): the plan's rows say both, and the newest vLLM where everything
    starts is 0.28.0."""
    report, good, spec, data = _plan_good_and_reported(capsys, "tpu-inference#3485")
    rows = {r["vllm"]: r for r in data["rows"]}
    assert rows[good["vllm"]]["verdict"] == "starts" and not rows[good["vllm"]]["will_not_start"]
    stopped = rows[report["vllm"]]["will_not_start"]
    assert rows[report["vllm"]]["verdict"] == "will_not_start"
    assert any(report["failing_name"] in names for names in stopped.values())
    assert data["newest_vllm_where_everything_starts"] == good["vllm"]
    assert main(["plan", spec, "--vllm", f"{good['vllm']},{report['vllm']}", "--width", "200"]) == 0
    screen = capsys.readouterr().out
    assert f"vllm-compat plan: {report['plugin']} {report['plugin_version']} on vLLM {good['vllm']} .. " in screen
    assert any(line.split()[:1] == [report["vllm"]] and "WILL NOT START" in line for line in screen.splitlines())
    assert f"newest vLLM where every entrypoint starts: {good['vllm']}" in screen


def test_plan_starts_at_the_declared_lower_bound_and_says_what_is_outside(capsys):
    """sendnn-inference 2.6.3 declares ``vllm<0.28.1,>=0.26.0`` ([[known_good]] evidence): without --vllm the plan
    starts at 0.26.0's minor, and 0.29.0 (up to --upto) is outside the range."""
    good = next(g for g in DATA["known_good"] if g["plugin"] == "sendnn-inference")
    release_or_skip("sendnn-inference", "2.6.3")
    for version in ("0.26.0", "0.27.1", "0.28.0", "0.29.0"):
        vllm_wheel_or_skip(version)
    assert main(["plan", "sendnn-inference==2.6.3", "--upto", "0.29", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["declared_vllm"].endswith(good["evidence"].split("vllm", 1)[1])
    rows = [(r["vllm"], r["in_declared_range"]) for r in data["rows"]]
    assert rows == [("0.26.0", True), ("0.27.1", True), ("0.28.0", True), ("0.29.0", False)]


def test_plan_still_refuses_a_vllm_spec(capsys):
    assert main(["plan", "vllm==0.24.0"]) == 2
    assert "plan takes the vllm-omni to plan" in capsys.readouterr().err


def test_plan_rows_say_where_a_plugin_release_fails_when_run(capsys):
    """vllm-spyre 0.5.3 on vLLM 0.9.2 ([[known_good]]) starts; on 0.10.0 its model runner reads
    ``vllm_config.prompt_adapter_config``, gone (sendnn-inference#336): that row fails when run."""
    report, good, _, data = _plan_good_and_reported(capsys, "sendnn-inference#336")
    rows = {r["vllm"]: r for r in data["rows"]}
    assert rows[good["vllm"]]["verdict"] == "starts" and not rows[good["vllm"]]["fails_when_run"]
    failing = rows[report["vllm"]]["fails_when_run"]
    assert rows[report["vllm"]]["verdict"] == "fails_when_run"
    assert any(report["failing_name"] in names for names in failing.values()), failing
