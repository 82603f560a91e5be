"""Mutation testing of the drift-point and decision modules with mutmut 3, in one matrix cell (``nox -s mutants``).

mutmut copies the package into ``mutants/``, rewrites each function of the mutated modules into a trampoline
over its mutants, runs the selected tests once to learn which tests reach which function, then forks one child
per mutant that runs only those tests (vLLM, vllm-omni and torch are imported once, in the parent). It works
in a scratch copy of the repository (``.nox/mutants-work``) with its own ``setup.cfg``, so the repository's
``pyproject.toml`` and tree stay as they are.

What a run can and cannot see: mutants run in the pytest process and in subprocesses the tests start with this
interpreter (``PYTHONPATH`` puts the mutated copy first, and mutmut's ``MUTANT_UNDER_TEST`` is inherited), but
mutmut picks a mutant's tests from the functions it saw called in the pytest process only. A function that only
a subprocess calls is "no tests": counted as not killed here.

Usage (inside the cell's env): ``python mutation/run.py [--modules GLOB ...] [--tests PATH ...] [--keep]``;
without ``--modules`` / ``--tests`` each module group of ``PLAN`` runs with its own tests, one after the other;
prints killed / total per module and writes ``.nox/mutants-work/summary.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".nox" / "mutants-work"
# The drift-point and decision modules (issue 23): what decides and installs, not the generic layers.
# The default is the scope measured in docs/mutation.md (~950 mutants, ~1 h on 2 busy cores); every drift point
# (``--modules "vllm_compat/patches/*.py" "vllm_compat/bridges/*.py"``) is several hours.
MODULES = ["vllm_compat/decide.py", "vllm_compat/drift.py", "vllm_compat/bridges/input_preprocessor.py",
           "vllm_compat/bridges/_name_stand_in.py", "vllm_compat/patches/hsdp_load_order.py"]
# Generated data and the routing table: no logic to mutate.
NOT_MUTATED = ["vllm_compat/bridges/_alias_table.py", "vllm_compat/catalogue.py", "vllm_compat/patches/catalogue.py"]
# Each module with the tests of its behaviour that run in the pytest process (mutmut learns a mutant's tests there).
# Run per module by default: drift.py's functions are called by nearly every test, so one selection for all five
# makes each drift.py mutant run every selected test (hours on 2 busy cores); per module the run is minutes each.
PLAN = [
    (["vllm_compat/bridges/_name_stand_in.py"],
     ["tests/bridges/test_name_stand_in_layer.py", "tests/bridges/test_stand_in_refusal.py",
      "tests/bridges/test_routed_experts_lists.py"]),
    (["vllm_compat/bridges/input_preprocessor.py"],
     ["tests/bridges/test_input_preprocessor.py", "tests/bridges/test_input_preprocessor_prompts.py",
      "tests/bridges/test_input_preprocessor_layer.py", "tests/bridges/test_stand_in_refusal.py"]),
    (["vllm_compat/drift.py", "vllm_compat/decide.py"],  # the primitive's own tests: every other test calls it too
     ["tests/test_drift.py", "tests/test_decide.py", "tests/bridges/test_stand_in_refusal.py"]),
    (["vllm_compat/patches/hsdp_load_order.py"],
     ["tests/patches/test_hsdp_load_order.py", "tests/patches/test_hsdp_process_once.py",
      "tests/patches/test_hsdp_load_order_layer.py"]),
]
# What ``--modules`` alone selects from: every test above, and the alias table's.
TESTS = sorted({t for _, tests in PLAN for t in tests} | {"tests/bridges/test_moved_names.py",
                                                          "tests/bridges/test_moved_names_targets.py"})
# Tests that only run the code in a fresh interpreter: mutmut never picks them for a mutant (it learns a mutant's
# tests from the calls it sees in the pytest process), so running them would only cost the stats and clean runs.
SUBPROCESS_ONLY = ("not unpatched and not imports_with_the_stand_in and not resolves_to_the_new and not old_module_path "
                   "and not patched_hsdp and not generator")
COPIED = ["vllm_compat", "tests", "matrix", "pyproject.toml", "README.md"]
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped", 36: "timeout",
          -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout", -11: "segfault", -9: "segfault",
          None: "not checked"}


def _prepare(modules: list[str], tests: list[str], keep: bool, from_tree: bool, rev: str = "HEAD") -> None:
    if WORK.exists() and not keep:
        shutil.rmtree(WORK)
    WORK.mkdir(parents=True, exist_ok=True)
    if from_tree:  # the working tree, uncommitted edits included
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
        for name in COPIED:
            source, target = ROOT / name, WORK / name
            if source.is_dir():
                shutil.copytree(source, target, ignore=ignore, dirs_exist_ok=True)
            elif source.exists():
                shutil.copy2(source, target)
    else:  # the last commit: others' half-done edits in a shared tree stay out
        archive = subprocess.run(["git", "archive", rev, *COPIED], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(WORK)], input=archive.stdout, check=True)
    cfg = ["[mutmut]", "source_paths = vllm_compat/", "only_mutate ="]
    cfg += [f"    {m}" for m in modules]
    cfg += ["do_not_mutate ="] + [f"    {m}" for m in NOT_MUTATED]
    cfg += ["also_copy ="] + [f"    {c}" for c in COPIED if c != "vllm_compat"]
    cfg += ["pytest_add_cli_args_test_selection ="] + [f"    {t}" for t in tests]
    # No xdist (mutmut forks per mutant), no cache between forks; tests that need a GPU skip on their own.
    cfg += ["pytest_add_cli_args =", "    -p", "    no:cacheprovider", "    -p", "    no:xdist",
            "    --ignore=tests/gpu", "    -k", f"    {SUBPROCESS_ONLY}", "timeout_multiplier = 4.0", "timeout_constant = 30.0",
            f"debug = {str(bool(os.environ.get('MUTANTS_DEBUG'))).lower()}", ""]
    (WORK / "setup.cfg").write_text("\n".join(cfg))
    # PYTHONPATH names it before mutmut fills it: an absent folder would be cached as not importable.
    (WORK / "mutants").mkdir(exist_ok=True)


def summarize() -> dict:
    """{module: {status: count}} from mutmut's meta files (one per mutated module); "message only" counts the
    not-killed mutants of the module that change nothing but a string constant."""
    out, texts = {}, message_only()
    for meta in sorted((WORK / "mutants").rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        module = str(meta.relative_to(WORK / "mutants"))[: -len(".meta")]
        out[module] = dict(Counter(STATUS.get(code, "suspicious") for code in codes.values()))
        out[module]["message only (not killed)"] = sum(
            1 for key, code in codes.items() if key in texts and STATUS.get(code, "suspicious") != "killed")
    return out


def _strip_strings(node):
    """The function's AST dumped with every string constant emptied and its name dropped."""
    import ast
    import copy

    node = copy.deepcopy(node)
    node.name = "_"
    for each in ast.walk(node):
        if isinstance(each, ast.Constant) and isinstance(each.value, str):
            each.value = ""
    return ast.dump(node)


def message_only() -> set[str]:
    """The mutants whose only change is a string constant (an error message, a log or report text)."""
    import ast

    found = set()
    for meta in sorted((WORK / "mutants").rglob("*.py.meta")):
        source = meta.with_suffix("")  # mutants/<path>.py, holding every mutant function beside the original
        functions = {n.name: n for n in ast.walk(ast.parse(source.read_text()))
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        for key in json.loads(meta.read_text())["exit_code_by_key"]:
            name = key.rsplit(".", 1)[1]
            original = functions.get(name.rsplit("__mutmut_", 1)[0] + "__mutmut_orig")
            if original is not None and name in functions and \
                    _strip_strings(functions[name]) == _strip_strings(original):
                found.add(key)
    return found


def survivors() -> list[str]:
    names = []
    for meta in sorted((WORK / "mutants").rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        names += [k for k, code in codes.items() if STATUS.get(code, "suspicious") != "killed"]
    return names


def render(summary: dict) -> str:
    lines = ["| module | killed / total | survived | no tests | timeout | other | not killed, text only |",
             "|---|---|---|---|---|---|---|"]
    totals = Counter()
    for module, counts in summary.items():
        if module == "message_only":
            continue
        texts = counts.get("message only (not killed)", 0)
        counts = {k: v for k, v in counts.items() if k != "message only (not killed)"}
        total = sum(counts.values())
        killed = counts.get("killed", 0) + counts.get("timeout", 0)
        other = total - killed - counts.get("survived", 0) - counts.get("no tests", 0)
        totals.update(counts)
        totals["texts"] += texts
        lines.append(f"| {module} | {killed} / {total} ({100 * killed / max(total, 1):.0f} %) | "
                     f"{counts.get('survived', 0)} | {counts.get('no tests', 0)} | {counts.get('timeout', 0)} | {other} | {texts} |")
    texts = totals.pop("texts", 0)
    total = sum(totals.values())
    killed = totals.get("killed", 0) + totals.get("timeout", 0)
    lines.append(f"| all | {killed} / {total} ({100 * killed / max(total, 1):.0f} %) | {totals.get('survived', 0)} | "
                 f"{totals.get('no tests', 0)} | {totals.get('timeout', 0)} | | {texts} |")
    return "\n".join(lines)


LAUNCHER = ("import os, sys\n"
            "if os.environ.pop('VLLM_COMPAT_MUTANTS_LAUNCH', None): os.environ.pop('VLLM_COMPAT_DISABLE', None)\n"
            "assert 'vllm_compat' not in sys.modules\n"
            "sys.argv = ['mutmut', 'run', '--max-children', sys.argv[1]]\n"
            "import mutmut.__main__ as mutmut_main\n"
            # mutmut's setup check makes every mutated function raise and expects a failing test; here the first
            # such raise is in tests/conftest.py (it plans the catalogue at import), which pytest reports as a usage
            # error (exit 4) that the check does not accept. The stats run already showed the mutated copy is the
            # one imported (its trampolines recorded the calls).
            "mutmut_main.run_forced_fail_test = lambda runner: None\n"
            "from mutmut.__main__ import cli\n"
            "cli()\n")


def run_group(modules: list[str], tests: list[str], work: Path, args) -> tuple[int, dict, list[str], float]:
    """mutmut over ``modules`` with ``tests`` in scratch folder ``work``: (exit code, summary, not killed, seconds)."""
    global WORK
    WORK = work
    _prepare(modules, tests, args.keep, args.tree, args.rev)
    env = {**os.environ, "PYTHONPATH": str(WORK / "mutants"), "VLLM_COMPAT_TEST_WORKERS": "0",
           # The startup hook (vllm_compat_startup.pth) would import the editable, unmutated vllm_compat before
           # mutmut puts the mutated copy first; the launcher takes the switch off again before any test.
           "VLLM_COMPAT_DISABLE": "1", "VLLM_COMPAT_MUTANTS_LAUNCH": "1"}
    started = time.monotonic()
    code = subprocess.run([sys.executable, "-c", LAUNCHER, str(args.max_children)], cwd=WORK, env=env).returncode
    elapsed = time.monotonic() - started
    summary, not_killed = summarize(), survivors()
    (WORK / "summary.json").write_text(json.dumps({"seconds": elapsed, "modules": summary, "tests": tests,
                                                   "not_killed": not_killed}, indent=1))
    print(f"{', '.join(modules)}: mutmut exit {code}, {elapsed:.0f} s; not killed: {WORK / 'summary.json'} "
          f"(mutmut show NAME in {WORK} for a diff)", flush=True)
    return code, summary, not_killed, elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--modules", nargs="+", help="globs of the modules to mutate (default: each module of PLAN "
                        "with its own tests, one run each)")
    parser.add_argument("--tests", nargs="+", help="test files / folders mutmut selects from (default: PLAN's for "
                        "the default modules, else TESTS)")
    parser.add_argument("--keep", action="store_true", help="reuse the scratch folder (mutmut's cached verdicts)")
    parser.add_argument("--tree", action="store_true", help="mutate the working tree (default: the last commit)")
    parser.add_argument("--rev", default="HEAD", help="the commit to mutate (default: HEAD)")
    parser.add_argument("--work", type=Path, default=WORK, help="scratch folder (default: .nox/mutants-work; one "
                        "subfolder per module group for the default plan)")
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 2)
    args = parser.parse_args(argv)
    work = args.work.resolve()
    if args.modules is None and args.tests is None:
        groups = [(modules, tests, work / Path(modules[0]).stem) for modules, tests in PLAN]
    else:
        groups = [(args.modules or MODULES, args.tests or TESTS, work)]
    codes, summary, not_killed, seconds = [], {}, [], {}
    for modules, tests, folder in groups:
        code, found, missed, elapsed = run_group(modules, tests, folder, args)
        codes.append(code)
        summary.update(found)
        not_killed += missed
        seconds[", ".join(modules)] = round(elapsed)
    work.mkdir(parents=True, exist_ok=True)
    (work / "summary.json").write_text(json.dumps({"seconds": seconds, "modules": summary, "not_killed": not_killed},
                                                  indent=1))
    print(render(summary))
    print(f"{sum(seconds.values())} s in all ({seconds}); not killed: {work / 'summary.json'}")
    return max(codes, key=abs)


if __name__ == "__main__":
    sys.exit(main())
