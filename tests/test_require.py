"""``--require offline,diffusion`` (vllm_compat/require.py): doctor and check exit 0 when the entrypoints asked for
start, 1 otherwise; without it the verdict's exit code stands.

The doctor cases run on small vllm-omni-shaped trees as tests/detect/test_entrypoints.py builds them (vLLM is not
installed in every env the suite runs in), judged against an env that lacks torchvision / torchaudio as a CPU-torch
env does; the check cases on the real wheels; the usage error through the console entry (a subprocess).
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

import vllm_compat
from tests.support.trees import write_tree
from tests.support.wheels import wheel_or_skip
from vllm_compat.cli import main
from vllm_compat.decide import Decision
from vllm_compat.detect.import_drift import EntrypointStatus, check_import_drift
from vllm_compat.detect.static import detect_static
from vllm_compat.reporting import Report
from vllm_compat.require import gate, known_ids, required_entrypoints

HOST = {"vllm/__init__.py": "", "vllm/v1/__init__.py": "", "vllm/v1/gone.py": "Kept = 1\n"}
OMNI = {
    "vllm_omni/__init__.py": "from vllm.v1.gone import Kept\n",
    "vllm_omni/entrypoints/__init__.py": "",
    "vllm_omni/entrypoints/omni.py": "from vllm.v1.gone import Kept\n",
    "vllm_omni/entrypoints/async_omni.py": "from .omni import Kept\n",
    "vllm_omni/entrypoints/cli/__init__.py": "",
    "vllm_omni/entrypoints/cli/main.py": "from vllm_omni.entrypoints.openai import api_server\n",
    "vllm_omni/entrypoints/openai/__init__.py": "",
    # the server imports what a CPU-torch env does not install
    "vllm_omni/entrypoints/openai/api_server.py": "import torchaudio\nimport torchvision.transforms\n",
    "vllm_omni/diffusion/__init__.py": "",
    "vllm_omni/diffusion/stage_diffusion_proc.py": "from vllm_omni.diffusion.diffusion_engine import Engine\n",
    "vllm_omni/diffusion/diffusion_engine.py": "Engine = 1\n",
    "vllm_omni/diffusion/worker/__init__.py": "",
    "vllm_omni/diffusion/worker/diffusion_worker.py": "from vllm.v1.gone import Kept\n",
}
CPU_TORCH_LACKS = {"torchaudio", "torchvision"}
DIFFUSION_STOPS = {"vllm_omni/diffusion/worker/diffusion_worker.py": "from vllm.v1.gone import Gone\n"}
NO_DIFFUSION = {k: v for k, v in OMNI.items() if not k.startswith("vllm_omni/diffusion/")}


_tree = write_tree


def _doctor_report(tmp_path, omni_files=OMNI, patches=()):
    """The doctor's report of an env holding this pair and lacking torchaudio / torchvision (a CPU-torch env)."""
    drift = check_import_drift(_tree(tmp_path / "omni", omni_files), _tree(tmp_path / "host", HOST))
    judged = drift.judged_installed(lambda package: package not in CPU_TORCH_LACKS)
    return Report(mode="static", static=detect_static(), patches=list(patches), _import_drift=judged,
                  startup_hook=True, judge_packages=False)


@pytest.fixture
def doctor(monkeypatch, capsys):
    """Run ``vllm-compat doctor ARGS`` on a given report: (exit code, stderr)."""
    def run(report, *args):
        monkeypatch.setattr(vllm_compat, "report", lambda runtime=False: report)
        code = main(["doctor", *args])
        return code, capsys.readouterr().err
    return run


def test_cpu_torch_env_where_only_the_server_cannot_start(tmp_path, doctor):
    """The issue's done-when: a diffusion worker's health check passes where only the server cannot start."""
    report = _doctor_report(tmp_path)
    statuses = {s.id: s.status for s in report.import_drift.statuses}
    assert statuses == {"offline": "works", "serve": "will_not_start", "diffusion_stage": "works"}
    assert doctor(report)[0] == 1  # the default: every entrypoint, as before
    code, err = doctor(report, "--require", "diffusion")
    assert code == 0 and err.strip() == "vllm-compat doctor --require diffusion_stage: diffusion_stage starts; exit 0"
    assert doctor(report, "--require", "offline,diffusion")[0] == 0
    code, err = doctor(report, "--require", "diffusion,server")
    assert code == 1
    assert "serve WILL NOT START (torchaudio, torchvision not installed here)" in err and "diffusion_stage starts" in err


def test_where_the_diffusion_stage_cannot_start_the_gate_fails(tmp_path, doctor):
    report = _doctor_report(tmp_path, {**OMNI, **DIFFUSION_STOPS})
    code, err = doctor(report, "--require", "diffusion")
    assert code == 1 and "diffusion_stage WILL NOT START (vllm.v1.gone.Gone missing" in err
    assert doctor(report, "--require", "offline")[0] == 0


def test_json_holds_the_gate_and_the_verdict_as_ever(tmp_path, capsys, monkeypatch):
    import json

    report = _doctor_report(tmp_path)
    monkeypatch.setattr(vllm_compat, "report", lambda runtime=False: report)
    assert main(["doctor", "--json", "--require", "diffusion"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["require"] == {"entrypoints": {"diffusion_stage": {"starts": True, "said": "starts"}},
                               "blockers": [], "exit_code": 0}
    assert (data["verdict"]["kind"], data["exit_code"]) == ("will_not_start", 1)


def test_an_entrypoint_this_release_lacks_fails_the_gate(tmp_path, doctor):
    code, err = doctor(_doctor_report(tmp_path, NO_DIFFUSION), "--require", "diffusion")
    assert code == 1 and "diffusion_stage does not start (not in this vllm-omni release)" in err


def test_when_vllm_omni_does_not_import_nothing_starts(tmp_path, doctor):
    report = _doctor_report(tmp_path, {**OMNI, "vllm_omni/__init__.py": "from vllm.v1.gone import Gone\n"})
    code, err = doctor(report, "--require", "offline")
    assert code == 1 and "`import vllm_omni` fails: vllm.v1.gone.Gone missing" in err


def test_nothing_installed_starts_nothing(doctor):
    report = Report(mode="static", static=detect_static(), patches=[], _import_drift=None)
    assert doctor(report)[0] == report.exit_code  # the default unchanged (0: nothing to do)
    code, err = doctor(report, "--require", "offline")
    assert code == 1 and "offline does not start (" in err and "not installed)" in err


def test_a_refused_target_still_fails_the_gate(tmp_path, doctor):
    refused = Decision("diffusers_loader_meta_device", "vllm_omni.x", "refused", None, "found an unknown shape")
    code, err = doctor(_doctor_report(tmp_path, patches=[refused]), "--require", "diffusion")
    assert code == 1 and "refused target(s) left unpatched: diffusers_loader_meta_device" in err


def test_failing_on_request_does_not_pass():
    status = EntrypointStatus("serve", "`vllm serve --omni`", "fails_on_request", ("m",))
    report = SimpleNamespace(import_drift=SimpleNamespace(import_ok=True, statuses=(status,), all_statuses=(status,)),
                             runtime_error=None, mismatches=[], patches=[])
    answer = gate(report, ("serve",))
    assert answer.exit_code == 1 and answer.said["serve"].startswith("starts but FAILS ON REQUEST")


def test_a_left_out_stage_does_not_pass():
    """The LLM / AR stages left out (the offline API starts without them) fail ``--require llm``, saying why."""
    offline = EntrypointStatus("offline", "the offline API", "works_with_vllm_compat", ("m",))
    stages = EntrypointStatus("llm_stage", "vllm-omni's LLM / AR stages", "left_out", ("w",),
                              missing=("vllm.v1.worker.gpu_model_runner",))
    report = SimpleNamespace(import_drift=SimpleNamespace(import_ok=True, statuses=(offline,),
                                                          all_statuses=(offline, stages)),
                             runtime_error=None, mismatches=[], patches=[])
    assert gate(report, ("offline",)).exit_code == 0
    answer = gate(report, required_entrypoints("ar"))
    assert answer.exit_code == 1
    assert answer.said["llm_stage"] == "LEFT OUT (vllm.v1.worker.gpu_model_runner missing, no bridge in vllm_compat)"


def test_ids_aliases_and_order():
    assert known_ids() == ("offline", "serve", "diffusion_stage", "llm_stage")
    assert required_entrypoints("llm") == required_entrypoints("ar") == ("llm_stage",)
    assert required_entrypoints("diffusion, offline,diffusion_stage") == ("diffusion_stage", "offline")
    assert required_entrypoints("server") == ("serve",)
    with pytest.raises(Exception, match="known ones are offline, serve, diffusion_stage, llm_stage"):
        required_entrypoints("offline,llm_stages")
    with pytest.raises(Exception, match="name at least one entrypoint"):
        required_entrypoints(" , ")


def test_an_unknown_id_is_a_usage_error_naming_the_known_ones():
    for command in (["doctor", "--require", "offline,http"], ["check", "vllm==0.31.0", "--require", "http"]):
        result = subprocess.run([sys.executable, "-m", "vllm_compat", *command], capture_output=True, text=True,
                                timeout=120)
        assert result.returncode == 2, result.stderr
        assert "'http' is not an entrypoint id; the known ones are offline, serve, diffusion_stage" in result.stderr
        assert result.stdout == ""


def test_check_require_on_the_real_wheels(capsys):
    """vLLM 0.31.0 + vllm-omni 0.24.0: every entrypoint starts with vllm_compat (matrix cell v0.31-omni0.24)."""
    wheel_or_skip("vllm", "0.31.0")
    wheel_or_skip("vllm-omni", "0.24.0")
    assert main(["check", "vllm==0.31.0", "vllm-omni==0.24.0", "--require", "diffusion"]) == 0
    err = capsys.readouterr().err
    assert "vllm-compat check --require diffusion_stage: diffusion_stage starts with vllm_compat; exit 0" in err


def test_check_require_where_the_diffusion_stage_stops(capsys, monkeypatch):
    """With the input_preprocessor bridge off, vLLM 0.31.0 + vllm-omni 0.24.0's diffusion stage misses
    vllm.inputs.preprocess (docs/cli.md): the gate on it fails, and so does the one on the offline API."""
    wheel_or_skip("vllm", "0.31.0")
    wheel_or_skip("vllm-omni", "0.24.0")
    monkeypatch.setenv("VLLM_COMPAT_DISABLE_PATCHES", "input_preprocessor")
    assert main(["check", "vllm==0.31.0", "vllm-omni==0.24.0", "--require", "diffusion"]) == 1
    assert "diffusion_stage WILL NOT START (vllm.inputs.preprocess missing" in capsys.readouterr().err
