"""KV-cache plans for inputs the tests control: the oracle of ``tests/bridges/test_kv_cache_configs.py``.

    VLLM_COMPAT_DISABLE=1 python -m tests.support.kv_cache_plans [OUT.json]

run on vLLM 0.32.0 (the last vLLM with ``vllm.v1.core.kv_cache_utils.get_kv_cache_configs`` of its own) writes what
that function returns for each input of ``SCENARIOS`` (``RECORD`` by default): every compared field of the returned
``KVCacheConfig`` list, by name, and ``max_model_len`` afterwards (auto-fit writes it), or the error raised. The inputs
are built as vllm-omni 0.30.0 builds its paged diffusion KV planning (``build_native_kv_cache_configs``): a bare
``VllmConfig`` on CPU whose ``model_config`` is a diffusion stand-in with only ``max_model_len`` /
``original_max_model_len`` (like vllm-omni's ``_DiffusionVllmModelConfig``, no ``supports_kv_cache_grouping``), the
layout pinned, the specs registered; nothing needs a model, a device or vllm-omni.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from pathlib import Path

RECORD = Path(__file__).resolve().parents[1] / "bridges" / "kv_cache_configs.vllm-0.32.0.json"
UTILS = "vllm.v1.core.kv_cache_utils"
NAME = "get_kv_cache_configs"
MiB = 1 << 20
SCENARIOS = ("one_worker", "two_ranks_min_blocks", "pipeline_stages", "hybrid", "auto_fit", "blocks_override",
             "attention_free", "too_little_memory")


@dataclasses.dataclass
class DiffusionModelConfig:
    """What vllm-omni 0.30.0's ``_DiffusionVllmModelConfig`` gives the planner (max_model_len, and the -1 sentinel
    for auto-fit), and like it no ``supports_kv_cache_grouping``: not a vLLM ``ModelConfig``."""

    max_model_len: int
    original_max_model_len: int


def scenario(name: str):
    """(vllm_config, kv_cache_specs, available_memory) of one named input (``SCENARIOS``)."""
    import torch
    from vllm.config import DeviceConfig, VllmConfig
    from vllm.v1.core import single_type_kv_cache_manager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    sliding = SlidingWindowSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16, sliding_window=128)
    four = {f"l{i}": full for i in range(4)}
    max_len, original, options, specs, memory = {
        "one_worker": (4096, 4096, {}, [four], [10 * MiB]),
        "two_ranks_min_blocks": (4096, 4096, {}, [four, dict(four)], [12 * MiB, 9 * MiB]),  # ranks -> the smaller
        "pipeline_stages": (4096, 4096, {}, [{"l0": full, "l1": full}, {"l2": full, "l3": full}], [6 * MiB, 9 * MiB]),
        "hybrid": (2048, 2048, {"hybrid": True}, [{"f0": full, "f1": full, "s0": sliding, "s1": sliding}],
                   [16 * MiB]),
        "auto_fit": (1 << 20, -1, {}, [four], [3 * MiB]),  # max_model_len=-1: fitted to the memory
        "blocks_override": (4096, 4096, {"override": 300}, [four], [10 * MiB]),
        "attention_free": (4096, 4096, {}, [{}], [0]),
        "too_little_memory": (1 << 16, 1 << 16, {}, [four], [1 * MiB]),  # raises
    }[name]
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    config.model_config = DiffusionModelConfig(max_len, original)
    config.cache_config.kv_cache_layout = "LBNHC"  # vllm-omni pins its diffusion layout before planning
    if options.get("hybrid"):
        config.scheduler_config.disable_hybrid_kv_cache_manager = False
    if "override" in options:
        config.cache_config.num_gpu_blocks_override = options["override"]
    single_type_kv_cache_manager.register_all_kvcache_specs(config)
    return config, specs, memory


def canonical(obj):
    """Every compared field of vLLM's dataclasses, by name (with ``__class__``; enums by name, dtypes as text)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__class__": type(obj).__name__,
                **{f.name: canonical(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.compare}}
    if isinstance(obj, enum.Enum):
        return obj.name
    if isinstance(obj, (list, tuple)):
        return [canonical(x) for x in obj]
    if isinstance(obj, dict):
        return {k: canonical(v) for k, v in obj.items()}
    if type(obj).__module__ == "torch":
        return str(obj)
    return obj


def outcome(function, name: str) -> dict:
    """What ``function(vllm_config, kv_cache_specs, available_memory)`` returns for the named input (the configs,
    and max_model_len after), or the error it raises."""
    config, specs, memory = scenario(name)
    try:
        configs = function(config, specs, memory)
    except Exception as exc:  # noqa: BLE001 - the error is part of the result
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {"configs": canonical(configs), "max_model_len": config.model_config.max_model_len}


def field_names(tree, found: set | None = None) -> set:
    """(class, field) of every dict in a canonical tree: which fields a vLLM's classes have."""
    found = set() if found is None else found
    if isinstance(tree, dict):
        for key, value in tree.items():
            found.add((tree.get("__class__"), key))
            field_names(value, found)
    elif isinstance(tree, list):
        for value in tree:
            field_names(value, found)
    return found


def shared(a, b):
    """``a`` cut to the fields ``b`` has too (recursively)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: shared(v, b[k]) for k, v in a.items() if k in b}
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [shared(x, y) for x, y in zip(a, b, strict=True)]
    return a


def has_block_layout() -> bool:
    """vLLM 0.29+ lays KV tensors out by layer and block stride (``KVCacheTensor.layers``); <= 0.28 had one tensor
    per layer (``shared_by``), a different plan for the same inputs."""
    from vllm.v1.kv_cache_interface import KVCacheTensor

    return "layers" in {f.name for f in dataclasses.fields(KVCacheTensor)}


def main(argv: list[str]) -> None:
    import importlib

    from vllm_compat.bridges import is_ours
    from vllm_compat.detect.versions import installed_version

    out = Path(argv[0]) if argv else RECORD
    own = vars(importlib.import_module(UTILS)).get(NAME)
    if own is None or is_ours(own):
        raise SystemExit(f"this vLLM ({installed_version('vllm')}) has no {UTILS}.{NAME} of its own to record")
    results = {name: outcome(own, name) for name in SCENARIOS}
    out.write_text(json.dumps({"vllm": installed_version("vllm"), "results": results}, indent=1, sort_keys=True)
                   + "\n")
    print(f"wrote {out}: {len(results)} inputs, vLLM {installed_version('vllm')}")


if __name__ == "__main__":
    main(sys.argv[1:])
