"""Keep matrix/vllm.toml in step with the index (``nox -s refresh``): a new vLLM release, then every cell re-measured.

1. Intake: the vLLM releases on the index (``pip index versions vllm``) newer than the newest in the matrix, the
   latest patch of each new minor, get one ``[[cell]]`` block per vllm-omni column (every ``vllm_omni`` of the
   matrix), appended to the file with expectations measured from the wheels (below), the override lines
   ``vllm-compat check`` names for the pair's resolver conflicts, and the new drift printed per column: the vLLM
   names the column imports that no longer resolve on the new release and did on the previous newest, each one
   "moved" (a same-named definition is elsewhere in the new tree: ``matrix/aliases.py`` matches it by source),
   "removed" (it is nowhere), and whether a drift point already bridges it; and the names that resolve again.
   A newer patch of a minor already in the matrix, or a newer vllm-omni than the newest column, is only named
   (a patch bump is one edited ``vllm =`` line per cell; a new column needs its native cell and record).
2. Re-measure: for every cell, ``pip download --no-deps`` the vLLM and vllm-omni wheels, scan them statically
   (capability level, loader kind, the decision, import drift of vllm-omni against that vLLM), and compare with
   the cell's ``expect``, ``unresolved`` and ``worker_unresolved``. Nothing is installed or imported. vLLM wheels
   are ~300 MB: one is on disk at a time (deleted after its cells are scanned); measured results are cached in
   ``--cache`` (JSON) per wheel pair.

    python matrix/refresh.py [--write] [--no-intake] [--matrix PATH] [--cache PATH] [--download-dir DIR]
                             [--no-aliases] [CELL_ID ...]

Without cell ids it also re-checks the generated alias table (``matrix/aliases.py --check``: regenerated from the
wheels, a diff printed when the checked-in ``vllm_compat/bridges/_alias_table.py`` is stale; ``--write`` rewrites
it), the generated tested range (``matrix/tested_pairs.py``: ``vllm_compat/detect/tested.py``, likewise) and the
behavioural-drift baselines (``matrix/behaviour_baselines.py``: ``vllm_compat/detect/behaviour_baselines.py``,
likewise). A new release's cells print, beside the import drift, each behavioural drift ``check`` finds, handled by a
drift point or NOT HANDLED, with what it does to each entrypoint. Exit
status: 0 when every scanned cell matches and the table is current (or ``--write`` rewrote them), 1 when a cell or
a generated file differs, 2 when a download failed. New cells are written whether or not ``--write`` is given
(that is the intake; ``git diff matrix/vllm.toml`` is the review); ``--no-intake`` skips the index look-up.
Steps and timings of an intake: docs/new-vllm-release.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / "matrix" / "vllm.toml"
# A measurement is reused while the wheels and the code that measured it are the same: the whole package (every
# drift point's facts and decision are measured, the loader package's among them) and this script.
ANALYSIS_DIGEST = hashlib.sha256(b"".join(
    path.read_bytes() for path in sorted((ROOT / "vllm_compat").rglob("*.py")) + [Path(__file__)]
    if "__pycache__" not in path.parts
)).hexdigest()[:12]


def _pip() -> list[str]:
    pip = [sys.executable, "-m", "pip"]
    if subprocess.run([*pip, "--version"], capture_output=True).returncode != 0:
        pip = [shutil.which("pip") or "pip"]  # a uv-made venv has no pip of its own
    return pip


def download(distribution: str, version: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    found = list(into.glob(f"{distribution.replace('-', '_')}-{version}-*.whl"))
    if found:
        return found[0]
    pip = _pip()
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary", ":all:",
                    f"{distribution}=={version}", "-d", str(into)], check=True)
    return next(into.glob(f"{distribution.replace('-', '_')}-{version}-*.whl"))


def measure(vllm_wheel: Path, omni_wheel: Path | None, vllm: str, omni: str | None) -> dict:
    from vllm_compat.config import read_controls
    from vllm_compat.decide import plan
    from vllm_compat.detect.import_drift import check_import_drift
    from vllm_compat.detect.static import SourceTree, StaticSite

    vllm_tree = SourceTree(vllm_wheel)
    omni_tree = SourceTree(omni_wheel) if omni_wheel else SourceTree(Path("/nonexistent-vllm-compat-root"))
    site = StaticSite(vllm_tree, omni_tree, {"vllm": vllm, "vllm-omni": omni, "torch": None})
    # expect describes the loader entry: its facts (vLLM level, loader shape) and its decision, as
    # test_matrix_consistency reads them
    _, env, decision = next(p for p in plan(site, read_controls()) if p[0].id == "diffusers_loader_meta_device")
    expect = {"level": env.vllm.level, "loader": env.loader.kind, "action": decision.action}
    if decision.variant:
        expect["variant"] = decision.variant
    result = {"expect": expect}
    if omni_wheel:
        drift = check_import_drift(omni_tree, vllm_tree)
        result["unresolved"] = drift.blocking_names
        result["worker_unresolved"] = [n for n in drift.worker_blocking_names if n not in drift.blocking_names]
        result["all_unresolved"] = len(drift.unresolved)
        # Each entrypoint (vllm_compat/entrypoints.py) as a user who installs vllm_compat gets it: the decided
        # bridges in place before vllm-omni is imported (the startup hook), as `vllm-compat check` says.
        from vllm_compat.bridges import drift_handler, provided_by_decisions

        decisions = [d for _, _, d in plan(site, read_controls())]
        bridged = drift.with_bridges(provided_by_decisions(decisions), early=True).with_behaviour(
            site.behaviour_drift, drift_handler(decisions))  # and the behavioural drift the drift points handle
        result["entrypoints"] = {status.id: status.status for status in bridged.all_statuses}  # the LLM / AR stages too
        # The method patches besides the loader entry that act on this pair (each makes the verdict "with
        # vllm_compat"); the key is left out where none does.
        patched = sorted(entry.id for entry, _, d in plan(site, read_controls())
                         if d.action == "patched" and entry.kind == "patch" and entry.id != "diffusers_loader_meta_device")
        if patched:
            result["patched"] = patched
    return result


MEASURED_KEYS = ("unresolved", "worker_unresolved", "entrypoints", "patched")  # the lines rewrite() keeps measured


def _toml_expect(expect: dict) -> str:
    return "{ " + ", ".join(f'{k} = "{v}"' for k, v in expect.items()) + " }"


def rewrite(text: str, cell_id: str, measured: dict) -> str:
    """Replace the cell's ``expect`` (and ``MEASURED_KEYS``) lines in place; everything else is kept."""
    block = re.search(rf'\[\[cell\]\]\nid = "{re.escape(cell_id)}"\n(?:(?!\[\[cell\]\]).*\n?)*', text)
    if block is None:
        return text
    body = block.group()
    current = re.search(r"^expect = .*$", body, flags=re.M)
    if current is None or tomllib.loads(current.group()).get("expect") != measured["expect"]:  # same: kept as written
        body = re.sub(r"^expect = .*$", f"expect = {_toml_expect(measured['expect'])}", body, flags=re.M)
    anchor = re.search(r"^expect = .*$", body, flags=re.M).group() + "\n"
    if "patched" not in measured:  # none acts (any more): no line
        body = re.sub(r"^patched = .*\n", "", body, flags=re.M)
    for key in MEASURED_KEYS:  # each goes after the one before
        if key not in measured:
            continue
        line = f"{key} = {json.dumps(measured[key])}" if key != "entrypoints" else f"{key} = {_toml_expect(measured[key])}"
        if re.search(rf"^{key} = .*$", body, flags=re.M):
            body = re.sub(rf"^{key} = .*$", line, body, flags=re.M)
        else:
            body = body.replace(anchor, f"{anchor}{line}\n")
        anchor = f"{line}\n"
    return text[: block.start()] + body + text[block.end():]


# ------------------------------------------------------------------------------------------------ intake
# A new vLLM release: which releases, the cells to add, the drift they bring. The pure parts (version lists,
# block text, the drift between two checks, moved or removed) take their inputs as arguments and are tested in
# tests/matrix/test_refresh.py; the rest fetches wheels and runs `vllm-compat check`.


def parse_index_versions(text: str) -> list[str]:
    """The versions in ``pip index versions NAME``'s output (its ``Available versions: a, b, ...`` line), as
    listed; [] when the line is missing."""
    found = re.search(r"^Available versions:\s*(.+)$", text, flags=re.M)
    return [v.strip() for v in found.group(1).split(",") if v.strip()] if found else []


def index_versions(distribution: str) -> list[str]:
    """Every version of ``distribution`` on the index pip is configured for (PyPI, or this machine's mirror)."""
    result = subprocess.run([*_pip(), "index", "versions", distribution], capture_output=True, text=True,
                            check=True)
    return parse_index_versions(result.stdout)


def _final(versions) -> list:
    """The valid final releases (post releases count) among ``versions``, as ``Version``s."""
    from packaging.version import InvalidVersion, Version

    out = []
    for text in versions:
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if not (version.is_prerelease or version.is_devrelease):
            out.append(version)
    return out


def _minor(version) -> tuple[int, int]:
    from packaging.version import Version

    release = Version(str(version)).release
    return (release[0], release[1] if len(release) > 1 else 0)


def newer_releases(available, known) -> list[str]:
    """The releases to add: for each minor newer than the newest minor in ``known``, the latest final release of
    it in ``available`` (the matrix keeps one row per minor, its latest patch); oldest first. Pre-releases and
    dev builds are never added."""
    newest = max(_minor(v) for v in known)
    latest: dict = {}
    for version in _final(available):
        if _minor(version) > newest and version > latest.get(_minor(version), version.__class__("0")):
            latest[_minor(version)] = version
    return [str(v) for v in sorted(latest.values())]


def newer_patches(available, known) -> list[tuple[str, str]]:
    """``(in the matrix, on the index)`` for each minor of ``known`` whose latest final release on the index is
    newer than the matrix's (a patch bump: named, not written)."""
    from packaging.version import Version

    ours: dict = {}
    for version in _final(known):
        ours[_minor(version)] = max(ours.get(_minor(version), version), version)
    theirs: dict = {}
    for version in _final(available):
        if _minor(version) in ours:
            theirs[_minor(version)] = max(theirs.get(_minor(version), version), version)
    return [(str(ours[m]), str(theirs[m])) for m in sorted(ours) if m in theirs and theirs[m] > ours[m]
            and ours[m] != Version("0")]


def omni_columns(cells: list[dict]) -> list[str]:
    """The vllm-omni releases the matrix has columns for, oldest first."""
    from packaging.version import Version

    return sorted({c["vllm_omni"] for c in cells if c.get("vllm_omni")}, key=Version)


def cell_id(vllm: str, omni: str | None) -> str:
    """``v0.34-omni0.30``: the matrix's short id (minors only)."""
    major, minor = _minor(vllm)
    if not omni:
        return f"v{major}.{minor}"
    omni_major, omni_minor = _minor(omni)
    return f"v{major}.{minor}-omni{omni_major}.{omni_minor}"


def render_cell(vllm: str, omni: str | None, measured: dict, *, why: str, overrides=(),
                bridged: dict | None = None) -> str:
    """One ``[[cell]]`` block of matrix/vllm.toml, in the file's layout: ``overrides`` as ``(line, reason)``
    pairs (a reason becomes the line's comment), ``measured`` as :func:`measure` returns it, ``bridged`` the
    drift point id of each bridged name (the block's ``bridged`` lists those among ``unresolved``, as
    tests/test_matrix_consistency.py reads it; the comment names every bridge, worker names too)."""
    lines = ["[[cell]]", f'id = "{cell_id(vllm, omni)}"', f'vllm = "{vllm}"']
    if omni:
        lines.append(f'vllm_omni = "{omni}"')
    lines.append(f"why = {json.dumps(why)}")
    if overrides:
        lines.append("overrides = [")
        lines += [f"  {json.dumps(line)},  # {reason}" if reason else f"  {json.dumps(line)},"
                  for line, reason in overrides]
        lines.append("]")
    lines.append(f"expect = {_toml_expect(measured['expect'])}")
    for key in ("unresolved", "worker_unresolved"):
        if key in measured:
            lines.append(f"{key} = {json.dumps(measured[key])}")
    if "entrypoints" in measured:
        lines.append(f"entrypoints = {_toml_expect(measured['entrypoints'])}")
    bridged = bridged or {}
    if "unresolved" in measured and bridged:
        names = sorted(n for n in measured["unresolved"] if n in bridged)
        by = "; ".join(f"{n.rsplit('.', 1)[-1]} by {bridged[n]}" for n in sorted(bridged))
        lines.append(f"bridged = {json.dumps(names)}  # {by}")
    return "\n".join(lines) + "\n"


def append_cells(text: str, vllm: str, blocks: list[str]) -> str:
    """``text`` (matrix/vllm.toml) with a section for ``vllm``'s new cells at the end."""
    header = f"# ---- vLLM {vllm} x every vllm-omni column: added by `nox -s refresh` (docs/new-vllm-release.md) ----"
    return text.rstrip("\n") + "\n\n" + header + "\n\n" + "\n".join(blocks)


_DEFINITION = re.compile(r"^(?:async\s+def|def|class)\s+([A-Za-z_]\w*)|^([A-Za-z_]\w*)\s*(?::[^=\n]*)?=", re.M)


def definition_index(sources) -> tuple[dict, dict]:
    """From ``(path inside the tree, source text)`` pairs: module-level names -> the modules defining them, and
    module basenames -> the modules of that name (``vllm/v1/worker/block_table.py`` -> ``block_table``)."""
    names: dict[str, set[str]] = {}
    modules: dict[str, set[str]] = {}
    for path, text in sources:
        module = path[: -len(".py")].replace("/", ".")
        if module.endswith(".__init__"):
            module = module[: -len(".__init__")]
        modules.setdefault(module.rsplit(".", 1)[-1], set()).add(module)
        for found in _DEFINITION.finditer(text):
            names.setdefault(found.group(1) or found.group(2), set()).add(module)
    return names, modules


def wheel_sources(wheel: Path, package: str = "vllm"):
    """``(path, text)`` of every ``.py`` file of ``package`` in a wheel."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        for path in archive.namelist():
            if path.startswith(f"{package}/") and path.endswith(".py"):
                yield path, archive.read(path).decode("utf-8", "replace")


def moved_or_removed(target: str, reason: str, index: tuple[dict, dict]) -> str:
    """``moved? (same name in a, b)`` when the new tree has a module of that name elsewhere or, for a name that is
    not a missing module, a module defining it (closest package first); ``removed`` when it has neither. A name
    match only: matrix/aliases.py decides a move by the definition's source."""
    names, modules = index
    parent, _, last = target.rpartition(".")
    # ``from vllm.v1.worker import block_table`` may name a module or an object: a module of that name, or a
    # module defining it, both count (a module not found can only have moved as a module)
    where = {m for m in modules.get(last, ()) if m != target}
    if "module" not in reason:
        where |= {m for m in names.get(last, ()) if m != parent}

    def shared(module: str) -> int:  # leading package names in common with the old home: the likelier move first
        pairs = zip(module.split("."), parent.split("."), strict=False)
        return next((i for i, (a, b) in enumerate(pairs) if a != b), min(module.count("."), parent.count(".")) + 1)

    where = sorted(where, key=lambda m: (-shared(m), m))
    if not where:
        return "removed"
    return f"moved? (same name in {', '.join(where[:3])}{', ...' if len(where) > 3 else ''})"


def new_drift(before: dict | None, after: dict) -> dict:
    """What a new vLLM changed for one vllm-omni, from two ``vllm-compat check --json`` ``import_drift`` dicts
    (the previous newest vLLM's, the new one's): ``added`` names (no longer resolving), each with the
    entrypoints that reach it, the bridge that provides it (or None) and its reason; ``gone`` names (resolving
    again)."""
    old = set(before["names"]) if before else set()
    reasons = {u["target"]: u["reason"] for u in after.get("unresolved", [])}
    entrypoints = after.get("entrypoints") or {}
    added = []
    for name in sorted(set(after["names"]) - old):
        reach = [key for key, e in entrypoints.items() if name in e.get("missing", []) or name in e.get("bridged", [])]
        added.append({"name": name, "bridged_by": (after.get("bridged") or {}).get(name), "entrypoints": reach,
                      "reason": reasons.get(name, "")})
    return {"added": added, "gone": sorted(old - set(after["names"]))}


def check_json(vllm_wheel: Path, omni_wheel: Path) -> dict:
    """``vllm-compat check VLLM_WHEEL OMNI_WHEEL --json`` (static: the two files), as data."""
    result = subprocess.run([sys.executable, "-m", "vllm_compat", "check", str(vllm_wheel), str(omni_wheel),
                             "--json"], capture_output=True, text=True, cwd=ROOT)
    if result.returncode not in (0, 1):
        raise RuntimeError(f"vllm-compat check {vllm_wheel.name} {omni_wheel.name} failed "
                           f"(exit {result.returncode}): {result.stderr[-2000:]}")
    return json.loads(result.stdout)


def check_overrides(check: dict) -> list[tuple[str, str]]:
    """The override lines ``check`` names for the pair's resolver conflicts, with their reasons (the
    dependency-drift part of ``check --json``; [] when this check has none)."""
    drift = check.get("dependency_drift") or {}
    return [(c["override"], f"{c.get('text', '')}: {c.get('resolution', '')}".strip(": "))
            for c in drift.get("conflicts", []) if c.get("override")]


def _entrypoint_summary(check: dict) -> str:
    entrypoints = (check.get("import_drift") or {}).get("entrypoints") or {}
    return ", ".join(f"{key} {e['status']}" for key, e in entrypoints.items()) or "-"


def behaviour_lines(check: dict) -> list[str]:
    """The behavioural drift ``check`` found (vllm_compat/detect/behaviour_drift.py), one line a finding: whether
    a drift point handles it, what it does to each entrypoint, the vLLM object, the vllm-omni site, what no longer
    binds. What stops or fails a start with nothing handling it is the next drift point to write."""
    found = ((check.get("import_drift") or {}).get("behaviour_drift") or {}).get("findings") or []
    effects = {}  # (finding site, vLLM object) -> {entrypoint: effect}
    for key, status in ((check.get("import_drift") or {}).get("entrypoints") or {}).items():
        for field in ("behaviour_drift", "fails_when_used"):
            for f in status.get(field, []):
                effects.setdefault((f["site"], f["vllm_object"]), {})[key] = f["effect"]
    lines = []
    for f in found:
        where = effects.get((f["site"], f["vllm_object"]), {})
        how = ", ".join(f"{key} {effect}" for key, effect in where.items()) or "handled"
        handled = f"handled by {f['handled_by']}" if f["handled_by"] else "NOT HANDLED"
        lines.append(f"behaviour: {f['kind']} {f['vllm_object']}: {f['detail']} (in {f['site']}); {handled}; {how}")
    return lines


def print_drift(vllm: str, previous: str, omni: str, drift: dict, check: dict, index) -> None:
    verdict = check.get("verdict", {}).get("kind", "?")
    print(f"\nvllm-omni {omni} on vLLM {vllm} (against {previous}): {verdict}; {_entrypoint_summary(check)}")
    if not drift["added"]:
        print(f"  nothing new: every name it imports resolves as on {previous}")
    for row in drift["added"]:
        kind = moved_or_removed(row["name"], row["reason"], index)
        bridge = f"bridged by {row['bridged_by']}" if row["bridged_by"] else "NOT BRIDGED"
        reach = ", ".join(row["entrypoints"]) or "none"
        print(f"  new: {row['name']}  {kind}; {bridge}; entrypoints reaching it: {reach}")
    for name in drift["gone"]:
        print(f"  resolves again: {name}")
    for line in behaviour_lines(check):
        print(f"  {line}")
    for line, reason in check_overrides(check):
        print(f"  override: {line}  ({reason})")


def intake(matrix: Path, workdir: Path, cache: dict, cache_path: Path, available: list[str] | None = None,
           ) -> list[str]:
    """Add the cells of the vLLM releases newer than ``matrix``'s newest (``available``: the index's versions,
    looked up when None), print their drift per vllm-omni column; returns the new cell ids."""
    from packaging.version import Version

    cells = tomllib.loads(matrix.read_text())["cell"]
    known = [c["vllm"] for c in cells]
    available = index_versions("vllm") if available is None else available
    for ours, theirs in newer_patches(available, known):
        print(f"intake: vLLM {theirs} is a newer patch of {ours} (in the matrix): bump those cells' vllm = by hand")
    columns = omni_columns(cells)
    try:
        newer_omni = [str(v) for v in _final(index_versions("vllm-omni")) if v > Version(columns[-1])]
    except (subprocess.CalledProcessError, IndexError):
        newer_omni = []
    if newer_omni:
        print(f"intake: vllm-omni {', '.join(newer_omni)} is newer than the newest column ({columns[-1]}): a new "
              "column needs its native cell and record (docs/new-vllm-release.md)")
    releases = newer_releases(available, known)
    previous = str(max(_final(known)))
    if not releases:
        print(f"intake: no vLLM on the index newer than {previous} (the newest in {matrix.name})")
        return []
    added = []
    omni_dir = workdir / "vllm-omni"
    for vllm in releases:
        print(f"intake: vLLM {vllm} is new: {len(columns)} cells, one per vllm-omni column ({', '.join(columns)})")
        new_dir, old_dir = workdir / f"vllm-{vllm}", workdir / f"vllm-{previous}"
        try:
            vllm_wheel, previous_wheel = download("vllm", vllm, new_dir), download("vllm", previous, old_dir)
            index = definition_index(wheel_sources(vllm_wheel))
            blocks = []
            for omni in columns:
                omni_wheel = download("vllm-omni", omni, omni_dir)
                key = f"{vllm}+{omni}+{ANALYSIS_DIGEST}"
                if key not in cache:
                    cache[key] = measure(vllm_wheel, omni_wheel, vllm, omni)
                    cache_path.parent.mkdir(parents=True, exist_ok=True)
                    cache_path.write_text(json.dumps(cache, indent=1, sort_keys=True))
                after, before = check_json(vllm_wheel, omni_wheel), check_json(previous_wheel, omni_wheel)
                drift = new_drift(before.get("import_drift"), after["import_drift"])
                print_drift(vllm, previous, omni, drift, after, index)
                why = (f"vllm-omni {omni} on vLLM {vllm}, added by nox -s refresh: check says "
                       f"{after['verdict']['kind']} ({_entrypoint_summary(after)})")
                blocks.append(render_cell(vllm, omni, cache[key], why=why, overrides=check_overrides(after),
                                          bridged=after["import_drift"].get("bridged")))
                added.append(cell_id(vllm, omni))
            matrix.write_text(append_cells(matrix.read_text(), vllm, blocks))
        finally:
            shutil.rmtree(new_dir, ignore_errors=True)
            shutil.rmtree(old_dir, ignore_errors=True)
        previous = vllm
    print(f"\nintake: added {', '.join(added)} to {matrix} (review: git diff {matrix.relative_to(ROOT) if matrix.is_relative_to(ROOT) else matrix})")
    return added


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="*", help="cell ids (default: all)")
    parser.add_argument("--write", action="store_true", help="rewrite matrix/vllm.toml with what was measured")
    parser.add_argument("--cache", type=Path, default=ROOT / ".nox" / "refresh-cache.json")
    parser.add_argument("--download-dir", type=Path, default=None)
    parser.add_argument("--no-aliases", action="store_true", help="skip re-checking vllm_compat/bridges/_alias_table.py")
    parser.add_argument("--no-intake", action="store_true", help="do not look for newer vLLM releases on the index")
    parser.add_argument("--matrix", type=Path, default=MATRIX, help="the matrix file (default: matrix/vllm.toml)")
    args = parser.parse_args(argv)

    cache = json.loads(args.cache.read_text()) if args.cache.exists() else {}
    workdir = args.download_dir or Path(tempfile.mkdtemp(prefix="vllm-compat-refresh-"))
    omni_dir = workdir / "vllm-omni"
    status, rows = 0, []
    started = time.monotonic()
    if not args.cells and not args.no_intake:
        try:
            intake(args.matrix, workdir, cache, args.cache)
            print(f"intake: {time.monotonic() - started:.0f} s")
        except subprocess.CalledProcessError as exc:
            print(f"refresh: the intake could not reach the index or fetch a wheel: {exc}", file=sys.stderr)
            status = 2
    cells = tomllib.loads(args.matrix.read_text())["cell"]
    if args.cells:
        cells = [c for c in cells if c["id"] in args.cells]
    try:
        by_vllm: dict[str, list[dict]] = {}
        for cell in cells:
            by_vllm.setdefault(cell["vllm"], []).append(cell)
        for vllm, group in by_vllm.items():
            vllm_dir = workdir / f"vllm-{vllm}"
            try:
                for cell in group:
                    omni = cell.get("vllm_omni")
                    key = f"{vllm}+{omni or '-'}+{ANALYSIS_DIGEST}"
                    if key not in cache:
                        vllm_wheel = download("vllm", vllm, vllm_dir)
                        omni_wheel = download("vllm-omni", omni, omni_dir) if omni else None
                        cache[key] = measure(vllm_wheel, omni_wheel, vllm, omni)
                        args.cache.parent.mkdir(parents=True, exist_ok=True)
                        args.cache.write_text(json.dumps(cache, indent=1, sort_keys=True))
                    measured = cache[key]
                    same = measured["expect"] == cell.get("expect") and all(
                        key not in measured or measured[key] == cell.get(key)
                        for key in ("unresolved", "worker_unresolved", "entrypoints")) and (
                        measured.get("patched", []) == cell.get("patched", []) or not cell.get("vllm_omni"))
                    rows.append((cell["id"], measured, same))
                    if not same and args.write:
                        args.matrix.write_text(rewrite(args.matrix.read_text(), cell["id"], measured))
                    elif not same:
                        status = 1
            except subprocess.CalledProcessError as exc:
                print(f"refresh: download failed for vLLM {vllm}: {exc}", file=sys.stderr)
                status = 2
            finally:
                shutil.rmtree(vllm_dir, ignore_errors=True)  # ~300 MB each: never keep more than one
    finally:
        if args.download_dir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(f"{'cell':<18} {'level':<30} {'loader':<7} {'decision':<18} {'unresolved (blocking import)':<40} toml")
    for cell_id, measured, same in rows:
        e = measured["expect"]
        decision = e["action"] + (f"/{e['variant']}" if e.get("variant") else "")
        unresolved = ", ".join(n.rsplit(".", 1)[-1] for n in measured.get("unresolved", [])) or (
            "-" if "unresolved" not in measured else "none")
        mark = "same" if same else ("REWRITTEN" if args.write else "DIFFERS")
        print(f"{cell_id:<18} {e['level']:<30} {e['loader']:<7} {decision:<18} {unresolved:<40} {mark}")
    if not args.cells and not args.no_aliases:
        # The alias table is generated from the same releases: re-check it (rewrite it under --write).
        sys.path.insert(0, str(ROOT / "matrix"))
        import aliases

        print("\nalias table (matrix/aliases.py):")
        alias_status = aliases.main([] if args.write else ["--check"])
        status = status or alias_status
    if not args.cells and args.matrix.resolve() == MATRIX:
        # What the package calls tested (vllm_compat/detect/tested.py) is generated from the cells that have passed.
        sys.path.insert(0, str(ROOT / "matrix"))
        import tested_pairs

        print("\ntested range and pairs (matrix/tested_pairs.py):")
        tested_status = tested_pairs.main([] if args.write else ["--check"])
        status = status or tested_status
        # What the behavioural scan finds on each vllm-omni's own vLLM, subtracted from every other pair's findings.
        import behaviour_baselines

        print("\nbehavioural-drift baselines (matrix/behaviour_baselines.py):")
        baseline_status = behaviour_baselines.main([] if args.write else ["--check"])
        status = status or baseline_status
    print(f"\nrefresh: {time.monotonic() - started:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
