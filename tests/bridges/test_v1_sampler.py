"""The raising ``vllm.v1.sample.sampler`` / ``vllm.v1.sample.metadata`` module stand-ins on the real wheels: the
import of the removed module fails on vLLM 0.34 without them (the real ModuleNotFoundError, reproduced first, and
vllm-omni 0.30.0's diffusion worker with it), works with them, building ``Sampler()`` / ``SamplingMetadata()`` raises
``RemovedByVLLMError`` naming the removal, ``SamplingMetadata | None`` annotations evaluate, revert takes out exactly
them, and vLLM <= 0.33 keeps its own modules."""

from __future__ import annotations

import json

import pytest

from conftest import OMNI_VERSION, needs_startup_hook, needs_vllm, run_python
from tests.bridges import module_stand_in_cases as cases
from vllm_compat.bridges import HostKind, v1_sampler, v1_sampling_metadata
from vllm_compat.detect.static import StaticSite

SITE = StaticSite.installed()
POINTS = {"sampler": (v1_sampler.DRIFT_POINT, "Sampler"), "metadata": (v1_sampling_metadata.DRIFT_POINT,
                                                                        "SamplingMetadata")}
STATIC = {key: point.detect_static(SITE) for key, (point, _) in POINTS.items()}
MISSING = [key for key, facts in STATIC.items() if facts.host == HostKind.LACKS and facts.importers]
SHIPPED = [key for key, facts in STATIC.items() if facts.host == HostKind.DEFINES]
needs_missing_modules = pytest.mark.skipif(
    MISSING != list(POINTS), reason=f"needs vLLM >= 0.34 (no vllm.v1.sample.sampler / metadata) with a vllm-omni that "
    f"imports them; here: {', '.join(f'{k}: vLLM {f.host} it' for k, f in STATIC.items())}")
# vllm-omni 0.30.0's diffusion stage reaches both (config.pipeline_registry -> models.auk.auk, breeze_tts_2)
WORKER_NEEDS_THEM = OMNI_VERSION is not None and OMNI_VERSION.startswith("0.30.")


@pytest.mark.parametrize("key", list(POINTS))
@pytest.mark.parametrize(("facts", "action"), cases.DECISION_CASES, ids=cases.DECISION_IDS)
def test_decision_table(key, facts, action):
    cases.check_decision(POINTS[key][0], facts, action)


@needs_vllm
@pytest.mark.parametrize("key", list(POINTS))
def test_static_and_runtime_facts_agree(key):
    cases.check_static_and_runtime_agree(POINTS[key][0], STATIC[key])


@needs_missing_modules
@pytest.mark.parametrize("key", list(POINTS))
def test_unpatched_import_fails_with_the_real_module_not_found_error(key):
    """With this stand-in disabled (the others on): vllm-omni's import of the removed module fails."""
    point, name = POINTS[key]
    missing = f"ModuleNotFoundError No module named '{point.old_module}'"
    assert missing in cases.unpatched_import_error(f"from {point.old_module} import {name}", point.id)


@needs_missing_modules
@pytest.mark.skipif(not WORKER_NEEDS_THEM, reason=f"vllm-omni 0.30.0's diffusion stage reaches both modules; "
                    f"here vllm-omni {OMNI_VERSION}'s does not")
@pytest.mark.parametrize(("controls", "bridged"), [("on", True), ("disabled", False), ("entry-disabled", False)])
def test_the_diffusion_stage_needs_them_and_starts_only_while_they_act(controls, bridged):
    """The static import drift of the diffusion stage (worker, engine, stage process): both modules are what vLLM
    lacks on its import chain; they stop it only where the stand-ins do not act. (The import itself, past them,
    stops on this CPU cell where the native pair stops too: transformers' Qwen2-VL image processing needs
    torchvision, which CPU cells uninstall.)"""
    from vllm_compat.config import Controls
    from vllm_compat.decide import plan
    from vllm_compat.reporting import Report

    ids = frozenset(point.id for point, _ in POINTS.values())
    chosen = {"on": Controls(), "disabled": Controls(disabled=True),
              "entry-disabled": Controls(disabled_patches=ids)}[controls]
    report = Report(mode="static", static=SITE.environment, patches=[d for _, _, d in plan(SITE, chosen)])
    drift = report.import_drift
    for point, _ in POINTS.values():
        assert point.old_module in drift.worker_blocking_names
        assert (point.old_module in drift.still_worker_blocking_names) == (not bridged)


@needs_missing_modules
@needs_startup_hook
def test_imports_with_the_stand_ins_which_raise_when_used_and_revert_removes_them():
    result = run_python("""
        import json, sys
        from vllm.v1.sample.sampler import Sampler
        from vllm.v1.sample.metadata import SamplingMetadata
        import vllm_compat
        from vllm_compat.bridges._module_stand_in import RemovedByVLLMError
        out = dict(raised={})
        def sample(logits, sampling_metadata: SamplingMetadata | None = None):  # as vllm-omni's models annotate it
            return sampling_metadata
        for cls in (Sampler, SamplingMetadata):
            try:
                cls()
            except RemovedByVLLMError as exc:
                out["raised"][cls.__name__] = [isinstance(exc, NotImplementedError), str(exc)]
        package = sys.modules["vllm.v1.sample"]
        out["marks"] = [sys.modules["vllm.v1.sample.sampler"]._vllm_compat_installed,
                        sys.modules["vllm.v1.sample.metadata"]._vllm_compat_installed]
        out["decisions"] = sorted((d.name, d.action) for d in vllm_compat.current_decisions()
                                  if d.name in ("v1_sampler", "v1_sampling_metadata"))
        vllm_compat.revert()
        out["reverted"] = [hasattr(package, "sampler"), hasattr(package, "metadata"),
                           "vllm.v1.sample.sampler" in sys.modules, "vllm.v1.sample.metadata" in sys.modules]
        vllm_compat.apply()
        from vllm.v1.sample.sampler import Sampler as again
        out["back"] = again is Sampler
        print("RESULT", json.dumps(out))
        """, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    raised = out.pop("raised")
    assert sorted(raised) == ["Sampler", "SamplingMetadata"]
    for name, module in (("Sampler", "vllm.v1.sample.sampler"), ("SamplingMetadata", "vllm.v1.sample.metadata")):
        is_not_implemented, message = raised[name]
        assert is_not_implemented and f"vLLM 0.34 removed {module}" in message and "vLLM <= 0.33" in message
    assert out == {
        "marks": ["v1_sampler", "v1_sampling_metadata"],
        "decisions": [["v1_sampler", "patched"], ["v1_sampling_metadata", "patched"]],
        "reverted": [False, False, False, False], "back": True,
    }


@needs_missing_modules
@pytest.mark.parametrize("key", list(POINTS))
def test_install_is_idempotent_and_uninstall_removes_exactly_ours(key):
    cases.check_install_uninstall_exact(POINTS[key][0])


@pytest.mark.parametrize("key", list(POINTS))
def test_stays_out_where_vllm_ships_the_module(key):
    if key not in SHIPPED:
        pytest.skip(f"needs a vLLM that ships {POINTS[key][0].old_module} (<= 0.33); here: {STATIC[key].host}")
    cases.check_stays_out(POINTS[key][0])
