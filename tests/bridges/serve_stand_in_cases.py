"""The checks every serving-layer module stand-in of vllm-omni 0.24.0's server (``bridges._module_stand_in``)
gets on the real wheels: the decision table, static and runtime facts agreeing, the real ModuleNotFoundError of
``import vllm_omni.entrypoints.openai.api_server`` without the bridge (reproduced first), the import with it, revert
removing exactly what it put there, and staying out where vLLM has the module. Each test file binds them to one
bridge (``cases(bridge_module)``)."""

from __future__ import annotations

import importlib
import importlib.util
import json

import pytest

from conftest import needs_startup_hook, needs_vllm, run_python
from tests.bridges.module_stand_in_cases import (
    check_install_uninstall_exact,
    check_stays_out,
    unpatched_import_error,
)
from vllm_compat.bridges import HostKind, StandInFacts
from vllm_compat.config import Controls
from vllm_compat.decide import Action, decide_entry
from vllm_compat.detect.static import StaticSite

SERVER = "vllm_omni.entrypoints.openai.api_server"


def serve_stops_elsewhere() -> list[str]:
    """What still stops vllm-omni's server in this env once every bridge decided here acts (the static check's
    serve entrypoint, as doctor reads it): where it is not empty, the server's import never reaches a later bridge's
    module (vLLM 0.30+ with vllm-omni 0.24.0: vllm.entrypoints.openai.engine.protocol, which no bridge provides)."""
    from vllm_compat.bridges import provided_by_decisions
    from vllm_compat.decide import plan

    site = StaticSite.installed()
    drift = site.installed_import_drift()
    if drift is None:
        return []
    provided = provided_by_decisions([decision for _, _, decision in plan(site, Controls())])
    bridged = drift.with_bridges(provided, early=True)
    return sorted({u.target for u in bridged.still_stopping("serve")} | set(bridged.still_blocking_names))


def cases(bridge, probe: str = SERVER) -> dict:
    """``probe``: the module whose import shows the drift (vllm-omni's server, or the old module itself where the
    server still needs more than this bridge on the vLLMs it serves)."""
    point = bridge.DRIFT_POINT
    static = point.detect_static(StaticSite.installed())
    host = getattr(static, "host", None)
    importers = getattr(static, "importers", ())
    facts_of = getattr(bridge, "facts_for_table", None) or StandInFacts
    importer = "vllm_omni.entrypoints.openai.api_server:1 (module)"
    needs_missing = pytest.mark.skipif(
        host != HostKind.LACKS or not importers or point.decide(static, Controls()).action != Action.PATCHED,
        reason=f"needs a vLLM without {point.old_module} (0.25+) where the bridge acts, with a vllm-omni that "
        f"imports it (0.24.0); here: vLLM {host} it, importers {list(importers) or 'none'}")
    if probe == SERVER and host == HostKind.LACKS:
        # vllm-omni's server imports torchvision and torchaudio, which CPU-torch cells uninstall
        stops = serve_stops_elsewhere() + [m for m in ("torchvision", "torchaudio") if importlib.util.find_spec(m) is None]
        needs_missing = pytest.mark.skipif(
            bool(stops) or host != HostKind.LACKS or not importers
            or point.decide(static, Controls()).action != Action.PATCHED,
            reason=f"needs a vLLM without {point.old_module} where the bridge acts and nothing else stops vllm-omni's "
            f"server before it (vLLM 0.25-0.29 with vllm-omni 0.24.0); here the server still stops on {stops[:3]}")
    needs_vllm_with_it = pytest.mark.skipif(
        host != HostKind.DEFINES, reason=f"needs a vLLM that has {point.first_missing} (0.24); here: {host}")
    missing = f"No module named '{point.first_missing}'"

    @pytest.mark.parametrize(("host_kind", "importing", "action"), [
        (HostKind.LACKS, True, Action.PATCHED), (HostKind.LACKS, False, Action.SKIPPED),
        (HostKind.DEFINES, True, Action.SKIPPED), (HostKind.NO_MODULE, True, Action.SKIPPED),
        (HostKind.ABSENT, False, Action.PENDING), (HostKind.UNKNOWN, True, Action.PENDING),
    ], ids=["lacks+imported", "lacks+unused", "defines", "no-parent", "no-vllm", "unknown"])
    def test_decision_table(host_kind, importing, action):
        facts = facts_of(host_kind, (importer,) if importing else ())
        decision = point.decide(facts, Controls())
        assert decision.action == action
        if action == Action.PATCHED:
            assert point.old_module in decision.provides
        disabled = Controls(disabled_patches=frozenset({point.id}))
        assert decide_entry(point.entry, facts, disabled).action == Action.DISABLED

    @needs_vllm
    def test_static_and_runtime_facts_agree():
        if host == HostKind.NO_MODULE:  # the files say the module is gone (vLLM 0.30+: openai.engine): so is it
            with pytest.raises(ModuleNotFoundError):
                importlib.import_module(point.target_module)
            return
        module = importlib.import_module(point.target_module)
        assert point.compare(static, point.detect_runtime(module)) == []

    @needs_missing
    def test_unpatched_server_import_fails_with_the_real_error():
        """Without this bridge (the others on), vllm-omni's server module dies on this module, as the bug report."""
        assert f"ModuleNotFoundError {missing}" in unpatched_import_error(f"import {probe}", point.id)

    @needs_missing
    @needs_startup_hook
    def test_server_imports_with_the_bridge_and_revert_removes_exactly_it():
        result = run_python(
            f"""
            import json, sys
            import {probe}
            import vllm_compat
            parent = sys.modules["{point.target_module}"]
            chain = {point.chain()!r}
            out = dict(marks=[getattr(sys.modules[n], "_vllm_compat_installed", None) for n in chain],
                       attribute=getattr(parent, "{point.target}") is sys.modules[chain[0]],
                       decision=[d.action for d in vllm_compat.current_decisions() if d.name == "{point.id}"])
            before, modules = set(vars(parent)), set(sys.modules)
            vllm_compat.revert()
            out["removed"] = sorted(before - set(vars(parent)))
            out["modules_removed"] = sorted(modules - set(sys.modules))
            try:
                import {point.old_module}
            except ImportError as exc:
                out["after_revert"] = str(exc)
            vllm_compat.apply()
            out["back"] = all(n in sys.modules for n in chain)
            print("RESULT", json.dumps(out))
            """, warm=True)
        assert result.returncode == 0, result.stderr[-3000:]
        out = json.loads(result.stdout.split("RESULT ", 1)[1])
        assert out["marks"] == [point.id] * len(point.chain()) and out["attribute"] and out["decision"] == ["patched"]
        assert point.target in out["removed"] and all(not n.startswith("vllm.") or n.startswith(
            "vllm.entrypoints") for n in out["removed"])
        assert set(point.chain()) <= set(out["modules_removed"])
        assert out["after_revert"] == missing and out["back"]

    @needs_missing
    def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
        check_install_uninstall_exact(point)

    @needs_vllm_with_it
    def test_stays_out_where_vllm_has_the_module():
        check_stays_out(point)

    return {name: value for name, value in locals().items() if name.startswith("test_")} | {
        "STATIC": static, "needs_missing": needs_missing}
