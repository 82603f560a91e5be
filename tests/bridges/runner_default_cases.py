"""What the runner-default stand-ins' tests share (``test_runner_xdrope_removed``,
``test_runner_routed_experts_removed``): which reads of a feature's state sit under its flag, read from the files."""

from __future__ import annotations

import ast


def guarded_reads(source: str, name: str, guard: str) -> list[tuple[int, bool]]:
    """``(line, guarded)`` of every ``self.<name>`` read in ``source``: guarded where it is in the body of an ``if``
    (or a conditional expression) whose test reads ``self.<guard>`` without ``not``, or after ``if not
    self.<guard>: return`` in its function."""
    def tests_guard(test) -> bool:
        return not (isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)) and any(
            isinstance(n, ast.Attribute) and n.attr == guard for n in ast.walk(test))

    def returns_unless_guard(stmt) -> bool:
        return (isinstance(stmt, ast.If) and isinstance(stmt.test, ast.UnaryOp) and isinstance(stmt.test.op, ast.Not)
                and any(isinstance(n, ast.Attribute) and n.attr == guard for n in ast.walk(stmt.test))
                and isinstance(stmt.body[-1], ast.Return))

    found = []

    def visit(node, guarded):
        if isinstance(node, ast.Attribute) and node.attr == name and isinstance(node.ctx, ast.Load):
            found.append((node.lineno, guarded))
        if isinstance(node, (ast.If, ast.IfExp)) and tests_guard(node.test):
            visit(node.test, guarded)
            for child in (node.body if isinstance(node, ast.If) else [node.body]):
                visit(child, True)
            for child in (node.orelse if isinstance(node, ast.If) else [node.orelse]):
                visit(child, guarded)
            return
        for field in ("body", "orelse", "finalbody"):
            statements = getattr(node, field, None)
            if isinstance(statements, list) and statements and isinstance(statements[0], ast.stmt):
                inner = guarded
                for stmt in statements:
                    visit(stmt, inner)
                    inner = inner or returns_unless_guard(stmt)
        for key, child in ast.iter_fields(node):
            if key in ("body", "orelse", "finalbody") and isinstance(child, list) and child and isinstance(
                    child[0], ast.stmt):
                continue
            for item in (child if isinstance(child, list) else [child]):
                if isinstance(item, ast.AST):
                    visit(item, guarded)

    visit(ast.parse(source), False)
    return found


def check_guard_reader():
    source = ("def f(self):\n    if self.a:\n        pass\n    elif self.g > 0:\n        self.x\n    self.x\n"
              "def h(self):\n    if not self.g:\n        return\n    self.x\n"
              "def k(self):\n    if not self.g:\n        self.x\n")
    assert guarded_reads(source, "x", "g") == [(5, True), (6, False), (10, True), (13, False)]
