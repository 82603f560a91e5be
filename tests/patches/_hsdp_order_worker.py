"""One rank of the HSDP load-order scenario: vllm-omni's real ``DiffusersPipelineLoader.load_model`` with
``use_hsdp`` on CPU FSDP2 (gloo), then a forward, compared with the same model processed unsharded.

Run as ``python -m tests.patches._hsdp_order_worker OUT.json WORLD_SIZE RANK PORT CHECKPOINT_DIR``: online quant,
then offline quant, in one process; ``VLLM_COMPAT_DISABLE_PATCHES=hsdp_load_order`` gives the unpatched run.
``HSDP_ORDER_DEVICE=cuda`` runs it on the GPU (``cuda:RANK``, NCCL, vLLM's and vllm-omni's real CUDA platforms)
instead of the CPU (gloo).

Real parts: vllm-omni's loader (``load_model`` -> ``_load_model_with_hsdp`` -> ``load_weights`` ->
``prepare_fp8_layers_for_fsdp`` -> ``apply_hsdp_to_model``), its distributed init and HSDP mesh, vLLM's config
objects and layerwise online processing, torch's FSDP2. Test parts: the quant methods (CPU doubles from
``tests/support``), the tiny DiT, and recording spies that call through to vllm-omni's sharding functions.
The CPU platform gets the three answers vllm-omni's distributed init asks of a device (count, set, torch
device), as the GPU harness's CPU dry run does.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ORDER: list[str] = []  # "load", "process:<method>", "prepare", "shard", in the order they happened
HIDDEN, BLOCKS = 16, 2


def build_dit(online: bool):
    """Two blocks ``x + second(gelu(first(x)))``. ``second`` is an offline FP8 method that registers new
    params when processed (as vLLM's offline methods do), so a processing FSDP never sees is visible in the
    forward; ``first`` is online FP8 (meta weights, processed by vLLM's layerwise machinery while loading)
    when ``online``."""
    import torch.nn.functional as F
    from torch import nn

    from tests.support.online_quant import CpuFp8OfflineMethod, CpuFp8OnlineMethod, QuantLinear

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.first = QuantLinear(HIDDEN, HIDDEN, CpuFp8OnlineMethod() if online else CpuFp8OfflineMethod())
            self.second = QuantLinear(HIDDEN, HIDDEN, CpuFp8OfflineMethod())

        def forward(self, x):
            return x + self.second(F.gelu(self.first(x)))

    class TinyShardedDiT(nn.Module):
        # vllm-omni's apply_hsdp_to_model shards the modules these conditions select, then the root.
        _hsdp_shard_conditions = [lambda name, module: name.count(".") == 1 and name.startswith("blocks.")]

        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    return TinyShardedDiT()


def load_into(model, checkpoint) -> None:
    """vLLM-style: each tensor through its param's ``weight_loader`` (online layers process when loaded)."""
    for name, tensor in checkpoint.items():
        param = model.get_parameter(name)
        param.weight_loader(param, tensor)


def main(out: str, world_size: int, rank: int, port: int, checkpoint_dir: str) -> None:
    """Load the checkpoint with online and then offline quant; write one result per quant to ``out``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world_size))
    import torch

    import vllm_compat

    vllm_compat.apply()
    _record_processing()
    cuda = os.environ.get("HSDP_ORDER_DEVICE") == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    from vllm.config import set_current_vllm_config
    from vllm_omni.diffusion.data import DiffusionParallelConfig, OmniDiffusionConfig
    from vllm_omni.diffusion.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm_omni.diffusion.model_loader import diffusers_loader as omni_loader
    from vllm_omni.diffusion.worker import diffusion_worker
    from vllm_omni.platforms import current_omni_platform

    if cuda:
        current_omni_platform.set_device(device)
    else:
        platform = type(current_omni_platform)
        platform.get_device_count = classmethod(lambda cls: world_size)
        platform.set_device = classmethod(lambda cls, device: None)
        platform.get_torch_device = classmethod(lambda cls, *args: torch.device("cpu"))
    _spy_sharding(omni_loader)

    od_config = OmniDiffusionConfig(
        model=checkpoint_dir, dtype=torch.bfloat16, quantization_config="fp8", enforce_eager=True,
        num_gpus=world_size,
        parallel_config=DiffusionParallelConfig(use_hsdp=True, hsdp_shard_size=world_size, hsdp_replicate_size=1),
    )
    # The diffusion worker's own per-process VllmConfig (what DiffusionWorker.init_device sets).
    vllm_config = diffusion_worker._create_diffusion_worker_vllm_config(device, od_config)
    results = {}
    with set_current_vllm_config(vllm_config):
        backend = None if cuda else "gloo"  # None: the platform's own (NCCL on CUDA)
        init_distributed_environment(world_size=world_size, rank=rank, backend=backend)
        initialize_model_parallel(fully_shard_degree=world_size, hsdp_replicate_size=1, backend=backend)
        for quant in ("online", "offline"):
            results[quant] = _scenario(omni_loader, od_config, quant == "online", device)
            torch.distributed.barrier()
    results["decisions"] = {d.name: d.action for d in vllm_compat.current_decisions()}
    Path(out).write_text(json.dumps(results))


def _scenario(omni_loader, od_config, online: bool, device) -> dict:
    import torch
    from torch import nn
    from vllm.config.load import LoadConfig

    from tests.support.online_quant import quant_layers

    loader_class = omni_loader.DiffusersPipelineLoader

    class OrderPipeline(nn.Module):
        """A diffusion pipeline holding one tiny DiT as ``transformer``, loaded from a diffusers-layout folder."""

        _dit_modules = ["transformer"]
        _encoder_modules: list[str] = []
        _vae_modules: list[str] = []

        def __init__(self, *, od_config, prefix: str = ""):
            super().__init__()
            self.weights_sources = [loader_class.ComponentSource(
                model_or_path=od_config.model, subfolder="transformer", revision=None, prefix="transformer.")]
            self.transformer = build_dit(online)

        def load_weights(self, weights):
            ORDER.append("load")
            loaded = set()
            for name, tensor in weights:
                param = self.get_parameter(name)
                param.weight_loader(param, tensor)
                loaded.add(name)
            return loaded

    # Registered with vllm-omni's out-of-tree API and loaded as load_format="default", the way a served model is:
    # built under the device context (load_format="custom_pipeline" would build it on the CPU and then call
    # model.to(device), which no model holding online-quant meta weights survives on a GPU).
    from vllm_omni.diffusion.registry import register_diffusion_model

    arch = f"HsdpOrder{'Online' if online else 'Offline'}Pipeline"
    setattr(sys.modules["__main__"], arch, OrderPipeline)
    register_diffusion_model(arch, "__main__", arch)
    od_config.model_class_name = arch
    ORDER.clear()
    loader = loader_class(LoadConfig(), od_config=od_config)
    result = {"load_error": None, "forward_error": None}
    try:
        pipeline = loader.load_model(load_device=device.type, load_format="default", device=device)
    except Exception as exc:  # noqa: BLE001 - the unpatched run's failure is a result
        result["load_error"] = f"{type(exc).__name__}: {exc}"
    result["order"] = list(ORDER)  # before the reference below adds its own processing
    result["shadows_left"] = sorted(k for k in ("load_weights", "_process_weights_after_loading") if k in vars(loader))
    if result["load_error"] is not None:
        return result
    x = torch.randn(3, HIDDEN, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16).to(device)
    with omni_loader.set_default_torch_dtype(od_config.dtype), device:  # as load_model builds the pipeline
        reference = build_dit(online)
    load_into(reference, _read_checkpoint(od_config.model))
    unprocessed = reference(x)
    for layer in quant_layers(reference).values():  # the reference: processed unsharded, directly
        layer.quant_method.process_weights_after_loading(layer)
    expected = reference(x)
    result["reference_processing_changes_output"] = not bool(torch.equal(expected, unprocessed))
    result["sharded_params"] = sum(hasattr(p, "to_local") for p in pipeline.transformer.parameters())
    try:
        with torch.no_grad():
            got = pipeline.transformer(x)
    except Exception as exc:  # noqa: BLE001
        result["forward_error"] = f"{type(exc).__name__}: {exc}"
        return result
    result.update(
        forward_equals_processed_reference=bool(torch.equal(got, expected)),
        forward_equals_unprocessed=bool(torch.equal(got, unprocessed)),
        max_abs_diff=float((got.float() - expected.float()).abs().max()),
        applied_weight_dtypes={n: str(m._test_apply_weight_dtype) for n, m in quant_layers(pipeline.transformer).items()},
    )
    return result


def _record_processing() -> None:
    """Record each quant layer's processing (the CPU doubles'), in order, without changing it."""
    from tests.support.online_quant import _CpuFp8MethodBase

    original = _CpuFp8MethodBase.process_weights_after_loading

    def recording(self, layer):
        ORDER.append(f"process:{type(self).__name__}")
        return original(self, layer)

    _CpuFp8MethodBase.process_weights_after_loading = recording


def _spy_sharding(omni_loader) -> None:
    """Record vllm-omni's prepare / shard steps and call through to them."""
    from vllm_omni.diffusion.quantization import hsdp_fp8

    real_prepare, real_shard = hsdp_fp8.prepare_fp8_layers_for_fsdp, omni_loader.apply_hsdp_to_model

    def prepare(*args, **kwargs):
        ORDER.append("prepare")
        return real_prepare(*args, **kwargs)

    def shard(*args, **kwargs):
        ORDER.append("shard")
        return real_shard(*args, **kwargs)

    hsdp_fp8.prepare_fp8_layers_for_fsdp = prepare
    omni_loader.apply_hsdp_to_model = shard


def _read_checkpoint(checkpoint_dir: str) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(checkpoint_dir) / "transformer" / "diffusion_pytorch_model.safetensors"))


def write_checkpoint(checkpoint_dir: Path) -> None:
    """The tiny DiT's checkpoint in the diffusers layout (``transformer/*.safetensors``), from a fixed seed."""
    import torch
    from safetensors.torch import save_file

    (checkpoint_dir / "transformer").mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(3)
    checkpoint = {f"blocks.{i}.{layer}.weight": torch.randn(HIDDEN, HIDDEN, generator=generator).to(torch.bfloat16)
                  for i in range(BLOCKS) for layer in ("first", "second")}
    save_file(checkpoint, str(checkpoint_dir / "transformer" / "diffusion_pytorch_model.safetensors"))
    (checkpoint_dir / "model_index.json").write_text(json.dumps({"_class_name": "OrderPipeline"}))


if __name__ == "__main__":
    out, world_size, rank, port, checkpoint_dir = sys.argv[1:]
    main(out, int(world_size), int(rank), int(port), checkpoint_dir)
