"""What the alias table's old paths were, read from an old vLLM itself: the oracle the alias targets are held to.

``python -m tests.bridges.alias_targets OUT.json`` in a cell whose vLLM still binds the old paths (v0.24-omni0.24:
vllm-omni 0.24.0 on the vLLM it was built for) imports each old path of the table and records, for a name, its
kind, ``__qualname__`` and a digest of its source with the docstring and its own name taken out; for a moved
module, the same for each name vllm-omni takes from it. The test (``test_moved_names_targets.py``) imports the
old paths on a newer vLLM with the bridge in place and compares: the table is never its own expectation.
"""

from __future__ import annotations

import ast
import difflib
import hashlib
import importlib
import inspect
import json
import sys
import textwrap
from pathlib import Path

ORACLE = Path(__file__).with_name("moved_names.vllm-0.24.0.json")


def normalized_source(obj) -> str | None:
    """The definition's source without its docstring and with its own name replaced, or None (no source: a
    constant, a builtin). Unparsed from the AST, so layout and comments do not count."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    node.name = "_"
    for each in ast.walk(node):
        body = getattr(each, "body", None)
        if (isinstance(each, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            each.body = body[1:] or [ast.Pass()]
    return ast.unparse(node)


def describe(obj) -> dict:
    source = normalized_source(obj)
    return {
        "kind": "class" if inspect.isclass(obj) else "function" if callable(obj) else type(obj).__name__,
        "qualname": getattr(obj, "__qualname__", None),
        "source": source,
        "digest": hashlib.sha256(source.encode()).hexdigest()[:16] if source is not None else None,
        "value": None if source is not None or callable(obj) else repr(obj),
    }


def similarity(a: str, b: str) -> float:
    return difflib.SequenceMatcher(None, a, b).ratio()


def resolve(path: str, kind: str, names=()) -> dict:
    """{name: describe(object)} for ``path`` (a module's listed ``names``, or the one name), or an ``error``."""
    try:
        if kind == "module":
            module = importlib.import_module(path)
            return {name: describe(getattr(module, name)) for name in names}
        module, name = path.rsplit(".", 1)
        return {name: describe(getattr(importlib.import_module(module), name))}
    except Exception as exc:  # noqa: BLE001 - an old path this vLLM does not bind is recorded as such
        return {"error": f"{type(exc).__name__}: {exc}"}


def record(out: Path) -> dict:
    import vllm

    from vllm_compat.bridges.moved_names import table

    names: dict = {}  # every name vllm-omni takes from an old module, over all of its rows
    for row in table():
        names.setdefault((row.old, row.kind), set()).update(row.names)
    rows = {old: resolve(old, kind, sorted(found)) for (old, kind), found in sorted(names.items())}
    result = {"vllm": vllm.__version__, "old_paths": rows}
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


if __name__ == "__main__":
    done = record(Path(sys.argv[1]))
    print({old: sorted(v) for old, v in done["old_paths"].items()})
