"""F-hsdp-order: vllm-omni's real ``load_model`` with ``use_hsdp`` on CPU FSDP2 (gloo, world size 1 and 2).

vllm-omni <= 0.24.0 processes weights after ``prepare_fp8_layers_for_fsdp`` and ``apply_hsdp_to_model``; the
``hsdp_load_order`` entry makes it load -> process -> prepare -> shard, as vllm-omni >= 0.26 does. Each rank
runs ``tests/patches/_hsdp_order_worker.py`` (online, then offline quant) and compares its forward with the
same model processed unsharded. Unpatched (``VLLM_COMPAT_DISABLE_PATCHES=hsdp_load_order``) is the real
failure: processing after sharding, and a forward that does not use the processed weights or raises.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import pytest

from conftest import clean_env, needs_omni, needs_online_processing
from tests.support.warm_python import WARM

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

REPO = Path(__file__).resolve().parents[2]
LAYERS = 4  # 2 blocks x (first, second): one processing each
SCENARIOS = {"patched": {}, "unpatched": {"VLLM_COMPAT_DISABLE_PATCHES": "hsdp_load_order"}}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def order_shape():
    from vllm_compat.detect.static import StaticSite
    from vllm_compat.patches import hsdp_load_order

    return hsdp_load_order.DRIFT_POINT.detect_static(StaticSite.installed())


@pytest.fixture(scope="module")
def runs(order_shape, tmp_path_factory):
    """{(scenario, world_size): [result of each rank]}: every run started at once, then collected."""
    if order_shape.kind != "process_after_shard":
        pytest.skip(f"installed vllm-omni's HSDP path is {order_shape.kind} ({order_shape.detail}); the reordering "
                    "serves the process_after_shard shape (vllm-omni <= 0.24.0)")
    sys.path.insert(0, str(REPO))
    from tests.patches._hsdp_order_worker import write_checkpoint

    root = tmp_path_factory.mktemp("hsdp_order")
    write_checkpoint(root / "checkpoint")
    started = {}
    for scenario, extra_env in SCENARIOS.items():
        for world_size in (1, 2):
            port = _free_port()
            outs = [root / f"{scenario}-ws{world_size}-rank{rank}.json" for rank in range(world_size)]
            ranks = [
                WARM.start(["-m", "tests.patches._hsdp_order_worker", str(out), str(world_size), str(rank), str(port),
                            str(root / "checkpoint")], clean_env({**extra_env, "OMP_NUM_THREADS": "1"}), REPO,
                           timeout=900)
                for rank, out in enumerate(outs)
            ]
            started[(scenario, world_size)] = (ranks, outs)
    results = {}
    for key, (ranks, outs) in started.items():
        for rank in ranks:
            proc = rank.wait()
            assert proc.returncode == 0, f"{key}: worker failed:\n{proc.stderr[-3000:]}"
        results[key] = [json.loads(out.read_text()) for out in outs]
    return results


def _ranks(runs, scenario):
    for world_size in (1, 2):
        for rank, result in enumerate(runs[(scenario, world_size)]):
            yield f"ws{world_size}/rank{rank}", result


@needs_omni
def test_installed_vllm_omni_shape_is_detected_the_same_statically_and_live(order_shape):
    import importlib

    from vllm_compat.patches import hsdp_load_order
    from vllm_compat.patches.diffusers_loader.facts import LOADER_MODULE

    live = hsdp_load_order.DRIFT_POINT.detect_runtime(importlib.import_module(LOADER_MODULE))
    assert hsdp_load_order.DRIFT_POINT.compare(order_shape, live) == []
    assert order_shape.kind in ("process_after_shard", "process_before_shard"), order_shape


@pytest.mark.parametrize("quant", ["online", "offline"])
@needs_omni
@needs_online_processing
def test_unpatched_legacy_hsdp_processes_after_sharding_and_the_forward_misses_it(runs, quant):
    for where, result in _ranks(runs, "unpatched"):
        case = result[quant]
        assert result["decisions"]["hsdp_load_order"] == "disabled"
        assert case["load_error"] is None, where
        order = case["order"]
        assert order.index("shard") < max(i for i, step in enumerate(order) if step.startswith("process:")), order
        # The failure users meet: the forward raises, or it runs without the processed weights.
        failed = case["forward_error"] is not None or not case["forward_equals_processed_reference"]
        assert failed, f"{where} {quant}: unpatched forward used the processed weights: {case}"


@pytest.mark.parametrize("quant", ["online", "offline"])
@needs_omni
@needs_online_processing
def test_patched_hsdp_processes_before_sharding_and_the_forward_uses_it(runs, quant):
    for where, result in _ranks(runs, "patched"):
        case = result[quant]
        assert result["decisions"]["hsdp_load_order"] == "patched"
        assert case["load_error"] is None and case["forward_error"] is None, (where, case)
        processes = [step for step in case["order"] if step.startswith("process:")]
        assert case["order"] == ["load", *processes, "prepare", "shard"], (where, case["order"])
        assert len(processes) == LAYERS, (where, processes)  # each layer once: never again after sharding
        assert case["sharded_params"] > 0, where
        assert case["reference_processing_changes_output"], "the reference cannot tell processed from raw"
        assert case["forward_equals_processed_reference"] and case["max_abs_diff"] == 0.0, (where, case)
        assert set(case["applied_weight_dtypes"].values()) == {"torch.float8_e4m3fn"}, (where, case)
        assert case["shadows_left"] == [], where  # the per-call shadows are gone from the loader


# Shapes no release has (a future loader): the classifier and the decision on source text alone.
LEGACY = """
class DiffusersPipelineLoader:
    def load_model(self, load_device, load_format="default", custom_pipeline_name=None, device=None):
        model = self._load_model_with_hsdp(target_device=device)
        self._process_weights_after_loading(model, device)
    def _load_model_with_hsdp(self, target_device):
        self.load_weights(model)
        prepare_fp8_layers_for_fsdp(model)
        apply_hsdp_to_model(model, config, target_device=target_device)
"""
SHAPES = {
    "legacy": (LEGACY, "process_after_shard", "patched"),
    "fixed": (LEGACY.replace("        self.load_weights(model)\n",
                             "        self.load_weights(model)\n        self._process_weights_after_loading(m, d)\n"),
              "process_before_shard", "skipped"),
    "no_hsdp_path": ("class DiffusersPipelineLoader:\n    def load_model(self, load_device, device=None): ...\n",
                     "no_hsdp", "skipped"),
    "shards_elsewhere": (LEGACY.replace("        apply_hsdp_to_model(model, config, target_device=target_device)\n",
                                        "        self._shard(model)\n"), "unknown", "refused"),
    "no_load_model": ("class DiffusersPipelineLoader:\n    def _load_model_with_hsdp(self, d): ...\n", "unknown",
                      "refused"),
    "not_python": ("class DiffusersPipelineLoader(:\n", "unknown", "refused"),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_load_order_shapes_and_decisions(name):
    from vllm_compat.catalogue import entry
    from vllm_compat.config import Controls
    from vllm_compat.decide import decide_entry
    from vllm_compat.patches import hsdp_load_order

    source, kind, action = SHAPES[name]
    order = hsdp_load_order.classify_class_source(source)
    assert order.kind == kind, order
    decision = decide_entry(entry("hsdp_load_order"), order, Controls())
    assert decision.action == action, decision
    if action == "refused":
        assert "VLLM_COMPAT_DISABLE_PATCHES=hsdp_load_order" in decision.reason and order.detail in decision.reason
    assert decide_entry(entry("hsdp_load_order"), order, Controls(disabled_patches=frozenset({"hsdp_load_order"}))
                        ).action == "disabled"
