"""Runtime detection: the same facts as ``static``, asked of the imported modules.

Importing vLLM costs seconds, so this runs only inside the post-import hook (where vLLM is already loaded by
vllm-omni's loader), in ``apply()`` and in ``vllm-compat doctor --runtime``.
"""

from __future__ import annotations

import importlib
import inspect

from .model import (
    FINALIZE_MODULE,
    FINALIZE_NAME,
    Environment,
    LoaderKind,
    LoaderShape,
    Param,
    ParamKind,
    VllmCapabilities,
    classify_loader_source,
)
from .static import LOADER_CLASS, LOADER_METHOD, OMNI_LOADER_FILE, OMNI_QUANTIZATION_DIR
from .versions import installed_version

LOADER_MODULE = OMNI_LOADER_FILE[:-3].replace("/", ".")
_OMNI_QUANTIZATION_PACKAGE = OMNI_QUANTIZATION_DIR.rstrip("/").replace("/", ".")


def _import_optional(name: str):
    """Import ``name``; None when the module (or a package above it) does not exist. Any other error while
    importing propagates: a broken install must not read as "not installed"."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            return None
        raise


def probe_vllm() -> VllmCapabilities:
    """Capabilities of the imported vLLM (importing it if needed)."""
    base_config = _import_optional("vllm.model_executor.layers.quantization.base_config")
    if base_config is None:
        installed = installed_version("vllm") is not None
        return VllmCapabilities(installed=installed, readable=not installed)
    layerwise = _import_optional(FINALIZE_MODULE)
    finalize = getattr(layerwise, FINALIZE_NAME, None)
    finalize_params = live_params(finalize) if finalize is not None else ()
    return VllmCapabilities(
        installed=True,
        has_uses_meta_device=hasattr(base_config.QuantizeMethodBase, "uses_meta_device"),
        has_layerwise_finalize=finalize is not None,
        finalize_params=finalize_params,
        has_initialize_online_processing=hasattr(layerwise, "initialize_online_processing"),
    )


_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: ParamKind.POSITIONAL,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: ParamKind.POSITIONAL,
    inspect.Parameter.VAR_POSITIONAL: ParamKind.VAR_POSITIONAL,
    inspect.Parameter.KEYWORD_ONLY: ParamKind.KEYWORD_ONLY,
    inspect.Parameter.VAR_KEYWORD: ParamKind.VAR_KEYWORD,
}


def live_params(func) -> tuple[Param, ...]:
    """``func``'s parameters as static detection reports them; a callable without a signature (some builtins)
    counts as ``(*args, **kwargs)``."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return (Param("args", ParamKind.VAR_POSITIONAL), Param("kwargs", ParamKind.VAR_KEYWORD))
    return tuple(Param(p.name, _KINDS[p.kind], p.default is not p.empty) for p in signature.parameters.values())


def original_loader_function(loader_class: type):
    """The loader method as vllm-omni defined it: unwraps our own wrapper, never anyone else's."""
    from ..drift import unwrap

    return unwrap(inspect.getattr_static(loader_class, LOADER_METHOD, None))


def classify_loader_class(loader_class: type) -> LoaderShape:
    """Shape of ``loader_class``'s live loader method, read from its source via ``inspect``."""
    func = original_loader_function(loader_class)
    if func is None:
        return LoaderShape(LoaderKind.UNKNOWN, f"{loader_class.__qualname__} has no method {LOADER_METHOD}")
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError) as exc:
        return LoaderShape(LoaderKind.UNKNOWN, f"source of {LOADER_METHOD} is unavailable ({exc})")
    return classify_loader_source(source, LOADER_CLASS, LOADER_METHOD)


def probe_omni_meta_device_methods() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(``module:Class`` of imported vllm-omni quant classes with ``uses_meta_device = True``, modules of
    vllm-omni's quantization package that failed to import), one module at a time."""
    package = _import_optional(_OMNI_QUANTIZATION_PACKAGE)
    if package is None:
        return (), ()
    import pkgutil

    found, failed = [], []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.ispkg:
            continue  # static detection reads the package's own files only
        name = f"{_OMNI_QUANTIZATION_PACKAGE}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional quant backend that does not import is not our failure
            failed.append(name)
            continue
        for attr, value in vars(module).items():
            if (
                isinstance(value, type)
                and value.__module__ == name
                and vars(value).get("uses_meta_device") is True
            ):
                found.append(f"{name}:{attr}")
    return tuple(sorted(found)), tuple(failed)


def detect_runtime(loader_module=None) -> Environment:
    """Runtime detection. Imports vLLM and vllm-omni's loader module unless ``loader_module`` (the already
    imported module, as the post-import hook has it) is given."""
    if loader_module is None:
        # Found by import, not by metadata: static detection reads the files even without a dist-info.
        loader_module = _import_optional(LOADER_MODULE)
    loader_class = getattr(loader_module, LOADER_CLASS, None) if loader_module is not None else None
    if loader_module is None:
        loader = LoaderShape(LoaderKind.ABSENT, "vllm-omni is not installed")
    elif loader_class is None:
        loader = LoaderShape(LoaderKind.UNKNOWN, f"{LOADER_MODULE} has no class {LOADER_CLASS}")
    else:
        loader = classify_loader_class(loader_class)
    meta_methods, import_failures = probe_omni_meta_device_methods() if loader_module is not None else ((), ())
    return Environment(
        source="runtime",
        vllm_version=installed_version("vllm"),
        vllm_omni_version=installed_version("vllm-omni"),
        torch_version=installed_version("torch"),
        vllm=probe_vllm(),
        loader=loader,
        omni_meta_device_methods=meta_methods,
        omni_quant_import_failures=import_failures,
    )
