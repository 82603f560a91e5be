"""bench/member_reads.py's table and counters, on values the tests control (the benchmark itself is not run)."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("bench_member_reads",
                                               Path(__file__).parents[2] / "bench" / "member_reads.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def _row(what, mode, wall, cpu, mb, rx=0.0):
    return {"what": what, "mode": mode, "wall": wall, "cpu": cpu, "code": 0, "fetched_mb": mb, "rx_mb": rx,
            "stats": {}}


def test_each_row_puts_both_modes_beside_the_goal():
    results = {"date": "2026-12-06 19:00 UTC", "cpus": 2, "load_before": (6.1, 0, 0), "load_after": (4.2, 0, 0),
               "rows": [_row("check, cold (never-seen pair)", "members", 9.5, 8.0, 19.1, 300),
                        _row("check, cold (never-seen pair)", "whole", 60.3, 20.0, 244.3),
                        _row("plan, warm", "members", 1.5, 1.2, 0.0)],
               "library": [{"reader": "own", "seconds": 0.84, "requests": 19, "bytes": 15_200_000}]}
    text = bench.summary(results, argparse.Namespace(vllm="0.34.0", omni="0.24.0", warm_runs=3))
    lines = text.splitlines()
    cold = next(line for line in lines if line.startswith("| check, cold"))
    assert cold == ("| check, cold (never-seen pair) | 9.50 s (CPU 8.0 s), 19.1 MB; rx 300 MB | 60.30 s (CPU 20.0 s), "
                    "244.3 MB; rx 0 MB | <= 10 s, <= 30 MB |")
    warm = next(line for line in lines if line.startswith("| plan, warm"))
    assert warm == "| plan, warm | 1.50 s (CPU 1.2 s); rx 0 MB | - | <= 2.0 s |"  # no whole-mode row: "-"
    assert "| vLLM 0.34.0 source members: own | 0.84 s, 19 requests, 15.2 MB | | |" in lines
    assert "2 CPUs, load average 6.1 before, 4.2 after" in lines[1]


def test_fetched_counts_the_reader_or_the_wheels_pip_left(tmp_path):
    (tmp_path / "a-1-py3-none-any.whl").write_bytes(b"x" * 2_000_000)
    (tmp_path / "members").mkdir()
    (tmp_path / "members" / "b.zip").write_bytes(b"y" * 5_000_000)  # kept members: not a download of pip's
    result = {"stats": {"range_bytes": 3_000_000, "whole_bytes": 1_000_000}}
    assert bench.fetched_mb(result, tmp_path, members=True) == 4.0
    assert bench.fetched_mb(result, tmp_path, members=False) == 2.0


def test_received_bytes_leave_loopback_out(tmp_path, monkeypatch):
    dev = tmp_path / "dev"
    dev.write_text("Inter-|   Receive\n face |bytes    packets\n    lo: 500 1 0 0 0 0 0 0 500 1 0 0 0 0 0 0\n"
                   "  eth0: 1200 3 0 0 0 0 0 0 10 1 0 0 0 0 0 0\n  eth1: 34 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(dev if path == "/proc/net/dev" else path,
                                                                          *a, **k))
    assert bench.rx_bytes() == 1234
