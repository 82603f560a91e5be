"""Real vllm-omni transformers (Qwen-Image, Z-Image) as loadable diffusion "pipelines", their local diffusers-layout
checkpoints, and their forward inputs: what ``gpu/real_models.py`` loads through ``DiffusersPipelineLoader``.

A pipeline here is vllm-omni's own transformer class (``QwenImageTransformer2DModel``, ``ZImageTransformer2DModel``)
and nothing else: the text encoders, VAEs and schedulers of the real pipelines are not part of the loader path under
test and would need their own multi-GB checkpoints. Each class is registered with vllm-omni's out-of-tree API
(``register_diffusion_model``), declares a ``transformer`` weight source in the diffusers layout
(``transformer/diffusion_pytorch_model.safetensors`` + ``transformer/config.json`` + ``model_index.json``), and loads
through vllm-omni's ``AutoWeightsLoader`` -> the transformer's own ``load_weights`` (QKV / w13 fusion included).

Stragglers (layers left on ``meta`` by vLLM's online FP8 until ``finalize_layerwise_processing``), written into the
checkpoint itself:
  * padded: a fused projection of which the checkpoint holds only some shards (Qwen-Image ``to_qkv`` without
    ``to_v``; Z-Image ``w13`` without ``w3``): vLLM counts it as partially loaded and defers it;
  * missing: a quantized linear with no tensor at all in the checkpoint. vllm-omni 0.24.0's strict check would
    raise ``ValueError`` before processing for such a layer, whatever the loader method, so the pipeline reports
    it as loaded (what vllm-omni's own pipelines do for components loaded by other means), and the load reaches
    ``_process_weights_after_loading`` with the layer still on ``meta``.
"""

from __future__ import annotations

import ast
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

QWEN_ARCH = "GpuCheckQwenImageDiT"
ZIMAGE_ARCH = "GpuCheckZImageDiT"

# Sizes: "small but not toy". Qwen-Image: 24 heads x 128 = 3072 hidden (the real model's width), 4 of its 60 dual-stream
# blocks. Z-Image: 3840 hidden / 30 heads (the real width), 3 main + 1 + 1 refiner blocks.
QWEN_CONFIG = {
    "_class_name": "QwenImageTransformer2DModel",
    "patch_size": 2,
    "in_channels": 64,
    "out_channels": 16,
    "num_layers": 4,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 3584,
    "guidance_embeds": False,
    "axes_dims_rope": [16, 56, 56],
}
ZIMAGE_CONFIG = {
    "_class_name": "ZImageTransformer2DModel",
    "all_patch_size": [2],
    "all_f_patch_size": [1],
    "in_channels": 16,
    "dim": 3840,
    "n_layers": 3,
    "n_refiner_layers": 1,
    "n_heads": 30,
    "n_kv_heads": 30,
    "cap_feat_dim": 2560,
    "axes_dims": [32, 48, 48],
    "axes_lens": [1024, 512, 512],
}
# Tiny sizes (GPU_CHECK_TINY=1): the CPU dry run of the harness and the matrix's diffusion-path record; three
# blocks, so that both stragglers (in blocks 1 and 2) exist.
TINY = {
    QWEN_ARCH: {"num_layers": 3, "attention_head_dim": 32, "num_attention_heads": 2, "joint_attention_dim": 64,
                "axes_dims_rope": [8, 12, 12]},
    ZIMAGE_ARCH: {"dim": 64, "n_layers": 3, "n_heads": 2, "n_kv_heads": 2, "cap_feat_dim": 32,
                  "axes_dims": [8, 12, 12]},
}


@dataclass(frozen=True)
class StragglerSpec:
    padded_param: str  # fused param of which the checkpoint holds only some shards
    padded_dropped: tuple[str, ...]  # checkpoint names (shards) left out
    missing_layer: str  # quantized linear with no checkpoint tensor at all


STRAGGLERS = {
    QWEN_ARCH: StragglerSpec(
        padded_param="transformer.transformer_blocks.1.attn.to_qkv.weight",
        padded_dropped=("transformer.transformer_blocks.1.attn.to_v.weight", "transformer.transformer_blocks.1.attn.to_v.bias"),
        missing_layer="transformer.transformer_blocks.2.img_mlp.net.2",
    ),
    ZIMAGE_ARCH: StragglerSpec(
        padded_param="transformer.layers.1.feed_forward.w13.weight",
        padded_dropped=("transformer.layers.1.feed_forward.w3.weight",),
        missing_layer="transformer.layers.2.attention.to_out.0",
    ),
}


def _config(arch: str) -> dict:
    cfg = dict(QWEN_CONFIG if arch == QWEN_ARCH else ZIMAGE_CONFIG)
    if os.environ.get("GPU_CHECK_TINY") == "1":
        cfg.update(TINY[arch])
    return cfg


class _DiTOnly(nn.Module):
    """A diffusion 'pipeline' holding one vllm-omni transformer (``self.transformer``)."""

    _dit_modules = ["transformer"]
    _encoder_modules: list[str] = []
    _vae_modules: list[str] = []

    def __init__(self, *, od_config, prefix: str = ""):
        super().__init__()
        from vllm_omni.diffusion.model_loader.diffusers_loader import DiffusersPipelineLoader

        self.od_config = od_config
        self.weights_sources = [
            DiffusersPipelineLoader.ComponentSource(
                model_or_path=od_config.model, subfolder="transformer", revision=od_config.revision,
                prefix="transformer.", fall_back_to_pt=True,
            )
        ]
        self.transformer = self._build(od_config)
        marker = Path(od_config.model) / "not_in_checkpoint.json"
        self._reported_loaded = set(json.loads(marker.read_text())) if marker.exists() else set()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        from vllm.model_executor.models.utils import AutoWeightsLoader

        loaded = AutoWeightsLoader(self).load_weights(weights)
        # Layers deliberately absent from the checkpoint (the "missing" straggler): reported as loaded so that
        # vllm-omni 0.24.0's strict check lets the load reach weight processing (see the module docstring).
        return loaded | self._reported_loaded


class QwenImageDiT(_DiTOnly):
    def _build(self, od_config):
        from vllm_omni.diffusion.models.qwen_image.qwen_image_transformer import QwenImageTransformer2DModel
        from vllm_omni.diffusion.utils.tf_utils import get_transformer_config_kwargs

        kwargs = get_transformer_config_kwargs(od_config.tf_model_config, QwenImageTransformer2DModel)
        return QwenImageTransformer2DModel(od_config=od_config, quant_config=od_config.quantization_config, **kwargs)


class ZImageDiT(_DiTOnly):
    def _build(self, od_config):
        from vllm_omni.diffusion.models.z_image.z_image_transformer import ZImageTransformer2DModel
        from vllm_omni.diffusion.utils.tf_utils import get_transformer_config_kwargs

        kwargs = get_transformer_config_kwargs(od_config.tf_model_config, ZImageTransformer2DModel)
        for key in ("all_patch_size", "all_f_patch_size"):
            if key in kwargs:
                kwargs[key] = tuple(kwargs[key])
        return ZImageTransformer2DModel(quant_config=od_config.quantization_config, **kwargs)


def register() -> None:
    from vllm_omni.diffusion.registry import register_diffusion_model

    register_diffusion_model(QWEN_ARCH, __name__, "QwenImageDiT")
    register_diffusion_model(ZIMAGE_ARCH, __name__, "ZImageDiT")


# --------------------------------------------------------------------------------------------------------------
# Checkpoint in the diffusers layout, from the model's own parameter shapes.
# --------------------------------------------------------------------------------------------------------------

# (fused vllm-omni param fragment, diffusers shard fragments in order) as the transformers' load_weights map them.
_FUSED = {
    QWEN_ARCH: [(".to_qkv.", (".to_q.", ".to_k.", ".to_v.")), (".add_kv_proj.", (".add_q_proj.", ".add_k_proj.", ".add_v_proj."))],
    ZIMAGE_ARCH: [(".to_qkv.", (".to_q.", ".to_k.", ".to_v.")), (".w13.", (".w1.", ".w3."))],
}


def checkpoint_shapes(model: nn.Module, arch: str) -> dict[str, tuple[int, ...]]:
    """diffusers-layout name -> shape for every parameter of ``model`` (a pipeline built on ``meta``, no quant)."""
    modules = dict(model.named_modules())
    out: dict[str, tuple[int, ...]] = {}
    for name, param in model.named_parameters():
        for fused, shards in _FUSED[arch]:
            if fused in name:
                layer = modules[name.rsplit(".", 1)[0]]
                sizes = list(layer.output_sizes)
                assert sum(sizes) == param.shape[0], (name, sizes, param.shape)
                for shard, size in zip(shards, sizes, strict=True):
                    out[name.replace(fused, shard)] = (size, *param.shape[1:])
                break
        else:
            out[name] = tuple(param.shape)
    return out


def write_checkpoint(root: Path, arch: str, shapes: dict[str, tuple[int, ...]], *, stragglers: bool,
                     device="cpu", seed: int = 0) -> dict:
    """Write ``root`` as a diffusers model dir. Values: weights ~ N(0, 1/fan_in), norm scales ~ 1, biases small.
    Returns {"tensors": n, "bytes": n, "dropped": [...], "reported_loaded": [...]}."""
    from safetensors.torch import save_file

    spec = STRAGGLERS[arch]
    dropped: set[str] = set()
    reported: list[str] = []
    if stragglers:
        dropped |= set(spec.padded_dropped)
        missing = {n for n in shapes if n.startswith(spec.missing_layer + ".")}
        dropped |= missing
        reported = sorted(missing)
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, shape in sorted(shapes.items()):
        if name in dropped:
            continue
        t = torch.randn(shape, generator=gen, device=device, dtype=torch.float32)
        leaf = name.rsplit(".", 1)[-1]
        if len(shape) >= 2:
            t = t / (shape[-1] ** 0.5)
        elif leaf == "bias":
            t = t * 0.02
        elif "norm" in name or leaf in ("weight", "scale"):
            t = 1.0 + 0.05 * t
        tensors[name.removeprefix("transformer.")] = t.to(torch.bfloat16).contiguous().cpu()
    sub = root / "transformer"
    sub.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(sub / "diffusion_pytorch_model.safetensors"))
    cfg = _config(arch)
    (sub / "config.json").write_text(json.dumps(cfg, indent=1))
    (root / "model_index.json").write_text(json.dumps({"_class_name": arch, "transformer": ["diffusers", cfg["_class_name"]]}))
    marker = root / "not_in_checkpoint.json"
    if reported:
        marker.write_text(json.dumps(reported))
    elif marker.exists():
        marker.unlink()
    return {"tensors": len(tensors), "bytes": sum(t.numel() * t.element_size() for t in tensors.values()),
            "dropped": sorted(dropped), "reported_loaded": reported}


def write_config_only(root: Path, arch: str) -> None:
    """model_index.json + transformer/config.json (enough to build the model on meta and read its shapes)."""
    sub = root / "transformer"
    sub.mkdir(parents=True, exist_ok=True)
    cfg = _config(arch)
    (sub / "config.json").write_text(json.dumps(cfg, indent=1))
    (root / "model_index.json").write_text(json.dumps({"_class_name": arch, "transformer": ["diffusers", cfg["_class_name"]]}))


# --------------------------------------------------------------------------------------------------------------
# Forward inputs and call, as the real pipelines call these transformers.
# --------------------------------------------------------------------------------------------------------------


def make_inputs(arch: str, device, seed: int = 5) -> dict:
    cfg = _config(arch)
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32).to(torch.bfloat16)

    if arch == QWEN_ARCH:
        h = w = 16  # latent patches: 16 x 16 = 256 image tokens
        txt = 64
        return {
            "hidden_states": rnd(1, h * w, cfg["in_channels"]),
            "encoder_hidden_states": rnd(1, txt, cfg["joint_attention_dim"]),
            "encoder_hidden_states_mask": torch.ones(1, txt, dtype=torch.long, device=device),
            "timestep": torch.tensor([0.5], device=device, dtype=torch.bfloat16),
            "img_shapes": [[(1, h, w)]],
            "txt_seq_lens": [txt],
        }
    return {
        "x": [rnd(cfg["in_channels"], 1, 32, 32)],
        "t": torch.tensor([0.5], device=device, dtype=torch.bfloat16),
        "cap_feats": [rnd(64, cfg["cap_feat_dim"])],
    }


def forward(pipeline: nn.Module, arch: str, inputs: dict) -> torch.Tensor:
    from vllm_omni.diffusion.forward_context import set_forward_context

    with torch.no_grad(), set_forward_context(omni_diffusion_config=pipeline.od_config):
        if arch == QWEN_ARCH:
            out = pipeline.transformer(**inputs, return_dict=False)
            return out[0] if isinstance(out, (tuple, list)) else out.sample
        out, _ = pipeline.transformer(**inputs)
        return torch.stack(out) if isinstance(out, (list, tuple)) else out


# --------------------------------------------------------------------------------------------------------------
# vllm-omni 0.30.0's in-tree method, compiled out of its files (0.30.0 does not import on vLLM 0.26).
# --------------------------------------------------------------------------------------------------------------


def function_from_file(path: str | os.PathLike, name: str, class_name: str | None = None, namespace: dict | None = None):
    """Compile function ``name`` (a method of ``class_name`` if given) out of a Python file; returns (fn, source)."""
    source = Path(path).read_text()
    tree = ast.parse(source)
    body = tree.body
    if class_name is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    fn.decorator_list = []
    text = ast.get_source_segment(source, fn)
    ns = dict(namespace or {})
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(path), "exec"), ns)
    return ns[name], text


def intree_030(loader_file: str, host_weight_plan_file: str):
    """(process_weights_after_loading, has_online_quant, sha256 prefix of the method text) of vllm-omni 0.30.0."""
    import hashlib

    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    hoq, _ = function_from_file(host_weight_plan_file, "has_online_quantization", namespace={"nn": nn})
    method, text = function_from_file(loader_file, "_process_weights_after_loading", "DiffusersPipelineLoader",
                                      {"torch": torch, "nn": nn, "QuantizeMethodBase": QuantizeMethodBase})
    return method, hoq, hashlib.sha256(text.encode()).hexdigest()[:16]
