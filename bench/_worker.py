"""In-process measurements, run by bench/run.py in a fresh interpreter of the env under test.

    python bench/_worker.py --parts hook,loader --out result.json [--sizes 100,1000,10000] [--quick]

Parts:
  hook    sections 4: latency from vllm-omni's loader module finishing its import to the patch being on the class
          (timestamps taken inside the process around vllm_compat's post-import callbacks), first import and
          reloads; then the cost of ``vllm_compat.apply()`` when the patch is already applied.
  instructions  section 3's meta_safe and in_tree calls counted in instructions (run under callgrind by
          bench/run.py; see part_instructions)
  loader  section 3: ``_process_weights_after_loading`` on CPU, meta-safe variant (through the installed
          wrapper) vs vllm-omni's in-tree method (the ORIGINAL function, ``__wrapped__`` of our wrapper) vs the
          legacy variant; peak memory; per-call shim overhead. Needs vllm-omni with the in-tree gated method
          and ``VLLM_COMPAT_LOADER_VARIANT=meta_safe`` (so the hook installs our wrapper on the real class).

Run from the repository root (tests/support/online_quant.py is imported for the models).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import sys
import time
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# Registered first thing, exactly as in a worker: `import vllm_compat` installs the post-import hook.
import vllm_compat  # noqa: E402
import vllm_compat.hooks as hooks  # noqa: E402

MEMORY_ROUNDS = 3
LOADER_MODULE = "vllm_omni.diffusion.model_loader.diffusers_loader"
CLASS_NAME = "DiffusersPipelineLoader"
METHOD = "_process_weights_after_loading"

_hook_samples: list[dict] = []
_finder = hooks._finder()  # the process's one post-import finder: its run_callbacks is what the hook calls
_real_run_callbacks = _finder.run_callbacks


def _timed_run_callbacks(fullname, module):
    # Called by the hooked loader right after the real loader's exec_module returned (the module body has
    # run; only `__loader__`/`__spec__.loader` were put back in between). t1: all callbacks returned.
    before = set(sys.modules)
    t0 = time.perf_counter_ns()
    _real_run_callbacks(fullname, module)
    t1 = time.perf_counter_ns()
    if fullname == LOADER_MODULE:
        from vllm_compat.patches.diffusers_loader import installed_variant

        new = set(sys.modules) - before
        _hook_samples.append({"ns": t1 - t0, "variant": installed_variant(getattr(module, CLASS_NAME)),
                              "new_modules": len(new),
                              "new_top_level": sorted({m.split(".")[0] for m in new})})


_finder.run_callbacks = _timed_run_callbacks


def rotated(items: list, i: int) -> list:
    """``items`` started at position ``i`` (mod its length): the contender order of round ``i``."""
    return items[i % len(items):] + items[: i % len(items)]


def median(xs):
    return statistics.median(xs) if xs else None


# ----------------------------------------------------------------------------------------------------------
# Section 4: hook latency and apply()
# ----------------------------------------------------------------------------------------------------------


def part_hook(reloads: int, apply_iters: int) -> dict:
    t = time.perf_counter()
    module = importlib.import_module(LOADER_MODULE)
    import_s = time.perf_counter() - t
    first = dict(_hook_samples[0]) if _hook_samples else None
    for _ in range(reloads):
        module = importlib.reload(module)
    warm = _hook_samples[1:]
    cls = getattr(module, CLASS_NAME)
    from vllm_compat.patches.diffusers_loader import installed_variant

    installed = vars(cls)[METHOD]
    # apply() with the patch already on the class: must change nothing.
    decisions = vllm_compat.apply()
    assert vars(cls)[METHOD] is installed, "apply() replaced an applied patch"
    per_call = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(apply_iters):
            vllm_compat.apply()
        per_call.append((time.perf_counter_ns() - t0) / apply_iters / 1e3)
    assert vars(cls)[METHOD] is installed, "apply() replaced an applied patch"
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        vllm_compat.apply()
    prof.disable()
    stats = pstats.Stats(prof)
    top = sorted(stats.stats.items(), key=lambda kv: kv[1][3], reverse=True)  # cumulative time
    apply_profile = [f"{func[2]} ({os.path.basename(func[0])}:{func[1]}): {ct / 20 * 1e3:.2f} ms/call"
                     for func, (_, _, _, ct, _) in top[:14]]
    return {
        "loader_import_s": import_s,
        "first_hook_us": first["ns"] / 1e3 if first else None,
        "first_variant": first["variant"] if first else None,
        "first_hook_new_modules": first["new_modules"] if first else None,
        "first_hook_new_top_level": first["new_top_level"] if first else None,
        "apply_profile_top": apply_profile,
        "reload_hook_us_median": median([s["ns"] / 1e3 for s in warm]),
        "reload_hook_us_all": [round(s["ns"] / 1e3, 1) for s in warm],
        "reload_variants": sorted({str(s["variant"]) for s in warm}),
        "variant_after": installed_variant(cls),
        "apply_decisions": [f"{d.action}/{d.variant}" for d in decisions],
        "apply_us_per_call_median": median(per_call),
        "apply_us_per_call_runs": [round(x, 2) for x in per_call],
        "apply_iters": apply_iters,
    }


# ----------------------------------------------------------------------------------------------------------
# Section 3: loader processing
# ----------------------------------------------------------------------------------------------------------


def straggler_plan(n_quant: int):
    """~1% of the quant layers, spread evenly, alternating absent (proj_out) and fused-partial (proj_in)."""
    from tests.support.online_quant import Straggler

    n_blocks = n_quant // 2
    k = max(1, round(n_quant * 0.01))
    step = max(1, n_blocks // k)
    out = []
    for i in range(k):
        block = (i * step + step // 2) % n_blocks
        if i % 2 == 0:
            out.append(Straggler(f"blocks.{block}.proj_out", "absent"))
        else:
            out.append(Straggler(f"blocks.{block}.proj_in", "partial"))
    return tuple(out)


class Models:
    """Identical fresh models on demand: same shapes, same seed, same checkpoint tensors, same stragglers."""

    def __init__(self, n_quant: int, online: bool, hidden: int):
        from tests.support.online_quant import build_model, make_checkpoint

        self.n_quant, self.online, self.hidden = n_quant, online, hidden
        self.stragglers = straggler_plan(n_quant) if online else ()
        proto = build_model(n_quant // 2, hidden, online=False, stragglers=(), seed=0)
        self.checkpoint = make_checkpoint(proto, seed=1)
        del proto

    def fresh(self):
        from tests.support.online_quant import build_model, load_checkpoint

        model = build_model(self.n_quant // 2, self.hidden, online=self.online, stragglers=self.stragglers, seed=0)
        load_checkpoint(model, self.checkpoint)
        return model


def _tensor_bytes(model) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.is_meta:
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def _torch_peak_bytes(call) -> int:
    """Peak bytes newly allocated by torch's CPU allocator during ``call()`` and not yet freed.

    The profiler records every c10 CPU allocation/free with the reporter's running total (``total_allocated``).
    That total carries over between profiler sessions, so it is taken relative to the first event. Frees of
    blocks allocated before profiling started are not reported by torch, so this is an upper bound on the
    increase over the model's own bytes (same bound for every contender)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        call()
    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        fields = node.extra_fields
        if type(fields).__name__ == "_ExtraFields_Allocation" and str(fields.device) == "cpu":
            events.append((node.start_time_ns, fields.alloc_size, fields.total_allocated))
    if not events:
        return 0
    events.sort()
    base = events[0][2] - events[0][1]
    return max(0, max(total - base for _, _, total in events))


def _state_equal(a, b) -> bool:
    import torch

    sa, sb = a.state_dict(), b.state_dict()
    if sa.keys() != sb.keys():
        return False
    for k in sa:
        x, y = sa[k], sb[k]
        if x.dtype != y.dtype or x.shape != y.shape or x.device != y.device:
            return False
        if x.is_meta:
            continue
        if not torch.equal(x.contiguous().view(torch.uint8), y.contiguous().view(torch.uint8)):
            return False
    return True


def loader_contenders():
    """The three calls section 3 compares on one model, and the check each result must pass.

    Returns ``(contenders, check, extras)``: ``contenders`` maps meta_safe (through the installed patch: the
    production path) / in_tree (vllm-omni's own function object) / legacy to a one-argument call; ``check(name,
    model, models)`` raises where a param is left on meta or a quant layer unprocessed; ``extras`` holds the
    loader instance, the device and the deps for the per-call overhead rows."""
    import inspect

    import torch

    from tests.support.online_quant import PROCESSED_FLAG, meta_param_names, quant_layers
    from vllm_compat.patches import diffusers_loader as dl

    module = importlib.import_module(LOADER_MODULE)
    cls = getattr(module, CLASS_NAME)
    patched = vars(cls)[METHOD]
    if dl.installed_variant(cls) != "meta_safe":
        raise SystemExit(f"expected the hook to install meta_safe (VLLM_COMPAT_LOADER_VARIANT=meta_safe); got "
                         f"{dl.installed_variant(cls)!r}")
    in_tree = patched.__wrapped__  # vllm-omni's own function object, not ours
    assert not getattr(in_tree, "_vllm_compat_installed", False)
    assert "has_online_quant" in inspect.getsource(in_tree), "this vllm-omni's loader is not the gated in-tree method"
    deps = dl.resolve_deps()
    loader = object.__new__(cls)  # the variants and the in-tree method read nothing from self but a staticmethod
    device = torch.device("cpu")

    contenders = {
        "meta_safe": lambda m: loader._process_weights_after_loading(m, device),  # through the installed patch
        "in_tree": lambda m: in_tree(loader, m, device),
        "legacy": lambda m: dl.process_legacy(loader, m, device, deps=deps),
    }

    def check(name, model, models):
        problems = []
        if meta_param_names(model):
            problems.append(f"{len(meta_param_names(model))} params still on meta")
        unprocessed = [n for n, layer in quant_layers(model).items() if not getattr(layer, PROCESSED_FLAG, False)]
        if unprocessed:
            problems.append(f"{len(unprocessed)} quant layers unprocessed")
        if problems:
            raise AssertionError(f"{name} on {models.n_quant}/{'online' if models.online else 'offline'}: "
                                 + "; ".join(problems))

    extras = {"loader": loader, "device": device, "deps": deps, "in_tree": in_tree}
    return contenders, check, extras


def part_loader(sizes, hidden: int, reps: dict, quick: bool) -> dict:
    from torch import nn

    from tests.support.online_quant import deterministic_fill, meta_param_names
    from vllm_compat.patches import diffusers_loader as dl

    contenders, check, extras = loader_contenders()
    loader, device, deps, in_tree = extras["loader"], extras["device"], extras["deps"], extras["in_tree"]

    results = {"hidden": hidden, "cases": []}
    for n in sizes:
        for online in (True, False):
            models = Models(n, online, hidden)
            case = {"n_quant": n, "online": online, "stragglers": len(models.stragglers), "timings_ms": {},
                    "status": {}}
            names = ["meta_safe", "in_tree", "legacy"]
            active = []
            # One untimed run per contender: crash check and correctness. Deterministic fill makes the never-loaded
            # stragglers' values comparable.
            outputs = {}
            for name in names:
                with deterministic_fill():
                    model = models.fresh()
                    if "model_tensor_bytes" not in case:
                        case["model_tensor_bytes"] = _tensor_bytes(model)
                        case["meta_params_before"] = len(meta_param_names(model))
                    try:
                        contenders[name](model)
                    except Exception as exc:  # noqa: BLE001 - reported
                        first_line = str(exc).splitlines()[0][:60]
                        case["status"][name] = f"crashes ({type(exc).__name__}: {first_line})"
                        continue
                check(name, model, models)
                outputs[name] = model
                case["status"][name] = "ok"
                active.append(name)
            # Peak memory, MEMORY_ROUNDS rounds in rotated order, median per contender (a one-off growth, of the
            # interpreter or of torch's allocator accounting, lands on whoever calls first at a model size).
            # Tensors: torch's allocator peak over the call (profiler around the call only). Python heap: the peak
            # the call adds over the heap before it (tracemalloc, started after the build: the model's own objects
            # vary by build by more than the call adds, so absolute peaks of separate builds do not compare).
            # Each counter on a call of its own: the profiler's own Python objects, made while tracemalloc traced
            # the call, put up to 37 KB on the first contender of a round (2026-12-01 run, 100 layers online).
            tracemalloc.start()
            model = models.fresh()
            case["model_py_heap"], _ = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            del model
            torch_peaks = {name: [] for name in active}
            heap_added = {name: [] for name in active}
            for i in range(MEMORY_ROUNDS):
                for name in rotated(active, i):
                    with deterministic_fill():
                        model = models.fresh()
                        gc.collect()
                        torch_peaks[name].append(_torch_peak_bytes(lambda m=model, f=contenders[name]: f(m)))
                        del model
                        model = models.fresh()
                        gc.collect()
                        tracemalloc.start()
                        try:
                            before, _ = tracemalloc.get_traced_memory()
                            tracemalloc.reset_peak()
                            contenders[name](model)
                            _, peak = tracemalloc.get_traced_memory()
                        finally:
                            tracemalloc.stop()
                    heap_added[name].append(peak - before)
                    del model
            case["torch_peak_new_bytes"] = {name: median(v) for name, v in torch_peaks.items()}
            case["torch_peak_new_bytes_all"] = torch_peaks
            case["py_heap_added"] = {name: median(v) for name, v in heap_added.items()}
            case["py_heap_added_all"] = heap_added
            if "meta_safe" in outputs and "in_tree" in outputs:
                case["meta_safe_equals_in_tree"] = _state_equal(outputs["meta_safe"], outputs["in_tree"])
            if "legacy" in outputs and "in_tree" in outputs:
                case["legacy_equals_in_tree"] = _state_equal(outputs["legacy"], outputs["in_tree"])
            outputs.clear()
            # Timing: interleaved, rotating order, a fresh identical model per timed call, only the call timed
            # (wall clock and this thread's CPU time; the GC is collected before and paused during the call).
            r = reps[n]
            wall = {name: [] for name in active}
            cpu = {name: [] for name in active}
            for i in range(r):
                for name in rotated(active, i):
                    model = models.fresh()
                    gc.collect()
                    gc.disable()
                    c0 = time.thread_time_ns()
                    t0 = time.perf_counter_ns()
                    contenders[name](model)
                    t1 = time.perf_counter_ns()
                    c1 = time.thread_time_ns()
                    gc.enable()
                    wall[name].append((t1 - t0) / 1e6)
                    cpu[name].append((c1 - c0) / 1e6)
                    del model
            case["timings_ms"] = {name: median(v) for name, v in wall.items()}
            case["cpu_ms"] = {name: median(v) for name, v in cpu.items()}
            case["timings_ms_all"] = {name: [round(x, 3) for x in v] for name, v in wall.items()}
            case["cpu_ms_all"] = {name: [round(x, 3) for x in v] for name, v in cpu.items()}
            case["reps"] = r
            results["cases"].append(case)
            print(f"[worker] {n} {'online' if online else 'offline'}: {case['timings_ms']} {case['status']}",
                  file=sys.stderr, flush=True)

    # Per-call shim overhead on an empty model (no modules at all, so no quant work).
    empty = nn.Module()
    calls = {
        "wrapper": lambda: loader._process_weights_after_loading(empty, device),
        "direct_variant": lambda: dl.process_meta_safe(loader, empty, device, deps=deps),
        "in_tree": lambda: in_tree(loader, empty, device),
    }
    iters = 2000 if not quick else 200
    per = {k: [] for k in calls}
    per_cpu = {k: [] for k in calls}
    for i in range(15 if not quick else 3):
        for k in rotated(list(calls), i):
            f = calls[k]
            c0 = time.thread_time_ns()
            t0 = time.perf_counter_ns()
            for _ in range(iters):
                f()
            per[k].append((time.perf_counter_ns() - t0) / iters / 1e3)
            per_cpu[k].append((time.thread_time_ns() - c0) / iters / 1e3)
    results["overhead_us"] = {k: median(v) for k, v in per.items()}
    results["overhead_cpu_us"] = {k: median(v) for k, v in per_cpu.items()}
    results["overhead_iters"] = iters
    return results


def part_instructions(sizes, hidden: int, reps: dict, callgrind_lib: str) -> dict:
    """Section 3's calls counted in instructions, under ``valgrind --tool=callgrind --instr-atstart=no``.

    The VM this runs on has its CPU time stolen by its host, so time cannot resolve 1 % between two calls of a few
    ms (section 3); instructions executed can, and do not depend on what else the machine is doing. Only the call
    is instrumented (``bench/_callgrind.c``); the builds run uninstrumented. Every rep is a fresh identical model
    (PYTHONHASHSEED and one torch thread are set by bench/run.py), so the reps of one contender agree closely
    (within 0.2 % in the first runs); the spread is reported, not assumed. Each count is dumped under the label ``<size>:<online or
    offline>:<contender>:<rep>``; bench/run.py reads the dumps. Legacy is left out: it is not a goal's contender
    and crashes online."""
    import ctypes

    import torch

    lib = ctypes.CDLL(callgrind_lib)
    lib.vc_end.argtypes = [ctypes.c_char_p]
    if not lib.vc_running_on_valgrind():
        raise SystemExit("the instructions part counts under callgrind: run it through bench/run.py (section 3i)")
    torch.set_num_threads(1)
    contenders, check, _ = loader_contenders()
    names = ["meta_safe", "in_tree"]
    labels = []
    for n in sizes:
        for online in (True, False):
            models = Models(n, online, hidden)
            for i in range(reps[n]):
                for name in rotated(names, i):
                    model = models.fresh()
                    gc.collect()
                    gc.disable()
                    label = f"{n}:{'online' if online else 'offline'}:{name}:{i}"
                    lib.vc_begin()
                    contenders[name](model)
                    lib.vc_end(label.encode())
                    gc.enable()
                    check(name, model, models)
                    labels.append(label)
                    del model
            print(f"[worker] {n} {'online' if online else 'offline'}: counted {reps[n]} reps", file=sys.stderr,
                  flush=True)
    return {"hidden": hidden, "labels": labels}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="hook,loader")
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", default="100,1000,10000")
    parser.add_argument("--hidden", type=int, default=8)
    parser.add_argument("--reloads", type=int, default=15)
    parser.add_argument("--apply-iters", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="few repeats (smoke test)")
    parser.add_argument("--callgrind-lib", help="bench/_callgrind.c built as a shared library (instructions part)")
    args = parser.parse_args()
    parts = args.parts.split(",")
    out = {"env": {}}
    import platform
    from importlib import metadata

    for dist in ("torch", "vllm", "vllm-omni", "wrapt"):
        try:
            out["env"][dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out["env"][dist] = None
    out["env"]["python"] = platform.python_version()
    out["env"]["VLLM_COMPAT_LOADER_VARIANT"] = os.environ.get("VLLM_COMPAT_LOADER_VARIANT", "auto")
    if "hook" in parts:
        out["hook"] = part_hook(args.reloads if not args.quick else 2, args.apply_iters if not args.quick else 10)
    if "loader" in parts:
        sizes = [int(s) for s in args.sizes.split(",")]
        reps = {n: (3 if args.quick else (101 if n <= 100 else 31 if n <= 1000 else 9)) for n in sizes}
        out["loader"] = part_loader(sizes, args.hidden, reps, args.quick)
    if "instructions" in parts:
        sizes = [int(s) for s in args.sizes.split(",")]
        reps = {n: (2 if args.quick or n > 1000 else 3) for n in sizes}
        out["instructions"] = part_instructions(sizes, args.hidden, reps, args.callgrind_lib)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
