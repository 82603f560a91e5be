"""The HSDP reordering processes each layer exactly once, with a quant method that does not flag what it processed.

vLLM's real offline FP8 methods quantize again when called twice (no ``_already_called_process_weights_after_loading``
check); the CPU double of ``tests/support/online_quant.py`` skips a flagged layer, so a second processing after
sharding could pass unseen with it. Here the method counts and re-quantizes on every call, as vLLM's offline ones do,
and the loader's ``_process_weights_after_loading`` is vllm-omni's real one (patched by
``diffusers_loader_meta_device`` or not, as this process has it). ``load_model`` is vllm-omni 0.24.0's order: load,
shard, then process (``_load_model_with_hsdp`` then ``_process_weights_after_loading``).
"""

from __future__ import annotations

import importlib

import pytest

from conftest import needs_omni

pytestmark = [needs_omni, pytest.mark.filterwarnings("ignore::DeprecationWarning")]
LAYERS = 3


def _no_flag_method(order: list):
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    class NoFlagOfflineFp8(QuantizeMethodBase):
        """Scales the weight on every call and counts the calls (no processed flag, as vLLM's offline methods)."""

        def create_weights(self, *args, **kwargs):  # the layers below register their own weight
            raise NotImplementedError

        def apply(self, layer, x, bias=None):
            raise NotImplementedError

        def process_weights_after_loading(self, layer):
            layer.process_calls += 1
            layer.weight.data.mul_(2.0)
            order.append(f"process:{layer.index}")

    return NoFlagOfflineFp8()


def _model(order: list):
    import torch
    from torch import nn

    class Layer(nn.Module):
        def __init__(self, index):
            super().__init__()
            self.index, self.process_calls = index, 0
            self.weight = nn.Parameter(torch.ones(2, 2), requires_grad=False)
            self.quant_method = _no_flag_method(order)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(Layer(i) for i in range(LAYERS))

    return Model()


def _legacy_loader(order: list):
    """vllm-omni's real loader class with ``load_weights`` recording, and vllm-omni 0.24.0's HSDP order."""
    module = importlib.import_module("vllm_omni.diffusion.model_loader.diffusers_loader")

    class Loader(module.DiffusersPipelineLoader):
        def __init__(self):  # no config: only the methods the reordering calls are used
            pass

        def load_weights(self, model, *args, **kwargs):
            order.append("load")
            self.loaded = (model, args, kwargs)
            return "loaded"

        def legacy_load_model(self, model, device, other=None):
            assert self.load_weights(model, "extra", key=1) == "loaded"
            order.append("shard")
            self._process_weights_after_loading(model, device)
            if other is not None:  # another model through the same loader: processed as usual
                self._process_weights_after_loading(other, device)
            return model

        def _load_model_with_hsdp(self, target_device):  # the method the reordering's contract asks for
            raise AssertionError("not called here")

        def load_model(self, load_device, load_format="default", custom_pipeline_name=None, device=None):
            """vllm-omni 0.24.0's signature; the model comes from the test."""
            return self.legacy_load_model(self.model, device)

    return Loader()


def test_each_layer_is_processed_once_before_sharding_and_never_after():
    import torch

    from vllm_compat.patches import hsdp_load_order

    order: list[str] = []
    loader, model = _legacy_loader(order), _model(order)
    device = torch.device("cpu")
    hsdp_load_order.load_with_processing_before_sharding(
        lambda *a, **k: loader.legacy_load_model(*a, **k), loader, device, (model, device), {})
    assert order == ["load", *(f"process:{i}" for i in range(LAYERS)), "shard"], order
    assert [layer.process_calls for layer in model.layers] == [1] * LAYERS
    assert all(torch.equal(layer.weight, torch.full((2, 2), 2.0)) for layer in model.layers)
    assert "load_weights" not in vars(loader) and "_process_weights_after_loading" not in vars(loader)
    assert loader.loaded == (model, ("extra",), {"key": 1})  # load_weights got the call as made


@pytest.mark.parametrize("use_hsdp", [True, False])
@pytest.mark.parametrize("device_given", [True, False])
def test_the_installed_wrapper_reorders_only_hsdp_calls_with_a_device(use_hsdp, device_given):
    """Through the drift point's own ``prepare`` / ``install`` on a subclass of vllm-omni's loader (the real class
    is left alone): an HSDP call with a device is reordered; without HSDP, or without a device, ``load_model`` runs
    as vllm-omni wrote it; ``uninstall`` puts the method back."""
    import types

    import torch

    from vllm_compat.decide import Action
    from vllm_compat.patches import hsdp_load_order

    order: list[str] = []
    loader, model = _legacy_loader(order), _model(order)
    owner = type(loader)
    original = vars(owner)["load_model"]
    point = hsdp_load_order.DRIFT_POINT
    decision = point.decision(Action.PATCHED, "test", hsdp_load_order.VARIANT)
    assert point.install(owner, decision, point.prepare(owner, None)) is True
    try:
        loader.model, loader.parallel_config = model, types.SimpleNamespace(use_hsdp=use_hsdp)
        kwargs = {"device": torch.device("cpu")} if device_given else {}
        assert loader.load_model("cpu", **kwargs) is model
    finally:
        assert point.uninstall(owner) is True
    assert vars(owner)["load_model"] is original
    processes = [f"process:{i}" for i in range(LAYERS)]
    if use_hsdp and device_given:
        assert order == ["load", *processes, "shard"], order
    else:
        assert order == ["load", "shard", *processes], order
    assert [layer.process_calls for layer in model.layers] == [1] * LAYERS


def test_prepare_refuses_a_load_model_without_a_device_parameter():
    from vllm_compat.errors import PatchRefusedError
    from vllm_compat.patches import hsdp_load_order

    owner = type(_legacy_loader([]))
    odd = type("Odd", (owner,), {"load_model": lambda self, load_device: None})
    with pytest.raises(PatchRefusedError, match="missing: \\['device'\\]"):
        hsdp_load_order.DRIFT_POINT.prepare(odd, None)
    no_hsdp = type("NoHsdp", (owner,), {"_load_model_with_hsdp": None, "load_model": vars(owner)["load_model"]})
    with pytest.raises(PatchRefusedError, match="lacks \\['_load_model_with_hsdp'\\]"):
        hsdp_load_order.DRIFT_POINT.prepare(no_hsdp, None)


def test_another_model_through_the_same_call_is_still_processed():
    import torch

    from vllm_compat.patches import hsdp_load_order

    order: list[str] = []
    loader, model, other = _legacy_loader(order), _model(order), _model([])
    device = torch.device("cpu")
    hsdp_load_order.load_with_processing_before_sharding(
        lambda *a, **k: loader.legacy_load_model(*a, **k), loader, device, (model, device), {"other": other})
    assert [layer.process_calls for layer in model.layers] == [1] * LAYERS
    assert [layer.process_calls for layer in other.layers] == [1] * LAYERS  # not skipped: not the loaded model


def test_unpatched_legacy_order_processes_after_sharding():
    """The reproduction: vllm-omni 0.24.0's order on its own processes each layer after the shard step."""
    import torch

    order: list[str] = []
    loader, model = _legacy_loader(order), _model(order)
    loader.legacy_load_model(model, torch.device("cpu"))
    assert order == ["load", "shard", *(f"process:{i}" for i in range(LAYERS))], order
