"""matrix/rotation.py: CI's share of the non-default cells. Checked on the real matrix/vllm.toml (whatever cells it
holds) and on lists the test writes: every cell once per period, the share size, neighbours in the file spread
over different runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading matrix/vllm.toml needs Python >= 3.11 (tomllib)")

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("matrix_rotation", ROOT / "matrix" / "rotation.py")
rotation = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rotation)
ROTATING = [c for c in tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"] if rotation.rotates(c)]


@pytest.mark.parametrize("per_run", [1, 3, 4, 5])
def test_every_rotating_cell_of_the_matrix_runs_once_per_period(per_run):
    period = rotation.rotation_period(len(ROTATING), per_run)
    assert period == -(-len(ROTATING) // per_run)
    for start in (0, 7, 1234):  # any run of `period` consecutive submissions
        runs = [rotation.rotation_share(ROTATING, seed, per_run) for seed in range(start, start + period)]
        ids = [c["id"] for run in runs for c in run]
        assert sorted(ids) == sorted(c["id"] for c in ROTATING)  # each once, none twice
        assert all(per_run - 1 <= len(run) <= per_run for run in runs)


def test_neighbours_land_in_different_runs():
    cells = [{"id": f"c{i}"} for i in range(10)]
    assert [[c["id"] for c in rotation.rotation_share(cells, seed, 4)] for seed in range(3)] == [
        ["c0", "c3", "c6", "c9"], ["c1", "c4", "c7"], ["c2", "c5", "c8"]]
    # the serve cells sit together at the end of the file: never more than one of them in a run (CI's 3, or 4)
    serve = [c["id"] for c in ROTATING if c["id"].endswith("-serve")]
    for per_run in (3, 4):
        period = rotation.rotation_period(len(ROTATING), per_run)
        if 0 < len(serve) <= period:
            for seed in range(period):
                assert sum(c["id"] in serve for c in rotation.rotation_share(ROTATING, seed, per_run)) <= 1


def test_nothing_to_rotate():
    assert rotation.rotation_share([], 5, 4) == []
    assert rotation.rotation_share([{"id": "a"}], 5, 0) == []
    assert rotation.rotation_share([{"id": "a"}], 5, 4) == [{"id": "a"}]
