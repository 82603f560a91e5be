"""Dependency drift (``vllm_compat.dependency_drift``) on the REAL metadata of real releases.

The oracle is what was measured, hard-coded here (issue 25 and the matrix's installs), never the code under test:
- vLLM 0.34.0 requires huggingface-hub>=2.0.0; every vllm-omni pins a diffusers (0.24.0 / 0.26.0: 0.38.0,
  0.28.0 / 0.30.0: 0.40.0) whose METADATA requires huggingface-hub<2.0: no pair with vLLM 0.34.0 resolves;
- vllm-omni 0.28.0 / 0.30.0 require transformers<5.15, vLLM 0.32+ >=5.16.1;
- every other pair of vLLM 0.24-0.33 with vllm-omni 0.24.0-0.30.0 installs without an override (the matrix's
  cells of vllm-omni 0.24.0 / 0.30.0 on 0.24-0.31 install without one; 0.24.0 has no transformers ceiling).

Metadata comes as the check reads it: a wheel already in the check's cache (VLLM_COMPAT_WHEEL_CACHE, which nox
shares across cells; else a session temporary directory) is read directly, any other release's METADATA through
pip's report (``detect.requirements.fetch_pinned``: the index's PEP 658 metadata, no 300 MB vLLM wheel), kept in
the same cache. The matrix test keeps matrix/vllm.toml's ``overrides`` equal to what check suggests for each cell's
pair, so every suggested override is one a cell installs with.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from vllm_compat.detect.requirements import (
    fetch_pinned,
    parse_metadata,
    ranges_overlap,
    tree_metadata,
)
from vllm_compat.detect.source_tree import SourceTree
from vllm_compat.detect.versions import installed_version
from vllm_compat.detect.wheels import CACHE_VAR, WheelError, cached_wheel

VLLM_VERSION, OMNI_VERSION = installed_version("vllm"), installed_version("vllm-omni")

tomllib = pytest.importorskip("tomllib", reason="reading matrix/vllm.toml needs Python >= 3.11 (tomllib)")

ROOT = Path(__file__).resolve().parent.parent
CELLS = tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]
# the cells of vLLM 0.34.0 + vllm-omni 0.24.0 that install with the measured huggingface-hub line (the matrix file)
HUB_CELLS = tuple(c["id"] for c in CELLS if (c["vllm"], c.get("vllm_omni")) == ("0.34.0", "0.24.0")
                  and "huggingface-hub==2.4.0" in c.get("overrides", []))
PAIRED = [c for c in CELLS if c.get("vllm_omni")]
SWEEP_CELL = next(c["id"] for c in CELLS if c.get("default"))
# Every pair (eleven vLLM METADATA from the index, ~10 s each when not cached) runs outside nox and in one nox cell;
# any other cell checks its own pair only.
HERE = next((c for c in CELLS if c["id"] == os.environ.get("VLLM_COMPAT_CELL")), None)
SWEEP = HERE is None or HERE["id"] == SWEEP_CELL


def _here(pair) -> bool:
    return SWEEP or pair == (HERE["vllm"], HERE.get("vllm_omni"))

# ---- the oracle: measured (issue 25's text; the matrix's installs) ----
VLLMS = ["0.24.0", "0.25.1", "0.26.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0", "0.32.0", "0.33.0",
         "0.34.0"]
OMNIS = ["0.24.0", "0.26.0", "0.28.0", "0.30.0"]
DIFFUSERS_PIN = {"0.24.0": "0.38.0", "0.26.0": "0.38.0", "0.28.0": "0.40.0", "0.30.0": "0.40.0"}


def expected_conflicts(vllm: str, omni: str) -> dict[str, str]:
    """{package: the plugin-side party whose range excludes vLLM's}, as measured."""
    found = {}
    if vllm == "0.34.0":
        found["huggingface-hub"] = f"diffusers {DIFFUSERS_PIN[omni]} (pinned by vllm-omni {omni})"
    if vllm in ("0.32.0", "0.33.0", "0.34.0") and omni in ("0.28.0", "0.30.0"):
        found["transformers"] = f"vllm-omni {omni}"
    return found


# vLLM's side of each conflict, as its METADATA states it (read by hand from the wheels)
HOST_RANGES = {"huggingface-hub": ">=2.0.0", "transformers": ">=5.16.1"}


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    shared = os.environ.get(CACHE_VAR)
    directory = Path(shared) if shared else tmp_path_factory.mktemp("drift-cache")
    saved = os.environ.get(CACHE_VAR)
    os.environ[CACHE_VAR] = str(directory)
    yield directory
    if saved is None:
        os.environ.pop(CACHE_VAR, None)


_READ: dict = {}


def requirements_of(distribution: str, version: str, cache: Path):
    """The release's requirements: from its wheel in the check's cache, else its METADATA from the index."""
    key = (distribution, version)
    if key not in _READ:
        wheel = cached_wheel(distribution, version, cache)
        if wheel is not None:
            _READ[key] = parse_metadata(tree_metadata(SourceTree(wheel), distribution))
        else:
            found, failed = fetch_pinned({distribution: version}, directory=cache)
            if distribution not in found:
                if "no_network" in str(failed) or "could not" in str(failed):
                    pytest.skip(f"cannot read {distribution}=={version} from the index: {failed}")
                raise AssertionError(f"{distribution}=={version}: {failed}")
            _READ[key] = found[distribution]
    return _READ[key]


def drift_of(vllm: str, omni: str, cache: Path, use_tested: bool = True):
    from vllm_compat.dependency_drift import detect_dependency_drift

    try:
        return detect_dependency_drift(requirements_of("vllm", vllm, cache), requirements_of("vllm-omni", omni, cache),
                                       directory=cache, use_tested=use_tested)
    except WheelError as exc:
        pytest.skip(f"the index could not be asked: {exc}")


# ------------------------------------------------------------------------------------------- ranges


@pytest.mark.parametrize(("a", "b", "overlap"), [
    (">=2.0.0", "<2.0,>=0.34.0", False),  # vLLM 0.34.0 / diffusers 0.38.0 on huggingface-hub
    (">=5.16.1,<5.20.0", "<5.15,>=5.13.0", False),  # vLLM 0.32.0 / vllm-omni 0.30.0 on transformers
    (">=5.16.1,<5.23.0", ">=5.5.3", True),  # vLLM 0.34.0 / vllm-omni 0.24.0
    (">=2.0.0rc1", "<2.0", False),  # PEP 440: <2.0 excludes 2.0's own pre-releases
    ("==0.7.3", ">=0.7", True),
    ("==0.7.3", "!=0.7.3", False),
    ("~=2.2", "<2.2", False),
    ("==6.30.*", ">=6.30.1,<6.31", True),
    ("!=6.30.*,>=5.29.6", "<6.31,>=6.30", False),
    (">1.0", "<=1.0.post1", False),  # >V excludes V's post-releases
])
def test_ranges_overlap(a, b, overlap):
    from packaging.specifiers import SpecifierSet

    assert ranges_overlap(SpecifierSet(a), SpecifierSet(b)) is overlap
    assert ranges_overlap(SpecifierSet(b), SpecifierSet(a)) is overlap


# ------------------------------------------------------------------------------ every pair, measured


@pytest.mark.parametrize(("vllm", "omni"), [(v, o) for v in VLLMS for o in OMNIS if _here((v, o))])
def test_conflicts_are_the_measured_ones(vllm, omni, cache):
    drift = drift_of(vllm, omni, cache)
    assert drift.unread == {}, f"the pins' METADATA must all be read: {drift.unread}"
    found = {c.package: [w.party for w in c.others] for c in drift.conflicts}
    expected = expected_conflicts(vllm, omni)
    assert {p: parties for p, parties in found.items()} == {p: [party] for p, party in expected.items()}, (
        "\n".join(drift.render_lines()))
    for c in drift.conflicts:
        assert c.host.party == f"vllm {vllm}"
        assert HOST_RANGES[c.package] in c.host.specifier.split(",")
        assert c.override is not None and c.override.startswith(f"{c.package}==")


@pytest.mark.skipif(not _here(("0.34.0", "0.24.0")), reason=f"reads vLLM 0.34.0's METADATA: in nox cell {SWEEP_CELL} "
                    "or v0.34-omni0.24 only")
def test_the_huggingface_hub_conflict_reads_as_the_user_needs_it(cache):
    drift = drift_of("0.34.0", "0.24.0", cache)
    (conflict,) = drift.conflicts
    assert conflict.describe() == ("huggingface-hub: vllm 0.34.0 needs >=2.0.0; diffusers 0.38.0 (pinned by "
                                   "vllm-omni 0.24.0) needs <2.0,>=0.34.0")
    assert conflict.override == "huggingface-hub==2.4.0"  # the line measured in issue 25 (native-equal)
    assert conflict.proven_by == HUB_CELLS
    assert f"tested by matrix cell {', '.join(HUB_CELLS)}" in conflict.resolution()


# ------------------------------------------------------------------------------------- the matrix


def _resolver_lines(cell: dict) -> list[str]:
    return sorted(cell.get("overrides", []))


MINE = [c for c in PAIRED if _here((c["vllm"], c["vllm_omni"]))]


@pytest.mark.parametrize("cell", MINE, ids=[c["id"] for c in MINE])
def test_cell_overrides_are_what_check_suggests(cell, cache):
    """A cell installs with exactly the lines check suggests for its pair, and each is proven by that cell."""
    drift = drift_of(cell["vllm"], cell["vllm_omni"], cache)
    assert sorted(drift.override_lines) == _resolver_lines(cell), "\n".join(drift.render_lines())
    for c in drift.conflicts:
        assert cell["id"] in c.proven_by
    conflicted = {c.package for c in drift.conflicts}
    for entry in cell.get("index_overrides", []):
        assert set(entry) == {"line", "reason"} and entry["reason"].strip(), entry
        from packaging.requirements import Requirement

        assert Requirement(entry["line"]).name not in conflicted, "an index workaround is not a resolver conflict"


@pytest.mark.parametrize("cell", [c for c in MINE if c.get("overrides")],
                         ids=[c["id"] for c in MINE if c.get("overrides")])
def test_cell_overrides_are_the_newest_release_in_vllms_range(cell, cache):
    """The rule without the matrix's lines (the newest release satisfying vLLM's range, as the intake chose them).
    A newer release on the index since the cell was measured is a warning, not a failure: re-run the cell with
    the new line and update its ``overrides``."""
    drift = drift_of(cell["vllm"], cell["vllm_omni"], cache, use_tested=False)
    from packaging.requirements import Requirement
    from packaging.version import Version

    newest = {c.package: c.override for c in drift.conflicts}
    for line in cell["overrides"]:
        package = Requirement(line).name
        assert package in newest
        (mine,) = Requirement(line).specifier
        (now,) = Requirement(newest[package]).specifier
        assert Version(mine.version) <= Version(now.version)
        if mine.version != now.version:
            warnings.warn(f"{cell['id']}: the index now has {newest[package]} (the cell installs {line}); re-run "
                          f"the cell with it and update matrix/vllm.toml", stacklevel=1)


def render_tested_overrides(cells: list[dict]) -> str:
    """The text of vllm_compat/tested_overrides.py for these cells: every cell's lines, and the reason each
    ``breakage_overrides`` / ``index_overrides`` line carries (the first cell's of the pair, in the file's order)."""
    pairs: dict = {}
    reasons: dict = {}
    for cell in cells:
        lines = (*cell.get("overrides", ()), *(o["line"] for key in ("breakage_overrides", "index_overrides")
                                               for o in cell.get(key, ())))
        if cell.get("vllm_omni") and lines:
            key = ("vllm", cell["vllm"], "vllm-omni", cell["vllm_omni"])
            pairs.setdefault(key, {})[cell["id"]] = lines
            for entry in (o for name in ("breakage_overrides", "index_overrides") for o in cell.get(name, ())):
                reasons.setdefault(key, {}).setdefault(entry["line"], entry["reason"])
    module = (ROOT / "vllm_compat" / "tested_overrides.py").read_text()
    head = module[:module.index("TESTED_OVERRIDES")]
    body = "".join(f"    {key!r}: {value!r},\n" for key, value in sorted(pairs.items()))
    why = "".join(f"    {key!r}: {value!r},\n" for key, value in sorted(reasons.items()))
    return (head + "TESTED_OVERRIDES: dict[tuple[str, str, str, str], dict[str, tuple[str, ...]]] = {\n" + body
            + "}\n\nTESTED_REASONS: dict[tuple[str, str, str, str], dict[str, str]] = {\n" + why + "}\n")


def test_tested_overrides_are_generated_from_the_matrix():
    text = render_tested_overrides(CELLS)
    current = (ROOT / "vllm_compat" / "tested_overrides.py").read_text()
    assert current == text, ("vllm_compat/tested_overrides.py differs from matrix/vllm.toml's overrides; "
                             "regenerate it: python -m tests.test_dependency_drift --write")


# ------------------------------------------------------------------------------------- check and doctor


@pytest.mark.skipif(not SWEEP, reason=f"downloads the vLLM 0.34.0 wheel (~240 MB): runs in nox cell {SWEEP_CELL} only")
def test_check_names_the_conflict_and_writes_the_override_file(capsys, cache, tmp_path):
    from vllm_compat.cli import main

    target = tmp_path / "overrides.txt"
    try:
        code = main(["check", "--json", "vllm==0.34.0", "vllm-omni==0.24.0", "--overrides", str(target)])
    except WheelError as exc:
        pytest.skip(f"cannot fetch the wheels: {exc}")
    data = json.loads(capsys.readouterr().out)
    if code == 2:
        pytest.skip(f"cannot fetch the wheels: {data.get('error')}")
    (conflict,) = data["dependency_drift"]["conflicts"]
    assert conflict["package"] == "huggingface-hub"
    assert conflict["override"] == "huggingface-hub==2.4.0" and conflict["proven_by"] == list(HUB_CELLS)
    lines = [line for line in target.read_text().splitlines() if line and not line.startswith("#")]
    assert lines == ["huggingface-hub==2.4.0"]
    main(["check", "--verbose", "vllm==0.34.0", "vllm-omni==0.24.0"])
    screen = capsys.readouterr().out
    assert screen.count("  dependencies: ") == 1 and screen.index("dependencies: ") < screen.index("verdict: ")
    flat = " ".join(screen.split())  # --verbose wraps at 100 columns
    assert ("huggingface-hub: vllm 0.34.0 needs >=2.0.0; diffusers 0.38.0 (pinned by vllm-omni 0.24.0) needs "
            "<2.0,>=0.34.0") in flat
    assert ("-> override: huggingface-hub==2.4.0 (vllm's range wins; tested by matrix cell "
            f"{', '.join(HUB_CELLS)})") in flat


@pytest.mark.skipif(VLLM_VERSION is None or OMNI_VERSION is None, reason="needs vLLM and vllm-omni installed")
def test_doctor_names_the_installed_pairs_overrides():
    """In a cell: the conflicts of the installed pair are the measured ones, each installed at the cell's line."""
    from vllm_compat.dependency_drift import installed_dependency_drift

    drift = installed_dependency_drift()
    assert drift is not None
    found = {c.package: c for c in drift.conflicts}
    if VLLM_VERSION in VLLMS and OMNI_VERSION in OMNIS:
        assert set(found) == set(expected_conflicts(VLLM_VERSION, OMNI_VERSION)), "\n".join(drift.render_lines())
    cell = next((c for c in CELLS if c["id"] == os.environ.get("VLLM_COMPAT_CELL")), None)
    for line in (cell or {}).get("overrides", []):
        package, _, version = line.partition("==")
        assert found[package].installed == version
        assert found[package].override == line and cell["id"] in found[package].proven_by


if __name__ == "__main__":  # python -m tests.test_dependency_drift --write
    import sys

    if sys.argv[1:] == ["--write"]:
        (ROOT / "vllm_compat" / "tested_overrides.py").write_text(render_tested_overrides(CELLS))
