"""Loading faults: the loader variants on vLLM's real layerwise machinery (CPU online-quant double).

Each scenario runs ``process_legacy`` / ``process_meta_safe`` as the installed patch calls them
(``fn(loader, model, target_device, deps=...)``) and, where it applies, vllm-omni 0.30.0's real gated
method (``reference``) on an identical model. Device moves are observed with a ``TorchFunctionMode`` and the
"cpu" vs "cpu:0" trick (see ``_models.CPU0``).
"""

from __future__ import annotations

import logging
import traceback
from dataclasses import replace

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this env")

import torch  # noqa: E402
from torch import nn  # noqa: E402

from conftest import needs_online_processing  # noqa: E402
from vllm_compat.patches.diffusers_loader import (  # noqa: E402
    process_legacy,
    process_meta_safe,
)

from . import _models as m  # noqa: E402
from ._models import CPU, CPU0, oq  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

VARIANTS = {"legacy": process_legacy, "meta_safe": process_meta_safe}


def _raising_model(online: bool) -> tuple[nn.Module, m.RaisingOfflineMethod]:
    model = nn.Module()
    if online:
        model.anchor = m.online_anchor()
    method = m.RaisingOfflineMethod()
    model.bad = oq.QuantLinear(8, 8, method, bias=True)
    m.loaded(model.bad)
    return model, method


@pytest.mark.parametrize("online", [False, pytest.param(True, marks=needs_online_processing)], ids=["offline", "online"])
@pytest.mark.parametrize("variant", ["legacy", "meta_safe"])
def test_quant_method_raising_reaches_caller_unchanged_and_moved_params_go_back(variant, online, deps):
    model, method = _raising_model(online)
    before = m.snapshot(model)
    with m.recording() as rec, pytest.raises(m.Boom) as excinfo:
        VARIANTS[variant](oq.LoaderShaped(), model, CPU0, deps=deps)
    assert excinfo.value is method.raised
    assert excinfo.value.__cause__ is None and excinfo.value.__context__ is None
    innermost = traceback.extract_tb(excinfo.value.__traceback__)[-1]
    assert innermost.name == "process_weights_after_loading" and innermost.filename == m.__file__
    assert method.seen_device == CPU  # a "cpu:0" tensor reports "cpu"
    to_target, back = rec.moves.count(str(CPU0)), rec.moves.count(str(CPU))
    assert to_target > 0 and back == to_target, rec.moves  # every move out was undone
    assert rec.moves[-1] == str(CPU)  # the move back ran after the failure
    assert m.diff_snapshots(before, m.snapshot(model)) == []


@pytest.mark.parametrize("online", [False, True], ids=["offline", "online"])
def test_reference_does_not_move_params_back_when_quant_method_raises(online, reference):
    """Recorded difference, shim better: the in-tree method has no try/finally: the raising layer's parameters,
    moved to the target, are the last moves (none goes back). Before them, an in-tree method that does not skip
    the completed online anchor (vllm-omni 0.26.0's) moves its parameters there and back."""
    model, method = _raising_model(online)
    raising = len(list(model.bad.parameters()))
    with m.recording() as rec, pytest.raises(m.Boom):
        reference(oq.LoaderShaped(), model, CPU0)
    assert rec.moves[-raising:] == [str(CPU0)] * raising, rec.moves
    earlier = rec.moves[:-raising]
    assert earlier.count(str(CPU0)) == earlier.count(str(CPU)), rec.moves  # any other layer's round trip is complete


def test_finalize_raising_reaches_caller_unchanged_and_nothing_moves(deps):
    raised = m.Boom("finalize failed")

    def finalize(model, model_config):
        raise raised

    model = oq.build_model()
    m.loaded(model)
    before = m.snapshot(model)
    with m.recording() as rec, pytest.raises(m.Boom) as excinfo:
        process_meta_safe(oq.LoaderShaped(), model, CPU0, deps=replace(deps, find_finalize=lambda: finalize))
    assert excinfo.value is raised
    assert traceback.extract_tb(excinfo.value.__traceback__)[-1].name == "finalize"
    assert rec.moves == []
    assert m.diff_snapshots(before, m.snapshot(model)) == []


@pytest.mark.parametrize("variant", ["legacy", "meta_safe", "reference"])
def test_model_without_quant_modules_is_left_untouched(variant, deps, request):
    fn = request.getfixturevalue("reference") if variant == "reference" else VARIANTS[variant]
    calls = []
    spy = replace(deps, find_finalize=lambda: lambda *a, **k: calls.append(a))
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Sequential(nn.Linear(4, 2)))
    model[2].to("meta")  # a non-quant module on meta is not the loader's business
    before, params = m.snapshot(model), list(model.parameters())
    with m.recording() as rec:
        if variant == "reference":
            fn(oq.LoaderShaped(), model, CPU0)
        else:
            fn(oq.LoaderShaped(), model, CPU0, deps=spy)
    assert rec.moves == [] and calls == []
    assert list(model.parameters()) == params and all(a is b for a, b in zip(model.parameters(), params, strict=True))
    assert m.diff_snapshots(before, m.snapshot(model)) == []


@pytest.mark.parametrize("online", [False, pytest.param(True, marks=needs_online_processing)], ids=["offline", "online"])
@pytest.mark.parametrize("variant", ["legacy", "meta_safe", "reference"])
def test_quant_module_without_parameters_is_processed_once(variant, online, deps, request):
    model = nn.Module()
    if online:
        model.anchor = m.online_anchor()
    model.empty = m.ParamlessQuant()
    if variant == "reference":
        request.getfixturevalue("reference")(oq.LoaderShaped(), model, CPU0)
    else:
        VARIANTS[variant](oq.LoaderShaped(), model, CPU0, deps=deps)
    assert model.empty.quant_method.calls == 1
    assert dict(model.empty.named_parameters()) == {}


def _tied_model(online: bool) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Module()
    if online:
        model.anchor = m.online_anchor()
    model.a = oq.QuantLinear(8, 8, oq.CpuFp8OfflineMethod(), bias=True)
    model.b = oq.QuantLinear(8, 8, oq.CpuFp8OfflineMethod(), bias=True)
    m.loaded(model.a, seed=2)
    model.b.weight = model.a.weight  # tied quant weights
    model.head = nn.Linear(8, 8, bias=False)
    model.head.weight = model.a.bias  # wrong shape for a Linear, but only identity matters here
    model.b.bias = model.a.bias  # a bias tied across quant and plain modules
    model.register_buffer("scale_table", torch.arange(8, dtype=torch.float32))
    model.b.register_buffer("lut", torch.linspace(0, 1, 8))
    return model


@pytest.mark.parametrize("online", [False, True], ids=["offline", "online"])
@pytest.mark.parametrize("variant", ["legacy", "meta_safe"])
@pytest.mark.parametrize("target", [CPU, CPU0], ids=["cpu", "cpu0"])
def test_tied_parameters_and_buffers_match_the_reference(variant, online, target, deps, reference):
    ours, ref = _tied_model(online), _tied_model(online)
    with oq.deterministic_fill():
        VARIANTS[variant](oq.LoaderShaped(), ours, target, deps=deps)
        reference(oq.LoaderShaped(), ref, target)
    assert m.diff_snapshots(m.snapshot(ref), m.snapshot(ours)) == []
    assert m.tie_groups(ours) == m.tie_groups(ref)
    assert {n for n, _ in ours.named_buffers()} == {"scale_table", "b.lut", *(
        n for n, _ in ref.named_buffers())}


def _mixed_device_model() -> nn.Module:
    """Stragglers: a fused layer with one shard loaded (weight on meta) next to a CPU bias, an absent
    layer (meta weight only), plus fully loaded layers."""
    model = nn.Module()
    model.blocks = nn.ModuleList([nn.Module(), nn.Module()])
    for block in model.blocks:
        block.proj_in = oq.QuantLinear(8, 8, oq.CpuFp8OnlineMethod(), n_shards=2, bias=True)
        block.proj_out = oq.QuantLinear(8, 8, oq.CpuFp8OnlineMethod())
    stragglers = (oq.Straggler("blocks.0.proj_in", "partial"), oq.Straggler("blocks.1.proj_out", "absent"))
    oq.load_checkpoint(model, oq.make_checkpoint(model, seed=3), stragglers=stragglers)
    return model


def test_mixed_cpu_and_meta_params_crash_legacy_but_not_meta_safe(deps, oq):
    model = _mixed_device_model()
    assert {p.device.type for p in model.blocks[0].proj_in.parameters()} == {"cpu", "meta"}
    with pytest.raises(NotImplementedError, match="meta tensor"):
        process_legacy(oq.LoaderShaped(), model, CPU0, deps=deps)
    model = _mixed_device_model()
    with oq.deterministic_fill():
        process_meta_safe(oq.LoaderShaped(), model, CPU0, deps=deps)
    if deps.find_finalize() is not None:
        assert oq.meta_param_names(model) == []


def test_mixed_cpu_and_meta_params_match_the_reference(deps, reference):
    ours, ref = _mixed_device_model(), _mixed_device_model()
    with oq.deterministic_fill():
        process_meta_safe(oq.LoaderShaped(), ours, CPU0, deps=deps)
        reference(oq.LoaderShaped(), ref, CPU0)
    assert m.diff_snapshots(m.snapshot(ref), m.snapshot(ours)) == []
    assert oq.meta_param_names(ours) == []


@needs_online_processing
def test_mixed_cpu_and_meta_params_without_finalize_warn_and_keep_cpu_params(deps, caplog):
    model = _mixed_device_model()
    cpu_before = {n: s for n, s in m.snapshot(model).items() if s[1] == "cpu"}
    with caplog.at_level(logging.WARNING, logger="vllm_compat"):
        process_meta_safe(oq.LoaderShaped(), model, CPU0, deps=replace(deps, find_finalize=lambda: None))
    left = oq.meta_param_names(model)
    assert left == ["blocks.0.proj_in.weight", "blocks.0.proj_in.weight_scale",
                    "blocks.1.proj_out.weight", "blocks.1.proj_out.weight_scale"]
    assert "still on meta" in caplog.text and "blocks.0.proj_in.weight" in caplog.text
    after = m.snapshot(model)
    # stragglers were processed where they are (meta in, meta out); everything on CPU is kept
    assert cpu_before and all(name in after for name in cpu_before)
    assert "blocks.0.proj_in.bias" in after and after["blocks.0.proj_in.bias"][1] == "cpu"


@pytest.mark.parametrize("variant", ["legacy", "meta_safe", "reference"])
def test_same_loader_called_twice_changes_nothing_the_second_time(variant, deps, request):
    online = variant != "legacy"  # legacy cannot run on stragglers (meta); it gets an offline model
    model = oq.build_model(online=online, stragglers=oq.DEFAULT_STRAGGLERS if online else ())
    m.loaded(model)
    run = (lambda: request.getfixturevalue("reference")(oq.LoaderShaped(), model, CPU0)) \
        if variant == "reference" else (lambda: VARIANTS[variant](oq.LoaderShaped(), model, CPU0, deps=deps))
    with oq.deterministic_fill():
        run()
        first = m.snapshot(model)
        calls = {n: getattr(layer, "_test_process_calls", 0) for n, layer in oq.quant_layers(model).items()}
        run()
    assert m.diff_snapshots(first, m.snapshot(model)) == []
    assert {n: getattr(layer, "_test_process_calls", 0) for n, layer in oq.quant_layers(model).items()} == calls
    assert calls and all(c == 1 for c in calls.values()), calls
