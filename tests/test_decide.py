"""Every row of the decision table, starting from this env's real static detection."""

from dataclasses import replace

import pytest

from vllm_compat.catalogue import entry
from vllm_compat.config import Controls
from vllm_compat.decide import Action, decide_entry
from vllm_compat.patches.diffusers_loader.facts import (
    LoaderKind,
    LoaderShape,
    Param,
    VllmCapabilities,
    detect_static,
)

LOADER = entry("diffusers_loader_meta_device")

REAL = detect_static()
META_VLLM = VllmCapabilities(installed=True, has_uses_meta_device=True, has_layerwise_finalize=True,
                             finalize_params=(Param("model"), Param("model_config")))
OLD_VLLM = VllmCapabilities(installed=True)  # vLLM <= 0.16: no uses_meta_device


def env_with(kind, vllm=META_VLLM, omni_methods=()):
    return replace(REAL, vllm=vllm, loader=LoaderShape(kind, "test"), omni_meta_device_methods=omni_methods)


def decide(env, **controls):
    variant = controls.pop("loader_variant", None)
    switches = (("VLLM_COMPAT_LOADER_VARIANT", variant),) if variant else ()
    return decide_entry(LOADER, env, Controls(**controls, switches=switches))


@pytest.mark.parametrize(
    ("env", "controls", "action", "variant"),
    [
        (env_with(LoaderKind.LEGACY, OLD_VLLM), {}, Action.PATCHED, "legacy"),
        (env_with(LoaderKind.LEGACY, OLD_VLLM, ("vllm_omni.quantization.int8_config:X",)), {}, Action.PATCHED,
         "meta_safe"),
        (env_with(LoaderKind.LEGACY), {}, Action.PATCHED, "meta_safe"),
        (env_with(LoaderKind.UNGATED, OLD_VLLM), {}, Action.PATCHED, "meta_safe"),
        (env_with(LoaderKind.UNGATED), {}, Action.PATCHED, "meta_safe"),
        (env_with(LoaderKind.GATED), {}, Action.SKIPPED, None),
        (env_with(LoaderKind.GATED), {"loader_variant": "meta_safe"}, Action.PATCHED, "meta_safe"),
        (env_with(LoaderKind.GATED), {"loader_variant": "legacy"}, Action.PATCHED, "legacy"),
        (env_with(LoaderKind.UNKNOWN), {}, Action.REFUSED, None),
        (env_with(LoaderKind.UNKNOWN), {"strict": True}, Action.REFUSED, None),
        (env_with(LoaderKind.UNKNOWN), {"loader_variant": "meta_safe"}, Action.PATCHED, "meta_safe"),
        (env_with(LoaderKind.ABSENT), {}, Action.PENDING, None),
        (env_with(LoaderKind.ABSENT), {"loader_variant": "legacy"}, Action.PENDING, None),
        (env_with(LoaderKind.LEGACY), {"disabled": True, "loader_variant": "legacy"}, Action.DISABLED, None),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_decision_table_row(env, controls, action, variant):
    decision = decide(env, **controls)
    assert (decision.action, decision.variant) == (action, variant), decision.reason
    assert decision.reason


def test_refusal_tells_the_user_how_to_force():
    assert "VLLM_COMPAT_LOADER_VARIANT=meta_safe" in decide(env_with(LoaderKind.UNKNOWN)).reason


def test_real_environment_decision_is_explained():
    decision = decide(REAL)
    assert decision.action in {Action.PATCHED, Action.SKIPPED, Action.PENDING}
    assert decision.reason
