"""One report model, rendered for ``vllm-compat doctor`` (table and ``--json``), logs and the pytest header."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .detect.static import SiteFacts
from .detect.versions import TESTED_VLLM_RANGE, is_tested_vllm
from .entrypoints import ENTRYPOINTS

SHORT_WIDTH = 100  # columns of every screen by default (``--width``): doctor, check, plan, and their --verbose
MIN_WIDTH = 40  # the narrowest ``--width``: an entrypoint's label and status still fit one line
NOTHING_TO_JUDGE_EXIT = 3  # doctor where vLLM or vllm-omni is not installed: not "works" (0), not "fails" (1)


@dataclass
class Report:
    mode: str  # "static" (files only) or "runtime" (imported and applied)
    static: SiteFacts  # versions and every entry's static facts (``detect.static.detect_static``)
    patches: list  # Decisions
    runtime: SiteFacts | None = None  # the same from the imported modules (entries whose target is imported)
    runtime_error: str | None = None
    mismatches: list[str] = field(default_factory=list)
    # Static import-drift check of vllm-omni against vLLM (detect.import_drift), as found (bridges not applied):
    # ``...`` means the installed pair, computed on first use (~1 s) so header_line() stays cheap; a callable is
    # called on first use for it; None when vllm-omni or vLLM is absent.
    _import_drift: object = field(default=..., repr=False)
    # Behavioural drift of the pair (detect.behaviour_drift): as ``_import_drift`` (``...``: the installed pair).
    _behaviour_drift: object = field(default=..., repr=False)
    # Whether what each entrypoint imports from other distributions must be installed here: the doctor's installed
    # pair; ``check`` reads wheels, whose installs bring their requirements.
    judge_packages: bool = True
    _packages_judged: bool = field(default=False, repr=False)
    # Whether bridges are in place before ``import vllm_omni`` (the startup .pth); None: ask this environment.
    startup_hook: bool | None = None
    # Install conflicts of the pair (dependency_drift.DependencyDrift): a callable is called on first use (the
    # doctor: installed METADATA, no index); None: not asked (check keeps its own on CheckResult).
    _dependency_drift: object = field(default=None, repr=False)
    # {entry id: handles_drift} of the acting drift points, where known without importing them (the static doctor's,
    # kept with its decisions: ``decide.decided``); None: each acting drift point is asked (``bridges.drift_handler``).
    _handles: dict | None = field(default=None, repr=False)

    def __post_init__(self):
        if self._import_drift is not ... and self._behaviour_drift is ...:
            self._behaviour_drift = None  # an import drift of other trees: the installed pair's scan does not apply

    @property
    def dependency_drift(self):
        if callable(self._dependency_drift):
            self._dependency_drift = self._dependency_drift()
        return self._dependency_drift

    @property
    def behaviour_drift(self):
        if self._behaviour_drift is ...:
            from .detect.static import StaticSite

            self._behaviour_drift = StaticSite.installed().behaviour_drift
        elif callable(self._behaviour_drift):
            self._behaviour_drift = self._behaviour_drift()
        return self._behaviour_drift

    @property
    def import_drift(self):
        """The import drift with the decided bridges applied: a bridged name no longer counts, and for
        ``import vllm_omni`` only when the startup hook puts the bridge in place in time."""
        if self._import_drift is ...:
            from .detect.static import StaticSite

            self._import_drift = StaticSite.installed().installed_import_drift()
        elif callable(self._import_drift):
            self._import_drift = self._import_drift()
        if self._import_drift is None:
            return None
        if self.judge_packages and not self._packages_judged:
            self._import_drift, self._packages_judged = self._import_drift.judged_installed(), True
        from .bridges import (
            drift_handler,
            left_out_by_decisions,
            provided_by_decisions,
            stage_left_out_by_decisions,
        )

        if self.startup_hook is None:
            from ._startup import is_installed

            self.startup_hook = is_installed()
        return self._import_drift.with_bridges(provided_by_decisions(self.patches), self.startup_hook,
                                               left_out_by_decisions(self.patches),
                                               stage_left_out_by_decisions(self.patches)).with_behaviour(
            self.behaviour_drift, drift_handler(self.patches, self._handles))

    @property
    def plugin_will_not_import(self) -> bool:
        return self.import_drift is not None and not self.import_drift.import_ok

    @property
    def environment(self) -> SiteFacts:
        return self.runtime or self.static

    def _entry_facts(self):
        """``(drift point, facts)`` of every catalogue entry this report has facts for (runtime facts first)."""
        from .catalogue import CATALOGUE

        found = {**self.static.facts, **(self.runtime.facts if self.runtime is not None else {})}
        return [(entry.point, found[entry.id]) for entry in CATALOGUE if entry.id in found]

    @property
    def exit_code(self) -> int:
        """0 when vllm-omni can start, natively or with the shim; 1 when it will not, a target was refused, the
        runtime check failed, or static and runtime detection disagree; 3 (``NOTHING_TO_JUDGE_EXIT``) when vLLM or
        vllm-omni is not installed."""
        return self.verdict().exit_code

    def to_dict(self) -> dict:
        versions = self.environment.versions
        data = {
            "mode": self.mode,
            "vllm": {"version": versions.get("vllm"), "tested": is_tested_vllm(versions.get("vllm"))},
            "vllm_omni": {"version": versions.get("vllm-omni")},
            "torch": {"version": versions.get("torch")},
            "patches": [d.to_dict() for d in self.patches],
            "catalogue": _catalogue_rows(),
            "import_drift": self.import_drift.to_dict() if self.import_drift is not None else None,
            "dependency_drift": self.dependency_drift.to_dict() if self.dependency_drift is not None else None,
            "mismatches": list(self.mismatches),
            "runtime_error": self.runtime_error,
            "verdict": {"kind": self.verdict().kind, "text": self.verdict().text},
            "exit_code": self.exit_code,
        }
        for key, fields in self.fact_fields().items():
            data.setdefault(key, {}).update(fields)
        return data

    def fact_fields(self) -> dict:
        """What each drift point adds of its facts to ``--json`` (``DriftPoint.report_fields``), merged by key."""
        merged: dict = {}
        for point, facts in self._entry_facts():
            for key, fields in point.report_fields(facts).items():
                merged.setdefault(key, {}).update(fields)
        return merged

    def header_line(self) -> str:
        versions = self.environment.versions
        notes = "; ".join(n for n in (point.header_note(facts) for point, facts in self._entry_facts()) if n)
        patches = ", ".join(f"{d.name}={d.action}" + (f"/{d.variant}" if d.variant else "") for d in self.patches)
        drift = self.import_drift
        stages = ("; " + ", ".join(f"{st.id}={st.status}" for st in drift.all_statuses)
                  if drift is not None and drift.import_ok else "")
        return (f"vllm-compat: vllm {versions.get('vllm') or 'absent'}, vllm-omni {versions.get('vllm-omni') or 'absent'}"
                f"{f' ({notes})' if notes else ''}{stages}; {patches}")

    def fact_lines(self, indent: str = "             ") -> list[str]:
        """What each drift point shows of its facts (``DriftPoint.report_lines``), indented under the versions."""
        return [f"{indent}{line}" for point, facts in self._entry_facts() for line in point.report_lines(facts)]

    def render_table(self, width: int | None = None) -> str:
        """``doctor --verbose``: the versions and facts, every drift point with its action and reason, the
        dependency drift and the verdict; lines wrapped at ``width`` (``wrap_lines``: nothing cut), or left whole
        with None."""
        versions = self.environment.versions
        tested = is_tested_vllm(versions.get("vllm"))
        tested_note = {True: "tested", False: "UNTESTED (outside {}-{})".format(*TESTED_VLLM_RANGE), None: ""}[tested]
        how = "read from files, nothing imported" if self.mode == "static" else "imported and applied live"
        lines = [
            f"vllm-compat doctor ({self.mode}: {how})",
            "",
            f"  vllm       {versions.get('vllm') or 'not installed':<14} {tested_note}".rstrip(),
            f"  vllm-omni  {versions.get('vllm-omni') or 'not installed'}",
        ]
        lines += self.fact_lines()
        lines += render_import_drift(self.import_drift)
        lines.append(f"  torch      {versions.get('torch') or 'not installed'}")
        lines.append("")
        name_width = max([len(d.name) for d in self.patches] + [5])
        variant_width = max([len(d.variant or "-") for d in self.patches] + [7])
        lines.append(f"  {'patch':<{name_width}}  {'action':<8}  {'variant':<{variant_width}}  why")
        for d in self.patches:
            lines.append(f"  {d.name:<{name_width}}  {d.action:<8}  {d.variant or '-':<{variant_width}}  {d.reason}")
        if self.mode == "static" and any(d.action == "patched" for d in self.patches):
            lines.append("  (static: 'patched' means it will be patched when its target module is imported)")
        if self.runtime_error:
            lines += ["", f"  runtime: {self.runtime_error}"]
        for mismatch in self.mismatches:
            lines.append(f"  MISMATCH static vs runtime: {mismatch}")
        if self.dependency_drift is not None:
            lines += ["", *self.dependency_drift.render_lines()]
        lines += ["", f"  verdict: {self.verdict().text}"]
        return "\n".join(lines if width is None else wrap_lines(lines, width))

    def render_short(self, width: int = SHORT_WIDTH) -> str:
        """Doctor's default screen (``render_summary``): the versions, one line per entrypoint, what vllm_compat
        does, the overrides and the verdict; ``render_table`` (``--verbose``) has every drift point and reason."""
        versions = self.environment.versions
        tested = {True: " (tested)", False: " (UNTESTED: outside {}-{})".format(*TESTED_VLLM_RANGE),
                  None: ""}[is_tested_vllm(versions.get("vllm"))]
        how = "read from files, nothing imported" if self.mode == "static" else "imported and applied live"
        head = [f"vllm-compat doctor ({self.mode}: {how})",
                f"  vllm {versions.get('vllm') or 'not installed'}{tested}, "
                f"vllm-omni {versions.get('vllm-omni') or 'not installed'}, "
                f"torch {versions.get('torch') or 'not installed'}"]
        return render_summary(self, head, self.dependency_drift, width)

    def verdict(self) -> Verdict:
        """The one verdict doctor and ``check`` print: will each way of starting vllm-omni start here, and why.
        Nothing to judge (exit 3) where there is no import drift to read: vLLM or vllm-omni is not installed (a
        runtime check that failed on what is installed fails first).

        Missing vLLM names count once the decided bridges are applied (``import_drift``): first what stops
        ``import vllm_omni`` (then nothing starts), then what stops each entrypoint (``entrypoints.ENTRYPOINTS``:
        the offline API, ``vllm serve --omni``, the diffusion stage), each named with its missing names and the
        ones that start beside it; then a failed runtime check, a static / runtime disagreement, a refused target;
        otherwise it works (every entrypoint starts), with vllm_compat when something is patched or bridged,
        natively when nothing needs to be. Where an entrypoint starts through a bridge that leaves a feature out
        (a raising stand-in), the verdict names that feature: it is never more optimistic than the env."""
        drift = self.import_drift
        if drift is None and self.runtime_error:  # what is installed fails to import: that is the answer
            return Verdict("failed", 1, "FAIL: the runtime check could not complete (see above).")
        if drift is None:  # the installed pair lacks vLLM or vllm-omni (check always reads both)
            return Verdict("nothing_to_judge", NOTHING_TO_JUDGE_EXIT, _nothing_to_judge(self.environment.versions))
        if drift is not None and not drift.import_ok:
            return Verdict("will_not_start", 1, (
                f"WILL NOT START: vllm-omni will not import on this vLLM ({', '.join(drift.still_blocking_names)} "
                "missing) and vllm_compat has no bridge for it; nothing of it can run here, patched or not."))
        stopped = [st for st in drift.statuses if st.status == "will_not_start"] if drift is not None else []
        failing = [st for st in drift.statuses if st.status == "fails_on_request"] if drift is not None else []
        if failing and not stopped:
            return Verdict("fails_on_request", 1, "FAILS ON REQUEST: " + "; ".join(
                f"{st.label} starts, but every {', '.join(st.endpoints_failing)} request fails ("
                + "; ".join(f.describe() for f in st.drift) + ")" for st in failing)
                + " and vllm_compat has nothing that handles it.")
        if stopped:
            started = [st for st in drift.statuses if st.starts]
            patched = [d.name for d in self.patches if d.action == "patched"]
            text = "WILL NOT START: " + "; ".join(f"{st.label} ({_why_stopped(st)})" for st in stopped) + "."
            if started:
                helped = any(st.status == "works_with_vllm_compat" for st in started) or patched
                text += (f" {_sentence(_join(st.label for st in started))} "
                         + ("start" if len(started) > 1 else "starts") + (" with vllm_compat" if helped else "")
                         + (f" (it handles {', '.join(patched)})" if patched else "") + "."
                         + _left_out(started))
            return Verdict("will_not_start", 1, text)
        if self.runtime_error:
            return Verdict("failed", 1, "FAIL: the runtime check could not complete (see above).")
        if self.mismatches:
            return Verdict("failed", 1, "FAIL: static and runtime detection disagree; please report it with this "
                           "output.")
        if any(d.action == "refused" for d in self.patches):
            return Verdict("refused", 1, "ATTENTION: a target has a shape vllm_compat does not recognize and stays "
                           "unpatched (see 'why'); it may fail where the patch would have helped.")
        if self.patches and all(d.action == "disabled" for d in self.patches):
            return Verdict("disabled", 0, "vllm_compat is disabled (VLLM_COMPAT_DISABLE): nothing is patched. Unset "
                           "it to see what vllm_compat would do.")
        patched = [d.name for d in self.patches if d.action == "patched"]
        started = [st for st in drift.statuses if st.starts] if drift is not None else []
        bridged = [st.label for st in started if st.status == "works_with_vllm_compat"]
        details = ([f"{_join(st.label for st in started)} " + ("start" if len(started) > 1 else "starts")]
                   if started else []) + ([f"it handles {', '.join(patched)}"] if patched else [])
        if patched or bridged:
            return Verdict("works_with_vllm_compat", 0, f"WORKS WITH vllm_compat{_except(started)}: "
                           f"{'; '.join(details)}.{_left_out(started)}")
        if started:
            return Verdict("works_natively", 0, f"WORKS NATIVELY{_except(started)}: {details[0]}; nothing needs "
                           f"patching.{_left_out(started)}")
        return Verdict("works_natively", 0, "WORKS NATIVELY: nothing needs patching.")


def _nothing_to_judge(versions) -> str:
    """The verdict where vLLM or vllm-omni is not installed: which, and what to do instead."""
    absent = [name for name, key in (("vLLM", "vllm"), ("vllm-omni", "vllm-omni")) if not versions.get(key)]
    what = " and ".join(absent) or "vLLM or vllm-omni"
    return (f"NOTHING TO JUDGE: {what} {'are' if len(absent) > 1 else 'is'} not installed here. Install both, or "
            "ask about a pair without installing it: vllm-compat check vllm==X vllm-omni==Y.")


def _why_stopped(status) -> str:
    """What stops one entrypoint: packages this env lacks, then vLLM names no bridge provides, then behavioural drift
    nothing handles."""
    parts = [f"{', '.join(status.not_installed)} not installed here"] if status.not_installed else []
    if status.missing_in_vllm:
        parts.append(f"{', '.join(status.missing_in_vllm)} missing, no bridge in vllm_compat")
    if status.stopping_drift:
        parts.append("; ".join(f.describe() for f in status.stopping_drift) + ", nothing in vllm_compat handles it")
    return "; ".join(parts)


def _left_out(started) -> str:
    """" Left out: <feature> (<entries>); ...." for what the bridges of the started entrypoints leave out, else
    ""."""
    found = _by_text(item for st in started for item in st.left_out)
    return f" Left out: {'; '.join(f'{text} ({entries})' for text, entries in found.items())}." if found else ""


def _by_text(left_out) -> dict[str, str]:
    """{feature: "entry, entry"} from (entry id, feature) pairs, in first-seen order: bridges of one removal say
    the same thing once."""
    found: dict[str, list[str]] = {}
    for entry, text in left_out:
        if entry not in found.setdefault(text, []):
            found[text].append(entry)
    return {text: ", ".join(entries) for text, entries in found.items()}


def _join(labels) -> str:
    """"a", "a and b", "a, b and c"."""
    labels = list(labels)
    return labels[0] if len(labels) == 1 else f"{', '.join(labels[:-1])} and {labels[-1]}"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


@dataclass(frozen=True)
class Verdict:
    """``Report.verdict``'s answer: kind ("works_natively", "works_with_vllm_compat", "will_not_start",
    "refused", "failed", "disabled", "nothing_to_judge"), the exit code and the sentence doctor and check print."""

    kind: str
    exit_code: int
    text: str


def render_import_drift(drift, indent: str = "             ", shown: int = 3) -> list[str]:
    """Doctor / scan lines for an ``ImportDrift``: the count and the first few names with their importer."""
    if drift is None:
        return []
    if drift.ok:
        return [f"{indent}import drift: none ({drift.checked} vLLM imports checked, {drift.unknown} undecidable)"]
    first = list(drift.blocking) + [u for u in drift.unresolved if u not in drift.blocking]
    names = ", ".join(f"{u.target} (in {u.importer}:{u.line}" + (f"; bridged by {drift.bridged_by(u.target)})"
                                                                 if drift.bridged_by(u.target) else ")")
                      for u in first[:shown])
    more = f", +{len(first) - shown} more" if len(first) > shown else ""
    lines = [f"{indent}import drift: {len(drift.unresolved)} vLLM import(s) no longer resolve: {names}{more}"]
    if not drift.import_ok:
        lines.append(f"{indent}WILL NOT IMPORT: `import {drift.plugin}` reaches "
                     f"{', '.join(drift.still_blocking_names)}, which this vLLM does not have"
                     + ("" if drift.early or not drift.bridged else
                        " (bridged, but vllm_compat_startup.pth is not installed: reinstall vllm_compat)"))
    elif drift.blocking:
        lines.append(f"{indent}`import {drift.plugin}` reaches {', '.join(drift.blocking_names)}: bridged by "
                     f"{', '.join(sorted({drift.bridged_by(n) for n in drift.blocking_names}))}")
    if drift.import_ok:
        lines += render_entrypoints(drift, indent + "  ")
    return lines


ENTRYPOINT_STATUS_TEXT = {"works": "starts natively", "works_with_vllm_compat": "starts with vllm_compat",
                          "will_not_start": "WILL NOT START", "fails_on_request": "starts, FAILS ON REQUEST",
                          "absent": "not in this vllm-omni release", "left_out": "LEFT OUT"}


def render_entrypoints(drift, indent: str = "    ") -> list[str]:
    """One line per entrypoint (``entrypoints.ENTRYPOINTS``): whether it starts once the bridges act, the names a
    bridge provides for it, and below it each name that still stops it with its first importer. Doctor and check
    print the same lines."""
    if not drift.statuses:
        return []
    lines = [f"{indent[:-2] if len(indent) > 2 else ''}entrypoints (each followed through its module-level imports, "
             "bridges applied):"]
    width = max(len(st.label) for st in drift.statuses)
    for st in drift.statuses:
        line = f"{indent}{st.label:<{width}}  {ENTRYPOINT_STATUS_TEXT[st.status]}"
        lines.append(line + (f" (bridged: {', '.join(st.bridged)})" if st.bridged and st.starts else ""))
        if st.starts:
            lines += [f"{indent}  left out: {text} ({entries})" for text, entries in _by_text(st.left_out).items()]
        first = {}
        for u in drift.still_stopping(st.id):
            first.setdefault(u.target, u)
        lines += [f"{indent}  still stops it: {name} (in {first[name].importer}:{first[name].line}"
                  + ("; not installed here)" if name in st.not_installed else ")") for name in sorted(first)]
        lines += [f"{indent}  " + ("still stops it: " if f.effect(st.id) == "stops" else f"fails on {f.endpoint()}: ")
                  + f.describe() for f in st.drift]
        used = [f for f in st.when_used if f.effect(st.id) == "when_used"]
        if used:
            lines.append(f"{indent}  fails when used ({len(used)} use(s) of vLLM that no longer fit, in code its start "
                         f"does not run): " + "; ".join(f.describe() for f in used[:2])
                         + (f"; +{len(used) - 2} more (--json)" if len(used) > 2 else ""))
    return lines


# ------------------------------------------------------------------------------------------- the short screen

KIND_PLURALS = {"patch": "patches", "stand-in": "stand-ins", "alias": "aliases", "adapter": "adapters"}
VERBOSE_HINT = "--verbose: every drift point, reason and missing name; --json: all of it as data"


def render_summary(report: Report, head: list[str], dependencies, width: int = SHORT_WIDTH) -> str:
    """The short screen doctor and check print by default (issue 34): ``head`` (the title and versions lines, the
    caller's), then one line per entrypoint with its first reason and one line for what the started ones leave
    out, what vllm_compat does here (acting drift points by kind, their ids; every refused and disabled one),
    the dependency overrides with the install command, and the verdict, its first words and exit code those of
    ``report.verdict()``. No line is longer than ``width``: long lists are wrapped, single reasons shortened with
    "..."; about 15-25 lines for any pair. Everything left out here is in ``render_table`` and ``--json``."""
    width = max(width, MIN_WIDTH)
    lines = [line for text in head for line in _wrap(text, width, "    ")]
    verdict = report.verdict()
    if verdict.kind == "nothing_to_judge":  # no entrypoint, drift point or loader to speak of
        return "\n".join([*lines, "", *_wrap(f"  verdict: {verdict.text}", width, "    ")])
    drift = report.import_drift
    if drift is not None and not drift.import_ok:
        names = list(drift.still_blocking_names)
        lines += ["", _fit(f"  `import {drift.plugin}`: WILL NOT IMPORT ({names[0]} missing"
                           + (f", +{len(names) - 1} more" if len(names) > 1 else "") + ")", width)]
    elif drift is not None and drift.statuses:
        lines += ["", *_entrypoint_lines(drift, width)]
    lines += ["", *_headline_line(report.patches, width)]
    compat_at, compat = len(lines), _compat_lines(report.patches, width)
    lines += compat
    if report.runtime_error:
        lines.append(_fit(f"  runtime: {report.runtime_error}", width))
    if report.mismatches:
        lines.append(_fit(f"  MISMATCH static vs runtime ({len(report.mismatches)}): {report.mismatches[0]}", width))
    if dependencies is not None:
        lines += ["", *_dependency_lines(dependencies, width)]
    lines += ["", *_wrap(f"  verdict: {_short_verdict(report, verdict)}", width, "    "),
              *_wrap(f"  ({VERBOSE_HINT})", width, "   ")]
    id_lines = MAX_ID_LINES
    while len(lines) > SHORT_LINES and width >= SHORT_WIDTH and id_lines > 1:  # the budget: fewer lines of ids
        id_lines -= 1
        fewer = _compat_lines(report.patches, width, id_lines)
        lines[compat_at:compat_at + len(compat)], compat = fewer, fewer
    return "\n".join(lines)


HEADLINE_SAYS = {"patched": "{variant} patch", "skipped": "left alone", "pending": "pending",
                 "refused": "REFUSED, left unpatched", "disabled": "disabled"}


def _headline_line(patches, width: int) -> list[str]:
    """One line for the decision of the catalogue's headline drift point (``catalogue.HEADLINE``: the one
    vllm_compat began with): its label, what vllm_compat does and why ("LABEL: VARIANT patch: REASON", "LABEL: left
    alone: REASON"); the reason up to its first ";" where the whole does not fit, cut at a word where that does not
    either. Read from the decision alone (the short doctor imports no drift point); [] where it was not decided."""
    from .catalogue import HEADLINE

    entry_id, label = HEADLINE
    decision = next((d for d in patches if d.name == entry_id), None)
    if decision is None:
        return []
    head = f"  {label}: " + HEADLINE_SAYS.get(decision.action, decision.action).format(variant=decision.variant or "-")
    reason = decision.reason or ""
    for text in (reason, reason.split(";", 1)[0]):
        if len(head) + 2 + len(text) <= width:
            return [f"{head}: {text}" if text else head]
    line = f"{head}: {reason}"[:width - 3]
    return [(line.rsplit(" ", 1)[0] if " " in line[len(head) + 2:] else line).rstrip(",;:") + "..."]


def wrap_lines(lines, width: int) -> list[str]:
    """Every line at most ``width`` columns and nothing cut (``--verbose`` screens): a longer line breaks at spaces,
    each continuation under a table row's last column where that leaves 30 columns, else under the line's indent
    and four spaces; a word longer than the room breaks after a ".", "/", "," or "_" where one fits, else at the
    room."""
    import re

    wrapped = []
    for line in lines:
        if len(line) <= width:
            wrapped.append(line)
            continue
        indent = len(line) - len(line.lstrip())
        gaps = [m.end() for m in re.finditer(r"\S {2,}(?=\S)", line)]  # a table's columns
        hang = gaps[-1] if gaps and gaps[-1] <= width - MIN_WIDTH // 4 * 3 else min(indent + 4, width // 2)
        first, rest = _cut(line, width, hang)
        wrapped.append(first)
        while rest:
            piece, rest = _cut(" " * hang + rest, width, hang)
            wrapped.append(piece)
    return wrapped


def _cut(text: str, width: int, start: int) -> tuple[str, str]:
    """``text`` split into what fits ``width`` columns and the rest (stripped): at the last space past ``start``,
    else after the last ".", "/", "," or "_" past it, else at ``width``."""
    if len(text) <= width:
        return text.rstrip(), ""
    space = text.rfind(" ", start + 1, width + 1)
    if space > start:
        return text[:space].rstrip(), text[space:].strip()
    mark = max(text.rfind(c, start + 1, width) for c in "./,_")
    at = mark + 1 if mark > start else width
    return text[:at], text[at:].strip()


def _fit(text: str, width: int) -> str:
    """``text`` cut to ``width`` columns, ending in "..." where it was cut."""
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def _wrap(text: str, width: int, indent: str) -> list[str]:
    """``text`` wrapped at ``width``, continuation lines under ``indent``; words are never split (long module
    paths break at their own spaces only), and a word longer than a line is cut."""
    import textwrap

    return [_fit(line, width) for line in textwrap.wrap(text, width, subsequent_indent=indent,
                                                         break_long_words=False, break_on_hyphens=False)]


def _first(items, more: str = " more") -> str:
    """"a" or "a, +N more"."""
    items = list(items)
    return items[0] + (f", +{len(items) - 1}{more}" if len(items) > 1 else "")


_PARTS = frozenset(e.id for es in ENTRYPOINTS.values() for e in es if e.part_of)


def _first_reason(status) -> str:
    """What stops or fails one entrypoint, its first item: a package not installed here, a vLLM name no bridge
    provides, a behavioural drift nothing handles; for a started one, the first feature it leaves out."""
    if status.status in ("will_not_start", "left_out"):
        if status.not_installed:
            return f"{_first(status.not_installed)} not installed here"
        if status.missing_in_vllm:
            return f"{_first(status.missing_in_vllm)} missing"
        if status.stopping_drift:
            return _first([f.detail for f in status.stopping_drift])
        return ""
    if status.status == "fails_on_request":
        failing = [f for f in status.drift if f.effect(status.id) == "request"]
        return f"{', '.join(status.endpoints_failing)}: {_first([f.detail for f in failing])}"
    if status.starts and status.left_out:
        return "except " + _first(_feature_names(status.left_out))
    return ""


def _feature_names(left_out) -> list[str]:
    """The features (entry id, text) pairs leave out, each by its name: the text up to its first " (" ("vllm-omni's
    LLM / AR stages"), once each."""
    return list(dict.fromkeys(text.split(" (", 1)[0] for text in _by_text(left_out)))


def _except(started) -> str:
    """", except <feature> and <feature>" for what the started entrypoints leave out, else "": part of the verdict's
    first words, never a line beside it."""
    names = _feature_names(item for st in started for item in st.left_out)
    return f", except {_join(names)}" if names else ""


def _entrypoint_lines(drift, width: int) -> list[str]:
    """One line per entrypoint and per part of one (the LLM / AR stages: judged on every pair), each with its first
    reason: what stops it, or for one that starts the first feature it leaves out and how many more."""
    shown = [st for st in drift.all_statuses if not (st.id in _PARTS and st.status == "absent")]
    # what a shown part leaves out (or the part itself) is said on the part's line, not again on its parents'
    parts = [st for st in shown if st.id in _PARTS]
    said = {st.id for st in parts} | {item for st in parts for item in st.left_out}
    label_width = max(len(st.label) for st in shown)
    lines = []
    for st in shown:
        line = f"  {st.label:<{label_width}}  {ENTRYPOINT_STATUS_TEXT[st.status]}"
        own = st if st in parts else dataclasses.replace(st, left_out=tuple(
            item for item in st.left_out if item not in said and item[0] not in said))
        reason = _first_reason(own)
        joint = ", " if reason.startswith("except ") else ": "
        if reason and len(line) + 2 + len(reason) <= width:
            lines.append(f"{line}{joint}{reason}")
        else:  # the reason on its own line, shortened to one
            lines += [_fit(line, width)] + ([_fit(f"    {reason}", width)] if reason else [])
    return lines


MAX_ID_LINES = 5  # the acting drift points' lines on the short screen (its 25-line budget)
SHORT_LINES = 25  # the short screen's budget at the default width: past it the drift points' ids give way


def _compat_lines(patches, width: int, id_lines: int = MAX_ID_LINES) -> list[str]:
    """What vllm_compat does here: the acting drift points (counts by catalogue kind, then their ids, wrapped onto
    at most ``id_lines`` lines, the rest counted); pending ones counted; every refused one on a line with its
    reason; the disabled ones on one line."""
    from .catalogue import entry

    def kind(decision) -> str:
        try:
            return entry(decision.name).kind
        except KeyError:
            return "patch"

    acting = [d for d in patches if d.action == "patched"]
    by_kind: dict[str, int] = dict.fromkeys(KIND_PLURALS, 0)
    for d in acting:
        by_kind[kind(d)] = by_kind.get(kind(d), 0) + 1
    pending = sum(d.action == "pending" for d in patches)
    tail = f"; {pending} pending (target not installed)" if pending else ""
    if acting:
        kinds = ", ".join(f"{n} {KIND_PLURALS.get(k, k + 's') if n > 1 else k}" for k, n in by_kind.items() if n)
        head = f"  vllm_compat acts on {len(acting)} of {len(patches)} drift points ({kinds}){tail}: "
        names = [d.name for d in acting]
        lines = _wrap(head + ", ".join(names), width, "    ")
        shown = len(names)
        while len(lines) > max(id_lines, 1) and shown > 1:  # the rest by count: --verbose names every one
            shown -= 1
            lines = _wrap(head + ", ".join(names[:shown]) + f", +{len(names) - shown} more (--verbose)", width,
                          "    ")
    else:
        lines = _wrap(f"  vllm_compat: no drift point acts here ({len(patches)} checked){tail}", width, "    ")
    refused = [d for d in patches if d.action == "refused"]
    for d in refused[:3]:
        lines.append(_fit(f"  refused: {d.name} ({d.reason})", width))
    if len(refused) > 3:
        lines.append(f"  refused: +{len(refused) - 3} more (--verbose)")
    disabled = [d for d in patches if d.action == "disabled"]
    if disabled and len(disabled) == len(patches):
        lines.append(f"  disabled: all {len(disabled)} drift points (VLLM_COMPAT_DISABLE)")
    elif disabled:
        suffix = " (VLLM_COMPAT_DISABLE_PATCHES)"
        lines.append(_fit("  disabled: " + ", ".join(d.name for d in disabled), width - len(suffix)) + suffix)
    return lines


def _dependency_lines(dependencies, width: int) -> list[str]:
    """The conflicts' overrides (tested or not), then (check) what uv's resolution of the pair shows
    (``resolution.Resolution.short_text``: the files two resolved wheels both install, the override each takes),
    and the install command; "no conflict" when there is none."""
    resolution = dependencies.resolution
    resolved = f"; {resolution.short_text()}" if resolution is not None else ""
    if dependencies.ok:
        lines = _wrap(f"  dependencies: no conflict{resolved}", width, "    ")
    else:
        items = []
        for c in dependencies.conflicts:
            item = (f"{c.override} ({'tested' if c.proven_by else 'untested'})" if c.override
                    else f"{c.package} (no override named, --verbose)")
            items.append(item + (f" [installed: {c.installed}]" if c.installed else ""))
        count = len(dependencies.conflicts)
        lines = _wrap(f"  dependencies: {count} conflict{'s' if count > 1 else ''} a resolver will hit; "
                      f"override{'s' if len(items) > 1 else ''}: {'; '.join(items)}{resolved}", width, "    ")
    for text, indent in dependencies.install_texts():  # the install command, verified or said not to be
        lines += _wrap(text, width, indent)
    if dependencies.unread:
        lines.append(_fit(f"    not read: {_first(sorted(dependencies.unread))} (--verbose)", width))
    return lines


def _short_verdict(report: Report, verdict: Verdict) -> str:
    """``verdict.text`` in a sentence or two: the same first words (up to its first ":"), then the entrypoints
    by name and counts instead of every missing name and drift point."""
    drift = report.import_drift
    statuses = drift.statuses if drift is not None else ()
    started = [st for st in statuses if st.starts]
    stopped = [st for st in statuses if st.status == "will_not_start"]
    failing = [st for st in statuses if st.status == "fails_on_request"]
    acting = sum(d.action == "patched" for d in report.patches)
    handles = f"it handles {acting} drift point{'s' if acting != 1 else ''}" if acting else ""

    def start(sts) -> str:
        return _sentence(_join(st.label for st in sts)) + (" start" if len(sts) > 1 else " starts")

    if verdict.kind == "will_not_start" and drift is not None and not drift.import_ok:
        return ("WILL NOT START: vllm-omni will not import on this vLLM and vllm_compat has no bridge for it; "
                "nothing of it can run here.")
    if verdict.kind == "will_not_start":
        text = "WILL NOT START: " + _join(st.label for st in stopped) + "."
        if started:
            helped = any(st.status == "works_with_vllm_compat" for st in started) or acting
            text += f" {start(started)}" + (" with vllm_compat" if helped else "") + "."
        return text
    if verdict.kind == "fails_on_request":
        return ("FAILS ON REQUEST: " + "; ".join(f"{st.label} starts, but every {', '.join(st.endpoints_failing)} "
                                                 "request fails" for st in failing)
                + " and vllm_compat has nothing that handles it.")
    if verdict.kind == "refused":
        return ("ATTENTION: a target has a shape vllm_compat does not recognize and stays unpatched (refused, "
                "above); it may fail where the patch would have helped.")
    if verdict.kind in ("works_with_vllm_compat", "works_natively") and started:
        head = verdict.text.split(":", 1)[0]  # with ", except <what is left out>"
        every = "every entrypoint starts" if len(started) == len(statuses) else start(started)
        if ", except " in head:
            every += " without " + ("it" if len(_feature_names(i for st in started for i in st.left_out)) == 1
                                    else "them")
        if verdict.kind == "works_natively":
            return f"{head}: {every}; nothing needs patching."
        return f"{head}: {every}" + (f"; {handles}" if handles else "") + "."  # what is left out: the line above
    if verdict.kind == "works_with_vllm_compat":
        return f"WORKS WITH vllm_compat: {handles}."
    return verdict.text


def build_report(runtime: bool = False) -> Report:
    """Detect statically; with ``runtime`` also import, apply and compare, entry by entry. Decisions already made
    in this process are reported as they are; otherwise the static decision is what the hooks will do."""
    from .activate import apply, current_decisions
    from .config import read_controls
    from .decide import decided, plan
    from .detect.static import FactsOnFirstUse, SiteFacts, StaticSite

    site = StaticSite.installed()
    controls = read_controls()
    if not runtime:
        # The decisions alone, kept with the facts: the short screen reads no fact, and the facts (with the
        # drift-point modules their classes live in) are read when --verbose or --json asks for them.
        static_decisions, handles = decided(site, controls)
        static = SiteFacts("static", site.versions, FactsOnFirstUse(lambda: site.environment.facts))
        recorded = {d.name: d for d in current_decisions() if d.action != "pending"}
        patches = [recorded.get(d.name, d) for d in static_decisions]
        return Report(_dependency_drift=site.installed_dependency_drift, mode="static", static=static, patches=patches, _import_drift=site.installed_import_drift,
                      _behaviour_drift=lambda: site.behaviour_drift, _handles=handles)

    planned = plan(site, controls)
    static = SiteFacts("static", site.versions, {entry.id: facts for entry, facts, _ in planned})
    static_decisions = [decision for _, _, decision in planned]
    try:
        live = detect_runtime(planned)
    except Exception as exc:  # noqa: BLE001 - the point is to show the user what breaks a worker
        return Report(_dependency_drift=site.installed_dependency_drift, mode="runtime", static=static, patches=static_decisions,
                      runtime_error=f"importing vLLM / vllm-omni failed: {type(exc).__name__}: {exc}")
    applied = apply()
    return Report(_dependency_drift=site.installed_dependency_drift, mode="runtime", static=static, runtime=live,
                  patches=_with_pending_decided(applied, static_decisions),
                  mismatches=_runtime_mismatches(planned, live))


def _with_pending_decided(applied, static_decisions) -> list:
    """The runtime decisions, each still "pending" (its target not imported in this process: a parent package
    imports it later) replaced by the static decision, which its hook will carry out when the target is imported:
    a bridge that is on its way counts as the bridge it will be, as in static doctor."""
    from .decide import Action

    static = {d.name: d for d in static_decisions}
    return [dataclasses.replace(static[d.name], reason=f"{static[d.name].reason} (when its target is imported)")
            if d.action == Action.PENDING and d.name in static and static[d.name].action != Action.PENDING else d
            for d in applied]


def reported_facts(site) -> SiteFacts:
    """The static facts of the drift points that show any (``report_lines`` / ``report_fields``), for
    ``vllm-compat scan``: the others are not detected."""
    from .catalogue import CATALOGUE
    from .drift import DriftPoint

    shown = [e for e in CATALOGUE if type(e.point).report_fields is not DriftPoint.report_fields
             or type(e.point).report_lines is not DriftPoint.report_lines]
    return SiteFacts("static", site.versions, {e.id: site.facts(e.id, e.point.detect_static) for e in shown})


def detect_runtime(planned) -> SiteFacts:
    """The runtime pass: vLLM and vllm-omni imported, with the target of every drift point that asks for it
    (``DriftPoint.imported_by_doctor``), then each imported target's runtime facts. Hooks fire on the way, as in
    a worker."""
    import sys

    from .detect.runtime import import_optional
    from .detect.versions import installed_version

    for package in ("vllm", "vllm_omni"):
        import_optional(package)
    for entry, _, _ in planned:
        if entry.point.imported_by_doctor:
            import_optional(entry.target_module)
    facts = {entry.id: entry.point.detect_runtime(sys.modules[entry.target_module])
             for entry, _, _ in planned if sys.modules.get(entry.target_module) is not None}
    versions = {d: installed_version(d) for d in ("vllm", "vllm-omni", "torch")}
    return SiteFacts("runtime", versions, facts)


def _runtime_mismatches(planned, live: SiteFacts) -> list[str]:
    """Every entry whose target is imported: its static facts against the live ones."""
    mismatches = []
    for entry, static_facts, _ in planned:
        if entry.id in live.facts:
            mismatches += [f"{entry.id}: {m}" for m in entry.point.compare(static_facts, live.facts[entry.id])]
    return mismatches


def _catalogue_rows() -> list[dict]:
    from .catalogue import CATALOGUE

    return [entry.to_dict() for entry in CATALOGUE]
