"""F-hsdp on CUDA: FSDP2 (NCCL) params sharded on the GPUs, processed with target and original devices that
differ, then a forward that must use the processed (FP8) weights.

    torchrun --nproc_per_node=N -m gpu.check_hsdp OUT.json      (N = GPUs; 1 works too)

Layouts (the params' device != the loader's target device in both):
  * ``cuda_to_cpu``: sharded params on ``cuda:<rank>``, target ``cpu``;
  * ``offload_to_cuda``: FSDP2 ``CPUOffloadPolicy`` (sharded params on ``cpu``), target ``cuda:<rank>``.
Methods: the ungated per-parameter ``.data`` fix (tests/support/online_quant.py), vllm_compat's ``legacy`` and
``meta_safe`` variants, and the installed vllm-omni's own method (0.30.0's gated one with omni30 on the path).
Online (processed while loading, before sharding) and offline (processed by the loader, after sharding) FP8.
Each case: build + load on cuda, ``fully_shard`` every block then the root, process, one forward; the output
is compared with an unsharded model processed the normal way. Rank 0 writes the JSON.
"""

from __future__ import annotations

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

from gpu import common
from tests.support import online_quant as oq

N_LAYERS, HIDDEN = 4, 256
LAYOUTS = ("cuda_to_cpu", "offload_to_cuda")


def methods():
    from vllm_compat.patches.diffusers_loader import VARIANT_FUNCTIONS, resolve_deps

    deps = resolve_deps()
    cls = common.loader_class()
    intree = common.original_method(cls)
    loader = common.bare_loader(cls)
    omni = common.versions()["vllm-omni"]
    return loader, {
        "ungated (per-param .data)": lambda m, d: oq.ungated_process_weights_after_loading(loader, m, d),
        "shim legacy": lambda m, d: VARIANT_FUNCTIONS["legacy"](loader, m, d, deps=deps),
        "shim meta_safe": lambda m, d: VARIANT_FUNCTIONS["meta_safe"](loader, m, d, deps=deps),
        f"vllm-omni {omni} in-tree": lambda m, d: intree(loader, m, d),
    }


def reference_output(online: bool, checkpoint, x):
    model, _ = common.build_loaded(N_LAYERS, HIDDEN, online=online, device="cuda", checkpoint=checkpoint)
    if not online:
        for layer in oq.quant_layers(model).values():
            layer.quant_method.process_weights_after_loading(layer)
    with torch.no_grad():
        return model(x)


def run_case(process, layout: str, online: bool, checkpoint, x, ref) -> dict:
    rank_dev = torch.device("cuda", torch.cuda.current_device())
    model, _ = common.build_loaded(N_LAYERS, HIDDEN, online=online, device="cuda", checkpoint=checkpoint)
    kwargs = {"offload_policy": CPUOffloadPolicy()} if layout == "offload_to_cuda" else {}
    for block in model.blocks:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    param_dev = str(next(model.parameters()).device)
    target = torch.device("cpu") if layout == "cuda_to_cpu" else rank_dev
    out = {"param_device": param_dev, "target": str(target)}
    out["process"] = common.capture(process, model, target)
    torch.cuda.synchronize()
    probe = oq.probe_forward(model, x)
    torch.cuda.synchronize()
    out["forward_error"] = None if probe.error is None else f"{type(probe.error).__name__}: {probe.error}"[:300]
    out["applied_dtypes"] = sorted({str(d) for d in probe.weight_dtypes.values()})
    out["used_processed_weights"] = probe.used_processed_weights
    if probe.output is not None:
        out["max_abs_diff_vs_reference"] = float((probe.output.float() - ref.float()).abs().max())
    return out


def main(out_path: str) -> None:
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=120))
    loader, variants = methods()
    results = {"versions": common.versions(), "world_size": world, "cases": []}
    for online in (True, False):
        with torch.device("cuda"):
            fresh = oq.build_model(N_LAYERS, HIDDEN, online=online)
        checkpoint = common.checkpoint_on(fresh, "cuda", seed=7)
        del fresh
        x = torch.randn(4, HIDDEN, device="cuda", dtype=torch.bfloat16, generator=torch.Generator("cuda").manual_seed(3))
        ref = reference_output(online, checkpoint, x)
        for layout in LAYOUTS:
            for name, process in variants.items():
                case = {"method": name, "online": online, "layout": layout}
                try:
                    case.update(run_case(process, layout, online, checkpoint, x, ref))
                except Exception as exc:  # noqa: BLE001 - a harness failure is a result too
                    case["harness_error"] = f"{type(exc).__name__}: {exc}"[:300]
                dist.barrier()
                results["cases"].append(case)
                if rank == 0:
                    print(json.dumps(case, default=str), flush=True)
    if rank == 0:
        with open(out_path, "w") as fh:
            json.dump(results, fh, indent=1, default=str)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "check_hsdp.json")
