"""Recompute matrix/vllm.toml's expectations from the real release wheels (``nox -s refresh``).

For every cell: ``pip download --no-deps`` the vLLM and vllm-omni wheels, scan them statically (capability
level, loader kind, the decision, import drift of vllm-omni against that vLLM), and compare with the cell's
``expect`` and ``unresolved``. Nothing is installed or imported. vLLM wheels are ~300 MB: one is on disk at a
time (deleted after its cells are scanned); measured results are cached in ``--cache`` (JSON) per wheel pair.

    python matrix/refresh.py [--write] [--cache PATH] [--download-dir DIR] [--no-aliases] [CELL_ID ...]

Without cell ids it also re-checks the generated alias table (``matrix/aliases.py --check``: regenerated from the
wheels, a diff printed when the checked-in ``vllm_compat/bridges/_alias_table.py`` is stale; ``--write`` rewrites
it). Exit status: 0 when every scanned cell matches and the table is current (or ``--write`` rewrote them), 1 when a
cell or the table differs, 2 when a download failed.
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
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
MATRIX = ROOT / "matrix" / "vllm.toml"
# A measurement is reused while the wheels and the code that measured it are the same.
ANALYSIS_DIGEST = hashlib.sha256(b"".join(
    path.read_bytes() for path in sorted((ROOT / "vllm_compat" / "detect").glob("*.py")) + [Path(__file__)]
)).hexdigest()[:12]


def download(distribution: str, version: str, into: Path) -> Path:
    into.mkdir(parents=True, exist_ok=True)
    found = list(into.glob(f"{distribution.replace('-', '_')}-{version}-*.whl"))
    if found:
        return found[0]
    pip = [sys.executable, "-m", "pip"]
    if subprocess.run([*pip, "--version"], capture_output=True).returncode != 0:
        pip = [shutil.which("pip") or "pip"]  # a uv-made venv has no pip of its own
    subprocess.run([*pip, "download", "-q", "--no-deps", "--only-binary", ":all:",
                    f"{distribution}=={version}", "-d", str(into)], check=True)
    return next(into.glob(f"{distribution.replace('-', '_')}-{version}-*.whl"))


def measure(vllm_wheel: Path, omni_wheel: Path | None, vllm: str, omni: str | None) -> dict:
    from vllm_compat.config import read_controls
    from vllm_compat.detect.import_drift import check_import_drift
    from vllm_compat.detect.static import SourceTree, StaticSite
    from vllm_compat.patches import plan

    vllm_tree = SourceTree(vllm_wheel)
    omni_tree = SourceTree(omni_wheel) if omni_wheel else SourceTree(Path("/nonexistent-vllm-compat-root"))
    site = StaticSite(vllm_tree, omni_tree, {"vllm": vllm, "vllm-omni": omni, "torch": None})
    env = site.environment
    # expect.action / variant are the first catalogue entry's (the loader), as test_matrix_consistency reads them
    _, _, decision = plan(site, read_controls())[0]
    expect = {"level": env.vllm.level, "loader": env.loader.kind, "action": decision.action}
    if decision.variant:
        expect["variant"] = decision.variant
    result = {"expect": expect}
    if omni_wheel:
        drift = check_import_drift(omni_tree, vllm_tree)
        result["unresolved"] = drift.blocking_names
        result["worker_unresolved"] = [n for n in drift.worker_blocking_names if n not in drift.blocking_names]
        result["all_unresolved"] = len(drift.unresolved)
    return result


def _toml_expect(expect: dict) -> str:
    return "{ " + ", ".join(f'{k} = "{v}"' for k, v in expect.items()) + " }"


def rewrite(text: str, cell_id: str, measured: dict) -> str:
    """Replace the cell's ``expect`` (and ``unresolved``, ``worker_unresolved``) lines in place; everything else is
    kept."""
    block = re.search(rf'\[\[cell\]\]\nid = "{re.escape(cell_id)}"\n(?:(?!\[\[cell\]\]).*\n?)*', text)
    if block is None:
        return text
    body = block.group()
    body = re.sub(r"^expect = .*$", f"expect = {_toml_expect(measured['expect'])}", body, flags=re.M)
    anchor = f"expect = {_toml_expect(measured['expect'])}\n"
    for key in ("unresolved", "worker_unresolved"):  # the second goes after the first
        if key not in measured:
            continue
        line = f"{key} = {json.dumps(measured[key])}"
        if re.search(rf"^{key} = .*$", body, flags=re.M):
            body = re.sub(rf"^{key} = .*$", line, body, flags=re.M)
        else:
            body = body.replace(anchor, f"{anchor}{line}\n")
        anchor = f"{line}\n"
    return text[: block.start()] + body + text[block.end():]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="*", help="cell ids (default: all)")
    parser.add_argument("--write", action="store_true", help="rewrite matrix/vllm.toml with what was measured")
    parser.add_argument("--cache", type=Path, default=ROOT / ".nox" / "refresh-cache.json")
    parser.add_argument("--download-dir", type=Path, default=None)
    parser.add_argument("--no-aliases", action="store_true", help="skip re-checking vllm_compat/bridges/_alias_table.py")
    args = parser.parse_args(argv)

    cells = tomllib.loads(MATRIX.read_text())["cell"]
    if args.cells:
        cells = [c for c in cells if c["id"] in args.cells]
    cache = json.loads(args.cache.read_text()) if args.cache.exists() else {}
    workdir = args.download_dir or Path(tempfile.mkdtemp(prefix="vllm-compat-refresh-"))
    omni_dir = workdir / "vllm-omni"
    status, rows = 0, []
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
                        for key in ("unresolved", "worker_unresolved"))
                    rows.append((cell["id"], measured, same))
                    if not same and args.write:
                        MATRIX.write_text(rewrite(MATRIX.read_text(), cell["id"], measured))
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
    return status


if __name__ == "__main__":
    sys.exit(main())
