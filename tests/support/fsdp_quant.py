"""FSDP2-compatible CPU quant-method double and a tiny model for the F-hsdp tests.

:class:`InPlaceFp8Method` is a real ``QuantizeMethodBase`` whose
``process_weights_after_loading`` writes its result *into the parameters
created by* ``create_weights`` (``Tensor.copy_``, the ``update_tensor_inplace``
pattern of vLLM's ``replace_parameter``), never registering new ones.  That is
the pattern that survives FSDP2: the parameters stay the ones FSDP manages, so
a forward after processing all-gathers the processed values.  (A method that
registers new parameters loses them to FSDP's unshard, see
``tests/support/online_quant.py:fsdp_model``.)

Processing is FP8 "fake quantization": ``weight`` becomes the FP8-rounded
quotient ``weight / scale`` (exact in bf16) and ``weight_scale`` the per-tensor
scale, so a forward with unprocessed weights (scale 1, raw weight) and one with
processed weights differ, and both are computable by the test from the
checkpoint (:func:`expected_processed`).

Each processing call records which storage it wrote to
(``layer._test_processed_storage``): with a target device that forces a move,
a whole-module move makes the method work on a *moved copy*, while a dropped
per-parameter ``.data`` move (what happens to a DTensor param on CPU torch
2.13) leaves it working on the shard where it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

from .online_quant import (
    PROCESSED_FLAG,
    CpuFp8OnlineMethod,
    QuantLinear,
    ensure_process_group,
    quant_layers,
    quantize_fp8,
)

__all__ = [
    "InPlaceFp8Method",
    "FsdpBlock",
    "FsdpDiT",
    "build",
    "make_checkpoint",
    "load",
    "process_unsharded",
    "shard",
    "expected_processed",
    "local_storage",
    "inplace_layers",
]


def local_storage(t: torch.Tensor) -> int:
    """Address of the storage holding ``t``'s (local) values; DTensor: its local shard."""
    local = t.to_local() if hasattr(t, "to_local") else t
    return local.untyped_storage().data_ptr()


def expected_processed(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight, weight_scale)`` that :class:`InPlaceFp8Method` produces from ``weight``."""
    qweight, scale = quantize_fp8(weight)
    return qweight.to(weight.dtype), scale


class InPlaceFp8Method(QuantizeMethodBase):
    """Offline FP8 fake quant that processes in place on its own parameters (FSDP2-compatible)."""

    uses_meta_device = False

    def create_weights(  # type: ignore[override]
        self,
        layer: nn.Module,
        in_features: int,
        out_features: int,
        dtype: torch.dtype,
        weight_loader: Callable[..., Any] = default_weight_loader,
    ) -> None:
        weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)
        weight.weight_loader = weight_loader  # type: ignore[attr-defined]
        layer.register_parameter("weight", weight)
        # Shape (1,): FSDP2 rejects 0-d params.  Created here, so FSDP manages it.
        layer.register_parameter("weight_scale", nn.Parameter(torch.ones(1), requires_grad=False))

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if getattr(layer, PROCESSED_FLAG, False):
            return
        qweight, scale = expected_processed(layer.weight)
        layer._test_processed_storage = local_storage(layer.weight)
        layer.weight.copy_(qweight)
        layer.weight_scale.copy_(scale)
        setattr(layer, PROCESSED_FLAG, True)
        layer._test_process_calls = getattr(layer, "_test_process_calls", 0) + 1

    def apply(  # type: ignore[override]
        self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        weight = layer.weight.to(torch.float32) * layer.weight_scale
        return F.linear(x, weight.to(x.dtype), bias)


class FsdpBlock(nn.Module):
    """``x + second(gelu(first(x)))``; ``first`` is online FP8 (processed while loading) when ``online``."""

    def __init__(self, hidden: int, online: bool, dtype: torch.dtype) -> None:
        super().__init__()
        first_method = CpuFp8OnlineMethod() if online else InPlaceFp8Method()
        self.first = QuantLinear(hidden, hidden, first_method, dtype=dtype)
        self.second = QuantLinear(hidden, hidden, InPlaceFp8Method(), dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.second(F.gelu(self.first(x)))


class FsdpDiT(nn.Module):
    def __init__(self, n_layers: int, hidden: int, online: bool, dtype: torch.dtype) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(FsdpBlock(hidden, online, dtype) for _ in range(n_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def build(online: bool, n_layers: int = 2, hidden: int = 16, dtype: torch.dtype = torch.bfloat16) -> FsdpDiT:
    return FsdpDiT(n_layers, hidden, online, dtype)


def make_checkpoint(model: nn.Module, seed: int = 1) -> dict[str, torch.Tensor]:
    """Deterministic checkpoint: every ``weight`` of every quant layer, from a private generator."""
    gen = torch.Generator().manual_seed(seed)
    ckpt = {}
    for name, layer in quant_layers(model).items():
        shape = (layer.out_features, layer.in_features)
        ckpt[f"{name}.weight"] = torch.randn(shape, generator=gen).to(torch.bfloat16)
    return ckpt


def load(model: nn.Module, checkpoint: dict[str, torch.Tensor]) -> None:
    """vLLM-style: each tensor through its param's ``weight_loader`` (online layers process when loaded)."""
    for name, tensor in checkpoint.items():
        param = model.get_parameter(name)
        getattr(param, "weight_loader", default_weight_loader)(param, tensor)


def process_unsharded(model: nn.Module) -> None:
    """The reference: call every quant method directly on the plain (unsharded) model."""
    for layer in quant_layers(model).values():
        layer.quant_method.process_weights_after_loading(layer)


def shard(model: nn.Module) -> nn.Module:
    """FSDP2 each block, then the root, on a 1-rank gloo group (loading happened before, as in HSDP)."""
    from torch.distributed.fsdp import fully_shard

    ensure_process_group()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def inplace_layers(model: nn.Module) -> dict[str, nn.Module]:
    return {n: m for n, m in quant_layers(model).items() if isinstance(m.quant_method, InPlaceFp8Method)}
