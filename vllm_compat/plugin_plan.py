"""``vllm-compat plan PLUGIN==Y`` for a vLLM plugin other than vllm-omni: ``plugin_check`` on each vLLM release, one
row each (issue 40).

Which vLLM releases: ``--vllm A,B`` as given; else the newest patch of each minor on the index (``plan.select_releases``)
from the lower bound of the plugin's declared vLLM range (its ``Requires-Dist: vllm>=...``), else from ``OLDEST``, up
to ``--upto`` (else the newest). Each row: whether the declared range admits that vLLM, the verdict, and the
entrypoints that will not start or fail when run, with the first missing name. What it reads is what ``check`` reads
for a plugin (``plugin_check``'s docstring says what that leaves out). Exit codes as ``plan``'s: 0 every release
read, 2 one could not be read or bad input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

OLDEST = "0.8.0"  # the oldest vLLM a plugin release without a declared range is planned from


@dataclass
class PluginRow:
    vllm: str
    in_range: bool | None = None  # None: nothing declared
    verdict: str = ""  # plugin_check's STARTS / WILL_NOT_START
    stopped: dict[str, list[str]] = field(default_factory=dict)  # entrypoint id -> missing names
    failing: dict[str, list[str]] = field(default_factory=dict)  # entrypoint id -> what its functions use, gone
    error: str | None = None

    def to_dict(self) -> dict:
        return {"vllm": self.vllm, "in_declared_range": self.in_range, "verdict": self.verdict,
                "will_not_start": self.stopped, "fails_when_run": self.failing, "error": self.error}


@dataclass
class PluginPlan:
    plugin: object  # check.CheckInput
    declared: str | None  # the declared requirement, as written
    rows: list[PluginRow]

    @property
    def newest_starting(self) -> str | None:
        found = [r.vllm for r in self.rows if r.error is None and not r.stopped and not r.failing]
        return found[-1] if found else None

    @property
    def exit_code(self) -> int:
        return 2 if any(r.error for r in self.rows) else 0

    def to_dict(self) -> dict:
        return {"mode": "plan", "plugin": self.plugin.to_dict(), "declared_vllm": self.declared,
                "rows": [r.to_dict() for r in self.rows], "newest_vllm_where_everything_starts": self.newest_starting,
                "exit_code": self.exit_code}


def _lower_bound(declared) -> str | None:
    """The version of a ``>=`` / ``==`` / ``~=`` clause of a declared range, the highest if several."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if declared is None or not declared.specifier:
        return None
    bounds = [s.version for s in SpecifierSet(declared.specifier) if s.operator in (">=", "==", "~=", ">")]
    return max(bounds, key=Version) if bounds else None


def make_plugin_plan(plugin, vllm_versions: list[str] | None = None, upto: str | None = None,
                     progress=None) -> PluginPlan:
    """The plan of ``plugin`` (a ``check.CheckInput`` whose ``release`` is read) over ``vllm_versions`` (see the module
    docstring). ``progress(row, index, count)`` is called after each row."""
    from . import plugin_check
    from .check import _index_input
    from .detect.wheels import WheelError, release_versions
    from .plan import select_releases

    declared = plugin.release.declared_vllm
    if vllm_versions is None:
        vllm_versions = select_releases(release_versions("vllm"), _lower_bound(declared) or OLDEST, upto)
    rows = []
    for index, version in enumerate(vllm_versions, 1):
        try:
            result = plugin_check.run(_index_input("vllm", version), plugin)
        except WheelError as exc:
            rows.append(PluginRow(version, error=str(exc)))
        else:
            rows.append(PluginRow(result.vllm.version or version, result.allows, result.kind,
                                  {s.id: sorted(s.missing) for s in result.stopped},
                                  {s.id: sorted({u.target for u in result.reads[s.id]}) for s in result.failing}))
        if progress is not None:
            progress(rows[-1], index, len(vllm_versions))
    return PluginPlan(plugin, declared.requirement if declared is not None else None, rows)


def _said(words: str, found: dict[str, list[str]]) -> str:
    """``WORDS: entrypoints; missing first (+n more)`` of one row's entrypoints."""
    missing = sorted({name for names in found.values() for name in names})
    more = f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""
    return f"{words}: {', '.join(found)}; missing {missing[0]}{more}"


def render(plan: PluginPlan, width: int | None = None) -> str:
    """``plan``'s screen for a plugin: one line per vLLM (in range, verdict, the entrypoints that stop and their
    first missing name), then the newest vLLM where every entrypoint starts."""
    from .reporting import MIN_WIDTH, SHORT_WIDTH, wrap_lines

    width = max(width or SHORT_WIDTH, MIN_WIDTH)
    plugin = plan.plugin
    first, last = (plan.rows[0].vllm, plan.rows[-1].vllm) if plan.rows else ("-", "-")
    lines = [f"vllm-compat plan: {plugin.distribution} {plugin.version} on vLLM {first} .. {last} (read from the "
             "files, nothing installed or imported)",
             f"  declared vLLM range: {plan.declared or 'none'}", ""]
    range_word = {True: "in range", False: "OUTSIDE", None: "-"}
    vllm_width = max([len(r.vllm) for r in plan.rows] + [4])
    lines.append(f"  {'vLLM':<{vllm_width}}  {'range':<8}  verdict")
    for r in plan.rows:
        if r.error:
            lines.append(f"  {r.vllm:<{vllm_width}}  {'':<8}  could not be checked: {r.error}")
            continue
        said = "; ".join(_said(words, found) for words, found in (("WILL NOT START", r.stopped),
                                                                    ("FAILS WHEN RUN", r.failing)) if found)
        lines.append(f"  {r.vllm:<{vllm_width}}  {range_word[r.in_range]:<8}  {said or 'starts'}")
    lines += ["", f"  newest vLLM where every entrypoint starts: {plan.newest_starting or 'none of these'}",
              f"  (each row as `vllm-compat check vllm==V {plugin.distribution}=={plugin.version}` says it; "
              "--json: the same as data)"]
    return "\n".join(wrap_lines(lines, width))
