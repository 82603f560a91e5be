"""``vllm-compat plan [vllm-omni==X]``: how far can vllm-omni X follow vLLM, and what does each step need.

X is checked, as ``vllm-compat check`` checks one pair (``check.run`` on the same wheels, from the same cache), on
every vLLM release from X's own (``behaviour_drift.own_vllm``: the same minor) to the newest on the index: the
newest patch of each minor (vLLM 0.25.1, not 0.25.0), from ``wheels.release_versions`` (one ``pip index versions``
call). One row per vLLM: each entrypoint's status (the check's ``import_drift.entrypoints.<id>.status``, word for
word in ``--json``), the drift points acting there (decisions ``patched``), the dependency overrides the pair
needs (``dependency_drift``) and the matrix cells that test it (``versions.cells_testing``); then the newest vLLM
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
    overrides: tuple[str, ...] = ()  # the override lines the pair's dependency conflicts need
    conflicts: int | None = None  # None: no Requires-Dist to read
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
                "overrides": list(self.overrides), "conflicts": self.conflicts, "cells": list(self.cells),
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
    if distribution != "vllm-omni":
        raise _usage(f"plan takes the vllm-omni to plan (vllm-omni==X), not {spec!r}; the vLLM releases come from "
                     "the index (or --vllm A,B).")
    return _index_input("vllm-omni", version)


def check_row(version: str, omni) -> Row:
    """vLLM ``version`` with ``omni`` (a ``CheckInput``), as ``vllm-compat check`` judges the pair."""
    from .check import _index_input, run
    from .detect.versions import cells_testing

    try:
        vllm = _index_input("vllm", version)
        result = run(vllm, omni)
    except WheelError as exc:
        return Row(version, error=str(exc))
    report, deps = result.report, result.dependencies
    drift = report.import_drift
    versions = report.static.versions
    return Row(
        vllm=vllm.version or version, source=vllm.source,
        import_ok=drift is not None and drift.import_ok,
        statuses={st.id: st.status for st in drift.all_statuses} if drift is not None else {},
        acting=tuple(d.name for d in report.patches if d.action == "patched"),
        overrides=tuple(deps.override_lines) if deps is not None else (),
        conflicts=len(deps.conflicts) if deps is not None else None,
        cells=cells_testing(versions.get("vllm") or version, versions.get("vllm-omni")),
        verdict=report.verdict().kind, exit_code=result.exit_code)


def make_plan(spec: str | None, vllm_versions: list[str] | None = None, upto: str | None = None,
              progress=None) -> Plan:
    """The plan for ``spec`` (see ``_omni_input``) over ``vllm_versions`` (None: the index's, ``select_releases``
    from vllm-omni's own minor to ``upto``). ``progress(row, index, count, seconds)`` is called after each vLLM.
    Raises ``WheelError`` for a usage error or an index that cannot be asked; a vLLM that cannot be had is a row
    with ``error``."""
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
    rows = []
    for index, version in enumerate(vllm_versions, 1):
        started = time.perf_counter()
        rows.append(check_row(version, omni))
        if progress is not None:
            progress(rows[-1], index, len(vllm_versions), time.perf_counter() - started)
    return Plan(omni, own, rows)


def _short(row: Row) -> str:
    if row.error:
        return "could not be checked"
    if not row.import_ok:
        return "import vllm_omni fails"
    return "everything starts" if row.everything_starts else "not everything starts"


def render(plan: Plan) -> str:
    """The screen ``vllm-compat plan`` prints."""
    from .entrypoints import entrypoints_of

    ids = [e.id for e in entrypoints_of("vllm_omni")]
    header = ["vLLM", *ids, "drift points", "overrides", "matrix cell"]
    table = []
    for r in plan.rows:
        if r.error:
            table.append([r.vllm, f"could not be checked: {r.error}"])
            continue
        words = [STATUS_WORDS.get(r.statuses.get(i, "absent"), r.statuses.get(i, "absent")) if r.import_ok
                 else "NO IMPORT" for i in ids]
        unresolved = (r.conflicts or 0) - len(r.overrides)
        overrides = "-" if r.conflicts is None else str(len(r.overrides)) + (f" (+{unresolved} without)"
                                                                             if unresolved else "")
        table.append([r.vllm, *words, str(len(r.acting)), overrides, r.cells[0] if r.cells else "untested"])
    widths = [max(len(row[c]) for row in [header, *table] if len(row) > c and len(row) == len(header))
              for c in range(len(header))]

    def line(cells):
        if len(cells) != len(header):
            return f"  {cells[0]:<{widths[0]}}  {cells[1]}"
        return "  " + "  ".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True)).rstrip()

    omni = plan.omni
    first, last = (plan.rows[0].vllm, plan.rows[-1].vllm) if plan.rows else ("-", "-")
    lines = [f"vllm-compat plan: vllm-omni {omni.version} (own vLLM {plan.own}) on vLLM {first} .. {last} "
             "(read from the wheels, nothing installed or imported)", "", line(header), *map(line, table), ""]
    lines.append(f"  newest vLLM where everything starts: {plan.newest_everything or 'none of these'}")
    lines.append(f"  newest where the diffusion stage starts: {plan.newest_diffusion or 'none of these'}")
    lines.append("  (statuses, drift points and overrides as `vllm-compat check vllm==V vllm-omni=="
                 f"{omni.version}` says them; `--json` lists the drift points, override lines and cells)")
    return "\n".join(lines)


def run_plan(args) -> int:
    """``vllm-compat plan`` (cli.py's handler)."""
    versions = [v.strip() for v in args.vllm.split(",") if v.strip()] if args.vllm else None
    progress = None
    if sys.stderr.isatty():
        def progress(row, index, count, seconds):
            print(f"vllm-compat plan: vLLM {row.vllm} ({index}/{count}) {_short(row)} [{seconds:.1f} s]",
                  file=sys.stderr, flush=True)
    try:
        plan = make_plan(args.spec, versions, args.upto, progress)
    except WheelError as exc:
        print(f"vllm-compat plan: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": {"kind": exc.kind, "message": str(exc)}, "exit_code": 2}, indent=2))
        return 2
    print(json.dumps(plan.to_dict(), indent=2) if args.json else render(plan))
    return plan.exit_code
