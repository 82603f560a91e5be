"""Where a name is defined in a source tree, and a key for its definition that compares source, not names.

The alias bridge and its generator (``matrix/aliases.py``) both ask "is this the same definition?": the
generator when it looks for where a name vLLM dropped went, the bridge when it checks that the installed vLLM's
definition is still the one the table was made from. Both use ``source_key`` below, so a table written on one
Python reads the same on another: ``ast.dump``'s text differs between Python releases (3.12 added
``type_params``, 3.13 leaves empty fields out), so the key is built from the node fields that every supported
Python (3.10+) has, leaving empty ones out.

Files only: nothing is imported. ``ast.parse`` of one vLLM module takes a few milliseconds; a ``Definitions``
caches the parsed files of its tree.
"""

from __future__ import annotations

import ast
import hashlib

from .host_index import absolute_module, host_index
from .source_tree import SourceTree, parse_source

# Fields that some Python versions have and others lack, or that carry no meaning for identity.
_SKIPPED_FIELDS = frozenset({"type_params", "type_comment", "kind", "ctx"})


def _strip_docstring(body: list) -> list:
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _serialize(node, out: list) -> None:
    if isinstance(node, ast.AST):
        out.append(type(node).__name__)
        out.append("(")
        for name in node._fields:
            if name in _SKIPPED_FIELDS:
                continue
            value = getattr(node, name, None)
            if name == "body" and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                value = _strip_docstring(value)  # a docstring edit is not a change of definition
            if value is None or value == []:
                continue
            out.append(name)
            out.append("=")
            _serialize(value, out)
            out.append(",")
        out.append(")")
    elif isinstance(node, list):
        out.append("[")
        for item in node:
            _serialize(item, out)
            out.append(",")
        out.append("]")
    else:
        out.append(repr(node))


def normalized_source(node: ast.AST, rename: str | None = None) -> str:
    """The definition's AST as text, docstrings and version-specific fields left out; with ``rename``, a
    def/class is serialized as if it had that name (so a renamed copy compares equal)."""
    if rename is not None and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        original = node.name
        node.name = rename
        try:
            return normalized_source(node)
        finally:
            node.name = original
    out: list = []
    _serialize(node, out)
    return "".join(out)


def source_key(node: ast.AST) -> str:
    """A short hash of ``normalized_source(node)``: equal keys, same definition (up to docstrings)."""
    return hashlib.sha256(normalized_source(node).encode()).hexdigest()[:16]


def module_of(relpath: str) -> str:
    return relpath[:-3].replace("/", ".").removesuffix(".__init__")


def module_bindings(body: list):
    """``(bound name, node)`` for the statements of a module body that bind names, descending into
    module-level ``if`` / ``try`` blocks (not under ``if TYPE_CHECKING``)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node.name, node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    yield target.id, node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            yield node.target.id, node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name != "*":
                    yield alias.asname or alias.name.split(".")[0], node
        elif isinstance(node, ast.If):
            test = ast.unparse(node.test) if hasattr(ast, "unparse") else ""
            if "TYPE_CHECKING" not in test:
                yield from module_bindings(node.body)
            yield from module_bindings(node.orelse)
        elif isinstance(node, ast.Try):
            yield from module_bindings(node.body)
            for handler in node.handlers:
                yield from module_bindings(handler.body)
            yield from module_bindings(node.orelse)


class Definitions:
    """The definitions of one tree (a wheel, an unpacked tree or a site-packages), parsed on demand."""

    def __init__(self, tree: SourceTree):
        self.tree = tree
        self.index = host_index(tree)
        self._parsed: dict[str, ast.Module | None] = {}

    def parse(self, relpath: str) -> ast.Module | None:
        if relpath not in self._parsed:
            text = self.tree.read(relpath)
            try:
                self._parsed[relpath] = parse_source(text) if text is not None else None
            except SyntaxError:
                self._parsed[relpath] = None
        return self._parsed[relpath]

    def module_file(self, module: str) -> str | None:
        found = self.index.module_file(module)
        return found if isinstance(found, str) else None

    def find(self, module: str, name: str, _seen: frozenset = frozenset()):
        """``(defining module, defined name, node)`` of what ``from module import name`` binds, following
        re-exports (``from .x import name [as other]``, ``from .x import *``); None when the tree does not
        define it there (or only as a submodule, or through a module ``__getattr__``)."""
        if (module, name) in _seen or len(_seen) > 20:
            return None
        seen = _seen | {(module, name)}
        relpath = self.module_file(module)
        parsed = self.parse(relpath) if relpath else None
        if parsed is None:
            return None
        package = module if relpath.endswith("__init__.py") else module.rpartition(".")[0]
        found = None
        for bound, node in module_bindings(parsed.body):
            if bound == name:
                found = node  # the last binding wins, as at run time
        if found is None:
            for node in parsed.body:
                if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                    source = absolute_module(node, package)
                    hit = self.find(source, name, seen) if source else None
                    if hit is not None:
                        return hit
            return None
        if isinstance(found, ast.ImportFrom):
            alias = next(a for a in found.names if (a.asname or a.name) == name)
            source = absolute_module(found, package)
            if source is None:
                return None
            if self.module_file(f"{source}.{alias.name}"):
                return None  # a submodule, not a definition
            return self.find(source, alias.name, seen)
        if isinstance(found, ast.Import):
            return None
        return module, name, found

    def definition_key(self, module: str, name: str) -> str | None:
        """``source_key`` of what ``from module import name`` binds; None when it is not defined there."""
        hit = self.find(module, name)
        return source_key(hit[2]) if hit is not None else None

    def top_level(self, relpath: str):
        """``(name, node)`` of every def, class and assignment a module file binds at module level."""
        parsed = self.parse(relpath)
        if parsed is None:
            return
        for bound, node in module_bindings(parsed.body):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                yield bound, node
