"""Entrypoints as data (vllm_compat.entrypoints): the static check follows each way vllm-omni is started, and the
verdict, the doctor's / check's screens and --json name each one. Rules on a small vllm-omni-shaped tree the test
writes; the real wheels are compared in tests/test_check.py and tests/test_matrix_consistency.py."""

from __future__ import annotations

import textwrap

import pytest

from tests.support.trees import write_tree
from vllm_compat.detect.import_drift import check_import_drift
from vllm_compat.detect.static import detect_static
from vllm_compat.entrypoints import ENTRYPOINTS
from vllm_compat.reporting import Report

LAUNCHER = "vllm.entrypoints.launcher"
GONE = "vllm.v1.gone.Gone"

HOST = {
    "vllm/__init__.py": "",
    "vllm/v1/__init__.py": "",
    "vllm/v1/gone.py": "Kept = 1\n",
    "vllm/entrypoints/__init__.py": "",
}

OMNI = {
    "vllm_omni/__init__.py": "from vllm.v1.gone import Kept\n",
    "vllm_omni/entrypoints/__init__.py": "",
    "vllm_omni/entrypoints/omni.py": "from vllm_omni.entrypoints.utils import helper\n",
    "vllm_omni/entrypoints/async_omni.py": "from .omni import helper\n",
    "vllm_omni/entrypoints/utils.py": "from vllm.v1.gone import Kept\nhelper = Kept\n",
    "vllm_omni/entrypoints/cli/__init__.py": "",
    "vllm_omni/entrypoints/cli/main.py": "from vllm_omni.entrypoints.openai import api_server\n",
    "vllm_omni/entrypoints/openai/__init__.py": "",
    "vllm_omni/entrypoints/openai/api_server.py": "from vllm.entrypoints.launcher import serve_http\n",
    "vllm_omni/diffusion/__init__.py": "",
    "vllm_omni/diffusion/stage_diffusion_proc.py": "from vllm_omni.diffusion.diffusion_engine import Engine\n",
    "vllm_omni/diffusion/diffusion_engine.py": "Engine = 1\n",
    "vllm_omni/diffusion/worker/__init__.py": "",
    "vllm_omni/diffusion/worker/diffusion_worker.py": "from vllm.v1.gone import Gone\n",
}


_tree = write_tree


@pytest.fixture
def drift(tmp_path):
    return check_import_drift(_tree(tmp_path / "omni", OMNI), _tree(tmp_path / "host", HOST))


def _report(drift, provided=None, early=True, monkeypatch=None):
    if provided is not None:  # what the decided bridges provide ({target: entry id}), as if a bridge were decided
        import vllm_compat.bridges

        monkeypatch.setattr(vllm_compat.bridges, "provided_by_decisions", lambda decisions: provided)
    return Report(mode="static", static=detect_static(), patches=[], _import_drift=drift, startup_hook=early)


def test_the_table_names_vllm_omnis_three_ways_in_and_the_llm_stages_they_run():
    ids = [e.id for e in ENTRYPOINTS["vllm_omni"]]
    assert ids == ["offline", "serve", "diffusion_stage", "llm_stage"]
    assert [e.id for e in ENTRYPOINTS["vllm_omni"] if not e.part_of] == ["offline", "serve", "diffusion_stage"]
    assert ENTRYPOINTS["vllm_omni"][3].part_of == ("offline", "serve")
    serve = ENTRYPOINTS["vllm_omni"][1]
    assert serve.roots == ("vllm_omni.entrypoints.cli.main", "vllm_omni.entrypoints.openai.api_server")


def test_each_entrypoint_is_followed_from_its_own_roots(drift):
    assert drift.import_ok  # the package itself reaches only what vLLM has
    statuses = {s.id: s for s in drift.statuses}
    assert statuses["offline"].status == "works"  # through utils: Kept exists
    assert statuses["serve"].status == "will_not_start" and statuses["serve"].missing == (LAUNCHER,)
    assert statuses["diffusion_stage"].status == "will_not_start" and statuses["diffusion_stage"].missing == (GONE,)
    assert not drift.starts
    # The older names of the diffusion stage still describe it.
    assert drift.worker_blocking_names == [GONE] and not drift.worker_ok
    assert drift.worker_module.split(", ") == list(ENTRYPOINTS["vllm_omni"][2].roots)


def test_verdict_names_what_will_not_start_and_what_starts(drift):
    report = _report(drift)
    verdict = report.verdict()
    assert verdict.kind == "will_not_start" and verdict.exit_code == 1
    stop, _, start = verdict.text.partition(". ")
    assert "`vllm serve --omni`" in stop and LAUNCHER in stop and "the diffusion stage" in stop and GONE in stop
    assert "offline API" in start and "serve" not in start  # what starts is named after what does not
    data = report.to_dict()["import_drift"]["entrypoints"]
    assert data["serve"] == {"label": "`vllm serve --omni`", "status": "will_not_start", "missing": [LAUNCHER],
                             "bridged": [], "roots": list(ENTRYPOINTS["vllm_omni"][1].roots), "not_installed": [],
                             "left_out": {}, "behaviour_drift": [], "fails_when_used": [], "handled": []}
    assert data["offline"]["status"] == "works"
    table = report.render_table()
    assert "`vllm serve --omni`" in table and "WILL NOT START" in table


def test_a_bridge_counts_only_when_it_is_in_place_before_the_entrypoint(drift, monkeypatch):
    provided = {LAUNCHER: "launcher", GONE: "gone"}
    late = {s.id: s.status for s in drift.with_bridges(provided, early=False).statuses}
    assert late == {"offline": "works", "serve": "will_not_start", "diffusion_stage": "will_not_start"}
    bridged = drift.with_bridges(provided, early=True)
    assert {s.id: s.status for s in bridged.statuses} == {
        "offline": "works", "serve": "works_with_vllm_compat", "diffusion_stage": "works_with_vllm_compat"}
    assert bridged.starts
    verdict = _report(drift, provided, monkeypatch=monkeypatch).verdict()
    assert verdict.kind == "works_with_vllm_compat" and verdict.exit_code == 0
    assert "`vllm serve --omni`" in verdict.text and "offline API" in verdict.text


def test_what_a_bridge_leaves_out_is_named_under_the_entrypoints_it_bridges_and_in_the_verdict(drift, monkeypatch):
    from vllm_compat.decide import Decision

    provided = {LAUNCHER: "launcher", GONE: "gone"}
    feature = "an LLM-stage server stops at startup"
    bridged = drift.with_bridges(provided, early=True, left_out={"launcher": feature, "unused": "not bridged here"})
    assert bridged.left_out == (("launcher", feature),)  # only bridges that provide a name of this drift
    assert {s.id: s.left_out for s in bridged.statuses} == {
        "offline": (), "serve": (("launcher", feature),), "diffusion_stage": ()}
    report = _report(drift, provided, monkeypatch=monkeypatch)
    report.patches = [Decision("launcher", LAUNCHER, "patched", None, "provided", leaves_out=feature),
                      Decision("gone", GONE, "patched", None, "provided")]
    verdict = report.verdict()
    assert verdict.kind == "works_with_vllm_compat" and verdict.exit_code == 0  # it starts; the feature is named
    assert verdict.text.endswith(f"Left out: {feature} (launcher).")
    assert report.to_dict()["import_drift"]["entrypoints"]["serve"]["left_out"] == {"launcher": feature}
    assert report.to_dict()["patches"][0]["leaves_out"] == feature and "leaves_out" not in report.to_dict()["patches"][1]
    table = report.render_table().splitlines()
    serve_line = next(i for i, line in enumerate(table) if "`vllm serve --omni`" in line and "starts" in line)
    assert table[serve_line + 1].strip() == f"left out: {feature} (launcher)"
    assert sum(f"left out: {feature}" in line for line in table) == 1  # once (drift points of this env may add theirs)
    # Two bridges of one removal that leave out the same feature are named once, together.
    report.patches[1] = Decision("gone", GONE, "patched", None, "provided", leaves_out=feature)
    assert report.verdict().text.endswith(f"Left out: {feature} (launcher, gone).")


def test_works_only_when_every_entrypoint_starts(drift, monkeypatch):
    only_serve = drift.with_bridges({LAUNCHER: "launcher"}, early=True)
    assert [s.id for s in only_serve.statuses if not s.starts] == ["diffusion_stage"]
    assert _report(drift, {LAUNCHER: "launcher"}, monkeypatch=monkeypatch).verdict().kind == "will_not_start"


def test_an_entrypoint_a_release_does_not_ship_is_absent_not_judged(tmp_path):
    files = {k: v for k, v in OMNI.items() if "/entrypoints/" not in k or k.endswith("omni.py") or
             k.endswith("utils.py") or k.endswith("entrypoints/__init__.py")}
    files["vllm_omni/diffusion/worker/diffusion_worker.py"] = "from vllm.v1.gone import Kept\n"
    drift = check_import_drift(_tree(tmp_path / "omni", files), _tree(tmp_path / "host", HOST))
    statuses = {s.id: s for s in drift.statuses}
    assert statuses["serve"].status == "absent" and statuses["serve"].roots == ()
    assert drift.starts and _report(drift).verdict().kind == "works_natively"


def test_a_package_that_does_not_import_stops_every_entrypoint(tmp_path):
    files = {**OMNI, "vllm_omni/__init__.py": "from vllm.v1.gone import Gone\n"}
    drift = check_import_drift(_tree(tmp_path / "omni", files), _tree(tmp_path / "host", HOST))
    assert not drift.import_ok
    assert all(s.status == "will_not_start" and GONE in s.missing for s in drift.statuses)
    assert "vllm-omni will not import" in _report(drift).verdict().text


def test_a_console_scripts_functions_are_followed_for_its_entrypoint_only(tmp_path):
    """``vllm serve --omni`` runs vllm-omni's ``cli.main:main()``, which imports vLLM's CLI helpers inside the
    function (vllm-omni 0.24.0-0.30.0: ``cli_env_setup``, moved by vLLM 0.33): those imports stop the server, and
    only the server; a function-level import in any other module still counts for nothing (it may never run)."""
    files = {**OMNI,
             "vllm_omni/entrypoints/cli/main.py": "import sys\ndef main():\n    from vllm.v1.gone import Gone\n",
             "vllm_omni/entrypoints/openai/api_server.py": "",
             "vllm_omni/diffusion/worker/diffusion_worker.py": "from vllm.v1.gone import Kept\n",
             "vllm_omni/entrypoints/utils.py": "from vllm.v1.gone import Kept\nhelper = Kept\n"
                                              "def later():\n    from vllm.v1.gone import AlsoGone\n"}
    drift = check_import_drift(_tree(tmp_path / "omni", files), _tree(tmp_path / "host", HOST))
    statuses = {s.id: s for s in drift.statuses}
    assert statuses["serve"].status == "will_not_start" and statuses["serve"].missing == (GONE,)
    assert statuses["offline"].status == "works" and statuses["diffusion_stage"].status == "works"
    assert "vllm.v1.gone.AlsoGone" not in drift.names
    assert [(u.importer, u.line) for u in drift.unresolved] == [("vllm_omni.entrypoints.cli.main (functions)", 3)]


def test_the_doctor_judges_what_an_entrypoint_imports_from_other_distributions(tmp_path):
    """The server's module-level import of a package this env lacks (torchaudio in a CPU-torch env) stops it in the
    doctor's verdict; an indented (possibly guarded) import, the standard library and vLLM itself do not count, and
    ``check`` (wheels: judge_packages=False) does not judge the env it runs in."""
    files = {**OMNI, "vllm_omni/entrypoints/openai/api_server.py": textwrap.dedent("""\
        import os, json as _json
        import absentpkg.io
        from vllm.v1.gone import Kept
        try:
            import guardedpkg
        except ImportError:
            guardedpkg = None
        def later():
            import lazypkg
        """)}
    drift = check_import_drift(_tree(tmp_path / "omni", files), _tree(tmp_path / "host", HOST))
    serve = drift.entrypoint("serve")
    assert [(p.module, p.importer, p.line) for p in serve.packages] == [
        ("absentpkg", "vllm_omni.entrypoints.openai.api_server", 2)]
    installed = {"guardedpkg", "lazypkg"}  # absentpkg is not: as torchaudio in a CPU-torch env
    judged = drift.judged_installed(lambda package: package in installed)
    statuses = {s.id: s for s in judged.statuses}
    assert statuses["serve"].status == "will_not_start" and statuses["serve"].not_installed == ("absentpkg",)
    assert statuses["offline"].status == "works"
    assert {s.id: s.status for s in drift.judged_installed(lambda package: True).statuses}["serve"] == "works"
    doctor = Report(mode="static", static=detect_static(), patches=[], _import_drift=judged, startup_hook=True)
    assert "`vllm serve --omni` (absentpkg not installed here)" in doctor.verdict().text
    assert "absentpkg (in vllm_omni.entrypoints.openai.api_server:2; not installed here)" in doctor.render_table()
    check = Report(mode="static", static=detect_static(), patches=[], _import_drift=drift, startup_hook=True,
                   judge_packages=False)
    assert {s.id: s.status for s in check.import_drift.statuses}["serve"] == "works"


# ------------------------------------------------------------------------------ the installed pair, for real

@pytest.mark.parametrize("entrypoint", [e.id for e in ENTRYPOINTS["vllm_omni"]])
def test_static_status_agrees_with_importing_the_roots(entrypoint):
    """The doctor's static status of an entrypoint <=> importing its roots in a fresh interpreter of this env (as
    a user runs it: vllm_compat's startup hook in place) works: a verdict never more optimistic than the env, nor
    less. Where it fails, Python names one of the missing names the static check lists: in a CPU-torch env that is
    torchvision or torchaudio for the server, which the doctor judges against the env (``judged_installed``).

    The doctor judges the other distributions vllm-omni's own modules import, not what those import in turn: in an
    env that lacks a requirement of vLLM's (CPU-torch cells uninstall torchvision / torchaudio; transformers 5.22's
    Qwen2-VL image processor, which vLLM 0.34 reaches, imports torchvision), an entrypoint it says starts may still
    stop on that requirement; the test says so and skips. A user's install brings vLLM's requirements."""
    import importlib.util

    from conftest import OMNI_VERSION, VLLM_VERSION, run_python
    from vllm_compat import report

    if VLLM_VERSION is None or OMNI_VERSION is None:
        pytest.skip("needs vLLM and vllm-omni installed (any versions)")
    drift = report().import_drift
    status = next(s for s in drift.statuses + drift.part_statuses if s.id == entrypoint)
    if status.status == "absent":
        pytest.skip(f"vllm-omni {OMNI_VERSION} ships none of the {entrypoint} roots")
    lacking = [name for name in ("torchvision", "torchaudio") if importlib.util.find_spec(name) is None]
    result = run_python(
        f"""
        import importlib
        for root in {list(status.roots)!r}:
            try:
                importlib.import_module(root)
            except ImportError as exc:
                print("FAILED", root, exc)
                break
        else:
            print("IMPORTED")
        """,
        timeout=1200,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    imported = "IMPORTED" in result.stdout
    failure = result.stdout.rsplit("FAILED", 1)[-1]
    if lacking and not imported and any(f"No module named '{name}'" in failure for name in lacking):
        if status.starts:
            pytest.skip(f"this env lacks vLLM's requirement(s) {lacking}; {failure.strip()[:200]} (imported by "
                        "another distribution, which the doctor does not follow)")
        return  # the doctor says it will not start (on that package or a name of vLLM's): not optimistic
    assert imported is status.starts, (status, result.stdout[-1000:])
    if not imported:
        parts = [name.split(".") for name in status.missing]
        said = {p[-1] for p in parts} | {".".join(p[:i]) for p in parts for i in range(2, len(p) + 1)}
        assert any(f"'{s}'" in failure for s in said), (failure, status.missing)


RUNNER = "vllm.v1.worker.gpu_model_runner"
WORKERS = {"vllm_omni/worker/__init__.py": "",
           "vllm_omni/worker/gpu_ar_worker.py": "from vllm_omni.worker.gpu_ar_model_runner import Runner\n",
           "vllm_omni/worker/gpu_ar_model_runner.py": f"from {RUNNER} import GPUModelRunner as Runner\n"}


def test_a_part_that_stops_is_left_out_of_the_entrypoints_it_is_part_of(tmp_path):
    """The LLM / AR stage workers reach a removed module (vLLM 0.34's V1 runner): the offline API and the server
    still start, each names the stages as left out, the part's own status is "left_out" and the verdict's first
    words name it; where the part imports, it starts and nothing is left out."""
    files = dict(OMNI, **WORKERS, **{"vllm_omni/entrypoints/openai/api_server.py": "x = 1\n",
                                      "vllm_omni/diffusion/worker/diffusion_worker.py": "x = 1\n"})
    drift = check_import_drift(_tree(tmp_path / "omni", files), _tree(tmp_path / "host", HOST))
    statuses = {s.id: s for s in drift.statuses}
    assert sorted(statuses) == ["diffusion_stage", "offline", "serve"] and drift.starts
    llm = ENTRYPOINTS["vllm_omni"][3]
    why = f"{llm.label} (they do not start: {RUNNER} missing, no bridge in vllm_compat)"
    assert statuses["offline"].left_out == statuses["serve"].left_out == (("llm_stage", why),)
    assert statuses["diffusion_stage"].left_out == ()
    assert [(s.id, s.status) for s in drift.part_statuses] == [("llm_stage", "left_out")]
    verdict = _report(drift).verdict()
    assert verdict.kind == "works_natively" and verdict.exit_code == 0  # nothing to patch; the stages are named
    assert verdict.text.startswith(f"WORKS NATIVELY, except {llm.label}: ")
    assert verdict.text.endswith(f"Left out: {why} (llm_stage).")
    host = dict(HOST, **{"vllm/v1/worker/__init__.py": "", "vllm/v1/worker/gpu_model_runner.py": "GPUModelRunner = 1\n"})
    kept = check_import_drift(_tree(tmp_path / "omni2", files), _tree(tmp_path / "host2", host))
    assert all(s.left_out == () for s in kept.statuses) and "Left out" not in _report(kept).verdict().text
    assert [(s.id, s.status) for s in kept.part_statuses] == [("llm_stage", "works")]
    assert _report(kept).verdict().text.startswith("WORKS NATIVELY: ")
