"""Reading only what is needed (issue 39, item 1): `check` and `plan` cold and warm with the source members read
by HTTP range requests, beside today's whole-wheel download in the same run; and the library measured against
our own range reader.

    python bench/member_reads.py [--vllm 0.34.0] [--omni 0.24.0] [--warm-runs 3] [--no-plan]
                                 [--library-python /tmp/cps/bin/python] [--out bench/member_reads.json]

Every command runs in a fresh interpreter of a venv made here with `uv venv` and `uv pip install` of a snapshot
of this tree (as a new user has it; `--python PY` uses an existing interpreter instead), wall clock with its
start. Two modes, interleaved, each on its own empty caches (a temporary VLLM_COMPAT_CACHE_DIR and VLLM_COMPAT_WHEEL_CACHE; the
user's ~/.cache/vllm-compat is never touched; uv's own cache is the user's):
  members  the source members by range requests (`detect.wheel_members`, the default);
  whole    today's path: `pip download` of each whole wheel (`wheel_members.READ_MEMBERS = False`).
Rows: cold `check vllm==V vllm-omni==O` (a never-seen pair: empty caches), warm `check` (median of --warm-runs),
warm `check` right after `uv pip install --reinstall` of the same tree (the fact cache is keyed on content), cold
and warm `plan vllm-omni==O` (every vLLM minor from O's own to the newest: eleven for 0.24.0). Fetched: what our
reader counted (range bytes and requests, whole downloads; for the whole mode the wheels pip left in the cache),
and the bytes this machine's network interfaces received during the run ("rx", /proc/net/dev: pip's and uv's
traffic too, and anything else running here: on a shared machine an upper bound only). CPU: user + sys of the
command's process tree.

Library vs own: conda-package-streaming's `lazy_wheel.LazyZipOverHTTP` (pip's LazyZipOverHTTP, on PyPI) reading
vLLM V's source members through `zipfile` one by one, and the same with our coalesced ranges fetched through its
`_download` first; against `wheel_members.read_members`. It needs a Python with conda-package-streaming and
requests (`--library-python`; made with uv in a temporary venv when not given, skipped when that fails).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOALS = {"check_cold_s": 10.0, "check_cold_mb": 30.0, "plan_cold_s": 60.0, "plan_cold_mb": 300.0,
         "plan_warm_s": 2.0, "check_warm_s": 0.5}

# the command, in the venv's interpreter: STATS of the reader printed to stderr at exit
DRIVER = """
import atexit, json, sys
from vllm_compat.detect import wheel_members as m
m.READ_MEMBERS = {members}
atexit.register(lambda: sys.stderr.write("\\nSTATS " + json.dumps(m.STATS) + "\\n"))
from vllm_compat.cli import main
sys.exit(main(sys.argv[1:]))
"""


def rx_bytes() -> int:
    """Bytes received by every network interface but loopback (/proc/net/dev)."""
    total = 0
    with open("/proc/net/dev") as handle:
        for line in handle.readlines()[2:]:
            name, _, rest = line.partition(":")
            if name.strip() != "lo":
                total += int(rest.split()[0])
    return total


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(python: str, args: list[str], env: dict, members: bool, timeout: float = 3600) -> dict:
    """One command; its wall and CPU seconds, exit code, the reader's STATS and the bytes received meanwhile."""
    rx, cpu, start = rx_bytes(), children_cpu(), time.perf_counter()
    proc = subprocess.run([python, "-c", DRIVER.format(members=members), *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
    wall = time.perf_counter() - start
    stats = next((json.loads(line[6:]) for line in reversed(proc.stderr.splitlines()) if line.startswith("STATS ")),
                 {})
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"wall": wall, "cpu": children_cpu() - cpu, "code": proc.returncode, "stats": stats,
            "rx": rx_bytes() - rx, "stdout": proc.stdout, "stderr_tail": proc.stderr[-500:]}


def fetched_mb(result: dict, wheel_cache: Path, members: bool) -> float:
    """What our reader fetched (range bytes and whole downloads), or for the whole mode the wheels pip left."""
    stats = result["stats"]
    if members:
        return (stats.get("range_bytes", 0) + stats.get("whole_bytes", 0)) / 1e6
    return sum(p.stat().st_size for p in wheel_cache.glob("*.whl")) / 1e6


INSTALLED = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "vllm_compat_startup.pth", "vllm_compat"]


def snapshot(work: Path) -> Path:
    """This tree's installable files (tracked and untracked, not ignored) copied once: what is installed, and
    installed again for the reinstall row, is the same version, whatever is edited here meanwhile."""
    source = work / "src"
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *INSTALLED], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split()
    for name in listed:
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    return source


def make_venv(work: Path, source: Path) -> str:
    """A venv with ``source`` installed by uv, as a new user has it; its interpreter."""
    venv = work / "venv"
    subprocess.run(["uv", "venv", "-q", "--seed", "-p", sys.executable, str(venv)], check=True)
    python = str(venv / "bin" / "python")
    subprocess.run(["uv", "pip", "install", "-q", "--python", python, str(source)], check=True)
    return python


def reinstall(python: str, source: Path) -> dict:
    """``pip install --force-reinstall --no-deps`` of the same snapshot, as a user reinstalls: the same bytes,
    new files (the row says whether the installed ``vllm_compat/__init__.py`` got a new mtime)."""
    where = [python, "-c",
             "import os, vllm_compat; s = os.stat(vllm_compat.__file__); print(s.st_mtime_ns, s.st_ino)"]
    env = {**os.environ, "VLLM_COMPAT_DISABLE": "1"}
    before = subprocess.run(where, capture_output=True, text=True, env=env).stdout.strip()
    start = time.perf_counter()
    subprocess.run([python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", "--no-cache-dir",
                    str(source)], check=True, env=env, capture_output=True)  # setuptools' warnings: not ours
    seconds = time.perf_counter() - start
    after = subprocess.run(where, capture_output=True, text=True, env=env).stdout.strip()
    return {"reinstall_s": seconds, "new_files": before != after}


# ------------------------------------------------------------------------------------------ library vs own

LIBRARY = r"""
import json, sys, time, zipfile, requests
from conda_package_streaming.lazy_wheel import LazyZipOverHTTP
url, mode, ranges = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
source = lambda n: n.endswith((".py", ".pyi")) or n.split("/", 1)[0].endswith(".dist-info") and not n.endswith("/")
start = time.perf_counter()
lazy = LazyZipOverHTTP(url, requests.Session())
archive = zipfile.ZipFile(lazy)
names = [i.filename for i in archive.infolist() if source(i.filename)]
if mode == "coalesced":
    for first, end in ranges:
        lazy._download(first, end - 1)
total = sum(len(archive.read(n)) for n in names)
held = sum(r - l + 1 for l, r in zip(lazy._left, lazy._right))
print(json.dumps({"seconds": time.perf_counter() - start, "requests": lazy._request_count, "bytes": held,
                  "members": len(names), "uncompressed": total}))
"""

OWN = r"""
import json, sys, tempfile, time
from vllm_compat.detect import wheel_members as m
from vllm_compat.detect.wheel_listing import RemoteWheel
url, sha256, size = sys.argv[1], sys.argv[2], int(sys.argv[3])
with tempfile.TemporaryDirectory() as folder:
    start = time.perf_counter()
    kept = m.read_members(RemoteWheel("vllm", "?", url, sha256, size), folder)
    seconds = time.perf_counter() - start
    tree = m.WheelMembers(kept)
    names = [n for n in tree.namelist() if m.is_source_member(n)]
    total = sum(len(tree._zip.read(n)) for n in names)
print(json.dumps({"seconds": seconds, "requests": m.STATS["range_requests"], "bytes": m.STATS["range_bytes"],
                  "members": len(names), "uncompressed": total}))
"""


def library_python(work: Path, given: str | None) -> str | None:
    if given:
        return given
    venv = work / "library"
    try:
        subprocess.run(["uv", "venv", "-q", "-p", sys.executable, str(venv)], check=True)
        subprocess.run(["uv", "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                        "conda-package-streaming", "requests"], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"  library: not measured (could not make its venv: {exc})")
        return None
    return str(venv / "bin" / "python")


def library_vs_own(python: str, lib_python: str | None, vllm: str) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    from vllm_compat.detect import wheel_members

    wheel = wheel_members.find_release("vllm", vllm)
    import zipfile

    from vllm_compat.detect.wheel_listing import _Fetcher, _RemoteTail

    with zipfile.ZipFile(_RemoteTail(_Fetcher(wheel.url))) as archive:
        infos = sorted(archive.infolist(), key=lambda i: i.header_offset)
        ends = [i.header_offset for i in infos[1:]] + [archive.start_dir]
    ranges = wheel_members.plan_ranges([(i.header_offset, e) for i, e in zip(infos, ends, strict=True)
                                        if wheel_members.is_source_member(i.filename)])
    rows = []
    own = subprocess.run([python, "-c", OWN, wheel.url, wheel.sha256, str(wheel.size)], capture_output=True,
                         text=True, check=True)
    rows.append({"reader": f"own: wheel_members.read_members ({wheel_members.WORKERS} at a time)",
                 **json.loads(own.stdout)})
    if lib_python:
        for mode, label in (("coalesced", "conda-package-streaming lazy_wheel, our ranges via _download"),
                            ("members", "conda-package-streaming lazy_wheel, zipfile reads member by member")):
            done = subprocess.run([lib_python, "-c", LIBRARY, wheel.url, mode, json.dumps(ranges)],
                                  capture_output=True, text=True, timeout=3600)
            if done.returncode != 0:
                rows.append({"reader": label, "error": done.stderr[-300:]})
            else:
                rows.append({"reader": label, **json.loads(done.stdout)})
    return rows


# ------------------------------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", default="0.34.0")
    parser.add_argument("--omni", default="0.24.0")
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--no-plan", action="store_true")
    parser.add_argument("--no-library", action="store_true")
    parser.add_argument("--python", help="an interpreter with vllm_compat importable (default: a venv made here)")
    parser.add_argument("--library-python")
    parser.add_argument("--out", help="also write the numbers as JSON here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="vllm-compat-bench-"))
    results: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpus": os.cpu_count(),
                     "load_before": os.getloadavg(), "rows": [], "library": []}
    try:
        source = snapshot(work)
        python = args.python or make_venv(work, source)
        check = ["check", f"vllm=={args.vllm}", f"vllm-omni=={args.omni}"]
        plan = ["plan", f"vllm-omni=={args.omni}"]
        caches = {}
        for mode in ("members", "whole"):
            facts, wheels = work / mode / "facts", work / mode / "wheels"
            facts.mkdir(parents=True)
            caches[mode] = (facts, wheels, {**os.environ, "VLLM_COMPAT_CACHE_DIR": str(facts),
                                            "VLLM_COMPAT_WHEEL_CACHE": str(wheels)})

        def row(what: str, mode: str, result: dict, mb: float | None = None, **extra):
            results["rows"].append({"what": what, "mode": mode, "wall": result["wall"], "cpu": result["cpu"],
                                    "code": result["code"], "fetched_mb": mb, "rx_mb": result["rx"] / 1e6,
                                    "stats": result["stats"], **extra})
            print(f"  {what:<34} {mode:<8} {result['wall']:7.2f} s  cpu {result['cpu']:6.2f} s  "
                  + (f"fetched {mb:7.1f} MB  " if mb is not None else "") + f"rx {result['rx'] / 1e6:7.1f} MB",
                  flush=True)

        for mode in ("members", "whole"):  # cold check, interleaved with the other mode's
            facts, wheels, env = caches[mode]
            result = run(python, check, env, mode == "members")
            row("check, cold (never-seen pair)", mode, result, fetched_mb(result, wheels, mode == "members"))
        for mode in ("members", "whole"):
            facts, wheels, env = caches[mode]
            warm = [run(python, check, env, mode == "members") for _ in range(args.warm_runs)]
            mid = sorted(warm, key=lambda r: r["wall"])[len(warm) // 2]
            row(f"check, warm (median of {len(warm)})", mode, mid, 0.0, walls=[r["wall"] for r in warm])
        if not args.python:
            for mode in ("members", "whole"):
                done = reinstall(python, source)
                row("check, warm after reinstall", mode, run(python, check, caches[mode][2], mode == "members"),
                    0.0, **done)
        if not args.no_plan:
            for mode in ("members", "whole"):  # the plan's own empty caches: every pair never seen
                facts, wheels = work / f"plan-{mode}" / "facts", work / f"plan-{mode}" / "wheels"
                facts.mkdir(parents=True)
                env = {**os.environ, "VLLM_COMPAT_CACHE_DIR": str(facts), "VLLM_COMPAT_WHEEL_CACHE": str(wheels)}
                result = run(python, plan, env, mode == "members")
                row("plan, cold", mode, result, fetched_mb(result, wheels, mode == "members"))
                result = run(python, plan, env, mode == "members")
                row("plan, warm", mode, result, 0.0)
        if not args.no_library:
            results["library"] = library_vs_own(python, library_python(work, args.library_python), args.vllm)
            for item in results["library"]:
                if "error" in item:
                    print(f"  {item['reader']}: failed: {item['error']}")
                else:
                    print(f"  {item['reader']:<66} {item['seconds']:7.2f} s  {item['requests']:5d} requests  "
                          f"{item['bytes'] / 1e6:6.1f} MB  ({item['members']} members)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["load_after"] = os.getloadavg()
    print(summary(results, args))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


def summary(results: dict, args) -> str:
    """The table: members vs whole per row, and the goals."""
    by = {(r["what"], r["mode"]): r for r in results["rows"]}
    lines = [f"\nvllm-compat check vllm=={args.vllm} vllm-omni=={args.omni} / plan vllm-omni=={args.omni}, "
             f"{results['date']}, {results['cpus']} CPUs, load average {results['load_before'][0]:.1f} before, "
             f"{results['load_after'][0]:.1f} after",
             "", "| what | members by range requests | whole wheels (today) | goal |", "|---|---|---|---|"]
    goals = {"check, cold (never-seen pair)":
             f"<= {GOALS['check_cold_s']:.0f} s, <= {GOALS['check_cold_mb']:.0f} MB",
             "plan, cold": f"<= {GOALS['plan_cold_s']:.0f} s, <= {GOALS['plan_cold_mb']:.0f} MB",
             "plan, warm": f"<= {GOALS['plan_warm_s']:.1f} s",
             f"check, warm (median of {args.warm_runs})": f"<= {GOALS['check_warm_s']:.1f} s",
             "check, warm after reinstall": f"<= {GOALS['check_warm_s']:.1f} s"}
    for what in dict.fromkeys(r["what"] for r in results["rows"]):
        cells = []
        for mode in ("members", "whole"):
            r = by.get((what, mode))
            if r is None:
                cells.append("-")
                continue
            fetched = f", {r['fetched_mb']:.1f} MB" if r["fetched_mb"] else ""
            cells.append(f"{r['wall']:.2f} s (CPU {r['cpu']:.1f} s){fetched}; rx {r['rx_mb']:.0f} MB")
        lines.append(f"| {what} | {cells[0]} | {cells[1]} | {goals.get(what, '')} |")
    for item in results["library"]:
        if "error" not in item:
            lines.append(f"| vLLM {args.vllm} source members: {item['reader']} | {item['seconds']:.2f} s, "
                         f"{item['requests']} requests, {item['bytes'] / 1e6:.1f} MB | | |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
