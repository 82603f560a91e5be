"""Helpers shared by the fault suite: the in-tree reference method, fake temp packages, isolated interpreters.

Nothing here fakes vLLM or vllm-omni. The reference is the real vllm-omni 0.30.0 method, compiled from the
installed wheel's own source file (or, where the installed vllm-omni is not gated, from the file named by
``VLLM_COMPAT_REFERENCE_LOADER``); fake packages are built only for shapes no release has.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:  # `tests.support` is imported as a package from the repository root
    sys.path.insert(0, str(REPO_ROOT))

LOADER_MODULE = "vllm_omni.diffusion.model_loader.diffusers_loader"
LOADER_FILE = "vllm_omni/diffusion/model_loader/diffusers_loader.py"
REFERENCE_VAR = "VLLM_COMPAT_REFERENCE_LOADER"


def _installed_loader_file() -> Path | None:
    from vllm_compat.detect.static import installed_package_root

    root = installed_package_root("vllm_omni")
    path = root / LOADER_FILE if root is not None else None
    return path if path is not None and path.is_file() else None


def reference_source(kind: str = "gated") -> tuple[str, str] | tuple[None, str]:
    """``(source of the in-tree method of shape ``kind``, where it came from)``, or ``(None, why not)``."""
    from vllm_compat.patches.diffusers_loader.facts import classify_loader_source

    candidates = []
    installed = _installed_loader_file()
    if installed is not None:
        candidates.append(installed)
    if os.environ.get(REFERENCE_VAR):
        candidates.append(Path(os.environ[REFERENCE_VAR]))
    for path in candidates:
        text = path.read_text(encoding="utf-8")
        shape = classify_loader_source(text, "DiffusersPipelineLoader", "_process_weights_after_loading")
        if shape.kind != kind:
            continue
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "DiffusersPipelineLoader":
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "_process_weights_after_loading":
                        return textwrap.dedent(ast.get_source_segment(text, item, padded=True)), str(path)
    return None, (
        f"no {kind} loader source: installed loader file {installed}; set {REFERENCE_VAR} to "
        f"a vllm-omni 0.30.0 {LOADER_FILE} to compare against it"
    )


def compile_reference(source: str):
    """The real method's code as a plain function ``fn(loader, model, target_device)``; its module-level
    names (torch, nn, QuantizeMethodBase) bound to the installed ones, exactly as the module binds them."""
    import torch
    from torch import nn
    from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

    namespace = {"torch": torch, "nn": nn, "QuantizeMethodBase": QuantizeMethodBase, "__name__": "reference"}
    exec(compile(source, "<vllm-omni _process_weights_after_loading>", "exec"), namespace)
    return namespace["_process_weights_after_loading"]


def write_package(root: Path, files: dict[str, str]) -> Path:
    """Write ``{relative path: source}`` under ``root`` (parents created); returns ``root``."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text), encoding="utf-8")
    return root


def site_packages() -> Path:
    import sysconfig

    return Path(sysconfig.get_paths()["purelib"])


def isolated_site(dest: Path, exclude: tuple[str, ...] = (), exclude_dist: tuple[str, ...] = ()) -> Path:
    """A directory of symlinks to every entry of this env's site-packages except the top-level packages in
    ``exclude`` and their ``*.dist-info`` (so they are neither importable nor "installed"), and except the
    ``*.dist-info`` only of ``exclude_dist`` (importable, but without distribution metadata)."""
    dest.mkdir(parents=True, exist_ok=True)
    normalized = tuple(name.replace("-", "_").lower() for name in exclude)
    dist_only = tuple(name.replace("-", "_").lower() for name in exclude_dist)
    for entry in site_packages().iterdir():
        stem = entry.name.lower()
        if stem.endswith(".pth"):
            continue  # -S never reads them; the repository root goes on PYTHONPATH instead
        top = stem.split("-", 1)[0] if stem.endswith((".dist-info", ".egg-info")) else stem.removesuffix(".py")
        if top in normalized or (top in dist_only and stem.endswith((".dist-info", ".egg-info"))):
            continue
        (dest / entry.name).symlink_to(entry)
    return dest


def run_isolated(code: str, site: Path, extra_paths=(), env: dict | None = None, args=(), timeout: float = 600):
    """Run ``code`` under ``python -S`` with only ``extra_paths``, the repository root and ``site`` on the
    path: what a machine without the excluded packages sees."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_COMPAT_", "PYTHONPATH"))}
    full_env["PYTHONPATH"] = os.pathsep.join([*map(str, extra_paths), str(REPO_ROOT), str(site)])
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-S", "-c", textwrap.dedent(code), *args], capture_output=True,
                          text=True, env=full_env, timeout=timeout)


def result_of(completed: subprocess.CompletedProcess) -> dict:
    """The JSON a subprocess printed after ``RESULT``; fails with its stderr when there is none."""
    assert "RESULT" in completed.stdout, (
        f"rc={completed.returncode}\nstdout:\n{completed.stdout[-3000:]}\nstderr:\n{completed.stderr[-5000:]}"
    )
    return json.loads(completed.stdout.rsplit("RESULT", 1)[1])
