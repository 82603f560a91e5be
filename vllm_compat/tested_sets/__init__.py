"""The exact distribution sets the matrix cells passed with (issue 33): installs that start today and next month.

A resolver picks new versions of transitive dependencies every day, so "tested by cell X" means nothing unless it
names versions. One file a cell, ``<cell id>.txt`` beside this module: the ``name==version`` of every distribution
the cell's env held when its whole suite passed (``uv pip freeze``), written by ``matrix/tested_sets.py record``
after a passing run (the noxfile, with VLLM_COMPAT_RECORD_SETS=1), never by hand. Its header says which cell,
which torch and when::

    # cell: v0.33-omni0.30-serve (vllm==0.33.0 vllm-omni==0.30.0)
    # torch: pinned
    # passed: 2026-12-05

Who reads them: the noxfile installs each cell with its set as constraints (CI installs what passed, not today's
resolution); ``nox -s refresh`` re-resolves every recorded cell, reports what moved, re-runs those cells and
rewrites a file only after its cell passed; ``vllm-compat check --constraints FILE`` writes the set of the pair's
cell, so ``uv pip install vllm==X vllm-omni==Y -c FILE`` (plus ``--override`` where check names overrides) gives
a tested env.

``torch: cpu``: the cell replaced vLLM's CUDA torch by a CPU build and removed torchvision / torchaudio /
torchcodec, so its file pins neither torch nor those; everything else is pinned and the torch stack is vLLM's pin,
untested as a set. ``for_pair`` prefers a cell on vLLM's pinned torch (``torch: pinned``), as users install it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HOME = Path(__file__).resolve().parent
HEADER_KEYS = ("cell", "torch", "passed")


@dataclass(frozen=True)
class TestedSet:
    """One cell's recorded set: ``pins`` are its ``name==version`` lines, sorted by name."""

    cell: str
    pair: str  # "vllm==0.33.0 vllm-omni==0.30.0" (vllm alone for a vLLM-only cell)
    torch: str  # "pinned" (vLLM's CUDA torch) or "cpu" (torch stack left out)
    passed: str  # the date its whole suite passed with exactly these versions
    pins: tuple[str, ...]
    path: Path

    @property
    def on_pinned_torch(self) -> bool:
        return self.torch == "pinned"

    def constraints_text(self) -> str:
        """The file ``check --constraints`` writes: what it is, how to install with it, then the pins."""
        torch = ("torch and its CUDA libraries included (vLLM's pinned torch)" if self.on_pinned_torch else
                 "torch, torchvision, torchaudio, torchcodec left to vLLM's pins: the cell ran a CPU torch")
        return "".join(f"{line}\n" for line in (
            f"# vllm-compat: the {len(self.pins)} distributions matrix cell {self.cell} passed its whole suite "
            f"with on {self.passed}",
            f"# {torch}",
            f"# install: uv pip install {self.pair} -c THIS_FILE  (pip: pip install {self.pair} -c THIS_FILE)",
            "# with --override FILE too where `vllm-compat check` names overrides for the pair",
            *self.pins))


def parse(text: str, path: Path) -> TestedSet:
    """A recorded file's ``TestedSet``; ValueError naming the file and what is missing when its header is not the
    three lines ``matrix/tested_sets.py`` writes."""
    header, pins = {}, []
    for line in text.splitlines():
        if line.startswith("# ") and ":" in line:
            key, _, value = line[2:].partition(":")
            header[key.strip()] = value.strip()
        elif line.strip() and not line.startswith("#"):
            pins.append(line.strip())
    missing = [key for key in HEADER_KEYS if key not in header]
    if missing:
        raise ValueError(f"{path}: no {', '.join(missing)} line in its header; the file is written by "
                         f"matrix/tested_sets.py record, not by hand")
    cell, _, pair = header["cell"].partition(" ")
    return TestedSet(cell=cell, pair=pair.strip("()"), torch=header["torch"], passed=header["passed"],
                     pins=tuple(pins), path=path)


def recorded(cell_id: str, home: Path | None = None) -> TestedSet | None:
    """Cell ``cell_id``'s set (in ``home``, default this package's folder); None where none is recorded."""
    path = (home or HOME) / f"{cell_id}.txt"
    return parse(path.read_text(), path) if path.is_file() else None


def for_pair(vllm_version: str | None, omni_version: str | None) -> TestedSet | None:
    """The recorded set of a passed cell testing this pair (``detect.versions.cells_testing``), a cell on vLLM's
    pinned torch first; None where no cell of the pair has one."""
    from ..detect.versions import cells_testing

    found = [tested for cell in cells_testing(vllm_version, omni_version) if (tested := recorded(cell))]
    if omni_version is not None:
        found = [tested for tested in found if "vllm-omni==" in tested.pair]
    return max(found, key=lambda tested: tested.on_pinned_torch, default=None)


def all_recorded(home: Path | None = None) -> list[TestedSet]:
    """Every recorded set in ``home`` (default this package's folder), by cell id."""
    folder = home or HOME
    return [parse(path.read_text(), path) for path in sorted(folder.glob("*.txt"))]


def _pair_versions(pair: str) -> dict[str, str]:
    """``{"vllm": "0.33.0", "vllm-omni": "0.30.0"}`` of a set's ``pair`` text."""
    return dict(item.split("==", 1) for item in pair.split() if "==" in item)


def nearest(vllm_version: str | None, omni_version: str | None, home: Path | None = None) -> TestedSet | None:
    """The recorded set of a vLLM + vllm-omni pair nearest to this one, for ``check --constraints`` where the pair
    itself has none: the same vllm-omni first (a vLLM the fewest minors away, the newer of two equally near), then
    the same vLLM, then any pair; a cell on vLLM's pinned torch before a CPU one. None where no pair has a set."""
    from packaging.version import InvalidVersion, Version

    def release(version: str | None) -> tuple[int, ...] | None:
        try:
            return Version(version).release if version else None
        except InvalidVersion:
            return None

    def minors(a: tuple[int, ...] | None, b: tuple[int, ...] | None) -> int:
        if a is None or b is None:
            return 1 << 16
        return abs((a[0] * 1000 + (a[1] if len(a) > 1 else 0)) - (b[0] * 1000 + (b[1] if len(b) > 1 else 0)))

    want_vllm, want_omni = release(vllm_version), release(omni_version)
    ranked = []
    for tested in all_recorded(home):
        versions = _pair_versions(tested.pair)
        if "vllm-omni" not in versions:
            continue
        have_vllm, have_omni = release(versions.get("vllm")), release(versions["vllm-omni"])
        ranked.append(((minors(want_omni, have_omni), minors(want_vllm, have_vllm),
                        tuple(-x for x in (have_vllm or ())), not tested.on_pinned_torch), tested))
    return min(ranked, key=lambda item: item[0])[1] if ranked else None
