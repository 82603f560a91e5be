"""CPU test double for vLLM online (meta-device) quantization.

vLLM's online quantization (``QuantizeMethodBase.uses_meta_device = True``)
creates weights on the ``meta`` device and lets vLLM's *real* layerwise
machinery (``vllm.model_executor.model_loader.reload.layerwise``) materialize
and quantize each layer as soon as all of its elements have been loaded.  The
real online FP8 method needs a vLLM config and CUDA kernels, so this module
provides only a CPU quant *method* double; everything else a test exercises
(``initialize_online_processing``, ``_layerwise_process``,
``finalize_layerwise_processing``, ``default_weight_loader``,
``QuantizeMethodBase``) is vLLM's own code.

Contents:

* :class:`CpuFp8OnlineMethod` / :class:`CpuFp8OfflineMethod` - the method
  double, with and without meta-device creation.
* :class:`QuantLinear`, :func:`build_model`, :func:`make_checkpoint`,
  :func:`load_checkpoint` - a tiny DiT-shaped model and a vLLM-style loader
  that can leave "straggler" layers on ``meta``.
* :func:`deterministic_fill` - makes vLLM's materialization of never-loaded
  weights reproducible.
* :class:`LoaderShaped`, :func:`ungated_process_weights_after_loading` - a
  stand-in loader instance and the first (ungated) upstream fix.
* :func:`fsdp_model` - the same model wrapped with FSDP2 on a 1-rank gloo group.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase
from vllm.model_executor.model_loader.weight_utils import default_weight_loader

# Both are absent in vLLM 0.18.1: it has ``uses_meta_device`` but its online FP8
# method materializes weights in its own patched loader, not layerwise.
try:
    from vllm.model_executor.model_loader.reload.layerwise import (
        initialize_online_processing,
    )
except ImportError:  # weights then stay on meta until processed (as meta).
    initialize_online_processing = None

try:
    from vllm.model_executor.model_loader.reload.layerwise import (
        finalize_layerwise_processing,
    )
except ImportError:
    finalize_layerwise_processing = None

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "HAS_ONLINE_PROCESSING",
    "HAS_FINALIZE",
    "PROCESSED_FLAG",
    "DEFAULT_STRAGGLERS",
    "STACKED_PARAMS",
    "Straggler",
    "CpuFp8OnlineMethod",
    "CpuFp8OfflineMethod",
    "CpuFp8OnlineLinearMethod",
    "cpu_fp8_online_config",
    "QuantLinear",
    "Block",
    "TinyDiT",
    "quantize_fp8",
    "fused_shard_loader",
    "build_model",
    "make_checkpoint",
    "load_checkpoint",
    "meta_param_names",
    "quant_layers",
    "deterministic_fill",
    "LoaderShaped",
    "ungated_process_weights_after_loading",
    "ensure_process_group",
    "fsdp_model",
    "ForwardProbe",
    "probe_forward",
]

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)

#: Whether the installed vLLM can process layers while they load.
HAS_ONLINE_PROCESSING = initialize_online_processing is not None
#: Whether the installed vLLM can process stragglers after loading.
HAS_FINALIZE = finalize_layerwise_processing is not None

PROCESSED_FLAG = "_already_called_process_weights_after_loading"


# --------------------------------------------------------------------------
# Quant method double
# --------------------------------------------------------------------------


def quantize_fp8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 quantization: ``(fp8 weight, float32 scale)``.

    Public so tests can compute the expected processed values from the
    checkpoint tensors.  The scale has shape ``(1,)`` like vLLM's per-tensor
    scale (FSDP2 also rejects 0-d parameters).  The scale is clamped away from zero so an all-zero
    weight quantizes to zeros instead of NaN.  A ``meta`` input gives ``meta``
    outputs (older vLLM without ``finalize_layerwise_processing``).
    """
    amax = weight.detach().abs().amax().to(torch.float32).reshape(1)
    scale = (amax / FP8_MAX).clamp_min(torch.finfo(torch.float32).tiny)
    qweight = (weight.detach().to(torch.float32) / scale).clamp(-FP8_MAX, FP8_MAX)
    return qweight.to(FP8_DTYPE), scale


class _CpuFp8MethodBase(QuantizeMethodBase):
    """Shared body of the online and offline CPU FP8 doubles.

    Subclasses choose only where ``weight`` is created (``uses_meta_device``).
    """

    def create_weights(  # type: ignore[override]
        self,
        layer: nn.Module,
        in_features: int,
        out_features: int,
        dtype: torch.dtype,
        weight_loader: Callable[..., Any] = default_weight_loader,
    ) -> None:
        """Register ``layer.weight`` with a vLLM-style ``weight_loader``.

        Online: the weight lives on ``meta`` and vLLM's real
        ``initialize_online_processing`` wraps its loader so the layer is
        materialized and processed once fully loaded.  Offline: the weight
        lives on the default device and is processed by the model loader.
        """
        device = torch.device("meta") if self.uses_meta_device else None
        weight = nn.Parameter(
            torch.empty(out_features, in_features, dtype=dtype, device=device),
            requires_grad=False,
        )
        weight.weight_loader = weight_loader  # type: ignore[attr-defined]
        layer.register_parameter("weight", weight)
        if self.uses_meta_device and initialize_online_processing is not None:
            initialize_online_processing(layer)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Quantize ``layer.weight`` to FP8 once, like vLLM's online FP8.

        ``layer._test_process_calls`` counts quantizations that actually ran,
        ``layer._test_process_skips`` the calls that returned early because
        the layer was already processed.  A still-``meta`` weight quantizes
        to ``meta`` without error.
        """
        if getattr(layer, PROCESSED_FLAG, False):
            layer._test_process_skips = getattr(layer, "_test_process_skips", 0) + 1
            return
        qweight, scale = quantize_fp8(layer.weight)
        layer.weight = nn.Parameter(qweight, requires_grad=False)
        layer.weight_scale = nn.Parameter(scale, requires_grad=False)
        setattr(layer, PROCESSED_FLAG, True)
        layer._test_process_calls = getattr(layer, "_test_process_calls", 0) + 1

    def apply(  # type: ignore[override]
        self,
        layer: nn.Module,
        x: torch.Tensor,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Linear with the dequantized weight (or the raw one if unprocessed).

        Records the dtype of the weight actually used in
        ``layer._test_apply_weight_dtype``: FSDP can swap ``layer.weight``
        behind the method's back (see :func:`fsdp_model`).
        """
        layer._test_apply_weight_dtype = layer.weight.dtype
        weight = layer.weight.to(torch.float32)
        scale = getattr(layer, "weight_scale", None)
        if scale is not None:
            weight = weight * scale
        return F.linear(x, weight.to(x.dtype), bias)


class CpuFp8OnlineMethod(_CpuFp8MethodBase):
    """Online FP8 double: weights on ``meta``, processed layer by layer."""

    uses_meta_device = True


class CpuFp8OfflineMethod(_CpuFp8MethodBase):
    """Same FP8 processing without meta weights ("no online quant" models)."""

    uses_meta_device = False


class CpuFp8OnlineLinearMethod(CpuFp8OnlineMethod):
    """The online double behind vLLM's own linear layers (``QKVParallelLinear``, ``RowParallelLinear``, ...), as
    a real model builds them: ``create_weights`` takes vLLM's ``LinearMethodBase`` arguments and registers the
    weight the way vLLM's online FP8 linear methods do (on ``meta``, the layer's own ``weight_loader``, then
    ``initialize_online_processing``); processing and ``apply`` are the CPU FP8 double's."""

    def create_weights(  # type: ignore[override]
        self,
        layer: nn.Module,
        input_size_per_partition: int,
        output_partition_sizes: list[int],
        input_size: int,
        output_size: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs: Any,
    ) -> None:
        from vllm.model_executor.parameter import ModelWeightParameter

        weight = ModelWeightParameter(
            data=torch.empty(sum(output_partition_sizes), input_size_per_partition, device="meta",
                             dtype=params_dtype),
            input_dim=1, output_dim=0, weight_loader=extra_weight_attrs.pop("weight_loader"),
        )
        layer.register_parameter("weight", weight)
        for key, value in extra_weight_attrs.items():
            setattr(weight, key, value)
        if initialize_online_processing is not None:
            initialize_online_processing(layer)


def cpu_fp8_online_config():
    """A vLLM ``QuantizationConfig`` that gives every vLLM linear layer :class:`CpuFp8OnlineLinearMethod`: what a
    model gets from ``quantization="fp8"`` on a BF16 checkpoint, with a method that runs on a CPU."""
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

    class CpuFp8OnlineConfig(QuantizationConfig):
        def get_name(self):
            return "cpu_fp8_online_double"

        def get_supported_act_dtypes(self):
            return [torch.bfloat16, torch.float16, torch.float32]

        @classmethod
        def get_min_capability(cls):
            return 0

        @staticmethod
        def get_config_filenames():
            return []

        @classmethod
        def from_config(cls, config):
            return cls()

        def get_quant_method(self, layer, prefix):
            return CpuFp8OnlineLinearMethod() if isinstance(layer, LinearBase) else None

    return CpuFp8OnlineConfig()


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


def fused_shard_loader(
    param: torch.Tensor,
    loaded_weight: torch.Tensor,
    loaded_shard_id: int | None = None,
) -> None:
    """Load one output-dim shard, like a merged column-parallel layer (TP=1).

    The first argument must be named ``param``: vLLM's layerwise wrapper
    rebinds it by name when it replays buffered loads.  ``loaded_shard_id``
    of ``None`` loads the whole (unfused) tensor.
    """
    if loaded_shard_id is None:
        default_weight_loader(param, loaded_weight)
        return
    size = loaded_weight.shape[0]
    param.data.narrow(0, loaded_shard_id * size, size).copy_(loaded_weight)


class QuantLinear(nn.Module):
    """Linear layer whose weight is owned by a vLLM ``QuantizeMethodBase``.

    ``n_shards > 1`` makes a fused layer (``out_features`` is per shard) whose
    weight is loaded shard by shard through :func:`fused_shard_loader`, which
    is how a layer ends up partially loaded.  ``bias`` is a plain, non-meta
    parameter, as in vLLM (it is created after ``create_weights``).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        quant_method: QuantizeMethodBase,
        *,
        n_shards: int = 1,
        bias: bool = False,
        dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features * n_shards
        self.n_shards = n_shards
        self.quant_method = quant_method
        loader = fused_shard_loader if n_shards > 1 else default_weight_loader
        quant_method.create_weights(self, in_features, self.out_features, dtype, weight_loader=loader)
        if bias:
            self.bias = nn.Parameter(torch.zeros(self.out_features, dtype=dtype), requires_grad=False)
            self.bias.weight_loader = default_weight_loader  # type: ignore[attr-defined]
        else:
            self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class Block(nn.Module):
    """DiT-ish block: ``x + proj_out(gelu(gate) * up)`` on ``norm(x)``.

    ``proj_in`` is fused from the checkpoint tensors ``to_gate``/``to_up``
    (see :data:`STACKED_PARAMS`); ``norm`` has no ``quant_method``.
    """

    def __init__(self, hidden: int, method_cls: type[_CpuFp8MethodBase], dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(hidden, dtype=dtype)
        self.proj_in = QuantLinear(hidden, hidden, method_cls(), n_shards=2, dtype=dtype)
        self.proj_out = QuantLinear(hidden, hidden, method_cls(), dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.proj_in(self.norm(x)).chunk(2, dim=-1)
        return x + self.proj_out(F.gelu(gate) * up)


@dataclass(frozen=True)
class Straggler:
    """A quant layer the checkpoint does not fully cover.

    ``absent``: no checkpoint tensor reaches the layer (it loads 0 elements).
    ``partial``: only the first shard of a fused layer is loaded.
    """

    layer: str
    kind: Literal["absent", "partial"]


class TinyDiT(nn.Module):
    """A stack of :class:`Block`; remembers its default stragglers and seed."""

    def __init__(
        self,
        n_layers: int,
        hidden: int,
        method_cls: type[_CpuFp8MethodBase],
        dtype: torch.dtype,
        stragglers: Sequence[Straggler],
        seed: int,
    ) -> None:
        super().__init__()
        self.hidden = hidden
        self.dtype = dtype
        self.seed = seed
        self.blocks = nn.ModuleList(Block(hidden, method_cls, dtype) for _ in range(n_layers))
        self.stragglers = tuple(stragglers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


#: vLLM-style ``stacked_params_mapping``: (model name, checkpoint name, shard).
STACKED_PARAMS: tuple[tuple[str, str, int], ...] = (
    ("proj_in", "to_gate", 0),
    ("proj_in", "to_up", 1),
)

#: One layer absent from the checkpoint, one partially loaded.
DEFAULT_STRAGGLERS: tuple[Straggler, ...] = (
    Straggler("blocks.1.proj_out", "absent"),
    Straggler("blocks.2.proj_in", "partial"),
)


def build_model(
    n_layers: int = 4,
    hidden: int = 16,
    online: bool = True,
    stragglers: Sequence[Straggler] = DEFAULT_STRAGGLERS,
    seed: int = 0,
    dtype: torch.dtype = torch.bfloat16,
) -> TinyDiT:
    """Build a :class:`TinyDiT` with online (meta) or offline quant layers.

    ``stragglers`` is stored on the model as the default for
    :func:`load_checkpoint`; straggler layer names must exist (checked here so
    a typo cannot silently turn a straggler test into a fully-loaded one).
    Construction draws no random numbers; ``seed`` is stored as the default
    checkpoint seed of :func:`make_checkpoint`.
    """
    method_cls = CpuFp8OnlineMethod if online else CpuFp8OfflineMethod
    model = TinyDiT(n_layers, hidden, method_cls, dtype, stragglers, seed)
    names = dict(model.named_modules())
    for straggler in stragglers:
        layer = names.get(straggler.layer)
        if not isinstance(layer, QuantLinear):
            raise ValueError(f"straggler {straggler.layer!r} is not a QuantLinear")
        if straggler.kind == "partial" and layer.n_shards < 2:
            raise ValueError(f"partial straggler {straggler.layer!r} is not fused")
    return model


def _checkpoint_names(model: nn.Module) -> dict[str, tuple[str, int | None, tuple[int, ...]]]:
    """Checkpoint name -> (model param name, shard id, shape), in load order."""
    names: dict[str, tuple[str, int | None, tuple[int, ...]]] = {}
    for name, param in model.named_parameters():
        layer_name, _, leaf = name.rpartition(".")
        if leaf == "weight_scale":  # created by processing, never in a checkpoint
            continue
        layer = model.get_submodule(layer_name) if layer_name else model
        n_shards = getattr(layer, "n_shards", 1)
        if n_shards == 1 or leaf != "weight":
            names[name] = (name, None, tuple(param.shape))
            continue
        parent, _, child = layer_name.rpartition(".")
        shard_shape = (param.shape[0] // n_shards, *param.shape[1:])
        for model_child, ckpt_child, shard_id in STACKED_PARAMS:
            if model_child == child:
                ckpt = f"{parent}.{ckpt_child}.{leaf}"
                names[ckpt] = (name, shard_id, shard_shape)
    return names


def make_checkpoint(
    model: nn.Module, seed: int | None = None, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """Deterministic full checkpoint (no stragglers applied) for ``model``.

    Call it on a freshly built model.  Values come from a private CPU
    generator seeded with ``seed`` (default: ``model.seed``), in ``dtype``
    (default: the model's dtype, bf16 unless built otherwise).  Fused layers
    appear under their checkpoint names (``to_gate``/``to_up``).
    """
    dtype = dtype or getattr(model, "dtype", torch.bfloat16)
    gen = torch.Generator().manual_seed(getattr(model, "seed", 0) if seed is None else seed)
    return {
        name: torch.randn(shape, generator=gen, dtype=torch.float32).to(dtype)
        for name, (_, _, shape) in _checkpoint_names(model).items()
    }


def _is_skipped(layer: str, shard_id: int | None, stragglers: Sequence[Straggler]) -> bool:
    """Whether a straggler rule withholds this (layer, shard) from loading."""
    for straggler in stragglers:
        if layer != straggler.layer:
            continue
        if straggler.kind == "absent":
            return True
        if straggler.kind == "partial" and shard_id not in (None, 0):
            return True
    return False


def load_checkpoint(
    model: nn.Module,
    checkpoint: Mapping[str, torch.Tensor],
    stragglers: Sequence[Straggler] | None = None,
) -> set[str]:
    """Feed ``checkpoint`` through each param's ``weight_loader``, as vLLM does.

    Mirrors a vLLM model's ``load_weights``: stacked names are mapped to the
    fused parameter and loaded with their shard id, everything else with
    ``weight_loader(param, tensor)`` (``default_weight_loader`` when a param
    has none).  ``stragglers`` (default: ``model.stragglers``) are skipped:
    an ``absent`` layer receives nothing, a ``partial`` layer only shard 0.
    Returns the model parameter names that received data.

    Afterwards, with vLLM's layerwise processing, fully loaded online layers
    hold fp8 weights while stragglers keep ``weight`` on ``meta``.  Beware: a
    forward then does not raise; on CPU torch 2.13 ``F.linear`` with a CPU
    input and a ``meta`` weight returns a *CPU* tensor of uninitialized
    memory, so the output is silently garbage (compare values, not devices).
    """
    if stragglers is None:
        stragglers = getattr(model, "stragglers", ())
    names = _checkpoint_names(model)
    loaded: set[str] = set()
    for ckpt_name, tensor in checkpoint.items():
        param_name, shard_id, _ = names[ckpt_name]
        layer = param_name.rpartition(".")[0]
        if _is_skipped(layer, shard_id, stragglers):
            continue
        # Look the param up each time: processing replaces ``weight``.
        param = model.get_parameter(param_name)
        loader = getattr(param, "weight_loader", default_weight_loader)
        if shard_id is None:
            loader(param, tensor)
        else:
            loader(param, tensor, shard_id)
        loaded.add(param_name)
    return loaded


def meta_param_names(model: nn.Module) -> list[str]:
    """Names of parameters still on the ``meta`` device."""
    return [name for name, param in model.named_parameters() if param.is_meta]


def quant_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Modules whose ``quant_method`` is a real vLLM ``QuantizeMethodBase``."""
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(getattr(module, "quant_method", None), QuantizeMethodBase)
    }


@contextlib.contextmanager
def deterministic_fill() -> Iterator[None]:
    """Make uninitialized memory deterministic (NaN / max int), then restore.

    vLLM materializes a never-loaded straggler with ``torch.empty_strided``;
    with this active, two runs produce bit-identical straggler values.
    """
    saved_fill = torch.utils.deterministic.fill_uninitialized_memory
    saved_algos = torch.are_deterministic_algorithms_enabled()
    saved_warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.utils.deterministic.fill_uninitialized_memory = True
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved_algos, warn_only=saved_warn)
        torch.utils.deterministic.fill_uninitialized_memory = saved_fill


# --------------------------------------------------------------------------
# Loader stand-in and the ungated fix
# --------------------------------------------------------------------------


class LoaderShaped:
    """Stand-in for a vllm-omni ``DiffusersPipelineLoader`` *instance*.

    The method under test is a plain function called as
    ``fn(loader, model, target_device)``; this object only supplies the
    attributes such methods read from ``self``.
    """

    def __init__(self, quant_config: object | None = None) -> None:
        self.quant_config = quant_config

    @staticmethod
    def _has_online_quant(model: nn.Module) -> bool:
        """Same rule as vllm-omni's ``has_online_quantization``."""
        return any(
            getattr(getattr(module, "quant_method", None), "uses_meta_device", False)
            for module in model.modules()
        )


def ungated_process_weights_after_loading(
    self: object, model: nn.Module, target_device: torch.device
) -> None:
    """The first (ungated) upstream fix, rebuilt from its description.

    Always finalizes layerwise processing, then, for every quant module,
    moves each non-meta parameter to ``target_device`` one by one via
    ``param.data = ...`` (instead of ``module.to``, which fails on meta),
    processes, and moves those parameters back.  It is "ungated" because it
    runs this path even when no online quantization is in use, e.g. on
    FSDP-sharded models (see :func:`fsdp_model`).
    """
    from vllm.model_executor.model_loader.reload.layerwise import (
        finalize_layerwise_processing as finalize,
    )

    finalize(model, model_config=None)
    for module in quant_layers(model).values():
        original_devices: dict[str, torch.device] = {}
        for name, param in module.named_parameters():
            if not param.is_meta and param.device != target_device:
                original_devices[name] = param.device
                param.data = param.data.to(target_device)
        module.quant_method.process_weights_after_loading(module)
        for name, param in module.named_parameters():
            if name in original_devices:
                param.data = param.data.to(original_devices[name])


# --------------------------------------------------------------------------
# FSDP2
# --------------------------------------------------------------------------


def ensure_process_group() -> None:
    """Initialize a 1-rank gloo group (FileStore in a temp dir) if none exists."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    store_dir = tempfile.mkdtemp(prefix="online_quant_pg_")
    store = dist.FileStore(os.path.join(store_dir, "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))


def fsdp_model(
    n_layers: int = 4,
    hidden: int = 16,
    online: bool = True,
    stragglers: Sequence[Straggler] = (),
    seed: int = 0,
    checkpoint_seed: int = 1,
) -> tuple[TinyDiT, dict[str, torch.Tensor]]:
    """Build, load and FSDP2-shard a model; return ``(model, checkpoint)``.

    Each block, then the root, is wrapped with ``fully_shard`` on a 1-rank
    gloo group (:func:`ensure_process_group`), i.e. loading happens *before*
    sharding, like vllm-omni's HSDP path; in vllm-omni 0.24.0 the loader's
    ``_process_weights_after_loading`` then runs on the *sharded* model.

    Findings, measured on CPU torch 2.13 (gloo, world size 1), vLLM 0.30.0:

    * ``param.data = param.data.to("cpu")`` on a DTensor param does not raise
      and is silently ignored: ``param.to_local()`` keeps the same storage, and
      even ``param.data = param.data * 0`` leaves ``to_local()`` and the
      forward output unchanged (FSDP all-gathers from its own sharded
      storage).  So the ungated fix's per-parameter ``.data`` device moves are
      no-ops on FSDP params (on CPU they are same-device anyway; across
      devices the shard would simply stay where it was).
    * Processing an already sharded module (ungated fix, vllm-omni 0.24.0's
      legacy ``module.to`` path, and 0.30.0's gated path all behave alike on
      CPU, since no device move is needed) quantizes the DTensor weight into
      new *DTensor* ``weight`` (fp8) / ``weight_scale`` Parameters that FSDP
      does not manage.  FSDP's pre-forward unshard then re-installs the
      all-gathered *original* bf16 weight, so the processed weight is lost;
      the forward then raises ``RuntimeError: aten.mul.Tensor got mixed
      torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor
      before calling distributed operators!`` (bf16 plain weight times DTensor
      scale).  It is loud here only because the scale is a DTensor; a method
      whose processed tensors end up plain would silently compute with the
      unquantized weight.
    * Online layers processed *during loading* are sharded as fp8 + scale
      and the forward matches an unsharded processed model exactly.
    * Stragglers left on ``meta`` are sharded as meta DTensors; vLLM's
      ``finalize_layerwise_processing`` then fails in ``materialize_meta_tensor``
      with ``TypeError: __class__ assignment: 'DTensor' object layout differs
      from 'Tensor'``, and a forward raises ``RuntimeError: FSDP parameters
      should be materialized from meta device before training, but the
      following were still on meta device: [...]``.  Hence the default
      ``stragglers=()`` here.

    The check that tells "processed weights used" from "lost": run
    :func:`probe_forward` and assert every quant layer applied an fp8 weight
    (``weight_dtypes``) and that the output equals an unsharded, processed
    reference; "lost" shows as a bf16 applied weight (plus, here, an error).
    """
    from torch.distributed.fsdp import fully_shard

    ensure_process_group()
    model = build_model(n_layers, hidden, online=online, stragglers=stragglers, seed=seed)
    checkpoint = make_checkpoint(model, checkpoint_seed)
    load_checkpoint(model, checkpoint)
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model, checkpoint


@dataclass
class ForwardProbe:
    """Outcome of :func:`probe_forward`."""

    output: torch.Tensor | None
    error: BaseException | None
    #: quant layer name -> dtype of the weight its ``apply`` saw (None: not reached)
    weight_dtypes: dict[str, torch.dtype | None]

    @property
    def used_processed_weights(self) -> bool:
        """True when every quant layer computed with its fp8 weight."""
        return self.error is None and all(d == FP8_DTYPE for d in self.weight_dtypes.values())


def probe_forward(model: nn.Module, x: torch.Tensor) -> ForwardProbe:
    """Run ``model(x)`` and report which weight dtype each quant layer used.

    Errors are captured rather than raised so a test can assert on both the
    failure and on what the layers saw before it.
    """
    layers = quant_layers(model)
    for layer in layers.values():
        layer.__dict__.pop("_test_apply_weight_dtype", None)
    output: torch.Tensor | None = None
    error: BaseException | None = None
    try:
        with torch.no_grad():
            output = model(x)
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        error = exc
    dtypes = {name: getattr(layer, "_test_apply_weight_dtype", None) for name, layer in layers.items()}
    return ForwardProbe(output, error, dtypes)
