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


# ---- the shared layer: Decision's report shape, the shared controls, plan ----

def test_decision_dict_has_provides_only_where_an_entry_names_some():
    from vllm_compat.decide import Decision

    plain = Decision("e", "m.n", Action.PATCHED, None, "why")
    assert plain.to_dict() == {"name": "e", "target": "m.n", "action": "patched", "variant": None, "reason": "why"}
    aliased = Decision("e", "m.n", Action.PATCHED, "v", "why", ("a.b", "c.d"))
    assert aliased.to_dict() == {"name": "e", "target": "m.n", "action": "patched", "variant": "v", "reason": "why",
                                 "provides": ["a.b", "c.d"]}


def test_the_shared_controls_come_first_and_say_which_switch():
    from vllm_compat.decide import DISABLED_REASON, disabled_decision

    assert disabled_decision(LOADER, Controls()) is None
    assert disabled_decision(LOADER, Controls(disabled_patches=frozenset({"another_entry"}))) is None
    everything = disabled_decision(LOADER, Controls(disabled=True))
    assert (everything.action, everything.reason) == (Action.DISABLED, DISABLED_REASON)
    assert "VLLM_COMPAT_DISABLE" in DISABLED_REASON
    listed = disabled_decision(LOADER, Controls(disabled_patches=frozenset({LOADER.id})))
    assert listed.action == Action.DISABLED and listed.name == LOADER.id
    assert LOADER.id in listed.reason and "VLLM_COMPAT_DISABLE_PATCHES" in listed.reason


def test_plan_detects_every_entry_through_the_site_and_saves_once():
    from vllm_compat.catalogue import CATALOGUE
    from vllm_compat.decide import plan

    class RecordingSite:
        def __init__(self):
            self.asked, self.saved = [], 0

        def facts(self, entry_id, detect):
            self.asked.append((entry_id, detect))
            return ("facts of", entry_id)

        def save(self):
            self.saved += 1

    site = RecordingSite()
    planned = plan(site, Controls(disabled=True))  # every decision is "disabled": the facts are not read
    assert [e.id for e, _, _ in planned] == [e.id for e in CATALOGUE]
    assert [a[0] for a in site.asked] == [e.id for e in CATALOGUE] and site.saved == 1
    for (entry_, facts, decision), (_, detect) in zip(planned, site.asked, strict=True):
        assert detect == entry_.point.detect_static, entry_.id
        assert facts == ("facts of", entry_.id) and decision.action == Action.DISABLED
