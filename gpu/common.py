"""Shared pieces of the GPU checks: models on a device, the loader methods under test, error capture.

The quant method is the CPU tests' online FP8 double (``tests/support/online_quant.py``): it quantizes with
torch's ``float8_e4m3fn`` on whatever device the weight lives on, so built under ``torch.device("cuda")`` it
quantizes on the GPU, and vLLM's real layerwise machinery (``initialize_online_processing``,
``finalize_layerwise_processing``) materializes the straggler layers there.
"""

from __future__ import annotations

import ast
import builtins
import dis
import hashlib
import os
import traceback
import types
from collections.abc import Sequence
from pathlib import Path

import torch

from tests.support import online_quant as oq

METHOD = "_process_weights_after_loading"
LOADER_MODULE = "vllm_omni.diffusion.model_loader.diffusers_loader"


def checkpoint_on(model: torch.nn.Module, device, seed: int = 1) -> dict[str, torch.Tensor]:
    """A full checkpoint for a freshly built ``model`` (names as ``oq.make_checkpoint``), drawn on ``device``
    so a ~1.4 B-parameter checkpoint takes a fraction of a second instead of a minute of CPU ``randn``."""
    gen = torch.Generator(device=device).manual_seed(seed)
    return {
        name: torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(model.dtype)
        for name, (_, _, shape) in oq._checkpoint_names(model).items()
    }


def build_loaded(
    n_layers: int,
    hidden: int,
    *,
    online: bool,
    stragglers: Sequence[oq.Straggler] = (),
    device="cuda",
    checkpoint: dict | None = None,
):
    """Build the DiT double with its params created on ``device`` (meta for online weights) and feed it
    ``checkpoint`` (drawn on ``device`` when None) through the vLLM-style loader. Returns (model, checkpoint)."""
    with torch.device(device):
        model = oq.build_model(n_layers, hidden, online=online, stragglers=stragglers)
    if checkpoint is None:
        checkpoint = checkpoint_on(model, device)
    oq.load_checkpoint(model, checkpoint)
    return model, checkpoint


def loader_class():
    import importlib

    return importlib.import_module(LOADER_MODULE).DiffusersPipelineLoader


def original_method(cls):
    """The class's own, unpatched ``_process_weights_after_loading`` (unwrapping ours if installed)."""
    fn = vars(cls)[METHOD]
    return fn.__wrapped__ if getattr(fn, "_vllm_compat_installed", False) else fn


def method_from_source(path: str | os.PathLike, class_name: str = "DiffusersPipelineLoader"):
    """Compile ``class_name._process_weights_after_loading`` out of a vllm-omni ``diffusers_loader.py`` file.

    Used to run vllm-omni 0.24.0's exact method text in a process that imports vllm-omni 0.30.0 (one
    ``vllm_omni`` per process). The method's globals are the names it uses (``torch``, ``nn``,
    ``QuantizeMethodBase`` from the installed vLLM); an unknown name fails here, not mid-run.
    Returns (function, sha256 of the method's source text).
    """
    from torch import nn
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    source = Path(path).read_text()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == METHOD)
    text = ast.get_source_segment(source, fn)
    namespace = {"torch": torch, "nn": nn, "QuantizeMethodBase": QuantizeMethodBase}
    module = ast.Module(body=[fn], type_ignores=[])
    exec(compile(module, str(path), "exec"), namespace)
    func = namespace[METHOD]
    missing = sorted(_global_names(func.__code__) - set(namespace) - set(dir(builtins)))
    if missing:
        raise RuntimeError(f"{path}: {METHOD} uses globals {missing} this harness does not supply")
    return func, hashlib.sha256(text.encode()).hexdigest()[:16]


def _global_names(code: types.CodeType) -> set[str]:
    names = {ins.argval for ins in dis.get_instructions(code) if ins.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def bare_loader(cls):
    """A loader instance without ``__init__`` (which wants a full vLLM load config); the methods under test
    read only static helpers from ``self``."""
    return object.__new__(cls)


def capture(fn, *args, **kwargs) -> dict:
    """Run ``fn``; return {"ok": bool, "error": "Type: message" | None, "where": last frame | None}."""
    try:
        fn(*args, **kwargs)
        return {"ok": True, "error": None, "where": None}
    except Exception as exc:  # noqa: BLE001 - reported
        tb = traceback.extract_tb(exc.__traceback__)
        where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else None
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:400], "where": where}


def versions() -> dict:
    import importlib.metadata as md

    out = {"torch": torch.__version__, "cuda": torch.version.cuda}
    for dist in ("vllm", "vllm-omni"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = None
    if torch.cuda.is_available():
        out["gpu"] = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    return out
