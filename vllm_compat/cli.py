"""``vllm-compat doctor``, ``scan``, ``check`` and ``plan`` (also ``python -m vllm_compat``).

Exit codes: 0 handled or nothing to do; 1 a target refused, a runtime failure, or static and runtime
detection disagreeing; 2 usage errors (bad arguments, bad ``VLLM_COMPAT_*`` values, unreadable paths, an output
file whose folder is missing), said in one or two lines before anything is read or fetched; 3 (doctor) nothing to
judge: vLLM or vllm-omni is not installed here.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys

# json is imported where --json is given: the default screen does without it (~1.4 ms of a warm doctor).


def _doctor(args) -> int:
    from . import report

    if args.runtime:
        with _stdout_to_stderr():  # vLLM logs to stdout: keep doctor's stdout its report alone
            result = report(runtime=True)
    else:
        result = report()
    screen = (lambda: result.render_table(args.width)) if args.verbose else lambda: result.render_short(args.width)
    if args.json:
        import json
    if args.require is None:
        print(json.dumps(result.to_dict(), indent=2) if args.json else screen())
        return result.exit_code
    from .require import gate

    answer = gate(result, args.require)
    print(json.dumps({**result.to_dict(), "require": answer.to_dict()}, indent=2) if args.json else screen())
    print(answer.line("doctor"), file=sys.stderr)
    return answer.exit_code


@contextlib.contextmanager
def _stdout_to_stderr():
    """Send everything written to stdout meanwhile to stderr: Python writes (vLLM's log handler is created with
    ``sys.stdout`` as it is when vLLM is imported, so it keeps writing to stderr afterwards) and, at the file
    descriptor, what native code prints."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved, 1)
        os.close(saved)


def _scan(args) -> int:
    from pathlib import Path

    from .detect.import_drift import check_import_drift
    from .detect.source_tree import SourceTree
    from .detect.static import StaticSite
    from .reporting import Report, render_import_drift, reported_facts

    against = None
    if args.vllm is not None:
        if not Path(args.vllm).exists():
            print(f"vllm-compat scan: --vllm {args.vllm} does not exist.", file=sys.stderr)
            return 2
        against = SourceTree(Path(args.vllm))
    results, drifts = [], []
    for raw in args.paths:
        path = Path(raw)
        if not path.exists():
            print(f"vllm-compat scan: {raw} does not exist; pass a wheel, an unpacked tree or a site-packages.",
                  file=sys.stderr)
            return 2
        tree = SourceTree(path)
        facts = reported_facts(StaticSite(tree, tree))
        # Import drift of a vllm-omni found here, against the vLLM beside it (or the one given by --vllm).
        drift = check_import_drift(tree, tree if tree.has_package("vllm") or against is None else against)
        drifts.append(drift)
        report = Report(mode="static", static=facts, patches=[], _import_drift=None)
        result = {"path": raw, "vllm": {"version": facts.versions.get("vllm")},
                  "vllm_omni": {"version": facts.versions.get("vllm-omni")}}
        for key, fields in report.fact_fields().items():
            result.setdefault(key, {}).update(fields)
        result["import_drift"] = drift.to_dict() if drift is not None else None
        result["_lines"] = report.fact_lines(indent="  ")
        results.append(result)
    lines = [r.pop("_lines") for r in results]
    if args.json:
        import json

        print(json.dumps(results, indent=2))
    else:
        for r, fact_lines, drift in zip(results, lines, drifts, strict=True):
            print(f"{r['path']}\n  vllm {r['vllm']['version'] or '-'}\n  vllm-omni {r['vllm_omni']['version'] or '-'}")
            for line in [*fact_lines, *render_import_drift(drift, indent="  ")]:
                print(line)
    return 0


def _check(args) -> int:
    from .check import run_check

    return run_check(args)


def _plan(args) -> int:
    from .plan import run_plan

    return run_plan(args)


def _add_require(parser: argparse.ArgumentParser) -> None:
    from .require import ALIASES, known_ids, required_entrypoints

    parser.add_argument(
        "--require", metavar="IDS", type=required_entrypoints, default=None,
        help=f"exit 0 when these entrypoints start, 1 otherwise (comma-separated: {', '.join(known_ids())}; "
             f"aliases {', '.join(f'{a}={t}' for a, t in ALIASES.items())}); default: every entrypoint, as the "
             "verdict says")


def _add_screen(parser: argparse.ArgumentParser, verbose: str = "print the full report: every drift point with its "
                "action and reason, every missing name, the facts read (the default is a short screen)") -> None:
    """``--verbose`` and ``--width`` of a command's screen (``reporting.render_summary``, ``plan.render``); under
    ``--verbose`` pip's and uv's own output is shown too (``tool_output``)."""
    from .reporting import SHORT_WIDTH

    parser.add_argument("--verbose", "-v", action="store_true",
                        help=f"{verbose}; also shows pip's and uv's own output")
    parser.add_argument("--width", metavar="N", type=_width, default=SHORT_WIDTH,
                        help=f"wrap the screen at N columns, N >= {_min_width()} (default {SHORT_WIDTH})")


def _min_width() -> int:
    from .reporting import MIN_WIDTH

    return MIN_WIDTH


def _width(text: str) -> int:
    """``--width N``: a whole number of columns, at least ``reporting.MIN_WIDTH`` (the narrowest screen whose
    status column still fits); argparse turns the error into one line and exit 2."""
    try:
        columns = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of columns; pass --width N with N >= "
                                         f"{_min_width()}.") from None
    if columns < _min_width():
        raise argparse.ArgumentTypeError(f"{columns} columns is under the minimum, {_min_width()}; pass --width "
                                         f"{_min_width()} or more.")
    return columns


def _output_file(text: str) -> str:
    """``--overrides FILE`` / ``--constraints FILE``: a file to write, checked before anything is read or fetched
    (so a bad path costs no check and leaves nothing half-written): its folder must exist and be writable, and
    the path must not be a folder. Returns ``text``."""
    path = os.path.abspath(os.path.expanduser(text))
    folder = os.path.dirname(path)
    if os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{text} is a folder; name a file in it ({os.path.join(text, 'FILE')}).")
    if not os.path.isdir(folder):
        what = "is not a folder" if os.path.exists(folder) else "does not exist"
        raise argparse.ArgumentTypeError(f"{text}: the folder {folder} {what}; create it first "
                                         f"(mkdir -p {folder}) or name a file in an existing folder.")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: the folder {folder} is not writable; name a file in a folder "
                                         "you can write to.")
    return text


class _ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, whose usage errors are one line and a hint (not the whole usage), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n  (`{self.prog} --help` lists the arguments)\n")


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, given the width its own reads through ``shutil.get_terminal_size``: argparse makes one
    for every argument added (to check its metavar), and importing shutil (with bz2, lzma and zlib) costs ~2-3 ms of
    a warm doctor that prints no help."""

    def __init__(self, prog, indent_increment=2, max_help_position=24, width=None, **kwargs):
        super().__init__(prog, indent_increment, max_help_position, _terminal_columns() - 2 if width is None else width,
                         **kwargs)


def _terminal_columns() -> int:
    """``shutil.get_terminal_size().columns``: ``$COLUMNS`` when a positive number, else the terminal's columns,
    else 80."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


def _command(commands, name: str, handler, summary: str, printed: str) -> argparse.ArgumentParser:
    """A subcommand (``summary``: its help line) running ``handler(args)``, with ``--json`` (print the ``printed`` as
    JSON)."""
    parser = commands.add_parser(name, help=summary, formatter_class=_HelpFormatter)
    parser.add_argument("--json", action="store_true", help=f"print the {printed} as JSON")
    parser.set_defaults(handler=handler)
    return parser


def build_parser() -> argparse.ArgumentParser:
    parser = _ArgumentParser(prog="vllm-compat", description=__doc__.splitlines()[0], formatter_class=_HelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    doctor = _command(commands, "doctor", _doctor, "what vllm_compat detects and decides for this environment",
                      "report")
    doctor.add_argument("--runtime", action="store_true",
                        help="import vLLM and vllm-omni, apply the shim and show the live result (slow)")
    _add_require(doctor)
    _add_screen(doctor)
    scan = _command(commands, "scan", _scan, "static capability profile of wheels, trees or site-packages",
                    "profiles")
    scan.add_argument("paths", nargs="+", metavar="PATH")
    scan.add_argument("--vllm", metavar="PATH", default=None,
                      help="check vllm-omni's imports (import drift) against the vLLM in PATH when a scanned "
                           "PATH holds vllm-omni without vLLM")
    check = _command(commands, "check", _check, "will vLLM X run vllm-omni Y? reads both release wheels (fetched "
                     "without dependencies into a per-user cache) and says: works natively, works with vllm_compat, "
                     "or will not start", "check")
    check.add_argument("specs", nargs="*", metavar="SPEC",
                       help="vllm==X and optionally vllm-omni==Y (default: the vllm-omni installed here) or another "
                            "vLLM plugin, PLUGIN==Y (tpu-inference==0.22.0: its entrypoints and declared vLLM range "
                            "read from its release); each may also be a wheel file, an unpacked tree or a "
                            "site-packages (offline), a plugin also its sdist")
    check.add_argument("--newest", action="store_true", help="check the newest vLLM on the index")
    check.add_argument("--no-resolve", action="store_true",
                       help="do not resolve the pair with uv nor list its wheels' files (offline use; local wheels "
                            "and trees never resolve)")
    check.add_argument("--overrides", metavar="FILE", default=None, type=_output_file,
                       help="write the override lines that resolve the pair's dependency conflicts and the file "
                            "clashes of its resolution to FILE, for `uv pip install vllm==X vllm-omni==Y --override "
                            "FILE` (docs/dependency-drift.md)")
    check.add_argument("--constraints", metavar="FILE", default=None, type=_output_file,
                       help="write the exact versions a matrix cell of the pair passed with to FILE, for "
                            "`uv pip install vllm==X vllm-omni==Y -c FILE` (exit 2 where no cell recorded them)")
    _add_require(check)
    _add_screen(check)
    plan = _command(commands, "plan", _plan, "how far can vllm-omni X follow vLLM? checks it on the newest patch of "
                    "every vLLM minor from its own to the newest on the index, one row each", "plan")
    plan.add_argument("spec", nargs="?", default=None, metavar="SPEC",
                      help="vllm-omni==X, a vllm-omni wheel or tree (default: the vllm-omni installed here); or any "
                           "vLLM plugin, PLUGIN==Y (from its declared lower bound: one row per vLLM, imports only)")
    which = plan.add_mutually_exclusive_group()
    which.add_argument("--upto", metavar="VERSION", default=None,
                       help="stop at this vLLM minor (0.30: up to the newest 0.30.x) instead of the newest")
    which.add_argument("--vllm", metavar="A,B", default=None,
                       help="check these vLLM releases (comma-separated) instead of asking the index")
    _add_screen(plan, "also list each vLLM's drift points, override lines and matrix cells")
    return parser


@contextlib.contextmanager
def _collector_paused():
    """Python's cyclic garbage collector off while a command runs, as it was after. A command reads hundreds of
    modules into syntax trees it keeps to its end, and the collector traversed them again at every full collection,
    and once more at the interpreter's exit: 40 % of a first check's time (vLLM 0.34.0 + vllm-omni 0.24.0, its
    fact cache empty: 12.1 s, 6.6 s paused; the same peak memory). What a command frees, it frees by reference
    counts; what it kept is frozen (``gc.freeze``: no later collection walks it again)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was_enabled:
            gc.enable()


def main(argv: list[str] | None = None) -> int:
    from . import tool_output
    from .errors import ConfigError

    args = build_parser().parse_args(argv)
    tool_output.show(getattr(args, "verbose", False))  # pip's and uv's own output: --verbose only
    try:
        with _collector_paused():
            return args.handler(args)
    except ConfigError as exc:
        print(f"vllm-compat: {exc}", file=sys.stderr)
        return 2
