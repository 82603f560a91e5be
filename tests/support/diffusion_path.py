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
  real layerwise machinery), then one forward: a digest of every parameter after loading and of the output.

Never-loaded straggler elements are whatever vLLM materializes them with; the loads run under torch's
deterministic fill, so those bytes are the same in every run (NaN), and the digests compare them too. A
straggler-free checkpoint keeps the forward's output finite and meaningful.

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
            om.write_checkpoint(checkpoint, arch, shapes, stragglers=kind == "stragglers")
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
            try:
                with worker.context(od):
                    out = om.forward(pipeline, arch, om.make_inputs(arch, worker.device)).float()
                record["output"] = _digest(out)
                record["output_finite"] = bool(torch.isfinite(out).all())
                record["output_abs_mean"] = float(out.abs().nan_to_num().mean())
            except Exception as exc:  # noqa: BLE001
                record["forward_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            records[arch][kind] = record
            del pipeline
    return records


def cpu_signature() -> dict:
    """What a forward's low bits depend on besides the code and the wheels: the CPU kernels torch and its BLAS pick
    for this processor, and the thread count. Parameters do not depend on it (the quantization is elementwise)."""
    import platform

    import torch

    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        cpuinfo = []
    processor = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")),
                     platform.processor())
    return {"capability": torch.backends.cpu.get_cpu_capability(), "processor": processor,
            "threads": torch.get_num_threads()}


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


def model_differences(native: dict, cell: dict) -> list[str]:
    """What differs in the loaded models and their outputs, one line each ([] when equal): parameters bit for bit;
    outputs bit for bit where both records come from the same CPU signature, else their abs mean within
    ``OTHER_CPU_OUTPUT_RTOL`` (and finite alike)."""
    import math

    if "worker_error" in cell:
        return [f"the worker could not be set up: {cell['worker_error']}"]
    bitwise_output = same_cpu(native, cell)
    diffs = []
    for arch, kinds in native["models"].items():
        for kind, expected in kinds.items():
            got = cell.get("models", {}).get(arch, {}).get(kind, {})
            where = f"{arch}/{kind}"
            for key in ("load_error", "forward_error", "meta_left", "fp8_params", "output_finite"):
                if got.get(key) != expected.get(key):
                    diffs.append(f"{where}: {key} {got.get(key)!r}, natively {expected.get(key)!r}")
            params = got.get("params", {})
            changed = sorted(n for n, digest in expected.get("params", {}).items() if params.get(n) != digest)
            extra = sorted(set(params) - set(expected.get("params", {})))
            if changed or extra:
                diffs.append(f"{where}: {len(changed)} parameter(s) differ ({', '.join(changed[:3])}"
                             f"{', ...' if len(changed) > 3 else ''}), {len(extra)} extra")
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
