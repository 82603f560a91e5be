"""F-hsdp: the loader patch on FSDP2-sharded models (CPU, gloo, world size 1, real vLLM).

Setup (as in vllm-omni 0.24.0's HSDP path): load, then ``fully_shard`` every block and the root, then run
``_process_weights_after_loading`` on the *sharded* model.  Quant layers use
:class:`tests.support.fsdp_quant.InPlaceFp8Method`, which processes in place on the parameters FSDP manages
(the FSDP-compatible pattern); with ``online`` each block's first layer is vLLM online FP8 (meta weights,
processed by vLLM's real layerwise machinery while loading), which turns the loaders' online-quant path on.

Two target devices:

* ``cpu``: the params' own device, no move anywhere.
* ``cpu:0``: compares unequal to ``cpu``, and ``Tensor.to("cpu:0")`` makes a real copy, so it forces the
  per-module move (``module.to``) in the shim and the per-parameter ``.data`` move in the ungated fix.

Measured on CPU torch 2.13: ``param.data = other`` on a DTensor param is accepted and silently dropped (its
local shard stays the same object), while ``module.to`` swaps the DTensor in place and FSDP follows it.  So
the ungated fix's move to the target device never happens (processing runs on the shard where it was).  On
CPU that loses the move, not the values (there is no second real device).  Every test runs a forward after
processing and compares it with an unsharded model processed directly.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import textwrap

import pytest

from tests.conftest import OMNI_VERSION, needs_layerwise_finalize, needs_vllm

pytestmark = needs_vllm

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover - CPU wheels ship it
    pytest.skip("torch.distributed is unavailable", allow_module_level=True)
pytest.importorskip("torch.distributed.fsdp", reason="FSDP2 (fully_shard) needs torch >= 2.6")

from torch.distributed.tensor import DTensor  # noqa: E402

from tests.support import fsdp_quant as fq  # noqa: E402
from tests.support.online_quant import (  # noqa: E402
    FP8_DTYPE,
    HAS_FINALIZE,
    HAS_ONLINE_PROCESSING,
    PROCESSED_FLAG,
    LoaderShaped,
    quant_layers,
    ungated_process_weights_after_loading,
)
from vllm_compat.patches.diffusers_loader import VARIANT_FUNCTIONS, resolve_deps, uses_online_quant  # noqa: E402

DEPS = resolve_deps()

# vLLM >= 0.33 imports its online-quant kernels module (about 12 s on CPU) the first time a layer is processed
# layerwise; pay that once here, at collection, instead of inside whichever test loads an online layer first.
for _lazy in ("vllm.model_executor.layers.quantization.online.fp8",
              "vllm.model_executor.layers.quantization.online.moe_base"):
    try:
        importlib.import_module(_lazy)
    except ImportError:
        pass
X = torch.randn(3, 16, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
TARGETS = {"cpu": torch.device("cpu"), "cpu:0": torch.device("cpu", 0)}

online_param = pytest.mark.parametrize(
    "online",
    [
        False,
        pytest.param(True, marks=pytest.mark.skipif(
            not HAS_ONLINE_PROCESSING, reason="installed vLLM has no initialize_online_processing")),
    ],
    ids=["offline", "online"],
)
target_param = pytest.mark.parametrize("target", list(TARGETS), ids=list(TARGETS))
variant_param = pytest.mark.parametrize("variant", list(VARIANT_FUNCTIONS))


@functools.cache
def reference(online: bool):
    """``(checkpoint, raw output, processed output)`` of an unsharded model whose quant methods are called
    directly: the values every sharded run must reproduce."""
    model = fq.build(online)
    checkpoint = fq.make_checkpoint(model)
    fq.load(model, checkpoint)
    with torch.no_grad():
        raw = model(X)
        fq.process_unsharded(model)
        processed = model(X)
    return checkpoint, raw, processed


def sharded(online: bool):
    """Fresh model loaded with the reference checkpoint and FSDP2-sharded; plus each in-place layer's local
    storage before processing."""
    model = fq.build(online)
    fq.load(model, reference(online)[0])
    fq.shard(model)
    before = {name: fq.local_storage(layer.weight) for name, layer in fq.inplace_layers(model).items()}
    return model, before


def forward(model):
    with torch.no_grad():
        return model(X)


def assert_all_dtensor(model):
    plain = [name for name, p in model.named_parameters() if not isinstance(p, DTensor)]
    assert not plain, f"params no longer DTensors: {plain}"


def assert_processed_values(model, online: bool):
    """Each in-place layer's (full, world size 1) shard holds exactly the processed checkpoint values, and
    FSDP's forward computes with them."""
    checkpoint = reference(online)[0]
    for name, layer in fq.inplace_layers(model).items():
        weight, scale = fq.expected_processed(checkpoint[f"{name}.weight"])
        assert getattr(layer, PROCESSED_FLAG, False), name
        assert layer._test_process_calls == 1, name
        assert torch.equal(layer.weight.to_local(), weight), name
        assert torch.equal(layer.weight_scale.to_local(), scale), name
    for name, layer in quant_layers(model).items():
        if name not in fq.inplace_layers(model):
            assert online and layer.weight.dtype == FP8_DTYPE, name  # processed by vLLM while loading
    torch.testing.assert_close(forward(model), reference(online)[2], rtol=0, atol=0)


def moved_for_processing(model, before) -> dict[str, bool]:
    """Per in-place layer: did the quant method process a copy moved to the target device?"""
    return {name: layer._test_processed_storage != before[name] for name, layer in fq.inplace_layers(model).items()}


# ---------------------------------------------------------------------------------------------------------


@online_param
def test_reference_forward_tells_processed_from_raw(online):
    checkpoint, raw, processed = reference(online)
    assert not torch.equal(raw, processed), "forward cannot tell processed weights from raw ones"
    model, _ = sharded(online)
    assert_all_dtensor(model)
    torch.testing.assert_close(forward(model), raw, rtol=0, atol=0)  # sharding alone changes nothing
    assert uses_online_quant(model) is online


@variant_param
@online_param
@target_param
def test_shim_variant_keeps_processed_weights_on_fsdp(variant, online, target):
    model, before = sharded(online)
    VARIANT_FUNCTIONS[variant](LoaderShaped(), model, TARGETS[target], deps=DEPS)

    assert_all_dtensor(model)
    assert_processed_values(model, online)
    # cpu:0 forces a whole-module move: the quant method really worked on a copy on the target device, and
    # FSDP kept that copy (values above).  cpu: nothing moved.
    assert set(moved_for_processing(model, before).values()) == {target == "cpu:0"}


@needs_layerwise_finalize  # the ungated fix imports finalize unconditionally
@online_param
def test_ungated_fix_loses_the_target_device_move_on_dtensor_params(online):
    """Reproduction: the first upstream fix's per-parameter ``.data`` move does run on DTensor params (the
    target copy is real) but is silently dropped, so processing never happens on the target device."""
    model, before = sharded(online)
    target = TARGETS["cpu:0"]
    probe = next(iter(fq.inplace_layers(model).values())).weight
    assert fq.local_storage(probe.data.to(target)) != fq.local_storage(probe), "cpu:0 no longer forces a copy"
    locals_before = {name: p._local_tensor for name, p in model.named_parameters()}

    ungated_process_weights_after_loading(LoaderShaped(), model, target)

    # Every `param.data = param.data.to(target)` was dropped: same local shard objects as before ...
    assert all(p._local_tensor is locals_before[name] for name, p in model.named_parameters())
    # ... so every quant method processed the shard where it was, not a copy on the target device (the shim
    # variants do move: test_shim_variant_keeps_processed_weights_on_fsdp[cpu:0-...]).
    assert set(moved_for_processing(model, before).values()) == {False}
    # On CPU the values survive (processing went to FSDP's own shard); what is lost is the move itself.
    assert_all_dtensor(model)
    assert_processed_values(model, online)


# ---------------------------------------------------------------------------------------------------------
# vllm-omni's own in-tree method as a reference. Importing vllm_omni's loader module costs over a minute
# (it imports most of vllm-omni), so the method is compiled from the installed source file instead.


@functools.cache
def in_tree_method():
    if OMNI_VERSION is None:
        pytest.skip("vllm-omni is not installed in this env: no in-tree method to compare with")
    spec = importlib.util.find_spec("vllm_omni")
    path = os.path.join(next(iter(spec.submodule_search_locations)), "diffusion", "model_loader",
                        "diffusers_loader.py")
    source = open(path, encoding="utf-8").read()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == "DiffusersPipelineLoader":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "_process_weights_after_loading":
                    code = textwrap.dedent(ast.get_source_segment(source, item))
                    from torch import nn
                    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

                    namespace = {"torch": torch, "nn": nn, "QuantizeMethodBase": QuantizeMethodBase}
                    exec(compile(code, f"{path}:_process_weights_after_loading", "exec"), namespace)
                    return namespace["_process_weights_after_loading"], "has_online_quant" in code
    pytest.skip(f"vllm-omni {OMNI_VERSION}: DiffusersPipelineLoader._process_weights_after_loading not found")


@online_param
@target_param
def test_in_tree_method_agrees_with_shim_on_fsdp(online, target):
    method, gated = in_tree_method()
    model, before = sharded(online)
    method(LoaderShaped(), model, TARGETS[target])
    shim_model, _ = sharded(online)
    VARIANT_FUNCTIONS["meta_safe"](LoaderShaped(), shim_model, TARGETS[target], deps=DEPS)

    assert_all_dtensor(model)
    assert_processed_values(model, online)
    for (name, p), (shim_name, q) in zip(model.named_parameters(), shim_model.named_parameters(), strict=True):
        assert name == shim_name and torch.equal(p.to_local(), q.to_local()), name
    # Where the shim deliberately differs: vllm-omni's gated method (>= 0.26) still uses per-parameter
    # `.data` moves under online quant, so on sharded modules its target-device move is dropped.
    expect_moved = target == "cpu:0" and not (gated and online)
    assert set(moved_for_processing(model, before).values()) == {expect_moved}


@pytest.mark.skipif(not (HAS_ONLINE_PROCESSING and HAS_FINALIZE), reason="needs vLLM's layerwise finalize")
def test_sharded_stragglers_get_a_clear_error_instead_of_a_deep_type_error():
    from tests.support.online_quant import DEFAULT_STRAGGLERS, deterministic_fill, fsdp_model
    from vllm_compat.errors import UnsupportedLayoutError

    with deterministic_fill():
        model, _ = fsdp_model(stragglers=DEFAULT_STRAGGLERS)
    meta_before = [name for name, p in model.named_parameters() if p.device.type == "meta"]
    assert meta_before  # the stragglers were sharded while still on meta
    with pytest.raises(UnsupportedLayoutError, match=r"sharded \(FSDP/HSDP DTensor\) parameter\(s\) are still on meta") as err:
        VARIANT_FUNCTIONS["meta_safe"](LoaderShaped(), model, torch.device("cpu"), deps=DEPS)
    assert isinstance(err.value.__cause__, TypeError)  # vLLM's own error stays chained
    # Nothing was lost: the sharded stragglers are still there (on meta), every other layer as it was.
    assert [name for name, p in model.named_parameters() if p.device.type == "meta"] == meta_before
