"""``vllm-compat check vllm==X PLUGIN==Y`` for a vLLM plugin other than vllm-omni: will this vLLM start it, read
from the two releases before either is installed (issue 40).

The plugin's entrypoints come from its own release (``detect.plugin_entrypoints.read_plugin``: each callable it
registers in vLLM's plugin groups, its startup hooks, the classes its platform names by string, and what vLLM itself
imports of it, ``host_references``); the generic import-drift scan (``detect.import_drift.check_import_drift``)
follows each through the plugin's module-level imports and says which vLLM names it reaches that this vLLM lacks.
The plugin's declared vLLM range (its ``Requires-Dist: vllm ...``) is a fact beside the verdict: whether the asked
vLLM is inside it, and where the reading and the range disagree, a line saying so (vllm-spyre 0.5.3 declares
``vllm>=0.9.2`` and breaks on 0.10.0; sendnn-inference 2.6.3 excludes vLLM 0.30.0, where the reading finds no
missing import).

vllm_compat's drift points and runtime bridges are vllm-omni's: for another plugin the check predicts and explains,
and acts on nothing. What it reads: imports, and attribute reads on vLLM values the plugin's annotations type
(``detect.function_uses``: an entrypoint that imports what it needs but reaches such a read of an attribute this vLLM
lacks "fails when run"). Call signatures are not read yet (plugins/README.md, wiring steps 3, 9, 10).

Exit codes, as for vllm-omni: 0 every entrypoint starts, 1 one will not start or fails when run, 2 bad input
(``check.run_check``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .check import CheckInput

STARTS, WILL_NOT_START, FAILS_WHEN_RUN = "starts", "will_not_start", "fails_when_run"


@dataclass
class PluginCheckResult:
    """One pair's answer: the inputs, the release's entrypoints as read (``release``), the package scanned, what
    vLLM imports of it (``host_refs``) and the import drift (``drift``: ``detect.import_drift.ImportDrift``)."""

    vllm: CheckInput
    plugin: CheckInput
    package: str
    host_refs: tuple
    drift: object
    # entrypoint id -> the reads of vLLM attributes this vLLM lacks in the modules it reaches
    # (``detect.function_uses.MissingUse``)
    reads: dict = field(default_factory=dict)

    @property
    def release(self):
        return self.plugin.release

    @property
    def statuses(self) -> tuple:
        return self.drift.statuses if self.drift is not None else ()

    @property
    def stopped(self) -> tuple:
        return tuple(s for s in self.statuses if s.status == "will_not_start")

    @property
    def failing(self) -> tuple:
        """The entrypoints that import what they need and reach code reading a vLLM attribute this vLLM lacks."""
        return tuple(s for s in self.statuses if s.status != "will_not_start" and self.reads.get(s.id))

    @property
    def kind(self) -> str:
        return WILL_NOT_START if self.stopped else FAILS_WHEN_RUN if self.failing else STARTS

    @property
    def exit_code(self) -> int:
        return 0 if self.kind == STARTS else 1

    @property
    def allows(self) -> bool | None:
        """Whether the declared range admits the asked vLLM; None when nothing is declared or a version is unknown."""
        return self.release.allows_vllm(self.vllm.version) if self.vllm.version else None

    @property
    def range_and_reading(self) -> str:
        """"agree", "disagree" (the range admits a vLLM the reading says will not start, or excludes one where the
        reading finds nothing missing) or "undeclared"."""
        if self.allows is None:
            return "undeclared"
        return "disagree" if self.allows == (self.kind != STARTS) else "agree"

    def _names(self) -> str:
        return f"{self.plugin.distribution} {self.plugin.version or '?'}"

    def range_lines(self) -> list[str]:
        """The declared range, whether the asked vLLM is inside it, and the disagreement where there is one."""
        declared, vllm = self.release.declared_vllm, self.vllm.version or "?"
        if declared is None:
            return [f"  declared vLLM range: none ({self._names()}'s metadata names no vllm requirement)"]
        where = {True: "inside it", False: "OUTSIDE it", None: "unknown (the version does not parse)"}[self.allows]
        condition = f"; only where {declared.marker}" if declared.marker else ""
        lines = [f"  declared vLLM range: vllm{declared.specifier or ' (any version)'} ({declared.source}{condition}); "
                 f"vLLM {vllm} is {where}"]
        if self.range_and_reading == "disagree" and self.allows:
            lines.append(f"  the reading and the range disagree: the range admits vLLM {vllm}, and the reading finds "
                         f"{len(self.stopped) + len(self.failing)} entrypoint(s) that will not start or fail "
                         "when run")
        elif self.range_and_reading == "disagree":
            lines.append(f"  the reading and the range disagree: the range excludes vLLM {vllm}, and the reading "
                         "finds nothing missing on any entrypoint's way (it reads imports and attribute reads on "
                         "typed vLLM values: the range may know of other drift)")
        return lines

    def verdict_text(self) -> str:
        started = [s for s in self.statuses if s.starts]
        if self.kind == STARTS:
            return (f"STARTS: each of {self._names()}'s {len(started)} entrypoint(s) imports what it needs from vLLM "
                    f"{self.vllm.version or '?'}, and no vLLM attribute its typed reads name is gone (call "
                    "signatures are not read for this plugin yet).")
        stops = "; ".join(f"{s.id} ({_count(s.missing, 1)} missing)" for s in self.stopped)
        fails = "; ".join(f"{s.id} ({_count(sorted({r.target for r in self.reads[s.id]}), 1)} gone)"
                          for s in self.failing)
        rest = [s.id for s in self.statuses if s.starts and s not in self.failing]
        rest = f" {', '.join(rest)} {'starts' if len(rest) == 1 else 'start'}." if rest else ""
        if not self.stopped:
            return f"FAILS WHEN RUN: {fails}.{rest}"
        return f"WILL NOT START: {stops}.{f' FAILS WHEN RUN: {fails}.' if fails else ''}{rest}"

    def lines(self, verbose: bool = False) -> list[str]:
        from .check import _first_use, _where

        versions = f"vllm {self.vllm.version or '?'} + {self._names()}"
        lines = [f"vllm-compat check: {versions} (read from the files, nothing installed)"]
        if verbose:
            lines += [f"  vllm    from {_where(self.vllm)}", f"  plugin  from {_where(self.plugin)}"]
        lines += self.range_lines()
        drift = self.drift
        lines += ["", f"  entrypoints (read from the release; each followed through its module-level imports: "
                      f"{drift.checked} vLLM imports of {self.package} checked, {drift.unknown} undecided):"]
        for status in self.statuses:
            said = {"works": "starts", "will_not_start": "WILL NOT START", "absent": "absent"}.get(
                status.status, status.status)
            if status in self.failing:
                said = "FAILS WHEN RUN"
            lines.append(f"    {status.id:<24}  {said}")
            lines.append(f"      {status.label}")
            entry = drift.entrypoint(status.id)
            blocking = [u for u in entry.blocking if u.target in status.missing] if entry is not None else []
            for use in _first_use(blocking):
                lines.append(f"      missing: {use['target']} (in {use['importer']}:{use['line']}, {use['reason']})")
            for use in _first_uses(self.reads.get(status.id, ())):
                lines.append(f"      {use.how} {use.target}{' inside a function' if use.how == 'imports' else ''}, "
                             f"which vLLM {self.vllm.version or '?'} lacks (in {use.module}:{use.line}, "
                             f"{use.function}: fails when it runs)")
        lacking = self.release.missing_for_host(self.host_refs)
        if lacking:
            lines.append(f"    vLLM {self.vllm.version or '?'} imports {len({r.module for r in lacking})} module(s) "
                         f"of {self.package} this release lacks (whether vLLM guards them is not read yet): "
                         + _count(sorted({f"{r.module} (in {r.importer}:{r.line})" for r in lacking}), 3))
        if not self.statuses:
            lines.append("    none found (no entry point, startup hook or named class; vLLM imports none of it)")
        lines += ["", f"  vllm_compat bridges nothing for {self.plugin.distribution}: its drift points are "
                      "vllm-omni's; this check predicts and explains.", "", f"  verdict: {self.verdict_text()}"]
        return lines

    def to_dict(self) -> dict:
        declared = self.release.declared_vllm
        return {
            "mode": "check",
            "plugin": {"distribution": self.plugin.distribution, "version": self.plugin.version,
                       "package": self.package, "packages": list(self.release.packages),
                       "read_from": self.release.source},
            "inputs": {"vllm": self.vllm.to_dict(), "plugin": self.plugin.to_dict()},
            "declared_vllm": None if declared is None else {
                "requirement": declared.requirement, "specifier": declared.specifier, "marker": declared.marker,
                "source": declared.source, "allows_asked_vllm": self.allows},
            "range_and_reading": self.range_and_reading,
            "release": self.release.to_dict(),
            "imported_by_vllm": [{"importer": r.importer, "line": r.line, "target": r.target, "how": r.how}
                                 for r in self.host_refs],
            "imported_by_vllm_missing": sorted({r.module for r in self.release.missing_for_host(self.host_refs)}),
            "import_drift": self.drift.to_dict(),
            "fails_when_run": {entry: [{"module": r.module, "function": r.function, "line": r.line, "how": r.how,
                                        "target": r.target} for r in reads] for entry, reads in self.reads.items()},
            "bridged_by_vllm_compat": False,
            "verdict": {"kind": self.kind, "text": self.verdict_text()},
            "exit_code": self.exit_code,
        }


def _count(names, shown: int) -> str:
    names = list(names)
    return ", ".join(names[:shown]) + (f", +{len(names) - shown} more" if len(names) > shown else "")


def _first_uses(uses) -> list:
    """One use per vLLM name: the first in module / line order."""
    first: dict[str, object] = {}
    for use in sorted(uses, key=lambda u: (u.module, u.line)):
        first.setdefault(use.target, use)
    return list(first.values())


def _package(release, entrypoints) -> str:
    """The top-level package the entrypoints start in (the one holding most of their roots; the first)."""
    roots = [root.split(".", 1)[0] for e in entrypoints for root in e.roots]
    return max(release.packages, key=lambda p: (roots.count(p), -release.packages.index(p)))


def run(vllm: CheckInput, plugin: CheckInput) -> PluginCheckResult:
    """Read ``plugin``'s entrypoints (and what ``vllm`` imports of it) and follow them through the import-drift
    scan against ``vllm``; see the module docstring. A release whose entrypoints are none (nothing registered,
    named or imported by vLLM) is judged by ``import <package>``."""
    from .detect.import_drift import check_import_drift
    from .detect.plugin_entrypoints import host_references
    from .entrypoints import Entrypoint, entrypoints_of

    release = plugin.release
    host_refs = host_references(vllm.tree, release.packages)
    entrypoints = entrypoints_of(release.packages[0], release, host_refs)
    package = _package(release, entrypoints)
    if not entrypoints:
        entrypoints = (Entrypoint("import", f"`import {package}`", (package,)),)
    entrypoints = tuple(e for e in entrypoints if any(r.split(".", 1)[0] == package for r in e.roots))
    drift = check_import_drift(plugin.tree, vllm.tree, package, entrypoints)
    return PluginCheckResult(vllm, plugin, package, host_refs, drift,
                             _function_uses(plugin, vllm, package, entrypoints))


def _function_uses(plugin: CheckInput, vllm: CheckInput, package: str, entrypoints) -> dict:
    """{entrypoint id: what the functions of the modules it reaches use of vLLM that this vLLM lacks}
    (``detect.function_uses``). A module the plugin imports by name in a function it reaches (``import_module(
    "kvcached.integration.vllm.autopatch")``, a ``dynamic_import`` row of the release) is reached too."""
    from .detect.function_uses import missing_uses
    from .detect.import_graph import plugin_graph
    from .entrypoints import called

    graph = plugin_graph(plugin.tree, package, "vllm", tuple(s for e in entrypoints for s in e.scripts))
    reach = {}
    for entrypoint in entrypoints:
        runs = [r for r in entrypoint.roots if r in graph.modules]
        runs += [called(s) for s in entrypoint.scripts if called(s) in graph.modules]
        modules = {m.removesuffix(" (functions)") for m in set().union(*map(graph.reached, runs))}
        while True:  # and the modules named by a dynamic import in a module reached
            more = {n.qualname for n in plugin.release.named if n.role == "dynamic_import"
                    and n.where.rpartition(".")[0] in modules and n.qualname in graph.modules} - modules
            if not more:
                break
            modules |= {m.removesuffix(" (functions)") for m in set().union(*map(graph.reached, more))}
        reach[entrypoint.id] = modules
    found = missing_uses(plugin.tree, vllm.tree, package, set().union(*reach.values()))
    return {entry: tuple(r for r in found if r.module in modules) for entry, modules in reach.items()
            if any(r.module in modules for r in found)}
