"""The short screen of ``vllm-compat check`` and ``doctor`` (issue 34, parts 1 and 4): at most 25 lines and 100
columns for every pair of matrix/vllm.toml, the verdict's first words and the exit code of ``--json``, one line for
the loader decision (issue 39); ``--verbose`` is the full report (every drift point with its reason, the verdict
word for word), wrapped at ``--width`` with nothing cut.

The sweep reads every vLLM wheel of the matrix (0.24-0.34): it runs where tests/test_check.py's sweep does (outside
nox, or in the first default nox cell). The doctor cases run on small vllm-omni-shaped trees, as
tests/test_require.py builds them, with a refused and a disabled drift point.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import vllm_compat
from tests.support.trees import write_tree
from tests.support.wheels import wheel_or_skip
from vllm_compat.cli import main
from vllm_compat.decide import Decision
from vllm_compat.detect.import_drift import check_import_drift
from vllm_compat.detect.static import detect_static
from vllm_compat.reporting import Report

tomllib = pytest.importorskip("tomllib", reason="reading matrix/vllm.toml needs Python >= 3.11 (tomllib)")

ROOT = Path(__file__).resolve().parent.parent
CELLS = tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]
SWEEP_CELL = next(c["id"] for c in CELLS if c.get("default"))
PAIRS = sorted({(c["vllm"], c["vllm_omni"]) for c in CELLS if c.get("vllm_omni")},
               key=lambda pair: [tuple(map(int, v.split("."))) for v in pair])
sweep_here = pytest.mark.skipif(
    os.environ.get("VLLM_COMPAT_CELL") not in (None, SWEEP_CELL),
    reason=f"reads every vLLM wheel of the matrix: it runs in nox cell {SWEEP_CELL} only, as test_check's sweep",
)
MAX_LINES, MAX_COLUMNS = 25, 100
STATUS_TEXT = {"works": "starts natively", "works_with_vllm_compat": "starts with vllm_compat",
               "will_not_start": "WILL NOT START", "fails_on_request": "starts, FAILS ON REQUEST",
               "absent": "not in this vllm-omni release", "left_out": "LEFT OUT"}


def _run(capsys, *args) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().out


def _squash(text: str) -> str:
    """``text`` without whitespace: what a wrapped screen says, wherever its lines break."""
    return "".join(text.split())


LOADER_ID = "diffusers_loader_meta_device"  # the loader decision's drift point (README's decision table)


def _loader_line(lines: list[str], decision: dict) -> str:
    """The screen's one loader line, checked against the loader's decision in ``--json``."""
    (line,) = [line for line in lines if line.startswith("  loader: ")]
    says = {"patched": f"{decision.get('variant')} patch", "skipped": "left alone", "pending": "pending",
            "refused": "REFUSED, left unpatched", "disabled": "disabled"}[decision["action"]]
    assert line.startswith(f"  loader: {says}: "), line
    assert decision["reason"].startswith(line.split(": ", 2)[2].removesuffix("...")), line
    return line


def _first_words(verdict_text: str) -> str:
    """"WORKS WITH vllm_compat", "WILL NOT START", ...: the verdict up to its first colon."""
    return verdict_text.split(":", 1)[0]


def _assert_fits(screen: str, width: int = MAX_COLUMNS) -> list[str]:
    """The screen's lines, after checking none is wider than ``width`` and, at the default width, that there are
    at most 25 (a narrower screen wraps onto more)."""
    lines = screen.rstrip("\n").splitlines()
    assert width < MAX_COLUMNS or len(lines) <= MAX_LINES, f"{len(lines)} lines:\n{screen}"
    too_wide = [line for line in lines if len(line) > width]
    assert not too_wide, f"wider than {width} columns: {too_wide}"
    return lines


@sweep_here
@pytest.mark.parametrize("pair", PAIRS, ids=[f"v{v}-omni{o}" for v, o in PAIRS])
def test_every_matrix_pair_fits_one_screen_with_the_same_verdict(capsys, pair):
    vllm, omni = pair
    wheel_or_skip("vllm", vllm)
    wheel_or_skip("vllm-omni", omni)
    spec = (f"vllm=={vllm}", f"vllm-omni=={omni}")
    json_code, out = _run(capsys, "check", "--json", *spec)
    data = json.loads(out)
    code, screen = _run(capsys, "check", *spec)
    lines = _assert_fits(screen)
    assert code == json_code == data["exit_code"]
    (start,) = [i for i, line in enumerate(lines) if line.startswith("  verdict: ")]
    verdict = " ".join(line.strip() for line in lines[start:] if not line.strip().startswith("(--verbose"))
    assert verdict.startswith(f"verdict: {_first_words(data['verdict']['text'])}:")  # what is left out included
    # one line per entrypoint, with its status as --json says it
    entrypoints = data["import_drift"]["entrypoints"] if data["import_drift"]["import_ok"] else {}
    for status in entrypoints.values():
        (line,) = [line for line in lines if line.startswith(f"  {status['label']}  ")]
        assert STATUS_TEXT[status["status"]] in line, line
    if not data["import_drift"]["import_ok"]:
        assert any("WILL NOT IMPORT" in line for line in lines)
    # every drift point that acts is named or counted, and the override lines with the install command
    acting = [p["name"] for p in data["patches"] if p["action"] == "patched"]
    unnamed = [name for name in acting if name not in screen]  # past five lines, the rest by count
    assert not unnamed or f", +{len(unnamed)} more (--verbose)" in " ".join(line.strip() for line in lines)
    assert f"acts on {len(acting)} of {len(data['patches'])}" in screen or not acting
    for override in data["dependency_drift"]["overrides"]:
        assert override in screen and f"uv pip install {spec[0]} {spec[1]} --override" in screen
    _loader_line(lines, next(p for p in data["patches"] if p["name"] == LOADER_ID))
    # --verbose: the full report, every reason and the verdict word for word, wrapped; same exit code
    verbose_code, full = _run(capsys, "check", "--verbose", *spec)
    assert verbose_code == code
    assert not [line for line in full.splitlines() if len(line) > MAX_COLUMNS]
    assert _squash(f"  verdict: {data['verdict']['text']}") in _squash(full)
    assert all(_squash(p["reason"]) in _squash(full) for p in data["patches"])


def test_the_numbers_the_issue_quotes(capsys):
    """vLLM 0.34.0 + vllm-omni 0.24.0 (every entrypoint starts with vllm_compat, the LLM / AR stages left out, one
    override): the short screen has what a user acts on and none of the long lines."""
    wheel_or_skip("vllm", "0.34.0")
    wheel_or_skip("vllm-omni", "0.24.0")
    code, screen = _run(capsys, "check", "vllm==0.34.0", "vllm-omni==0.24.0")
    lines = _assert_fits(screen)
    assert code == 0 and 15 <= len(lines)
    # the LLM / AR stages have their own line, and what is left out is part of the verdict's first words
    assert any(line.startswith("  vllm-omni's LLM / AR stages ") and "LEFT OUT: vllm.v1." in line for line in lines)
    assert screen.split("verdict: ", 1)[1].startswith("WORKS WITH vllm_compat, except vllm-omni's LLM / AR stages")
    assert "huggingface-hub==2.4.0 (tested)" in screen
    # vllm-omni 0.24.0's legacy loader on a vLLM whose quantization leaves params on meta (README)
    assert any(line.startswith("  loader: meta_safe patch: legacy loader, and vLLM (uses_meta_device) can leave "
                               "params on meta") for line in lines)
    install = next(line for line in lines if line.startswith("    install"))  # verified or said not to be
    assert "uv pip install vllm==0.34.0 vllm-omni==0.24.0 --override overrides.txt" in " ".join(
        " ".join(lines[lines.index(install):]).split())
    assert "drift point  " not in screen and "still stops it" not in screen  # the verbose table's
    code, narrow = _run(capsys, "check", "--width", "72", "vllm==0.34.0", "vllm-omni==0.24.0")
    assert code == 0
    _assert_fits(narrow, 72)


def test_an_entrypoint_that_will_not_start_names_its_first_reason(capsys, monkeypatch):
    """vLLM 0.31.0 + vllm-omni 0.24.0 with the input_preprocessor bridge off (docs/cli.md): each entrypoint WILL
    NOT START for vllm.inputs.preprocess, and the disabled drift point is on its own line."""
    wheel_or_skip("vllm", "0.31.0")
    wheel_or_skip("vllm-omni", "0.24.0")
    monkeypatch.setenv("VLLM_COMPAT_DISABLE_PATCHES", "input_preprocessor")
    code, screen = _run(capsys, "check", "vllm==0.31.0", "vllm-omni==0.24.0")
    lines = _assert_fits(screen)
    assert code == 1
    assert "  the diffusion stage                 WILL NOT START: vllm.inputs.preprocess missing" in lines
    assert "  disabled: input_preprocessor (VLLM_COMPAT_DISABLE_PATCHES)" in lines
    assert any(line.startswith("  verdict: WILL NOT START: ") for line in lines)


# ------------------------------------------------------------------------------------ doctor, small trees

HOST = {"vllm/__init__.py": "", "vllm/v1/__init__.py": "", "vllm/v1/gone.py": "Kept = 1\n"}
OMNI = {
    "vllm_omni/__init__.py": "from vllm.v1.gone import Kept\n",
    "vllm_omni/entrypoints/__init__.py": "",
    "vllm_omni/entrypoints/omni.py": "from vllm.v1.gone import Kept\n",
    "vllm_omni/entrypoints/async_omni.py": "from .omni import Kept\n",
    "vllm_omni/entrypoints/cli/__init__.py": "",
    "vllm_omni/entrypoints/cli/main.py": "from vllm_omni.entrypoints.openai import api_server\n",
    "vllm_omni/entrypoints/openai/__init__.py": "",
    "vllm_omni/entrypoints/openai/api_server.py": "from vllm.v1.gone import Gone\n",  # the server stops
    "vllm_omni/diffusion/__init__.py": "",
    "vllm_omni/diffusion/stage_diffusion_proc.py": "from vllm_omni.diffusion.diffusion_engine import Engine\n",
    "vllm_omni/diffusion/diffusion_engine.py": "Engine = 1\n",
    "vllm_omni/diffusion/worker/__init__.py": "",
    "vllm_omni/diffusion/worker/diffusion_worker.py": "from vllm.v1.gone import Kept\n",
}
LOADER = "vllm_omni.diffusion.model_loader.diffusers_loader.DiffusersPipelineLoader._process_weights_after_loading"
REFUSED = Decision("diffusers_loader_meta_device", LOADER, "refused", None,
                   "vllm-omni's _process_weights_after_loading has a shape vllm_compat does not recognize "
                   "(expected a blanket module.to(), found something else); set VLLM_COMPAT_LOADER_VARIANT to "
                   "force a variant " + "and more words " * 10)
DISABLED = Decision("hsdp_load_order", "DiffusersPipelineLoader.load_model", "disabled", None,
                    "hsdp_load_order is listed in VLLM_COMPAT_DISABLE_PATCHES")


_tree = write_tree


def _doctor_report(tmp_path, omni_files=OMNI, patches=()) -> Report:
    drift = check_import_drift(_tree(tmp_path / "omni", omni_files), _tree(tmp_path / "host", HOST))
    return Report(mode="static", static=detect_static(), patches=list(patches), _import_drift=drift,
                  startup_hook=True, judge_packages=False)


@pytest.fixture
def doctor(monkeypatch, capsys):
    """``vllm-compat doctor ARGS`` on a given report: (exit code, stdout)."""
    def run(report, *args):
        monkeypatch.setattr(vllm_compat, "report", lambda runtime=False: report)
        return _run(capsys, "doctor", *args)
    return run


def test_doctor_short_screen_names_refused_and_disabled_drift_points(tmp_path, doctor):
    report = _doctor_report(tmp_path, patches=[REFUSED, DISABLED])
    code, screen = doctor(report)
    lines = _assert_fits(screen)
    json_code, out = doctor(report, "--json")
    data = json.loads(out)
    assert code == json_code == data["exit_code"] == 1
    assert lines[0] == "vllm-compat doctor (static: read from files, nothing imported)"
    refused = [line for line in lines if line.startswith("  refused: diffusers_loader_meta_device (vllm-omni's ")]
    assert len(refused) == 1 and refused[0].endswith("...") and len(refused[0]) == MAX_COLUMNS
    assert "  disabled: hsdp_load_order (VLLM_COMPAT_DISABLE_PATCHES)" in lines
    assert any(line.startswith("  `vllm serve --omni`") and "WILL NOT START: vllm.v1.gone.Gone missing" in line
               for line in lines)
    (start,) = [i for i, line in enumerate(lines) if line.startswith("  verdict: ")]
    verdict = " ".join(line.strip() for line in lines[start:] if not line.strip().startswith("(--verbose"))
    assert verdict.startswith(f"verdict: {_first_words(data['verdict']['text'])}:")  # what is left out included
    code, full = doctor(report, "--verbose")
    assert code == 1 and full == report.render_table(MAX_COLUMNS) + "\n" and _squash(REFUSED.reason) in _squash(full)
    assert not [line for line in full.splitlines() if len(line) > MAX_COLUMNS]
    code, narrow = doctor(report, "--width", "60")
    _assert_fits(narrow, 60)
    code, narrow_full = doctor(report, "--verbose", "--width", "60")
    assert not [line for line in narrow_full.splitlines() if len(line) > 60]
    assert _squash(narrow_full) == _squash(report.render_table())  # wrapped, nothing cut


def test_doctor_short_screen_on_a_pair_that_works(tmp_path, doctor):
    omni = {**OMNI, "vllm_omni/entrypoints/openai/api_server.py": "from vllm.v1.gone import Kept\n"}
    report = _doctor_report(tmp_path, omni)
    code, screen = doctor(report)
    lines = _assert_fits(screen)
    assert code == 0 and report.verdict().kind == "works_natively"
    assert sum(line.endswith("  starts natively") for line in lines) == 3
    assert any(line.startswith("  verdict: WORKS NATIVELY: ") for line in lines)
    assert "refused" not in screen and "disabled" not in screen


# ------------------------------------------------------------------------------------------- the loader line

LEGACY = Decision(LOADER_ID, LOADER, "patched", "meta_safe", "legacy loader, and vLLM (uses_meta_device) can leave "
                  "params on meta; module.to() would crash on them")
GATED = Decision(LOADER_ID, LOADER, "skipped", None, "vllm-omni's loader already has the gated meta-safe fix")
ABSENT = Decision(LOADER_ID, LOADER, "pending", None, "vllm-omni is not installed; patched when it is imported")


@pytest.mark.parametrize(("decision", "expected"), [
    (LEGACY, "  loader: meta_safe patch: legacy loader, and vLLM (uses_meta_device) can leave params on meta"),
    (GATED, "  loader: left alone: vllm-omni's loader already has the gated meta-safe fix"),
    (ABSENT, "  loader: pending: vllm-omni is not installed; patched when it is imported"),
    (REFUSED, None),
], ids=["legacy", "gated", "pending", "refused"])
@pytest.mark.parametrize("width", [MAX_COLUMNS, 60])
def test_the_loader_decision_has_one_line(tmp_path, doctor, decision, expected, width):
    """The legacy loader gets meta_safe, a gated one is left alone: one line on the doctor's short screen, whatever
    else acts, the reason shortened at its first ";" and then at a word to fit the width."""
    code, screen = doctor(_doctor_report(tmp_path, patches=[decision, DISABLED]), "--width", str(width))
    lines = _assert_fits(screen, width)
    (line,) = [line for line in lines if line.startswith("  loader: ")]
    expected = expected or f"  loader: REFUSED, left unpatched: {REFUSED.reason}"
    clause = expected.split(";", 1)[0]
    if len(expected) <= width:
        assert line == expected
    elif len(clause) <= width:
        assert line == clause
    else:  # cut at a word
        assert line.endswith("...") and not line[:-3].endswith(" ") and clause.startswith(line[:-3])
        assert clause[len(line) - 3] == " "
    assert lines.index(line) < next(i for i, x in enumerate(lines) if x.startswith("  disabled: "))


def test_check_names_the_loader_decision_of_the_real_wheels(capsys):
    """vllm-omni 0.24.0 ships the legacy loader (patched with meta_safe on vLLM 0.31.0, whose quantization leaves
    params on meta); 0.28.0 the gated one (left alone): docs/drift-points, README."""
    for vllm, omni, says in (("0.31.0", "0.24.0", "meta_safe patch"), ("0.28.0", "0.28.0", "left alone")):
        wheel_or_skip("vllm", vllm)
        wheel_or_skip("vllm-omni", omni)
        code, screen = _run(capsys, "check", f"vllm=={vllm}", f"vllm-omni=={omni}")
        lines = _assert_fits(screen)
        _, out = _run(capsys, "check", "--json", f"vllm=={vllm}", f"vllm-omni=={omni}")
        line = _loader_line(lines, next(p for p in json.loads(out)["patches"] if p["name"] == LOADER_ID))
        assert line.startswith(f"  loader: {says}: ")


def test_check_verbose_wraps_at_the_width_and_keeps_every_word(capsys):
    wheel_or_skip("vllm", "0.31.0")
    wheel_or_skip("vllm-omni", "0.24.0")
    spec = ("vllm==0.31.0", "vllm-omni==0.24.0")
    _, whole = _run(capsys, "check", "--verbose", "--width", "100000", *spec)
    assert max(len(line) for line in whole.splitlines()) > MAX_COLUMNS  # there is something to wrap
    for width in (MAX_COLUMNS, 60, 40):
        code, wrapped = _run(capsys, "check", "--verbose", "--width", str(width), *spec)
        assert not [line for line in wrapped.splitlines() if len(line) > width]
        assert code in (0, 1) and _squash(wrapped) == _squash(whole)  # nothing cut, nothing added
