"""Test sessions over real vLLM / vllm-omni releases, built from matrix/vllm.toml.

    nox -s tests          the default cells (CI)
    nox -s matrix         every cell
    nox -s lint           ruff

Torch: vLLM wheels pin an exact CUDA torch. On a CPU machine we override it with the CPU build named by
VLLM_COMPAT_TORCH (default "2.13.0", looked up in VLLM_COMPAT_FIND_LINKS, default /opt/wheels when it exists).
Set VLLM_COMPAT_TORCH=pinned on a GPU machine to keep vLLM's own pin.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
CELLS = tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]
DEFAULT_CELLS = [c for c in CELLS if c.get("default")]
# PyPI's torchvision/torchaudio/torchcodec fail to import beside a CPU torch override; transformers and
# diffusers work without them.
BROKEN_BESIDE_CPU_TORCH = ["torchvision", "torchaudio", "torchcodec"]


def _torch_override_args(session: nox.Session) -> list[str]:
    torch = os.environ.get("VLLM_COMPAT_TORCH", "2.13.0")
    if torch == "pinned":
        return []
    overrides = Path(session.create_tmp()) / "torch-override.txt"
    overrides.write_text(f"torch=={torch}\n")
    args = ["--override", str(overrides), "--index-strategy", "unsafe-best-match"]
    find_links = os.environ.get("VLLM_COMPAT_FIND_LINKS", "/opt/wheels")
    if Path(find_links).exists():
        args += ["--find-links", find_links]
    return args


def _install_cell(session: nox.Session, cell: dict) -> None:
    packages = [f"vllm=={cell['vllm']}"]
    if cell.get("vllm_omni"):
        packages.append(f"vllm-omni=={cell['vllm_omni']}")
    session.install(*packages, "-e", ".[test]", *_torch_override_args(session))
    if os.environ.get("VLLM_COMPAT_TORCH", "2.13.0") != "pinned":
        session.run("uv", "pip", "uninstall", "--python", session.virtualenv.location, *BROKEN_BESIDE_CPU_TORCH,
                    silent=True)


def _run_cell(session: nox.Session, cell: dict) -> None:
    """Install the cell, print the doctor, run the whole suite with the cell's expectations."""
    _install_cell(session, cell)
    expect = cell.get("expect", {})
    env = {f"VLLM_COMPAT_EXPECT_{key.upper()}": value for key, value in expect.items()}
    env["VLLM_COMPAT_CELL"] = cell["id"]
    session.run("python", "-m", "vllm_compat", "doctor", env=env, success_codes=[0, 1])
    session.run("pytest", "--strict-markers", *session.posargs, env=env)


@nox.session(name="tests")
@nox.parametrize("cell", DEFAULT_CELLS, ids=[c["id"] for c in DEFAULT_CELLS])
def tests(session: nox.Session, cell: dict) -> None:
    """Full test suite on the default matrix cells (the ones CI runs)."""
    _run_cell(session, cell)


@nox.session(name="matrix")
@nox.parametrize("cell", CELLS, ids=[c["id"] for c in CELLS])
def matrix(session: nox.Session, cell: dict) -> None:
    """Full test suite on every matrix cell."""
    _run_cell(session, cell)


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff over the package, tests and this file."""
    session.run("uvx", "ruff", "check", "vllm_compat", "tests", "noxfile.py")
