"""F-meta on CUDA: online FP8 with straggler layers left on ``meta`` by vLLM's layerwise loading.

Run with one vllm-omni on the path (``source gpu/device_env.sh 24``), then ``python -m gpu.check_meta OUT.json``.
1. unpatched: the installed vllm-omni's own ``_process_weights_after_loading`` (vllm_compat not imported);
2. patched: ``vllm_compat.apply()`` (the decision table's pick), then the same call through the class;
3. forced meta_safe: ``install_variant(cls, "meta_safe", resolve_deps())``, in case the table picked another.
Each on a fresh model; target device ``cuda:<current>``. Reports the outcome, params left on meta, and whether
every loaded layer holds the FP8 weight/scale of its checkpoint tensors on CUDA.
"""

from __future__ import annotations

import json
import os
import sys

import torch

from gpu import common
from tests.support import online_quant as oq

N_LAYERS, HIDDEN = 4, 256
# GPU_CHECK_DEVICE=cpu runs the same script on a CPU machine (a smoke test of the harness only).
DEVICE_TYPE = os.environ.get("GPU_CHECK_DEVICE", "cuda")


def _check_processed(model, checkpoint, device) -> dict:
    """Layers loaded in full must hold quantize_fp8(checkpoint) on ``device``; stragglers only fp8 on device."""
    stragglers = {s.layer for s in oq.DEFAULT_STRAGGLERS}
    bad = []
    for name, layer in oq.quant_layers(model).items():
        w, scale = layer.weight, getattr(layer, "weight_scale", None)
        if w.dtype != oq.FP8_DTYPE or w.device != device or scale is None or scale.device != device:
            bad.append(f"{name}: {w.dtype}@{w.device}")
            continue
        if name in stragglers:
            continue
        parent, _, child = name.rpartition(".")
        if child == "proj_in":
            full = torch.cat([checkpoint[f"{parent}.to_gate.weight"], checkpoint[f"{parent}.to_up.weight"]])
        else:
            full = checkpoint[f"{name}.weight"]
        qw, qs = oq.quantize_fp8(full.to(device))
        if not (torch.equal(w.view(torch.uint8), qw.view(torch.uint8)) and torch.equal(scale, qs)):
            bad.append(f"{name}: values differ from quantize_fp8(checkpoint)")
    return {"layers_ok": not bad, "layer_problems": bad[:5]}


def run_case(call, device) -> dict:
    with oq.deterministic_fill():
        model, checkpoint = common.build_loaded(
            N_LAYERS, HIDDEN, online=True, stragglers=oq.DEFAULT_STRAGGLERS, device=device
        )
    before = oq.meta_param_names(model)
    outcome = common.capture(call, model, device)
    outcome.update(meta_before=before, meta_after=oq.meta_param_names(model))
    if outcome["ok"]:
        outcome.update(_check_processed(model, checkpoint, device))
        x = torch.randn(2, HIDDEN, device=device, dtype=torch.bfloat16)
        probe = oq.probe_forward(model, x)
        outcome["forward"] = "ok" if probe.error is None else f"{type(probe.error).__name__}: {probe.error}"[:200]
        outcome["forward_fp8_everywhere"] = all(d == oq.FP8_DTYPE for d in probe.weight_dtypes.values())
    return outcome


def main(out_path: str) -> dict:
    device = torch.device("cuda", torch.cuda.current_device()) if DEVICE_TYPE == "cuda" else torch.device("cpu")
    cls = common.loader_class()  # imported before vllm_compat: nothing patched yet
    assert "vllm_compat" not in sys.modules
    loader = common.bare_loader(cls)
    original = common.original_method(cls)
    report = {"versions": common.versions(), "device": str(device)}
    report["unpatched"] = run_case(lambda m, d: original(loader, m, d), device)

    import vllm_compat
    from vllm_compat.patches import diffusers_loader as patch

    decision = vllm_compat.apply()[0]
    report["decision"] = {"action": str(decision.action), "variant": decision.variant, "reason": decision.reason}
    report["patched_by_apply"] = run_case(lambda m, d: loader._process_weights_after_loading(m, d), device)

    vllm_compat.revert()
    patch.install_variant(cls, "meta_safe", patch.resolve_deps())
    report["patched_meta_safe"] = run_case(lambda m, d: loader._process_weights_after_loading(m, d), device)
    patch.DRIFT_POINT.uninstall(cls)

    with open(out_path, "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    return report


if __name__ == "__main__":
    result = main(sys.argv[1] if len(sys.argv) > 1 else "check_meta.json")
    print(json.dumps(result, indent=1, default=str))
