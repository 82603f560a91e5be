""".github/workflows/matrix.yml's cell listing, run here: its embedded Python reads matrix/vllm.toml and must give
every cell (in file order, with its versions and torch) as the JSON matrix the cell jobs expand, a chosen subset, and a
failure naming an unknown id. The expected ids come from the TOML itself."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="the workflow's listing uses tomllib (Python 3.11, as on the runner)")

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "matrix.yml"
CELLS = tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]


def _listing(wanted: str) -> subprocess.CompletedProcess:
    text = WORKFLOW.read_text()
    found = re.search(r"python - <<'EOF' >> \"\$GITHUB_OUTPUT\"\n(.*?)\n\s*EOF\n", text, flags=re.S)
    assert found, "the workflow's cell listing (python - <<'EOF' >> \"$GITHUB_OUTPUT\") is gone"
    return subprocess.run([sys.executable, "-"], input=textwrap.dedent(found.group(1)), text=True,
                          capture_output=True, cwd=ROOT, env={**os.environ, "WANTED": wanted})


def _matrix(result: subprocess.CompletedProcess) -> list[dict]:
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    assert line.startswith("cells=")
    return json.loads(line[len("cells="):])


def test_the_workflow_lists_every_cell_of_the_matrix():
    rows = _matrix(_listing(""))
    assert [r["id"] for r in rows] == [c["id"] for c in CELLS]
    assert [(r["vllm"], r["vllm_omni"], r["torch"]) for r in rows] == [
        (c["vllm"], c.get("vllm_omni", "-"), c.get("torch", "cpu")) for c in CELLS]


def test_a_chosen_subset_and_an_unknown_id():
    first, last = CELLS[0]["id"], CELLS[-1]["id"]
    assert [r["id"] for r in _matrix(_listing(f" {last}, {first} "))] == [first, last]
    result = _listing(f"{first},no-such-cell")
    assert result.returncode != 0 and "unknown cells ['no-such-cell']" in result.stderr


def test_each_cell_job_runs_the_nox_cell_session():
    text = WORKFLOW.read_text()
    assert 'nox -s "cell(${CELL})"' in text and "CELL: ${{ matrix.cell.id }}" in text
    assert "fail-fast: false" in text
