"""The exact sets the matrix cells passed with (``vllm_compat/tested_sets/``, issue 33): every recorded file is a
cell's, as matrix/vllm.toml says it; the cell that runs this suite installed its recorded set; ``record`` reads an
env the way importlib.metadata does; ``moved`` names what a fresh resolution changed; ``check --constraints``
writes the pair's set, on vLLM's pinned torch first.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest

from vllm_compat import tested_sets
from vllm_compat.tested_sets import for_pair, parse, recorded

tomllib = pytest.importorskip("tomllib", reason="reading matrix/vllm.toml needs Python >= 3.11 (tomllib)")

ROOT = Path(__file__).resolve().parent.parent
CELLS = {c["id"]: c for c in tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]}
RECORDED = sorted(path.stem for path in tested_sets.HOME.glob("*.txt"))
CELL = os.environ.get("VLLM_COMPAT_CELL")
SCRIPT = ROOT / "matrix" / "tested_sets.py"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _installed() -> dict[str, str]:
    """{canonical name: version} of this env's site-packages, read by importlib.metadata (the oracle: not uv's
    freeze). Its site-packages only: importing setuptools puts setuptools/_vendor on sys.path, whose vendored
    copies (packaging, zipp, importlib-metadata ...) are no installed distributions."""
    sites = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    return {_canonical(d.metadata["Name"]): d.version for d in metadata.distributions(path=sites)
            if d.metadata["Name"]}


@pytest.mark.parametrize("cell_id", RECORDED or ["(none recorded)"])
def test_each_recorded_set_is_its_cells(cell_id):
    if not RECORDED:
        pytest.skip("no tested set recorded yet")
    tested = recorded(cell_id)
    cell = CELLS.get(cell_id)
    assert cell is not None, f"{tested.path}: no cell {cell_id} in matrix/vllm.toml (removed? delete the file)"
    pair = f"vllm=={cell['vllm']}" + (f" vllm-omni=={cell['vllm_omni']}" if cell.get("vllm_omni") else "")
    assert (tested.cell, tested.pair) == (cell_id, pair)
    assert tested.torch == ("pinned" if cell.get("torch") == "pinned" else "cpu")
    names = [_canonical(pin.split("==")[0]) for pin in tested.pins]
    assert names == sorted(names) and len(set(names)) == len(names)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+==\S+", pin) for pin in tested.pins)
    assert f"vllm=={cell['vllm']}" in tested.pins and "vllm-compat" not in names
    if tested.torch == "cpu":  # the override's CPU build is not what users install
        assert "torch" not in names


@pytest.mark.skipif(CELL is None or recorded(CELL or "") is None or os.environ.get("VLLM_COMPAT_FRESH_RESOLVE") == "1",
                    reason="runs in a nox cell that has a recorded set, installed from it (not a fresh resolution)")
def test_this_cell_installed_its_recorded_set():
    installed = _installed()
    wrong = {pin: installed.get(_canonical(pin.split("==")[0]), "not installed") for pin in recorded(CELL).pins
             if installed.get(_canonical(pin.split("==")[0])) != pin.split("==")[1]}
    assert not wrong, f"cell {CELL} did not install the versions it passed with (noxfile: -c): {wrong}"


@pytest.mark.skipif(CELL not in CELLS, reason="records this env as its nox cell: runs in a nox cell")
def test_record_reads_the_env_as_importlib_metadata_does(tmp_path):
    subprocess.run([sys.executable, str(SCRIPT), "record", CELL, "--python", sys.executable, "--sets", str(tmp_path)],
                   check=True, capture_output=True, text=True)
    tested = recorded_in(tmp_path, CELL)
    expected = {name: version for name, version in _installed().items() if name != "vllm-compat"}
    if CELLS[CELL].get("torch") != "pinned":
        expected.pop("torch", None)
    assert {_canonical(p.split("==")[0]): p.split("==")[1] for p in tested.pins} == expected
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", tested.passed)


def recorded_in(directory: Path, cell_id: str) -> tested_sets.TestedSet:
    path = directory / f"{cell_id}.txt"
    return parse(path.read_text(), path)


def _write_set(directory: Path, cell_id: str, torch: str, pins: list[str]) -> Path:
    cell = CELLS[cell_id]
    path = directory / f"{cell_id}.txt"
    path.write_text(f"# cell: {cell_id} (vllm=={cell['vllm']} vllm-omni=={cell['vllm_omni']})\n# torch: {torch}\n"
                    f"# passed: 2026-12-05\n" + "".join(f"{pin}\n" for pin in pins))
    return path


def test_moved_names_each_change_and_only_the_cells_that_moved(tmp_path):
    home = tmp_path / "sets"
    home.mkdir()
    _write_set(home, "v0.33-omni0.24", "cpu", ["cuda-python==12.6.2.post1", "gone==1.0", "vllm==0.33.0"])
    _write_set(home, "v0.33-omni0.24-serve", "pinned", ["torch==2.11.0", "vllm==0.33.0"])
    moved_file = tmp_path / "moved.txt"  # uv pip compile's output shape: annotations, a torch the CPU cell drops
    moved_file.write_text("cuda-python==13.4.4\n    # via flashinfer-python\nnew-one==2.0\ntorch==2.11.0\n"
                          "vllm==0.33.0\n")
    same_file = tmp_path / "same.txt"
    same_file.write_text("torch==2.11.0\nvllm==0.33.0\n")
    out = subprocess.run([sys.executable, str(SCRIPT), "moved", f"v0.33-omni0.24={moved_file}",
                          f"v0.33-omni0.24-serve={same_file}", f"v0.34-omni0.24={same_file}", "--sets", str(home)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1] == "moved: v0.33-omni0.24"
    assert "v0.33-omni0.24: 3 distribution(s) moved since 2026-12-05:" in lines
    assert {"  cuda-python 12.6.2.post1 -> 13.4.4", "  +new-one==2.0", "  -gone==1.0"} <= set(lines)
    assert "v0.33-omni0.24-serve: unchanged since 2026-12-05 (2 distributions)" in lines
    assert any(line.startswith("v0.34-omni0.24: no recorded set") for line in lines)


def test_a_pairs_set_is_its_pinned_torch_cells_first(tmp_path, monkeypatch):
    monkeypatch.setattr(tested_sets, "HOME", tmp_path)
    _write_set(tmp_path, "v0.33-omni0.24", "cpu", ["vllm==0.33.0"])
    assert for_pair("0.33.0", "0.24.0").cell == "v0.33-omni0.24"
    _write_set(tmp_path, "v0.33-omni0.24-serve", "pinned", ["torch==2.11.0", "vllm==0.33.0"])
    assert for_pair("0.33.0", "0.24.0").cell == "v0.33-omni0.24-serve"
    assert for_pair("0.33.0", "0.30.0") is None and for_pair("0.35.0", "0.24.0") is None


def test_a_hand_edited_header_is_refused_with_the_file_named(tmp_path):
    path = tmp_path / "v0.33-omni0.24.txt"
    path.write_text("# cell: v0.33-omni0.24 (vllm==0.33.0)\nvllm==0.33.0\n")
    with pytest.raises(ValueError, match=r"v0\.33-omni0\.24\.txt: no torch, passed line"):
        parse(path.read_text(), path)


def test_check_writes_the_pairs_set_as_constraints(capsys, tmp_path, monkeypatch):
    """``check --constraints F`` on real wheels (vLLM 0.31.0 + vllm-omni 0.24.0, fetched by the check)."""
    from tests.support.wheels import wheel_or_skip
    from vllm_compat.cli import main

    vllm, omni = wheel_or_skip("vllm", "0.31.0"), wheel_or_skip("vllm-omni", "0.24.0")
    monkeypatch.setattr(tested_sets, "HOME", tmp_path / "sets")
    (tmp_path / "sets").mkdir()
    target = tmp_path / "constraints.txt"
    assert main(["check", str(vllm), str(omni), "--constraints", str(target)]) == 2  # none recorded: not written
    err = capsys.readouterr().err
    assert not target.exists() and "cell v0.31-omni0.24 tests this pair; its exact versions are not recorded" in err
    pins = ["accelerate==1.12.0", "vllm==0.31.0", "vllm-omni==0.24.0"]
    _write_set(tmp_path / "sets", "v0.31-omni0.24", "cpu", pins)
    code = main(["check", "--json", str(vllm), str(omni), "--constraints", str(target)])
    data = json.loads(capsys.readouterr().out)
    assert code in (0, 1) and data["tested_set"]["cell"] == "v0.31-omni0.24" and data["tested_set"]["pins"] == pins
    written = target.read_text().splitlines()
    assert [line for line in written if not line.startswith("#")] == pins
    assert "# install: uv pip install vllm==0.31.0 vllm-omni==0.24.0 -c THIS_FILE" in " ".join(written)
    main(["check", str(vllm), str(omni)])
    screen = capsys.readouterr().out
    assert "tested install: cell v0.31-omni0.24's 3 versions (2026-12-05): --constraints FILE" in screen
