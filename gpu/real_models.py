"""The seed's scenarios on real vllm-omni models and vLLM's real online FP8 (issue 12).

    source gpu/device_env_real.sh && python -m gpu.real_models OUT.json --part meta      (F-meta, offload, timing)
                                     python -m gpu.real_models OUT.json --part hsdp      (Z-Image HSDP + layerwise)

vLLM 0.26.0 on its CUDA platform (its compiled ``_C_stable_libtorch``), vllm-omni 0.24.0 whole, vllm-omni 0.30.0's
in-tree loader method compiled out of its file (0.30.0 does not import on vLLM 0.26). Models: tests/support/omni_models.py.
Every load is vllm-omni 0.24.0's ``DiffusersPipelineLoader.load_model`` (what ``DiffusionModelRunner.load_model``
calls), under the worker's vLLM config and forward context; only the class's ``_process_weights_after_loading`` is
swapped per method:
  unpatched   vllm-omni 0.24.0's own method (run first: vllm_compat not yet imported)
  apply       ``vllm_compat.apply()``, the decision table's pick (recorded)
  legacy / meta_safe   a shim variant forced with ``install``
  ungated     the first upstream fix (per-parameter ``.data`` moves, no gate): tests/support/online_quant.py
  intree030   vllm-omni 0.30.0's method (+ its ``_has_online_quant``), compiled from its files
``quantization="fp8"``: vllm-omni 0.24.0 has no ``DiffusionFp8Config``; its factory builds vLLM's ``Fp8Config``, whose
non-serialized path is vLLM 0.26's ``Fp8PerTensorOnlineLinearMethod`` (``uses_meta_device=True``).

GPU_CHECK_TINY=1 GPU_CHECK_DEVICE=cpu runs the harness on a CPU with tiny models (BF16 only: no FP8 kernels there).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from tests.support import omni_models as om

METHOD = "_process_weights_after_loading"
CKPT_ROOT = Path(os.environ.get("GPU_CHECK_CKPT", "/tmp/vc_ckpt"))
OMNI30 = Path(os.environ.get("OMNI30_DIR", "/tmp/vc/omni30src"))
DEVICE_TYPE = os.environ.get("GPU_CHECK_DEVICE", "cuda")
ARCHS = {"qwen": om.QWEN_ARCH, "zimage": om.ZIMAGE_ARCH}


def log(*a):
    print(*a, flush=True)


def capture(fn):
    try:
        return {"ok": True, "error": None, "where": None}, fn()
    except Exception as exc:  # noqa: BLE001 - the outcome is the result
        tb = traceback.extract_tb(exc.__traceback__)
        frames = [f"{Path(f.filename).name}:{f.lineno}" for f in tb[-4:]]
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:400], "where": frames}, None


def sync():
    if DEVICE_TYPE == "cuda":
        torch.cuda.synchronize()


def free():
    gc.collect()
    if DEVICE_TYPE == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------------------ environment


class Env:
    """The diffusion worker's environment, set up as ``DiffusionWorker.init_device`` does (once per process)."""

    def __init__(self, *, hsdp: bool):
        from vllm_omni.diffusion.distributed.parallel_state import (
            init_distributed_environment,
            initialize_model_parallel,
        )
        from vllm_omni.platforms import current_omni_platform

        os.environ.setdefault("MASTER_ADDR", "localhost")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 1000))
        for k, v in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}.items():
            os.environ.setdefault(k, v)
        self.platform = current_omni_platform
        if DEVICE_TYPE == "cuda":
            self.device = current_omni_platform.get_torch_device(0)
            current_omni_platform.set_device(self.device)
        else:
            # CPU dry run of the harness only: vllm-omni's distributed init divides by the device count.
            self.device = torch.device("cpu")
            plat = type(current_omni_platform)
            plat.get_device_count = classmethod(lambda cls: 1)
            plat.set_device = classmethod(lambda cls, d: None)
            plat.get_torch_device = classmethod(lambda cls, *a: torch.device("cpu"))
            plat.get_diffusion_attn_backend_cls = classmethod(
                lambda cls, *a, **k: "vllm_omni.diffusion.attention.backends.sdpa.SDPABackend")
        od = self.od_config(om.ZIMAGE_ARCH, CKPT_ROOT / "config_only" / om.ZIMAGE_ARCH, quant=None, hsdp=hsdp)
        with self.context(od):
            backend = None if DEVICE_TYPE == "cuda" else "gloo"  # the platform's own backend on CUDA (nccl)
            init_distributed_environment(world_size=1, rank=0, backend=backend)
            initialize_model_parallel(fully_shard_degree=1, hsdp_replicate_size=1, backend=backend)
            if DEVICE_TYPE == "cuda":
                from vllm.v1.worker.workspace import init_workspace_manager

                init_workspace_manager(self.device)

    @staticmethod
    def od_config(arch, ckpt, *, quant, hsdp=False, layerwise=False):
        from vllm_omni.diffusion.data import DiffusionParallelConfig, OmniDiffusionConfig

        parallel = DiffusionParallelConfig(use_hsdp=hsdp, hsdp_shard_size=1 if hsdp else -1, hsdp_replicate_size=1)
        # SDPA attention: the FA backends need vLLM's FA2 / fa3_fwd builds, which are not carried (and attention
        # is not what is under test).
        od = OmniDiffusionConfig.from_kwargs(
            model=str(ckpt), model_class_name=arch, dtype=torch.bfloat16, quantization_config=quant,
            parallel_config=parallel, enable_layerwise_offload=layerwise, num_gpus=1, enforce_eager=True,
            diffusion_attention_backend="TORCH_SDPA",
        )
        od.enrich_config()  # reads model_index.json + transformer/config.json, as StageDiffusionProc does
        return od

    def vllm_config(self, od):
        """``DiffusionWorker.init_device``'s worker-local VllmConfig, for this od_config."""
        from vllm_omni.diffusion.worker import diffusion_worker as dw

        device = self.device if DEVICE_TYPE == "cuda" else torch.device("cpu")
        cfg = dw._create_diffusion_worker_vllm_config(device, od)
        cfg.parallel_config.tensor_parallel_size = od.parallel_config.tensor_parallel_size
        cfg.parallel_config.data_parallel_size = od.parallel_config.data_parallel_size
        cfg.model_config = dw._make_diffusion_vllm_model_config(od)
        cfg.quant_config = od.quantization_config
        return cfg

    @contextlib.contextmanager
    def context(self, od):
        from vllm.config import set_current_vllm_config
        from vllm_omni.diffusion.forward_context import set_forward_context

        cfg = self.vllm_config(od)
        with set_forward_context(vllm_config=cfg, omni_diffusion_config=od), set_current_vllm_config(cfg):
            yield

    def load(self, od, *, load_device: str):
        """``DiffusionModelRunner.load_model``'s call: ``DiffusersPipelineLoader(LoadConfig(), od).load_model``."""
        from vllm.config.load import LoadConfig
        from vllm_omni.diffusion.model_loader.diffusers_loader import DiffusersPipelineLoader

        with self.context(od):
            loader = DiffusersPipelineLoader(LoadConfig(), od_config=od)
            return loader.load_model(load_device=load_device, device=self.device)

    def enable_offload(self, od, pipeline):
        from vllm_omni.diffusion.offloader import get_offload_backend

        with self.context(od):
            backend = get_offload_backend(od, device=self.device)
            if backend is None:
                return None
            backend.enable(pipeline)
            return type(backend).__name__


# ------------------------------------------------------------------------------------------------ methods


class Methods:
    """Swaps ``DiffusersPipelineLoader._process_weights_after_loading``; ``use(name)`` is a context manager."""

    def __init__(self):
        from vllm_omni.diffusion.model_loader.diffusers_loader import DiffusersPipelineLoader

        self.cls = DiffusersPipelineLoader
        self.original = vars(self.cls)[METHOD]
        self.decisions = None
        self.intree = None
        loader30 = OMNI30 / "vllm_omni/diffusion/model_loader/diffusers_loader.py"
        if loader30.exists():
            self.intree = om.intree_030(str(loader30), str(OMNI30 / "vllm_omni/diffusion/model_loader/host_weight_plan.py"))

    @contextlib.contextmanager
    def use(self, name: str):
        cls = self.cls
        if name == "unpatched":
            assert "vllm_compat" not in sys.modules, "unpatched must run before vllm_compat is imported"
            yield
            return
        if name.startswith("apply"):
            # vllm_compat.apply() under its public controls: "apply" (auto), "apply:legacy" (forced loader variant),
            # "apply:no_order" (the HSDP load-order patch left alone), or both ("apply:legacy,no_order").
            import vllm_compat

            opts = set(name.partition(":")[2].split(",")) - {""}
            env = {}
            if "legacy" in opts:
                env["VLLM_COMPAT_LOADER_VARIANT"] = "legacy"
            if "no_order" in opts:
                env["VLLM_COMPAT_DISABLE_PATCHES"] = "hsdp_load_order"
            saved = {k: os.environ.get(k) for k in ("VLLM_COMPAT_LOADER_VARIANT", "VLLM_COMPAT_DISABLE_PATCHES")}
            os.environ.update(env)
            try:
                decisions = vllm_compat.apply()
                self.decisions = [
                    {"patch": getattr(d, "patch_id", None) or getattr(d, "name", None), "action": str(d.action),
                     "variant": d.variant, "reason": d.reason} for d in decisions
                ]
                yield
            finally:
                vllm_compat.revert()
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
            return
        if name == "ungated":
            from tests.support import online_quant as oq

            setattr(cls, METHOD, oq.ungated_process_weights_after_loading)
        elif name == "intree030":
            method, hoq, _ = self.intree
            setattr(cls, METHOD, method)
            cls._has_online_quant = staticmethod(hoq)
        else:
            raise ValueError(name)
        try:
            yield
        finally:
            setattr(cls, METHOD, self.original)
            if "_has_online_quant" in vars(cls):
                delattr(cls, "_has_online_quant")


@contextlib.contextmanager
def record_processing(cls, into: dict):
    """Record the params on meta when ``_process_weights_after_loading`` is entered and left (wraps whatever method
    is installed; not used in timed loads)."""
    current = vars(cls)[METHOD]

    def recorder(self, model, target_device, *a, **k):
        into.setdefault("calls", 0)
        into["calls"] += 1
        into["meta_on_entry"] = [n for n, p in model.named_parameters() if p.is_meta]
        into["target_device"] = str(target_device)
        into["dtensor_params_on_entry"] = sum(type(p).__name__ == "DTensor" or type(p.data).__name__ == "DTensor"
                                              for p in model.parameters())
        try:
            return current.__get__(self, type(self))(model, target_device, *a, **k)
        finally:
            into["meta_on_exit"] = [n for n, p in model.named_parameters() if p.is_meta]

    setattr(cls, METHOD, recorder)
    try:
        yield
    finally:
        setattr(cls, METHOD, current)


# ------------------------------------------------------------------------------------------------ checks


def linear_report(pipeline) -> dict:
    """Every vLLM linear and what it holds after loading."""
    from vllm.model_executor.layers.linear import LinearBase

    fp8, full_precision, problems = [], [], []
    for name, mod in pipeline.named_modules():
        if not isinstance(mod, LinearBase):
            continue
        qm = type(mod.quant_method).__name__
        w = mod.weight
        if qm == "UnquantizedLinearMethod":
            full_precision.append(name)
            continue
        if w.dtype == torch.float8_e4m3fn and not w.is_meta and getattr(mod, "weight_scale", None) is not None:
            fp8.append(name)
        else:
            problems.append(f"{name}: {qm} {w.dtype}@{w.device}")
    methods = sorted({type(m.quant_method).__name__ for m in pipeline.modules() if isinstance(m, LinearBase)})
    return {"fp8_linears": len(fp8), "full_precision_linears": len(full_precision), "not_fp8": problems[:8],
            "n_not_fp8": len(problems), "quant_methods": methods,
            "full_precision_examples": full_precision[:4],
            "kernels": sorted({type(getattr(m.quant_method, "fp8_linear", None)).__name__
                               for m in pipeline.modules() if isinstance(m, LinearBase) and hasattr(m.quant_method, "fp8_linear")})}


def fingerprint(pipeline, skip: set[str]) -> dict:
    """Sum of FP8 weights (as float) and scales of the FP8 linears not in ``skip`` (stragglers are materialized from
    uninitialized memory by vLLM, so their values are whatever memory they got)."""
    total, n = 0.0, 0
    for name, mod in pipeline.named_modules():
        w = getattr(mod, "weight", None)
        if w is None or w.dtype != torch.float8_e4m3fn or any(name == s or name.startswith(s + ".") for s in skip):
            continue
        total += float(w.float().sum()) + float(mod.weight_scale.float().sum())
        n += 1
    return {"sum": total, "layers": n}


def check_against_checkpoint(pipeline, ckpt: Path, arch: str, skip: set[str]) -> dict:
    """Each FP8 linear loaded in full holds exactly ``ops.scaled_fp8_quant(checkpoint weight)`` (vLLM's own quant op
    on the checkpoint tensor, fused shards concatenated)."""
    from safetensors import safe_open
    from vllm import _custom_ops as ops

    fused = om._FUSED[arch]
    bad, checked = [], 0
    with safe_open(str(ckpt / "transformer/diffusion_pytorch_model.safetensors"), framework="pt", device=str(DEVICE_TYPE)) as f:
        keys = set(f.keys())
        for name, mod in pipeline.named_modules():
            w = getattr(mod, "weight", None)
            if w is None or w.dtype != torch.float8_e4m3fn or any(name == s or name.startswith(s + ".") for s in skip):
                continue
            rel = name.removeprefix("transformer.") + ".weight"
            parts = None
            for frag, shards in fused:
                if frag in rel:
                    parts = [rel.replace(frag, s) for s in shards]
                    break
            parts = parts or [rel]
            if not all(p in keys for p in parts):
                bad.append(f"{name}: checkpoint lacks {parts}")
                continue
            full = torch.cat([f.get_tensor(p) for p in parts])
            qw, qs = ops.scaled_fp8_quant(full, scale=None)
            held = w.t() if not w.is_contiguous() else w
            if not (torch.equal(held.contiguous().view(torch.uint8), qw.view(torch.uint8)) and torch.equal(mod.weight_scale.reshape(-1), qs.reshape(-1))):
                bad.append(f"{name}: differs from scaled_fp8_quant(checkpoint)")
            checked += 1
    return {"checked": checked, "mismatches": bad[:5], "n_mismatches": len(bad)}


def straggler_layers(arch: str) -> set[str]:
    spec = om.STRAGGLERS[arch]
    return {spec.padded_param.rsplit(".", 1)[0], spec.missing_layer}


def straggler_state(pipeline, arch: str) -> dict:
    mods = dict(pipeline.named_modules())
    out = {}
    for name in sorted(straggler_layers(arch)):
        m = mods[name]
        out[name] = {"dtype": str(m.weight.dtype), "device": str(m.weight.device),
                     "scale": None if getattr(m, "weight_scale", None) is None else float(m.weight_scale.float().max())}
    return out


def run_forward(pipeline, arch, inputs) -> tuple[dict, torch.Tensor | None]:
    """One forward; counts vLLM's FP8 ops seen by the profiler (CPU-side op records)."""
    from torch.profiler import ProfilerActivity, profile

    res = {}
    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            out = om.forward(pipeline, arch, inputs)
            sync()
    except Exception as exc:  # noqa: BLE001
        res["forward_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
        res["forward_where"] = [f"{Path(f.filename).name}:{f.lineno}" for f in traceback.extract_tb(exc.__traceback__)[-4:]]
        return res, None
    counts: dict[str, int] = {}
    for ev in prof.events():
        n = ev.name
        if "scaled_mm" in n or "fp8_quant" in n:
            counts[n] = counts.get(n, 0) + 1
    res["fp8_ops"] = counts
    res["output_finite"] = bool(torch.isfinite(out.float()).all())
    return res, out.float().cpu()


def compare(out: torch.Tensor, ref: torch.Tensor) -> dict:
    d = (out - ref).double()
    rel = float(d.norm() / ref.double().norm())
    cos = float(torch.nn.functional.cosine_similarity(out.double().flatten(), ref.double().flatten(), dim=0))
    return {"rel_l2": rel, "max_abs": float(d.abs().max()), "cosine": cos, "ref_abs_mean": float(ref.abs().mean())}


# ------------------------------------------------------------------------------------------------ checkpoints


def prepare_checkpoints(env: Env, arch: str) -> dict:
    """model_index.json + config (to build the model on meta and read its parameter shapes), then a full checkpoint
    and one with the two stragglers, written as safetensors on the local disk."""
    info = {}
    cfg_dir = CKPT_ROOT / "config_only" / arch
    om.write_config_only(cfg_dir, arch)
    od = env.od_config(arch, cfg_dir, quant=None)
    from vllm_omni.diffusion.registry import initialize_model

    with env.context(od), torch.device("meta"):
        meta_model = initialize_model(od)
    shapes = om.checkpoint_shapes(meta_model, arch)
    info["params"] = sum(p.numel() for p in meta_model.parameters())
    del meta_model
    gen_dev = "cuda" if DEVICE_TYPE == "cuda" else "cpu"
    for kind in ("full", "stragglers"):
        t0 = time.perf_counter()
        info[kind] = om.write_checkpoint(CKPT_ROOT / arch / kind, arch, shapes, stragglers=kind == "stragglers", device=gen_dev)
        info[kind]["write_s"] = round(time.perf_counter() - t0, 2)
    return info


# ------------------------------------------------------------------------------------------------ part: meta


def load_case(env: Env, methods: Methods, method: str, arch: str, kind: str, *, quant, layerwise=False,
              hsdp=False, reference=None, inputs=None, deep_check=False) -> dict:
    ckpt = CKPT_ROOT / arch / kind
    od = env.od_config(arch, ckpt, quant=quant, hsdp=hsdp, layerwise=layerwise)
    load_device = "cpu" if layerwise else str(env.device)
    case = {"method": method, "arch": arch, "checkpoint": kind, "quant": quant, "layerwise_offload": layerwise,
            "hsdp": hsdp, "load_device": load_device}
    rec: dict = {}
    with methods.use(method), record_processing(methods.cls, rec):
        outcome, pipe = capture(lambda: env.load(od, load_device=load_device))
    case["load"] = outcome
    case["processing"] = rec
    if method.startswith("apply"):
        case["decisions"] = methods.decisions
    if pipe is None:
        free()
        return case
    case["param_devices"] = sorted({str(p.device) for p in pipe.parameters()})
    case["meta_after"] = [n for n, p in pipe.named_parameters() if p.is_meta]
    if quant:
        case["linears"] = linear_report(pipe)
        skip = straggler_layers(arch) if kind == "stragglers" else set()
        case["fingerprint"] = fingerprint(pipe, skip)
        if kind == "stragglers":
            case["stragglers"] = straggler_state(pipe, arch)
        if deep_check:
            case["vs_checkpoint"] = check_against_checkpoint(pipe, ckpt, arch, skip)
    if layerwise:
        o, name = capture(lambda p=pipe: env.enable_offload(od, p))
        case["offload_backend"] = name if o["ok"] else o
        case["param_devices_after_offload_enable"] = sorted({str(p.device) for p in pipe.parameters()})
    if inputs is not None:
        fw, out = run_forward(pipe, arch, inputs)
        case.update(fw)
        if out is not None and reference is not None:
            case["vs_bf16"] = compare(out, reference)
        case["_out"] = out
    del pipe
    free()
    return case


def timed_loads(env, methods, arch, kind, names, repeats) -> dict:
    """``load_model`` as a whole per method: wall time between synchronizes, peak allocated above the start."""
    od = env.od_config(arch, CKPT_ROOT / arch / kind, quant="fp8")
    rows = {n: {"samples_s": [], "peak_mib": []} for n in names}
    order = list(names)
    for r in range(repeats + 1):  # round 0: warm-up, not recorded
        for name in order:
            free()
            with methods.use(name):
                sync()
                if DEVICE_TYPE == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                    base = torch.cuda.memory_allocated()
                t0 = time.perf_counter()
                pipe = env.load(od, load_device=str(env.device))
                sync()
                dt = time.perf_counter() - t0
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20 if DEVICE_TYPE == "cuda" else 0.0
                held = (torch.cuda.memory_allocated() - base) / 2**20 if DEVICE_TYPE == "cuda" else 0.0
            del pipe
            if r:
                rows[name]["samples_s"].append(dt)
                rows[name]["peak_mib"].append(peak)
                rows[name].setdefault("held_mib", held)
        order = order[1:] + order[:1]
    ref = names[0]
    for row in rows.values():
        row["median_s"] = statistics.median(row["samples_s"])
        row["min_s"] = min(row["samples_s"])
        row["max_s"] = max(row["samples_s"])
        row["peak_mib_median"] = statistics.median(row["peak_mib"])
        row["ratio_vs_" + ref] = row["median_s"] / statistics.median(rows[ref]["samples_s"])
        row["paired_ratio_vs_" + ref] = statistics.median(
            a / b for a, b in zip(row["samples_s"], rows[ref]["samples_s"], strict=True))
    return {"arch": arch, "checkpoint": kind, "repeats": repeats, "rows": rows}


PARTIAL: dict = {}


def dump_partial() -> None:
    path = PARTIAL.get("path")
    if path:
        Path(path).write_text(json.dumps(PARTIAL["report"], indent=1, default=str))


def harness_error(report: dict, where: str, exc: BaseException) -> None:
    report.setdefault("harness_errors", []).append(
        {"where": where, "error": f"{type(exc).__name__}: {exc}"[:500],
         "trace": [f"{Path(f.filename).name}:{f.lineno}" for f in traceback.extract_tb(exc.__traceback__)[-6:]]})
    log("HARNESS ERROR", where, repr(exc)[:300])
    dump_partial()


def part_meta(env: Env, methods: Methods, archs, repeats: int) -> dict:
    report = PARTIAL["report"]
    report.update({"checkpoints": {}, "cases": [], "timing": []})
    fp8 = "fp8" if DEVICE_TYPE == "cuda" else None
    for arch in archs:
        report["checkpoints"][arch] = prepare_checkpoints(env, arch)
        log(arch, "checkpoints", json.dumps(report["checkpoints"][arch])[:400])
    # 1. unpatched first (vllm_compat not imported yet): the straggler checkpoint, then the full one.
    refs, inputs = {}, {}
    for arch in archs:
        inputs[arch] = om.make_inputs(arch, env.device)
        bf16 = load_case(env, methods, "unpatched", arch, "full", quant=None, inputs=inputs[arch])
        refs[arch] = bf16.pop("_out")
        report["cases"].append(bf16)
        log(json.dumps(bf16, default=str)[:600])
    plan = []
    for arch in archs:
        plan += [("unpatched", arch, "stragglers", False), ("unpatched", arch, "full", False)]
        if arch == om.ZIMAGE_ARCH:
            plan += [("unpatched", arch, "stragglers", True)]
    for arch in archs:
        plan += [("apply", arch, "stragglers", False), ("intree030", arch, "stragglers", False),
                 ("apply", arch, "full", False), ("intree030", arch, "full", False)]
        if arch == om.ZIMAGE_ARCH:
            plan += [("apply", arch, "stragglers", True), ("intree030", arch, "stragglers", True),
                     ("apply", arch, "full", True)]
    outs = {}
    for method, arch, kind, layerwise in plan:
        if method == "intree030" and methods.intree is None:
            continue
        try:
            case = load_case(env, methods, method, arch, kind, quant=fp8, layerwise=layerwise,
                             reference=refs[arch] if kind == "full" else None, inputs=inputs[arch],
                             deep_check=method in ("apply", "intree030") and not layerwise)
        except Exception as exc:  # noqa: BLE001
            harness_error(report, f"{method} {arch} {kind} layerwise={layerwise}", exc)
            free()
            continue
        out = case.pop("_out", None)
        if out is not None:
            outs[(method, arch, kind, layerwise)] = out
        report["cases"].append(case)
        log(json.dumps(case, default=str)[:900])
        dump_partial()
    # Same result, shim vs in-tree (and vs unpatched where it ran): output tensors bit for bit.
    same = []
    for (method, arch, kind, layerwise), out in outs.items():
        # Straggler checkpoints: the straggler layers are materialized from uninitialized memory (by vLLM's design),
        # so their outputs differ between any two loads; those are compared by fingerprint instead.
        if method == "intree030" or kind != "full":
            continue
        key = ("intree030", arch, kind, layerwise)
        if key in outs:
            same.append({"method": method, "arch": arch, "checkpoint": kind, "layerwise_offload": layerwise,
                         "equal_to_intree030": bool(torch.equal(out, outs[key])),
                         "max_abs_vs_intree030": float((out - outs[key]).abs().max())})
    report["same_output"] = same
    if fp8 and repeats:
        for arch in archs:
            try:
                t = timed_loads(env, methods, arch, "stragglers", ["intree030", "apply"], repeats)
            except Exception as exc:  # noqa: BLE001
                harness_error(report, f"timing {arch}", exc)
                continue
            report["timing"].append(t)
            log(json.dumps({k: {kk: vv for kk, vv in v.items() if kk not in ("samples_s", "peak_mib")}
                            for k, v in t["rows"].items()}))
    return report


# ------------------------------------------------------------------------------------------------ part: hsdp


def part_hsdp(env: Env, methods: Methods) -> dict:
    arch = om.ZIMAGE_ARCH
    report = PARTIAL["report"]
    report.update({"checkpoints": {arch: prepare_checkpoints(env, arch)}, "cases": []})
    inputs = om.make_inputs(arch, env.device)
    ref_case = load_case(env, methods, "unpatched", arch, "full", quant=None, inputs=inputs)
    ref = ref_case.pop("_out")
    report["cases"].append(ref_case)
    fp8 = "fp8" if DEVICE_TYPE == "cuda" else None
    # BF16 (every vLLM linear has UnquantizedLinearMethod, a QuantizeMethodBase): the seed's layerwise_hsdp setup.
    # Every "unpatched" case first: vllm_compat must not be imported before them.
    plan = [("unpatched", None, "full")]
    if fp8:
        plan += [("unpatched", fp8, "full"), ("unpatched", fp8, "stragglers")]
    plan += [(m, None, "full") for m in ("ungated", "apply:no_order", "apply:legacy,no_order", "intree030", "apply",
                                         "apply:legacy")]
    if fp8:
        plan += [(m, fp8, "full") for m in ("ungated", "apply:no_order", "intree030", "apply")]
        plan += [(m, fp8, "stragglers") for m in ("apply:no_order", "intree030", "apply")]
    for method, quant, kind in plan:
        if method == "intree030" and methods.intree is None:
            continue
        try:
            case = load_case(env, methods, method, arch, kind, quant=quant, layerwise=True, hsdp=True,
                             reference=ref if (kind == "full") else None, inputs=inputs)
        except Exception as exc:  # noqa: BLE001
            harness_error(report, f"{method} {quant} {kind}", exc)
            free()
            continue
        case.pop("_out", None)
        report["cases"].append(case)
        log(json.dumps(case, default=str)[:900])
        dump_partial()
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--part", choices=("meta", "hsdp"), required=True)
    ap.add_argument("--archs", default="qwen,zimage")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    t_start = time.perf_counter()
    om.register()
    om.write_config_only(CKPT_ROOT / "config_only" / om.ZIMAGE_ARCH, om.ZIMAGE_ARCH)
    env = Env(hsdp=args.part == "hsdp")
    methods = Methods()
    from gpu import common

    report = {"versions": common.versions(), "part": args.part, "device": str(env.device),
              "platform": type(env.platform).__name__,
              "intree030_sha": methods.intree[2] if methods.intree else None}
    try:
        import vllm.platforms as vp

        report["vllm_platform"] = type(vp.current_platform).__name__
    except Exception as exc:  # noqa: BLE001
        report["vllm_platform"] = f"error: {exc}"
    PARTIAL.update(path=args.out, report=report)
    try:
        if args.part == "meta":
            part_meta(env, methods, [ARCHS[a] for a in args.archs.split(",")], args.repeats)
        else:
            part_hsdp(env, methods)
    except Exception as exc:  # noqa: BLE001 - keep what ran
        harness_error(report, args.part, exc)
    import importlib.util

    spec = importlib.util.find_spec("vllm_compat")  # after the runs: finding it does not import it, listing is safe
    report["vllm_compat_patch_modules"] = sorted(p.name for p in (Path(spec.origin).parent / "patches").glob("*.py"))
    report["wall_s"] = round(time.perf_counter() - t_start, 1)
    Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    log("wrote", args.out, "in", report["wall_s"], "s")


if __name__ == "__main__":
    main()
