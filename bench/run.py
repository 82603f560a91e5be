"""vllm_compat benchmarks: one command, one table (also written to bench/results.md).

    python bench/run.py [--python PY] [--hook-python PY ...] [--quick] [--no-write]

--python       the env measured for sections 1-4 (default: this interpreter). Section 3 needs vllm-omni with
               the in-tree gated loader method (vllm-omni >= 0.26, e.g. vllm 0.30.0 + vllm-omni 0.30.0).
--hook-python  extra envs where section 4 is also measured with the default controls (auto), e.g. a
               vllm-omni 0.24.0 env where the hook really patches (repeatable).

Sections (every figure is a median of interleaved repeated runs; the repeat counts are printed):
  1. import cost: `python -c "import vllm_compat"` vs `python -c pass`, and the heavy modules it loads; the startup
     hook (vllm_compat_startup.pth): `python -c pass` in two throwaway venvs of the same base interpreter, one
     with the hook, one without.
  2. static doctor (`python -m vllm_compat doctor --json`) vs an import-based probe (bench/_probe.py), wall
     clock including interpreter start; and the default short screen (`python -m vllm_compat doctor`), warm,
     against the probe and the 100 ms goal.
  3. `_process_weights_after_loading` on CPU: meta-safe variant vs vllm-omni's in-tree method vs the legacy
     variant, on synthetic DiT-shaped models (bench/_worker.py); peak memory; the shim's per-call overhead.
  3i. the same meta_safe and in_tree calls counted in instructions under callgrind (valgrind, gcc and valgrind's
     headers; skipped without them): the measure that resolves 1 % where time, on a shared VM, cannot.
  4. hook latency (target module imported -> patch on the class) and `apply()` when already applied.
Only the standard library is used here; everything that needs torch/vLLM runs in subprocesses.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
HEAVY = ("torch", "vllm", "vllm_omni", "wrapt", "asyncio", "logging", "inspect", "dataclasses", "packaging")
GOAL_IMPORT_MS = 2.0
GOAL_DOCTOR_SPEEDUP = 150.0
GOAL_DOCTOR_MS = 100.0  # the warm `vllm-compat doctor` (short screen), wall clock with the interpreter's start
GOAL_LOADER_RATIO = 1.01
GOAL_MEMORY_PCT = 1.0


def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_COMPAT_")}
    env.update(extra)
    return env


_LAST_CPU = [0.0]


def wall(cmd, env=None, check=True) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of one subprocess (interpreter start included); its CPU seconds go to _LAST_CPU[0]."""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env or clean_env(), cwd=ROOT)
    elapsed = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    _LAST_CPU[0] = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if check and proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {cmd}\n{proc.stderr[-3000:]}")
    return elapsed, proc


def med(xs):
    return statistics.median(xs)


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------------------


def section_import(py: str, runs: int) -> dict:
    log(f"1. import cost: {runs} x `-c pass` and `-c 'import vllm_compat'`, interleaved")
    # VLLM_COMPAT_DISABLE=1 keeps the env's startup hook (section 1b) from importing vllm_compat in both commands
    # (it did in an env installed with the hook: 0 modules added, 2026-12-02); `import vllm_compat` does not read it.
    env = clean_env(VLLM_COMPAT_DISABLE="1")
    base, imp, base_cpu, imp_cpu = [], [], [], []
    for i in range(runs):
        pair = [("pass", base, base_cpu), ("import vllm_compat", imp, imp_cpu)]
        if i % 2:
            pair.reverse()
        for code, sink, cpu_sink in pair:
            sink.append(wall([py, "-c", code], env=env)[0] * 1e3)
            cpu_sink.append(_LAST_CPU[0] * 1e3)
    # In-process view, much less noisy than process wall clocks: -X importtime's cumulative figure.
    self_us = []
    for _ in range(max(5, runs // 3)):
        _, proc = wall([py, "-X", "importtime", "-c", "import vllm_compat"], env=env)
        for line in proc.stderr.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) == 3 and parts[2] == "vllm_compat":
                self_us.append(int(parts[1]))
    probe = ("import sys; before = set(sys.modules); import vllm_compat; "
             "new = sorted(set(sys.modules) - before); import json; print(json.dumps(new))")
    new = json.loads(wall([py, "-c", probe], env=env)[1].stdout)
    heavy = sorted({m.split(".")[0] for m in new} & set(HEAVY))
    return {"runs": runs, "pass_ms": med(base), "import_ms": med(imp), "added_ms": med(imp) - med(base),
            "added_ms_paired": med([b - a for a, b in zip(base, imp, strict=True)]),
            "pass_cpu_ms": med(base_cpu), "import_cpu_ms": med(imp_cpu), "added_cpu_ms": med(imp_cpu) - med(base_cpu),
            "importtime_cumulative_ms": med(self_us) / 1e3 if self_us else None,
            "new_modules": new, "heavy_loaded": heavy}


def section_hook(py: str, runs: int) -> dict:
    """The startup hook's own cost: every interpreter of an env with vllm_compat_startup.pth installed pays it.

    Two throwaway venvs of ``py``'s base interpreter, identical (vllm_compat importable through a path .pth) but
    for vllm_compat_startup.pth, the file setup.py installs, in one: ``-c pass`` in each, interleaved. Also,
    in-process: what site's processing of the .pth takes (read, exec, the import), and the modules it adds."""
    base = wall([py, "-c", "import sys; print(getattr(sys, '_base_executable', sys.executable))"])[1].stdout.strip()
    log(f"1b. startup hook: two venvs of {base}, {runs} x `-c pass` in each, interleaved")
    with tempfile.TemporaryDirectory() as tmp:
        pys = {}
        for name in ("without", "with"):
            venv = os.path.join(tmp, name)
            wall([base, "-m", "venv", "--without-pip", venv])
            vpy = os.path.join(venv, "bin", "python")
            site_dir = wall([vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])[1].stdout.strip()
            with open(os.path.join(site_dir, "_vllm_compat_source.pth"), "w") as f:
                f.write(ROOT + "\n")
            if name == "with":
                shutil.copy(os.path.join(ROOT, "vllm_compat_startup.pth"), site_dir)
            pys[name] = vpy
        times = {"without": [], "with": []}
        cpus = {"without": [], "with": []}
        for i in range(runs):
            order = ["without", "with"] if i % 2 == 0 else ["with", "without"]
            for name in order:
                times[name].append(wall([pys[name], "-c", "pass"])[0] * 1e3)
                cpus[name].append(_LAST_CPU[0] * 1e3)
        listing = "import sys, json; print(json.dumps(sorted(sys.modules)))"
        added = sorted(set(json.loads(wall([pys["with"], "-c", listing])[1].stdout))
                       - set(json.loads(wall([pys["without"], "-c", listing])[1].stdout)))
        # site.addpackage on the .pth, timed inside a process of the venv without it: the hook's whole work.
        timed = ("import site, sys, time; t = time.perf_counter_ns(); "
                 "site.addpackage(sys.argv[1], 'vllm_compat_startup.pth', set()); "
                 "t = time.perf_counter_ns() - t; assert 'vllm_compat' in sys.modules; print(t)")
        in_process = [int(wall([pys["without"], "-c", timed, ROOT])[1].stdout) / 1e6 for _ in range(max(5, runs // 3))]
        importtime = []
        for _ in range(max(5, runs // 3)):
            _, proc = wall([pys["with"], "-X", "importtime", "-c", "pass"])
            for line in proc.stderr.splitlines():
                parts = [p.strip() for p in line.split("|")]
                if len(parts) == 3 and parts[2] == "vllm_compat":
                    importtime.append(int(parts[1]) / 1e3)
    return {"runs": runs, "base_python": base, "without_ms": med(times["without"]), "with_ms": med(times["with"]),
            "added_ms": med(times["with"]) - med(times["without"]),
            "added_ms_paired": med([b - a for a, b in zip(times["without"], times["with"], strict=True)]),
            "without_cpu_ms": med(cpus["without"]), "with_cpu_ms": med(cpus["with"]),
            "added_cpu_ms": med(cpus["with"]) - med(cpus["without"]),
            "in_process_ms": med(in_process), "importtime_cumulative_ms": med(importtime) if importtime else None,
            "modules_added": added,
            "foreign_modules_added": [m for m in added if m.split(".")[0] != "vllm_compat"]}


def section_doctor(py: str, probe_runs: int, doctor_per_probe: int) -> dict:
    """The static doctor against the import probe: ``doctor --json`` (every fact, so the probe's can be compared)
    and the default short screen, ``doctor`` (what a user runs; goal <= GOAL_DOCTOR_MS warm), each with
    ``-c pass`` beside it (the interpreter's own start), interleaved with the probes; warm: one doctor runs first,
    so the fact cache holds the install's facts (a first doctor detects them: ~15 s)."""
    log(f"2. doctor vs import probe: {probe_runs} probes, {probe_runs * doctor_per_probe} doctors of each screen, "
        "interleaved")
    doctor, probe, doctor_cpu, probe_cpu = [], [], [], []
    short, short_cpu, bare = [], [], []
    doctor_json = probe_json = None
    wall([py, "-m", "vllm_compat", "doctor"], check=False)

    def doctors(count: int) -> None:
        nonlocal doctor_json
        for _ in range(count):
            order = ("json", "short", "pass") if len(short) % 2 == 0 else ("pass", "short", "json")
            for which in order:
                if which == "json":
                    t, proc = wall([py, "-m", "vllm_compat", "doctor", "--json"], check=False)
                    doctor.append(t)
                    doctor_cpu.append(_LAST_CPU[0])
                    doctor_json = proc.stdout
                elif which == "short":
                    short.append(wall([py, "-m", "vllm_compat", "doctor"], check=False)[0])
                    short_cpu.append(_LAST_CPU[0])
                else:
                    bare.append(wall([py, "-c", "pass"])[0])

    for _ in range(probe_runs):
        doctors(doctor_per_probe // 2)
        t, proc = wall([py, os.path.join(HERE, "_probe.py")])
        probe.append(t)
        probe_cpu.append(_LAST_CPU[0])
        probe_json = proc.stdout
        log(f"   probe {len(probe)}: {t:.1f} s")
        doctors(doctor_per_probe - doctor_per_probe // 2)
    log(f"   warm `doctor` (short screen): median {med(short) * 1e3:.0f} ms of {len(short)} runs (CPU "
        f"{med(short_cpu) * 1e3:.0f} ms; `-c pass` {med(bare) * 1e3:.0f} ms): {med(short) * 1e3 / GOAL_DOCTOR_MS:.2f} "
        f"of the {GOAL_DOCTOR_MS:.0f} ms goal; the import probe takes {med(probe) / med(short):.0f}x as long")
    d = json.loads(doctor_json)
    p = json.loads(probe_json.strip().splitlines()[-1])
    caps = d["vllm"]["capabilities"]
    agree = {
        "vllm version": d["vllm"]["version"] == p["vllm"],
        "vllm-omni version": d["vllm_omni"]["version"] == p["vllm_omni"],
        "uses_meta_device": caps["has_uses_meta_device"] == p["has_uses_meta_device"],
        "layerwise finalize": caps["has_layerwise_finalize"] == p["has_layerwise_finalize"],
        "finalize params": [f["name"] for f in caps["finalize_params"]] == p["finalize_params"],
        "initialize_online_processing": caps["has_initialize_online_processing"]
        == p["has_initialize_online_processing"],
        "loader kind": d["vllm_omni"]["loader_kind"] == p["loader_kind"],
        "omni meta-device methods": sorted(d["vllm_omni"]["meta_device_methods"]) == p["meta_device_methods"],
    }
    return {"doctor_s": med(doctor), "probe_s": med(probe), "doctor_runs": len(doctor), "probe_runs": len(probe),
            "speedup": med(probe) / med(doctor), "doctor_cpu_s": med(doctor_cpu), "probe_cpu_s": med(probe_cpu),
            "speedup_cpu": med(probe_cpu) / med(doctor_cpu), "agree": agree, "probe_facts": p,
            "short_s": med(short), "short_cpu_s": med(short_cpu), "short_runs": len(short), "pass_s": med(bare),
            "short_speedup": med(probe) / med(short), "short_of_goal": med(short) * 1e3 / GOAL_DOCTOR_MS}


def run_worker(py: str, parts: str, variant: str, quick: bool, sizes: str, *, prefix=(), extra_args=(),
               extra_env=None) -> dict:
    """bench/_worker.py's ``parts`` in a fresh interpreter of ``py`` (behind ``prefix``, e.g. valgrind); its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        cmd = [*prefix, py, os.path.join(HERE, "_worker.py"), "--parts", parts, "--out", out, "--sizes", sizes,
               *extra_args]
        if quick:
            cmd.append("--quick")
        env = clean_env(**({"VLLM_COMPAT_LOADER_VARIANT": variant} if variant != "auto" else {}), **(extra_env or {}))
        env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        for line in proc.stderr.splitlines():
            if line.startswith("[worker]"):
                log(line)
        if proc.returncode != 0:
            raise SystemExit(f"worker failed ({proc.returncode}): {cmd}\n{proc.stderr[-4000:]}")
        with open(out) as f:
            return json.load(f)


def section_instructions(py: str, quick: bool, sizes: str) -> dict:
    """Section 3's meta_safe and in_tree calls counted in instructions under callgrind (bench/_worker.py's
    ``instructions`` part): the CPU measure that resolves 1 % on a machine whose time is noisy. Needs valgrind
    and a C compiler with valgrind's headers; returns ``{"skipped": why}`` without them."""
    missing = [tool for tool in ("valgrind", "gcc") if shutil.which(tool) is None]
    if missing or not os.path.exists("/usr/include/valgrind/callgrind.h"):
        return {"skipped": f"needs valgrind, gcc and valgrind/callgrind.h (missing: {missing or 'the header'})"}
    log("3i. instructions: meta_safe and in_tree under callgrind (slow: the counted calls run ~50x slower)")
    with tempfile.TemporaryDirectory() as tmp:
        lib = os.path.join(tmp, "libvc.so")
        wall(["gcc", "-shared", "-fPIC", "-O1", "-o", lib, os.path.join(HERE, "_callgrind.c")])
        dumps = os.path.join(tmp, "cg.out")
        prefix = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={dumps}", "-q"]
        t0 = time.perf_counter()
        result = run_worker(py, "instructions", "meta_safe", quick, sizes, prefix=prefix,
                            extra_args=["--callgrind-lib", lib],
                            extra_env={"PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"})["instructions"]
        result["seconds"] = time.perf_counter() - t0
        counts = {}
        for name in os.listdir(tmp):
            if name.startswith("cg.out"):
                label, total = read_callgrind_dump(os.path.join(tmp, name))
                if label is not None:
                    counts[label] = total
    missing_labels = [label for label in result["labels"] if label not in counts]
    if missing_labels:
        raise SystemExit(f"callgrind wrote no count for {missing_labels[:3]} ({len(missing_labels)} in all)")
    result["counts"] = {label: counts[label] for label in result["labels"]}
    return result


def read_callgrind_dump(path: str) -> tuple[str | None, int]:
    """(the client request's label, instructions counted) of one callgrind dump; (None, 0) for other dumps."""
    label, total = None, 0
    with open(path) as f:
        for line in f:
            if line.startswith("desc: Trigger: Client Request: "):
                label = line.split(": ", 3)[3].strip()
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    return label, total


def instruction_cases(s3i: dict) -> list[dict]:
    """Per size and model: each contender's counts over the reps, and meta_safe / in_tree of their medians."""
    cases: dict[tuple, dict] = {}
    for label, count in s3i["counts"].items():
        n, model, name, _ = label.split(":")
        case = cases.setdefault((int(n), model == "online"), {"n_quant": int(n), "online": model == "online",
                                                               "counts": {}})
        case["counts"].setdefault(name, []).append(count)
    for case in cases.values():
        c = case["counts"]
        case["ratio"] = med(c["meta_safe"]) / med(c["in_tree"])
    return sorted(cases.values(), key=lambda c: (c["n_quant"], not c["online"]))


# ----------------------------------------------------------------------------------------------------------


def machine() -> dict:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(ln for ln in f if ln.startswith("MemTotal")).split()[1])
            mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, StopIteration):
        pass
    return {"cpus": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else None, "cpu_model": model, "memory": mem, "os": platform.platform(),
            "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None}


def ok(flag: bool) -> str:
    return "MET" if flag else "NOT MET"


def fmt_bytes(n: int) -> str:
    return f"{n:,} B"


def render(m: dict, env: dict, s1: dict | None, s2: dict | None, s3: dict | None, s4: list,
           s3i: dict | None = None) -> str:
    out = []
    w = out.append
    w("# vllm_compat benchmarks\n")
    w(f"Date: {m['date']}  ")
    w(f"Machine: {m['cpus']} CPUs (affinity {m['affinity']}), {m['cpu_model']}, {m['memory']}, {m['os']}  ")
    w(f"Load average at start / end: {' '.join(f'{x:.2f}' for x in m['loadavg_start'])} / "
      f"{' '.join(f'{x:.2f}' for x in m['loadavg_end'])} (other work on the box adds noise to wall clocks)  ")
    w(f"Env measured: `{env['python_path']}`: Python {env['python']}, torch {env['torch']}, vllm {env['vllm']}, "
      f"vllm-omni {env['vllm-omni']}, wrapt {env['wrapt']}  ")
    w(f"Command: `{m['command']}`; total {m['total_s']:.0f} s  ")
    for u in m.get("updates", []):
        w(f"Sections {', '.join(u['sections'])} measured again {u['date']} (load average "
          f"{' '.join(f'{x:.2f}' for x in u['loadavg_start'])} / {' '.join(f'{x:.2f}' for x in u['loadavg_end'])}): "
          f"`{u['command']}`; {u['total_s']:.0f} s  ")
    w("")

    if s1:
        w("## 1. Import cost (`python -c \"import vllm_compat\"` vs `python -c pass`)\n")
        w("| measure | value | goal | status |")
        w("|---|---|---|---|")
        w(f"| `-c pass` median wall ({s1['runs']} runs) | {s1['pass_ms']:.1f} ms | | |")
        w(f"| `-c \"import vllm_compat\"` median wall ({s1['runs']} runs, interleaved) | {s1['import_ms']:.1f} ms | | |")
        w(f"| added (difference of medians / median of paired differences) | {s1['added_ms']:.2f} ms / "
          f"{s1['added_ms_paired']:.2f} ms | <= {GOAL_IMPORT_MS:.0f} ms | "
          f"{ok(max(s1['added_ms'], s1['added_ms_paired']) <= GOAL_IMPORT_MS)} |")
        w(f"| added, process CPU time (user+sys; {s1['pass_cpu_ms']:.1f} vs {s1['import_cpu_ms']:.1f} ms) | "
          f"{s1['added_cpu_ms']:.2f} ms | <= {GOAL_IMPORT_MS:.0f} ms | {ok(s1['added_cpu_ms'] <= GOAL_IMPORT_MS)} |")
        if s1["importtime_cumulative_ms"] is not None:
            w(f"| in-process `-X importtime` cumulative for vllm_compat | {s1['importtime_cumulative_ms']:.2f} ms | "
              f"<= {GOAL_IMPORT_MS:.0f} ms | {ok(s1['importtime_cumulative_ms'] <= GOAL_IMPORT_MS)} |")
        w(f"| heavy modules loaded (of {', '.join(HEAVY)}) | {', '.join(s1['heavy_loaded']) or 'none'} | "
          f"none of torch, vllm, vllm_omni, wrapt, asyncio | "
          f"{ok(not set(s1['heavy_loaded']) & {'torch', 'vllm', 'vllm_omni', 'wrapt', 'asyncio'})} |")
        foreign = [m for m in s1["new_modules"] if m.split(".")[0] != "vllm_compat"]
        w(f"| modules loaded beyond `-c pass`'s, other than vllm_compat's own | {', '.join(foreign) or 'none'} | none | "
          f"{ok(not foreign)} |")
        w(f"\nModules `import vllm_compat` adds ({len(s1['new_modules'])}): {', '.join(s1['new_modules'])}\n")
        hook = s1.get("hook")
        if hook:
            w("Startup hook (`vllm_compat_startup.pth`, run by every interpreter of an env that has it): two throwaway "
              f"venvs of `{hook['base_python']}`, vllm_compat on the path in both, the hook in one; `-c pass` in "
              "each, interleaved.\n")
            w("| measure | value | goal | status |")
            w("|---|---|---|---|")
            w(f"| `-c pass` median wall, without / with the hook ({hook['runs']} runs each) | "
              f"{hook['without_ms']:.1f} / {hook['with_ms']:.1f} ms | | |")
            w(f"| added by the hook (difference of medians / median of paired differences) | {hook['added_ms']:.2f} ms / "
              f"{hook['added_ms_paired']:.2f} ms | <= {GOAL_IMPORT_MS:.0f} ms | "
              f"{ok(max(hook['added_ms'], hook['added_ms_paired']) <= GOAL_IMPORT_MS)} |")
            w(f"| added, process CPU time ({hook['without_cpu_ms']:.1f} vs {hook['with_cpu_ms']:.1f} ms) | "
              f"{hook['added_cpu_ms']:.2f} ms | <= {GOAL_IMPORT_MS:.0f} ms | {ok(hook['added_cpu_ms'] <= GOAL_IMPORT_MS)} |")
            w(f"| in-process: `site.addpackage` of the .pth (read, exec, import) | {hook['in_process_ms']:.2f} ms | "
              f"<= {GOAL_IMPORT_MS:.0f} ms | {ok(hook['in_process_ms'] <= GOAL_IMPORT_MS)} |")
            if hook["importtime_cumulative_ms"] is not None:
                w(f"| in-process `-X importtime` cumulative for vllm_compat at startup | "
                  f"{hook['importtime_cumulative_ms']:.2f} ms | <= {GOAL_IMPORT_MS:.0f} ms | "
                  f"{ok(hook['importtime_cumulative_ms'] <= GOAL_IMPORT_MS)} |")
            w(f"| modules the hook adds to a bare start, other than vllm_compat's own | "
              f"{', '.join(hook['foreign_modules_added']) or 'none'} ({len(hook['modules_added'])} in all) | none | "
              f"{ok(not hook['foreign_modules_added'])} |\n")

    if s2:
        w("## 2. Static doctor vs import-based probe (wall clock incl. interpreter start)\n")
        w("| measure | value | goal | status |")
        w("|---|---|---|---|")
        w(f"| `python -m vllm_compat doctor --json` ({s2['doctor_runs']} runs) | {s2['doctor_s'] * 1e3:.0f} ms | | |")
        w(f"| import probe, bench/_probe.py ({s2['probe_runs']} runs, interleaved) | {s2['probe_s']:.1f} s | | |")
        w(f"| speedup, wall clock | {s2['speedup']:.0f}x | >= {GOAL_DOCTOR_SPEEDUP:.0f}x | "
          f"{ok(s2['speedup'] >= GOAL_DOCTOR_SPEEDUP)} |")
        w(f"| speedup, process CPU time ({s2['doctor_cpu_s'] * 1e3:.0f} ms vs {s2['probe_cpu_s']:.1f} s) | "
          f"{s2['speedup_cpu']:.0f}x | >= {GOAL_DOCTOR_SPEEDUP:.0f}x | {ok(s2['speedup_cpu'] >= GOAL_DOCTOR_SPEEDUP)} |")
        if "short_s" in s2:  # measured since issue 34 part 5
            w(f"| `python -m vllm_compat doctor`, the default short screen, warm ({s2['short_runs']} runs, "
              f"interleaved) | {s2['short_s'] * 1e3:.0f} ms (CPU {s2['short_cpu_s'] * 1e3:.0f} ms) | "
              f"<= {GOAL_DOCTOR_MS:.0f} ms | {ok(s2['short_s'] * 1e3 <= GOAL_DOCTOR_MS)} |")
            w(f"| same, of the goal / import probe vs it (`-c pass` here: {s2['pass_s'] * 1e3:.0f} ms) | "
              f"{s2['short_of_goal']:.2f} / {s2['short_speedup']:.0f}x | <= 1.00 | {ok(s2['short_of_goal'] <= 1)} |")
        disagree = [k for k, v in s2["agree"].items() if not v]
        w(f"| same facts (versions, capabilities, loader kind, omni meta methods) | "
          f"{'all agree' if not disagree else 'DISAGREE: ' + ', '.join(disagree)} | agree | {ok(not disagree)} |\n")

    if s3:
        lo = s3["loader"]
        w(f"## 3. `_process_weights_after_loading` on CPU (hidden={lo['hidden']}, bf16, vLLM's real layerwise "
          f"machinery, tests/support/online_quant.py)\n")
        w("meta_safe: our variant called through the installed wrapper (the production path); in_tree: "
          "vllm-omni's own method (the original function, `__wrapped__`); legacy: our legacy variant. "
          "Fresh identical model (same seed, same checkpoint, same stragglers) per timed call; only the call is "
          "timed; GC collected before and paused during it. Wall ms = median wall clock; CPU ms = median thread "
          "CPU time (immune to other processes taking the CPU). ratio = meta_safe / in_tree, of the medians; "
          "paired = median over reps of the CPU ratio of the two calls made in the same rep (drift "
          "on a shared machine cancels out); the goal is checked on the paired CPU ratio.\n")
        w("| quant layers | model | stragglers | reps | meta_safe wall / CPU ms | in_tree wall / CPU ms | "
          f"legacy wall / CPU ms | ratio wall / CPU / paired CPU | <= {GOAL_LOADER_RATIO} | same result as in_tree |")
        w("|---|---|---|---|---|---|---|---|---|---|")
        for c in lo["cases"]:
            t, cpu, st = c["timings_ms"], c["cpu_ms"], c["status"]

            def cell(name, c=c, t=t, cpu=cpu, st=st):
                if st.get(name) != "ok":
                    return st.get(name, "-")
                return f"{t[name]:.2f} / {cpu[name]:.2f}"

            paired = paired_cpu_ratio(c)
            ratio = (f"{t['meta_safe'] / t['in_tree']:.3f} / {cpu['meta_safe'] / cpu['in_tree']:.3f} / {paired:.3f}"
                     if paired is not None else "-")
            same = "yes" if c.get("meta_safe_equals_in_tree") else "NO"
            if "legacy_equals_in_tree" in c:
                same += f" (legacy: {'yes' if c['legacy_equals_in_tree'] else 'NO'})"
            w(f"| {c['n_quant']:,} | {'online quant' if c['online'] else 'no online quant'} | {c['stragglers']} | "
              f"{c['reps']} | {cell('meta_safe')} | {cell('in_tree')} | {cell('legacy')} | {ratio} | "
              f"{ok(paired is not None and paired <= GOAL_LOADER_RATIO)} | {same} |")
        w("")
        w("Peak memory during the call, 3 rounds in rotated order, median per contender. Tensors: torch's own CPU "
          "allocator accounting (profiler `profile_memory`, the allocator's running `total_allocated` per "
          "allocation event): peak bytes newly allocated and not yet freed during the call, added to the model's "
          "tensor bytes before the call. Python heap: tracemalloc started after the model was built, the peak the "
          "call adds over the heap before it (the model's own Python objects, measured once, vary by a few "
          "percent from build to build, more than any call adds, so peaks of separate builds do not compare); "
          "the diff is taken over model + added. tracemalloc cannot see tensor storage and RSS is too coarse "
          "(glibc arenas) for kB-sized deltas, hence the two counters, each read on a call of its own (the "
          "profiler's own Python objects would count in the heap's).\n")
        w("The diffs are meta_safe against in_tree: of the medians / paired (the median over rounds of the two "
          "contenders' peaks in the same round; the goal is checked on it). The tensor peaks of offline models drift "
          "from round to round for every contender alike (1,000 layers: in_tree's own 80,564-97,936 B over 3 "
          "rounds, 2026-12-02), with or without the GC paused, and the round's first call is the highest, so the "
          "medians of rotated rounds compare calls from different rounds.\n")
        w("| quant layers | model | tensors: model + peak new (meta_safe / in_tree / legacy) | tensor peak diff, "
          "medians / paired | Python heap: model + added (meta_safe / in_tree / legacy) | heap peak diff, medians / "
          f"paired | within {GOAL_MEMORY_PCT:.0f}% (paired) |")
        w("|---|---|---|---|---|---|---|")
        for c in lo["cases"]:
            tp, ha, base = c["torch_peak_new_bytes"], c["py_heap_added"], c["model_tensor_bytes"]
            names = [n for n in ("meta_safe", "in_tree", "legacy") if n in tp]
            tens = " / ".join(f"{base:,} + {tp[n]:,}" for n in names)
            heap = f"{c['model_py_heap']:,} + " + " / ".join(f"{ha[n]:,}" for n in names)
            tdiff = ((base + tp["meta_safe"]) / (base + tp["in_tree"]) - 1) * 100
            hdiff = ((c["model_py_heap"] + ha["meta_safe"]) / (c["model_py_heap"] + ha["in_tree"]) - 1) * 100
            tpaired = paired_peak_diff_pct(base, c["torch_peak_new_bytes_all"])
            hpaired = paired_peak_diff_pct(c["model_py_heap"], c["py_heap_added_all"])
            w(f"| {c['n_quant']:,} | {'online' if c['online'] else 'offline'} | {tens} | {tdiff:+.2f}% / "
              f"{tpaired:+.2f}% | {heap} B | {hdiff:+.2f}% / {hpaired:+.2f}% | "
              f"{ok(abs(tpaired) <= GOAL_MEMORY_PCT and abs(hpaired) <= GOAL_MEMORY_PCT)} |")
        w("")
        # Linearity: per-layer cost.
        w("Per-layer cost (CPU ms / quant layer x 1000 = us/layer; linear means flat across sizes):\n")
        w("| model | contender | " + " | ".join(f"{n:,} layers" for n in sorted({c['n_quant'] for c in lo['cases']}))
          + " | largest / smallest |")
        w("|---|---|" + "---|" * (len({c['n_quant'] for c in lo['cases']}) + 1))
        for online in (True, False):
            cases = sorted((c for c in lo["cases"] if c["online"] == online), key=lambda c: c["n_quant"])
            for name in ("meta_safe", "in_tree", "legacy"):
                per = [c["cpu_ms"][name] / c["n_quant"] * 1e3 for c in cases if name in c["cpu_ms"]]
                if len(per) != len(cases):
                    continue
                w(f"| {'online' if online else 'offline'} | {name} | " + " | ".join(f"{x:.1f} us" for x in per)
                  + f" | {per[-1] / per[0]:.2f} |")
        if s3i:
            render_instructions(w, s3i)
        ov, oc = lo["overhead_us"], lo.get("overhead_cpu_us", lo["overhead_us"])
        w("")
        w(f"Shim per-call overhead on an empty model (`nn.Module()`, no quant layers), median of 15 interleaved "
          f"batches of {lo['overhead_iters']} calls (the decision itself is taken once, in the hook: section 4):\n")
        w("| call | wall us/call | CPU us/call |")
        w("|---|---|---|")
        rows = [("installed wrapper -> meta_safe (production path)", "wrapper", None),
                ("meta_safe variant called directly", "direct_variant", None),
                ("vllm-omni in-tree method called directly", "in_tree", None),
                ("wrapper cost (wrapper - direct)", "wrapper", "direct_variant"),
                ("variant logic vs in-tree (direct - in_tree)", "direct_variant", "in_tree"),
                ("total shim overhead per call (wrapper - in_tree)", "wrapper", "in_tree")]
        for label, a, b in rows:
            wv = ov[a] - (ov[b] if b else 0)
            cv = oc[a] - (oc[b] if b else 0)
            w(f"| {label} | {wv:.2f} | {cv:.2f} |")
        w("")

    if s3i and not s3:
        w("## 3. `_process_weights_after_loading` on CPU: instructions only\n")
        render_instructions(w, s3i)

    if s4:
        w("## 4. Patch application\n")
        w("Hook latency: inside one process, timestamps right after vllm-omni's loader module finished executing "
          "and right after vllm_compat's post-import callbacks returned (patch on the class, checked). "
          "First import: includes the shim's own lazy imports and runtime detection; reload: "
          "`importlib.reload` of the loader module (hook fires again, same detection on a warm process).\n")
        w("| env | controls | loader import | first hook (new modules imported) | hook on reload (median) | "
          "variant installed | apply() when applied |")
        w("|---|---|---|---|---|---|---|")
        for r in s4:
            h = r["hook"]
            w(f"| vllm {r['env']['vllm']} + vllm-omni {r['env']['vllm-omni']} | "
              f"LOADER_VARIANT={r['env']['VLLM_COMPAT_LOADER_VARIANT']} | {h['loader_import_s']:.1f} s | "
              f"{h['first_hook_us'] / 1e3:.1f} ms ({h['first_hook_new_modules']}: "
              f"{', '.join(h['first_hook_new_top_level'])}) | {h['reload_hook_us_median'] / 1e3:.2f} ms | "
              f"{h['variant_after']} | {h['apply_us_per_call_median']:.0f} us/call "
              f"(median of 5 x {h['apply_iters']}) |")
        w("")
        w("Where `apply()`'s time goes (cProfile, cumulative, first env):\n")
        w("```")
        for line in s4[0]["hook"]["apply_profile_top"]:
            w(line)
        w("```\n")
    return "\n".join(out)


def render_instructions(w, s3i: dict) -> None:
    if "skipped" in s3i:
        w(f"Instructions executed: not measured ({s3i['skipped']}).\n")
        return
    w(f"Instructions executed by the call (callgrind `Ir`, only the call instrumented: bench/_callgrind.c), the "
      f"same calls on fresh identical models, rotated order, one torch thread, PYTHONHASHSEED=0; "
      f"{s3i['seconds']:.0f} s under valgrind. Unlike time, the count does not depend on what else the machine "
      f"runs, so it resolves 1 %: the spread column shows how far the reps of one contender differ.\n")
    w(f"| quant layers | model | reps | meta_safe instructions | in_tree instructions | spread (max-min)/median, "
      f"meta_safe / in_tree | ratio of medians | <= {GOAL_LOADER_RATIO} |")
    w("|---|---|---|---|---|---|---|---|")
    for c in instruction_cases(s3i):
        ms, it = c["counts"]["meta_safe"], c["counts"]["in_tree"]

        def spread(xs):
            return f"{(max(xs) - min(xs)) / med(xs) * 100:.3f} %"

        w(f"| {c['n_quant']:,} | {'online quant' if c['online'] else 'no online quant'} | {len(ms)} | "
          f"{med(ms):,.0f} | {med(it):,.0f} | {spread(ms)} / {spread(it)} | {c['ratio']:.4f} | "
          f"{ok(c['ratio'] <= GOAL_LOADER_RATIO)} |")
    w("")


def paired_ratio(meta_safe: list, in_tree: list) -> float:
    """Median over reps (or rounds) of meta_safe / in_tree, the two values of one rep taken one after the other:
    drift between reps cancels, where a ratio of the two medians would compare different reps."""
    return med([a / b for a, b in zip(meta_safe, in_tree, strict=True)])


def paired_peak_diff_pct(base: int, added_all: dict) -> float:
    """Median over rounds of meta_safe's peak (base + added) against in_tree's in the same round, in percent."""
    peaks = {name: [base + added for added in added_all[name]] for name in ("meta_safe", "in_tree")}
    return (paired_ratio(peaks["meta_safe"], peaks["in_tree"]) - 1) * 100


def paired_cpu_ratio(case: dict) -> float | None:
    """Median over reps of meta_safe / in_tree CPU time, the two calls of one rep being made one after the other."""
    cpu = case.get("cpu_ms_all", {})
    if "meta_safe" not in cpu or "in_tree" not in cpu:
        return None
    return paired_ratio(cpu["meta_safe"], cpu["in_tree"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--hook-python", action="append", default=[])
    parser.add_argument("--quick", action="store_true", help="smoke test: few repeats, small models")
    parser.add_argument("--sections", default="1,2,3,3i,4")
    parser.add_argument("--instruction-sizes", help="section 3i's model sizes (default: section 3's)")
    parser.add_argument("--no-write", action="store_true", help="do not write bench/results.md")
    parser.add_argument("--render", metavar="JSON", help="only re-render the table from a results.json")
    parser.add_argument("--update", action="store_true",
                        help="run only --sections and put them into bench/results.json / .md, keeping the others "
                             "(the header says which sections were measured when)")
    args = parser.parse_args()
    if args.render:
        with open(args.render) as f:
            raw = json.load(f)
        write_results(raw, json_too=False, no_write=args.no_write)
        return
    sections = set(args.sections.split(","))
    start = time.perf_counter()
    # An install has its bytecode (pip compiles it; uv writes it on first import): measure that, not a compile of
    # sources newer than their .pyc, which PYTHONDONTWRITEBYTECODE would leave stale. The envs' site-packages too:
    # without it every import of vLLM compiles it again (the import probe took 71 s instead of 24 in a new uv env).
    # A no-op once compiled.
    for py in dict.fromkeys([args.python, *args.hook_python]):
        log(f"compiling bytecode of {py}'s site-packages and vllm_compat (once)")
        purelib = wall([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])[1].stdout.strip()
        wall([py, "-m", "compileall", "-q", "-j", "0", purelib, os.path.join(ROOT, "vllm_compat")], check=False)
    m = machine()
    m["date"] = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    m["command"] = " ".join(["python", "bench/run.py", *sys.argv[1:]])
    s1 = section_import(args.python, 10 if args.quick else 100) if "1" in sections else None
    if s1 is not None:
        s1["hook"] = section_hook(args.python, 10 if args.quick else 100)
    s2 = section_doctor(args.python, 1 if args.quick else 3, 4 if args.quick else 10) if "2" in sections else None
    s4main = None
    s4 = []
    if "3" in sections or "4" in sections:
        parts = ",".join(p for s, p in (("4", "hook"), ("3", "loader")) if s in sections)
        log(f"3/4. worker in {args.python} ({parts}, VLLM_COMPAT_LOADER_VARIANT=meta_safe)")
        s4main = run_worker(args.python, parts, "meta_safe", args.quick, "100,1000" if args.quick else "100,1000,10000")
        if "hook" in s4main:
            s4.append(s4main)
    env = s4main["env"] if s4main else json.loads(wall([args.python, "-c", (
        "import json, platform; from importlib import metadata as m\n"
        "def v(d):\n try: return m.version(d)\n except m.PackageNotFoundError: return None\n"
        "print(json.dumps({'python': platform.python_version(), **{d: v(d) for d in "
        "('torch', 'vllm', 'vllm-omni', 'wrapt')}}))")])[1].stdout)
    env["python_path"] = args.python
    if "4" in sections:
        for py in args.hook_python:
            log(f"4. hook worker in {py} (auto)")
            s4.append(run_worker(py, "hook", "auto", args.quick, ""))
    # Last: its counts do not depend on the machine's load, so other work may start once it has (the log says).
    s3i = (section_instructions(args.python, args.quick, args.instruction_sizes or ("100,1000" if args.quick else
                                                                                    "100,1000,10000"))
           if "3i" in sections else None)
    m["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    m["total_s"] = time.perf_counter() - start
    raw = {"machine": m, "env": env, "import": s1, "doctor": s2, "worker": s4main, "hook_envs": s4[1:],
           "instructions": s3i}
    if args.update:
        with open(os.path.join(HERE, "results.json")) as f:
            raw = updated(json.load(f), raw, sections)
    write_results(raw, json_too=True, no_write=args.no_write)


# The results.json keys each section's figures are kept under (sections 3 and 4 share one worker's).
SECTION_KEYS = {"1": ("import",), "2": ("doctor",), "3": ("worker",), "4": ("worker", "hook_envs"),
                "3i": ("instructions",)}


def updated(old: dict, new: dict, sections: set) -> dict:
    """``old`` results with the figures of ``sections`` taken from ``new``; the run is listed in the machine's
    ``updates`` (the header shows it), the rest of the header stays the first run's."""
    if sections & {"3", "4"} and not {"3", "4"} <= sections:
        raise SystemExit("--update: sections 3 and 4 come from one worker; update both or neither")
    merged = dict(old)
    for section in sections:
        for key in SECTION_KEYS[section]:
            merged[key] = new[key]
    m = new["machine"]
    merged["machine"] = {**old["machine"], "updates": [*old["machine"].get("updates", []), {
        "sections": sorted(sections), "date": m["date"], "command": m["command"], "total_s": m["total_s"],
        "loadavg_start": m["loadavg_start"], "loadavg_end": m["loadavg_end"]}]}
    return merged


def write_results(raw: dict, *, json_too: bool, no_write: bool) -> None:
    """Render ``raw`` (results.json's shape), print it, and write results.md (and results.json)."""
    worker = raw["worker"] or {}
    s4 = ([worker] if "hook" in worker else []) + raw["hook_envs"]
    text = render(raw["machine"], raw["env"], raw["import"], raw["doctor"], worker if "loader" in worker else None,
                  s4, raw.get("instructions"))
    print(text)
    if no_write:
        return
    with open(os.path.join(HERE, "results.md"), "w") as f:
        f.write(text + "\n")
    if json_too:
        with open(os.path.join(HERE, "results.json"), "w") as f:
            json.dump(raw, f, indent=1, default=str)
    log(f"wrote bench/results.md{' and bench/results.json' if json_too else ''}")


if __name__ == "__main__":
    main()
