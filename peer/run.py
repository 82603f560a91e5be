"""Run a vllm-omni release's own tests (stored unchanged under peer/) in one env and judge them against the native pair.

    python peer/run.py --python ENV_PYTHON --release 0.24.0 --cell CELL_ID [--native] [--suite core,server]
                       [--write-native]

The tests run as vllm-omni's CI runs them: from a checkout's layout (the stored ``tests/`` and upstream
``pyproject.toml`` copied into a fresh folder, ``vllm_omni`` beside them as a link to the installed package, which
is what some tests read by path), with the env's vllm_compat active as users get it (the startup hook), or with
``VLLM_COMPAT_DISABLE=1`` for ``--native`` (the release's own vLLM: the reference).

The reference is ``peer/vllm-omni-RELEASE.native.toml``: how many passed on the native pair and each test that fails
there for this machine's reasons (no GPU, no network, a package vllm-omni's CI installs and this env does not), with
that reason, written by a person (``--write-native`` writes the measured failures with reason "TODO" to start from;
a native failure is never drift). ``judged_cells`` lists the bridged cells measured at 0 new failures: a new failure
fails only those (and the native pair); another cell prints its table and passes until it is measured and added. A ``[left_out."CELL"]`` table names tests a cell is allowed to fail, each with the
vLLM change that removed what they exercise and that vllm_compat reports as left out.

Prints the table (passed, failed, new failures with their exception) and exits 1 where a bridged cell has a new
failure, or the native pair's failures differ from the record.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import tomllib

HERE = Path(__file__).parent


def provenance(release: str) -> dict:
    return tomllib.loads((HERE / f"vllm-omni-{release}" / "PROVENANCE.toml").read_text())


def native_record(release: str) -> dict:
    path = HERE / f"vllm-omni-{release}.native.toml"
    return tomllib.loads(path.read_text()) if path.is_file() else {}


def _installed_package(python: str) -> Path:
    out = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('vllm_omni').submodule_search_locations[0])"],
                         check=True, capture_output=True, text=True, env={**os.environ, "VLLM_COMPAT_DISABLE": "1"})
    return Path(out.stdout.strip().splitlines()[-1])


def checkout_layout(python: str, release: str, workdir: Path) -> Path:
    """A folder laid out as vllm-omni's checkout at the release's commit: its tests, its pyproject.toml, and
    ``vllm_omni`` linked to the installed package (the same files: the release's wheel)."""
    tree = HERE / f"vllm-omni-{release}"
    run_dir = workdir / f"vllm-omni-{release}"
    shutil.copytree(tree / "tests", run_dir / "tests")
    shutil.copy2(tree / "pyproject.toml", run_dir / "pyproject.toml")
    (run_dir / "vllm_omni").symlink_to(_installed_package(python), target_is_directory=True)
    return run_dir


def outcomes(junit: Path) -> dict[str, tuple[str, str]]:
    """test id (path::name[param]) -> (outcome, first line of its failure message)."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "")
        if module:
            path, klass = _split_classname(module)
            test_id = f"{path}::{klass + '::' if klass else ''}{case.get('name')}"
        else:  # a file that failed to collect: junit names its module, dotted
            test_id = case.get("name", "").replace(".", "/") + ".py"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = (node.get("message") or node.text or "").strip().splitlines()[0:1]
                message = message[0][:160] if message else ""
                break
        result[test_id] = (outcome, message)
    return result


def _split_classname(classname: str) -> tuple[str, str]:
    """junit's ``tests.engine.test_x.TestY`` -> (``tests/engine/test_x.py``, ``TestY``)."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        if parts[cut - 1].startswith("test_") or parts[cut - 1].endswith("_test"):
            return "/".join(parts[:cut]) + ".py", "::".join(parts[cut:])
    return "/".join(parts) + ".py", ""


def run(python: str, release: str, suites: list[str], native: bool, workdir: Path, workers: str) -> dict:
    files = [path for suite in suites for path in provenance(release)[suite]]
    run_dir = checkout_layout(python, release, workdir)
    junit = workdir / "junit.xml"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "", "HF_HUB_OFFLINE": "1"}
    if native:
        env["VLLM_COMPAT_DISABLE"] = "1"
    command = [python, "-m", "pytest", *files, "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
               "--rootdir", str(run_dir), "--junitxml", str(junit),
               "-o", "junit_family=xunit1", *(["-n", workers] if workers != "0" else [])]
    subprocess.run(command, cwd=run_dir, env=env, stdout=sys.stderr)
    return outcomes(junit)


def judge(results: dict, record: dict, cell: str, native: bool) -> tuple[list[str], list[str]]:
    """(lines to print, problems). Problems: a bridged cell's failures beyond the native record's and the cell's
    left-out tests; on the native pair, a failure the record lacks. A recorded failure that passes here is said,
    not a problem: some fail on this machine's load only (a subprocess or an orchestrator timing out)."""
    env_failures = record.get("env_failures", {})
    left_out = record.get("left_out", {}).get(cell, {})
    failed = {t: m for t, (o, m) in results.items() if o == "failed"}
    passed = sum(1 for o, _ in results.values() if o == "passed")
    skipped = sum(1 for o, _ in results.values() if o == "skipped")
    lines = [f"{cell}: {passed} passed, {len(failed)} failed, {skipped} skipped "
             f"({'native pair, vllm_compat off' if native else 'with vllm_compat'}); the native pair passed "
             f"{record.get('passed', '?')} and fails {len(env_failures)} for this machine's reasons"]
    problems = []
    if native:
        problems += [f"fails natively, not in the record: {t}: {m}" for t, m in sorted(failed.items())
                     if t not in env_failures]
        lines += [f"  recorded as failing natively, passes here: {t}" for t in sorted(env_failures)
                  if results.get(t, ("absent",))[0] == "passed"]
    else:
        new = {t: m for t, m in failed.items() if t not in env_failures and t not in left_out}
        allowed = sorted(t for t in failed if t in left_out)
        if allowed:
            lines.append(f"  left out ({len(allowed)}, named in the record): "
                         + "; ".join(sorted({left_out[t] for t in allowed})))
        lines.append(f"  new failures with vllm_compat: {len(new)}")
        problems += [f"{t}: {m}" for t, m in sorted(new.items())]
    return lines, problems


def write_native(release: str, results: dict) -> Path:
    path = HERE / f"vllm-omni-{release}.native.toml"
    passed = sum(1 for o, _ in results.values() if o == "passed")
    rows = [f'"{t}" = "TODO: {m.replace(chr(34), chr(39))}"' for t, (o, m) in sorted(results.items()) if o == "failed"]
    path.write_text(f"passed = {passed}\n\n[env_failures]\n" + "\n".join(rows) + "\n")
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True)
    parser.add_argument("--release", required=True)
    parser.add_argument("--cell", required=True)
    parser.add_argument("--native", action="store_true")
    parser.add_argument("--suite", default="core,server")
    parser.add_argument("--workers", default=os.environ.get("VLLM_COMPAT_TEST_WORKERS", "auto"))
    parser.add_argument("--write-native", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vllm-compat-peer-") as tmp:
        results = run(args.python, args.release, args.suite.split(","), args.native, Path(tmp), args.workers)
    if args.write_native:
        print(write_native(args.release, results))
        return 0
    record = native_record(args.release)
    lines, problems = judge(results, record, args.cell, args.native)
    print("\n".join(lines + [f"    {p}" for p in problems]))
    if problems and not is_judged(record, args.cell, args.native):
        print(f"  {args.cell} is not among the record's judged_cells (measured at 0 new failures): reported, not "
              "failed; add it once its new failures are bridged or named left out")
        return 0
    return 1 if problems else 0


def is_judged(record: dict, cell: str, native: bool) -> bool:
    """Whether a problem fails the cell: on the native pair always, elsewhere in the record's ``judged_cells``."""
    return native or cell in record.get("judged_cells", ())


if __name__ == "__main__":
    sys.exit(main())
