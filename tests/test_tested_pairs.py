"""What the package calls tested (vllm_compat/detect/tested.py: the vLLM range, the pairs and their cells) is generated
from matrix/vllm.toml's passed cells and is not stale; ``python matrix/tested_pairs.py`` regenerates it. Expected
values are read from the matrix file here, never from the module under test."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from packaging.version import Version

from vllm_compat.detect import tested
from vllm_compat.detect.versions import TESTED_VLLM_RANGE, cells_testing, is_tested_vllm

tomllib = pytest.importorskip("tomllib", reason="reading matrix/vllm.toml needs Python >= 3.11 (tomllib)")

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("matrix_tested_pairs", ROOT / "matrix" / "tested_pairs.py")
tested_pairs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tested_pairs)


def _cells() -> list[dict]:
    return tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]


def _passed() -> list[dict]:
    # spelled out here, not through tested_pairs.has_passed: `rotation = false` marks a cell not yet passed whole
    return [c for c in _cells() if c.get("rotation") is not False]


def test_the_module_is_generated_from_the_matrix():
    assert tested_pairs.render(_cells()) == (ROOT / "vllm_compat" / "detect" / "tested.py").read_text(), \
        "vllm_compat/detect/tested.py is stale: run python matrix/tested_pairs.py"
    assert tested_pairs.main(["--check"]) == 0


def test_the_range_spans_the_passed_cells():
    vllms = sorted({c["vllm"] for c in _passed()}, key=Version)
    assert TESTED_VLLM_RANGE == tested.TESTED_VLLM_RANGE == (vllms[0], vllms[-1])
    assert is_tested_vllm(vllms[-1]) is True and is_tested_vllm(vllms[0]) is True
    newest = Version(vllms[-1]).release
    assert is_tested_vllm(f"{newest[0]}.{newest[1] + 1}.0") is False
    assert is_tested_vllm(f"{vllms[-1]}+cu129") is True  # a local build of a tested release
    assert is_tested_vllm(None) is None and is_tested_vllm("not a version") is None


def test_every_passed_pair_names_its_cells():
    for cell in _passed():
        ids = cells_testing(cell["vllm"], cell.get("vllm_omni"))
        assert cell["id"] in ids
        if cell.get("vllm_omni"):
            assert ids == tuple(c["id"] for c in _passed()
                                if (c["vllm"], c.get("vllm_omni")) == (cell["vllm"], cell["vllm_omni"]))
        else:  # vllm-omni absent: every passed cell on that vLLM
            assert set(ids) == {c["id"] for c in _passed() if c["vllm"] == cell["vllm"]}
    newest = max((c for c in _passed() if c.get("vllm_omni")), key=lambda c: Version(c["vllm"]))
    assert cells_testing(newest["vllm"] + ".dev3", newest["vllm_omni"]) == cells_testing(newest["vllm"],
                                                                                     newest["vllm_omni"])
    assert cells_testing(newest["vllm"], "0.1.0") == ()
    assert cells_testing("not a version", newest["vllm_omni"]) == () and cells_testing(None, None) == ()


def test_a_new_passed_cell_moves_the_range_and_a_waiting_one_does_not():
    """The check can fail: a cell for a newer vLLM makes the module stale once it has passed, and not before."""
    current = (ROOT / "vllm_compat" / "detect" / "tested.py").read_text()
    high = Version(TESTED_VLLM_RANGE[1]).release
    newer = f"{high[0]}.{high[1] + 1}.0"
    cell = {"id": "v-next-omni", "vllm": newer, "vllm_omni": "0.30.0", "rotation": False}
    assert tested_pairs.render([*_cells(), cell]) == current
    del cell["rotation"]
    text = tested_pairs.render([*_cells(), cell])
    assert text != current
    assert f"TESTED_VLLM_RANGE = ({TESTED_VLLM_RANGE[0]!r}, {newer!r})" in text
    assert f"({newer!r}, '0.30.0'): ('v-next-omni',)," in text
    # and an existing cell marked back to waiting leaves its pair
    cells = _cells()
    waiting = next(c for c in cells if c["vllm"] == TESTED_VLLM_RANGE[1] and c.get("vllm_omni")
                   and not c.get("default"))
    waiting["rotation"] = False
    assert f"{waiting['id']!r}" not in tested_pairs.render(cells)
