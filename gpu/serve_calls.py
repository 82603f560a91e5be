"""The device calls of the served checks (gpu/serve_run.sh), derived from what gpu/prepare_serve.sh built.

Which call completes which part depends on the slicing knobs (SLICE_MB, CALL_MB), so no call number is written down
anywhere: this file reads gpu/.carry/serve/calls.txt (the call folders in order, with the slices each holds) and
gpu/.carry/serve/MANIFEST (each part's slice count), and gives every phase the first call after which all the parts
it needs are unpacked on the machine.

  python3 gpu/serve_calls.py [--dir gpu/.carry/serve] [--phases issue35 | bug,native,...] [--json]
        print the call list: one `run` per call folder that holds a slice of a part the phases need (carry = that
        folder; the command runs the next phase whose parts are complete by then, else `unpack`), then one call with
        no carry for each phase left; the folders no phase needs stay behind (named on a last line). Also checks
        that every call fits the device tool's 64 MiB with the working tree beside it (exit 1 if one does not).
        --phases takes a named list of RERUNS (issue35, the default; issue35_all; issue24) or phase names.
  python3 gpu/serve_calls.py pack SLICES CARRY CALL_MB PART...
        gpu/prepare_serve.sh's packing: moves the slices of SLICES (PART.tar.xz.NN) into CARRY/call1..N, first fit
        over the folders opened so far, the parts in the order given, at most CALL_MB MiB a folder.
  python3 gpu/serve_calls.py needs PHASE
        the parts PHASE needs, one per line (gpu/serve_run.sh refuses a phase whose parts are not unpacked yet);
        exit 2 for a phase gpu/serve_run.sh does not have.
  python3 gpu/serve_calls.py phases
        every phase with what it runs.

Standard library only: it runs on the CPU machine and on the device's own python3.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CARRY = Path("gpu/.carry/serve")
MIB = 1024 * 1024
# The device tool: what one call may carry, the working tree (tracked + untracked-not-ignored files) included.
CALL_LIMIT_MIB = 64.0
# Headroom asked for on top of the tree measured now: results and notes committed between prepare_serve.sh and the
# device calls travel too.
DEFAULT_MARGIN_MIB = 2.0

# The parts (gpu/prepare_serve.sh) each vLLM needs: its pure-Python tree + own deps, its kernels, FA3, the common deps
# and its vllm-omni (0.24.0; 0.26.0 for vLLM 0.26.0).
SET_0251 = ("so0251", "py0251", "deps", "fa3_0251", "omni024")
SET_024 = ("so024", "py024", "deps", "fa3_024", "omni024")
SET_026 = ("so026", "py026", "deps", "fa3_026", "omni026")
BOTH = tuple(dict.fromkeys(SET_0251 + SET_024))
ALL_PARTS = tuple(dict.fromkeys(SET_026 + SET_0251 + SET_024))

# Every phase of gpu/serve_run.sh (tests/gpu/test_serve_tools.py checks the two agree), with the parts it needs and
# what it runs. `unpack` only keeps and unpacks the slices its call carried.
PHASES: dict[str, tuple[tuple[str, ...], str]] = {
    "unpack": ((), "keep this call's slices, unpack every part that is complete"),
    "bug": (SET_0251, "vLLM 0.25.1 + vllm-omni 0.24.0 unpatched, tiny Qwen-Image (bug0251)"),
    "native": (SET_024, "native 0.24.0, BF16 and --quantization fp8 (native024, native024_fp8)"),
    "compat": (SET_0251, "vllm_compat on 0.25.1: BF16, fp8, fp8 without the loader patch "
                         "(SERVE_COMPAT024=1 adds 0.24.0 fp8 and needs the 0.24.0 parts too)"),
    "llm": (BOTH, "tiny Qwen2 LM as one LLM stage: native 0.24.0, then vllm_compat on 0.25.1"),
    "llm_noscheduler": (SET_0251, "the llm phase's vllm_compat run, ar_scheduler_v1_runner left out"),
    "llm_sync": (SET_0251, "the llm phase's vllm_compat run, the stage's async scheduling off"),
    "llm_v1": (SET_0251, "the llm phase's vllm_compat run, VLLM_USE_V2_MODEL_RUNNER=0"),
    "diag": (SET_0251, "DIAGNOSTIC: vllm_compat + gpu/serve_diag_reuse_port.py on 0.25.1 (BF16, fp8)"),
    # Issue 35: vLLM 0.26.0 + vllm-omni 0.26.0 (the native pair), the offline Omni API.
    "llm026": (SET_026, "the llm phase's tiny Qwen2 stage on 0.26.0 + vllm-omni 0.26.0: native, then vllm_compat"),
    "llm026_async": (SET_026, "native 0.26.0, the stage on vllm-omni's async AR scheduler class "
                              "(gpu/llm_stage_async.yaml)"),
    "llm026_noec": (SET_026, "vllm_compat on 0.26.0, omni_output_ec_transfer_params left out"),
    "omni026": (SET_026, "offline Omni, the same AR stage, greedy generate: native 0.26.0, then vllm_compat"),
    "omni0251": (BOTH, "offline Omni, the same AR stage: native 0.24.0, then vllm_compat on 0.25.1"),
    "omni0251_noscheduler": (SET_0251, "omni0251's vllm_compat run, ar_scheduler_v1_runner left out"),
    "image026": (SET_026, "tiny Qwen-Image served on 0.26.0 + vllm-omni 0.26.0: native, then vllm_compat (bytes "
                          "compared)"),
}
# Named phase lists, in order: a rerun of a section of gpu/results.md. issue35 is what "GPU runs of issue 35"
# asks for (parts 1-3, and llm026_async: the scheduler class vllm-omni 0.26.0's own pipelines get on CUDA), each
# riding a carry call of the default build; issue35_all adds the two runs that bound its claims further; issue24
# reruns "Served Qwen-Image" and "LLM stage".
RERUNS: dict[str, tuple[str, ...]] = {
    "issue35": ("llm026", "llm026_async", "image026", "omni026", "omni0251"),
    "issue35_all": ("llm026", "llm026_async", "image026", "omni026", "omni0251", "llm026_noec",
                    "omni0251_noscheduler"),
    "issue24": ("bug", "native", "compat", "llm", "llm_noscheduler"),
}
DEFAULT_PHASES = RERUNS["issue35"]


def needs(phase: str, env: dict[str, str] | None = None) -> tuple[str, ...]:
    env = os.environ if env is None else env
    parts = PHASES[phase][0]
    if phase == "compat" and env.get("SERVE_COMPAT024"):
        parts = BOTH
    return parts


def read_manifest(path: Path) -> dict[str, int]:
    """MANIFEST lines `part slices sha256 bytes` -> {part: slices}."""
    out = {}
    for line in path.read_text().splitlines():
        if line.strip():
            part, n = line.split()[:2]
            out[part] = int(n)
    return out


def read_calls(path: Path) -> list[dict]:
    """calls.txt lines `gpu/.carry/serve/callN SIZE MiB: file file ...` -> [{folder, mib, files}] in call order."""
    calls = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        head, _, files = line.partition(":")
        folder, mib = head.split()[:2]
        calls.append({"folder": folder, "mib": float(mib), "files": files.split()})
    calls.sort(key=lambda c: int("".join(ch for ch in Path(c["folder"]).name if ch.isdigit()) or 0))
    return calls


def slice_part(name: str) -> str | None:
    """`py0251.tar.xz.03` -> `py0251`; None for anything else (MANIFEST)."""
    stem, dot, idx = name.rpartition(".")
    if not dot or not idx.isdigit() or not stem.endswith(".tar.xz"):
        return None
    return stem[: -len(".tar.xz")]


def phase_list(value: str) -> tuple[str, ...]:
    """``--phases``: a name of RERUNS, or phase names separated by commas."""
    if value in RERUNS:
        return RERUNS[value]
    return tuple(p for p in value.split(",") if p)


def plan(calls: list[dict], manifest: dict[str, int], phases: tuple[str, ...] = DEFAULT_PHASES,
         env: dict[str, str] | None = None) -> list[dict]:
    """The device calls: one per call folder that holds a slice of a part some phase needs, then one with no carry
    for each phase not yet run.

    A phase runs in the first call after which every part it needs has all its slices on the machine (the parts
    unpack at the start of that call, before its phase), and phases keep their order: one phase a call. A folder
    holding only parts no phase needs is left behind (``left_behind``): the 0.26.0 phases alone on the default
    build carry call1-call3 and none of the 0.25.1 / 0.24.0 folders after them (2026-12-06 the plan still ended
    in a seventh call, `unpack` with fa3_024, which the how-to left out).
    """
    for p in phases:
        if p not in PHASES or p == "unpack":
            raise ValueError(f"unknown phase {p!r}; gpu/serve_run.sh has {', '.join(PHASES)}")
    needed = {part for p in phases for part in needs(p, env)}
    have: dict[str, int] = {}
    todo = list(phases)
    out = []
    for call in (c for c in calls if not left_behind([c], needed)):
        i = len(out) + 1
        for f in call["files"]:
            part = slice_part(f)
            if part is not None:
                have[part] = have.get(part, 0) + 1
        complete = {p for p, n in manifest.items() if have.get(p, 0) >= n}
        phase = "unpack"
        if todo and set(needs(todo[0], env)) <= complete:
            phase = todo.pop(0)
        out.append({"call": i, "carry": [call["folder"]], "carry_mib": call["mib"], "phase": phase,
                    "complete": sorted(complete)})
    complete = {p for p, n in manifest.items() if have.get(p, 0) >= n}
    missing_parts = sorted(set(manifest) - complete)
    for phase in todo:
        lacking = sorted(set(needs(phase, env)) - complete)
        if lacking:
            raise ValueError(f"phase {phase} needs {', '.join(lacking)}, which the calls never complete "
                             f"(incomplete after every call: {', '.join(missing_parts) or 'none'})")
        out.append({"call": len(out) + 1, "carry": [], "carry_mib": 0.0, "phase": phase, "complete": sorted(complete)})
    return out


def left_behind(calls: list[dict], needed: set[str]) -> list[str]:
    """The folders of ``calls`` that hold no slice of a part in ``needed``: no call carries them."""
    return [c["folder"] for c in calls if not {slice_part(f) for f in c["files"]} & needed]


def first_fit(slices: list[tuple[str, int]], limit: int) -> list[list[str]]:
    """gpu/prepare_serve.sh's packing: each slice (name, bytes), in the order given, into the first folder opened so
    far with room for it (at most ``limit`` bytes a folder), else a new one. Returns the folders' slice names."""
    used: list[int] = []
    folders: list[list[str]] = []
    for name, size in slices:
        i = next((i for i, u in enumerate(used) if u + size <= limit), None)
        if i is None:
            used.append(0)
            folders.append([])
            i = len(used) - 1
        used[i] += size
        folders[i].append(name)
    return folders


def pack(slices_dir: Path, carry: Path, call_mb: int, parts: list[str]) -> list[list[str]]:
    """Moves the slices of ``slices_dir`` (PART.tar.xz.NN, ``parts`` in carry order) into ``carry``/call1..N by
    :func:`first_fit`, ``call_mb`` MiB a folder at most. Returns the folders' slice names."""
    slices = [(f.name, f.stat().st_size) for part in parts for f in sorted(slices_dir.glob(part + ".tar.xz.*"))]
    folders = first_fit(slices, call_mb * MIB)
    for i, names in enumerate(folders, 1):
        (carry / f"call{i}").mkdir(parents=True, exist_ok=True)
        for name in names:
            (slices_dir / name).rename(carry / f"call{i}" / name)
    return folders


def tree_bytes(root: Path = ROOT) -> int | None:
    """What travels with every call besides the carry: tracked files plus untracked files git does not ignore
    (the same sum as `git ls-files | xargs du -cb` plus `git ls-files --others --exclude-standard | xargs du -cb`).
    None where there is no git checkout (the device's copy of the tree)."""
    total = 0
    for args in (["ls-files", "-z"], ["ls-files", "-z", "--others", "--exclude-standard"]):
        try:
            names = subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
        for name in names.decode(errors="surrogateescape").split("\0"):
            p = root / name
            if name and p.is_file() and not p.is_symlink():
                total += p.stat().st_size
    return total


def folder_mib(folder: str, fallback: float, carry: Path = ROOT / CARRY) -> float:
    """The call folder's exact size where it exists in ``carry`` (the folder calls.txt is in: each call folder is
    one of its children), else calls.txt's (du -sm: rounded up)."""
    d = carry / Path(folder).name
    if d.is_dir():
        return sum(f.stat().st_size for f in d.iterdir() if f.is_file()) / MIB
    return fallback


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="?", default="list", choices=["list", "needs", "phases"])
    ap.add_argument("phase", nargs="?")
    ap.add_argument("--dir", type=Path, default=CARRY, help="prepare_serve.sh's output (calls.txt, MANIFEST)")
    ap.add_argument("--phases", default="issue35",
                    help=f"a named list ({', '.join(RERUNS)}; default issue35 = {','.join(DEFAULT_PHASES)}) or "
                         "phase names, comma-separated, in order")
    ap.add_argument("--margin-mib", type=float, default=float(os.environ.get("MARGIN_MB", DEFAULT_MARGIN_MIB)))
    ap.add_argument("--json", action="store_true")
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["pack"]:
        if len(argv) < 5:
            print("usage: serve_calls.py pack SLICES CARRY CALL_MB PART...", file=sys.stderr)
            return 2
        pack(Path(argv[1]), Path(argv[2]), int(argv[3]), argv[4:])
        return 0
    args = ap.parse_args(argv)
    if args.what == "phases":
        for name, (parts, what) in PHASES.items():
            print(f"{name:21} {what}\n{'':21} needs: {' '.join(parts) or '-'}")
        for name, phases in RERUNS.items():
            print(f"--phases {name}: {','.join(phases)}")
        return 0
    if args.what == "needs":
        if args.phase not in PHASES:
            print(f"serve_calls: no phase {args.phase!r}; gpu/serve_run.sh has {', '.join(PHASES)}", file=sys.stderr)
            return 2
        print("\n".join(needs(args.phase)))
        return 0
    d = args.dir if args.dir.is_absolute() else ROOT / args.dir
    if not (d / "calls.txt").is_file() or not (d / "MANIFEST").is_file():
        print(f"serve_calls: no {d}/calls.txt or MANIFEST: run `bash gpu/prepare_serve.sh` first", file=sys.stderr)
        return 1
    calls = read_calls(d / "calls.txt")
    phases = phase_list(args.phases)
    try:
        rows = plan(calls, read_manifest(d / "MANIFEST"), phases)
    except ValueError as e:
        print(f"serve_calls: {e}", file=sys.stderr)
        return 1
    behind = left_behind(calls, {part for p in phases for part in needs(p)})
    calls = [c for c in calls if c["folder"] not in behind]
    tree = tree_bytes()
    tree_mib = None if tree is None else tree / MIB
    worst = None
    for r, c in zip(rows, calls + [None] * len(rows), strict=False):
        if c is not None:
            r["carry_mib"] = round(folder_mib(c["folder"], c["mib"], d), 2)
        if tree_mib is not None:
            r["total_mib"] = round(r["carry_mib"] + tree_mib, 2)
            r["left_mib"] = round(CALL_LIMIT_MIB - r["total_mib"], 2)
            worst = r["left_mib"] if worst is None else min(worst, r["left_mib"])
    if args.json:
        print(json.dumps({"tree_mib": tree_mib and round(tree_mib, 2), "calls": rows, "left_behind": behind},
                         indent=1))
    else:
        print(f"Device calls, one GPU (`run` with no kind: an H100 or an H200), back to back on one warm machine (from {d}/calls.txt and MANIFEST).")
        if tree_mib is not None:
            print(f"Working tree that travels with each call: {tree_mib:.2f} MiB; a call may carry "
                  f"{CALL_LIMIT_MIB:.0f} MiB in all.")
        for r in rows:
            carry = json.dumps(r["carry"])
            size = f"{r['carry_mib']:6.2f} MiB" + (f", {r['left_mib']:5.2f} left" if "left_mib" in r else "")
            cmd = f"`bash gpu/serve_run.sh {r['phase']}`"
            print(f"  call {r['call']}: carry {carry:28} command {cmd:38} ({size})")
        if behind:
            print(f"Not carried (no part these phases need): {' '.join(Path(f).name for f in behind)}")
    if worst is not None and worst < args.margin_mib:
        print(f"serve_calls: a call leaves {worst:.2f} MiB of the {CALL_LIMIT_MIB:.0f} MiB, under the "
              f"{args.margin_mib} MiB margin: re-slice smaller (REUSE_PARTS=1 CALL_MB=... bash gpu/prepare_serve.sh)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
