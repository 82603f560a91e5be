"""What meta_safe costs on the fully loaded online-FP8 call, without the bench's per-round rebuild: each method
called 20 times in a row on one fully loaded model, 30 batches (results in gpu/results/online_full_calls.txt).

    source gpu/device_env.sh 30 && python -m gpu.bench_online_full_calls [nogc]
"""
import gc
import statistics
import sys
import time

import torch
import wrapt

from gpu import common
from gpu.bench import _loader_with_wrapt_patch
from tests.support import online_quant as oq
from vllm_compat.patches import diffusers_loader as patch

print("wrapt", wrapt.__version__, "(first design's wrapper):", wrapt.FunctionWrapper.__module__)
cls = common.loader_class()
intree = common.original_method(cls)
deps = patch.resolve_deps()
patch.install_variant(cls, "meta_safe", deps)
loader = common.bare_loader(cls)
wrapt_loader = _loader_with_wrapt_patch(cls, deps)
with torch.device("cuda"):
    ckpt = common.checkpoint_on(oq.build_model(28, 4096, online=True, stragglers=()), "cuda")
model, _ = common.build_loaded(28, 4096, online=True, stragglers=(), device="cuda", checkpoint=ckpt)
target = torch.device("cuda", torch.cuda.current_device())
flagged = sum(bool(getattr(m, oq.PROCESSED_FLAG, False)) for m in oq.quant_layers(model).values())
print("quant layers", len(oq.quant_layers(model)), "flagged processed", flagged)
fin = deps.find_finalize()
calls = {
    "in_tree": lambda: intree(loader, model, target),
    "wrapper": lambda: loader._process_weights_after_loading(model, target),
    "meta_safe direct": lambda: patch.process_meta_safe(loader, model, target, deps=deps),
    "wrapt wrapper (first design)": lambda: wrapt_loader._process_weights_after_loading(model, target),
    "uses_online_quant": lambda: patch.uses_online_quant(model),
    "find_finalize": lambda: deps.find_finalize(),
    "finalize": lambda: fin(model, model_config=None),
    "named_modules walk": lambda: [None for _ in model.named_modules()],
}
empty = torch.nn.Module()
calls["wrapper, empty model"] = lambda: loader._process_weights_after_loading(empty, target)
calls["direct, empty model"] = lambda: patch.process_meta_safe(loader, empty, target, deps=deps)
calls["in_tree, empty model"] = lambda: intree(loader, empty, target)
for f in calls.values():
    f()
res = {k: [] for k in calls}
if "nogc" in sys.argv:
    gc.collect()
    gc.disable()
print("gc", gc.isenabled())
for _ in range(30):
    for k, f in calls.items():
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            f()
        torch.cuda.synchronize()
        res[k].append((time.perf_counter() - t) / 20 * 1e6)
for k, v in res.items():
    print(f"{k:20s} min {min(v):8.1f} us  median {statistics.median(v):8.1f} us")
