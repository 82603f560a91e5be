"""Record and compare the exact sets the matrix cells pass with (``vllm_compat/tested_sets/<cell id>.txt``).

    python matrix/tested_sets.py record CELL_ID --python PYTHON     after the cell's whole suite passed in PYTHON's env
    python matrix/tested_sets.py moved CELL_ID=COMPILED ...         what a fresh resolution moved, per cell

``record`` reads the env with ``uv pip freeze --exclude-editable`` (vllm-compat itself is the checkout under
test), leaves torch out of a CPU-torch cell (the noxfile's override puts a CPU build there; users run vLLM's CUDA
pin) and writes the file with its three header lines (``vllm_compat.tested_sets``). The noxfile calls it when
VLLM_COMPAT_RECORD_SETS=1, only after pytest passed.

``moved`` compares each cell's recorded set with a fresh ``uv pip compile`` of the same install (the noxfile's
``refresh`` session writes COMPILED), prints one block per cell (moved versions, added and removed distributions)
and, last, one line ``moved: ID ID ...``: the cells whose set changed, which the session then re-runs, fresh, and
re-records only where they pass. Cells without a recorded set are named, not compared.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vllm_compat.tested_sets import HOME, recorded  # noqa: E402

CELLS = {cell["id"]: cell for cell in tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]}
# What a CPU-torch cell's env does not keep from vLLM's resolution (noxfile.py: the torch override, and the three it
# uninstalls): never recorded for it, so never compared.
CPU_CELL_LEAVES_OUT = {"torch", "torchvision", "torchaudio", "torchcodec"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """{canonical name: version} of ``name==version`` lines (freeze or compile output; comments, ``-e`` lines and
    indented annotations skipped)."""
    found = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line and not line.startswith("-"):
            name, _, version = line.partition("==")
            found[canonical(name.split("[", 1)[0])] = version.split(";", 1)[0].strip()
    return found


def kept(cell: dict, versions: dict[str, str]) -> dict[str, str]:
    """``versions`` without vllm-compat (the checkout) and, in a CPU-torch cell, the torch stack."""
    leave_out = {"vllm-compat"} | (set() if cell.get("torch") == "pinned" else CPU_CELL_LEAVES_OUT)
    return {name: version for name, version in versions.items() if name not in leave_out}


def pair(cell: dict) -> str:
    return f"vllm=={cell['vllm']}" + (f" vllm-omni=={cell['vllm_omni']}" if cell.get("vllm_omni") else "")


def record(cell_id: str, python: str, home: Path = HOME) -> Path:
    cell = CELLS[cell_id]
    freeze = subprocess.run(["uv", "pip", "freeze", "--exclude-editable", "--python", python],
                            capture_output=True, text=True, check=True).stdout
    versions = kept(cell, pins(freeze))
    path = home / f"{cell_id}.txt"
    path.write_text("".join(f"{line}\n" for line in (
        f"# cell: {cell_id} ({pair(cell)})",
        f"# torch: {'pinned' if cell.get('torch') == 'pinned' else 'cpu'}",
        f"# passed: {time.strftime('%Y-%m-%d', time.gmtime())}",
        *(f"{name}=={version}" for name, version in sorted(versions.items())))))
    return path


def differences(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """``name old -> new``, ``+name==version``, ``-name==version``, sorted by name."""
    lines = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        lines.append(f"+{name}=={new}" if old is None else f"-{name}=={old}" if new is None
                     else f"{name} {old} -> {new}")
    return lines


def moved(compiled: dict[str, Path], home: Path = HOME) -> list[str]:
    """Print each cell's differences; return the ids of the cells whose set moved."""
    changed = []
    for cell_id, path in compiled.items():
        tested = recorded(cell_id, home)
        if tested is None:
            print(f"{cell_id}: no recorded set (record one: VLLM_COMPAT_RECORD_SETS=1 nox -s \"cell({cell_id})\")")
            continue
        cell = CELLS[cell_id]
        lines = differences(kept(cell, pins("\n".join(tested.pins))), kept(cell, pins(path.read_text())))
        if not lines:
            print(f"{cell_id}: unchanged since {tested.passed} ({len(tested.pins)} distributions)")
            continue
        changed.append(cell_id)
        print(f"{cell_id}: {len(lines)} distribution(s) moved since {tested.passed}:")
        print("".join(f"  {line}\n" for line in lines), end="")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    rec = commands.add_parser("record")
    rec.add_argument("cell", choices=sorted(CELLS))
    rec.add_argument("--python", required=True)
    cmp = commands.add_parser("moved")
    cmp.add_argument("compiled", nargs="+", metavar="CELL_ID=FILE")
    for command in (rec, cmp):
        command.add_argument("--sets", type=Path, default=HOME, help="the sets' folder (default: the package's)")
    args = parser.parse_args(argv)
    if args.command == "record":
        print(f"recorded {record(args.cell, args.python, args.sets)}")
        return 0
    compiled = {}
    for item in args.compiled:
        cell_id, _, path = item.partition("=")
        if cell_id not in CELLS or not path:
            parser.error(f"{item!r}: expected CELL_ID=FILE with a cell of matrix/vllm.toml")
        compiled[cell_id] = Path(path)
    print("moved: " + " ".join(moved(compiled, args.sets)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
