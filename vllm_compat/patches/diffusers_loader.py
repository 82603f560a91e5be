"""Patch ``vllm_omni...DiffusersPipelineLoader._process_weights_after_loading``.

Why: vLLM's online quantization (``uses_meta_device = True``) leaves "straggler" layers on ``meta``; the
legacy loader's blanket ``module.to()`` raises "Cannot copy out of meta tensor" on them, and the first fix
(per-parameter ``.data`` moves) broke FSDP/HSDP-sharded DTensor params.
When: ``legacy`` serves vllm-omni <= 0.24.0 on a vLLM that creates no meta params (its exact semantics);
``meta_safe`` serves the legacy and ungated loaders wherever meta params can appear. A gated loader
(vllm-omni >= 0.26.0) is left alone unless a variant is forced.
Retire when: the oldest supported vllm-omni ships the gated loader (0.26.0).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from ..detect.model import LOADER_PARAMS, LoaderShape
from ..errors import PatchRefusedError, UnsupportedLayoutError
from .catalogue import DIFFUSERS_LOADER as ENTRY

logger = logging.getLogger("vllm_compat")

METHOD_NAME = ENTRY.target.rsplit(".", 1)[-1]
# Set by vLLM quant methods (and vLLM's layerwise loader) once a layer's weights are processed.
PROCESSED_FLAG = "_already_called_process_weights_after_loading"
VARIANTS = ("legacy", "meta_safe")


@dataclass(frozen=True)
class LoaderDeps:
    """What the variants need from the installed vLLM, resolved once when the patch is installed.

    ``finalize`` is vLLM's ``finalize_layerwise_processing`` where the installed vLLM has a compatible one,
    else None (vLLM 0.17/0.18: stragglers cannot be finalized and are processed where they are).
    """

    quant_method_base: type
    finalize: Callable[..., Any] | None


def _quant_modules(model, quant_method_base: type):
    for _, module in model.named_modules():
        quant_method = getattr(module, "quant_method", None)
        if quant_method is not None and isinstance(quant_method, quant_method_base):
            yield module, quant_method


def _process_with_module_move(module, quant_method, target_device, *, meta_safe: bool = False) -> None:
    """vllm-omni 0.24.0's per-module step: move the whole module (``module.to`` swaps DTensor params in place,
    which FSDP/HSDP survive), process, move it back. Moves back on error too, so a failing quant method
    leaves no module on the target device.

    ``meta_safe``: a module that holds a meta param although no quant method declared ``uses_meta_device`` takes
    the meta-safe step instead, where a move is needed (``module.to`` cannot copy a meta param). Checked only
    then: where no move is needed both steps are the same call, and the offline path keeps in-tree's cost."""
    first_param = next(module.parameters(), None)
    module_device = first_param.device if first_param is not None else None
    needs_device_move = module_device != target_device
    if needs_device_move and meta_safe and _has_meta_param(module):
        _process_without_moving_meta(module, quant_method, target_device)
        return
    if needs_device_move:
        module.to(target_device)
    try:
        quant_method.process_weights_after_loading(module)
    finally:
        if needs_device_move:
            module.to(module_device)


def _process_with_param_moves(module, quant_method, target_device) -> None:
    """The gated fix's per-module step for plain tensors: move each non-meta param not on the target device,
    process, move those names back; params the quant method created stay on the target device."""
    original_devices = {}
    for name, param in module.named_parameters():
        if param.device.type != "meta" and param.device != target_device:
            original_devices[name] = param.device
            param.data = param.data.to(target_device)
    try:
        quant_method.process_weights_after_loading(module)
    finally:
        for name, param in module.named_parameters():
            if name in original_devices:
                param.data = param.data.to(original_devices[name])


def _holds_tensor_subclass(module) -> bool:
    # DTensor (FSDP/HSDP) and other wrapper subclasses: `.data =` across devices is lost or crashes later.
    # The same test torch's Module._apply uses to swap such params in place instead of assigning `.data`.
    return any(is_traceable_wrapper_subclass(param) for param in module.parameters())


def _has_meta_param(module) -> bool:
    return any(param.is_meta for param in module.parameters())


def _process_sharded_module(module, quant_method, target_device) -> None:
    """Tensor-subclass params under online quant: whole-module moves only, and none when a meta param is
    present and a move would be needed (that cannot be done without losing the param: say so instead)."""
    params = dict(module.named_parameters())
    meta_names = [name for name, p in params.items() if p.device.type == "meta"]
    if not meta_names:
        _process_with_module_move(module, quant_method, target_device)
        return
    off_target = [name for name, p in params.items() if p.device.type != "meta" and p.device != target_device]
    if off_target:
        raise UnsupportedLayoutError(
            f"{type(module).__name__} holds sharded (tensor-subclass) params {off_target} off the target device "
            f"{target_device} and params still on meta {meta_names}. Moving it would either crash on the meta "
            f"params or re-point the sharded ones. Load the model with vLLM >= 0.19 (which finalizes stragglers) "
            f"or place the module on {target_device} before loading."
        )
    quant_method.process_weights_after_loading(module)


def _process_without_moving_meta(module, quant_method, target_device) -> None:
    """The meta-safe step: per-param moves for plain tensors, whole-module moves (or a clear refusal) for
    tensor-subclass (DTensor) params, whose ``.data`` cannot be re-pointed across devices."""
    if _holds_tensor_subclass(module):
        _process_sharded_module(module, quant_method, target_device)
    else:
        _process_with_param_moves(module, quant_method, target_device)


def _refuse_sharded_stragglers(model, cause: BaseException) -> None:
    """vLLM's finalize cannot materialize a meta param that FSDP has already sharded (it fails deep inside with
    "__class__ assignment: 'DTensor' object layout differs from 'Tensor'"): when that is why ``cause`` was raised,
    say what and where instead (the original error stays chained)."""
    sharded_meta = [
        name for name, param in model.named_parameters() if param.is_meta and is_traceable_wrapper_subclass(param)
    ]
    if sharded_meta:
        raise UnsupportedLayoutError(
            f"{len(sharded_meta)} sharded (FSDP/HSDP DTensor) parameter(s) are still on meta: "
            f"{', '.join(sharded_meta[:5])}. These layers were not fully loaded before the model was sharded, and "
            f"vLLM's layerwise finalize cannot materialize sharded params. Process weights before fully_shard "
            f"(as vllm-omni >= 0.26 does), or make the checkpoint cover these layers."
        ) from cause


def _warn_meta_leftovers(model) -> None:
    left = [name for name, param in model.named_parameters() if param.is_meta]
    if left:
        logger.warning(
            "vllm_compat: %d parameter(s) are still on meta after weight processing (first: %s). The installed "
            "vLLM has no layerwise finalize to materialize them; these layers were never fully loaded.",
            len(left),
            ", ".join(left[:5]),
        )


def process_legacy(loader, model, target_device, *, deps: LoaderDeps, **loader_kwargs) -> None:
    """vllm-omni 0.24.0's method: blanket ``module.to()`` around every quant method (plus move-back on error)."""
    for module, quant_method in _quant_modules(model, deps.quant_method_base):
        _process_with_module_move(module, quant_method, target_device)


def uses_online_quant(model) -> bool:
    """The gated fix's test: any module's quant method (the instance, so per-instance switches count) declares
    ``uses_meta_device``."""
    return any(getattr(getattr(m, "quant_method", None), "uses_meta_device", False) for m in model.modules())


def process_meta_safe(loader, model, target_device, *, deps: LoaderDeps, **loader_kwargs) -> None:
    """The gated fix's semantics, hardened.

    Same resulting params as vllm-omni 0.26.0+'s in-tree method wherever that works. In addition: a quant module
    holding meta params takes the meta-safe path even when no method declares ``uses_meta_device``; finalize is
    called only where vLLM provides it (and refused with a clear error for sharded stragglers it cannot
    materialize); a module holding tensor-subclass (DTensor) params is moved as a whole, never per ``.data``;
    params moved for processing go back even when processing raises; with no finalize available, quantized params
    left on meta are named in a warning.
    """
    online = uses_online_quant(model)
    if online and deps.finalize is not None:
        try:
            # model_config is only read for vLLM Attention layers, which diffusion models do not have.
            deps.finalize(model, None)
        except Exception as exc:
            # Explain the one failure we know (sharded stragglers) only once it happened: no extra pass on the
            # happy path.
            _refuse_sharded_stragglers(model, exc)
            raise
    # Walked lazily, as the in-tree method does: no list, so time and peak memory stay its own.
    for module, quant_method in _quant_modules(model, deps.quant_method_base):
        if getattr(module, PROCESSED_FLAG, False):
            continue
        if online:
            _process_without_moving_meta(module, quant_method, target_device)
        else:
            _process_with_module_move(module, quant_method, target_device, meta_safe=True)
    if online and deps.finalize is None:
        _warn_meta_leftovers(model)


VARIANT_FUNCTIONS = {"legacy": process_legacy, "meta_safe": process_meta_safe}


def resolve_deps(finalize_compatible: bool) -> LoaderDeps:
    """Import what the variants call from the installed vLLM (already imported by vllm-omni's loader)."""
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    finalize = None
    if finalize_compatible:
        from vllm.model_executor.model_loader.reload.layerwise import finalize_layerwise_processing

        finalize = finalize_layerwise_processing
    return LoaderDeps(quant_method_base=QuantizeMethodBase, finalize=finalize)


def check_contract(original: Callable, shape: LoaderShape) -> None:
    """Refuse a target whose live signature is not ``(self, model, target_device[, optional extras])``: no
    variant can be called the way vllm-omni calls it. Raises ``PatchRefusedError`` with what was found."""
    if not callable(original):
        raise PatchRefusedError(f"{ENTRY.target_path} is {original!r}, not a function; cannot patch it.")
    params = list(inspect.signature(original).parameters.values())
    names = tuple(p.name for p in params[: len(LOADER_PARAMS)])
    extras_required = [
        p.name
        for p in params[len(LOADER_PARAMS):]
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if names != LOADER_PARAMS or extras_required:
        raise PatchRefusedError(
            f"{ENTRY.target_path} has signature {inspect.signature(original)}; expected "
            f"({', '.join(LOADER_PARAMS)}[, extras with defaults]) (shape: {shape.kind}, {shape.detail}). "
            f"It was left unpatched; set VLLM_COMPAT_DISABLE=1 to silence this, or upgrade vllm_compat."
        )


@functools.cache
def _wrapper_type():
    import wrapt  # imported here, not on `import vllm_compat`: it costs tens of milliseconds

    class LoaderPatch(wrapt.FunctionWrapper):
        """Our wrapper. Class attributes (never instance ones: wrapt forwards those to the wrapped function)
        mark it as ours."""

        _vllm_compat_installed = True

        @property
        def _vllm_compat_variant(self) -> str:
            return self._self_variant

    return LoaderPatch


def installed_variant(loader_class: type) -> str | None:
    """The variant we installed on ``loader_class`` itself (not inherited), or None."""
    current = vars(loader_class).get(METHOD_NAME)
    return current._vllm_compat_variant if getattr(current, "_vllm_compat_installed", False) else None


def install(loader_class: type, variant: str, deps: LoaderDeps) -> bool:
    """Install ``variant`` on ``loader_class``; returns False when exactly that variant is already there.

    The caller holds the activation lock. The installed method keeps the original's name, docstring and
    signature (wrapt), exposes it as ``__wrapped__``, and accepts the extra keyword arguments newer vllm-omni
    versions pass (they are forwarded to the variant, which ignores the ones it does not know).
    """
    current = installed_variant(loader_class)
    if current == variant:
        return False
    if current is not None:
        uninstall(loader_class)
    original = vars(loader_class)[METHOD_NAME]
    implementation = VARIANT_FUNCTIONS[variant]
    signature = inspect.signature(original)

    def call_variant(wrapped, instance, args, kwargs):
        if instance is not None and len(args) == 2 and not kwargs:
            # How vllm-omni calls it, ``self._process_weights_after_loading(model, target_device)``: no binding.
            return implementation(instance, args[0], args[1], deps=deps)
        bound = signature.bind(instance, *args, **kwargs)
        arguments = dict(bound.arguments)
        arguments.pop("self")
        model = arguments.pop("model")
        target_device = arguments.pop("target_device")
        return implementation(instance, model, target_device, deps=deps, **arguments)

    patch = _wrapper_type()(original, call_variant)
    patch._self_variant = variant
    setattr(loader_class, METHOD_NAME, patch)
    return True


def uninstall(loader_class: type) -> bool:
    """Put back the exact original function object; False when nothing of ours was installed."""
    current = vars(loader_class).get(METHOD_NAME)
    if not getattr(current, "_vllm_compat_installed", False):
        return False
    setattr(loader_class, METHOD_NAME, current.__wrapped__)
    return True
