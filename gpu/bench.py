"""Time and peak GPU memory of ``_process_weights_after_loading`` on a synthetic ~1.4 B-parameter DiT.

    source gpu/device_env.sh 30 && python -m gpu.bench OUT.json [--layers 28 --hidden 4096 --repeats 5]

Methods: vllm-omni 0.30.0's in-tree (gated) method, vllm_compat ``meta_safe`` installed on that class (called
through the class, the installed wrapper included), and vllm-omni 0.24.0's legacy method compiled from its file;
``--methods`` picks some, or adds the diagnostics ``meta_safe`` without a wrapper and behind the first design's
wrapt wrapper (wrapt needed for that one).
Scenarios: offline FP8 on cuda (every layer quantized by the call), online FP8 fully loaded (finalize + skip),
online FP8 with one absent and one partial straggler (legacy cannot run it: F-meta), offline FP8 with the model
on cpu and target cuda (module moves). One warm-up round, then ``--repeats`` rounds; within a round every method
runs once on a fresh model, in an order rotated each round. Time: the call between two ``cuda.synchronize()``.
Memory: ``max_memory_allocated`` during the call minus ``memory_allocated`` before it (reset just before).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time

import torch

from gpu import common
from tests.support import online_quant as oq

OMNI24_FILE = os.environ.get(
    "OMNI24_LOADER_FILE", "/tmp/vc/omni24/vllm_omni/diffusion/model_loader/diffusers_loader.py"
)
SCENARIOS = {
    # name: (online, stragglers, model device, methods that can run it)
    "offline, cuda->cuda": (False, (), "cuda", ("in-tree 0.30.0", "meta_safe", "legacy 0.24.0")),
    "online full, cuda->cuda": (True, (), "cuda", ("in-tree 0.30.0", "meta_safe", "legacy 0.24.0")),
    "online stragglers, cuda->cuda": (True, oq.DEFAULT_STRAGGLERS, "cuda", ("in-tree 0.30.0", "meta_safe")),
    "offline, cpu->cuda": (False, (), "cpu", ("in-tree 0.30.0", "meta_safe", "legacy 0.24.0")),
}
SCENARIO_METHODS = ("in-tree 0.30.0", "meta_safe", "legacy 0.24.0")
WRAPT_DIAGNOSTIC = "meta_safe, wrapt wrapper (first design)"
METHODS = (*SCENARIO_METHODS, "meta_safe, no wrapper", WRAPT_DIAGNOSTIC)


def fingerprint(model) -> float:
    """Sum of the processed weights and scales of the layers loaded in full: equal across methods. Straggler
    layers are left out: vLLM materializes them inside the timed call with ``torch.empty_strided``, so their
    values are whatever memory they got."""
    skip = {s.layer for s in getattr(model, "stragglers", ())}
    total = 0.0
    for name, layer in oq.quant_layers(model).items():
        if name in skip:
            continue
        total += float(torch.nansum(layer.weight.float()).item()) + float(torch.nansum(layer.weight_scale.float()))
    return total


def _loader_with_wrapt_patch(cls, deps):
    """A bare loader of a subclass of ``cls`` whose method is meta_safe behind a ``wrapt.FunctionWrapper`` subclass,
    called as vllm_compat's first ``_method.install`` called it."""
    import wrapt  # only for this diagnostic: vllm_compat itself no longer uses it

    from vllm_compat.patches import diffusers_loader as patch

    class MethodPatch(wrapt.FunctionWrapper):
        _vllm_compat_installed = True

    def call_variant(wrapped, instance, args, kwargs):
        if instance is not None and len(args) == 2 and not kwargs:
            return patch.process_meta_safe(instance, args[0], args[1], deps=deps)
        raise TypeError("the bench calls it as vllm-omni does: (model, target_device)")

    subclass = type("WraptPatchedLoader", (cls,), {patch.METHOD_NAME: MethodPatch(common.original_method(cls),
                                                                                   call_variant)})
    return common.bare_loader(subclass)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--scenarios", default=";".join(SCENARIOS), help="names separated by ;")
    ap.add_argument("--methods", default="", help="names separated by ; (default: every method a scenario can run, "
                    f"of {'; '.join(METHODS)})")
    args = ap.parse_args()

    from vllm_compat.patches import diffusers_loader as patch

    cls = common.loader_class()
    intree = common.original_method(cls)
    legacy, legacy_sha = common.method_from_source(OMNI24_FILE)
    deps = patch.resolve_deps()
    patch.install_variant(cls, "meta_safe", deps)
    loader = common.bare_loader(cls)
    wanted = [n for n in args.methods.split(";") if n]
    wrapt_loader = _loader_with_wrapt_patch(cls, deps) if WRAPT_DIAGNOSTIC in wanted else None
    methods = {
        "in-tree 0.30.0": lambda m, d: intree(loader, m, d),
        "meta_safe": lambda m, d: loader._process_weights_after_loading(m, d),
        "legacy 0.24.0": lambda m, d: legacy(loader, m, d),
        # Diagnostics, to split meta_safe's cost: its function without the installed wrapper, and behind the
        # wrapt wrapper vllm_compat installed before (patches/_method.py says why it went).
        "meta_safe, no wrapper": lambda m, d: patch.process_meta_safe(loader, m, d, deps=deps),
        WRAPT_DIAGNOSTIC: lambda m, d: wrapt_loader._process_weights_after_loading(m, d),
    }
    assert set(methods) == set(METHODS)
    target = torch.device("cuda", torch.cuda.current_device())
    report = {"versions": common.versions(), "legacy_source_sha": legacy_sha, "args": vars(args), "scenarios": {}}

    for scen in args.scenarios.split(";"):
        online, stragglers, model_dev, names = SCENARIOS[scen]
        if wanted:
            names = tuple(n for n in wanted if n in names or n not in SCENARIO_METHODS)
        with torch.device("meta"):
            shape_model = oq.build_model(args.layers, args.hidden, online=online, stragglers=stragglers)
        n_params = sum(p.numel() for p in shape_model.parameters())
        with torch.device("cuda"):
            ckpt = common.checkpoint_on(oq.build_model(args.layers, args.hidden, online=online, stragglers=()), "cuda")
        if model_dev == "cpu":
            ckpt = {k: v.cpu() for k, v in ckpt.items()}
        samples = {n: {"s": [], "peak_mib": [], "fingerprint": None, "error": None} for n in names}
        for rnd in range(args.repeats + 1):
            order = list(names[rnd % len(names):]) + list(names[: rnd % len(names)])
            for name in order:
                with oq.deterministic_fill():
                    model, _ = common.build_loaded(
                        args.layers, args.hidden, online=online, stragglers=stragglers, device=model_dev,
                        checkpoint=ckpt,
                    )
                gc.collect()
                torch.cuda.synchronize()
                base = torch.cuda.memory_allocated()
                torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                outcome = common.capture(methods[name], model, target)
                torch.cuda.synchronize()
                elapsed = time.perf_counter() - t0
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
                if not outcome["ok"]:
                    samples[name]["error"] = outcome["error"]
                elif rnd == 0:
                    samples[name]["fingerprint"] = fingerprint(model)
                else:
                    samples[name]["s"].append(elapsed)
                    samples[name]["peak_mib"].append(peak)
                del model
                gc.collect()
                torch.cuda.empty_cache()
        rows = {}
        for name, smp in samples.items():
            if smp["s"]:
                rows[name] = {
                    "median_s": statistics.median(smp["s"]), "min_s": min(smp["s"]), "max_s": max(smp["s"]),
                    "peak_mib": max(smp["peak_mib"]), "fingerprint": smp["fingerprint"], "samples_s": smp["s"],
                }
            else:
                rows[name] = {"error": smp["error"]}
        base_t = rows.get("in-tree 0.30.0", {}).get("median_s")
        for row in rows.values():
            if base_t and "median_s" in row:
                row["ratio_vs_intree"] = row["median_s"] / base_t
        report["scenarios"][scen] = {"params": n_params, "rows": rows}
        print(scen, json.dumps(rows, default=str), flush=True)
        del ckpt
        gc.collect()
        torch.cuda.empty_cache()

    with open(args.out, "w") as fh:
        json.dump(report, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
