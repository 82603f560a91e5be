"""The ``_copy_missing_attrs`` stand-in on the real wheels: vllm-omni 0.24.0's int8 / mxfp8 / mxfp4 quant configs die at
import on vLLM 0.27+ without it (the real ImportError, reproduced first), import with it, and the stand-in copies what
vLLM 0.26's function copied (the same scenario runs on vLLM's own where vLLM <= 0.26 keeps it)."""

from __future__ import annotations

import importlib
import json

import pytest

from conftest import needs_startup_hook, needs_vllm, run_python
from tests.bridges import name_stand_in_cases as cases
from vllm_compat.bridges import HostKind, host_lookup
from vllm_compat.bridges import fp8_copy_missing_attrs as bridge
from vllm_compat.detect.static import StaticSite
from vllm_compat.errors import PatchRefusedError

SITE = StaticSite.installed()
STATIC = bridge.DRIFT_POINT.detect_static(SITE)
TARGET = bridge.DRIFT_POINT.entry.target_path
FP8 = bridge.DRIFT_POINT.entry.target_module
CONFIGS = ("vllm_omni.quantization.int8_config", "vllm_omni.quantization.mxfp8_config",
           "vllm_omni.quantization.mxfp4_config")
# The quant configs' other fp8 name: vLLM's own up to 0.27, bridged by moved_names on 0.28+.
COUNTER_LACKING = host_lookup(SITE.vllm_tree, FP8, "CopyNumelCounter") == HostKind.LACKS
needs_missing_name = pytest.mark.skipif(
    STATIC.host != HostKind.LACKS or not STATIC.importers,
    reason=f"needs vLLM >= 0.27 (no {TARGET}) with a vllm-omni that imports it (0.24.0); here: vLLM {STATIC.host} "
    f"it, importers {list(STATIC.importers) or 'none'}",
)
needs_vllm_defining_it = pytest.mark.skipif(
    STATIC.host != HostKind.DEFINES, reason=f"needs a vLLM that defines {TARGET} (<= 0.26); here: {STATIC.host}"
)


def import_error(name: str) -> str:
    return f"cannot import name '{name}' from '{FP8}'"


# One scenario for the stand-in and for vLLM's own (<= 0.26): what vllm-omni's quant methods do, a layer's weight
# (vLLM weight attrs set by set_weight_attrs, plus a plain attribute) copied onto the replacement parameter, which
# already has some of its own. ``copy`` is the function under test.
SCENARIO = """
def scenario(copy):
    import torch
    from vllm.model_executor.utils import set_weight_attrs

    def loader(param, loaded_weight):
        pass

    old = torch.nn.Parameter(torch.zeros(4, 2), requires_grad=False)
    set_weight_attrs(old, {"weight_loader": loader, "output_dim": 0, "input_dim": 1, "is_metadata": False})
    old.tp_note = "from old"
    new = torch.nn.Parameter(torch.ones(4, 2), requires_grad=False)
    set_weight_attrs(new, {"output_dim": 7})
    new.own = "kept"
    before = set(dir(new))
    expected_added = sorted(set(dir(old)) - before)
    copy(old, new)
    return dict(
        added=sorted(set(dir(new)) - before),
        expected_added=expected_added,
        loader_is_old=new.weight_loader is loader,
        output_dim=new.output_dim, input_dim=new.input_dim, is_metadata=new.is_metadata, tp_note=new.tp_note,
        own=new.own, data_kept=new.data.tolist() == torch.ones(4, 2).tolist(),
        old_untouched=not hasattr(old, "own") and old.output_dim == 0,
    )
"""
SCENARIO_RESULT = {
    "added": ["input_dim", "is_metadata", "tp_note", "weight_loader"],
    "expected_added": ["input_dim", "is_metadata", "tp_note", "weight_loader"],
    "loader_is_old": True, "output_dim": 7, "input_dim": 1, "is_metadata": False, "tp_note": "from old",
    "own": "kept", "data_kept": True, "old_untouched": True,
}


def run_scenario(copy) -> dict:
    namespace: dict = {}
    exec(SCENARIO, namespace)
    return namespace["scenario"](copy)


@pytest.mark.parametrize(("facts", "action"), cases.DECISION_CASES, ids=cases.DECISION_IDS)
def test_decision_table(facts, action):
    cases.check_decision(bridge.DRIFT_POINT, facts, action)


@needs_vllm
def test_static_and_runtime_facts_agree():
    cases.check_static_and_runtime_agree(bridge.DRIFT_POINT, STATIC)


@needs_missing_name
def test_unpatched_entry_quant_configs_fail_with_the_real_import_error():
    """Every other bridge on (``vllm_compat.apply()`` before the import, so ``import vllm_omni`` itself works), this
    one off: each quant config dies at its fp8 import, on ``_copy_missing_attrs``."""
    result = run_python(
        f"""
        import importlib, json
        import vllm_compat
        vllm_compat.apply()
        out = {{}}
        for name in {CONFIGS!r}:
            try:
                importlib.import_module(name)
            except ImportError as exc:
                out[name] = str(exc)
            else:
                out[name] = "IMPORTED"
        print("RESULT", json.dumps(out))
        """,
        env={"VLLM_COMPAT_DISABLE_PATCHES": bridge.DRIFT_POINT.entry.id},
        warm=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert all(message.startswith(import_error(bridge.NAME)) for message in out.values()), out


@needs_missing_name
def test_disabled_quant_configs_fail_with_the_real_import_error():
    """``VLLM_COMPAT_DISABLE=1``: nothing is bridged, so on vLLM 0.31+ ``import vllm_omni`` dies earlier (on
    RoutedExpertsLists); the quant config files are run from their paths (vllm-omni's real source, its package not
    imported) to reach their fp8 import. mxfp4_config imports only ``_copy_missing_attrs``; int8 / mxfp8 import
    ``CopyNumelCounter`` first, which vLLM 0.28+ lacks too (``moved_names`` is off)."""
    result = run_python(
        f"""
        import importlib.util, json, os
        import vllm_compat  # imported, and disabled: it must change nothing
        root = os.path.dirname(importlib.util.find_spec("vllm_omni").origin)
        out = {{}}
        for name in {CONFIGS!r}:
            path = os.path.join(root, "quantization", name.rsplit(".", 1)[1] + ".py")
            spec = importlib.util.spec_from_file_location(name, path)
            try:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            except ImportError as exc:
                out[name] = str(exc)
            else:
                out[name] = "IMPORTED"
        print("RESULT", json.dumps(out))
        """,
        env={"VLLM_COMPAT_DISABLE": "1"},
        warm=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    first = "CopyNumelCounter" if COUNTER_LACKING else bridge.NAME
    assert out[CONFIGS[2]].startswith(import_error(bridge.NAME)), out
    assert out[CONFIGS[0]].startswith(import_error(first)) and out[CONFIGS[1]].startswith(import_error(first)), out


@needs_missing_name
@needs_startup_hook
def test_quant_configs_import_with_the_stand_in_and_revert_removes_it():
    """The fixed run: a plain import of the three quant configs (the startup hook registered vllm_compat's hooks)
    works, the name they hold is the stand-in on vLLM's fp8 module and does what vLLM 0.26's did, revert() takes out
    exactly it and apply() puts it back."""
    result = run_python(
        SCENARIO + f"""
import importlib, json, sys
import vllm_compat
configs = [importlib.import_module(name) for name in {CONFIGS!r}]
fp8 = sys.modules[{FP8!r}]
copy = fp8._copy_missing_attrs
out = dict(
    same=[config._copy_missing_attrs is copy for config in configs],
    mark=copy._vllm_compat_installed,
    decision=[d.action for d in vllm_compat.current_decisions() if d.name == {bridge.DRIFT_POINT.entry.id!r}],
    scenario=scenario(configs[0]._copy_missing_attrs),
)
before = set(vars(fp8))
vllm_compat.revert()
out["removed"] = sorted(before - set(vars(fp8)))
out["added"] = sorted(set(vars(fp8)) - before)
vllm_compat.apply()
out["back"] = getattr(fp8, "_copy_missing_attrs", None) is copy
print("RESULT", json.dumps(out))
""",
        warm=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    # revert() takes out every bridge: on vLLM 0.28+ also moved_names' CopyNumelCounter alias, nothing of vLLM's
    also_bridged = ["CopyNumelCounter"] if COUNTER_LACKING else []
    assert out == {
        "same": [True, True, True], "mark": bridge.DRIFT_POINT.entry.id, "decision": ["patched"], "scenario": SCENARIO_RESULT,
        "removed": sorted([bridge.NAME, *also_bridged]), "added": [], "back": True,
    }


@needs_missing_name
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    def scenario_holds(copy):
        assert run_scenario(copy) == SCENARIO_RESULT

    cases.check_install_uninstall_exact(bridge.DRIFT_POINT, STATIC, importlib.import_module(FP8), scenario_holds)


@needs_missing_name
def test_refuses_where_set_weight_attrs_has_another_shape(monkeypatch):
    module = importlib.import_module(FP8)
    utils = importlib.import_module(bridge.HELPER_MODULE)
    monkeypatch.setattr(utils, bridge.HELPER, lambda weight, attrs, *, overwrite=False: None)
    with pytest.raises(PatchRefusedError, match=r"takes \('weight', 'attrs', 'overwrite'\), expected"):
        bridge.DRIFT_POINT.prepare(module, STATIC)
    monkeypatch.delattr(utils, bridge.HELPER)
    with pytest.raises(PatchRefusedError, match="set_weight_attrs is missing"):
        bridge.DRIFT_POINT.prepare(module, STATIC)


@needs_vllm_defining_it
def test_stays_out_where_vllm_defines_it_and_the_scenario_is_vllm_s_own():
    """vLLM <= 0.26: its own function is left in place, and the scenario the stand-in is held to gives the same
    result on it (the differential oracle)."""
    own = cases.check_stays_out_where_vllm_defines_it(bridge.DRIFT_POINT, importlib.import_module(FP8))
    assert run_scenario(own) == SCENARIO_RESULT
