"""The HSDP load-order patch's classifier, decision, contract and wrapper, in the pytest process.

The shapes are vllm-omni's, written small here: 0.24.0's ``load_model`` runs ``_load_model_with_hsdp`` (load, prepare
FP8 layers, shard) and then ``_process_weights_after_loading``; 0.26+'s ``_load_model_with_hsdp`` processes before it
shards; a loader without ``_load_model_with_hsdp`` has no HSDP path. The wrapper runs on a loader class made here
(the patch's contract: ``load_model(self, load_device, ..., device=...)`` plus the three methods), with the steps
recorded, so what runs in which order and with which arguments is what is checked.
"""

from __future__ import annotations

import logging
import types

import pytest

from vllm_compat.decide import Action
from vllm_compat.detect.source_tree import SourceTree
from vllm_compat.detect.static import StaticSite
from vllm_compat.drift import variant_of
from vllm_compat.errors import PatchRefusedError
from vllm_compat.patches import hsdp_load_order as hsdp
from vllm_compat.patches.hsdp_load_order import LoadOrder, OrderKind

POINT = hsdp.DRIFT_POINT

LEGACY = '''
class DiffusersPipelineLoader:
    def load_model(self, load_device, load_format="default", device=None):
        model = self._load_model_with_hsdp(load_device)
        self._process_weights_after_loading(model, device)
        return model

    def _load_model_with_hsdp(self, target_device):
        model = build()
        self.load_weights(model)
        prepare_fp8_layers_for_fsdp(model)
        apply_hsdp_to_model(model)
        return model
'''
FIXED = LEGACY.replace("        prepare_fp8_layers_for_fsdp(model)\n",
                       "        self._process_weights_after_loading(model, target_device)\n"
                       "        prepare_fp8_layers_for_fsdp(model)\n")
NO_HSDP = LEGACY.split("    def _load_model_with_hsdp")[0]
NO_LOAD_MODEL = "class DiffusersPipelineLoader:\n    def _load_model_with_hsdp(self, d):\n        apply_hsdp_to_model(d)\n"
ODD = LEGACY.replace("        apply_hsdp_to_model(model)\n", "").replace(
    "        prepare_fp8_layers_for_fsdp(model)\n", "").replace("        self._process_weights_after_loading(model, device)\n",
                                                              "")


# ---- the classifier ----

def test_the_legacy_order_is_process_after_shard_naming_the_shard_calls():
    order = hsdp.classify_class_source(LEGACY)
    assert order.kind == OrderKind.PROCESS_AFTER_SHARD
    assert "(apply_hsdp_to_model, prepare_fp8_layers_for_fsdp)" in order.detail
    only_shard = hsdp.classify_class_source(LEGACY.replace("        prepare_fp8_layers_for_fsdp(model)\n", ""))
    assert only_shard.kind == OrderKind.PROCESS_AFTER_SHARD and "(apply_hsdp_to_model)" in only_shard.detail
    assert order.to_dict() == {"kind": OrderKind.PROCESS_AFTER_SHARD, "detail": order.detail}


@pytest.mark.parametrize(
    ("source", "kind", "named"),
    [(FIXED, OrderKind.PROCESS_BEFORE_SHARD, "_load_model_with_hsdp"),
     (NO_HSDP, OrderKind.NO_HSDP, "_load_model_with_hsdp"),
     (NO_LOAD_MODEL, OrderKind.UNKNOWN, "load_model"),
     ("class Other:\n    pass\n", OrderKind.UNKNOWN, "DiffusersPipelineLoader"),
     ("class DiffusersPipelineLoader(:\n", OrderKind.UNKNOWN, "line 1")],
    ids=["fixed", "no-hsdp", "no-load-model", "no-class", "syntax-error"],
)
def test_every_other_shape_says_what_was_found(source, kind, named):
    order = hsdp.classify_class_source(source)
    assert order.kind == kind and named in order.detail, order


def test_an_unrecognized_order_lists_only_the_calls_that_matter():
    order = hsdp.classify_class_source(ODD)
    assert order.kind == OrderKind.UNKNOWN
    assert "_load_model_with_hsdp calls ['load_weights'] and load_model calls ['_load_model_with_hsdp']" in order.detail


def test_a_method_defined_in_the_class_body_source_is_indented_source():
    indented = "\n".join("    " + line for line in LEGACY.splitlines())
    assert hsdp.classify_class_source(indented).kind == OrderKind.PROCESS_AFTER_SHARD


# ---- static and runtime detection ----

def test_static_detection_without_vllm_omni_is_absent_and_pending(tmp_path):
    site = StaticSite(SourceTree(tmp_path / "vllm"), SourceTree(tmp_path / "omni"))
    order = POINT.detect_static(site)
    assert order.kind == OrderKind.ABSENT and "not installed" in order.detail
    decision = POINT.decide(order, None)
    assert decision.action == Action.PENDING and order.detail in decision.reason and "imported" in decision.reason


def test_static_detection_reads_the_loader_module_file(tmp_path):
    relpath = POINT.target_module.replace(".", "/") + ".py"
    path = tmp_path / "omni" / relpath
    path.parent.mkdir(parents=True)
    path.write_text(LEGACY)
    site = StaticSite(SourceTree(tmp_path / "vllm"), SourceTree(tmp_path / "omni"))
    assert POINT.detect_static(site) == hsdp.classify_class_source(LEGACY)


class LegacyShape:
    """vllm-omni 0.24.0's two methods, as code (inspect reads them from this file)."""

    def load_model(self, load_device, load_format="default", device=None):
        model = self._load_model_with_hsdp(load_device)
        self._process_weights_after_loading(model, device)
        return model

    def _load_model_with_hsdp(self, target_device):
        model = object()
        self.load_weights(model)
        apply_hsdp_to_model(model)  # noqa: F821 - read, never run
        return model


def _module(**names):
    module = types.ModuleType("scratch_loader")
    vars(module).update(names)
    return module


def test_runtime_detection_reads_the_class_s_methods():
    cls = type("DiffusersPipelineLoader", (LegacyShape,), {})
    assert POINT.detect_runtime(_module(DiffusersPipelineLoader=cls)).kind == OrderKind.PROCESS_AFTER_SHARD
    no_hsdp = type("DiffusersPipelineLoader", (), {"load_model": LegacyShape.load_model})
    assert POINT.detect_runtime(_module(DiffusersPipelineLoader=no_hsdp)).kind == OrderKind.NO_HSDP


@pytest.mark.parametrize("value", [None, 1, "DiffusersPipelineLoader"], ids=["absent", "int", "str"])
def test_runtime_detection_without_the_class(value):
    module = _module() if value is None else _module(DiffusersPipelineLoader=value)
    order = POINT.detect_runtime(module)
    assert order.kind == OrderKind.UNKNOWN and "scratch_loader" in order.detail and "DiffusersPipelineLoader" in order.detail


def test_runtime_detection_without_source_or_with_a_lambda():
    namespace = {}
    exec("class DiffusersPipelineLoader:\n    def load_model(self, load_device, device=None):\n        pass\n",  # noqa: S102
         namespace)
    order = POINT.detect_runtime(_module(DiffusersPipelineLoader=namespace["DiffusersPipelineLoader"]))
    assert order.kind == OrderKind.UNKNOWN and "unavailable" in order.detail
    lam = type("DiffusersPipelineLoader", (), {"load_model": lambda self, load_device, device=None: None})
    order = POINT.detect_runtime(_module(DiffusersPipelineLoader=lam))
    assert order.kind == OrderKind.UNKNOWN and "no method load_model" in order.detail


def test_compare_is_by_kind():
    assert POINT.compare(LoadOrder(OrderKind.NO_HSDP, "a"), LoadOrder(OrderKind.NO_HSDP, "b")) == []
    (line,) = POINT.compare(LoadOrder(OrderKind.NO_HSDP), LoadOrder(OrderKind.UNKNOWN))
    assert f"{OrderKind.NO_HSDP} != {OrderKind.UNKNOWN}" in line


# ---- the decision ----

def test_the_decision_per_shape():
    patched = POINT.decide(LoadOrder(OrderKind.PROCESS_AFTER_SHARD, "d"), None)
    assert (patched.action, patched.variant) == (Action.PATCHED, "process_before_shard")
    assert "after sharding" in patched.reason
    for kind in (OrderKind.PROCESS_BEFORE_SHARD, OrderKind.NO_HSDP):
        skipped = POINT.decide(LoadOrder(kind, f"detail of {kind}"), None)
        assert (skipped.action, skipped.reason, skipped.variant) == (Action.SKIPPED, f"detail of {kind}", None)
    refused = POINT.decide(LoadOrder(OrderKind.UNKNOWN, "what was found"), None)
    assert refused.action == Action.REFUSED and "(what was found)" in refused.reason
    assert f"VLLM_COMPAT_DISABLE_PATCHES={POINT.id}" in refused.reason
    pending = POINT.decide(LoadOrder(OrderKind.ABSENT, "not here"), None)
    assert pending.action == Action.PENDING and pending.reason.startswith("not here;")


# ---- the contract and the wrapper ----

def _loader_class(steps: list):
    class Loader:
        def __init__(self, parallel_config=None):
            if parallel_config is not None:
                self.parallel_config = parallel_config

        def load_weights(self, model, *args, **kwargs):
            steps.append(("load", model, args, kwargs))
            return "loaded"

        def _process_weights_after_loading(self, model, device, **kwargs):
            steps.append(("process", model, device, kwargs))

        def _load_model_with_hsdp(self, target_device):
            model = types.SimpleNamespace(name="model")
            assert self.load_weights(model, "extra", key=1) == "loaded"
            steps.append(("shard", model))
            return model

        def load_model(self, load_device, load_format="default", custom_pipeline_name=None, device=None):
            steps.append(("load_model", load_device, load_format, device))
            model = self._load_model_with_hsdp(load_device)
            self._process_weights_after_loading(model, device)
            return model

    return Loader


@pytest.fixture
def patched():
    steps: list = []
    owner = _loader_class(steps)
    original = vars(owner)["load_model"]
    decision = POINT.decision(Action.PATCHED, "test", hsdp.VARIANT)
    assert POINT.install(owner, decision, POINT.prepare(owner, None)) is True
    assert variant_of(vars(owner)["load_model"]) == hsdp.VARIANT
    yield owner, steps
    assert POINT.uninstall(owner) is True and vars(owner)["load_model"] is original


def _kinds(steps):
    return [s[0] for s in steps]


@pytest.mark.parametrize("config", [None, types.SimpleNamespace(), types.SimpleNamespace(use_hsdp=False)],
                         ids=["no-parallel-config", "no-use-hsdp", "use-hsdp-false"])
def test_without_hsdp_load_model_runs_as_written_with_its_arguments(patched, config):
    owner, steps = patched
    owner(config).load_model("cpu", load_format="fmt", device="dev")
    assert _kinds(steps) == ["load_model", "load", "shard", "process"]
    assert steps[0] == ("load_model", "cpu", "fmt", "dev") and steps[-1][2] == "dev"


def test_hsdp_without_a_device_runs_as_written_with_its_arguments(patched):
    owner, steps = patched
    owner(types.SimpleNamespace(use_hsdp=True)).load_model("cpu", load_format="fmt")
    assert _kinds(steps) == ["load_model", "load", "shard", "process"] and steps[0] == ("load_model", "cpu", "fmt", None)


@pytest.mark.parametrize("how", ["keyword", "positional"])
def test_hsdp_with_a_device_processes_before_the_shard_on_that_device_once(patched, how):
    owner, steps = patched
    loader = owner(types.SimpleNamespace(use_hsdp=True))
    model = loader.load_model("cpu", device="dev-7") if how == "keyword" else loader.load_model("cpu", "fmt", None, "dev-7")
    assert _kinds(steps) == ["load_model", "load", "process", "shard"], steps
    assert steps[1] == ("load", model, ("extra",), {"key": 1})  # load_weights got the call as made
    assert steps[2] == ("process", model, "dev-7", {})
    assert "load_weights" not in vars(loader) and "_process_weights_after_loading" not in vars(loader)


def test_a_call_load_model_rejects_is_rejected_by_it(patched):
    owner, steps = patched
    loader = owner(types.SimpleNamespace(use_hsdp=True))
    with pytest.raises(TypeError, match="unexpected keyword argument 'speed'"):
        loader.load_model("cpu", speed=2, device="dev")
    assert steps == [] and "load_weights" not in vars(loader)


def test_the_instance_s_own_attributes_come_back_after_the_call():
    steps: list = []
    loader = _loader_class(steps)()
    own_load = loader.load_weights  # a bound method kept on the instance, as a test double or a hook would
    loader.load_weights = own_load

    def wrapped(model, device):
        loader.load_weights(model)
        steps.append(("shard", model))
        loader._process_weights_after_loading(model, device)
        loader._process_weights_after_loading("another model", device, flag=True)
        return model

    hsdp.load_with_processing_before_sharding(wrapped, loader, "dev", ("m", "dev"), {})
    assert vars(loader)["load_weights"] is own_load and "_process_weights_after_loading" not in vars(loader)
    assert _kinds(steps) == ["load", "process", "shard", "process"]
    assert steps[-1] == ("process", "another model", "dev", {"flag": True})  # another model: processed, kwargs kept


def test_the_skip_is_logged_at_debug_naming_the_model(caplog):
    steps: list = []
    loader = _loader_class(steps)()

    class Transformer:
        pass

    model = Transformer()

    def wrapped():
        loader.load_weights(model)
        return loader._process_weights_after_loading(model, "dev")

    with caplog.at_level(logging.DEBUG, logger="vllm_compat"):
        assert hsdp.load_with_processing_before_sharding(wrapped, loader, "dev", (), {}) is None
    (record,) = [r for r in caplog.records if r.name == "vllm_compat"]
    assert record.levelno == logging.DEBUG and "Transformer" in record.getMessage()
    assert "processed before sharding" in record.getMessage()
    assert _kinds(steps) == ["load", "process"]


def test_prepare_refuses_a_class_that_lacks_a_method():
    steps: list = []
    owner = _loader_class(steps)
    lacking = type("Lacking", (), {"load_model": vars(owner)["load_model"],
                                   "_process_weights_after_loading": vars(owner)["_process_weights_after_loading"],
                                   "_load_model_with_hsdp": vars(owner)["_load_model_with_hsdp"]})
    with pytest.raises(PatchRefusedError, match=r"lacks \['load_weights'\]") as raised:
        POINT.prepare(lacking, None)
    assert "missing: none" in str(raised.value)
    no_load_device = type("NoLoadDevice", (owner,), {"load_model": lambda self, device=None: None})
    with pytest.raises(PatchRefusedError, match=r"missing: \['load_device'\]") as raised:
        POINT.prepare(no_load_device, None)
    assert "lacks nothing" in str(raised.value)
