"""The served checks' CPU-side tools (no GPU, no vLLM): the device call list derived from prepare_serve.sh's output
(gpu/serve_calls.py) and the rule that keeps warnings out of a record's ``error_lines`` (gpu/serve_check.py), on the
lines and server logs of the runs recorded in gpu/results/."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "gpu" / "results"


def _load(name: str):
    """gpu/<name>.py by path (under pytest `gpu` can resolve to this tests/gpu package)."""
    spec = importlib.util.spec_from_file_location(f"_gpu_{name}", ROOT / "gpu" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


serve_calls = _load("serve_calls")
_serve_check = _load("serve_check")
_error_like, classify_log_lines = _serve_check._error_like, _serve_check.classify_log_lines

# ------------------------------------------------------------------------------------------------------------------
# error_lines
# ------------------------------------------------------------------------------------------------------------------

# Lines copied from gpu/results/ records (`error_lines` of serve_native.json, serve_r3/serve_compat.json,
# serve_bug.json, serve_compat0251_r1.json, serve_r5/serve_llm_compat0251_noscheduler.json).
MOE_WARNING = ("WARNING 12-03 05:49:51 [cuda.py:226] Failed to import from vllm._moe_C_stable_libtorch: "
               "ModuleNotFoundError(\"No module named 'vllm._moe_C_stable_libtorch'\")")
ULIMIT_WARNING = (
    "(APIServer pid=2251) WARNING 12-03 05:49:57 [system_utils.py:299] Found ulimit of 20000 and failed to "
    "automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like "
    "`OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n"
)
REAL_ERRORS = [
    "ModuleNotFoundError: No module named 'vllm.entrypoints.serve.disagg'",
    "NotImplementedError: Cannot copy out of meta tensor; no data! Please use torch.nn.Module.to_empty() instead of "
    "torch.nn.Module.to() when moving module from meta to a different device.",
    "(APIServer pid=2685) RuntimeError: Orchestrator initialization failed:",
    "(APIServer pid=1869) TypeError: setup_server() missing 1 required keyword-only argument: 'reuse_port'",
    "(StageEngineCoreProc_stage0_replica0 pid=2225) ERROR 12-03 22:16:13 [stage_engine_core_proc.py:178] KeyError: "
    "'chatcmpl-a49f90ebd94c06ec-b97effa1'",
    "(APIServer pid=2091) omegaconf.errors.ConfigAttributeError: Missing key model_stage. Did you mean one of: "
    "'model_tag', 'model_arch'?",
]


def test_recorded_warnings_are_warnings_and_recorded_errors_stay_errors():
    info = "INFO 12-03 05:49:51 [x.py:1] ok"
    errors, warnings = classify_log_lines([MOE_WARNING, ULIMIT_WARNING, *REAL_ERRORS, info])
    assert warnings == [MOE_WARNING, ULIMIT_WARNING]
    assert errors == REAL_ERRORS


def test_python_warnings_module_lines_and_a_raised_warning():
    lines = [
        "/tmp/vcs/deps/torch/cuda/__init__.py:61: FutureWarning: The pynvml package is deprecated. ValueError: x",
        "  warnings.warn(\"ImportError: soon\")",
        "(Worker pid=7) /x.py:3: UserWarning: TypedStorage is deprecated; Error: none",
        "Traceback (most recent call last):",
        '  File "/x.py", line 3, in <module>',
        "    warnings.warn(\"deprecated\", DeprecationWarning)",
        "DeprecationWarning: deprecated",  # raised (warnings as errors): the traceback's end is an error
        "RuntimeError: an error whose message says Warning: no",
    ]
    errors, warnings = classify_log_lines(lines)
    assert warnings == [lines[0], lines[1].strip(), lines[2]]
    assert errors == [lines[6], lines[7]]


def _recorded_logs():
    """(tarball, run name, log lines, that run's record) for every server log in gpu/results/."""
    for tb in sorted(RESULTS.rglob("*_logs.tar.gz")):
        summary = tb.with_name(tb.name.replace("_logs.tar.gz", ".json"))
        runs = json.loads(summary.read_text()).get("runs", {}) if summary.is_file() else {}
        with tarfile.open(tb) as tf:
            for m in tf.getmembers():
                if m.isfile() and m.name.endswith(".log"):
                    name = Path(m.name).stem
                    yield tb, name, tf.extractfile(m).read().decode(errors="replace").splitlines(), runs.get(name)


def _answered(rec: dict) -> bool:
    failed = any(k.endswith("_error") for k in rec)
    return not failed and (len(rec.get("images") or []) == 2 or len(rec.get("chats") or []) == 2)


def test_recorded_server_logs_successful_runs_have_no_error_lines():
    logs = list(_recorded_logs())
    assert len(logs) >= 20, "gpu/results/ should hold the served runs' logs tarballs"
    answered = 0
    moe_seen = False
    for tb, name, lines, rec in logs:
        errors, warnings = classify_log_lines(lines)
        # Nothing the old criterion caught is lost: it is an error or a warning, and every warning is logged at
        # WARNING level in these logs.
        assert sorted(errors + warnings) == sorted(ln.strip() for ln in lines if _error_like(ln)), (tb, name)
        assert all(re.search(r"(^|\) )WARNING \d\d-\d\d ", w) for w in warnings), (tb, name, warnings)
        moe_seen |= any("_moe_C_stable_libtorch" in w for w in warnings)
        if rec is not None and _answered(rec):
            answered += 1
            assert errors == [], (tb, name, errors)
        if rec is not None and not rec.get("started", True):
            assert errors, (tb, name, "a run that never served must show why")
    assert moe_seen and answered >= 10


# ------------------------------------------------------------------------------------------------------------------
# The device call list
# ------------------------------------------------------------------------------------------------------------------

def _fake_build(d: Path, calls: list[list[str]], manifest: dict[str, int], mib: float = 40) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "MANIFEST").write_text("".join(f"{p} {n} {'0' * 64} {n * 1000}\n" for p, n in manifest.items()))
    (d / "calls.txt").write_text("".join(
        f"gpu/.carry/serve/call{i} {mib:.0f} MiB: MANIFEST {' '.join(files)} \n" for i, files in enumerate(calls, 1)))
    return d


MANIFEST = {"so0251": 2, "py0251": 1, "deps": 2, "fa3_0251": 1, "omni024": 1, "fa3_024": 1, "py024": 1, "so024": 2}
CALLS = [
    ["so0251.tar.xz.00", "so0251.tar.xz.01", "py0251.tar.xz.00"],
    ["deps.tar.xz.00", "deps.tar.xz.01", "fa3_0251.tar.xz.00"],
    ["omni024.tar.xz.00", "fa3_024.tar.xz.00"],  # the 0.25.1 set is complete here
    ["py024.tar.xz.00", "so024.tar.xz.00"],
    ["so024.tar.xz.01"],  # and the 0.24.0 set here
]


def test_plan_gives_each_phase_the_first_call_that_completes_its_parts(tmp_path):
    d = _fake_build(tmp_path / "serve", CALLS, MANIFEST)
    rows = serve_calls.plan(serve_calls.read_calls(d / "calls.txt"), serve_calls.read_manifest(d / "MANIFEST"))
    assert [(r["call"], r["carry"], r["phase"]) for r in rows] == [
        (1, ["gpu/.carry/serve/call1"], "unpack"),
        (2, ["gpu/.carry/serve/call2"], "unpack"),
        (3, ["gpu/.carry/serve/call3"], "bug"),
        (4, ["gpu/.carry/serve/call4"], "unpack"),
        (5, ["gpu/.carry/serve/call5"], "native"),
        (6, [], "compat"),
        (7, [], "llm"),
        (8, [], "llm_noscheduler"),
    ]
    # Other knobs, other calls: the same slices in two calls put bug in call 1 and native in call 2.
    two = _fake_build(tmp_path / "two", [sum(CALLS[:3], []), sum(CALLS[3:], [])], MANIFEST)
    rows = serve_calls.plan(serve_calls.read_calls(two / "calls.txt"), MANIFEST, ("bug", "native", "llm_sync"))
    assert [(r["carry"] != [], r["phase"]) for r in rows] == [(True, "bug"), (True, "native"), (False, "llm_sync")]
    # One call holding everything: one phase a call, the second with no carry.
    one = _fake_build(tmp_path / "one", [sum(CALLS, [])], MANIFEST)
    rows = serve_calls.plan(serve_calls.read_calls(one / "calls.txt"), MANIFEST, ("bug", "native"))
    assert [(r["carry"], r["phase"]) for r in rows] == [(["gpu/.carry/serve/call1"], "bug"), ([], "native")]
    # SERVE_COMPAT024=1 makes compat need the 0.24.0 parts too.
    rows = serve_calls.plan(serve_calls.read_calls(d / "calls.txt"), MANIFEST, ("compat",),
                            env={"SERVE_COMPAT024": "1"})
    assert [r["phase"] for r in rows] == ["unpack"] * 4 + ["compat"]


def test_plan_refuses_a_phase_whose_parts_never_arrive_and_an_unknown_phase(tmp_path):
    d = _fake_build(tmp_path, CALLS[:3], MANIFEST)
    calls = serve_calls.read_calls(d / "calls.txt")
    with pytest.raises(ValueError, match="native needs fa3_024|native needs .*py024"):
        serve_calls.plan(calls, MANIFEST)
    with pytest.raises(ValueError, match="unknown phase 'natve'"):
        serve_calls.plan(calls, MANIFEST, ("natve",))


def test_cli_dry_run_on_a_fake_build_prints_the_calls_and_checks_the_size(tmp_path):
    d = _fake_build(tmp_path / "ok", CALLS, MANIFEST)
    run = subprocess.run([sys.executable, "gpu/serve_calls.py", "--dir", str(d), "--json"], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert [r["phase"] for r in out["calls"]][:5] == ["unpack", "unpack", "bug", "unpack", "native"]
    if out["tree_mib"] is not None:  # a git checkout: the tree that travels beside each carry is measured
        assert 0 < out["tree_mib"] < 20
        assert out["calls"][0]["total_mib"] == pytest.approx(40 + out["tree_mib"], abs=0.01)
        # A call folder as large as the old default (60 MiB) leaves under the 2 MiB margin beside this tree.
        big = _fake_build(tmp_path / "big", CALLS, MANIFEST, mib=62)
        run = subprocess.run([sys.executable, "gpu/serve_calls.py", "--dir", str(big)], cwd=ROOT,
                             capture_output=True, text=True)
        assert run.returncode == 1 and "re-slice smaller" in run.stderr, run.stderr
    run = subprocess.run([sys.executable, "gpu/serve_calls.py", "--dir", str(tmp_path / "none")], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 1 and "prepare_serve.sh" in run.stderr


def test_phase_table_matches_serve_run_and_prepare_serve():
    run_sh = (ROOT / "gpu" / "serve_run.sh").read_text()
    phases = {"unpack", *re.findall(r'\[ "\$phase" = (\w+) \]', run_sh)}
    assert phases == set(serve_calls.PHASES)
    assert set(serve_calls.DEFAULT_PHASES) <= phases
    prep = (ROOT / "gpu" / "prepare_serve.sh").read_text()
    (order,) = re.findall(r"^for part in ([\w ]+); do$", prep, flags=re.M)
    assert set(order.split()) == set(serve_calls.BOTH)
    assert subprocess.run([sys.executable, "gpu/serve_calls.py", "needs", "nope"], cwd=ROOT,
                          capture_output=True).returncode == 2


def test_build_folders_are_git_ignored():
    paths = ["gpu/.serve-build/parts/py024.tar.xz", "gpu/.serve-build/real26/vllm/__init__.py",
             "gpu/.carry/serve/call1/MANIFEST", "gpu/.carry/site.tar.xz", "gpu/.carry/whl26/x.whl"]
    try:
        run = subprocess.run(["git", "-C", str(ROOT), "check-ignore", *paths], capture_output=True, text=True)
    except OSError:
        pytest.skip("no git here")
    if run.returncode == 128:
        pytest.skip("not a git checkout")
    assert run.stdout.split() == paths
