"""F-meta: the diffusion loader against vLLM's real layerwise online processing, unpatched then patched.

The quant method is a CPU double (tests/support/online_quant.py); vLLM's layerwise machinery, its
``finalize_layerwise_processing``, and vllm-omni's loader methods are the real released code.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from conftest import needs_layerwise_finalize, needs_omni, needs_vllm

pytestmark = [needs_vllm, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def oq():
    return importlib.import_module("tests.support.online_quant")


@pytest.fixture(scope="module")
def loader_module():
    from vllm_compat.patches.diffusers_loader.facts import LOADER_MODULE

    try:
        return importlib.import_module(LOADER_MODULE)
    except ImportError as exc:
        pytest.skip(f"vllm-omni's loader does not import on this vLLM: {exc}")


@pytest.fixture(scope="module")
def shapes(loader_module):
    """(loader class, the unpatched original function, its shape)."""
    from vllm_compat.patches.diffusers_loader.facts import classify_loader_class, original_loader_function

    cls = loader_module.DiffusersPipelineLoader
    return cls, original_loader_function(cls), classify_loader_class(cls).kind


@pytest.fixture(scope="module")
def deps():
    from vllm_compat.patches.diffusers_loader import resolve_deps

    return resolve_deps()


def loaded_model(oq, online=True, stragglers=None, seed=0):
    model = oq.build_model(online=online, stragglers=oq.DEFAULT_STRAGGLERS if stragglers is None else stragglers)
    checkpoint = oq.make_checkpoint(model, seed)
    oq.load_checkpoint(model, checkpoint)
    return model, checkpoint


def assert_fully_processed(oq, model):
    assert oq.meta_param_names(model) == []
    for name, layer in oq.quant_layers(model).items():
        assert getattr(layer, oq.PROCESSED_FLAG, False), name
        assert layer._test_process_calls == 1, name
        assert layer.weight.dtype == oq.FP8_DTYPE and layer.weight.device == CPU, name


def assert_loaded_layers_match_checkpoint(oq, model, checkpoint):
    # Fully loaded, non-fused layers: the fp8 weight is exactly the quantized checkpoint tensor.
    stragglers = {s.layer for s in model.stragglers}
    for name, layer in oq.quant_layers(model).items():
        key = f"{name}.weight"
        if name in stragglers or key not in checkpoint:
            continue
        expected_weight, expected_scale = oq.quantize_fp8(checkpoint[key])
        assert torch.equal(layer.weight.view(torch.uint8), expected_weight.view(torch.uint8)), name
        assert torch.equal(layer.weight_scale, expected_scale), name


@needs_omni
def test_unpatched_legacy_loader_crashes_on_stragglers_and_the_patch_fixes_it(oq, shapes):
    cls, original, kind = shapes
    if kind != "legacy":
        pytest.skip(f"installed vllm-omni loader is {kind}; the crash reproduces on the legacy loader only")
    loader = object.__new__(cls)
    model, _ = loaded_model(oq)
    assert len(oq.meta_param_names(model)) == 2  # the two stragglers
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        original(loader, model, CPU)

    model, checkpoint = loaded_model(oq)
    from vllm_compat import apply

    [decision] = [d for d in apply() if d.name == "diffusers_loader_meta_device"]
    assert (decision.action, decision.variant) == ("patched", "meta_safe"), decision.reason
    loader._process_weights_after_loading(model, CPU)  # through the installed patch, bound as vllm-omni calls it
    assert_fully_processed(oq, model)
    assert_loaded_layers_match_checkpoint(oq, model, checkpoint)


@needs_omni
def test_meta_safe_matches_the_in_tree_gated_fix_bit_for_bit(oq, shapes, deps):
    cls, original, kind = shapes
    if kind != "gated":
        pytest.skip(f"installed vllm-omni loader is {kind}; the in-tree reference ships from vllm-omni 0.26.0")
    from vllm_compat.patches.diffusers_loader import process_meta_safe

    for online in (True, False):
        results = []
        for process in (original, lambda loader, model, device: process_meta_safe(loader, model, device, deps=deps)):
            with oq.deterministic_fill():
                model, _ = loaded_model(oq, online=online, stragglers=oq.DEFAULT_STRAGGLERS if online else ())
                process(object.__new__(cls), model, CPU)
            results.append({
                name: (p.dtype, p.device, p.shape, p.detach().view(torch.uint8).clone())
                for name, p in model.named_parameters()
            })
        reference, ours = results
        assert list(ours) == list(reference), f"online={online}"
        for name in reference:
            assert ours[name][:3] == reference[name][:3], name
            assert torch.equal(ours[name][3], reference[name][3]), f"{name} differs (online={online})"


@needs_layerwise_finalize  # "no param left on meta" needs vLLM's finalize; without it: tests/faults
def test_variants_on_the_installed_vllm_layerwise_machinery(oq, deps):
    """Without vllm-omni (newest vLLM): the variants themselves, on a loader-shaped object."""
    from vllm_compat.patches.diffusers_loader import process_legacy, process_meta_safe

    model, _ = loaded_model(oq)
    with pytest.raises(NotImplementedError, match="Cannot copy out of meta tensor"):
        process_legacy(oq.LoaderShaped(), model, CPU, deps=deps)

    model, checkpoint = loaded_model(oq)
    process_meta_safe(oq.LoaderShaped(), model, CPU, deps=deps)
    assert_fully_processed(oq, model)
    assert_loaded_layers_match_checkpoint(oq, model, checkpoint)


def test_meta_safe_processes_an_offline_model_like_legacy(oq, deps):
    from vllm_compat.patches.diffusers_loader import process_legacy, process_meta_safe

    models = []
    for process in (process_legacy, process_meta_safe):
        model, checkpoint = loaded_model(oq, online=False, stragglers=())
        process(oq.LoaderShaped(), model, CPU, deps=deps)
        assert_fully_processed(oq, model)
        models.append(model)
    for (name, a), (_, b) in zip(models[0].named_parameters(), models[1].named_parameters(), strict=True):
        assert torch.equal(a.view(torch.uint8), b.view(torch.uint8)), name


@needs_omni
def test_installed_method_forwards_extra_keyword_arguments(oq, shapes, deps):
    """Newer vllm-omni may add optional parameters: the patched method accepts and forwards them."""
    from vllm_compat.patches import diffusers_loader

    cls, original, _ = shapes

    class FutureLoader(cls):
        def _process_weights_after_loading(self, model, target_device, *, offload_plan=None):
            return original(self, model, target_device)

    calls = []

    def spy(loader, model, target_device, *, deps, **extras):
        calls.append((type(loader), model, target_device, extras))

    diffusers_loader.VARIANT_FUNCTIONS["spy"] = spy
    try:
        assert diffusers_loader.install_variant(FutureLoader, "spy", deps)
        model = torch.nn.Linear(1, 1)
        object.__new__(FutureLoader)._process_weights_after_loading(model, CPU, offload_plan="plan")
        FutureLoader._process_weights_after_loading(object.__new__(FutureLoader), model, CPU)  # unbound call
        patched = vars(FutureLoader)["_process_weights_after_loading"]
    finally:
        del diffusers_loader.VARIANT_FUNCTIONS["spy"]
        diffusers_loader.DRIFT_POINT.uninstall(FutureLoader)
    assert calls == [
        (FutureLoader, model, CPU, {"offload_plan": "plan"}),
        (FutureLoader, model, CPU, {}),
    ]
    assert vars(FutureLoader)["_process_weights_after_loading"] is patched.__wrapped__


def _completed_online_layer_model():
    """One online-quant layer that vLLM's layerwise loader already processed (``uses_meta_device``, the
    processed flag set), on CPU; its method's processing is a Mock that must not be called again."""
    from unittest import mock

    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    from vllm_compat.patches.diffusers_loader import PROCESSED_FLAG

    class CompletedOnline(QuantizeMethodBase):
        uses_meta_device = True

        def create_weights(self, *args, **kwargs):  # pragma: no cover - never created here
            raise AssertionError("not used")

        def apply(self, layer, x, bias=None):  # pragma: no cover - no forward here
            raise AssertionError("not used")

    layer = torch.nn.Linear(4, 4)
    layer.quant_method = CompletedOnline()
    layer.quant_method.process_weights_after_loading = mock.Mock()
    setattr(layer, PROCESSED_FLAG, True)
    return torch.nn.Sequential(layer), layer


def _assert_upstream_finalize_contract(monkeypatch, process, skips_processed: bool = True) -> None:
    """The contract vllm-omni's own loader tests check: finalize, replaced on vLLM's layerwise module after the
    loader is set up, is called once as ``(model, model_config=None)``; the completed layer is neither processed
    again nor moved. ``process(model, target_device)`` runs the method under test. ``skips_processed=False``: an
    in-tree method without the skip of completed layers (vllm-omni 0.26.0's), which processes the layer once more
    (its parameters moved to the target and back, the same tensors)."""
    from unittest import mock

    from vllm_compat.patches.diffusers_loader.facts import FINALIZE_MODULE, FINALIZE_NAME

    layerwise = pytest.importorskip(FINALIZE_MODULE, reason="this vLLM has no layerwise module (< 0.16)")
    model, layer = _completed_online_layer_model()
    weight, device = layer.weight, layer.weight.device
    stub = mock.Mock()
    monkeypatch.setattr(layerwise, FINALIZE_NAME, stub, raising=False)
    process(model, torch.device("cpu", 0))  # a target device other than the layer's: a move would show
    stub.assert_called_once_with(model, model_config=None)
    if skips_processed:
        layer.quant_method.process_weights_after_loading.assert_not_called()
    else:
        layer.quant_method.process_weights_after_loading.assert_called_once_with(layer)
    assert layer.weight is weight and layer.weight.device == device


def test_meta_safe_calls_a_finalize_stubbed_after_install_as_upstream_does(oq, deps, monkeypatch):
    """Fails on the shim that bound finalize at install time and called ``finalize(model, None)``."""
    from vllm_compat.patches.diffusers_loader import process_meta_safe

    _assert_upstream_finalize_contract(
        monkeypatch, lambda model, device: process_meta_safe(oq.LoaderShaped(), model, device, deps=deps))


@needs_omni
def test_installed_patch_meets_the_finalize_contract_like_the_in_tree_fix(shapes, deps, monkeypatch):
    """Through the real loader class with the meta_safe variant installed (forced where the loader is already
    gated), and, on a gated vllm-omni, its own in-tree method: the same contract on both."""
    from vllm_compat.patches import diffusers_loader

    cls, original, kind = shapes

    class Loader(cls):
        pass

    Loader._process_weights_after_loading = original
    assert diffusers_loader.install_variant(Loader, "meta_safe", deps)
    try:
        _assert_upstream_finalize_contract(
            monkeypatch, lambda model, device: object.__new__(Loader)._process_weights_after_loading(model, device))
    finally:
        diffusers_loader.DRIFT_POINT.uninstall(Loader)
    if kind == "gated":
        # vllm-omni 0.28.0+ skip a layer vLLM's layerwise loader already processed (vLLM's own flag, read from
        # their source); 0.26.0's gated method processes it again
        skips = "_already_called_process_weights_after_loading" in inspect.getsource(original)
        _assert_upstream_finalize_contract(monkeypatch, lambda model, device: original(object.__new__(cls), model,
                                                                                      device), skips)
