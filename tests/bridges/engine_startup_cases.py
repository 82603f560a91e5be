"""What both ``wait_for_engine_startup`` call adapters' tests check on the real wheels
(test_engine_startup_adapter.py: the diffusion stage's caller; test_stage_engine_startup_adapter.py:
``vllm_omni.engine.stage_engine_startup``'s four calls): the caller imported once, and in place / out of place /
uninstall, each against vLLM's own function."""

from __future__ import annotations

import importlib
import inspect

import pytest

import vllm_compat
from vllm_compat.bridges import is_ours
from vllm_compat.bridges._engine_startup_call import ADDRESSES_PARAMS, NAME, VARIANT
from vllm_compat.decide import Action
from vllm_compat.errors import PatchRefusedError


def import_caller(point):
    """The vllm-omni module that calls vLLM's function (imported once a test module: ~1 min on this machine), with
    vllm_compat applied (the startup hook did already where it is installed)."""
    name = point.entry.target_module
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in ("vllm", "vllm_omni"):
            raise  # a vLLM / vllm-omni name missing is this project's business: fail
        pytest.skip(f"{name} does not import in this env for a reason outside vLLM and vllm-omni: {exc} "
                    "(the matrix uninstalls torchvision, which PyPI builds for another torch)")
    vllm_compat.apply()
    return module


def vllm_function():
    from vllm.v1.engine import utils

    return utils.wait_for_engine_startup


def check_installed_on_import_and_uninstall_exact(point, caller):
    """Patched with the adapter's variant, wrapping vLLM's own function under the old parameters; apply() again
    changes nothing; revert() puts vLLM's function back exactly; apply() installs it again."""
    original = vllm_function()
    decision = {d.name: d for d in vllm_compat.apply()}[point.entry.id]
    assert decision.action == Action.PATCHED and decision.variant == VARIANT
    installed = caller.wait_for_engine_startup
    assert is_ours(installed, point.entry.id) and installed.__wrapped__ is original
    assert tuple(inspect.signature(installed).parameters) == ADDRESSES_PARAMS
    vllm_compat.apply()
    assert caller.wait_for_engine_startup is installed  # idempotent
    try:
        vllm_compat.revert()
        assert caller.wait_for_engine_startup is original
        assert point.uninstall(caller) is False
    finally:
        vllm_compat.apply()
    assert is_ours(caller.wait_for_engine_startup, point.entry.id)


def check_refuses_a_binding_that_is_not_vllms_function(point, caller, monkeypatch):
    monkeypatch.setattr(caller, NAME, lambda *args: None)
    with pytest.raises(PatchRefusedError, match=r"is <function .*<lambda>.*not vllm\.v1\.engine\.utils"):
        point.prepare(caller, point.detect_runtime(caller))


def check_stays_out_where_the_shapes_already_match(point, caller):
    decision = {d.name: d for d in vllm_compat.apply()}[point.entry.id]
    assert decision.action == Action.SKIPPED and "the way this vLLM takes it" in decision.reason
    assert caller.wait_for_engine_startup is vllm_function()
    assert point.uninstall(caller) is False
