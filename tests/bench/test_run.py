"""bench/run.py's arithmetic and parsing, on values the tests control (the benchmarks themselves are not run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_run", Path(__file__).parents[2] / "bench" / "run.py")
run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run)

# A client-request dump as callgrind 3.19 writes it (header of a real one; body cut).
DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 14307
cmd:  python bench/_worker.py --parts instructions
part: 2

desc: I1 cache:
desc: Timerange: Basic block 1000 - 28959
desc: Trigger: Client Request: 100:online:meta_safe:0

positions: line
events: Ir
summary: 9878460

fn=(192) __read_nocancel
26 8

totals: 9878460
"""


def test_reads_label_and_count_of_a_client_request_dump(tmp_path):
    dump = tmp_path / "cg.out.2"
    dump.write_text(DUMP)
    assert run.read_callgrind_dump(str(dump)) == ("100:online:meta_safe:0", 9878460)


def test_a_dump_at_program_exit_has_no_label(tmp_path):
    dump = tmp_path / "cg.out"
    dump.write_text(DUMP.replace("Client Request: 100:online:meta_safe:0", "Program termination"))
    assert run.read_callgrind_dump(str(dump))[0] is None


def test_instruction_cases_group_by_size_and_model_and_divide_the_medians():
    counts = {"100:online:meta_safe:0": 110, "100:online:in_tree:0": 100, "100:online:meta_safe:1": 102,
              "100:online:in_tree:1": 100, "100:online:meta_safe:2": 101, "100:online:in_tree:2": 104,
              "100:offline:meta_safe:0": 50, "100:offline:in_tree:0": 40}
    cases = run.instruction_cases({"counts": counts})
    assert [(c["n_quant"], c["online"]) for c in cases] == [(100, True), (100, False)]
    assert cases[0]["counts"]["meta_safe"] == [110, 102, 101]
    assert cases[0]["ratio"] == pytest.approx(102 / 100)
    assert cases[1]["ratio"] == pytest.approx(50 / 40)


def test_paired_peak_diff_compares_within_a_round():
    # Per round 140/141, 110/110, 120/119: the median is the equal round. The medians of the contenders
    # (120 vs 119) would put meta_safe 0.84 % higher.
    added = {"meta_safe": [40, 10, 20], "in_tree": [41, 10, 19]}
    assert run.paired_peak_diff_pct(100, added) == pytest.approx(0.0)


def _machine(date):
    return {"date": date, "command": f"run at {date}", "total_s": 1.0, "loadavg_start": [0, 0, 0],
            "loadavg_end": [1, 1, 1]}


def test_update_replaces_only_the_sections_run_and_says_when():
    old = {"machine": _machine("first"), "env": {}, "import": {"v": 1}, "doctor": {"v": 1}, "worker": {"v": 1},
           "hook_envs": [], "instructions": None}
    new = {"machine": _machine("second"), "env": {}, "import": None, "doctor": None, "worker": None,
           "hook_envs": [], "instructions": {"v": 2}}
    merged = run.updated(old, new, {"3i"})
    assert merged["instructions"] == {"v": 2}
    assert merged["import"] == merged["doctor"] == merged["worker"] == {"v": 1}
    assert merged["machine"]["date"] == "first"
    assert [u["date"] for u in merged["machine"]["updates"]] == ["second"]


def test_update_refuses_half_of_the_shared_worker():
    with pytest.raises(SystemExit, match="sections 3 and 4"):
        run.updated({}, {}, {"3"})
