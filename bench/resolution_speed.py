"""`vllm-compat check`'s resolution step (vllm_compat/resolution.py), cold and warm: `uv pip compile` of a pair, the
range-read listing of every resolved wheel, the clash finder, and the re-resolution with the overrides it names.

    python bench/resolution_speed.py [PAIR ...] [--override LINE ...]
    PAIR: vllm==0.33.0,vllm-omni==0.24.0 (default: the two pairs of docs/dependency-drift.md, each with the
          conflict overrides check suggests for it)

Per pair, in this interpreter (what check runs), each in a fresh temporary cache directory:
  cold      our caches empty (resolutions/, listings/), uv's own cache as it is on this machine;
  cold+uv   our caches and uv's (UV_CACHE_DIR pointing at an empty directory) empty: a first run anywhere;
  warm      the cold run's directory again: the day's resolution and every listing from the cache.
It prints the seconds (uv, listing, total), the packages resolved, the wheels listed, the requests and bytes
fetched, and what was found. Needs uv on PATH and PyPI.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from vllm_compat.resolution import resolve_pair  # noqa: E402

PAIRS = {  # the pair and the conflict overrides check suggests for it (docs/dependency-drift.md)
    "vllm==0.33.0,vllm-omni==0.24.0": [],
    "vllm==0.34.0,vllm-omni==0.30.0": ["transformers==5.22.2", "huggingface-hub==2.4.0"],
}


def one(label: str, requirements: list[str], overrides: list[str], directory: Path) -> None:
    resolution = resolve_pair(requirements, overrides, directory)
    parts = [resolution.first] + ([resolution.fix] if resolution.fix is not None else [])
    uv = sum(p.compiled.seconds for p in parts if not p.compiled.cached)
    listing = sum(p.list_seconds for p in parts)
    fetched = sum(p.fetched_bytes for p in parts)
    requests = sum(p.requests for p in parts)
    listed = sum(p.listed for p in parts)
    print(f"  {label:<8} total {resolution.seconds:6.1f} s (uv {uv:5.1f} s, listing {listing:5.1f} s); "
          f"{len(resolution.first.compiled.packages)} packages, {listed} listings ({requests} requests, "
          f"{fetched / 1e6:.2f} MB)")
    if label == "warm":
        print(f"  found: {resolution.short_text()}")
        if resolution.fix is not None:
            print(f"  fix: {resolution.fix_text()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pairs", nargs="*", metavar="PAIR")
    parser.add_argument("--override", action="append", default=None, help="override lines (for every PAIR given)")
    args = parser.parse_args()
    pairs = {p: args.override or [] for p in args.pairs} if args.pairs else PAIRS
    for pair, overrides in pairs.items():
        requirements = pair.split(",")
        print(f"{' '.join(requirements)}" + (f" --override {' '.join(overrides)}" if overrides else ""))
        with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as uv_cache:
            one("cold", requirements, overrides, Path(tmp) / "a")
            one("warm", requirements, overrides, Path(tmp) / "a")
            saved = os.environ.get("UV_CACHE_DIR")
            os.environ["UV_CACHE_DIR"] = uv_cache
            try:
                one("cold+uv", requirements, overrides, Path(tmp) / "b")
            finally:
                if saved is None:
                    os.environ.pop("UV_CACHE_DIR", None)
                else:
                    os.environ["UV_CACHE_DIR"] = saved


if __name__ == "__main__":
    main()
