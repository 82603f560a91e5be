"""What the installed vllm-omni's diffusion path does on the installed vLLM, as one record a cell can compare with
the record of vllm-omni's own (native) vLLM.

    python -m tests.support.diffusion_path OUT.json [--no-modules]

run in a fresh interpreter, as a worker starts: the startup hook (if installed) and ``vllm_compat.apply()`` are
in place before vllm-omni is imported. The record holds:

* ``modules``: every module of the diffusion path (``vllm_omni``, ``vllm_omni.diffusion.*``, the quant configs
  ``vllm_omni.quantization.*``, the ``Omni`` / ``AsyncOmni`` entrypoints), and whether it imports (``null``) or
  the first line of what it raises;
* ``models``: vllm-omni's own Qwen-Image and Z-Image transformers at tiny sizes (``tests/support/omni_models.py``),
  from a checkpoint written here as safetensors, once complete and once with stragglers (a fused projection
  missing a shard, a linear missing entirely), loaded by ``DiffusersPipelineLoader.load_model``
  (``load_weights`` then ``_process_weights_after_loading``) with online quant (the CPU double behind vLLM's
  real layerwise machinery), then one forward: a digest of every parameter after loading and of the output, each
  parameter's dtype and shape (``layout``), and what of the stragglers' layers the checkpoint leaves unloaded
  (``never_loaded``).

Never-loaded straggler elements are whatever vLLM materializes them with: values the test does not control. The
loads run under torch's deterministic fill, so within one vLLM they are the same in every run (NaN up to vLLM
0.33), but vLLM 0.34's layerwise reload also processes a layer with nothing loaded (0.33 skipped it), so on 0.34
the FP8 weight and scale of both stragglers' layers differ from the native record's, for every vllm-omni release
alike, vllm-omni's own loader included. So the record says, per model, which parameters hold never-loaded elements
(``never_loaded``: derived from what the written checkpoint leaves out, not from the load), and
``model_differences`` holds those to being materialized with the right dtype and shape (and their loaded rows to
the checkpoint), every other parameter bit for bit. A straggler-free checkpoint keeps the forward's output finite
and meaningful: that output is compared; the stragglers' output, which reads never-loaded elements, is not.

The native records (``matrix/native/vllm-omni-<version>.json``) are written by ``nox -s native`` in the cells
marked ``native`` in ``matrix/vllm.toml``; ``tests/bridges/test_diffusion_path.py`` compares a cell's record
with them.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

NATIVE_DIR = Path(__file__).resolve().parents[2] / "matrix" / "native"
CHECKPOINT_KINDS = ("complete", "stragglers")
# How far a forward's output may move between two CPUs (measured: 4.5e-6 and 8.9e-5 relative on the abs mean
# between an AMD EPYC and an Intel Xeon with AVX-512 kernels, same wheels); the parameters, compared bit for bit
# on any CPU, carry the load's check.
OTHER_CPU_OUTPUT_RTOL = 1e-3


def native_record_path(omni_version: str) -> Path:
    return NATIVE_DIR / f"vllm-omni-{omni_version}.json"


# ------------------------------------------------------------------------------------------------ modules


# The diffusion path by module: the package, its quant configs, and the entrypoints a diffusion stage is served from.
PATH_PACKAGES = ("diffusion", "quantization")
PATH_MODULES = ("vllm_omni", "vllm_omni.entrypoints.omni", "vllm_omni.entrypoints.async_omni")


def diffusion_module_names() -> list[str]:
    """Every module of the diffusion path, by its files (nothing imported to list them)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm_omni")
    root = Path(next(iter(spec.submodule_search_locations)))
    names = [name for name in PATH_MODULES
             if name == "vllm_omni" or (root.parent / f"{name.replace('.', '/')}.py").exists()]
    for package in PATH_PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join(parts))
    return names


def import_outcomes(names: list[str]) -> dict[str, str | None]:
    """name -> None if it imports, else the first line of what it raised."""
    outcomes: dict[str, str | None] = {}
    for name in names:
        try:
            importlib.import_module(name)
            outcomes[name] = None
        except BaseException as exc:  # noqa: BLE001 - SystemExit from a module is an outcome too
            outcomes[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
    return outcomes


# ------------------------------------------------------------------------------------------------ models


def _digest(tensor) -> str:
    import torch

    data = tensor.detach().cpu().contiguous()
    raw = data.view(torch.uint8) if data.dtype.itemsize == 1 else data.view(-1).view(torch.uint8)
    return hashlib.sha256(f"{data.dtype}{tuple(data.shape)}".encode() + raw.numpy().tobytes()).hexdigest()[:16]


class CpuWorker:
    """The diffusion worker's process state on a CPU, set up as ``DiffusionWorker.init_device`` does: a
    worker-local ``VllmConfig``, a one-rank gloo world group, TP=1, SDPA attention."""

    def __init__(self, config_dir: Path, arch: str):
        import torch
        from vllm_omni.diffusion.distributed.parallel_state import (
            init_distributed_environment,
            initialize_model_parallel,
        )
        from vllm_omni.platforms import current_omni_platform

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
        for key, value in {"LOCAL_RANK": "0", "RANK": "0", "WORLD_SIZE": "1"}.items():
            os.environ.setdefault(key, value)
        # vllm-omni's platform has no CPU answers for these (it would divide by a device count of 0, and 0.24.0's
        # attention selection has no CPU branch): the worker's device is the CPU, its attention SDPA.
        platform = type(current_omni_platform)
        platform.get_device_count = classmethod(lambda cls: 1)
        platform.set_device = classmethod(lambda cls, device: None)
        platform.get_torch_device = classmethod(lambda cls, *args: torch.device("cpu"))
        platform.get_diffusion_attn_backend_cls = classmethod(
            lambda cls, *args, **kwargs: "vllm_omni.diffusion.attention.backends.sdpa.SDPABackend")
        from vllm_omni.diffusion.attention.backends.sdpa import SDPAImpl

        SDPAImpl.forward = SDPAImpl.forward_cuda  # its dispatch has no CPU branch; the CUDA one is plain torch SDPA
        self.device = torch.device("cpu")
        with self.context(self.od_config(arch, config_dir, quant=None)):
            init_distributed_environment(world_size=1, rank=0, backend="gloo")
            initialize_model_parallel(fully_shard_degree=1, backend="gloo")

    @staticmethod
    def od_config(arch: str, checkpoint: Path, *, quant):
        import torch
        from vllm_omni.diffusion.data import OmniDiffusionConfig

        od = OmniDiffusionConfig.from_kwargs(
            model=str(checkpoint), model_class_name=arch, dtype=torch.bfloat16, quantization_config=quant,
            num_gpus=1, enforce_eager=True, diffusion_attention_backend="TORCH_SDPA",
        )
        od.enrich_config()  # reads model_index.json + transformer/config.json, as the diffusion stage does
        return od

    def vllm_config(self, od):
        """The worker-local ``VllmConfig``, built by whichever function this vllm-omni's worker uses."""
        import importlib.util

        if importlib.util.find_spec("vllm_omni.diffusion.vllm_config") is not None:  # vllm-omni 0.30.0
            from vllm_omni.diffusion.vllm_config import create_diffusion_vllm_config

            return create_diffusion_vllm_config(self.device, od)
        from vllm_omni.diffusion.worker import diffusion_worker as worker

        config = worker._create_diffusion_worker_vllm_config(self.device, od)
        config.model_config = worker._make_diffusion_vllm_model_config(od)
        config.quant_config = od.quantization_config
        return config

    @contextlib.contextmanager
    def context(self, od):
        from vllm.config import set_current_vllm_config
        from vllm_omni.diffusion.forward_context import set_forward_context

        config = self.vllm_config(od)
        with set_forward_context(vllm_config=config, omni_diffusion_config=od), set_current_vllm_config(config):
            yield

    def load(self, od):
        """``DiffusionModelRunner.load_model``'s call, loading on the worker's device. No ``device``: with one, a
        "cpu" load device means CPU offload after quantizing on that device, which on a CPU-only machine is the
        same device and, in vllm-omni 0.30.0, ends in ``torch.accelerator.empty_cache()`` (no accelerator)."""
        from vllm.config.load import LoadConfig
        from vllm_omni.diffusion.model_loader.diffusers_loader import DiffusersPipelineLoader

        with self.context(od):
            return DiffusersPipelineLoader(LoadConfig(), od_config=od).load_model(load_device=self.device.type)


def _layout(tensor) -> str:
    return f"{str(tensor.dtype).removeprefix('torch.')} {list(tensor.shape)}"


def never_loaded_rows(arch: str, shapes: dict[str, tuple[int, ...]], dropped) -> dict[str, list[list[int]]]:
    """model parameter -> the row ranges ([start, stop) of dim 0) the checkpoint does not hold, from what the test
    left out of it: a dropped shard of a fused projection is its rows of the fused parameter (shards in the order
    ``omni_models._FUSED`` gives, sized by ``shapes``), a dropped unfused tensor is all of its parameter."""
    from tests.support import omni_models as om

    rows: dict[str, list[list[int]]] = {}
    for name in sorted(dropped):
        for fused, shards in om._FUSED[arch]:
            index = next((i for i, shard in enumerate(shards) if shard in name), None)
            if index is not None:
                param = name.replace(shards[index], fused)
                sizes = [shapes[name.replace(shards[index], shard)][0] for shard in shards]
                rows.setdefault(param, []).append([sum(sizes[:index]), sum(sizes[:index + 1])])
                break
        else:
            rows[name] = [[0, shapes[name][0]]]
    return {param: sorted(ranges) for param, ranges in rows.items()}


def never_loaded_record(pipeline, arch: str, shapes: dict, dropped, checkpoint: Path) -> dict[str, dict]:
    """Every parameter of a layer the checkpoint leaves (partly) unloaded -> what the test controls of it:

    * ``rows``: its never-loaded rows (``[]``: fully loaded);
    * ``processed``: not as loaded (a quantized weight, now FP8, and its scale, which no checkpoint holds): made
      by the layer's processing from all of the layer's elements, never-loaded ones included (a per-tensor scale),
      so none of its values is controlled;
    * ``loaded_rows``: for an unprocessed one, whether its loaded rows equal the checkpoint's tensors bit for bit
      (``"equal"`` / ``"differ"``; ``"none"`` when no row is loaded);
    * ``layout`` (dtype and shape) and ``meta`` (still on ``meta``: not materialized).
    """
    import torch
    from safetensors.torch import load_file

    from tests.support import omni_models as om

    rows = never_loaded_rows(arch, shapes, dropped)
    layers = {name.rsplit(".", 1)[0] for name in rows}
    tensors = load_file(str(checkpoint / "transformer" / "diffusion_pytorch_model.safetensors")) if rows else {}
    out: dict[str, dict] = {}
    for name, param in pipeline.named_parameters():
        if name.rsplit(".", 1)[0] not in layers:
            continue
        missing = rows.get(name, [])
        fused = next(((f, shards) for f, shards in om._FUSED[arch] if f in name), None)
        parts = [name.replace(fused[0], shard) for shard in fused[1]] if fused else [name]  # its checkpoint names
        entry = {"rows": missing, "layout": _layout(param), "meta": bool(param.is_meta),
                 "processed": not all(part in shapes for part in parts) or param.dtype != torch.bfloat16}
        if not entry["processed"] and not param.is_meta:
            keep = torch.ones(param.shape[0], dtype=torch.bool)
            for start, stop in missing:
                keep[start:stop] = False
            expected = [tensors[part.removeprefix("transformer.")] for part in parts
                        if part.removeprefix("transformer.") in tensors]
            if not keep.any():
                entry["loaded_rows"] = "none"
            else:
                got = param.detach().cpu()[keep]
                same = bool(expected) and torch.equal(got.view(torch.int16), torch.cat(expected).view(torch.int16))
                entry["loaded_rows"] = "equal" if same else "differ"
        out[name] = entry
    return out


def model_records(workdir: Path) -> dict:
    """arch -> checkpoint kind -> digests of the loaded parameters and of one forward's output."""
    import torch
    from vllm_omni.diffusion.registry import initialize_model

    from tests.support import omni_models as om
    from tests.support.online_quant import cpu_fp8_online_config, deterministic_fill

    om.register()
    records: dict = {}
    worker = None
    for arch in (om.QWEN_ARCH, om.ZIMAGE_ARCH):
        config_dir = workdir / "config_only" / arch
        om.write_config_only(config_dir, arch)
        worker = worker or CpuWorker(config_dir, arch)
        od = worker.od_config(arch, config_dir, quant=None)
        with worker.context(od), torch.device("meta"):
            shapes = om.checkpoint_shapes(initialize_model(od), arch)
        records[arch] = {}
        for kind in CHECKPOINT_KINDS:
            checkpoint = workdir / arch / kind
            written = om.write_checkpoint(checkpoint, arch, shapes, stragglers=kind == "stragglers")
            od = worker.od_config(arch, checkpoint, quant=cpu_fp8_online_config())
            record: dict = {}
            try:
                with deterministic_fill():
                    pipeline = worker.load(od)
            except Exception as exc:  # noqa: BLE001 - a failed load is this cell's outcome
                records[arch][kind] = {"load_error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
                continue
            record["meta_left"] = sorted(n for n, p in pipeline.named_parameters() if p.is_meta)
            record["params"] = {n: _digest(p) for n, p in pipeline.named_parameters() if not p.is_meta}
            record["fp8_params"] = sum(p.dtype == torch.float8_e4m3fn for p in pipeline.parameters())
            record["layout"] = {n: _layout(p) for n, p in pipeline.named_parameters()}
            record["never_loaded"] = never_loaded_record(pipeline, arch, shapes, written["dropped"], checkpoint)
            try:
                with worker.context(od):
                    out = om.forward(pipeline, arch, om.make_inputs(arch, worker.device)).float()
                record["output"] = _digest(out)
                record["output_shape"] = list(out.shape)
                record["output_finite"] = bool(torch.isfinite(out).all())
                record["output_abs_mean"] = float(out.abs().nan_to_num().mean())
            except Exception as exc:  # noqa: BLE001
                record["forward_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            records[arch][kind] = record
            del pipeline
    return records


def cpu_signature() -> dict:
    """What a forward's low bits depend on besides the code and the wheels: the CPU kernels torch and its BLAS pick
    for this processor, and the thread count. Parameters do not depend on it (the quantization is elementwise).
    ``model``: the processor's family / model / stepping, which tells apart generations a virtual machine names
    alike ("Intel(R) Xeon(R) Processor": an Emerald Rapids, model 207, gave the complete checkpoint's output
    another low bit than the Xeon vllm-omni 0.24.0's record was made on, 2026-12-07); a record made without it
    compares as another CPU's."""
    import platform

    import torch

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        cpuinfo = []

    def first(field: str) -> str | None:
        return next((line.split(":", 1)[1].strip() for line in cpuinfo
                     if line.split(":", 1)[0].strip() == field), None)

    model = "/".join(str(first(f)) for f in ("cpu family", "model", "stepping"))
    return {"capability": torch.backends.cpu.get_cpu_capability(), "processor": first("model name")
            or platform.processor(), "model": model, "threads": torch.get_num_threads()}


# ------------------------------------------------------------------------------------------------ record


def record(*, modules: bool = True) -> dict:
    """The whole record for the installed pair (vllm_compat applied as a worker applies it); ``modules=False``
    leaves out the module walk (the unpatched run needs only the load)."""
    from importlib.metadata import version

    os.environ["GPU_CHECK_TINY"] = "1"  # omni_models' tiny sizes: a few layers, CPU-sized
    import vllm_compat

    vllm_compat.apply()
    started = time.monotonic()
    result: dict = {"vllm": version("vllm"), "vllm_omni": version("vllm-omni"), "torch": version("torch"),
                    "cpu": cpu_signature()}
    try:
        importlib.import_module("vllm_omni")
    except Exception as exc:  # noqa: BLE001
        result["import_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    if "import_error" not in result:
        with tempfile.TemporaryDirectory(prefix="vc-diffusion-path-") as tmp:
            try:
                result["models"] = model_records(Path(tmp))
            except Exception as exc:  # noqa: BLE001 - e.g. the worker's modules not importing: the cell's outcome
                result["worker_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    if modules and "import_error" not in result:
        result["modules"] = import_outcomes(diffusion_module_names())
    result["decisions"] = {d.name: d.action for d in vllm_compat.current_decisions()}  # after every import hook ran
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def module_differences(native: dict, cell: dict) -> dict[str, tuple[str | None, str | None]]:
    """module -> (native outcome, this cell's outcome) for every module whose importability differs."""
    names = set(native["modules"]) | set(cell["modules"])
    missing = "not in this vllm-omni"
    return {name: (native["modules"].get(name, missing), cell["modules"].get(name, missing)) for name in sorted(names)
            if (native["modules"].get(name, missing) is None) != (cell["modules"].get(name, missing) is None)}


def same_cpu(native: dict, cell: dict) -> bool:
    return native.get("cpu") == cell.get("cpu")


def uncontrolled(record: dict) -> set[str]:
    """The parameters of a model record whose values the test does not control: those with never-loaded rows, and
    those a layer with never-loaded elements made by processing (see ``never_loaded_record``)."""
    return {name for name, entry in record.get("never_loaded", {}).items() if entry["rows"] or entry["processed"]}


def model_differences(native: dict, cell: dict) -> list[str]:
    """What differs in the loaded models and their outputs, one line each ([] when equal).

    Parameters: bit for bit, except the ones holding never-loaded elements (``uncontrolled``; which ones comes from
    the checkpoint the record wrote, what it left out, in either record). vLLM fills never-loaded elements with
    whatever it materializes (NaN under the deterministic fill up to vLLM 0.33; from 0.34 its layerwise reload also
    processes a layer with nothing loaded, so they differ), so for those: materialized (not ``meta``), the dtype and
    shape this cell's complete checkpoint gives the same parameter (whose bits equal native), and the loaded rows
    of an unprocessed one bit for bit equal to the checkpoint's tensors; a processed one (an FP8 weight, its
    scale) is made from the whole layer, never-loaded elements included, and has no controlled value left.

    Outputs: where a record has uncontrolled parameters (the stragglers checkpoint) the output depends on them, so
    it is not compared; the forward must run as natively (``forward_error``) to an output of the shape the
    complete checkpoint's forward gives. Elsewhere (the complete checkpoint) bit for bit where both records come
    from the same CPU signature, else their abs mean within ``OTHER_CPU_OUTPUT_RTOL`` (and finite alike)."""
    import math

    if "worker_error" in cell:
        return [f"the worker could not be set up: {cell['worker_error']}"]
    bitwise_output = same_cpu(native, cell)
    diffs = []
    for arch, kinds in native["models"].items():
        for kind, expected in kinds.items():
            got = cell.get("models", {}).get(arch, {}).get(kind, {})
            complete = cell.get("models", {}).get(arch, {}).get("complete", {})
            where = f"{arch}/{kind}"
            free = uncontrolled(expected) | uncontrolled(got)
            if kind == "complete" and free:
                diffs.append(f"{where}: never-loaded elements in the complete checkpoint: {sorted(free)}")
            for key in ("load_error", "forward_error", "meta_left", "fp8_params"):
                if got.get(key) != expected.get(key):
                    diffs.append(f"{where}: {key} {got.get(key)!r}, natively {expected.get(key)!r}")
            params = got.get("params", {})
            changed = sorted(n for n, digest in expected.get("params", {}).items()
                             if n not in free and params.get(n) != digest)
            extra = sorted(set(params) - set(expected.get("params", {})))
            if changed or extra:
                diffs.append(f"{where}: {len(changed)} parameter(s) differ ({', '.join(changed[:3])}"
                             f"{', ...' if len(changed) > 3 else ''}), {len(extra)} extra")
            for name in sorted(free):
                entry = got.get("never_loaded", {}).get(name)
                if entry is None:
                    diffs.append(f"{where}: {name} holds never-loaded elements natively, not recorded here")
                    continue
                if entry["meta"] or name not in params:
                    diffs.append(f"{where}: {name} never materialized (left on meta)")
                if entry["layout"] != complete.get("layout", {}).get(name):
                    diffs.append(f"{where}: {name} is {entry['layout']}, "
                                 f"{complete.get('layout', {}).get(name)} from the complete checkpoint")
                if entry.get("loaded_rows") == "differ":
                    diffs.append(f"{where}: {name}'s loaded rows differ from the checkpoint's tensors")
            if "output" not in got and "output" not in expected:
                continue
            if free:
                if got.get("output_shape") != complete.get("output_shape"):
                    diffs.append(f"{where}: forward output of shape {got.get('output_shape')}, "
                                 f"{complete.get('output_shape')} from the complete checkpoint")
                continue
            if got.get("output_finite") != expected.get("output_finite"):
                diffs.append(f"{where}: output_finite {got.get('output_finite')!r}, "
                             f"natively {expected.get('output_finite')!r}")
            here, there = got.get("output_abs_mean"), expected.get("output_abs_mean")
            if bitwise_output and got.get("output") != expected.get("output"):
                diffs.append(f"{where}: forward output differs (abs mean {here}, natively {there})")
            elif not bitwise_output and not (here is not None and there is not None
                                             and math.isclose(here, there, rel_tol=OTHER_CPU_OUTPUT_RTOL)):
                diffs.append(f"{where}: forward output differs by more than another CPU's rounding (abs mean "
                             f"{here}, natively {there} on {native.get('cpu')})")
    return diffs


def missing_target(error: str | None) -> str | None:
    """The vLLM name an import error says is missing (``module.name`` or a module), else None."""
    import re

    if error is None:
        return None
    found = re.search(r"cannot import name '([\w.]+)' from '([\w.]+)'", error)
    if found:
        return f"{found[2]}.{found[1]}"
    found = re.search(r"No module named '([\w.]+)'", error)
    return found[1] if found else None


def main(argv: list[str]) -> None:
    out, *flags = argv
    Path(out).write_text(json.dumps(record(modules="--no-modules" not in flags), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
