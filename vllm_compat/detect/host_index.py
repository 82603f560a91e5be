"""The host side of import drift: does vLLM's module ``x`` have ``Y``, read from its files.

``Y`` resolves when ``x`` has a submodule ``Y`` (a ``.py`` file, a package or a compiled extension), or binds ``Y``
at module level (def, class, assignment, import), or re-exports it through ``from .z import *`` (``z.__all__`` when
literal, else ``z``'s public names). A module with a module-level ``__getattr__`` (lazy exports, as
``vllm/__init__`` has) answers "unknown", never "missing"; so does a module that exists only as a compiled
extension. Module summaries and answers are kept per tree for the life of the process (``host_index``).
"""

from __future__ import annotations

import ast
import os

from .source_scan import ModuleSummary, summarize_module
from .source_tree import SourceTree


class TreeListing:
    """The zip namelist / directory listing of a tree, for existence checks without a stat per query."""

    def __init__(self, tree: SourceTree):
        self.tree = tree
        self._is_zip = tree.is_zip
        self._dirs: dict[str, set[str]] = {}
        if tree.is_zip:  # every directory of the zip indexed in one pass (a scan per directory cost ~0.4 s)
            for name in tree.namelist():
                parts = name.split("/")
                for depth, entry in enumerate(parts):
                    if entry:
                        self._dirs.setdefault("/".join(parts[:depth]), set()).add(entry)

    def listdir(self, reldir: str) -> set[str]:
        """Entry names directly under ``reldir`` (no trailing slash)."""
        if reldir not in self._dirs:
            if self._is_zip:
                self._dirs[reldir] = set()  # indexed up front: a directory not seen there does not exist
            else:
                try:
                    self._dirs[reldir] = set(os.listdir(self.tree.root / reldir))
                except OSError:
                    self._dirs[reldir] = set()
        return self._dirs[reldir]


class HostIndex:
    """Answers "does ``module`` have ``name``?" for the vLLM in ``tree``: "yes", "no", "unknown" or
    "no_module". Per-file summaries are cached on the instance (and instances per tree, see ``host_index``)."""

    def __init__(self, tree: SourceTree):
        self.tree = tree
        self.names = TreeListing(tree)
        self._summaries: dict[str, ModuleSummary | None] = {}
        self._answers: dict[tuple[str, str | None], str] = {}

    def module_file(self, module: str) -> str | None | bool:
        """Relative path of ``module``'s source; True for a namespace package or a compiled module
        (exists, contents unknown); None when it does not exist."""
        parts = module.split(".")
        parent = "/".join(parts[:-1])
        entries = self.names.listdir(parent)
        leaf = parts[-1]
        path = "/".join(parts)
        if f"{leaf}.py" in entries:
            return f"{path}.py"
        if leaf in entries:
            return f"{path}/__init__.py" if "__init__.py" in self.names.listdir(path) else True
        if any(e.startswith(f"{leaf}.") and e.endswith((".so", ".pyd")) for e in entries):
            return True
        return None

    def summary(self, relpath: str) -> ModuleSummary | None:
        if relpath not in self._summaries:
            text = self.tree.read(relpath)
            self._summaries[relpath] = summarize_module(text) if text is not None else None
        return self._summaries[relpath]

    def lookup(self, module: str, name: str | None, _seen: frozenset = frozenset()) -> str:
        key = (module, name)
        if key not in self._answers:
            self._answers[key] = self._lookup(module, name, _seen | {module})
        return self._answers[key]

    def _lookup(self, module: str, name: str | None, seen: frozenset) -> str:
        found = self.module_file(module)
        if found is None:
            parent = module.rpartition(".")[0]
            if parent and self.lookup(parent, None, seen) == "unknown":
                return "unknown"
            return "no_module"
        if name is None:
            return "yes"
        if found is True:
            return "unknown" if self.module_file(f"{module}.{name}") is None else "yes"
        if self.module_file(f"{module}.{name}") is not None:
            return "yes"  # a submodule: ``from pkg import sub`` imports it
        summary = self.summary(found)
        if summary is None:
            return "unknown"
        if name in summary.defined:
            return "yes"
        package = module if found.endswith("__init__.py") else module.rpartition(".")[0]
        stars = []
        for _, statement in summary.import_texts:
            if name not in statement and "*" not in statement:
                continue
            try:
                nodes = ast.parse(statement.strip()).body
            except SyntaxError:
                continue
            for node in nodes:
                if isinstance(node, ast.Import):
                    if any((a.asname or a.name.split(".")[0]) == name for a in node.names):
                        return "yes"
                elif isinstance(node, ast.ImportFrom):
                    for alias in node.names:
                        if alias.name == "*":
                            stars.append(absolute_module(node, package))
                        elif (alias.asname or alias.name) == name:
                            return "yes"
        answer = "unknown" if summary.dynamic else "no"
        for star in stars:
            if star is None or star in seen:
                continue
            exported = self._star_exports(star, name, seen)
            if exported == "yes":
                return "yes"
            if exported == "unknown":
                answer = "unknown"
        return answer

    def _star_exports(self, module: str, name: str, seen: frozenset) -> str:
        found = self.module_file(module)
        if found is None:
            return "no"
        if found is True:
            return "unknown"
        summary = self.summary(found)
        if summary is None:
            return "unknown"
        if summary.all_names is not None:
            return "yes" if name in summary.all_names else "no"
        if name.startswith("_"):
            return "no"
        return self.lookup(module, name, seen)


def absolute_module(node: ast.ImportFrom, package: str) -> str | None:
    """The absolute module a (possibly relative) ``from ... import`` in ``package`` names; None past the top."""
    if not node.level:
        return node.module
    parts = package.split(".")
    if node.level - 1 > len(parts):
        return None
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


_HOST_INDEXES: dict[str, HostIndex] = {}


def host_index(tree: SourceTree) -> HostIndex:
    """The cached ``HostIndex`` of a tree (keyed by its root path)."""
    key = str(tree.root)
    if key not in _HOST_INDEXES:
        _HOST_INDEXES[key] = HostIndex(tree)
    return _HOST_INDEXES[key]
