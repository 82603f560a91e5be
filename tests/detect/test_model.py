"""The loader classifier on real vllm-omni sources and on shapes no release has (source text only)."""

import textwrap

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, needs_omni
from vllm_compat.detect.static import SourceTree, installed_package_root
from vllm_compat.patches.diffusers_loader.facts import (
    LOADER_CLASS,
    LOADER_METHOD,
    OMNI_LOADER_FILE,
    LoaderKind,
    Param,
    VllmCapabilities,
    VllmLevel,
    classify_loader_source,
)

UNGATED = '''
class DiffusersPipelineLoader:
    def _process_weights_after_loading(self, model, target_device):
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_processing
        finalize_layerwise_processing(model, model_config=None)
        for _, module in model.named_modules():
            quant_method = getattr(module, "quant_method", None)
            if quant_method is None:
                continue
            original_devices = {}
            for name, param in module.named_parameters():
                if param.device.type != "meta" and param.device != target_device:
                    original_devices[name] = param.device
                    param.data = param.data.to(target_device)
            quant_method.process_weights_after_loading(module)
            for name, param in module.named_parameters():
                if name in original_devices:
                    param.data = param.data.to(original_devices[name])
'''


def classify(source):
    return classify_loader_source(source, LOADER_CLASS, LOADER_METHOD)


def test_ungated_first_fix_is_classified_ungated():
    assert classify(UNGATED).kind == LoaderKind.UNGATED


def test_method_source_alone_is_accepted_as_runtime_inspect_gives_it():
    method = UNGATED.split("class DiffusersPipelineLoader:\n", 1)[1]
    assert classify(textwrap.dedent(method)).kind == LoaderKind.UNGATED


@pytest.mark.parametrize(
    ("source", "detail"),
    [
        ("class DiffusersPipelineLoader:\n    def _process_weights_after_loading(self, model):\n"
         "        model.to('cpu')\n        x.process_weights_after_loading(model)\n", "signature is (self, model)"),
        ("class DiffusersPipelineLoader:\n    def _process_weights_after_loading(self, model, target_device, "
         "plan):\n        model.to('cpu')\n        x.process_weights_after_loading(model)\n", "expected"),
        ("class DiffusersPipelineLoader:\n    def load(self):\n        pass\n", "has no method"),
        ("class Other:\n    pass\n", "no class DiffusersPipelineLoader"),
        ("class DiffusersPipelineLoader:\n    def _process_weights_after_loading(self, model, target_device):\n"
         "        return None\n", "does not call process_weights_after_loading"),
        ("def broken(:\n", "does not parse"),
    ],
)
def test_shapes_no_release_has_are_unknown_with_the_reason(source, detail):
    shape = classify(source)
    assert shape.kind == LoaderKind.UNKNOWN
    assert detail in shape.detail


def test_extra_parameters_with_defaults_keep_the_shape():
    source = UNGATED.replace("(self, model, target_device)", "(self, model, target_device, *, plan=None)")
    shape = classify(source)
    assert shape.kind == LoaderKind.UNGATED and shape.params == ("self", "model", "target_device", "plan")


@needs_omni
def test_installed_vllm_omni_loader_file_classifies_as_its_release_ships():
    tree = SourceTree(installed_package_root("vllm_omni"))
    shape = classify(tree.read(OMNI_LOADER_FILE))
    expected = LoaderKind.LEGACY if Version(OMNI_VERSION) <= Version("0.24.0") else LoaderKind.GATED
    assert shape.kind == expected, shape


@pytest.mark.parametrize(
    ("caps", "level"),
    [
        (VllmCapabilities(installed=False), VllmLevel.ABSENT),
        (VllmCapabilities(installed=True, readable=False), VllmLevel.UNKNOWN),
        (VllmCapabilities(installed=True), VllmLevel.NO_META_DEVICE),
        (VllmCapabilities(installed=True, has_uses_meta_device=True), VllmLevel.META_DEVICE_WITHOUT_FINALIZE),
        (VllmCapabilities(installed=True, has_uses_meta_device=True, has_layerwise_finalize=True,
                          finalize_params=(Param("model"),)), VllmLevel.META_DEVICE_WITHOUT_FINALIZE),
        (VllmCapabilities(installed=True, has_uses_meta_device=True, has_layerwise_finalize=True,
                          finalize_params=(Param("model"), Param("model_config"))), VllmLevel.META_DEVICE_WITH_FINALIZE),
    ],
)
def test_level_names_follow_capabilities(caps, level):
    assert caps.level == level
