"""gpu/prepare_serve.sh's packing, on CPU: the pyTAG part keeps the compiled files of the set's own dependencies, and
they import from the unpacked part (2026-12-06 they did not: gpu/results/serve_r6/README.md, fault 1); its uv installs
copy files out of uv's cache rather than hard-link them (fault 2).

Two tests, both through the script's own `pack_py` (``source gpu/prepare_serve.sh`` defines it and returns):
- ``test_pack_py_keeps_the_deps_compiled_files``: the pins of gpu/deps-serve-v0.26.0.txt installed for this
  interpreter by uv through the script's environment, packed beside a vLLM tree cut from the installed vLLM (its
  dist-info, ``__init__.py`` and its smallest kernel), unpacked, imported. The single tar run of before runs first, on
  the same inputs, and its part fails the import as the device did. About 13 s with uv's cache warm; skipped without uv,
  without an installed vLLM, or when uv cannot fetch the pins (no network, nothing cached).
- ``test_built_part_imports_its_compiled_dependencies``: the parts gpu/prepare_serve.sh built last
  (gpu/.serve-build/parts/py026.tar.xz and deps.tar.xz) unpacked in the device's order and their compiled dependencies
  imported by a CPython 3.12 (the device's; the parts are cp312). About 22 s (xz -d of the deps part); skipped with
  its reason when the parts or a python3.12 are absent (set ``SERVE_PY312`` to its path).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREPARE = ROOT / "gpu" / "prepare_serve.sh"
BUILD = ROOT / "gpu" / ".serve-build"
DEPS_026 = ROOT / "gpu" / "deps-serve-v0.26.0.txt"


def _bash(script: str, **env: str) -> subprocess.CompletedProcess:
    """``script`` in bash after ``source gpu/prepare_serve.sh`` (its functions and exports, nothing built)."""
    return subprocess.run(["bash", "-c", f'source "{PREPARE}" && {script}'], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)


def _compiled_packages(tree: Path) -> dict[str, list[str]]:
    """{top-level package of ``tree``: its .so files, relative to ``tree``}, for the packages that have any."""
    out: dict[str, list[str]] = {}
    for so in sorted(tree.rglob("*.so")):
        rel = so.relative_to(tree)
        if rel.parts[0] != "bin" and not rel.parts[0].endswith(".dist-info"):
            out.setdefault(rel.parts[0], []).append(str(rel))
    return out


def _import_from(python: str, path: list[Path], packages: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """Imports ``packages`` and every compiled module of theirs under ``python`` with PYTHONPATH = ``path`` (in the
    order given, as gpu/device_env_serve.sh's serve_env); prints each package's file."""
    code = ("import importlib, sys\n"
            f"for name in {packages!r}:\n"
            "    m = importlib.import_module(name)\n"
            "    print(name, m.__file__)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(map(str, path))
    return subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=300)


def _extension_modules(tree: Path, packages: list[str]) -> list[str]:
    """The importable extension modules (``nvtx._lib.lib``) of ``packages`` in ``tree``; shared libraries that are no
    module (tvm_ffi/lib/libtvm_ffi.so, loaded by the package itself) are left to the package's import."""
    mods = []
    for pkg in packages:
        for so in sorted((tree / pkg).rglob("*.so")):
            name = so.name.split(".")[0]
            if so.parent.name == "lib" and name.startswith("lib"):
                continue
            mods.append(".".join(so.relative_to(tree).parent.parts + (name,)))
    return mods


def _installed_vllm() -> tuple[Path, str]:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs vLLM installed (a cell env): the vLLM half of the part is cut from it")
    from importlib.metadata import version

    return Path(next(iter(spec.submodule_search_locations))), version("vllm")


def test_pack_py_keeps_the_deps_compiled_files(tmp_path):
    if shutil.which("uv") is None:
        pytest.skip("needs uv on PATH (prepare_serve.sh's installer)")
    vllm_dir, ver = _installed_vllm()
    # The vLLM half: the installed vLLM's dist-info, __init__.py and smallest kernel (hard-linked, not copied).
    vtree = tmp_path / "v"
    (vtree / "vllm").mkdir(parents=True)
    shutil.copy2(vllm_dir / "__init__.py", vtree / "vllm" / "__init__.py")
    kernel = min(vllm_dir.glob("*.so"), key=lambda p: p.stat().st_size)
    os.link(kernel, vtree / "vllm" / kernel.name)
    shutil.copytree(vllm_dir.parent / f"vllm-{ver}.dist-info", vtree / f"vllm-{ver}.dist-info")
    # The set's own dependencies, as prepare_serve.sh installs them (its exported UV_LINK_MODE), for this interpreter.
    deps = tmp_path / "deps026"
    # The script exports it whatever the caller's environment says.
    assert _bash('echo "$UV_LINK_MODE"', UV_LINK_MODE="hardlink").stdout.strip() == "copy"
    done = _bash(f'uv pip install -q --no-deps --no-compile --python "{sys.executable}" --target "{deps}" '
                 f'-r "{DEPS_026}"', UV_LINK_MODE="hardlink")
    if done.returncode != 0:
        pytest.skip(f"uv could not install {DEPS_026.name}'s pins for this interpreter: {done.stderr.strip()[-300:]}")
    compiled = _compiled_packages(deps)
    assert "tvm_ffi" in compiled, compiled  # apache-tvm-ffi, the dependency the device missed
    # Fault 2: every installed file is the install's own, not a hard link into uv's cache.
    assert [f for f in deps.rglob("*") if f.is_file() and f.stat().st_nlink > 1] == []

    def unpack(tar: Path, name: str) -> Path:
        out = tmp_path / name
        out.mkdir()
        with tarfile.open(tar) as tf:
            tf.extractall(out, filter="tar") if hasattr(tarfile, "data_filter") else tf.extractall(out)
        return out

    packages = sorted(compiled)
    modules = packages + _extension_modules(deps, packages)
    empty_deps = tmp_path / "deps"  # the common deps part after it on PYTHONPATH, as on the device
    empty_deps.mkdir()
    # Before: one tar run with the vLLM tree's excludes, which GNU tar applies to the deps half too.
    old = tmp_path / "old.tar"
    subprocess.run(["bash", "-c", 'source "$1" && tar -cf "$2" "${PURE[@]}" -C "$3" vllm "vllm-$4.dist-info" '
                    '-C "$5" --exclude=./bin .', "bash", str(PREPARE), str(old), str(vtree), ver, str(deps)], check=True)
    old_py = unpack(old, "py_old")
    assert _compiled_packages(old_py) == {}
    before = _import_from(sys.executable, [old_py, empty_deps], ["tvm_ffi"], tmp_path)
    assert before.returncode != 0 and "libtvm_ffi.so" in before.stderr, (before.stdout, before.stderr[-2000:])
    # After: pack_py.
    new = tmp_path / "py026.tar"
    done = _bash(f'pack_py "{vtree}" "{ver}" "{deps}" "{new}"')
    assert done.returncode == 0, done.stderr
    py = unpack(new, "py026")
    assert _compiled_packages(py) == compiled  # every .so of the deps, none of the vLLM tree's
    assert not list((py / "vllm").rglob("*.so")) and (py / "vllm" / "__init__.py").is_file()
    assert (py / f"vllm-{ver}.dist-info" / "METADATA").is_file() and not (py / "bin").exists()
    after = _import_from(sys.executable, [py, empty_deps], modules, tmp_path)
    assert after.returncode == 0, after.stderr[-3000:]
    assert all(line.split()[1].startswith(str(py)) for line in after.stdout.splitlines()), after.stdout


def _python312() -> str | None:
    """A CPython 3.12 that runs: ``SERVE_PY312``, else python3.12 on PATH or pyenv's (a pyenv shim may be on PATH
    without a 3.12 selected: it is asked, not trusted)."""
    cands = [os.environ.get("SERVE_PY312"), shutil.which("python3.12"),
             *map(str, sorted((Path.home() / ".pyenv" / "versions").glob("3.12*/bin/python3.12")))]
    for cand in filter(None, cands):
        try:
            done = subprocess.run([cand, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
                                  capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if done.stdout.strip() == "True":
            return cand
    return None


@pytest.mark.skipif(not (BUILD / "parts" / "py026.tar.xz").is_file() or not (BUILD / "parts" / "deps.tar.xz").is_file(),
                    reason="needs the parts of `SERVE_SETS=026 bash gpu/prepare_serve.sh` (gpu/.serve-build/parts/"
                           "py026.tar.xz and deps.tar.xz; ~2 min with uv's cache warm)")
@pytest.mark.skipif(_python312() is None, reason="needs a CPython 3.12 (the device's; the parts are cp312): set "
                                                 "SERVE_PY312 to its path")
def test_built_part_imports_its_compiled_dependencies(tmp_path):
    """py026 and deps unpacked as gpu/device_env_serve.sh does, PYTHONPATH in serve_env's order (py026 first); the
    packages of gpu/.serve-build/deps026 (the set's own dependencies, as installed) that carry compiled files import
    from py026, each compiled module too. torch and the image's other packages are not here: typing_extensions (which
    tvm_ffi imports) stands in for them, copied from this interpreter."""
    parts = BUILD / "parts"
    out = {}
    for part in ("py026", "deps"):
        out[part] = tmp_path / part
        out[part].mkdir()
        subprocess.run(f'xz -d -T0 < "{parts / part}.tar.xz" | tar -C "{out[part]}" -xf -', shell=True, check=True)
    installed = BUILD / "deps026"
    compiled = _compiled_packages(installed)
    assert "tvm_ffi" in compiled, compiled
    assert _compiled_packages(out["py026"]) == compiled
    image = tmp_path / "image"
    image.mkdir()
    import typing_extensions

    shutil.copy2(typing_extensions.__file__, image)
    packages = sorted(compiled)
    done = _import_from(_python312(), [out["py026"], out["deps"], image], packages + _extension_modules(
        out["py026"], packages), tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert all(line.split()[1].startswith(str(out["py026"])) for line in done.stdout.splitlines()), done.stdout
