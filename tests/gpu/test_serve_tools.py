"""The served checks' CPU-side tools (no GPU): the device call list derived from prepare_serve.sh's output
(gpu/serve_calls.py), the phases of gpu/serve_run.sh and the parts gpu/prepare_serve.sh builds for them, the rule that
keeps warnings out of a record's ``error_lines`` (gpu/serve_check.py) on the lines and server logs of the runs
recorded in gpu/results/, the offline run's record (``serve_check.py omni``, its child stood in for), and, where
vllm-omni is installed, what its own loader makes of the stage configs the phases pass (``serve_check.py
stage-config``)."""

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
    rows = serve_calls.plan(serve_calls.read_calls(d / "calls.txt"), serve_calls.read_manifest(d / "MANIFEST"),
                            serve_calls.RERUNS["issue24"])
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
        serve_calls.plan(calls, MANIFEST, serve_calls.RERUNS["issue24"])
    with pytest.raises(ValueError, match="llm026 needs .*fa3_026"):  # a 0.24/0.25.1 build cannot run issue 35
        serve_calls.plan(calls, MANIFEST)
    with pytest.raises(ValueError, match="unknown phase 'natve'"):
        serve_calls.plan(calls, MANIFEST, ("natve",))


def test_cli_dry_run_on_a_fake_build_prints_the_calls_and_checks_the_size(tmp_path):
    d = _fake_build(tmp_path / "ok", CALLS, MANIFEST)
    run = subprocess.run([sys.executable, "gpu/serve_calls.py", "--dir", str(d), "--json", "--phases", "issue24"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert [r["phase"] for r in out["calls"]][:5] == ["unpack", "unpack", "bug", "unpack", "native"]
    if out["tree_mib"] is not None:  # a git checkout: the tree that travels beside each carry is measured
        assert 0 < out["tree_mib"] < 20
        assert out["calls"][0]["total_mib"] == pytest.approx(40 + out["tree_mib"], abs=0.01)
        # A call folder as large as the old default (60 MiB) leaves under the 2 MiB margin beside this tree.
        big = _fake_build(tmp_path / "big", CALLS, MANIFEST, mib=62)
        run = subprocess.run([sys.executable, "gpu/serve_calls.py", "--dir", str(big), "--phases", "bug"], cwd=ROOT,
                             capture_output=True, text=True)
        assert run.returncode == 1 and "re-slice smaller" in run.stderr, run.stderr
    run = subprocess.run([sys.executable, "gpu/serve_calls.py", "--dir", str(tmp_path / "none")], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 1 and "prepare_serve.sh" in run.stderr


def _prepare_parts(sets: str | None = None) -> list[str]:
    """The parts gpu/prepare_serve.sh builds, in carry order, for SERVE_SETS=``sets`` (default: its own default):
    its SETS / ver_of / omni_of / PARTS lines, run by bash."""
    prep = (ROOT / "gpu" / "prepare_serve.sh").read_text().splitlines()
    start = next(i for i, line in enumerate(prep) if line.startswith("SETS="))
    first = next(i for i, line in enumerate(prep) if line.startswith("ver_of()"))
    end = next(i for i, line in enumerate(prep) if i > first and line == "done")
    script = "\n".join([prep[start], *prep[first:end + 1], 'echo "${PARTS[@]}"'])
    env = {"PATH": "/usr/bin:/bin", **({"SERVE_SETS": sets} if sets else {})}
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True).stdout.split()


def test_phase_table_matches_serve_run_and_prepare_serve():
    run_sh = (ROOT / "gpu" / "serve_run.sh").read_text()
    phases = {"unpack", *re.findall(r'\[ "\$phase" = (\w+) \]', run_sh)}
    assert phases == set(serve_calls.PHASES)
    assert all(set(run) <= phases for run in serve_calls.RERUNS.values())
    assert serve_calls.DEFAULT_PHASES == serve_calls.RERUNS["issue35"]
    # Every phase is in serve_run.sh's header and in the how-to (gpu/results.md).
    how_to = (ROOT / "gpu" / "results.md").read_text()
    for phase in phases:
        assert f"serve_run.sh {phase} " in run_sh, phase
        assert f"`{phase}`" in how_to, phase
    # prepare_serve.sh builds the parts every phase needs, the first set of SERVE_SETS first.
    parts = _prepare_parts()
    assert parts[:5] == list(serve_calls.SET_026) and set(parts) == set(serve_calls.ALL_PARTS)
    assert _prepare_parts("026") == list(serve_calls.SET_026)
    assert set(_prepare_parts("0251 024")) == set(serve_calls.BOTH)
    for tag in ("024", "0.25.1", "0.26.0"):
        assert (ROOT / "gpu" / f"deps-serve-v{'0.24.0' if tag == '024' else tag}.txt").is_file()
    assert subprocess.run([sys.executable, "gpu/serve_calls.py", "needs", "nope"], cwd=ROOT,
                          capture_output=True).returncode == 2
    # The stage configs the phases pass exist.
    for stages in re.findall(r"\$PWD/(gpu/[\w.]+\.yaml)", run_sh):
        assert (ROOT / stages).is_file(), stages


def test_bash_scripts_parse():
    for script in ("prepare_serve.sh", "serve_run.sh", "device_env_serve.sh"):
        done = subprocess.run(["bash", "-n", str(ROOT / "gpu" / script)], capture_output=True, text=True)
        assert done.returncode == 0, (script, done.stderr)


MANIFEST_35 = {"so026": 2, "py026": 1, "deps": 2, "fa3_026": 1, "omni026": 1, **{
    k: v for k, v in MANIFEST.items() if k != "deps"}}
CALLS_35 = [
    ["so026.tar.xz.00", "so026.tar.xz.01", "py026.tar.xz.00"],
    ["deps.tar.xz.00", "deps.tar.xz.01", "fa3_026.tar.xz.00", "omni026.tar.xz.00"],  # the 0.26.0 set is complete
    ["so0251.tar.xz.00", "so0251.tar.xz.01", "py0251.tar.xz.00"],
    ["fa3_0251.tar.xz.00", "omni024.tar.xz.00", "fa3_024.tar.xz.00"],
    ["py024.tar.xz.00", "so024.tar.xz.00", "so024.tar.xz.01"],  # and the 0.25.1 + 0.24.0 sets here
]


def test_issue35_plan_runs_the_026_phases_while_the_other_sets_are_carried(tmp_path):
    d = _fake_build(tmp_path / "serve35", CALLS_35, MANIFEST_35)
    rows = serve_calls.plan(serve_calls.read_calls(d / "calls.txt"), serve_calls.read_manifest(d / "MANIFEST"))
    assert [(r["call"], r["carry"] != [], r["phase"]) for r in rows] == [
        (1, True, "unpack"), (2, True, "llm026"), (3, True, "llm026_async"), (4, True, "image026"),
        (5, True, "omni026"), (6, False, "omni0251"),
    ]
    rows = serve_calls.plan(serve_calls.read_calls(d / "calls.txt"), MANIFEST_35,
                            serve_calls.phase_list("issue35_all"))
    assert [r["phase"] for r in rows][5:] == ["omni0251", "llm026_noec", "omni0251_noscheduler"]
    assert [r["carry"] for r in rows][5:] == [[], [], []]
    run = subprocess.run([sys.executable, "gpu/serve_calls.py", "--dir", str(d), "--json"], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert [r["phase"] for r in json.loads(run.stdout)["calls"]] == ["unpack", "llm026", "llm026_async", "image026",
                                                                      "omni026", "omni0251"]
    # A build of the 0.26.0 set alone (SERVE_SETS=026) runs issue 35's 0.26.0 phases and refuses part 2.
    alone = _fake_build(tmp_path / "alone", CALLS_35[:2], {p: MANIFEST_35[p] for p in serve_calls.SET_026})
    calls = serve_calls.read_calls(alone / "calls.txt")
    rows = serve_calls.plan(calls, serve_calls.read_manifest(alone / "MANIFEST"), ("llm026", "image026", "omni026"))
    assert [(r["carry"] != [], r["phase"]) for r in rows] == [(True, "unpack"), (True, "llm026"), (False, "image026"),
                                                               (False, "omni026")]
    with pytest.raises(ValueError, match="omni0251 needs "):
        serve_calls.plan(calls, serve_calls.read_manifest(alone / "MANIFEST"))


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


# ------------------------------------------------------------------------------------------------------------------
# The offline run (serve_check.py omni) and the stage configs (serve_check.py stage-config)
# ------------------------------------------------------------------------------------------------------------------

GENERATIONS = ("import json, sys; out = {'outputs': [{'text': 'ab', 'token_ids': [1, 2], 'finish_reason': 'length'}]}; "
               "json.dump({'generations': [out, out], 'init_s': 1.0}, open(sys.argv[3], 'w'))")


def test_offline_record_from_the_childs_result(tmp_path, monkeypatch):
    """The record ``omni`` writes from its child's result file and log (the child stood in for: it needs a GPU)."""
    monkeypatch.setattr(_serve_check, "OMNI_CHILD", GENERATIONS + "; print(" + repr(MOE_WARNING) + ")")
    rec = _serve_check.offline("ok", tmp_path / "m", tmp_path, stages=tmp_path / "s.yaml", timeout=60)
    assert rec["generated"] and rec["repeat_equal"] and rec["exit_code"] == 0 and rec["init_s"] == 1.0
    assert rec["error_lines"] == [] and rec["warning_lines"] == [MOE_WARNING]
    assert json.loads((tmp_path / "ok.json").read_text())["generated"]
    # A child that fails prints its traceback and hangs (a stage that died): stopped after the grace, not generated.
    monkeypatch.setattr(_serve_check, "TRACEBACK_GRACE_S", 1.0)
    monkeypatch.setattr(_serve_check, "OMNI_CHILD", "import sys, time; print('Traceback (most recent call last):'); "
                        "print('RuntimeError: Orchestrator initialization failed'); sys.stdout.flush(); time.sleep(60)")
    rec = _serve_check.offline("stuck", tmp_path / "m", tmp_path, stages=tmp_path / "s.yaml", timeout=60)
    assert not rec["generated"] and "stopped_after_traceback_s" in rec and rec["wall_s"] < 30
    assert rec["error_lines"] == ["RuntimeError: Orchestrator initialization failed"]


def _omni_version():
    try:
        from importlib.metadata import version

        return version("vllm-omni")
    except Exception:  # noqa: BLE001 - not installed
        return None


@pytest.mark.skipif(_omni_version() is None, reason="needs vllm-omni installed (a cell env): its own stage loader")
@pytest.mark.parametrize(("stages", "scheduler"), [("llm_stage.yaml", "OmniARScheduler"),
                                                   ("llm_stage_async.yaml", "OmniARAsyncScheduler")])
def test_stage_configs_parse_with_the_installed_vllm_omnis_loader(tmp_path, stages, scheduler):
    """gpu/llm_stage.yaml (vllm-omni 0.24.0's legacy format) through the installed vllm-omni's own loader, engine-args
    builder and ``OmniEngineArgs``: the same engine args for 0.24.0 and 0.26.0, nothing dropped, the scheduler class
    named; 0.28.0+ dropped the legacy format (deploy configs only), which the record says."""
    from packaging.version import Version

    (tmp_path / "config.json").write_text(json.dumps({  # the tiny Qwen2's config (the loader reads nothing else)
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 320, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1}))
    # vllm_compat active, as users run it: vllm-omni 0.24.0 imports its stage config through scheduler modules
    # that need a stand-in on vLLM 0.31+ (RoutedExpertsLists); the loader it reaches is vllm-omni's own either way
    done = subprocess.run([sys.executable, "gpu/serve_check.py", "stage-config", str(tmp_path), f"gpu/{stages}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    if done.returncode != 0 and last.startswith(("ImportError", "ModuleNotFoundError")):
        pytest.skip(f"vllm-omni's stage-config modules do not import on this vLLM, vllm_compat active: {last}")
    assert done.returncode == 0, done.stderr[-3000:]
    rec = json.loads(done.stdout.split("STAGE_CONFIG ", 1)[1])
    if Version(_omni_version()) >= Version("0.28"):
        assert rec == {"legacy_stage_configs": False, "loader_parameters": rec["loader_parameters"]}
        assert "stage_configs_path" not in rec["loader_parameters"]
        return
    assert rec["legacy_stage_configs"] and rec["stages"] == 1 and rec["stage_type"] == "llm"
    assert rec["dropped_by_omni_engine_args"] == []
    args = rec["omni_engine_args"]
    assert args["scheduler_cls"] == f"vllm_omni.core.sched.omni_ar_scheduler.{scheduler}"
    assert rec["scheduler_mro"][0] == scheduler
    assert (args["model_arch"], args["model_stage"], args["worker_type"]) == ("TransformersForCausalLM", "llm", "ar")
    assert args["async_scheduling"] is None  # vLLM's default: on, resolved on the GPU
    if Version(_omni_version()) >= Version("0.26"):  # its engine reads the file as a deploy config too
        assert rec["deploy_reads"] == {"pipeline_config": None, "deploy_config": "DeployConfig"}


# ------------------------------------------------------------------------------------------------------------------
# The how-to's call table (gpu/results.md) is serve_calls' plan
# ------------------------------------------------------------------------------------------------------------------

# The parts of the build carried 2026-12-06 (after the pack_py fix): part, slices, sha256, bytes.
RECORDED_MANIFEST = RESULTS / "serve_build" / "MANIFEST"
ALONE_026 = ("llm026", "llm026_async", "image026", "omni026")


def _default_build() -> tuple[list[dict], dict[str, int]]:
    """The call folders a default `bash gpu/prepare_serve.sh` makes (its SERVE_SETS, SLICE_MB and CALL_MB defaults,
    read from the script) of parts the sizes of RECORDED_MANIFEST's, packed by serve_calls.first_fit, which the
    script runs (`serve_calls.py pack`)."""
    prep = (ROOT / "gpu" / "prepare_serve.sh").read_text()
    slice_b = int(re.search(r"^SLICE_MB=\$\{SLICE_MB:-(\d+)\}", prep, re.M).group(1)) * serve_calls.MIB
    call_mb = int(re.search(r"^CALL_MB=\$\{CALL_MB:-(\d+)\}", prep, re.M).group(1))
    assert 'serve_calls.py pack "$S" "$C" "$CALL_MB" "${PARTS[@]}"' in prep
    size = {line.split()[0]: int(line.split()[3]) for line in RECORDED_MANIFEST.read_text().splitlines()}
    slices, manifest = [], {}
    for part in _prepare_parts():
        manifest[part] = -(-size[part] // slice_b)  # split -b: whole slices, the last one shorter
        slices += [(f"{part}.tar.xz.{i:02d}", min(slice_b, size[part] - i * slice_b)) for i in range(manifest[part])]
    folders = serve_calls.first_fit(slices, call_mb * serve_calls.MIB)
    calls = [{"folder": f"gpu/.carry/serve/call{i}", "mib": sum(dict(slices)[n] for n in names) / serve_calls.MIB,
              "files": names} for i, names in enumerate(folders, 1)]
    return calls, manifest


def _how_to_table() -> dict[str, list[tuple[str | None, str]]]:
    """gpu/results.md's call table (issue 35's how-to, step 2): per column, [(carried folder or None, phase)]."""
    text = (ROOT / "gpu" / "results.md").read_text()
    head = text.index("| call | `--phases issue35`: carry, command | the 0.26.0 phases alone")
    rows = [line.strip() for line in text[head:].splitlines()[2:]]
    stop = next((i for i, line in enumerate(rows) if not re.match(r"\| \d+ \|", line)), len(rows))
    cols: dict[str, list[tuple[str | None, str]]] = {"issue35": [], "alone": []}
    for line in rows[:stop]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for key, cell in zip(("issue35", "alone"), cells[1:3], strict=True):
            ticks = re.findall(r"`([^`]+)`", cell)
            if ticks:
                cols[key].append((ticks[0] if ticks[0].startswith("call") else None, ticks[-1]))
    return cols


def test_how_to_call_table_is_serve_calls_plan():
    """The how-to's calls, for issue 35 and for its 0.26.0 phases alone, are the plan serve_calls prints for a
    default build: the folders it carries, in order, and the phase each call runs (2026-12-06 the plan for the
    0.26.0 phases alone ended in a seventh call, `unpack` carrying fa3_024, which the how-to left out)."""
    calls, manifest = _default_build()
    table = _how_to_table()
    for key, phases in (("issue35", serve_calls.RERUNS["issue35"]), ("alone", ALONE_026)):
        rows = serve_calls.plan(calls, manifest, phases)
        assert [(Path(r["carry"][0]).name if r["carry"] else None, r["phase"]) for r in rows] == table[key], key
    # The 0.26.0 phases alone carry only folders with 0.26.0 parts, and none after the last such folder.
    behind = serve_calls.left_behind(calls, set(serve_calls.SET_026))
    carried = [c for c in calls if c["folder"] not in behind]
    assert behind and all(int(b.rsplit("call", 1)[1]) > int(carried[-1]["folder"].rsplit("call", 1)[1]) for b in behind)
