"""The loader's variants, each named by the upstream loader shape it serves: ``legacy`` (vllm-omni 0.24.0's own
method, for a vLLM that creates no meta params) and ``meta_safe`` (the gated fix's semantics, hardened), with what
they need from the installed vLLM and torch (``resolve_deps``), the contract check and the install."""


from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...detect.model import accepts_call
from ...errors import PatchRefusedError, UnsupportedLayoutError
from .. import _method
from .facts import (
    FINALIZE_CALL_KEYWORDS,
    FINALIZE_CALL_POSITIONAL,
    FINALIZE_MODULE,
    FINALIZE_NAME,
    LOADER_PARAMS,
    LoaderShape,
)

ENTRY_ID = "diffusers_loader_meta_device"
CLASS_NAME, METHOD_NAME = "DiffusersPipelineLoader", "_process_weights_after_loading"  # the catalogue row's target
TARGET_PATH = f"vllm_omni.diffusion.model_loader.diffusers_loader.{CLASS_NAME}.{METHOD_NAME}"

# Set by vLLM quant methods (and vLLM's layerwise loader) once a layer's weights are processed.
PROCESSED_FLAG = "_already_called_process_weights_after_loading"
VARIANTS = ("legacy", "meta_safe")


@dataclass(frozen=True)
class LoaderDeps:
    """What the variants need from the installed vLLM and torch, resolved when the patch is installed.

    ``find_finalize()`` returns the finalize to call, or None (vLLM 0.17/0.18 have none: stragglers cannot be
    finalized and are processed where they are). In production it looks vLLM's layerwise module up at call
    time, so a finalize replaced there later (a test's stub, another plugin's wrapper) is the one called.
    """

    quant_method_base: type
    find_finalize: Callable[[], Callable[..., Any] | None]
    is_tensor_subclass: Callable[[Any], bool]


def _quant_modules(model, quant_method_base: type):
    for _, module in model.named_modules():
        quant_method = getattr(module, "quant_method", None)
        if quant_method is not None and isinstance(quant_method, quant_method_base):
            yield module, quant_method


def _process_with_module_move(module, quant_method, target_device, *, meta_safe_deps: LoaderDeps | None = None) -> None:
    """vllm-omni 0.24.0's per-module step: move the whole module (``module.to`` swaps DTensor params in place,
    which FSDP/HSDP survive), process, move it back. Moves back on error too, so a failing quant method
    leaves no module on the target device.

    ``meta_safe_deps`` (meta_safe only): a module that holds a meta param although no quant method declared ``uses_meta_device`` takes
    the meta-safe step instead, where a move is needed (``module.to`` cannot copy a meta param). Checked only
    then: where no move is needed both steps are the same call, and the offline path keeps in-tree's cost."""
    first_param = next(module.parameters(), None)
    module_device = first_param.device if first_param is not None else None
    needs_device_move = module_device != target_device
    if needs_device_move and meta_safe_deps is not None and _has_meta_param(module):
        _process_without_moving_meta(module, quant_method, target_device, meta_safe_deps)
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


def _holds_tensor_subclass(module, deps: LoaderDeps) -> bool:
    # DTensor (FSDP/HSDP) and other wrapper subclasses: `.data =` across devices is lost or crashes later.
    # The same test torch's Module._apply uses to swap such params in place instead of assigning `.data`.
    return any(deps.is_tensor_subclass(param) for param in module.parameters())


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


def _process_without_moving_meta(module, quant_method, target_device, deps: LoaderDeps) -> None:
    """The meta-safe step: per-param moves for plain tensors, whole-module moves (or a clear refusal) for
    tensor-subclass (DTensor) params, whose ``.data`` cannot be re-pointed across devices.

    Where no real param is off the target device (online quant initializes on the accelerator: the usual case)
    every one of those steps is the bare process call, so it is made without asking which one applies: one pass
    over the params, as in-tree's first, and no second one (bench section 3)."""
    for param in module.parameters():
        if param.device != target_device and not param.is_meta:
            break
    else:
        quant_method.process_weights_after_loading(module)
        return
    if _holds_tensor_subclass(module, deps):
        _process_sharded_module(module, quant_method, target_device)
    else:
        _process_with_param_moves(module, quant_method, target_device)


def _refuse_sharded_stragglers(model, cause: BaseException, deps: LoaderDeps) -> None:
    """vLLM's finalize cannot materialize a meta param that FSDP has already sharded (it fails deep inside with
    "__class__ assignment: 'DTensor' object layout differs from 'Tensor'"): when that is why ``cause`` was raised,
    say what and where instead (the original error stays chained)."""
    sharded_meta = [
        name for name, param in model.named_parameters() if param.is_meta and deps.is_tensor_subclass(param)
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
        import logging  # not at module level: the static doctor imports this module, and logging costs ~10 ms

        logging.getLogger("vllm_compat").warning(
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
    finalize = deps.find_finalize() if online else None
    if finalize is not None:
        try:
            # As the in-tree fix calls it. model_config is only read for vLLM Attention layers, which diffusion
            # models do not have.
            finalize(model, model_config=None)
        except Exception as exc:
            # Explain the one failure we know (sharded stragglers) only once it happened: no extra pass on the
            # happy path.
            _refuse_sharded_stragglers(model, exc, deps)
            raise
    # The in-tree method's own loop, inlined: walked lazily (no list, so peak memory stays its own), and per layer
    # no generator and, where no move is needed, no helper call, so time per layer stays its own (bench section 3).
    quant_method_base = deps.quant_method_base
    for _, module in model.named_modules():
        quant_method = getattr(module, "quant_method", None)
        if quant_method is None or not isinstance(quant_method, quant_method_base):
            continue
        if getattr(module, PROCESSED_FLAG, False):
            continue
        if online:
            _process_without_moving_meta(module, quant_method, target_device, deps)
            continue
        first_param = next(module.parameters(), None)
        if first_param is not None and first_param.device == target_device:
            # What _process_with_module_move does where no move is needed.
            quant_method.process_weights_after_loading(module)
        else:
            _process_with_module_move(module, quant_method, target_device, meta_safe_deps=deps)
    if online and finalize is None:
        _warn_meta_leftovers(model)


VARIANT_FUNCTIONS = {"legacy": process_legacy, "meta_safe": process_meta_safe}


def _layerwise_finalize_finder(layerwise) -> Callable[[], Callable[..., Any] | None]:
    """A ``find_finalize`` reading ``layerwise.finalize_layerwise_processing`` at each call; the acceptance check
    (does it take ``(model, model_config=None)``?) is redone only when the object there changes."""
    from ...detect.runtime import live_params

    checked: list = [None, None]  # [the finalize object last checked, whether it accepts the call]

    def find_finalize():
        finalize = getattr(layerwise, FINALIZE_NAME, None)
        if finalize is None or not callable(finalize):
            return None
        if checked[0] is not finalize:
            ok = accepts_call(live_params(finalize), FINALIZE_CALL_POSITIONAL, FINALIZE_CALL_KEYWORDS)
            checked[:] = [finalize, ok]
        return finalize if checked[1] else None

    # Checked now, while the patch is installed: the check reads the signature (~50 us, 1.7 % of a 100-layer
    # online call in instructions, bench section 3i), and the one loading call of a worker would otherwise pay it.
    find_finalize()
    return find_finalize


def resolve_deps() -> LoaderDeps:
    """Import what the variants call from the installed vLLM and torch (already imported by vllm-omni's
    loader). vLLM without a layerwise module (< 0.16) gets a finder that always answers None."""
    import importlib

    from torch.utils._python_dispatch import is_traceable_wrapper_subclass
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    try:
        layerwise = importlib.import_module(FINALIZE_MODULE)
    except ImportError:
        layerwise = None
    return LoaderDeps(
        quant_method_base=QuantizeMethodBase,
        find_finalize=_layerwise_finalize_finder(layerwise),
        is_tensor_subclass=is_traceable_wrapper_subclass,
    )


def check_contract(original: Callable, shape: LoaderShape) -> None:
    """Refuse a target whose live signature is not ``(self, model, target_device[, optional extras])``: no
    variant can be called the way vllm-omni calls it. Raises ``PatchRefusedError`` with what was found."""
    if not callable(original):
        raise PatchRefusedError(f"{TARGET_PATH} is {original!r}, not a function; cannot patch it.")
    params = list(inspect.signature(original).parameters.values())
    names = tuple(p.name for p in params[: len(LOADER_PARAMS)])
    extras_required = [
        p.name
        for p in params[len(LOADER_PARAMS):]
        if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if names != LOADER_PARAMS or extras_required:
        raise PatchRefusedError(
            f"{TARGET_PATH} has signature {inspect.signature(original)}; expected "
            f"({', '.join(LOADER_PARAMS)}[, extras with defaults]) (shape: {shape.kind}, {shape.detail}). "
            f"It was left unpatched; set VLLM_COMPAT_DISABLE_PATCHES={ENTRY_ID} to silence this, or upgrade "
            f"vllm_compat."
        )


def installed_variant(loader_class: type) -> str | None:
    """The variant we installed on ``loader_class`` itself (not inherited), or None."""
    return _method.installed_variant(loader_class, METHOD_NAME)


def install_variant(loader_class: type, variant: str, deps: LoaderDeps) -> bool:
    """Replace ``loader_class``'s method with ``variant``; False when that variant is already installed.

    Extra arguments (optional parameters newer vllm-omni versions add) are bound against the original's
    signature and forwarded to the variant, which ignores the ones it does not know.
    """
    implementation = VARIANT_FUNCTIONS[variant]
    signature = inspect.signature(vars(loader_class)[METHOD_NAME])

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

    return _method.install(loader_class, METHOD_NAME, variant, call_variant, ENTRY_ID)


