"""``vllm-compat plan [vllm-omni==X]``: how far can vllm-omni X follow vLLM, and what does each step need.

X is checked, as ``vllm-compat check`` checks one pair (``check.run`` on the same wheels, from the same cache), on
every vLLM release from X's own (``behaviour_drift.own_vllm``: the same minor) to the newest on the index: the
newest patch of each minor (vLLM 0.25.1, not 0.25.0), from ``wheels.release_versions`` (one ``pip index versions``
call). One row per vLLM: each entrypoint's status (the check's ``import_drift.entrypoints.<id>.status``, word for
word in ``--json``), the drift points acting there (decisions ``patched``), every override line the pair's install
takes, as ``check --overrides`` writes them (the conflicts' and, with the pair resolved as check resolves it,
``check.resolve_install``, the missing pins' and file clashes'; verified or not) and the matrix cells that test it (``versions.cells_testing``); then the newest vLLM
where everything starts and the newest where the diffusion stage starts. ``--vllm A,B`` checks those releases
instead of asking the index; ``--upto M`` stops at minor M.

Without an argument the vllm-omni installed here is planned (found without importing it); X may also be a wheel
file or an unpacked tree. Each pair costs what a check costs: 5-14 s cold (the wheels read, the behavioural scan),
a fraction of a second warm (the facts are cached per wheel pair), plus a wheel download the first time.

Exit codes: 0 the plan was made; 2 usage (no vllm-omni, an unknown version, no index) or a vLLM whose wheel could
not be had (its row says why, the other rows are still printed).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field

from .detect.wheels import WheelError

STATUS_WORDS = {"works": "works", "works_with_vllm_compat": "with vllm_compat", "will_not_start": "WILL NOT START",
                "fails_on_request": "FAILS ON REQUEST", "absent": "absent", "left_out": "LEFT OUT"}


@dataclass
class Row:
    """One vLLM release with vllm-omni X. ``statuses``: {entrypoint id: the check's status}; ``import_ok``: False
    when ``import vllm_omni`` fails (then nothing starts, whatever the statuses say); ``error``: why the release
    could not be checked (every other field empty)."""

    vllm: str
    source: str = ""  # "cache" | "downloaded"
    import_ok: bool = False
    statuses: dict[str, str] = field(default_factory=dict)
    acting: tuple[str, ...] = ()  # drift points patched
    # every line the install takes, as ``check --overrides`` writes them (``DependencyDrift.install_lines``: the
    # conflicts' overrides, then the resolution's file-clash and missing-pin lines)
    overrides: tuple[str, ...] = ()
    conflicts: int | None = None  # None: no Requires-Dist to read
    without_override: int = 0  # conflicts with no override named
    install: str = ""  # "verified", or why the install with ``overrides`` is not (``install_verified``)
    cells: tuple[str, ...] = ()
    verdict: str = ""
    exit_code: int | None = None
    error: str | None = None

    def starts(self, entrypoint_id: str) -> bool:
        return self.import_ok and self.statuses.get(entrypoint_id) in ("works", "works_with_vllm_compat")

    @property
    def everything_starts(self) -> bool:
        """``import vllm_omni`` works and every entrypoint this release ships starts (``ImportDrift.starts``)."""
        return (self.error is None and self.import_ok and bool(self.statuses)
                and all(self.starts(i) for i, s in self.statuses.items() if s != "absent"))

    def to_dict(self) -> dict:
        return {"vllm": self.vllm, "source": self.source, "import_ok": self.import_ok,
                "entrypoints": dict(self.statuses), "starts": {i: self.starts(i) for i in self.statuses},
                "everything_starts": self.everything_starts, "drift_points": list(self.acting),
                "overrides": list(self.overrides), "conflicts": self.conflicts,
                "without_override": self.without_override, "install": self.install,
                "install_verified": self.install == "verified", "cells": list(self.cells),
                "tested": bool(self.cells), "verdict": self.verdict, "exit_code": self.exit_code, "error": self.error}


@dataclass
class Plan:
    omni: object  # check.CheckInput
    own: str  # vllm-omni's own vLLM
    rows: list[Row]

    def newest(self, test) -> str | None:
        found = [r.vllm for r in self.rows if r.error is None and test(r)]
        return found[-1] if found else None

    @property
    def newest_everything(self) -> str | None:
        return self.newest(lambda r: r.everything_starts)

    @property
    def newest_diffusion(self) -> str | None:
        return self.newest(lambda r: r.starts("diffusion_stage"))

    @property
    def exit_code(self) -> int:
        return 2 if any(r.error for r in self.rows) else 0

    def to_dict(self) -> dict:
        return {"mode": "plan", "vllm_omni": self.omni.to_dict(), "own_vllm": self.own,
                "rows": [r.to_dict() for r in self.rows], "newest_everything_starts": self.newest_everything,
                "newest_diffusion_stage_starts": self.newest_diffusion, "exit_code": self.exit_code}


def _release(version: str) -> tuple[int, ...]:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).release
    except InvalidVersion:
        raise WheelError("usage", f"{version!r} is not a version; write one such as 0.30 or 0.30.0.") from None


def select_releases(available: list[str], own: str, upto: str | None = None) -> list[str]:
    """The newest patch of each minor in ``available`` (final releases, any order) from ``own``'s minor up to
    ``upto``'s (inclusive; None: the newest), oldest first."""
    newest: dict[tuple[int, ...], str] = {}
    for version in available:
        minor = _release(version)[:2]
        if minor not in newest or _release(version) > _release(newest[minor]):
            newest[minor] = version
    low = _release(own)[:2]
    high = _release(upto)[:2] if upto is not None else None
    return [newest[m] for m in sorted(newest) if m >= low and (high is None or m <= high)]


def _omni_input(spec: str | None):
    """The vllm-omni to plan: ``vllm-omni==X``, a wheel or tree holding it, or the one installed here."""
    from .check import _index_input, _installed_omni, _looks_like_path, _parse_spec, _tree_input, _usage

    if spec is None:
        omni = _installed_omni()
        if omni is None:
            raise _usage("no vllm-omni is installed here; name the one to plan: vllm-omni==X or its wheel.")
        return omni
    if _looks_like_path(spec):
        found = [item for item in _tree_input(spec) if item.distribution == "vllm-omni"]
        if not found:
            raise _usage(f"{spec} holds no vllm-omni (vllm_omni/__init__.py); pass a vllm-omni wheel or tree.")
        return found[0]
    distribution, version = _parse_spec(spec)
    if distribution == "vllm":
        raise _usage(f"plan takes the vllm-omni to plan (vllm-omni==X), not {spec!r}; the vLLM releases come from "
                     "the index (or --vllm A,B).")
    return _index_input("vllm-omni", version)


def other_plugin(spec: str | None):
    """The ``CheckInput`` of ``spec`` where it names a vLLM plugin other than vllm-omni (``PLUGIN==Y``, its wheel,
    sdist or tree; planned by ``plugin_plan``), else None."""
    from .check import _looks_like_path, _parse_spec, _plugin_index_input, _tree_input

    if spec is None:
        return None
    if _looks_like_path(spec):
        found = [item for item in _tree_input(spec) if item.distribution not in ("vllm", "vllm-omni")]
        return found[0] if found else None
    distribution, version = _parse_spec(spec)
    return None if distribution in ("vllm", "vllm-omni") else _plugin_index_input(distribution, version)


RESOLVE_WORKERS = 3  # pairs resolved at once: uv and the listings wait on the index more than on the 2 cores


def _check(version: str, omni):
    """``check.run`` of vLLM ``version`` with ``omni``, unresolved: a ``CheckResult``, or the ``WheelError`` that
    kept the release from being checked."""
    from .check import _index_input, run

    try:
        return run(_index_input("vllm", version), omni)
    except WheelError as exc:
        return exc


def row_of(version: str, result) -> Row:
    """The row of one ``check.run`` result (or its ``WheelError``), as ``vllm-compat check`` judges the pair: the
    statuses, drift points, verdict and exit code of its report, and the install lines of its dependencies."""
    from .detect.versions import cells_testing

    if isinstance(result, WheelError):
        return Row(version, error=str(result))
    report, deps = result.report, result.dependencies
    drift = report.import_drift
    versions = report.static.versions
    verified, short, _ = deps.install_verified() if deps is not None else (False, "no Requires-Dist read", "")
    return Row(
        vllm=result.vllm.version or version, source=result.vllm.source,
        import_ok=drift is not None and drift.import_ok,
        statuses={st.id: st.status for st in drift.all_statuses} if drift is not None else {},
        acting=tuple(d.name for d in report.patches if d.action == "patched"),
        overrides=tuple(deps.install_lines) if deps is not None else (),
        conflicts=len(deps.conflicts) if deps is not None else None,
        without_override=sum(c.override is None for c in deps.conflicts) if deps is not None else 0,
        install="verified" if verified else short,
        cells=cells_testing(versions.get("vllm") or version, versions.get("vllm-omni")),
        verdict=report.verdict().kind, exit_code=result.exit_code)


def make_plan(spec: str | None, vllm_versions: list[str] | None = None, upto: str | None = None,
              progress=None, resolve: bool | None = None) -> Plan:
    """The plan for ``spec`` (see ``_omni_input``) over ``vllm_versions`` (None: the index's, ``select_releases``
    from vllm-omni's own minor to ``upto``). ``progress(row, index, count, seconds)`` is called after each vLLM's
    static check (its row without the resolution). ``resolve`` (None: as check decides, ``check.resolve_enabled``):
    each pair is resolved as check resolves it, ``RESOLVE_WORKERS`` at a time while the next are checked, so each
    row's overrides are what ``check --overrides`` writes for the pair. Raises ``WheelError`` for a usage error or an index that
    cannot be asked; a vLLM that cannot be had is a row with ``error``."""
    from concurrent.futures import ThreadPoolExecutor

    from .check import resolve_enabled, resolve_install
    from .detect.behaviour_drift import own_vllm
    from .detect.wheels import release_versions

    for version in [*(vllm_versions or ()), *([upto] if upto is not None else [])]:
        _release(version)  # a usage error before anything is fetched
    omni = _omni_input(spec)
    own = own_vllm(omni.version)
    if own is None:
        raise WheelError("usage", f"the version of the vllm-omni in {omni.location} is unknown, so is its own vLLM; "
                                  "pass vllm-omni==X or list the vLLM releases with --vllm A,B.")
    if vllm_versions is None:
        vllm_versions = select_releases(release_versions("vllm"), own, upto)
    resolving = resolve if resolve is not None else resolve_enabled()
    results, resolutions = [], []
    # each pair is resolved while the next ones are checked: uv and the listings wait on the index, the scans on
    # the CPU (a cold plan of eleven releases: 91 s, resolving after the checks)
    with ThreadPoolExecutor(max_workers=RESOLVE_WORKERS) as pool:
        for index, version in enumerate(vllm_versions, 1):
            started = time.perf_counter()
            results.append(_check(version, omni))
            if progress is not None:  # the row before its resolution starts: nothing changes it while it is read
                progress(row_of(version, results[-1]), index, len(vllm_versions), time.perf_counter() - started)
            if resolving and not isinstance(results[-1], WheelError):
                resolutions.append(pool.submit(resolve_install, results[-1]))
        for resolution in resolutions:
            resolution.result()  # its error, as the checks' loop would have raised it
    return Plan(omni, own, [row_of(version, result) for version, result in zip(vllm_versions, results, strict=True)])


def _short(row: Row) -> str:
    if row.error:
        return "could not be checked"
    if not row.import_ok:
        return "import vllm_omni fails"
    return "everything starts" if row.everything_starts else "not everything starts"


_CANNOT = "  could not be checked: "
# the table's narrower form (``render``): status words and headers that leave 100 columns room
COMPACT_WORDS = {"works": "works", "works_with_vllm_compat": "compat", "will_not_start": "NO START",
                 "fails_on_request": "FAILS REQ", "absent": "absent", "left_out": "LEFT OUT"}
COMPACT_SAYS = {"compat": "starts with vllm_compat", "NO START": "will not start",
                "FAILS REQ": "starts, fails on request", "NO IMPORT": "import vllm_omni fails"}


def _cells(r: Row, ids: list[str], words: dict) -> list[str]:
    """One row's cells: the vLLM, each entrypoint's status in ``words``, the drift points acting, the override
    lines (and the conflicts without one), the first matrix cell."""
    statuses = [words.get(r.statuses.get(i, "absent"), r.statuses.get(i, "absent")) if r.import_ok
                else "NO IMPORT" for i in ids]
    unresolved = r.without_override
    overrides = "-" if r.conflicts is None else str(len(r.overrides)) + (f" (+{unresolved} without)"
                                                                         if unresolved else "")
    return [r.vllm, *statuses, str(len(r.acting)), overrides, r.cells[0] if r.cells else "untested"]


def _table(header: list[str], rows: list[Row], cells) -> list[str]:
    """The rows under ``header``, columns as wide as their widest cell; a row that could not be checked says why
    after its vLLM."""
    table = [cells(r) for r in rows if not r.error]
    widths = [max(len(row[c]) for row in [header, *table]) for c in range(len(header))]

    def line(row: Row | None) -> str:
        if row is not None and row.error:
            return f"  {row.vllm:<{widths[0]}}{_CANNOT}{row.error}"
        items = header if row is None else cells(row)
        return "  " + "  ".join(f"{c:<{w}}" for c, w in zip(items, widths, strict=True)).rstrip()

    return [line(None), *(line(r) for r in rows)]


def render(plan: Plan, width: int | None = None, verbose: bool = False) -> str:
    """The screen ``vllm-compat plan`` prints, no line wider than ``width`` (``reporting.SHORT_WIDTH`` by default;
    ``reporting.wrap_lines``, nothing cut): the table with each status as ``check`` words it where that fits,
    else with short words (a legend names the ones used), else one block per vLLM; then the newest vLLM where
    everything starts and where the diffusion stage does. ``verbose`` adds, per vLLM, its verdict, the drift
    points acting, the override lines with whether the install with them was verified, and every matrix cell."""
    from .entrypoints import entrypoints_of
    from .reporting import MIN_WIDTH, SHORT_WIDTH, wrap_lines

    width = max(width or SHORT_WIDTH, MIN_WIDTH)
    ids = [e.id for e in entrypoints_of("vllm_omni")]
    omni = plan.omni
    first, last = (plan.rows[0].vllm, plan.rows[-1].vllm) if plan.rows else ("-", "-")
    lines = [f"vllm-compat plan: vllm-omni {omni.version} (own vLLM {plan.own}) on vLLM {first} .. {last} "
             "(read from the wheels, nothing installed or imported)", ""]
    full = _table(["vLLM", *ids, "drift points", "overrides", "matrix cell"], plan.rows,
                  lambda r: _cells(r, ids, STATUS_WORDS))
    compact = _table(["vLLM", *(i.split("_")[0] for i in ids), "drift", "overrides", "cell"], plan.rows,
                     lambda r: _cells(r, ids, COMPACT_WORDS))
    checked = [r for r in plan.rows if not r.error]

    def fits(table: list[str]) -> bool:  # a row's error is wrapped below its vLLM
        return all(len(line) <= width for line in table if _CANNOT not in line)

    if fits(full):
        lines += full
    elif fits(compact):
        lines += compact
        used = {word for r in checked for word in _cells(r, ids, COMPACT_WORDS)[1:1 + len(ids)]}
        legend = "; ".join(f"{word}: {says}" for word, says in COMPACT_SAYS.items() if word in used)
        lines += [f"  ({legend})"] if legend else []
    else:  # one block per vLLM: the entrypoints grouped by status
        for r in plan.rows:
            if r.error:
                lines.append(f"  vLLM {r.vllm}: could not be checked: {r.error}")
                continue
            cells = _cells(r, ids, STATUS_WORDS)
            grouped: dict[str, list[str]] = {}
            for i, word in zip(ids, cells[1:1 + len(ids)], strict=True):
                grouped.setdefault(word, []).append(i)
            overrides = "dependencies not read" if r.conflicts is None else f"{cells[-2]} override lines"
            lines.append(f"  vLLM {r.vllm}: " + "; ".join(f"{', '.join(i)} {word}" for word, i in grouped.items())
                         + f"; {cells[-3]} drift points, {overrides}, {cells[-1]}")
    lines.append("")
    lines.append(f"  newest vLLM where everything starts: {plan.newest_everything or 'none of these'}")
    lines.append(f"  newest where the diffusion stage starts: {plan.newest_diffusion or 'none of these'}")
    if verbose:
        for r in checked:
            lines += ["", f"  vLLM {r.vllm}: {r.verdict} (exit {r.exit_code}); matrix cells: "
                          f"{', '.join(r.cells) or 'none'}",
                      f"    drift points acting ({len(r.acting)}): {', '.join(r.acting) or 'none'}",
                      f"    override lines ({len(r.overrides)}): {', '.join(r.overrides) or 'none'}"
                      + (f"; install: {r.install}" if r.install else "")]
    lines.append("  (statuses, drift points and overrides as `vllm-compat check vllm==V vllm-omni=="
                 f"{omni.version}` says them; " + ("`--json`: the same as data)" if verbose else
                                                  "--verbose lists the drift points, override lines and cells)"))
    return "\n".join(wrap_lines(lines, width))


def run_plan(args) -> int:
    """``vllm-compat plan`` (cli.py's handler)."""
    from .check import resolve_enabled

    versions = [v.strip() for v in args.vllm.split(",") if v.strip()] if args.vllm else None
    progress = None
    if sys.stderr.isatty():
        def progress(row, index, count, seconds):
            print(f"vllm-compat plan: vLLM {row.vllm} ({index}/{count}) {_short(row)} [{seconds:.1f} s]",
                  file=sys.stderr, flush=True)
    try:
        plugin = other_plugin(args.spec)
        if plugin is not None:
            return _run_plugin_plan(args, plugin, versions)
        plan = make_plan(args.spec, versions, args.upto, progress, resolve=resolve_enabled(args))
    except WheelError as exc:
        print(f"vllm-compat plan: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": {"kind": exc.kind, "message": str(exc)}, "exit_code": 2}, indent=2))
        return 2
    print(json.dumps(plan.to_dict(), indent=2) if args.json
          else render(plan, getattr(args, "width", None), getattr(args, "verbose", False)))
    return plan.exit_code


def _run_plugin_plan(args, plugin, versions: list[str] | None) -> int:
    """``plan`` for a plugin other than vllm-omni (``plugin_plan``): its screen or ``--json``."""
    from .plugin_plan import make_plugin_plan
    from .plugin_plan import render as render_plugin

    progress = None
    if sys.stderr.isatty():
        def progress(row, index, count):
            print(f"vllm-compat plan: vLLM {row.vllm} ({index}/{count}) {row.error or row.verdict}", file=sys.stderr,
                  flush=True)
    for version in [*(versions or ()), *([args.upto] if args.upto is not None else [])]:
        _release(version)  # a usage error before anything is fetched
    plan = make_plugin_plan(plugin, versions, args.upto, progress)
    print(json.dumps(plan.to_dict(), indent=2) if args.json else render_plugin(plan, getattr(args, "width", None)))
    return plan.exit_code
