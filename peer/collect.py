"""Copy a vllm-omni release's own CPU tests, byte for byte, out of an upstream git tree (maintainer tool).

    python peer/collect.py GIT_DIR COMMIT RELEASE [WHEEL]

GIT_DIR is a clone of vllm-omni (or a fork carrying its history) holding COMMIT. Writes
peer/vllm-omni-RELEASE/: the selected test files, every conftest / __init__ / helper module they reach
(``tests.*`` imports and ``pytest_plugins``, followed transitively), the upstream pyproject.toml (its pytest
settings: asyncio mode, markers) and PROVENANCE.toml (commit, and per file its path and git blob id, so
tests/test_peer.py proves the copies unedited). Nothing is edited; nothing is run.

Releases are not tagged in the clones at hand, so COMMIT is found by comparing trees with the release's wheel.
WHEEL (the release's wheel file) records that evidence in PROVENANCE.toml: how many of the wheel's ``vllm_omni/``
.py files the commit holds byte for byte, and which differ or are on one side only (``_version.py`` is written at
build time, so it is always only in the wheel). Where the commit is not the release's, the stored tests are that
commit's, not the release's, and the lists say how far apart the two are.

The selection (SUITES below) is the CPU part of vllm-omni's own suite: the core (schedulers, engine and
orchestrator, model-runner helpers, connectors, metrics, config, inputs) and the server (entrypoints), without the
files that need a GPU (``hardware_test``) or model weights.
"""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path, PurePosixPath

HERE = Path(__file__).parent
SUITES = {
    "core": ("tests/ar_diffusion", "tests/config", "tests/core", "tests/distributed", "tests/engine",
             "tests/inputs", "tests/metrics", "tests/worker", "tests/test_*.py"),
    "server": ("tests/entrypoints",),
}
# Markers of files that need hardware or weights: never collected into the peer suite.
EXCLUDING_TEXT = ("hardware_test(", "snapshot_download(", ".from_pretrained(")


def _git(git_dir: str, *args: str) -> bytes:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True).stdout


def _tree(git_dir: str, commit: str, folder: str = "tests") -> dict[str, str]:
    """path -> blob id of every file under the folder at the commit."""
    out = _git(git_dir, "ls-tree", "-r", commit, folder).decode()
    return {line.split("\t", 1)[1]: line.split()[2] for line in out.splitlines() if line.split()[1] == "blob"}


def _selected(tree: dict[str, str], patterns: tuple[str, ...], read) -> list[str]:
    chosen = []
    for path in tree:
        pure = PurePosixPath(path)
        if not (pure.name.startswith("test_") and pure.suffix == ".py"):
            continue
        # a glob names files of its own folder only ("tests/test_*.py": not tests/helpers/tests/test_x.py)
        if not any(pure.match(p) and len(pure.parts) == len(PurePosixPath(p).parts) if "*" in p
                   else path.startswith(p + "/") for p in patterns):
            continue
        if any(marker in read(path) for marker in EXCLUDING_TEXT):
            continue
        chosen.append(path)
    return sorted(chosen)


def _tests_imports(source: str) -> set[str]:
    """The ``tests.*`` modules a file imports or names in pytest_plugins."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "tests":
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.split(".")[0] == "tests")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("tests."):
            names.add(node.value)
    return names


def _closure(tree: dict[str, str], roots: list[str], read) -> list[str]:
    """The roots plus every conftest / __init__ above them and every tests.* module they reach."""
    wanted, todo = set(), list(roots)
    while todo:
        path = todo.pop()
        if path in wanted or path not in tree:
            continue
        wanted.add(path)
        parts = PurePosixPath(path).parts
        for depth in range(1, len(parts)):
            folder = "/".join(parts[:depth])
            todo += [f"{folder}/conftest.py", f"{folder}/__init__.py"]
        for module in _tests_imports(read(path)):
            stem = module.replace(".", "/")
            todo += [f"{stem}.py", f"{stem}/__init__.py"]
    return sorted(wanted)


def _toml_paths(paths: list[str]) -> str:
    """A TOML array of the paths, one a line (these lists run to hundreds)."""
    return "[" + "".join(f"\n  {json.dumps(p)}," for p in paths) + ("\n]" if paths else "]")


def wheel_closeness(git_dir: str, commit: str, wheel: str) -> list[str]:
    """TOML lines saying how close the commit's ``vllm_omni/`` is to the wheel's: its .py files compared by git
    blob id, which is what ties the stored tests to the code users install."""
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = {name: git_blob_id(archive.read(name)) for name in archive.namelist()
                    if name.startswith("vllm_omni/") and name.endswith(".py")}
    in_tree = {path: blob for path, blob in _tree(git_dir, commit, "vllm_omni").items() if path.endswith(".py")}
    shared = in_wheel.keys() & in_tree.keys()
    return [f"# the commit's vllm_omni/ against {Path(wheel).name}'s: .py files, by git blob id",
            f"wheel_files = {len(in_wheel)}",
            f"identical = {sum(in_wheel[path] == in_tree[path] for path in shared)}",
            f"differing = {_toml_paths(sorted(p for p in shared if in_wheel[p] != in_tree[p]))}",
            f"only_in_wheel = {_toml_paths(sorted(in_wheel.keys() - in_tree.keys()))}",
            f"only_in_tree = {_toml_paths(sorted(in_tree.keys() - in_wheel.keys()))}"]


def collect(git_dir: str, commit: str, release: str, wheel: str | None = None) -> Path:
    tree = _tree(git_dir, commit)
    cache: dict[str, str] = {}

    def read(path: str) -> str:
        if path not in cache:
            cache[path] = _git(git_dir, "cat-file", "blob", tree[path]).decode()
        return cache[path]

    out = HERE / f"vllm-omni-{release}"
    lines = [f'# vllm-omni {release}\'s own tests, copied unchanged by peer/collect.py (Apache-2.0, vllm-project/vllm-omni)',
             f'release = "{release}"', f'commit = "{commit}"']
    lines += [*(wheel_closeness(git_dir, commit, wheel) if wheel else []), ""]
    for suite, patterns in SUITES.items():
        lines.append(f"{suite} = {json.dumps(_selected(tree, patterns, read))}")
    files = _closure(tree, [p for s in SUITES.values() for p in _selected(tree, s, read)], read)
    pyproject_blob = _git(git_dir, "rev-parse", f"{commit}:pyproject.toml").decode().strip()
    lines += ["", "[blobs]  # path = git blob id at the commit"]
    for path, blob in [("pyproject.toml", pyproject_blob), *((p, tree[p]) for p in files)]:
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_git(git_dir, "cat-file", "blob", blob))
        lines.append(f'"{path}" = "{blob}"')
    (out / "PROVENANCE.toml").write_text("\n".join(lines) + "\n")
    return out


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


if __name__ == "__main__":
    print(collect(*sys.argv[1:5]))
