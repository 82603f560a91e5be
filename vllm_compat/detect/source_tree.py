"""A read-only view of the files of installed or unpacked packages, or of a wheel, found without importing them.

Every static detection (``static``, ``import_drift``, ``definitions``, ``check``) reads vLLM's and vllm-omni's
files through a ``SourceTree``; nothing here imports vllm, vllm_omni or torch.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# A root no tree has: the tree of a package that is not installed, which answers "absent" to every question.
NOWHERE = Path("/nonexistent-vllm-compat-root")


class SourceTree:
    """Read-only view of files under a root that holds top-level packages: a site-packages directory, an
    unpacked tree, or a wheel (zip). Paths are POSIX, relative to that root."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self._zip = None
        if self.root.is_file():
            import zipfile  # wheels only (check, scan): doctor's installed trees are directories

            self._zip = zipfile.ZipFile(self.root)

    @property
    def is_zip(self) -> bool:
        return self._zip is not None

    def read(self, relpath: str) -> str | None:
        try:
            if self._zip is not None:
                return self._zip.read(relpath).decode("utf-8")
            return (self.root / relpath).read_text(encoding="utf-8")
        except (KeyError, OSError, UnicodeDecodeError):
            return None

    def namelist(self) -> list[str]:
        """Every file path of a wheel; empty for a directory (walk it instead)."""
        return self._zip.namelist() if self._zip is not None else []

    def list_dir(self, reldir: str) -> list[str]:
        if self._zip is not None:
            return sorted(n for n in self._zip.namelist() if n.startswith(reldir) and "/" not in n[len(reldir):])
        base = self.root / reldir
        return sorted(f"{reldir}{p.name}" for p in base.iterdir()) if base.is_dir() else []

    def walk_py(self, package: str) -> list[str]:
        """Relative paths of every ``.py`` file of ``package`` in this tree, sorted."""
        if self._zip is not None:
            return sorted(n for n in self._zip.namelist() if n.startswith(f"{package}/") and n.endswith(".py"))
        found = []
        for dirpath, dirnames, filenames in os.walk(self.root / package):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            rel = os.path.relpath(dirpath, self.root).replace(os.sep, "/")
            found.extend(f"{rel}/{f}" for f in filenames if f.endswith(".py"))
        return sorted(found)

    def has_package(self, name: str) -> bool:
        return self.read(f"{name}/__init__.py") is not None

    def distribution_version(self, distribution: str) -> str | None:
        """Version from a ``*.dist-info/METADATA`` inside the tree (for trees that are not installed)."""
        prefix = distribution.replace("-", "_") + "-"
        if self._zip is not None:
            names = self._zip.namelist()
        else:
            names = [p.name + "/" for p in self.root.iterdir()] if self.root.is_dir() else []
        for name in names:
            top = name.split("/", 1)[0]
            if top.startswith(prefix) and top.endswith(".dist-info"):
                text = self.read(f"{top}/METADATA")
                if text:
                    from email.parser import HeaderParser  # ~25 ms to import: wheels and unpacked trees only

                    return HeaderParser().parsestr(text).get("Version")
        return None


_PARSED: dict = {}


def parse_source(text: str):
    """``ast.parse(text)``, once per process for the same text: the drift points and the scans of one run read the
    same files (``SyntaxError`` as ``ast.parse`` raises it). Callers only read the tree they get."""
    found = _PARSED.get(text)
    if found is None:
        import ast

        found = _PARSED[text] = ast.parse(text)
    return found


def children(node) -> list:
    """The nodes directly under ``node``, as ``ast.iter_child_nodes`` gives them (a list: about twice as fast).
    A cold check asks this ~1.2 M times: ``ast`` is looked up once, and a node without fields (``Load``,
    ``Store``, an operator: a third of them) is answered at once."""
    fields = node._fields
    if not fields:
        return []
    node_class = _AST_NODE or _ast_node_class()
    found = []
    for name in fields:
        value = getattr(node, name, None)
        if value.__class__ is list:
            found += [item for item in value if isinstance(item, node_class)]
        elif isinstance(value, node_class):
            found.append(value)
    return found


def _ast_node_class():
    """``ast.AST``, imported on first use (the installed side never parses: doctor's startup stays light)."""
    global _AST_NODE
    if _AST_NODE is None:
        import ast

        _AST_NODE = ast.AST
    return _AST_NODE


_AST_NODE = None


def walk(node) -> list:
    """Every node under ``node``, itself first, in ``ast.walk``'s order; listed once and kept on the node. A scan
    walks the same functions and classes many times (a cold check: ~2 M nodes walked, half of them again), and the
    trees it reads are never changed (``parse_source``)."""
    found = node.__dict__.get("_walked")
    if found is None:
        found = [node]
        for current in found:  # appended while read: breadth first, as ast.walk
            found.extend(children(current))
        node._walked = found
    return found


def installed_package_root(name: str) -> Path | None:
    """The directory holding the installed top-level package ``name``, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))).parent


def tree_at(root: Path | None) -> SourceTree:
    """The tree at ``root``; for None, an empty tree that answers "not installed" to every question."""
    return SourceTree(root) if root is not None else SourceTree(NOWHERE)


def tree_of(package: str) -> SourceTree:
    """The tree holding the installed top-level ``package`` (empty when it is not installed)."""
    return tree_at(installed_package_root(package))
