"""One report model, rendered for ``vllm-compat doctor`` (table and ``--json``), logs and the pytest header."""

from __future__ import annotations

from dataclasses import dataclass, field

from .detect.model import Environment, render_params
from .detect.versions import TESTED_VLLM_RANGE, is_tested_vllm


@dataclass
class Report:
    mode: str  # "static" (files only) or "runtime" (imported and applied)
    static: Environment
    patches: list  # Decisions
    runtime: Environment | None = None
    runtime_error: str | None = None
    mismatches: list[str] = field(default_factory=list)
    # Static import-drift check of vllm-omni against the installed vLLM (detect.import_drift); computed on
    # first use (~1 s), so header_line() stays cheap. None when vllm-omni or vLLM is absent.
    _import_drift: object = field(default=..., repr=False)

    @property
    def import_drift(self):
        if self._import_drift is ...:
            from ._startup import is_installed
            from .bridges import provided_by_decisions
            from .detect.import_drift import detect_import_drift

            drift = detect_import_drift()
            # Bridged names no longer count against import; only the startup hook bridges them in time for it.
            self._import_drift = drift and drift.with_bridges(provided_by_decisions(self.patches), is_installed())
        return self._import_drift

    @property
    def plugin_will_not_import(self) -> bool:
        return self.import_drift is not None and not self.import_drift.import_ok

    @property
    def environment(self) -> Environment:
        return self.runtime or self.static

    @property
    def exit_code(self) -> int:
        """0 when every target is handled or there is nothing to do; 1 on a refusal, a runtime failure,
        static and runtime detection disagreeing, or vllm-omni bound to fail on import (import drift)."""
        refused = any(d.action == "refused" for d in self.patches)
        return 1 if refused or self.mismatches or self.runtime_error or self.plugin_will_not_import else 0

    def to_dict(self) -> dict:
        env = self.environment
        data = {
            "mode": self.mode,
            "vllm": {
                "version": env.vllm_version,
                "level": env.vllm.level,
                "tested": is_tested_vllm(env.vllm_version),
                "capabilities": env.vllm.to_dict(),
            },
            "vllm_omni": {
                "version": env.vllm_omni_version,
                "loader_kind": env.loader.kind,
                "loader_detail": env.loader.detail,
                "meta_device_methods": list(env.omni_meta_device_methods),
                "quant_import_failures": list(env.omni_quant_import_failures),
            },
            "torch": {"version": env.torch_version},
            "patches": [d.to_dict() for d in self.patches],
            "catalogue": _catalogue_rows(),
            "import_drift": self.import_drift.to_dict() if self.import_drift is not None else None,
            "mismatches": list(self.mismatches),
            "runtime_error": self.runtime_error,
            "exit_code": self.exit_code,
        }
        return data

    def header_line(self) -> str:
        env = self.environment
        patches = ", ".join(f"{d.name}={d.action}" + (f"/{d.variant}" if d.variant else "") for d in self.patches)
        return (
            f"vllm-compat: vllm {env.vllm_version or 'absent'} ({env.vllm.level}), "
            f"vllm-omni {env.vllm_omni_version or 'absent'} (loader {env.loader.kind}); {patches}"
        )

    def render_table(self) -> str:
        env = self.environment
        caps = env.vllm
        yes = {True: "yes", False: "no"}
        tested = is_tested_vllm(env.vllm_version)
        tested_note = {True: "tested", False: "UNTESTED (outside {}-{})".format(*TESTED_VLLM_RANGE), None: ""}[tested]
        finalize = "no"
        if caps.has_layerwise_finalize:
            finalize = f"yes {render_params(caps.finalize_params)}" + (
                "" if caps.has_compatible_finalize else " INCOMPATIBLE: does not accept (model, model_config=None)")
        how = "read from files, nothing imported" if self.mode == "static" else "imported and applied live"
        lines = [
            f"vllm-compat doctor ({self.mode}: {how})",
            "",
            f"  vllm       {env.vllm_version or ('unknown version' if caps.installed else 'not installed'):<14} level: {caps.level}  {tested_note}".rstrip(),
        ]
        if caps.installed:
            lines.append(
                f"             uses_meta_device: {yes[caps.has_uses_meta_device]}   layerwise finalize: {finalize}"
                f"   initialize_online_processing: {yes[caps.has_initialize_online_processing]}"
            )
        omni_present = env.loader.kind != "absent"
        lines.append(f"  vllm-omni  {env.vllm_omni_version or ('unknown version' if omni_present else 'not installed'):<14} loader: {env.loader.kind}"
                     + (f" ({env.loader.detail})" if env.loader.detail else ""))
        if env.omni_meta_device_methods:
            names = ", ".join(m.rsplit(":", 1)[-1] for m in env.omni_meta_device_methods)
            lines.append(f"             own meta-device quant methods: {names}")
        lines += render_import_drift(self.import_drift)
        lines.append(f"  torch      {env.torch_version or 'not installed'}")
        lines.append("")
        width = max([len(d.name) for d in self.patches] + [5])
        variant_width = max([len(d.variant or "-") for d in self.patches] + [7])
        lines.append(f"  {'patch':<{width}}  {'action':<8}  {'variant':<{variant_width}}  why")
        for d in self.patches:
            lines.append(f"  {d.name:<{width}}  {d.action:<8}  {d.variant or '-':<{variant_width}}  {d.reason}")
        if self.mode == "static" and any(d.action == "patched" for d in self.patches):
            lines.append("  (static: 'patched' means it will be patched when its target module is imported)")
        if self.runtime_error:
            lines += ["", f"  runtime: {self.runtime_error}"]
        for mismatch in self.mismatches:
            lines.append(f"  MISMATCH static vs runtime: {mismatch}")
        lines += ["", f"  verdict: {self._verdict()}"]
        return "\n".join(lines)

    def _verdict(self) -> str:
        if self.plugin_will_not_import:
            return (f"FAIL: vllm-omni will not import on this vLLM ({', '.join(self.import_drift.still_blocking_names)} "
                    "missing); nothing of it can run here, patched or not.")
        if self.runtime_error:
            return "FAIL: the runtime check could not complete (see above)."
        if self.mismatches:
            return "FAIL: static and runtime detection disagree; please report it with this output."
        if any(d.action == "refused" for d in self.patches):
            return "ATTENTION: a target was refused; the worker runs unpatched (see 'why')."
        return "OK: every target is handled, or there is nothing to do."

    # ---- vllm-compat check (vllm_compat/check.py): a forecast for a vLLM / vllm-omni pair not installed ----

    def check_verdict(self, import_blocking=(), worker_blocking=(), bridged=()) -> CheckVerdict:
        """The check's verdict from this report's decisions and the missing vLLM names that still stop
        ``import vllm_omni`` (``import_blocking``) or its diffusion worker (``worker_blocking``) after the
        ``bridged`` ones. Will not start (1) when anything is still missing; refused (1) when a target was
        refused (doctor's exit code); else works with vllm_compat (0) when something is patched or bridged,
        works natively (0) when nothing needs to be; disabled (0) under VLLM_COMPAT_DISABLE."""
        if import_blocking:
            return CheckVerdict("will_not_start", 1, (
                f"WILL NOT START: `import vllm_omni` fails on this vLLM ({', '.join(import_blocking)} missing), "
                "and vllm_compat has no bridge for it."))
        if worker_blocking:
            return CheckVerdict("will_not_start", 1, (
                f"WILL NOT START: vllm_omni imports, but its diffusion worker does not ({', '.join(worker_blocking)} "
                "missing), and vllm_compat has no bridge for it."))
        if any(d.action == "refused" for d in self.patches):
            return CheckVerdict("refused", 1, (
                "ATTENTION: vllm-omni imports, but a target has a shape vllm_compat does not recognize and stays "
                "unpatched (see 'why'); it may fail where the patch would have helped."))
        if self.patches and all(d.action == "disabled" for d in self.patches):
            return CheckVerdict("disabled", 0, (
                "vllm_compat is disabled (VLLM_COMPAT_DISABLE): nothing would be patched; vllm-omni imports. Unset "
                "it to see what vllm_compat would do."))
        patched = [d.name for d in self.patches if d.action == "patched"]
        if patched or bridged:
            done = [f"patches {', '.join(patched)}"] * bool(patched) + [f"bridges {len(bridged)} name(s)"] * bool(bridged)
            return CheckVerdict("works_with_vllm_compat", 0, f"WORKS WITH vllm_compat: it {' and '.join(done)}.")
        return CheckVerdict("works_natively", 0, "WORKS NATIVELY: vllm-omni imports and nothing needs patching.")


@dataclass(frozen=True)
class CheckVerdict:
    """``Report.check_verdict``'s answer: kind ("works_natively", "works_with_vllm_compat", "will_not_start",
    "refused", "disabled"), the exit code and the sentence ``vllm-compat check`` prints."""

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
    return lines


def build_report(runtime: bool = False) -> Report:
    """Detect statically; with ``runtime`` also import, apply and compare, entry by entry. Decisions already made
    in this process are reported as they are; otherwise the static decision is what the hooks will do."""
    from .activate import apply, current_decisions
    from .config import read_controls
    from .detect.static import StaticSite
    from .patches import plan

    site = StaticSite.installed()
    planned = plan(site, read_controls())
    static_decisions = [decision for _, _, decision in planned]
    if not runtime:
        recorded = {d.name: d for d in current_decisions() if d.action != "pending"}
        patches = [recorded.get(d.name, d) for d in static_decisions]
        return Report(mode="static", static=site.environment, patches=patches)

    from .detect.runtime import detect_runtime

    try:
        live = detect_runtime()
    except Exception as exc:  # noqa: BLE001 - the point is to show the user what breaks a worker
        return Report(mode="runtime", static=site.environment, patches=static_decisions,
                      runtime_error=f"importing vLLM / vllm-omni failed: {type(exc).__name__}: {exc}")
    return Report(mode="runtime", static=site.environment, runtime=live, patches=apply(),
                  mismatches=_runtime_mismatches(planned))


def _runtime_mismatches(planned) -> list[str]:
    """Every entry whose target is imported: its static facts against the live ones."""
    import sys

    from .patches import drift_point

    mismatches = []
    for entry, static_facts, _ in planned:
        module = sys.modules.get(entry.target_module)
        if module is None:
            continue
        point = drift_point(entry)
        mismatches += [f"{entry.id}: {m}" for m in point.compare(static_facts, point.detect_runtime(module))]
    return mismatches


def _catalogue_rows() -> list[dict]:
    from .patches import CATALOGUE

    return [entry.to_dict() for entry in CATALOGUE]
