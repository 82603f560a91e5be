"""The import-based way to learn what ``vllm-compat doctor`` reports statically (section 2's baseline).

Imports vLLM's ``base_config`` and ``layerwise`` modules and vllm-omni's diffusion loader (and, as runtime
detection does, vllm-omni's quantization modules) and reads the same facts from the live objects. Deliberately
does not import vllm_compat (its hook would add work). Prints the facts as JSON.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pkgutil
from importlib import metadata


def version(dist):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


facts = {"vllm": version("vllm"), "vllm_omni": version("vllm-omni"), "torch": version("torch")}
base_config = importlib.import_module("vllm.model_executor.layers.quantization.base_config")
layerwise = importlib.import_module("vllm.model_executor.model_loader.reload.layerwise")
finalize = getattr(layerwise, "finalize_layerwise_processing", None)
facts["has_uses_meta_device"] = hasattr(base_config.QuantizeMethodBase, "uses_meta_device")
facts["has_layerwise_finalize"] = finalize is not None
facts["finalize_params"] = [p.name for p in inspect.signature(finalize).parameters.values()] if finalize else []
facts["has_initialize_online_processing"] = hasattr(layerwise, "initialize_online_processing")

loader = importlib.import_module("vllm_omni.diffusion.model_loader.diffusers_loader")
source = inspect.getsource(vars(loader.DiffusersPipelineLoader)["_process_weights_after_loading"])
facts["loader_kind"] = ("gated" if "has_online_quant" in source
                        else "ungated" if "finalize_layerwise_processing" in source
                        else "legacy" if "module.to(" in source else "unknown")
package = importlib.import_module("vllm_omni.quantization")
found = []
for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
    if info.ispkg:
        continue
    name = f"vllm_omni.quantization.{info.name}"
    try:
        module = importlib.import_module(name)
    except Exception:  # noqa: BLE001
        continue
    found += [f"{name}:{attr}" for attr, value in vars(module).items()
              if isinstance(value, type) and value.__module__ == name and vars(value).get("uses_meta_device") is True]
facts["meta_device_methods"] = sorted(found)
print(json.dumps(facts))
