"""``vllm-compat check vllm==X PLUGIN==Y`` for plugins other than vllm-omni (issue 40), on the real cached releases.

Expected values come from plugins/breakage_reports.toml (each report's ``failing_name`` and the plugin module of its
``where``; each ``[[known_good]]`` pair) and from plugins/README.md's measured table (which entrypoint a report's
import stops), never from the code under test. A pair whose wheel is not cached is skipped with the file to fetch.

vLLM releases named by a report but not cached (0.19.1 for vllm-metal#493) are checked on a cached one that also
lacks the name, as the report's notes and README's table say: vllm-metal 0.1.0 breaks "from vLLM 0.14.0 already",
measured on 0.24.0.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plugins.releases import release_or_skip, vllm_wheel_or_skip
from vllm_compat.cli import main

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+; the reports table is read on 3.11+ only")

DATA = tomllib.loads((Path(__file__).resolve().parents[2] / "plugins" / "breakage_reports.toml").read_text())
REPORTS = {r["id"]: r for r in DATA["report"]}


def _check(capsys, *args) -> tuple[int, dict]:
    code = main(["check", "--json", *map(str, args)])
    return code, json.loads(capsys.readouterr().out)


def _screen(capsys, *args) -> tuple[int, str]:
    code = main(["check", "--width", "400", *map(str, args)])
    return code, capsys.readouterr().out


def _stopping(data: dict) -> dict[str, set[str]]:
    """{entrypoint id: missing names} of those that will not start."""
    return {i: set(e["missing"]) for i, e in data["import_drift"]["entrypoints"].items()
            if e["status"] == "will_not_start"}


# (report id, vLLM asked, the entrypoints README's measured table names it under)
NAMED = [
    ("tpu-inference#2844", None, {"general:register_layers", "worker"}),
    ("tpu-inference#3485", None, {"worker"}),  # found only once the prefilter names the plugin (wiring step 1)
    ("vllm-metal#493", "0.24.0", {"platform:metal", "worker"}),
    # vllm.utils' __getattr__ answers the names of a literal mapping and raises for the rest (vLLM 0.11.1)
    ("tpu-inference#944", None, {"worker"}),
    ("tpu-inference#869", None, {"worker"}),
    ("vllm-ascend#7058", None, {"worker"}),
]


@pytest.mark.parametrize("report_id, vllm, entrypoints", NAMED, ids=[n[0] for n in NAMED])
def test_check_names_the_reported_name_under_the_entrypoint_it_stops(capsys, report_id, vllm, entrypoints):
    report = REPORTS[report_id]
    vllm = vllm or report["vllm"]
    host = vllm_wheel_or_skip(vllm)
    release_or_skip(report["plugin"], report["plugin_version"])
    code, data = _check(capsys, host, f"{report['plugin']}=={report['plugin_version']}")
    assert code == 1 and data["exit_code"] == 1 and data["verdict"]["kind"] == "will_not_start"
    stopping = _stopping(data)
    assert entrypoints <= set(stopping), stopping
    for entrypoint in entrypoints:
        assert report["failing_name"] in stopping[entrypoint]
    # the first importer of the name is the module the report's `where` names
    importers = {u["importer"] for u in data["import_drift"]["unresolved"] if u["target"] == report["failing_name"]}
    assert report["where"].split(" ", 1)[0].split(":", 1)[0] in importers
    # and the screen says the same in words
    code, screen = _screen(capsys, host, f"{report['plugin']}=={report['plugin_version']}")
    assert code == 1 and "WILL NOT START" in screen and f"missing: {report['failing_name']} (in " in screen
    assert f"vllm {vllm} + {report['plugin']} {report['plugin_version']}" in screen


# (report id, the vLLM asked: the report's where the read is not masked by an import the same entrypoint lacks)
READS = [
    ("sendnn-inference#336", None),  # a parameter annotated VllmConfig
    ("sendnn-inference#376", None),  # one field further; the annotation names a TYPE_CHECKING import
    ("tpu-inference#3481", None),  # an element of an annotated list field; masked by #3485's import on the same pair
    ("kvcached#241", None),  # an import inside the init_device kvcached patches in, reached from its startup hook
]


@pytest.mark.parametrize("report_id, vllm", READS, ids=[r[0] for r in READS])
def test_check_names_what_a_plugin_function_uses_and_this_vllm_lacks(capsys, report_id, vllm):
    """The report's failing ``Class.attribute`` (or imported name) is used in the module its ``where`` names (the check names the
    module defining the class, the report the one importing it: the last two parts are compared), and the screen
    says so under an entrypoint."""
    report = REPORTS[report_id]
    host = vllm_wheel_or_skip(vllm or report["vllm"])
    release_or_skip(report["plugin"], report["plugin_version"])
    code, data = _check(capsys, host, f"{report['plugin']}=={report['plugin_version']}")
    assert code == 1 and data["verdict"]["kind"] in ("will_not_start", "fails_when_run")
    tail = report["failing_name"].split(".")[-2:]
    module = report["where"].split(" ", 1)[0].split(":", 1)[0]
    reads = [r for reads in data["fails_when_run"].values() for r in reads]
    assert any(r["target"].split(".")[-2:] == tail and r["module"] == module for r in reads), reads
    _, screen = _screen(capsys, host, f"{report['plugin']}=={report['plugin_version']}")
    named = [line for line in screen.replace("\n          ", " ").splitlines() if f".{'.'.join(tail)}" in line]
    assert any(f", which vLLM {vllm or report['vllm']} lacks (in {module}:" in line for line in named), named


def test_vllm_metal_also_names_set_random_seed_under_its_worker(capsys):
    """kvcached#241's notes: the same vLLM change (set_random_seed gone from vllm.model_executor, 0.14.0) broke
    vllm-metal 0.1.0 at vllm_metal/v1/worker.py:17, module level: the worker, not the platform plugin."""
    name = REPORTS["kvcached#241"]["failing_name"]
    code, data = _check(capsys, vllm_wheel_or_skip("0.24.0"), release_or_skip("vllm-metal", "0.1.0"))
    stopping = _stopping(data)
    assert code == 1 and name in stopping["worker"] and name not in stopping["platform:metal"]
    assert any(u["target"] == name and u["importer"] == "vllm_metal.v1.worker"
               for u in data["import_drift"]["unresolved"])


def test_the_range_admits_a_vllm_the_reading_stops(capsys):
    """vllm-metal#493: declared ``vllm>=0.13.0; extra == 'vllm'``, in_declared_range = true: the range admits the
    vLLM the platform plugin breaks on."""
    report = REPORTS["vllm-metal#493"]
    code, data = _check(capsys, vllm_wheel_or_skip("0.24.0"), release_or_skip("vllm-metal", "0.1.0"))
    declared = data["declared_vllm"]
    assert declared["specifier"] == report["declared"].split(";")[0].removeprefix("vllm")
    assert declared["marker"] is not None and "extra" in declared["marker"]
    assert declared["allows_asked_vllm"] is report["in_declared_range"] is True
    assert data["range_and_reading"] == "disagree"
    _, screen = _screen(capsys, vllm_wheel_or_skip("0.24.0"), release_or_skip("vllm-metal", "0.1.0"))
    assert "vLLM 0.24.0 is inside it" in screen
    assert "the reading and the range disagree: the range admits vLLM 0.24.0" in screen


def test_sendnn_inference_outside_its_range_with_nothing_missing_says_they_disagree(capsys):
    """sendnn-inference 2.6.3 declares ``vllm<0.28.1,>=0.26.0`` ([[known_good]] evidence); README's table: on vLLM
    0.30.0 the reading finds nothing at import level, outside the declared range."""
    good = next(g for g in DATA["known_good"] if g["plugin"] == "sendnn-inference")
    specifier = good["evidence"].split("vllm", 1)[1]
    host, plugin = vllm_wheel_or_skip("0.30.0"), release_or_skip("sendnn-inference", "2.6.3")
    code, data = _check(capsys, host, "sendnn-inference==2.6.3")
    assert code == 0 and data["verdict"]["kind"] == "starts"
    assert data["declared_vllm"]["specifier"] == specifier
    assert data["declared_vllm"]["allows_asked_vllm"] is False
    assert data["range_and_reading"] == "disagree"
    code, screen = _screen(capsys, host, plugin)  # the wheel path: the same answer
    assert code == 0
    assert f"declared vLLM range: vllm{specifier} " in screen and "vLLM 0.30.0 is OUTSIDE it" in screen
    assert "the reading and the range disagree: the range excludes vLLM 0.30.0" in screen


GOOD = [(g["plugin"], g["plugin_version"], g["vllm"]) for g in DATA["known_good"]]


@pytest.mark.parametrize("plugin, version, vllm", GOOD, ids=[f"{p}-{v}+vllm-{x}" for p, v, x in GOOD])
def test_a_pair_the_plugin_tested_gets_no_will_not_start(capsys, plugin, version, vllm):
    host = vllm_wheel_or_skip(vllm)
    release_or_skip(plugin, version)
    code, data = _check(capsys, host, f"{plugin}=={version}")
    assert code == 0 and data["verdict"]["kind"] == "starts", _stopping(data)
    assert not _stopping(data) and data["import_drift"]["entrypoints"]
    assert data["range_and_reading"] in ("agree", "undeclared")
    _, screen = _screen(capsys, host, f"{plugin}=={version}")
    assert "WILL NOT START" not in screen and "verdict: STARTS" in screen


def test_a_plugin_wheel_path_reads_as_its_name_does(capsys):
    report = REPORTS["tpu-inference#2844"]
    host = vllm_wheel_or_skip(report["vllm"])
    wheel = release_or_skip(report["plugin"], report["plugin_version"])
    by_name = _check(capsys, host, f"{report['plugin']}=={report['plugin_version']}")
    by_path = _check(capsys, host, wheel)
    assert by_name[0] == by_path[0] == 1
    assert by_name[1]["import_drift"] == by_path[1]["import_drift"]
    assert by_path[1]["inputs"]["plugin"]["source"] == "path"


@pytest.mark.parametrize("args, message", [
    (["vllm==0.24.0", "tpu-inference>=0.22"], "is not one of vllm==VERSION, vllm-omni==VERSION, PLUGIN==VERSION"),
    (["vllm==0.24.0", "tpu-inference==0.22.0", "vllm-omni==0.24.0"], "2 plugins given"),
    (["vllm==0.24.0", "tpu-inference==0.22.0", "--require", "serve"], "--require serve vllm-omni only"),
])
def test_plugin_usage_errors_exit_2(capsys, monkeypatch, args, message):
    from vllm_compat.detect import wheels

    if "--require" in args:
        vllm_wheel_or_skip("0.24.0")
        release_or_skip("tpu-inference", "0.22.0")
    monkeypatch.setattr(wheels, "pip_command", lambda: pytest.fail("a usage error must not reach pip"))
    assert main(["check", *args]) == 2
    assert message in capsys.readouterr().err
