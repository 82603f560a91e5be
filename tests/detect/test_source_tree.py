"""The walks the scans share, against the standard library's and a recursive definition, on real modules (the
standard library's and this package's own), and a pair's texts read once."""

import ast
import asyncio
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest

import vllm_compat
from vllm_compat.detect import behaviour_drift
from vllm_compat.detect.code_model import CodeModel
from vllm_compat.detect.source_tree import SourceTree, children, walk

MODULES = [Path(inspect.getfile(m)) for m in (ast, asyncio.base_events, dataclasses, typing)] + sorted(
    Path(vllm_compat.__file__).parent.rglob("*.py"))[:40]


@pytest.fixture(scope="module")
def trees():
    return [ast.parse(path.read_text(encoding="utf-8")) for path in MODULES]


def test_walk_gives_ast_walks_nodes_in_its_order_and_children_iter_child_nodes(trees):
    for tree in trees:
        assert walk(tree) == list(ast.walk(tree))
        for node in ast.walk(tree):
            assert children(node) == list(ast.iter_child_nodes(node))
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
        for function in functions[:20]:
            assert walk(function) == list(ast.walk(function))


def test_a_walk_is_listed_once_per_node():
    tree = ast.parse("def f(x):\n    return g(x) + 1\n")
    assert walk(tree) is walk(tree)
    assert walk(tree.body[0]) == walk(tree)[1:]


def _recursive_walk(body, cls=None, func=None, cond=""):
    """The scan's walk as it was first written, recursively: the reference for the stack version."""
    for node in body:
        yield node, cls, func, cond
        if isinstance(node, ast.ClassDef):
            yield from _recursive_walk(node.body, node if cls is None and func is None else cls, func, "")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _recursive_walk(node.body, cls, node if func is None else func, "" if func is None else cond)
            yield from _recursive_walk(node.decorator_list + node.args.defaults, cls, func, cond)
        elif isinstance(node, (ast.If, ast.IfExp)) and func is not None:
            test = behaviour_drift._short(ast.unparse(node.test))
            yield from _recursive_walk([node.test], cls, func, cond)
            yield from _recursive_walk(node.body if isinstance(node.body, list) else [node.body], cls, func, test)
            yield from _recursive_walk(node.orelse if isinstance(node.orelse, list) else [node.orelse], cls, func,
                                       f"not ({test})")
        elif isinstance(node, ast.ExceptHandler) and func is not None:
            yield from _recursive_walk(node.body, cls, func, "an exception is handled")
        else:
            yield from _recursive_walk(list(ast.iter_child_nodes(node)), cls, func, cond)


def test_the_scans_walk_gives_each_node_its_class_function_and_condition_in_order(trees):
    for tree in trees:
        assert list(behaviour_drift._walk(tree.body)) == list(_recursive_walk(tree.body))
    nested = ast.parse("class A:\n    def f(self, y=h()):\n        if y:\n            g(y)\n        else:\n"
                       "            try:\n                k()\n            except E:\n                m(1 if y else 2)\n")
    conditions = {ast.unparse(node): cond for node, _, _, cond in behaviour_drift._walk(nested.body)
                  if isinstance(node, ast.Call)}
    assert conditions == {"h()": "", "g(y)": "y", "k()": "not (y)", "m(1 if y else 2)": "an exception is handled"}


def test_a_code_model_reads_each_file_once(tmp_path):
    """The scan's many passes over vLLM's texts read each file once per pair; a new pair reads them anew (the
    texts are the model's, not the tree's: a plan's rows do not keep each other's)."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "m.py").write_text("x = 1\n")
    tree = SourceTree(tmp_path)
    model = CodeModel(SourceTree(tmp_path / "nowhere"), tree)
    assert model.read("host", "vllm/m.py") == "x = 1\n"
    (tmp_path / "vllm" / "m.py").write_text("x = 2\n")
    assert model.read("host", "vllm/m.py") == "x = 1\n" and list(model.texts("host")) == [("vllm/m.py", "x = 1\n")]
    assert model.read("host", "vllm/missing.py") is None
    assert CodeModel(SourceTree(tmp_path / "nowhere"), tree).read("host", "vllm/m.py") == "x = 2\n"


def test_what_a_file_binds_is_kept_by_its_place_and_new_models_share_it(tmp_path):
    """Two files of one text share one parsed tree (``parse_source``); their relative imports bind by where each
    is, so what a module binds is kept per (module, file); a second model (a plan's next row) is given the same."""
    for package in ("vllm/a", "vllm/b"):
        (tmp_path / package).mkdir(parents=True)
        (tmp_path / package / "__init__.py").write_text("")
        (tmp_path / package / "m.py").write_text("from .x import y\n")
    (tmp_path / "vllm" / "__init__.py").write_text("")
    host = SourceTree(tmp_path)
    model = CodeModel(SourceTree(tmp_path / "nowhere"), host)
    assert model.module_ast("vllm.a.m") is model.module_ast("vllm.b.m")
    assert model.bindings("vllm.a.m")["y"] == ("import", "vllm.a.x", "y")
    assert model.bindings("vllm.b.m")["y"] == ("import", "vllm.b.x", "y")
    again = CodeModel(SourceTree(tmp_path / "nowhere"), host)
    assert again.bindings("vllm.b.m") is model.bindings("vllm.b.m")


def test_the_scans_walk_of_a_module_is_kept_on_its_tree(trees):
    for tree in trees:
        assert behaviour_drift._walked(tree) == list(behaviour_drift._walk(tree.body))
        assert behaviour_drift._walked(tree) is behaviour_drift._walked(tree)
