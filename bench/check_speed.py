"""`vllm-compat check` speed, cold and warm, with the behavioural-drift scan: one command, ratios from one run.

    python bench/check_speed.py [--vllm 0.34.0] [--omni 0.24.0] [--runs 5]

Each run is `python -m vllm_compat check vllm==V vllm-omni==O` in a fresh interpreter, wall clock including its
start, the two wheels already in the wheel cache (the first run downloads them if not). Interleaved:
  cold  a fresh fact cache (VLLM_COMPAT_CACHE_DIR pointing at an empty directory): every drift point's facts, the
        import drift and the behavioural scan of the pair (its own vLLM's scan is the shipped baseline);
  warm  the same fact cache again: what a second `check` of the pair costs (goal: <= 1.0 s, issue 32).
It prints the medians, the warm / cold ratio, the cache's size for the pair and whether the goal holds. Standard
library only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

GOAL_WARM_S = 1.0


def timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", default="0.34.0")
    parser.add_argument("--omni", default="0.24.0")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    cmd = [sys.executable, "-m", "vllm_compat", "check", f"vllm=={args.vllm}", f"vllm-omni=={args.omni}"]
    subprocess.run(cmd, capture_output=True)  # the wheels into the wheel cache; the user's fact cache untouched
    cold, warm, sizes = [], [], []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "VLLM_COMPAT_CACHE_DIR": cache}
            cold.append(timed(cmd, env))
            warm.append(timed(cmd, env))
            sizes.append(sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache) for f in fs))
    c, w = statistics.median(cold), statistics.median(warm)
    print(f"vllm-compat check vllm=={args.vllm} vllm-omni=={args.omni}: {args.runs} cold and {args.runs} warm runs, "
          "interleaved, wall clock with interpreter start")
    print(f"  cold (fresh fact cache)  {c:6.2f} s   (min {min(cold):.2f}, max {max(cold):.2f})")
    print(f"  warm (same fact cache)   {w:6.2f} s   (min {min(warm):.2f}, max {max(warm):.2f})")
    print(f"  warm / cold              {w / c:6.3f}   (cold is {c / w:.0f}x warm)")
    print(f"  fact cache for the pair  {statistics.median(sizes) / 1024:.0f} KiB")
    print(f"  goal: warm <= {GOAL_WARM_S:.1f} s: {'held' if w <= GOAL_WARM_S else 'MISSED'}")


if __name__ == "__main__":
    main()
