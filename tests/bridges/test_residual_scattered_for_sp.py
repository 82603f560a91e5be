"""The ``is_residual_scattered_for_sp`` stand-in on the real wheels: vllm-omni's AR model runner's import of it fails
on vLLM 0.32+ without it (the real ImportError, reproduced first), works with it, and the stand-in answers what vLLM
0.31.0's own function answers (the oracle: that function, read from vLLM 0.31.0's wheel and run here), on the
installed vLLM's own config too."""

from __future__ import annotations

import ast
import importlib
from types import SimpleNamespace

import pytest

from conftest import needs_startup_hook, needs_vllm
from tests.bridges import name_stand_in_cases as cases
from tests.support.wheels import wheel_or_skip
from vllm_compat.bridges import HostKind
from vllm_compat.bridges import residual_scattered_for_sp as bridge
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
TARGET = POINT.entry.target_path
# vllm-omni's own import statement (vllm_omni/worker/gpu_ar_model_runner.py), the name it needs
OMNI_IMPORT = f"from {POINT.entry.target_module} import {bridge.NAME}"
needs_missing_name = pytest.mark.skipif(
    STATIC.host != HostKind.LACKS or not STATIC.importers,
    reason=f"needs vLLM 0.32-0.33 (no {TARGET}) with a vllm-omni that imports it; here: vLLM {STATIC.host} it, "
    f"importers {list(STATIC.importers) or 'none'}")
needs_vllm_defining_it = pytest.mark.skipif(
    STATIC.host != HostKind.DEFINES, reason=f"needs a vLLM that defines {TARGET} (<= 0.31); here: {STATIC.host}")


def config(enable_sp, tp, graph_partition=False, splitting_ops=()):
    """What the function reads of a ``VllmConfig``; ``enable_sp=None``: a pass config without the switch (0.32+)."""
    pass_config = SimpleNamespace() if enable_sp is None else SimpleNamespace(enable_sp=enable_sp)
    return SimpleNamespace(
        compilation_config=SimpleNamespace(pass_config=pass_config, use_inductor_graph_partition=graph_partition,
                                           splitting_ops=list(splitting_ops)),
        parallel_config=SimpleNamespace(tensor_parallel_size=tp))


CONFIGS = {  # name: (config, num_input_tokens)
    "no-sp": (config(False, 4), 8), "sp-tp1": (config(True, 1), 7), "sp-tp2": (config(True, 2), 8),
    "sp-tp4-partitioned": (config(True, 4, graph_partition=True, splitting_ops=["attn"]), 16),
}
RAISES = {"sp-split-graph": (config(True, 2, splitting_ops=["attn"]), 8), "sp-unpadded": (config(True, 2), 7)}


def oracle():
    """vLLM 0.31.0's own ``is_residual_scattered_for_sp``, compiled from the cached wheel (never from the stand-in)."""
    from vllm_compat.detect.source_tree import SourceTree

    source = SourceTree(wheel_or_skip("vllm", "0.31.0")).read("vllm/v1/worker/utils.py")
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.FunctionDef) and n.name == bridge.NAME)
    node.args.args[0].annotation = None  # VllmConfig lives in the rest of the file
    namespace: dict = {}
    exec(compile(ast.Module([node], []), "vllm-0.31.0/vllm/v1/worker/utils.py", "exec"), namespace)
    return namespace[bridge.NAME]


@pytest.mark.parametrize(("facts", "action"), cases.DECISION_CASES, ids=cases.DECISION_IDS)
def test_decision_table(facts, action):
    cases.check_decision(POINT, facts, action)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_stand_in_answers_what_vllm_0_31_answers(name):
    vllm_config, tokens = CONFIGS[name]
    assert bridge.is_residual_scattered_for_sp(vllm_config, tokens) == oracle()(vllm_config, tokens)


@pytest.mark.parametrize("name", list(RAISES))
def test_a_config_vllm_0_31_refuses_is_refused_the_same_way(name):
    vllm_config, tokens = RAISES[name]
    with pytest.raises(AssertionError):  # its text: pytest rewrites the asserts of its plugin, vllm_compat
        bridge.is_residual_scattered_for_sp(vllm_config, tokens)
    with pytest.raises(AssertionError):
        oracle()(vllm_config, tokens)


@needs_vllm
def test_the_installed_vllms_own_config_is_answered():
    """On the installed vLLM's default ``VllmConfig`` (with two tensor-parallel ranks): not scattered; a vLLM
    without the sequence-parallel switch (0.32+) is answered as one with it off."""
    from vllm.config import DeviceConfig, VllmConfig

    vllm_config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    vllm_config.parallel_config.tensor_parallel_size = 2
    assert bridge.is_residual_scattered_for_sp(vllm_config, 8) is False


@needs_vllm
def test_static_and_runtime_facts_agree():
    module = importlib.import_module(POINT.entry.target_module)
    assert POINT.compare(STATIC, POINT.detect_runtime(module)) == []


@needs_missing_name
def test_unpatched_import_fails_with_the_real_import_error():
    """Without the stand-in (the other bridges on), vllm-omni's import statement dies on vLLM 0.32+."""
    cases.check_unpatched_import_fails(POINT, OMNI_IMPORT, bridge.NAME)


@needs_missing_name
@needs_startup_hook
def test_import_works_with_the_stand_in_and_revert_removes_exactly_it():
    cases.import_through_the_hook_and_revert(POINT, OMNI_IMPORT, bridge.NAME)


@needs_missing_name
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    cases.check_install_uninstall_exact(POINT, STATIC, importlib.import_module(POINT.entry.target_module))


@needs_vllm_defining_it
def test_stays_out_where_vllm_defines_it_and_vllm_s_own_answers_the_same():
    own = cases.check_stays_out_where_vllm_defines_it(POINT, importlib.import_module(POINT.entry.target_module))
    assert all(own(*CONFIGS[name]) == bridge.is_residual_scattered_for_sp(*CONFIGS[name]) for name in CONFIGS)
