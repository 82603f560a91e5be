"""CI's share of the matrix cells that are not default (``nox -s rotation``; .ci/run), as a pure function.

The rotating cells, in matrix/vllm.toml's order, are dealt into ``period = ceil(n / per_run)`` shares by stride:
cell ``i`` goes to share ``i % period``, and submission ``seed`` runs share ``seed % period``. So every cell runs
once in every ``period`` consecutive submissions, each run takes ``per_run`` cells (the last shares one fewer when
``n`` is not a multiple), and cells that sit together in the file (a vllm-omni column, the serve cells with their
CUDA torch) land in different runs, which keeps each run's time near the average. Whatever cells the file holds are
taken; adding or removing one re-deals the shares, so the cycle starts over.
"""

from __future__ import annotations


def rotates(cell: dict) -> bool:
    """Whether CI's rotation runs ``cell`` (a ``[[cell]]`` of matrix/vllm.toml): not a default cell (those run on every
    submission) and not marked ``rotation = false`` (listed, its whole suite not yet passed here)."""
    return not cell.get("default") and bool(cell.get("rotation", True))


def rotation_share(cells: list[dict], seed: int, per_run: int) -> list[dict]:
    """The cells of ``cells`` (the rotating ones, in file order) that submission number ``seed`` runs; [] when
    there are none or ``per_run`` is not positive."""
    if not cells or per_run <= 0:
        return []
    period = rotation_period(len(cells), per_run)
    return cells[seed % period::period]


def rotation_period(count: int, per_run: int) -> int:
    """How many consecutive submissions run every one of ``count`` rotating cells at ``per_run`` a run."""
    return max(1, -(-count // max(per_run, 1)))
