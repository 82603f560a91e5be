"""Data integrity: ``process_meta_safe`` against vllm-omni 0.30.0's real gated method, bit for bit.

A bounded property test draws module trees (online / offline quant layers, fused layers, plain layers,
parameterless modules, nesting), straggler sets and target devices, runs both on identical models under
``deterministic_fill()`` and checks: no parameter left on meta, every parameter and buffer equal bit for bit
to the reference, on the device the reference leaves it, nothing dropped, ties as the reference leaves them.
Offline-only trees are also compared with the installed legacy method (vllm-omni <= 0.24.0) where present.

Reference fails, shim survives (recorded as tests): a quant module holding meta params whose method does not
declare ``uses_meta_device`` (the reference takes the ``module.to`` path and raises on meta).
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this env")
hypothesis = pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

from vllm_compat.patches.diffusers_loader import process_legacy, process_meta_safe  # noqa: E402

from . import _models as m  # noqa: E402
from ._models import CPU, CPU0, oq  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

KINDS = ("q_online", "q_online_fused", "q_offline", "q_offline_fused", "linear", "norm", "empty", "nested")


def _children(depth: int):
    kinds = st.sampled_from(KINDS if depth < 2 else KINDS[:-1])
    return st.lists(st.tuples(kinds, st.booleans()), min_size=1, max_size=4)


@st.composite
def trees(draw, depth=0):
    spec = []
    fused_used = False
    for kind, bias in draw(_children(depth)):
        if kind.endswith("_fused"):
            if fused_used:
                kind = kind.removesuffix("_fused")
            fused_used = True
        spec.append((kind, bias, draw(trees(depth + 1)) if kind == "nested" else None))
    return spec


def build(spec, hidden=8) -> nn.Module:
    module = nn.Module()
    for i, (kind, bias, sub) in enumerate(spec):
        name = "proj_in" if kind.endswith("_fused") else f"c{i}"
        if kind.startswith("q_"):
            method = oq.CpuFp8OnlineMethod() if kind.startswith("q_online") else oq.CpuFp8OfflineMethod()
            child = oq.QuantLinear(hidden, hidden, method, n_shards=2 if kind.endswith("_fused") else 1, bias=bias)
        elif kind == "linear":
            child = nn.Linear(hidden, hidden, bias=bias)
        elif kind == "norm":
            child = nn.LayerNorm(hidden)
            child.register_buffer("running", nn.init.constant_(child.weight.detach().clone(), 0.5))
        elif kind == "empty":
            child = nn.Identity()
        else:
            child = build(sub, hidden)
        setattr(module, name, child)
    return module


def online_layers(model):
    return {n: (layer, layer.n_shards) for n, layer in oq.quant_layers(model).items() if layer.quant_method.uses_meta_device}


@st.composite
def cases(draw):
    spec = draw(trees())
    probe = build(spec)
    candidates = sorted(online_layers(probe).items())
    stragglers = []
    for name, (_, n_shards) in candidates:
        choice = draw(st.sampled_from(["loaded", "absent", "partial"] if n_shards > 1 else ["loaded", "absent"]))
        if choice != "loaded":
            stragglers.append(oq.Straggler(name, choice))
    target = draw(st.sampled_from([CPU, CPU0]))
    seed = draw(st.integers(0, 2**16))
    return spec, tuple(stragglers), target, seed


def loaded_model(spec, stragglers, seed):
    model = build(spec)
    oq.load_checkpoint(model, oq.make_checkpoint(model, seed=seed, dtype=oq.torch.bfloat16), stragglers)
    return model


@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(case=cases())
def test_meta_safe_matches_the_reference_on_random_trees(case, deps, reference, request):
    spec, stragglers, target, seed = case
    with oq.deterministic_fill():
        ours, ref = loaded_model(spec, stragglers, seed), loaded_model(spec, stragglers, seed)
        names_before = {n for n, _ in ours.named_parameters()}
        process_meta_safe(oq.LoaderShaped(), ours, target, deps=deps)
        reference(oq.LoaderShaped(), ref, target)
    assert oq.meta_param_names(ours) == []
    assert names_before <= {n for n, _ in ours.named_parameters()}  # nothing dropped
    assert m.diff_snapshots(m.snapshot(ref), m.snapshot(ours)) == []  # values, dtypes, devices, buffers
    assert m.tie_groups(ours) == m.tie_groups(ref)
    # ``process_legacy`` is exactly vllm-omni 0.24.0's method wherever that one runs (no meta params)
    if not online_layers(ours):
        legacy = request.getfixturevalue("legacy_reference") if _has_legacy() else None
        if legacy is not None:
            with oq.deterministic_fill():
                a, b = loaded_model(spec, (), seed), loaded_model(spec, (), seed)
                process_legacy(oq.LoaderShaped(), a, target, deps=deps)
                legacy(oq.LoaderShaped(), b, target)
            assert m.diff_snapshots(m.snapshot(b), m.snapshot(a)) == []


def _has_legacy() -> bool:
    from . import _support

    return _support.reference_source("legacy")[0] is not None


@pytest.mark.parametrize("target", [CPU, CPU0], ids=["cpu", "cpu0"])
def test_default_model_with_stragglers_matches_the_reference(target, deps, reference):
    with oq.deterministic_fill():
        ours, ref = oq.build_model(), oq.build_model()
        m.loaded(ours), m.loaded(ref)
        process_meta_safe(oq.LoaderShaped(), ours, target, deps=deps)
        reference(oq.LoaderShaped(), ref, target)
    assert oq.meta_param_names(ours) == [] == oq.meta_param_names(ref)
    assert m.diff_snapshots(m.snapshot(ref), m.snapshot(ours)) == []


def _undeclared_meta_model() -> nn.Module:
    """An offline (``uses_meta_device = False``) quant layer whose weight is nonetheless on meta (a plugin
    quant method that creates weights lazily), next to a loaded offline layer."""
    model = nn.Module()
    model.ok = oq.QuantLinear(8, 8, oq.CpuFp8OfflineMethod(), bias=True)
    m.loaded(model.ok)
    model.lazy = oq.QuantLinear(8, 8, oq.CpuFp8OfflineMethod(), bias=True)
    model.lazy.weight = nn.Parameter(oq.torch.empty(8, 8, dtype=model.lazy.weight.dtype, device="meta"),
                                     requires_grad=False)
    return model


def test_reference_fails_on_undeclared_meta_params(reference):
    with pytest.raises(NotImplementedError, match="meta tensor"):
        reference(oq.LoaderShaped(), _undeclared_meta_model(), CPU0)


def test_meta_safe_survives_undeclared_meta_params(deps):
    ours = _undeclared_meta_model()
    process_meta_safe(oq.LoaderShaped(), ours, CPU0, deps=deps)
    assert ours.ok.weight.dtype == oq.FP8_DTYPE  # the healthy layer is processed
    assert ours.lazy.bias.device == CPU  # the CPU bias is kept; the lazy weight stays on meta (nothing to load)
    assert "lazy.weight" in oq.meta_param_names(ours)
