"""What a plugin's functions use of vLLM that this vLLM no longer has, read from the files of both (issue 40,
plugins/README.md wiring steps 3 and 10): imports inside a function (``from vllm.model_executor import
set_random_seed`` in kvcached's patched ``init_device``, kvcached#241), and attribute reads on vLLM values
(``vllm_config.prompt_adapter_config``, sendnn-inference#336). Neither stops an import: each fails where its function
runs.

An import inside a function is missing where vLLM's files say so (``host_index``), unless a ``try`` whose handler
catches ImportError (or a parent) without raising guards it, or an ``if`` on the running version holds it.

Which values are vLLM's: a parameter or local annotated with a vLLM class, or built from one (``CodeModel.local_types``:
annotations, constructions, elements of annotated containers), one field further (``sc = vllm_config.scheduler_config``
where ``VllmConfig`` annotates ``scheduler_config: SchedulerConfig``; ``for t in config.kv_cache_tensors`` where the
field is ``list[KVCacheTensor]``), and a vLLM class named directly (``Pooler.from_config_with_defaults``).

When a read is missing: no class on the value's class walk defines the name (methods, class-level assignments and
annotated fields, ``self.x = ...`` in its methods: ``CodeModel.instance_attributes``), the walk is complete (no base
from a third package, no ``__getattr__``), nothing anywhere in vLLM's files defines an attribute of that name, and no
plugin class derives the value's class (a subclass may define it, and the value may be one: then the read is not
called missing). A read a ``hasattr`` / ``getattr`` in its function names, a read under an ``if`` on the running
version, and an attribute the plugin itself sets on some object (``forward_context.capturing = ...``) are not called
missing either. Erring towards "present": a read this cannot type is not checked.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from .code_model import CodeModel, Definition, statements


@dataclass(frozen=True)
class MissingUse:
    module: str  # the plugin module that reads it
    function: str  # the function (``Class.method``) that reads it
    line: int
    owner: str  # the vLLM class (a read) or module (an import), dotted
    name: str
    how: str = "reads"  # "reads" an attribute, or "imports" a name inside a function

    @property
    def target(self) -> str:
        return f"{self.owner}.{self.name}"


def _functions(tree: ast.Module):
    """``(class node or None, function node)`` of every def at module level and in module-level classes."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield None, node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield node, item


class _Reader:
    def __init__(self, model: CodeModel):
        self.model = model
        self._type_checking: dict[str, dict[str, Definition | None]] = {}
        self._version_tests: dict = {}

    def version_test(self, module: str):
        """``source_scan``'s version-test pattern for ``module`` (its module-level version flags), read once."""
        from .source_scan import _version_test

        if module not in self._version_tests:
            self._version_tests[module] = _version_test(
                self.model.read("plugin", self.model.module_file(module)) or "")
        return self._version_tests[module]

    def type_checking_imports(self, module: str) -> dict[str, Definition | None]:
        """{name: vLLM class} of ``from vllm... import Name`` under a module-level ``if TYPE_CHECKING:``, whose
        ``else`` often binds the name to None at run time (vllm-spyre's ``platform.py``): what annotations mean."""
        if module not in self._type_checking:
            found: dict[str, Definition | None] = {}
            tree = self.model.module_ast(module)
            for node in tree.body if tree is not None else ():
                if isinstance(node, ast.If) and (ast.unparse(node.test).rsplit(".", 1)[-1] == "TYPE_CHECKING"):
                    for item in node.body:
                        if isinstance(item, ast.ImportFrom) and item.module and item.level == 0 \
                                and self.model.side_of(item.module) == "host":
                            for alias in item.names:
                                held = self.model.resolve(item.module, alias.name)
                                found[alias.asname or alias.name] = held if isinstance(held, Definition) \
                                    and held.is_class else None
            self._type_checking[module] = found
        return self._type_checking[module]

    def _field_annotation(self, cls: Definition, name: str) -> tuple[str, ast.expr] | None:
        """``(module, annotation)`` of the first class-level ``name: annotation`` on ``cls``'s walk."""
        for candidate in self.model.mro(cls):
            if isinstance(candidate, Definition):
                for node in candidate.node.body:
                    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                            and node.target.id == name:
                        return candidate.module, node.annotation
        return None

    def field_class(self, cls: Definition, name: str) -> Definition | None:
        """The vLLM class a field of ``cls`` holds: its annotation on ``cls``'s walk, else what a base's ``__init__``
        assigns it."""
        annotated = self._field_annotation(cls, name)
        held = self.model._annotated_class(*annotated) if annotated is not None \
            else self.model.attribute_class(cls, name)
        return held if isinstance(held, Definition) else None

    def element_class(self, cls: Definition, name: str) -> Definition | None:
        """The element class of a container field of ``cls`` (``list[KVCacheTensor]``)."""
        annotated = self._field_annotation(cls, name)
        found = self.model._element_class(*annotated) if annotated is not None else None
        return found[0] if found is not None and not found[1] else None

    def typed(self, module: str, cls_node, func) -> dict[str, Definition]:
        """``{name: vLLM class}`` a function's names hold (see the module docstring), ``self`` left out (its reads
        are the plugin's own class's)."""
        held = {n: c for n, c in self.model.local_types(module, cls_node, func).items()
                if n != "self" and c.side == "host"}
        for arg in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs):
            annotation = arg.annotation.value if isinstance(arg.annotation, ast.Constant) else \
                ast.unparse(arg.annotation) if arg.annotation is not None else None
            if arg.arg not in held and annotation in self.type_checking_imports(module):
                found = self.type_checking_imports(module)[annotation]
                if found is not None:
                    held[arg.arg] = found
        for node in statements(func.body):  # one field further
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and isinstance(node.value, ast.Attribute) and isinstance(node.value.value, ast.Name) \
                    and node.value.value.id in held and node.targets[0].id not in held:
                found = self.field_class(held[node.value.value.id], node.value.attr)
                if found is not None and found.side == "host":
                    held[node.targets[0].id] = found
            elif isinstance(node, (ast.For, ast.AsyncFor)) and isinstance(node.target, ast.Name) \
                    and isinstance(node.iter, ast.Attribute) and isinstance(node.iter.value, ast.Name) \
                    and node.iter.value.id in held and node.target.id not in held:
                found = self.element_class(held[node.iter.value.id], node.iter.attr)
                if found is not None and found.side == "host":
                    held[node.target.id] = found
        return held

    def reads(self, module: str):
        """``(function, line, vLLM class, attribute)`` of each read on a vLLM value in ``module``, but those a
        ``hasattr`` / ``getattr`` in the same function names (a guard) and those under an ``if`` on the running
        version (``source_scan``'s rule: only the run decides)."""

        tree = self.model.module_ast(module)
        if tree is None:
            return
        version_test = self.version_test(module)
        classes: dict[str, Definition | None] = {}
        for cls_node, func in _functions(tree):
            where = f"{cls_node.name}.{func.name}" if cls_node is not None else func.name
            held = self.typed(module, cls_node, func)
            assigned = {t.id for node in statements(func.body) if isinstance(node, ast.Assign)
                        for t in node.targets if isinstance(t, ast.Name)}
            guarded = {a.value for node in ast.walk(func) if isinstance(node, ast.Call)
                       and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr")
                       for a in node.args[1:2] if isinstance(a, ast.Constant) and isinstance(a.value, str)}
            for node in _runs(func, version_test, _READ_GUARDS):
                if isinstance(node, ast.Attribute) and node.attr in guarded:
                    continue
                if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                        and isinstance(node.value, ast.Name)):
                    continue
                name = node.value.id
                if name in held:
                    yield where, node.lineno, held[name], node.attr
                elif name not in assigned and name[:1].isupper():  # a vLLM class named directly
                    if name not in classes:
                        found = self.model.resolve_expr(module, name)
                        classes[name] = found if isinstance(found, Definition) and found.is_class \
                            and found.side == "host" else None
                    if classes[name] is not None:
                        yield where, node.lineno, classes[name], node.attr


    def imports(self, module: str):
        """``MissingUse`` of each import inside a function of ``module`` that this vLLM lacks, unguarded and ungated
        (see the module docstring)."""
        from .host_index import host_index

        tree = self.model.module_ast(module)
        if tree is None:
            return
        host, index = self.model.packages["host"], host_index(self.model.trees["host"])
        version_test = self.version_test(module)
        for cls_node, func in _functions(tree):
            where = f"{cls_node.name}.{func.name}" if cls_node is not None else func.name
            for node in _runs(func, version_test, _IMPORT_GUARDS):
                if isinstance(node, ast.ImportFrom) and not node.level and node.module \
                        and node.module.split(".")[0] == host:
                    for alias in node.names:
                        answer = index.lookup(node.module, None if alias.name == "*" else alias.name)
                        if answer == "no":
                            yield MissingUse(module, where, node.lineno, node.module, alias.name, "imports")
                        elif answer == "no_module":
                            parent, _, leaf = node.module.rpartition(".")
                            yield MissingUse(module, where, node.lineno, parent, leaf, "imports")
                            break
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        if alias.name.split(".")[0] == host and index.lookup(alias.name, None) == "no_module":
                            parent, _, leaf = alias.name.rpartition(".")
                            yield MissingUse(module, where, node.lineno, parent, leaf, "imports")


# what a handler must catch to guard a use (a bare ``except:`` too), its body not raising
_IMPORT_GUARDS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})
_READ_GUARDS = frozenset({"AttributeError", "Exception", "BaseException"})


def _catches(handler: ast.ExceptHandler, guards: frozenset) -> bool:
    caught = [] if handler.type is None else handler.type.elts if isinstance(handler.type, ast.Tuple) \
        else [handler.type]
    names = {(ast.unparse(c).rsplit(".", 1)[-1]) for c in caught}
    return (handler.type is None or bool(names & guards)) and not any(
        isinstance(n, ast.Raise) for n in ast.walk(handler))


def _runs(func, version_test, guards: frozenset):
    """The nodes of ``func`` that run unguarded: outside the branches of an ``if`` on the running version, outside a
    ``try`` body whose handler catches one of ``guards`` without raising, and outside that handler (a fallback)."""
    todo = [func]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and version_test.match(f"if {ast.unparse(node.test)}:"):
            todo.append(node.test)
        elif isinstance(node, ast.Try):
            if not any(_catches(h, guards) for h in node.handlers):
                todo.extend(node.body)
            # a handler of the same errors is a fallback for what its try did not do; another runs on its error
            todo.extend(h for h in node.handlers if not _catches(h, guards))
            todo.extend(node.orelse + node.finalbody)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _matches(model: CodeModel, side: str, names: set[str], pattern: str) -> set[str]:
    """The names of ``names`` that ``pattern`` (``{names}`` standing for their alternation) finds in a side's files."""
    if not names:
        return set()
    regex = re.compile(pattern.format(names="|".join(sorted(map(re.escape, names)))), re.M)
    found: set[str] = set()
    for _, text in model.texts(side):
        for match in regex.findall(text):
            found.update([match] if isinstance(match, str) else [m for m in match if m])
        if found >= names:
            break
    return found


# a def, a class-level or local binding, or ``self.x = ``: where vLLM (a subclass of the value's class, say) may
# define the attribute; over-matching locals only errs towards "present"
_DEFINES = r"(?:\bdef[ \t]+|\bself\.|^[ \t]+)({names})\b[ \t]*(?:\(|:|=(?!=))"
_SUBCLASSES = r"^[ \t]*class[ \t]+\w+\([^)]*\b({names})\b"  # a plugin class deriving the value's class
# the plugin setting the attribute on another object than its own (vllm-ascend sets its fields on vLLM's ForwardContext)
_SETS = r"""(?:(?<!self)\.({names})\b[ \t]*=(?!=)|setattr\([^,]+,[ \t]*["']({names})["'])"""


def missing_uses(plugin_tree, host_tree, plugin: str, modules) -> list[MissingUse]:
    """The imports inside functions and the reads of vLLM attributes this vLLM lacks in the plugin's ``modules``
    (see the module docstring)."""
    model = CodeModel(plugin_tree, host_tree, plugin, "vllm")
    reader = _Reader(model)
    imports = [use for module in sorted(modules) for use in reader.imports(module)]
    candidates = []
    for module in sorted(modules):
        for where, line, cls, name in reader.reads(module):
            if name.startswith("__"):
                continue
            names, complete = model.instance_attributes(cls)
            if complete and name not in names and model.outside_has(cls, name) is False:
                candidates.append(MissingUse(module, where, line, f"{cls.module}.{cls.name}", name))
    names = {c.name for c in candidates}
    defined = _matches(model, "host", names, _DEFINES) | _matches(model, "plugin", names, _SETS)
    subclassed = _matches(model, "plugin", {c.owner.rsplit(".", 1)[1] for c in candidates}, _SUBCLASSES)
    return imports + [c for c in candidates if c.name not in defined and c.owner.rsplit(".", 1)[1] not in subclassed]
