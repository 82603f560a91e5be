"""Two packages' Python code as definitions, read from files: names resolved across re-exports and across the two
packages, classes with their bases, methods, attributes and abstract methods, and callables with the signature a
call binds against.

``CodeModel(plugin_tree, host_tree)`` answers for a plugin (vllm-omni) and the host it runs on (vLLM): it resolves
``from vllm.x import Y`` in a plugin module to the def or class vLLM's files define for it (following ``from .z
import Y`` re-exports), walks a class's bases in either package (left to right, depth first, each class once: C3
order for the class trees these packages have), and says what ``Cls(...)`` binds against (the first ``__init__``
on that walk, or the one a dataclass, a ``msgspec.Struct`` or a ``NamedTuple`` generates from its fields:
``generated_init``) and what class ``self.x`` holds (``attribute_class``: what the ``__init__`` of a base assigns
it), what a function's names hold (``local_types``: annotations, constructions, elements of annotated
containers), where a name the host moved now lives (``moved``: a module moved whole) and what a standard-library
base provides (``outside_has``). Where the files cannot tell (a base from a third package, a generated constructor
``generated_init`` cannot read, a module ``__getattr__``), the answer is None: the caller counts it as undecidable,
never as a fit.

Each file is parsed once per process (``parsed``), whoever asks: the behavioural-drift scan, the drift points and
the definitions reader share it.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field

from .definitions import module_bindings
from .generated_init import generated_init, generated_kind
from .host_index import absolute_module, host_index
from .model import Param, ParamKind
from .source_tree import SourceTree, parse_source
from .static import function_params as signature

_PARSED: dict[tuple[str, str], ast.Module | None] = {}

# Bases every class has, or that add nothing a call binds against or an attribute read finds.
_TRIVIAL_BASES = frozenset({"object", "ABC", "abc.ABC", "Generic", "typing.Generic", "Protocol", "typing.Protocol"})
# Decorators and bases that generate the constructor (its signature is not a def in the file), where
# ``generated_init`` does not read it.
_GENERATED_INIT = frozenset({"dataclass", "dataclasses.dataclass", "NamedTuple", "typing.NamedTuple", "TypedDict",
                             "BaseModel", "pydantic.BaseModel", "Enum", "IntEnum", "StrEnum", "enum.Enum",
                             "msgspec.Struct", "Struct", "attr.s", "attrs.define", "define", "frozen",
                             "config", "OpenAIBaseModel"})


_OBJECT_INIT = ast.parse("def __init__(self): pass").body[0]  # what a class without any __init__ binds against
_STDLIB_SKIPPED = frozenset({"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo"})  # side effects


def parsed(tree: SourceTree, relpath: str) -> ast.Module | None:
    """The parsed module at ``relpath`` of ``tree`` (None when missing or not Python 3 source); parsed once per
    process and tree."""
    key = (str(tree.root), relpath)
    if key not in _PARSED:
        text = tree.read(relpath)
        try:
            _PARSED[key] = parse_source(text) if text is not None else None
        except SyntaxError:
            _PARSED[key] = None
    return _PARSED[key]


def _binding(name: str, node, package: str) -> tuple:
    """``CodeModel.bindings``' record of what ``node`` binds to ``name`` at module level."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return ("def", node)
    if isinstance(node, ast.ImportFrom):
        alias = next(a for a in node.names if (a.asname or a.name) == name)
        source = absolute_module(node, package)
        return ("import", source, alias.name) if source else ("value", None)
    if isinstance(node, ast.Import):
        alias = next(a for a in node.names if (a.asname or a.name.split(".")[0]) == name)
        return ("module", alias.name if alias.asname else alias.name.split(".")[0])
    return ("value", None)


def statements(body):
    """Every statement under ``body``, nested blocks and definitions included, expressions not entered (an
    import, an assignment is a statement: reading them needs no walk of every expression node)."""
    todo = list(reversed(body))
    while todo:
        node = todo.pop()
        yield node
        for name in ("body", "orelse", "finalbody", "handlers", "cases"):
            block = getattr(node, name, None)
            if isinstance(block, list):
                todo.extend(reversed(block))


def dotted(node: ast.AST) -> str | None:
    """``a.b.c`` for a Name / Attribute chain (a call's function, a base, a decorator); None otherwise."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Call):  # @decorator(...)
        return dotted(node.func)
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def decorator_names(node) -> set[str]:
    return {name for name in (dotted(d) for d in node.decorator_list) if name}


def is_abstract(func) -> bool:
    return any(name.rsplit(".", 1)[-1] == "abstractmethod" for name in decorator_names(func))


def bound_params(func) -> tuple[Param, ...] | None:
    """The parameters a call through an instance or the class binds (``self`` / ``cls`` dropped; a staticmethod
    keeps all); None for a property."""
    names = {n.rsplit(".", 1)[-1] for n in decorator_names(func)}
    if "property" in names or "cached_property" in names:
        return None
    params = signature(func)
    if "staticmethod" in names:
        return params
    return params[1:] if params and params[0].kind == ParamKind.POSITIONAL else params


@dataclass(frozen=True)
class Definition:
    """A def or class found in one of the two packages: ``module`` (where it is defined), ``name`` (its qualified
    name in the module: ``Cls`` or ``Cls.method``), ``node`` and ``side`` ("plugin" or "host")."""

    side: str
    module: str
    name: str
    node: ast.AST = field(compare=False, repr=False)

    @property
    def path(self) -> str:
        return f"{self.module}.{self.name}"

    @property
    def is_class(self) -> bool:
        return isinstance(self.node, ast.ClassDef)


class CodeModel:
    """The plugin's and the host's code, each in its tree (see the module docstring)."""

    def __init__(self, plugin_tree: SourceTree, host_tree: SourceTree, plugin: str = "vllm_omni", host: str = "vllm"):
        self.trees = {"plugin": plugin_tree, "host": host_tree}
        self.packages = {"plugin": plugin, "host": host}
        # each file's text, read once for this pair: the scan reads every file of vLLM's several times (a regex
        # over each), and unzipping them again cost ~1.5 s of a cold check (vLLM 0.34: ~10 MB); kept here, not
        # on the tree, so a plan's rows do not keep each vLLM's texts to its end
        self._texts: dict[tuple[str, str], str | None] = {}
        self._bindings: dict[tuple[str, str], dict] = {}
        self._mro: dict[str, tuple] = {}
        self._held: dict[tuple[str, str], Definition | None] = {}  # attribute_class's answers
        self._constructors: dict[str, tuple[Definition | None, str]] = {}
        self._moved_index: dict[str, list[str]] | None = None  # moved()'s: def / class name -> host files
        self._locals: dict[int, dict[str, Definition]] = {}  # local_types' answers, by function node
        self._own: dict[int, set[str]] = {}  # own_attributes' answers, by class node

    # ------------------------------------------------------------------------------------------- modules

    def side_of(self, module: str) -> str | None:
        for side, package in self.packages.items():
            if module == package or module.startswith(package + "."):
                return side
        return None

    def module_file(self, module: str) -> str | None:
        side = self.side_of(module)
        if side is None:
            return None
        found = host_index(self.trees[side]).module_file(module)
        return found if isinstance(found, str) else None

    def module_ast(self, module: str) -> ast.Module | None:
        relpath = self.module_file(module)
        return parsed(self.trees[self.side_of(module)], relpath) if relpath else None

    def bindings(self, module: str) -> dict:
        """``{name: binding}`` of a module: ``("def", node)`` for its defs and classes, ``("import", module, name)``
        for ``from module import name``, ``("module", module)`` for ``import a.b as m`` (and ``import a.b``: ``a``),
        ``("value", None)`` for other assignments; function-level imports count too (a plugin module's calls are
        read in its functions). The last binding of a name wins, as at run time; module-level ``if`` / ``try``
        blocks are read, ``if TYPE_CHECKING`` is not."""
        key = ("module", module)
        if key in self._bindings:
            return self._bindings[key]
        tree = self.module_ast(module)
        if tree is None:
            found = self._bindings[key] = {}
            return found
        relpath = self.module_file(module)
        # kept on the parsed tree too, by where it was read: a plan's rows share vllm-omni's trees (and vLLM
        # releases many of their files), and what a file binds depends on its text and its place only
        kept = tree.__dict__.setdefault("_bindings_at", {})
        if (module, relpath) in kept:
            found = self._bindings[key] = kept[module, relpath]
            return found
        found = self._bindings[key] = kept[module, relpath] = {}
        package = module if relpath.endswith("__init__.py") else module.rpartition(".")[0]
        for name, node in module_bindings(tree.body):  # what the module binds, as definitions.Definitions reads it
            found[name] = _binding(name, node, package)
        for node in statements(tree.body):  # then imports inside functions, for names the module leaves unbound
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self._bind_functions(node.body, package, found)
        return found

    def _bind_functions(self, body, package: str, found: dict) -> None:
        """Imports inside a function body (vllm-omni imports heavy vLLM names where it uses them)."""
        for node in statements(body):
            if isinstance(node, ast.ImportFrom):
                source = absolute_module(node, package)
                for alias in node.names:
                    if source and alias.name != "*":
                        found.setdefault(alias.asname or alias.name, ("import", source, alias.name))

    # -------------------------------------------------------------------------------------------- names

    def resolve(self, module: str, name: str, _depth: int = 0) -> Definition | str | None:
        """What ``from module import name`` binds: a ``Definition`` (a def or class), the dotted name of a module
        (``name`` is a submodule, or an imported module), or None when the files cannot tell (another
        distribution, an assignment, a module ``__getattr__``, a missing name)."""
        if _depth > 20 or self.side_of(module) is None:
            return None
        if self.module_file(f"{module}.{name}") is not None or (
                host_index(self.trees[self.side_of(module)]).module_file(f"{module}.{name}") is True):
            return f"{module}.{name}"
        binding = self.bindings(module).get(name)
        if binding is None:
            found = self._star_export(module, name, _depth)
            return found if found is not None or self.side_of(module) != "host" else self.moved(module, name)
        if binding[0] == "def":
            return Definition(self.side_of(module), module, name, binding[1])
        if binding[0] == "import":
            return self.resolve(binding[1], binding[2], _depth + 1)
        if binding[0] == "module":
            return binding[1]
        return None

    def _star_export(self, module: str, name: str, depth: int):
        tree = self.module_ast(module)
        if tree is None:
            return None
        relpath = self.module_file(module)
        package = module if relpath.endswith("__init__.py") else module.rpartition(".")[0]
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
                source = absolute_module(node, package)
                found = self.resolve(source, name, depth + 1) if source else None
                if found is not None:
                    return found
        return None

    def moved(self, module: str, name: str) -> Definition | None:
        """Where the host defines ``name`` now that ``module`` lacks it (a moved class or function: what the import
        drift reports and an alias bridges): the one top-level def or class of that name in a host module with the
        old module's last part (``a.cli_args.f`` -> ``b.cli_args.f``: a module moved whole); None where none or
        several fit (a same-named class of another module is another class: ``x.gpu_model_runner.Runner`` is not
        ``x.gpu.model_runner.Runner``). The host's files are indexed by a regex over their text on first use."""
        if self._moved_index is None:
            pattern = re.compile(r"^(?:async[ \t]+)?(?:def|class)[ \t]+(\w+)", re.M)
            self._moved_index = {}
            for relpath, text in self.texts("host"):
                for found in set(pattern.findall(text)):
                    self._moved_index.setdefault(found, []).append(relpath)
        candidates = [relpath[:-3].replace("/", ".").removesuffix(".__init__")
                      for relpath in self._moved_index.get(name, ())]
        candidates = [c for c in candidates if c != module and c.rsplit(".", 1)[-1] == module.rsplit(".", 1)[-1]]
        if len(candidates) != 1:
            return None
        node = next((n for n in (self.module_ast(candidates[0]) or ast.Module(body=[])).body
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name), None)
        return Definition("host", candidates[0], name, node) if node is not None else None

    def read(self, side: str, relpath: str) -> str | None:
        """The text of a side's file, read once for this model."""
        key = (side, relpath)
        if key not in self._texts:
            self._texts[key] = self.trees[side].read(relpath)
        return self._texts[key]

    def texts(self, side: str):
        """``(relative path, text)`` of every ``.py`` file of a side's package, read as they are asked for."""
        for relpath in self.trees[side].walk_py(self.packages[side]):
            yield relpath, self.read(side, relpath) or ""

    def origin(self, module: str, expr: str, _depth: int = 0) -> Definition | str | None:
        """``resolve_expr``, except that a name either package imports from a third one (``dataclasses``,
        ``msgspec``, ``pydantic``) is that package's dotted name (``from msgspec import Struct`` -> "msgspec.Struct"),
        followed through the packages' re-exports; for a decorator or a base whose meaning comes from elsewhere."""
        head, _, rest = expr.partition(".")
        binding = self.bindings(module).get(head) if _depth <= 20 and self.side_of(module) else None
        if binding is None:
            return None
        outside = None
        if binding[0] == "import" and self.side_of(binding[1]) is None:
            outside = f"{binding[1]}.{binding[2]}"
        elif binding[0] == "module" and self.side_of(binding[1]) is None:
            outside = binding[1]
        elif binding[0] == "import":
            followed = self.origin(binding[1], binding[2], _depth + 1)  # a re-export: where it comes from
            if isinstance(followed, str) and self.side_of(followed) is None:
                outside = followed
        if outside is not None:
            return f"{outside}.{rest}" if rest else outside
        return self.resolve_expr(module, expr)

    def resolve_expr(self, module: str, expr: str) -> Definition | str | None:
        """``Name`` or ``a.b.Name`` as written in ``module`` (a call's function, a base), resolved through the
        module's bindings, attribute by attribute (a module's member, a class's method)."""
        head, *rest = expr.split(".")
        binding = self.bindings(module).get(head)
        if binding is None:
            return None
        current = (Definition(self.side_of(module), module, head, binding[1]) if binding[0] == "def"
                   else self.resolve(binding[1], binding[2]) if binding[0] == "import"
                   else binding[1] if binding[0] == "module" else None)
        for part in rest:
            if isinstance(current, str):
                current = self.resolve(current, part)
            elif isinstance(current, Definition) and current.is_class:
                current = self.member(current, part)
            else:
                return None
        return current

    # ------------------------------------------------------------------------------------------ classes

    def bases(self, cls: Definition) -> list[Definition | str]:
        """The class's bases: each a class ``Definition`` or, where the files cannot follow it, its name as
        written (``Generic[T]`` counts as ``Generic``)."""
        found = []
        for base in cls.node.bases:
            target = base.value if isinstance(base, ast.Subscript) else base
            written = dotted(target) or ast.unparse(base)
            resolved = self.resolve_expr(cls.module, written) if dotted(target) else None
            found.append(resolved if isinstance(resolved, Definition) and resolved.is_class else written)
        return found

    def mro(self, cls: Definition) -> tuple[Definition | str, ...]:
        """``cls`` and its bases, left to right and depth first, each once; unresolved bases as their names."""
        if cls.path in self._mro:
            return self._mro[cls.path]
        self._mro[cls.path] = (cls,)  # a cycle (a name rebound to a subclass) ends here
        order, seen, todo = [], set(), [cls]
        while todo:  # a stack, not a recursive closure: that would hold this model in a reference cycle
            current = todo.pop()
            key = current.path if isinstance(current, Definition) else current
            if key in seen:
                continue
            seen.add(key)
            order.append(current)
            if isinstance(current, Definition):
                todo.extend(reversed(self.bases(current)))
        self._mro[cls.path] = tuple(order)
        return self._mro[cls.path]

    def methods(self, cls: Definition) -> dict[str, ast.AST]:
        return {n.name: n for n in cls.node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}

    def own_attributes(self, cls: Definition) -> set[str]:
        """Names a class defines for its instances: methods, class-level assignments and annotated fields, and
        ``self.x = ...`` in its methods (read once per class)."""
        key = id(cls.node)
        if key not in self._own:
            self._own[key] = self._own_attributes(cls)
        return self._own[key]

    def _own_attributes(self, cls: Definition) -> set[str]:
        names = set(self.methods(cls))
        for node in cls.node.body:
            if isinstance(node, ast.Assign):
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
        for method in self.methods(cls).values():
            for node in statements(method.body):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                    node, (ast.AnnAssign, ast.AugAssign)) else []
                for target in targets:
                    for item in (target.elts if isinstance(target, ast.Tuple) else [target]):
                        if isinstance(item, ast.Attribute) and isinstance(item.value, ast.Name) \
                                and item.value.id == "self":
                            names.add(item.attr)
        return names

    def member(self, cls: Definition, name: str, after: Definition | None = None) -> Definition | None:
        """The first class on ``cls``'s walk (after ``after``, for ``super()``) defining method ``name``, as a
        ``Definition`` of the method; None when none does or an unresolved base comes first."""
        walk = self.mro(cls)
        if after is not None:
            keys = [c.path if isinstance(c, Definition) else c for c in walk]
            walk = walk[keys.index(after.path) + 1:] if after.path in keys else ()
        for candidate in walk:
            if not isinstance(candidate, Definition):
                if candidate in _TRIVIAL_BASES:
                    continue
                return None
            method = self.methods(candidate).get(name)
            if method is not None:
                return Definition(candidate.side, candidate.module, f"{candidate.name}.{name}", method)
        return None

    def constructor(self, cls: Definition) -> tuple[Definition | None, str]:
        """``(the __init__ that Cls(...) binds against, "")``, or ``(None, why)`` when the files cannot tell: a
        generated constructor ``generated_init`` cannot read (pydantic ``BaseModel``, an enum, a dataclass field
        with an alias), an unresolved base before any ``__init__``, a ``__new__`` or a metaclass. A generated one
        (a dataclass's, a ``msgspec.Struct``'s) is a def made from the fields, named ``Cls.__init__`` as a written
        one is. A class whose walk has no ``__init__`` takes no arguments (``object``'s)."""
        if cls.path not in self._constructors:
            self._constructors[cls.path] = self._constructor(cls)
        return self._constructors[cls.path]

    def _constructor(self, cls: Definition) -> tuple[Definition | None, str]:
        for candidate in self.mro(cls):
            if not isinstance(candidate, Definition):
                if candidate in _TRIVIAL_BASES:
                    continue
                return None, f"base {candidate} is not in either package's files"
            made = generated_init(self, candidate)
            if made is not None:
                node, why = made
                if node is None:
                    return None, f"{candidate.path}'s generated constructor: {why}"
                return Definition(candidate.side, candidate.module, f"{candidate.name}.__init__", node), ""
            methods = self.methods(candidate)
            generated = {n.rsplit(".", 1)[-1] for n in decorator_names(candidate.node)} | {
                (dotted(b) or "").rsplit(".", 1)[-1] for b in candidate.node.bases}
            if "__init__" not in methods and generated_kind(self, candidate) is None and (
                    generated & {g.rsplit(".", 1)[-1] for g in _GENERATED_INIT} or candidate.node.keywords):
                return None, f"{candidate.path}'s constructor is generated"  # and not read (a BaseModel, an Enum)
            if "__new__" in methods:
                return None, f"{candidate.path} defines __new__"
            if "__init__" in methods:
                return Definition(candidate.side, candidate.module, f"{candidate.name}.__init__",
                                  methods["__init__"]), ""
        # no __init__, __new__ or metaclass on a walk the files read whole: object's, which takes no arguments (named
        # after the first host class on the walk, where there is one: a call into it, as the host's own classes are)
        owner = next((c for c in self.mro(cls) if isinstance(c, Definition) and c.side == "host"), cls)
        return Definition(owner.side, owner.module, f"{owner.name}.__init__", _OBJECT_INIT), ""

    def attribute_class(self, cls: Definition, attribute: str) -> Definition | None:
        """The class of what ``self.<attribute>`` holds on an instance of ``cls``, from the assignments the methods
        along its walk make (a base's ``__init__`` assigning a manager it builds): each a call of a class (or of a
        function whose return annotation names one), a parameter annotated with a class (``X``, ``X | None``,
        ``Optional[X]``) or an annotated assignment (of a call of a class: that class, whatever the annotation says,
        ``x: list[int] = Buffer(...)`` holding a ``Buffer``); ``None`` assigned is left aside. None where one assignment is something else, where
        they name unrelated classes, or where an unresolved base may assign it too; where they name a class and
        its subclass, the subclass."""
        key = (cls.path, attribute)
        if key in self._held:
            return self._held[key]
        found: dict[str, Definition] = {}
        self._held[key] = None
        for candidate in self.mro(cls):
            if not isinstance(candidate, Definition):
                if candidate in _TRIVIAL_BASES:
                    continue
                return None
            for method in self.methods(candidate).values():
                for value in self._assigned(candidate.module, method, attribute):
                    if value is False:
                        return None
                    if value is not None:
                        found[value.path] = value
        held = [c for c in found.values() if all(
            any(isinstance(b, Definition) and b.path == other for b in self.mro(c)) for other in found)]
        self._held[key] = held[0] if len(held) == 1 else None
        return self._held[key]

    def _assigned(self, module: str, method, attribute: str):
        """For each ``self.<attribute> = value`` in ``method``: the class ``value`` is (a Definition), None for
        ``None``, False where the files cannot tell."""
        annotated = {a.arg: a.annotation for a in (*method.args.posonlyargs, *method.args.args,
                                                   *method.args.kwonlyargs) if a.annotation is not None}
        for node in statements(method.body):
            if isinstance(node, ast.Assign):
                targets, value, annotation = node.targets, node.value, None
            elif isinstance(node, ast.AnnAssign):
                targets, value, annotation = [node.target], node.value, node.annotation
            else:
                continue
            for target in targets:
                items = target.elts if isinstance(target, ast.Tuple) else [target]
                if not any(isinstance(t, ast.Attribute) and t.attr == attribute and isinstance(t.value, ast.Name)
                           and t.value.id == "self" for t in items):
                    continue
                if len(items) > 1 or (annotation is None and value is None):
                    yield False
                elif annotation is not None and isinstance(value, ast.Call) \
                        and (built := self._built_class(module, value)) is not False:
                    yield built  # x: list[int] = Buffer(...) holds a Buffer, whatever the annotation says
                elif annotation is not None:
                    yield self._annotated_class(module, annotation)
                elif isinstance(value, ast.Constant) and value.value is None:
                    yield None
                elif isinstance(value, ast.Name) and value.id in annotated:
                    yield self._annotated_class(module, annotated[value.id])
                elif isinstance(value, ast.Call):
                    yield self._built_class(module, value)
                else:
                    yield False

    def _built_class(self, module: str, call: ast.Call) -> Definition | bool:
        """The class a call builds: ``Cls(...)``, or ``make(...)`` whose return annotation names one; False else."""
        written = dotted(call.func)
        built = self.resolve_expr(module, written) if written else None
        if isinstance(built, Definition) and not built.is_class and getattr(built.node, "returns", None) is not None:
            return self._annotated_class(built.module, built.node.returns)
        return built if isinstance(built, Definition) and built.is_class else False

    def _annotated_class(self, module: str, annotation) -> Definition | bool:
        """The one class an annotation names (``X``, ``"X"``, ``X | None``, ``Optional[X]``, ``Union[X, None]``);
        False for anything else (a container, a union of classes, a name the files cannot follow)."""
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                annotation = ast.parse(annotation.value, mode="eval").body
            except SyntaxError:
                return False
        members = [annotation]
        if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
            members = [annotation.left, annotation.right]
        elif isinstance(annotation, ast.Subscript) and (dotted(annotation.value) or "").rsplit(".", 1)[-1] in (
                "Optional", "Union"):
            inner = annotation.slice
            members = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        members = [m for m in members if not (isinstance(m, ast.Constant) and m.value is None)]
        written = dotted(members[0]) if len(members) == 1 and isinstance(members[0], (ast.Name, ast.Attribute)) \
            else None
        found = self.resolve_expr(module, written) if written else None
        return found if isinstance(found, Definition) and found.is_class else False

    def abstract_left(self, cls: Definition) -> tuple[list[tuple[str, Definition]], bool]:
        """``([(method, the class declaring it abstract)], complete)``: the abstract methods ``cls`` leaves
        undefined (the first class on its walk defining the name declares it abstract); ``complete`` is False
        when an unresolved base might define some."""
        walk = self.mro(cls)
        complete = all(isinstance(c, Definition) or c in _TRIVIAL_BASES for c in walk)
        declared = {name for c in walk if isinstance(c, Definition)
                    for name, m in self.methods(c).items() if is_abstract(m)}
        left = []
        for name in sorted(declared):
            for candidate in walk:
                if not isinstance(candidate, Definition):
                    continue
                method = self.methods(candidate).get(name)
                if method is not None or name in self.own_attributes(candidate) - set(self.methods(candidate)):
                    if method is not None and is_abstract(method):
                        left.append((name, candidate))
                    break
        return left, complete

    def instance_attributes(self, cls: Definition) -> tuple[set[str], bool]:
        """``(names an instance of cls has, complete)``: ``own_attributes`` along its walk; ``complete`` is False
        when an unresolved base or a ``__getattr__`` may provide more."""
        names, complete = set(), True
        for candidate in self.mro(cls):
            if not isinstance(candidate, Definition):
                complete = complete and candidate in _TRIVIAL_BASES
                continue
            names |= self.own_attributes(candidate)
        return names, complete and "__getattr__" not in names and "__getattribute__" not in names

    def outside_has(self, cls: Definition, name: str) -> bool | None:
        """Whether a base of ``cls`` that neither package defines provides ``name``: True where one does, False where
        every such base is a class of the standard library (or a builtin) that does not, None where a base comes
        from a third package. The standard library's classes are the running interpreter's, imported to be asked
        (``array.array``, ``list``): the files of a C class say nothing."""
        import builtins
        import importlib

        answer = False
        for candidate in self.mro(cls):
            if isinstance(candidate, Definition) or candidate in _TRIVIAL_BASES:
                continue
            lister = next((c for c in self.mro(cls) if isinstance(c, Definition) and any(
                (dotted(b.value if isinstance(b, ast.Subscript) else b) or "") == candidate for b in c.node.bases)),
                cls)
            origin = self.origin(lister.module, candidate)
            if origin is None and "." not in candidate and candidate not in self.bindings(lister.module):
                origin = f"builtins.{candidate}"
            top = origin.split(".")[0] if isinstance(origin, str) else None
            if top is None or top not in sys.stdlib_module_names or top in _STDLIB_SKIPPED:
                return None
            found = None
            module_name, _, attribute = origin.rpartition(".")
            try:
                found = getattr(builtins if module_name == "builtins" else importlib.import_module(module_name),
                                attribute, None)
            except Exception:  # noqa: BLE001 - a module this interpreter lacks: cannot tell
                return None
            if not isinstance(found, type):
                return None
            answer = answer or hasattr(found, name)
        return answer

    def local_types(self, module: str, cls_node, func) -> dict[str, Definition]:
        """``{local name: class}`` of what a function's names hold, as far as its text says: ``self`` (its class),
        a parameter annotated with one class, ``x = Cls(...)``, and an element of an annotated container
        (``xs: dict[str, Cls]``: ``xs[k]``, ``xs.get(k)``, ``for x in xs.values()``, ``for k, x in xs.items()``;
        ``list[Cls]`` / ``Sequence[Cls]``: ``xs[i]``, ``for x in xs``). A name bound to two different classes, or
        rebound to anything else, is left out."""
        key = id(func)
        if key in self._locals:
            return self._locals[key]
        found: dict[str, Definition] = {}
        elements: dict[str, tuple[Definition, bool]] = {}  # container name -> (element class, is a mapping)
        dropped: set[str] = set()

        def bind(name: str, value) -> None:
            if not isinstance(value, Definition) or name in dropped or (name in found and found[name] != value):
                found.pop(name, None)
                dropped.add(name)
            else:
                found[name] = value

        if cls_node is not None:
            found["self"] = Definition(self.side_of(module) or "plugin", module, cls_node.name, cls_node)
        for arg in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs):
            if arg.annotation is None or arg.arg in ("self", "cls"):
                continue
            held = self._annotated_class(module, arg.annotation)
            if isinstance(held, Definition):
                found[arg.arg] = held
            elif (element := self._element_class(module, arg.annotation)) is not None:
                elements[arg.arg] = element
        for node in statements(func.body):
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                name, value = node.targets[0].id, node.value
                if name in elements or name == "self":
                    continue
                if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in (
                        "get", "pop") and isinstance(value.func.value, ast.Name) and value.func.value.id in elements \
                        and elements[value.func.value.id][1]:
                    bind(name, elements[value.func.value.id][0])
                elif isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) \
                        and value.value.id in elements:
                    bind(name, elements[value.value.id][0])
                elif isinstance(value, ast.Call):
                    bind(name, self._built_class(module, value))
                else:
                    bind(name, None)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                bind(node.target.id, self._annotated_class(module, node.annotation))
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                container, mapping_part = node.iter, None
                if isinstance(container, ast.Call) and isinstance(container.func, ast.Attribute) \
                        and container.func.attr in ("values", "items") and not container.args:
                    container, mapping_part = container.func.value, container.func.attr
                if not isinstance(container, ast.Name) or container.id not in elements:
                    continue
                element, is_mapping = elements[container.id]
                if mapping_part == "items" and isinstance(node.target, ast.Tuple) and len(node.target.elts) == 2 \
                        and isinstance(node.target.elts[1], ast.Name):
                    bind(node.target.elts[1].id, element)
                elif isinstance(node.target, ast.Name) and (mapping_part == "values" or not is_mapping):
                    bind(node.target.id, element)
        self._locals[key] = found
        return found

    def _element_class(self, module: str, annotation) -> tuple[Definition, bool] | None:
        """``(the class of a container's elements, whether it is a mapping)`` for ``dict[K, Cls]`` /
        ``Mapping[K, Cls]`` / ``list[Cls]`` / ``Sequence[Cls]`` / ``Iterable[Cls]`` / ``set[Cls]`` / ``tuple[Cls,
        ...]`` (``| None`` allowed); None for anything else."""
        if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
            parts = [p for p in (annotation.left, annotation.right)
                     if not (isinstance(p, ast.Constant) and p.value is None)]
            annotation = parts[0] if len(parts) == 1 else None
        if not isinstance(annotation, ast.Subscript):
            return None
        head = (dotted(annotation.value) or "").rsplit(".", 1)[-1]
        inner = annotation.slice
        items = list(inner.elts) if isinstance(inner, ast.Tuple) else [inner]
        if head in ("dict", "Dict", "Mapping", "MutableMapping", "OrderedDict", "defaultdict") and len(items) == 2:
            held, mapping = self._annotated_class(module, items[1]), True
        elif head in ("list", "List", "Sequence", "MutableSequence", "Iterable", "Iterator", "set", "Set", "frozenset",
                      "deque", "Collection") and len(items) == 1:
            held, mapping = self._annotated_class(module, items[0]), False
        elif head in ("tuple", "Tuple") and len(items) == 2 and isinstance(items[1], ast.Constant) \
                and items[1].value is Ellipsis:
            held, mapping = self._annotated_class(module, items[0]), False
        else:
            return None
        return (held, mapping) if isinstance(held, Definition) else None
