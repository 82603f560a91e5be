"""Static behavioural drift: what vllm-omni's code does with vLLM that a newer vLLM no longer accepts, found from the
files of both, before either is installed.

Import drift (``import_drift``) finds names that are gone. This finds what still imports but no longer fits:

* ``call``: a call from vllm-omni into a vLLM function or class (``super().__init__`` and ``super().m`` too, an
  inherited vLLM method called on ``self``, the constructor a vllm-omni class inherits from vLLM, and the one a vLLM
  dataclass, ``msgspec.Struct`` or pydantic ``BaseModel`` generates from its fields, where a field was dropped or
  became required) that no longer binds: a required parameter added, a keyword renamed or removed, too many
  positionals (vLLM 0.25's ``setup_server(args, *, reuse_port)``), a positional-only parameter a call through
  ``**kwargs`` leaves empty; and ``x.a.m(...)`` where ``x.a`` holds a vLLM class (``self.a``: what a base's
  ``__init__`` assigns; a parameter's or local's ``a``: what its class's ``__init__`` assigns) whose ``m`` is gone or
  no longer binds (a method of a manager a scheduler's base creates, removed; a list that became an ``array``);
* ``unpack``: ``a, b, c = f(...)`` where vLLM's ``f`` (an inherited method too) now returns a tuple of another
  length;
* ``abstract``: a vllm-omni class deriving a vLLM class that declares abstract methods it does not define, built by
  vllm-omni or a leaf: it cannot be instantiated (vLLM 0.31 / 0.34's ``EngineClient``);
* ``override``: a vllm-omni method overriding a vLLM one whose signature no longer accepts what the base declares,
  which is how vLLM calls it (``EngineClient.generate(..., session_id=)``, vLLM 0.28);
* ``attribute``: an attribute read that finds nothing: vLLM's code reading it from the objects vllm-omni hands it in
  place of its own (an override's return value, an adapter passed where vLLM annotates its own class) that
  vllm-omni's class does not define (an attribute vLLM 0.26's completion serving reads from every request output,
  which vllm-omni's outputs lacked); vllm-omni reading ``self.x`` that no class of the instance's assigns any more
  (a vLLM base stopped); a vLLM method inherited by a vllm-omni class whose ``__init__`` skips vLLM's reading what
  only that ``__init__`` sets;
* ``unread``: an attribute vllm-omni sets on a vLLM object that nothing reads any more: the behaviour it asks for
  is gone (it starts and runs, differently; a report line).

What is read: every vllm-omni module an entrypoint's imports reach, and the modules of the classes vllm-omni names by
their import path (``"pkg.mod.Cls"``) where their base is reached (``_add_loaded_by_name``).

Differential: the same scan runs against the vLLM the vllm-omni release was made for (``own_vllm``) and only what
is new on the target is reported, so the noise of untyped code (a call the reading gets wrong, on both) never is.
Each finding is followed to the entrypoints whose modules reach its site (``entrypoints.ENTRYPOINTS``, as the
import drift is), and, for ``override`` / ``attribute``, to the vLLM module that calls or reads (its request
endpoint). A call whose ``*args`` / ``**kwargs`` decide whether it binds, a constructor the files cannot tell (an
alias or a validator that reshapes the arguments, a base from a third package), a class with a ``__getattr__``, a
call through an attribute that holds an abstract class that does not take it as declared (whose subclass may) is
counted as undecidable, never as a fit or a failure.

Which drift point handles a finding is the drift points' answer (``DriftPoint.handles_drift``), not this module's.
"""

from __future__ import annotations

import ast
import dataclasses
import re

from ..entrypoints import called, entrypoints_of
from .behaviour_findings import KINDS, BehaviourDrift, Finding  # noqa: F401 - the records, read from here too
from .code_model import CodeModel, Definition, bound_params, dotted, signature, statements
from .import_graph import plugin_graph
from .model import render_params, why_call_fails, why_open_call_fails, why_override_narrows
from .source_tree import SourceTree, children, walk

_SKIPPED_OVERRIDES = frozenset({"__init__", "__new__", "__post_init__", "__init_subclass__", "__class_getitem__"})


# ------------------------------------------------------------------------------------------------ the scan


def _walk(body, cls=None, func=None, cond=""):
    """``(node, enclosing top-level class, enclosing function (the def), condition)`` for every node under ``body``,
    depth first; ``condition`` is the test of the innermost ``if`` (statement or expression) or ``except`` of the
    enclosing function that the node runs under ("" where it runs whenever the function does). A stack, not
    recursion: a cold check walks ~450,000 nodes of vllm-omni this way."""
    stack = [(iter(body), cls, func, cond)]
    while stack:
        nodes, cls, func, cond = stack[-1]
        node = next(nodes, None)
        if node is None:
            stack.pop()
            continue
        yield node, cls, func, cond
        # each node's groups of children pushed last first: they are walked in the order written
        if isinstance(node, ast.ClassDef):
            stack.append((iter(node.body), node if cls is None and func is None else cls, func, ""))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            stack.append((iter(node.decorator_list + node.args.defaults), cls, func, cond))
            stack.append((iter(node.body), cls, node if func is None else func, "" if func is None else cond))
        elif isinstance(node, (ast.If, ast.IfExp)) and func is not None:
            test = _short(ast.unparse(node.test))
            stack.append((iter(node.orelse if isinstance(node.orelse, list) else [node.orelse]), cls, func,
                          f"not ({test})"))
            stack.append((iter(node.body if isinstance(node.body, list) else [node.body]), cls, func, test))
            stack.append((iter([node.test]), cls, func, cond))
        elif isinstance(node, ast.ExceptHandler) and func is not None:
            stack.append((iter(node.body), cls, func, "an exception is handled"))
        elif kids := children(node):
            stack.append((iter(kids), cls, func, cond))


def _walked(tree) -> list:
    """``_walk(tree.body)`` as a list, kept on the module's parsed tree: what it yields depends on the tree alone,
    and a plan's rows walk the same vllm-omni modules (~450,000 nodes) once per vLLM release."""
    found = tree.__dict__.get("_scan_walked")
    if found is None:
        found = tree._scan_walked = list(_walk(tree.body))
    return found


def _module_classes(body):
    """The classes a module defines outside functions and classes (in ``if`` / ``try`` blocks too)."""
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for name in ("body", "orelse", "finalbody", "handlers"):
                yield from _module_classes(getattr(node, name, None) or [])


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


class _Scan:
    """One pass over the plugin modules an entrypoint reaches, against one host tree."""

    def __init__(self, model: CodeModel, modules: dict[str, set[str]], host_modules: dict[str, set[str]]):
        self.model = model
        self.modules = modules  # plugin module -> ids of the entrypoints reaching it
        self.host_modules = host_modules  # host module the plugin imports -> ids of the entrypoints importing it
        self.findings: list[Finding] = []
        self.checked = self.undecidable = 0
        # plugin function -> {the plugin functions / classes it calls: the condition of the call ("" none)}
        self.calls: dict[str, dict[str, str]] = {}
        self.held: dict[str, dict[str, Definition]] = {}  # plugin class -> {self attribute: plugin class}
        self.classes: list[Definition] = []  # the plugin's top-level classes in the modules read
        self.owners: dict = {}  # (vLLM module, class) -> (plugin subclasses, self-callers, methods decided)
        self.built: set[str] = set()  # the plugin classes its functions build (``Cls(...)``): instantiated
        self.reported: set[tuple] = set()  # (plugin class, vLLM object) of the attribute findings made
        self.readers: dict[tuple, int] = {}  # the same key -> its finding's index, where vllm-omni's code reads it
        self.writes: dict[str, list[tuple]] = {}  # attribute -> where vllm-omni sets it on a vLLM object (_write)
        self.subclasses: dict[str, list[Definition]] | None = None  # class path -> plugin classes deriving it
        self.memo: dict = {}  # per class / method node: _sets_by_name's and _self_reads' answers

    def run(self) -> list[Finding]:
        trees = {module: tree for module in sorted(self.modules)
                 if (tree := self.model.module_ast(module)) is not None}
        # the classes first: a call through an attribute asks which of them derive the class it holds
        self.classes = classes = [Definition("plugin", module, node.name, node) for module, tree in trees.items()
                                  for node in _module_classes(tree.body)]
        for module, tree in trees.items():
            for node, cls, func, cond in _walked(tree):
                if isinstance(node, ast.Call):
                    self._call(module, node, cls, func, cond)
                    if func is not None:
                        self._edge(module, node, cls, func, cond)
                elif isinstance(node, ast.Assign):
                    self._unpack(module, node, cls, func, cond)
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and func is not None:
                    self._write(module, node, cls, func, cond)
        parents = {base.path for c in classes for base in self.model.mro(c)[1:] if isinstance(base, Definition)}
        for cls in classes:
            self._class(cls, is_leaf=cls.path not in parents or cls.path in self.built)
        self._unread()
        return self.findings

    # ------------------------------------------------------------------------------------------ writes

    def _write(self, module: str, node, cls, func, cond: str) -> None:
        """Record ``x.<attribute> = ...`` where ``x`` is a parameter or local holding a vLLM class (or a vllm-omni
        subclass of one): state vllm-omni hands to vLLM through its object (``_unread`` decides)."""
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        types = None
        for target in targets:
            if not isinstance(target, ast.Attribute) or not isinstance(target.value, ast.Name) \
                    or target.value.id in ("self", "cls"):
                continue
            types = self.model.local_types(module, cls, func) if types is None else types
            held = types.get(target.value.id)
            host = next((c for c in self.model.mro(held) if isinstance(c, Definition) and c.side == "host"), None) \
                if held is not None else None
            if host is not None:
                self.writes.setdefault(target.attr, []).append((host, module, cls, func, node.lineno, cond))

    def _unread(self) -> None:
        """``unread``: an attribute vllm-omni sets on a vLLM object (``_write``) that no file of either package reads
        (``.name`` other than as an assignment's target, or ``"name"`` for ``getattr``): the write changes nothing.
        Against vllm-omni's own vLLM, which read it, only what vLLM stopped reading is new: a behaviour vllm-omni
        asks for that vLLM no longer has (it starts and runs, differently)."""
        if not self.writes:
            return
        names = "|".join(sorted(map(re.escape, self.writes)))
        read = re.compile(rf"""\.({names})\b(?!\s*=(?!=))|["']({names})["']""")
        seen: set[str] = set()
        for side in ("plugin", "host"):
            for _, text in self.model.texts(side):
                if any(name in text for name in self.writes.keys() - seen):
                    seen.update(a or b for a, b in read.findall(text))
                if seen >= self.writes.keys():
                    return
        for attribute in sorted(self.writes.keys() - seen):
            for host, module, cls, func, line, cond in self.writes[attribute][:1]:
                self.checked += 1
                self._add("unread", f"{host.path}.{attribute}", _where(module, cls, func), module, line,
                          f"sets .{attribute} on a {host.name}, which nothing reads any more (neither vLLM nor "
                          f"vllm-omni): what it asks of vLLM no longer happens", (attribute,), condition=cond)

    # ------------------------------------------------------------------------------------ startup paths

    def _edge(self, module: str, node: ast.Call, cls, func, cond: str) -> None:
        """Record what a call inside plugin function ``func`` (its def) runs of the plugin's own code: a function, a
        class's constructor (and the class as built), a method of its own class (``self.m()``, ``super().m()``), a
        class picked into a local first (``out_cls = A if test else B; out_cls(...)``)."""
        caller = ".".join(p for p in (module, cls.name if cls is not None else None, func.name) if p)
        callee = node.func
        targets = self.calls.setdefault(caller, {})
        here = Definition("plugin", module, cls.name, cls) if cls is not None else None
        if isinstance(callee, ast.Name) and callee.id in (picked := self._picked_classes(module, func)):
            for built, picked_when in picked[callee.id]:
                self._built_edge(targets, built, picked_when or cond)
            return
        if isinstance(callee, ast.Attribute) and isinstance(callee.value, ast.Name) \
                and callee.value.id in ("self", "cls") and here is not None:
            found = self.model.member(here, callee.attr)
        elif isinstance(callee, ast.Attribute) and isinstance(callee.value, ast.Attribute) \
                and isinstance(callee.value.value, ast.Name) and callee.value.value.id == "self" and here is not None:
            held = self._held(here).get(callee.value.attr)  # self.runtime.initialize(): what self.runtime holds
            found = self.model.member(held, callee.attr) if held is not None else None
        elif isinstance(callee, ast.Attribute) and isinstance(callee.value, ast.Call) \
                and dotted(callee.value.func) == "super" and here is not None:
            found = self.model.member(here, callee.attr, after=here)
        else:
            written = dotted(callee)
            found = self.model.resolve_expr(module, written) if written else None
        # functions handed over as arguments (a process target, a callback) run too
        for argument in [*node.args, *(k.value for k in node.keywords)]:
            written = dotted(argument) if isinstance(argument, (ast.Name, ast.Attribute)) else None
            if written and written.count(".") == 1 and written.startswith("self.") and here is not None:
                passed = self.model.member(here, written[5:])  # threading.Thread(target=self._run)
            else:
                passed = self.model.resolve_expr(module, written) if written and "self" not in written else None
            if isinstance(passed, Definition) and passed.side == "plugin" and not passed.is_class:
                _add_edge(targets, passed.path, cond)  # a class handed over is not built (isinstance(x, Cls))
        if isinstance(found, Definition) and found.side == "plugin":
            self._built_edge(targets, found, cond)

    def _built_edge(self, targets: dict[str, str], found: Definition, cond: str) -> None:
        """A call of the plugin's function or class ``found``: the class counts as built, its constructor runs."""
        _add_edge(targets, found.path, cond)
        if found.is_class:
            self.built.add(found.path)
        init = self.model.constructor(found)[0] if found.is_class else None
        if init is not None and init.side == "plugin":
            _add_edge(targets, init.path, cond)

    def _picked_classes(self, module: str, func) -> dict[str, list[tuple[Definition, str]]]:
        """``{local name: [(plugin class, the test it is picked under: "" always)]}`` for each plain local of
        ``func`` assigned one class name, or one of two (``A if test else B``), and nothing else."""
        key = ("picked", id(func))
        if key not in self.memo:
            picked: dict[str, list] = {}
            assigned: dict[str, int] = {}
            for node in walk(func):
                if not isinstance(node, ast.Assign):
                    continue
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned[target.id] = assigned.get(target.id, 0) + 1
                if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
                    continue
                value = node.value
                test = _short(ast.unparse(value.test)) if isinstance(value, ast.IfExp) else ""
                options = [(value.body, test), (value.orelse, f"not ({test})")] if test else [(value, "")]
                classes = []
                for option, picked_when in options:
                    written = dotted(option) if isinstance(option, (ast.Name, ast.Attribute)) else None
                    found = self.model.resolve_expr(module, written) if written else None
                    if isinstance(found, Definition) and found.is_class and found.side == "plugin":
                        classes.append((found, picked_when))
                if classes:
                    picked[node.targets[0].id] = classes
            self.memo[key] = {name: classes for name, classes in picked.items() if assigned.get(name) == 1}
        return self.memo[key]

    def _held(self, cls: Definition) -> dict[str, Definition]:
        """``{attribute: plugin class}`` for the ``self.x = Cls(...)`` assignments of ``cls``'s methods (and its
        plugin bases'): what ``self.x.m()`` calls."""
        if cls.path not in self.held:
            found: dict[str, Definition] = {}
            for candidate in reversed(self.model.mro(cls)):
                if not isinstance(candidate, Definition) or candidate.side != "plugin":
                    continue
                for node in statements(candidate.node.body):
                    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                        written = dotted(node.value.func)
                        built = self.model.resolve_expr(candidate.module, written) if written else None
                        if isinstance(built, Definition) and not built.is_class and built.side == "plugin":
                            built = self._returned_class(built)  # self.runtime = create_runtime(...)
                        if isinstance(built, Definition) and built.is_class and built.side == "plugin":
                            for target in node.targets:
                                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                                        and target.value.id == "self":
                                    found[target.attr] = built
            self.held[cls.path] = found
        return self.held[cls.path]

    def _returned_class(self, func: Definition) -> Definition | None:
        """The plugin class a plugin factory function's return annotation names."""
        returns = getattr(func.node, "returns", None)
        written = dotted(returns) if isinstance(returns, (ast.Name, ast.Attribute)) else None
        found = self.model.resolve_expr(func.module, written) if written else None
        return found if isinstance(found, Definition) and found.is_class else None

    def startup_paths(self, roots: dict[str, tuple[str, ...]]) -> dict[str, dict[str, str]]:
        """``{entrypoint id: {plugin function or class built: condition}}`` for what its start runs: the root
        functions themselves (``Entrypoint.runs``), and everything they and the functions and the constructors of
        the classes of its root modules call of the plugin's own code,
        transitively (through ``self.m()`` and ``self.x.m()`` where ``self.x`` holds a plugin class it built; calls
        on other objects are not followed: what they run counts as "when used"). The condition is "" where every
        call on the way runs whenever its caller does, else the first ``if`` test on the way (a path without one
        wins)."""
        found = {}
        for entrypoint, modules in roots.items():
            reached = {caller: "" for caller in self.calls if caller in modules or caller.rpartition(".")[0] in modules
                       or (caller.endswith(".__init__") and caller.rsplit(".", 2)[0] in modules)}
            todo = list(reached)
            while todo:
                caller = todo.pop()
                for target, cond in self.calls.get(caller, {}).items():
                    cond = cond or reached[caller]  # the innermost test on the way: the most specific
                    if target not in reached or (reached[target] and not cond):
                        reached[target] = cond
                        todo.append(target)
            found[entrypoint] = reached
        return found

    def _add(self, kind, vllm_object, plugin_object, module, line, detail, names=(), via=None, **more):
        reach = self.modules.get(module, set())
        if via is not None:
            reach = reach & self.host_modules.get(via, set())
        self.findings.append(Finding(kind, vllm_object, plugin_object, module, line, detail, tuple(names), via,
                                     tuple(sorted(reach)), **more))

    # -------------------------------------------------------------------------------------------- calls

    def _callee(self, module: str, node: ast.Call, cls) -> tuple[Definition | None, str]:
        """(the host function a call binds against, how vllm-omni names it), or (None, "") when it is not a
        call into vLLM (or cannot be told: counted as undecidable where it is one)."""
        func = node.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) \
                and dotted(func.value.func) == "super" and cls is not None:
            here = Definition("plugin", module, cls.name, cls)
            target = self.model.member(here, func.attr, after=here)
            if target is None:
                if any(isinstance(b, Definition) and b.side == "host" for b in self.model.mro(here)):
                    self.undecidable += 1
                return None, ""
            return (target, f"super().{func.attr}") if target.side == "host" else (None, "")
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in ("self", "cls") \
                and cls is not None:
            # an inherited vLLM method called on the instance (a subclass's override of it is vllm-omni's own)
            here = Definition("plugin", module, cls.name, cls)
            target = self.model.member(here, func.attr)
            if target is None or target.side != "host" or self._overridden_by_plugin(here, func.attr):
                return None, ""
            if func.value.id == "cls" and not {(dotted(d) or "").rsplit(".", 1)[-1] for d in
                                               target.node.decorator_list} & {"staticmethod", "classmethod"}:
                return None, ""
            return target, f"{func.value.id}.{func.attr}"
        written = dotted(func)
        if written is None or written.split(".")[0] in ("self", "cls", "super"):
            return None, ""
        resolved = self.model.resolve_expr(module, written)
        if not isinstance(resolved, Definition):
            if resolved is None and self._names_host(module, written):
                self.undecidable += 1
            return None, ""
        if resolved.is_class:
            init, why = self.model.constructor(resolved)
            if init is None:
                if resolved.side == "host" or any(isinstance(c, Definition) and c.side == "host"
                                                  for c in self.model.mro(resolved)):
                    self.undecidable += 1
                return None, ""
            return (init, written) if init.side == "host" else (None, "")
        if resolved.side != "host":
            return None, ""
        if "." in resolved.name:  # Cls.method: only static and class methods are called through the class
            kinds = {d.rsplit(".", 1)[-1] for d in (dotted(x) for x in resolved.node.decorator_list) if d}
            if not kinds & {"staticmethod", "classmethod"}:
                return None, ""
        return resolved, written

    def _may_hold_a_subclass(self, holder: Definition, method: str) -> bool:
        """Whether what an attribute typed ``holder`` holds may answer ``method`` otherwise than ``holder`` does: an
        abstract class or a protocol (the object is a subclass: a client interface the plugin implements), or a
        class a vllm-omni subclass of which defines ``method``."""
        if self.model.abstract_left(holder)[0] or any(
                c in ("Protocol", "typing.Protocol", "typing_extensions.Protocol") for c in self.model.mro(holder)):
            return True
        return self._overridden_by_plugin(holder, method)

    def _overridden_by_plugin(self, holder: Definition, method: str) -> bool:
        """Whether a vllm-omni subclass of ``holder`` defines ``method`` (what an attribute typed ``holder`` holds may
        be that subclass)."""
        return any((found := self.model.member(c, method)) is not None and found.side == "plugin"
                   for c in self._subclasses(holder))

    def _subclasses(self, holder: Definition) -> list[Definition]:
        """The vllm-omni classes read whose walk has ``holder`` after themselves."""
        if self.subclasses is None:
            self.subclasses = {}
            for c in self.classes:
                for b in self.model.mro(c)[1:]:
                    if isinstance(b, Definition):
                        self.subclasses.setdefault(b.path, []).append(c)
        return self.subclasses.get(holder.path, [])

    def _names_host(self, module: str, written: str) -> bool:
        binding = self.model.bindings(module).get(written.split(".")[0])
        return binding is not None and binding[0] in ("import", "module") and \
            self.model.side_of(binding[1]) == "host"

    def _call(self, module: str, node: ast.Call, cls, func, cond: str) -> None:
        target, written = self._held_callee(module, node, cls, func, cond)
        if target is None:
            target, written = self._callee(module, node, cls)
        if target is None:
            return
        params = bound_params(target.node) if "." in target.name else signature(target.node)
        if params is None:
            return
        keywords = tuple(k.arg for k in node.keywords if k.arg is not None)
        star_args = any(isinstance(a, ast.Starred) for a in node.args)
        star_kwargs = any(k.arg is None for k in node.keywords)
        positional = sum(1 for a in node.args if not isinstance(a, ast.Starred))
        if star_args or star_kwargs:
            why, decided = why_open_call_fails(params, positional, keywords, star_args, star_kwargs,
                                               _positional_only(target, params))
            decided = decided or _forwards(node, func, target)  # passes on what vLLM called the override with
            if not decided:
                self.undecidable += 1
                return
        else:
            why = why_call_fails(params, positional, keywords)
        self.checked += 1
        self._arguments(module, node, cls, func, target, params)
        if why is None:
            return
        names = _names_in(why, params, keywords)
        self._add("call", target.path, _where(module, cls, func), module, node.lineno, f"{written}(...) {why}",
                  names, signature=f"{target.name.rsplit('.', 1)[-1]}{render_params(params)}", condition=cond,
                  call_shape=_call_shape(node))

    def _held_callee(self, module: str, node: ast.Call, cls, func, cond: str) -> tuple[Definition | None, str]:
        """For ``<name>.<attribute>.<method>(...)`` where ``<name>.<attribute>`` holds a vLLM class (``self``: the one
        a vLLM base's ``__init__`` assigns it; a parameter or local of a known class: the one that class's methods
        assign: ``CodeModel.attribute_class``): (the vLLM method it binds against, how vllm-omni writes the call).
        (None, "") for any other call, and where this decides it here: a method the class does not have is a finding
        (a class deriving one of the standard library's answers from it: ``CodeModel.outside_has``); an abstract
        holder, one whose bases the files cannot read, or an attribute a vllm-omni subclass of a vLLM class assigns
        too is undecidable; a vllm-omni method is not a call into vLLM."""
        callee = node.func
        if func is None or not isinstance(callee, ast.Attribute) or not isinstance(callee.value, ast.Attribute) \
                or not isinstance(callee.value.value, ast.Name):
            return None, ""
        name, attribute, method = callee.value.value.id, callee.value.attr, callee.attr
        if name == "self":
            if cls is None:
                return None, ""
            owner = Definition("plugin", module, cls.name, cls)
        else:
            owner = self.model.local_types(module, cls, func).get(name)
            if owner is None or name in ("cls", "super"):
                return None, ""
            if owner.side == "host" and any(attribute in self.model.own_attributes(c) for c in self._subclasses(owner)):
                self.undecidable += 1  # vllm-omni's subclass, which the object may be, sets it its own way
                return None, ""
        holder = self.model.attribute_class(owner, attribute)
        host = next((c for c in self.model.mro(holder) if isinstance(c, Definition) and c.side == "host"), None) \
            if holder is not None else None
        if host is None:
            return None, ""
        written = f"{name}.{attribute}.{method}"
        target = self.model.member(holder, method)
        if self._may_hold_a_subclass(holder, method):
            # a subclass answers: a call that binds to what the abstract class declares binds to its implementations
            # (they take at least that); one that does not may still bind to the one the object is
            params = bound_params(target.node) if target is not None and target.side == "host" else None
            if params is None or any(isinstance(a, ast.Starred) for a in node.args) or any(
                    k.arg is None for k in node.keywords) or why_call_fails(
                    params, len(node.args), tuple(k.arg for k in node.keywords)) is not None \
                    or self._overridden_by_plugin(holder, method):
                self.undecidable += 1
                return None, ""
        if target is not None:
            return (target, written) if target.side == "host" else (None, "")
        names, complete = self.model.instance_attributes(holder)
        if method in names:
            return None, ""  # an attribute, not a method the files define: its call is not read
        if not complete:
            outside = self.model.outside_has(holder, method) if "__getattr__" not in names else None
            if outside is None:
                self.undecidable += 1
            if outside is not False:
                return None, ""
        self.checked += 1
        self._add("call", f"{host.path}.{method}", _where(module, cls, func), module, node.lineno,
                  f"{written}(...): {holder.name} (what {name}.{attribute} holds) has no method {method}", (method,),
                  condition=cond, call_shape=_call_shape(node))
        return None, ""

    def _arguments(self, module: str, node: ast.Call, cls, func, target: Definition, params) -> None:
        """Attributes vLLM's ``target`` reads from a parameter it annotates with a vLLM class, where vllm-omni passes
        an object of a vllm-omni class that does not derive it (a duck-typed stand-in: an adapter that plays a
        vLLM request) and that defines no such attribute, while vLLM's class does."""
        types = self.model.local_types(module, cls, func) if func is not None else {}
        if not types or not isinstance(target.node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return
        leading = [p.name for p in params if p.kind == "positional"]
        passed = [(leading[i], a) for i, a in enumerate(node.args) if i < len(leading)
                  and not any(isinstance(b, ast.Starred) for b in node.args[: i + 1])]
        passed += [(k.arg, k.value) for k in node.keywords if k.arg is not None]
        annotations = {a.arg: a.annotation for a in (*target.node.args.posonlyargs, *target.node.args.args,
                                                     *target.node.args.kwonlyargs)}
        for param, argument in passed:
            ours = types.get(argument.id) if isinstance(argument, ast.Name) and argument.id != "self" else None
            if ours is None or ours.side != "plugin" or annotations.get(param) is None:
                continue
            expected = self.model._annotated_class(target.module, annotations[param])
            if not isinstance(expected, Definition) or expected.side != "host" or any(
                    isinstance(b, Definition) and b.path == expected.path for b in self.model.mro(ours)):
                continue
            theirs, _ = self.model.instance_attributes(expected)
            has, complete = self.model.instance_attributes(ours)
            if not complete:
                self.undecidable += 1
                continue
            for read in walk(target.node):
                if isinstance(read, ast.Attribute) and isinstance(read.ctx, ast.Load) \
                        and isinstance(read.value, ast.Name) and read.value.id == param \
                        and read.attr in theirs and read.attr not in has \
                        and (ours.path, f"{expected.path}.{read.attr}") not in self.reported:
                    self.reported.add((ours.path, f"{expected.path}.{read.attr}"))
                    self._add("attribute", f"{expected.path}.{read.attr}", ours.path, ours.module, ours.node.lineno,
                              f"vLLM's {target.name} reads .{read.attr} ({target.module}:{read.lineno}) from the "
                              f"{ours.name} vllm-omni passes as its {param} in place of {expected.name}, which does "
                              f"not define it (in {_where(module, cls, func)}:{node.lineno})", (read.attr,),
                              target.module)

    def _unpack(self, module: str, node: ast.Assign, cls, func, cond: str) -> None:
        """``a, b, c = f(...)`` where ``f`` is a vLLM function or method (an inherited ``self.m``, ``super().m``, a
        function or a class's static method) whose every ``return`` gives a tuple of one other length: unpacking
        it raises ValueError."""
        target = node.targets[0] if len(node.targets) == 1 else None
        if not isinstance(target, (ast.Tuple, ast.List)) or not isinstance(node.value, ast.Call) \
                or any(isinstance(e, ast.Starred) for e in target.elts):
            return
        callee, written = self._returning(module, node.value, cls)
        arities = _returned_arities(callee.node) if callee is not None else None
        if not arities or len(arities) != 1:
            return
        (arity,) = arities
        self.checked += 1
        if arity == len(target.elts):
            return
        self._add("unpack", callee.path, _where(module, cls, func), module, node.lineno,
                  f"{len(target.elts)} values unpacked from {written}(...), which returns {arity}",
                  (callee.name.rsplit(".", 1)[-1],), condition=cond, call_shape=str(len(target.elts)))

    def _returning(self, module: str, call: ast.Call, cls) -> tuple[Definition | None, str]:
        """The vLLM def a call's value comes from, for ``_unpack`` (None where it is not one, or may be vllm-omni's
        override on a subclass the object is)."""
        func = call.func
        here = Definition("plugin", module, cls.name, cls) if cls is not None else None
        found = None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self" \
                and here is not None:
            found = self.model.member(here, func.attr)
            if found is not None and self._may_hold_a_subclass(here, func.attr):
                return None, ""
        elif isinstance(func, ast.Attribute) and isinstance(func.value, ast.Call) \
                and dotted(func.value.func) == "super" and here is not None:
            found = self.model.member(here, func.attr, after=here)
        elif (written := dotted(func)) is not None and written.split(".")[0] not in ("self", "cls", "super"):
            resolved = self.model.resolve_expr(module, written)
            if isinstance(resolved, Definition) and not resolved.is_class and ("." not in resolved.name or {
                    (dotted(d) or "").rsplit(".", 1)[-1] for d in resolved.node.decorator_list} & {
                    "staticmethod", "classmethod"}):
                found = resolved
        if not isinstance(found, Definition) or found.side != "host" or found.is_class:
            return None, ""
        return found, ast.unparse(func)

    # ------------------------------------------------------------------------------------------ classes

    def _class(self, cls: Definition, is_leaf: bool) -> None:
        mro = self.model.mro(cls)
        if not any(isinstance(c, Definition) and c.side == "host" for c in mro):
            return
        self.checked += 1
        if is_leaf:
            left, _complete = self.model.abstract_left(cls)
            for name, declaring in left:
                if declaring.side == "host":
                    self._add("abstract", f"{declaring.path}.{name}", cls.path, cls.module, cls.node.lineno,
                              f"abstract in {declaring.name}, not defined by {cls.name}: {cls.name}(...) raises "
                              "TypeError", (name,))
        for name, method in self.model.methods(cls).items():
            if name in _SKIPPED_OVERRIDES:
                continue
            base = self.model.member(cls, name, after=cls)
            if base is None or base.side != "host":
                continue
            base_params, params = bound_params(base.node), bound_params(method)
            if base_params is None or params is None:
                continue
            self.checked += 1
            through_instances = not {d.rsplit(".", 1)[-1] for d in map(dotted, base.node.decorator_list) if d} & {
                "classmethod", "staticmethod"}  # vLLM calls its own class's, not this override
            for param, why in why_override_narrows(base_params, params):
                via = self._caller_of(name, param) if through_instances else None
                self._add("override", base.path, f"{cls.path}.{name}", cls.module, method.lineno,
                          f"{cls.name}.{name} {why}, which vLLM's base declares"
                          + (f" and {via} passes" if via else ""), (param,), via)
            self._stand_in(cls, base, method)
        self._unset(cls, mro)

    def _cached(self, function, node):
        key = (function.__name__, id(node))
        if key not in self.memo:
            self.memo[key] = function(node)
        return self.memo[key]

    def _unset(self, cls: Definition, mro) -> None:
        """Attributes read from ``self`` of a vllm-omni class deriving a vLLM class that its instances never get:

        * read by vllm-omni's own methods (its class's or a vllm-omni base's) where no class on the walk assigns,
          declares or defines them any more (a vLLM base's ``__init__`` stopped assigning one);
        * read by a vLLM method it inherits where only an ``__init__`` it never runs assigns them: a vllm-omni
          ``__init__`` on the way that calls neither ``super().__init__`` nor the base's, so every ``__init__``
          after it on the walk is skipped.

        A read under ``hasattr(self, name)`` / ``getattr(self, name, default)`` in the same function is not one; a
        walk the files cannot read whole, or a class that sets attributes by name (``setattr(self, ...)``,
        ``self.__dict__``, ``__getattr__``), is left alone."""
        classes = [c for c in mro if isinstance(c, Definition)]
        if any(not isinstance(c, Definition) and c not in _TRIVIAL for c in mro) or any(
                self._cached(_sets_by_name, c.node) for c in classes):
            return
        skipped = _skipped_inits(self.model, cls, mro)
        has: set[str] = set()
        init_only: dict[str, Definition] = {}  # attribute -> the skipped __init__'s class that alone assigns it
        for c in classes:
            own = self.model.own_attributes(c)
            if c.path in skipped:
                rest = _assigned_outside_init(c.node)
                for name in own - rest:
                    init_only.setdefault(name, c)
                own = rest
            has |= own
        if "__getattr__" in has or "__getattribute__" in has:
            return
        first_host = next(c for c in classes if c.side == "host")
        running = {}  # (method name, class) -> the def that runs: the first on the walk, and vLLM's under super()
        extended = {name for c in classes if c.side == "plugin" for name, m in self.model.methods(c).items()
                    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
                           and isinstance(n.func.value, ast.Call) and dotted(n.func.value.func) == "super"
                           for n in walk(m))}
        seen: set[str] = set()
        for c in classes:
            for name in self.model.methods(c):
                if name not in seen or (c.side == "host" and name in extended):
                    running[(name, c.path)] = c
                seen.add(name)
        for (name, _), owner in sorted(running.items()):
            method = self.model.methods(owner)[name]
            if owner.side == "host" and not init_only:
                continue
            for attribute, line in self._cached(_self_reads, method):
                if attribute.startswith("__") and attribute.endswith("__"):
                    continue  # every object's (__class__, __dict__)
                if attribute in has:
                    continue
                if owner.side == "host" and attribute not in init_only:
                    continue  # vLLM's own business, as on its own classes
                where = init_only.get(attribute, first_host)
                key = (cls.path, f"{where.path}.{attribute}")
                reader = f"{owner.path}.{name}" if owner.side == "plugin" else ""
                if key in self.reported:  # one finding an attribute; each vllm-omni function reading it noted
                    found = self.readers.get(key)
                    if found is not None and reader and reader not in self.findings[found].readers:
                        self.findings[found] = dataclasses.replace(
                            self.findings[found], readers=(*self.findings[found].readers, reader))
                    continue
                self.reported.add(key)
                self.readers[key] = len(self.findings)
                if attribute in init_only:
                    detail = (f"vLLM's {owner.name}.{name} ({owner.module}:{line}) reads self.{attribute}, which only "
                              f"{where.name}.__init__ assigns, and {cls.name} never runs that __init__")
                else:
                    detail = (f"{owner.name}.{name} reads self.{attribute} ({owner.module}:{line}), which no class of "
                              f"{cls.name}'s (vLLM's {first_host.name} included) assigns or defines")
                self._add("attribute", f"{where.path}.{attribute}", cls.path,
                          owner.module if owner.side == "plugin" else cls.module,
                          line if owner.side == "plugin" else cls.node.lineno, detail, (attribute,),
                          owner.module if owner.side == "host" else None, readers=(reader,) if reader else ())

    def _host_sources(self, needle: str):
        """``(host module, parsed)`` of the vLLM modules the plugin imports whose text holds ``needle``."""
        for module in sorted(self.host_modules):
            relpath = self.model.module_file(module)
            text = self.model.read("host", relpath) if relpath else None
            if text and needle in text:
                parsed = self.model.module_ast(module)
                if parsed is not None:
                    yield module, parsed

    def _caller_of(self, method: str, keyword: str) -> str | None:
        """The first vLLM module the plugin imports that calls ``.method(..., keyword=...)``."""
        for module, parsed in self._host_sources(f"{keyword}="):
            for node in walk(parsed):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr == method and any(k.arg == keyword for k in node.keywords):
                    return module
        return None

    def _stand_in(self, cls: Definition, base: Definition, method) -> None:
        """Attributes vLLM reads from what ``method`` returns in place of what vLLM's ``base`` returns."""
        theirs, ours = base.node.returns, method.returns
        if theirs is None or ours is None:
            return
        for host_cls in self._classes_in(base.module, theirs, "host"):
            for plugin_cls in self._classes_in(cls.module, ours, "plugin"):
                if any(isinstance(c, Definition) and c.path == host_cls.path for c in self.model.mro(plugin_cls)):
                    continue  # a subclass has what its base has
                self._attributes(host_cls, plugin_cls)

    def _skipped_by_plugin(self, module: str, owner: str, method: str, parsed: ast.Module) -> bool:
        """Whether vLLM's ``module.owner.method`` never runs for vllm-omni's objects: a vllm-omni class deriving
        ``owner`` defines ``method`` itself, or every ``self.method()`` call of ``owner`` sits in methods that never
        run (a helper of an overridden method). A method nothing of ``owner`` calls runs (vLLM calls it)."""
        key = (module, owner)
        if key not in self.owners:
            path = f"{module}.{owner}"
            subclasses = [c for c in self.classes
                          if any(isinstance(b, Definition) and b.path == path for b in self.model.mro(c)[1:])]
            callers: dict[str, set[str]] = {}  # method -> the methods of owner that call it through self
            cls_node = next((n for n in parsed.body if isinstance(n, ast.ClassDef) and n.name == owner), None)
            for item in (cls_node.body if cls_node is not None and subclasses else ()):
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    for node in walk(item):
                        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                                and isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
                            callers.setdefault(node.func.attr, set()).add(item.name)
            self.owners[key] = (subclasses, callers, {})
        return bool(self.owners[key][0]) and self._never_runs(key, method, frozenset())

    def _never_runs(self, key: tuple, name: str, seen: frozenset) -> bool:
        """``_skipped_by_plugin`` for method ``name`` of ``key``'s class, asked through the methods calling it."""
        subclasses, callers, known = self.owners[key]
        if name not in known:
            overridden = any((found := self.model.member(c, name)) is not None and found.side == "plugin"
                             for c in subclasses)
            calling = callers.get(name, set()) - seen
            known[name] = overridden or (bool(calling) and all(self._never_runs(key, c, seen | {name})
                                                               for c in calling))
        return known[name]

    def _classes_in(self, module: str, annotation, side: str) -> list[Definition]:
        """The classes of ``side`` an annotation names (string forward references read too)."""
        found = []
        nodes = list(walk(annotation))
        for node in list(nodes):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                try:
                    nodes += list(ast.walk(ast.parse(node.value, mode="eval")))  # a passing tree: nothing kept on it
                except SyntaxError:
                    continue
        for node in nodes:
            written = dotted(node) if isinstance(node, (ast.Name, ast.Attribute)) else None
            resolved = self.model.resolve_expr(module, written) if written else None
            if isinstance(resolved, Definition) and resolved.is_class and resolved.side == side \
                    and resolved not in found:
                found.append(resolved)
        return found

    def _attributes(self, host_cls: Definition, plugin_cls: Definition) -> None:
        theirs, _ = self.model.instance_attributes(host_cls)
        ours, complete = self.model.instance_attributes(plugin_cls)
        if not complete:
            self.undecidable += 1
            return
        self.checked += 1
        reported = set()
        for module, parsed in self._host_sources(host_cls.name):
            for attribute, line, owner, method in _reads_of(parsed, host_cls.name):
                if owner is not None and self._skipped_by_plugin(module, owner, method, parsed):
                    continue  # vllm-omni's subclass runs its own method instead of this one
                if attribute in theirs and attribute not in ours and not attribute.startswith("_") \
                        and attribute not in reported:
                    reported.add(attribute)
                    self._add("attribute", f"{host_cls.path}.{attribute}", plugin_cls.path, plugin_cls.module,
                              plugin_cls.node.lineno,
                              f"vLLM reads .{attribute} ({module}:{line}) from the {plugin_cls.name} it gets in "
                              f"place of {host_cls.name}, which does not define it",
                              (attribute,), module)


def _where(module: str, cls, func) -> str:
    """The dotted vllm-omni function a site is in (``module.Cls.method``; ``func`` a def or its name)."""
    name = getattr(func, "name", func)
    return ".".join(p for p in (module, cls.name if cls is not None else None, name) if p)


def _call_shape(node: ast.Call) -> str:
    """What a call passes, "<positionals>:<keywords>" (``Finding.call_shape``)."""
    return f"{len(node.args)}:{','.join(sorted(k.arg or '**' for k in node.keywords))}"


_TRIVIAL = frozenset({"object", "ABC", "abc.ABC", "Generic", "typing.Generic", "Protocol", "typing.Protocol"})


def _sets_by_name(cls_node) -> bool:
    """Whether a class body sets instance attributes by name: ``setattr(self, ...)``, ``self.__dict__``,
    ``vars(self)``, ``__slots__``-free tricks the files cannot follow. A ``setattr(self, name, ...)`` whose name is a
    literal, or checked against a literal set of names first (``if name not in {"a", "b"}: raise``: vLLM's
    ``GPUModelRunner.update_config``), sets nothing unknown."""
    for function in [n for n in walk(cls_node) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        allowed = _allowlisted_names(function)
        for node in walk(function):
            if isinstance(node, ast.Call) and dotted(node.func) in ("setattr", "vars", "object.__setattr__") and \
                    node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "self":
                name = node.args[1] if len(node.args) > 1 else None
                if not (isinstance(name, ast.Constant) or isinstance(name, ast.Name) and name.id in allowed):
                    return True
            if isinstance(node, ast.Attribute) and node.attr == "__dict__" and isinstance(node.value, ast.Name) \
                    and node.value.id == "self":
                return True
    return False


def _allowlisted_names(function) -> set[str]:
    """The variables ``function`` refuses unless in a literal set of names: ``if x not in <a literal, or a name
    bound to one>:`` whose body ends in raise, return or continue."""
    literals = {t.id for n in walk(function) if isinstance(n, ast.Assign) and _literal_names(n.value)
                for t in n.targets if isinstance(t, ast.Name)}
    found = set()
    for node in walk(function):
        test = node.test if isinstance(node, ast.If) else None
        if isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and len(test.ops) == 1 \
                and isinstance(test.ops[0], ast.NotIn) and node.body \
                and isinstance(node.body[-1], (ast.Raise, ast.Return, ast.Continue)) \
                and (_literal_names(test.comparators[0]) or dotted(test.comparators[0]) in literals):
            found.add(test.left.id)
    return found


def _literal_names(node) -> bool:
    """Whether ``node`` is a literal set, tuple or list of strings."""
    return isinstance(node, (ast.Set, ast.Tuple, ast.List)) and bool(node.elts) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)


def _skipped_inits(model: CodeModel, cls: Definition, mro) -> set[str]:
    """The classes on ``cls``'s walk whose ``__init__`` never runs for an instance of it: those after a vllm-omni
    ``__init__`` that calls neither ``super().__init__`` nor a base's ``X.__init__(self, ...)`` (all of them), or
    between it and the base whose ``__init__`` it calls by name. vLLM's own ``__init__`` methods are taken to chain as
    written in vLLM; an ``__init__`` calling several, or one the files cannot follow, skips nothing known."""
    with_init = [c for c in mro if isinstance(c, Definition) and "__init__" in model.methods(c)]
    skipped: set[str] = set()
    index = 0
    while index < len(with_init) and with_init[index].side == "plugin":
        current = with_init[index]
        calls = [node for node in walk(model.methods(current)["__init__"]) if isinstance(node, ast.Call)
                 and isinstance(node.func, ast.Attribute) and node.func.attr == "__init__"]
        if not calls:
            return skipped | {c.path for c in with_init[index + 1:]}
        if len(calls) > 1:
            return skipped
        value = calls[0].func.value
        if isinstance(value, ast.Call) and dotted(value.func) == "super":
            index += 1
            continue
        written = dotted(value)
        resolved = model.resolve_expr(current.module, written) if written else None
        paths = [c.path for c in with_init]
        if not isinstance(resolved, Definition) or resolved.path not in paths[index + 1:]:
            return skipped
        target = paths.index(resolved.path)
        skipped |= set(paths[index + 1: target])
        index = target
    return skipped


def _assigned_outside_init(cls_node) -> set[str]:
    """What a class defines for its instances other than through its ``__init__``: its methods, class-level names and
    ``self.x = ...`` in its other methods."""
    names = set()
    for node in cls_node.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
            if node.name == "__init__":
                continue
            for inner in walk(node):
                if isinstance(inner, ast.Attribute) and isinstance(inner.ctx, ast.Store) \
                        and isinstance(inner.value, ast.Name) and inner.value.id == "self":
                    names.add(inner.attr)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _self_reads(method) -> list[tuple[str, int]]:
    """``(attribute, line)`` of each ``self.<attribute>`` a method reads or deletes, first read each, except those
    it also asks ``hasattr(self, ...)`` / ``getattr(self, ..., default)`` about."""
    asked = set()
    for node in walk(method):
        if isinstance(node, ast.Call) and dotted(node.func) in ("hasattr", "getattr") and len(node.args) >= 2 \
                and isinstance(node.args[0], ast.Name) and node.args[0].id == "self" \
                and isinstance(node.args[1], ast.Constant):
            asked.add(node.args[1].value)
    found: dict[str, int] = {}
    for node in walk(method):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, (ast.Load, ast.Del)) \
                and isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr not in asked:
            found.setdefault(node.attr, node.lineno)
    return sorted(found.items(), key=lambda item: item[1])


def _forwards(node: ast.Call, func, target: Definition) -> bool:
    """Whether a call passes on its function's own ``*args`` / ``**kwargs`` (no other starred value) to the vLLM
    method of the same name (``super().__init__(*args, **kwargs)`` in ``__init__``): what they hold is what vLLM
    called the override with, which vLLM's own method takes (what the call passes besides is checked as usual)."""
    if func is None or target.name.rsplit(".", 1)[-1] != func.name:
        return False
    own = {"*": func.args.vararg.arg if func.args.vararg else None,
           "**": func.args.kwarg.arg if func.args.kwarg else None}
    starred = [a.value for a in node.args if isinstance(a, ast.Starred)]
    doubled = [k.value for k in node.keywords if k.arg is None]
    return all(isinstance(v, ast.Name) and v.id == own["*"] for v in starred) and all(
        isinstance(v, ast.Name) and v.id == own["**"] for v in doubled) and len(starred) <= 1 and len(doubled) <= 1


def _positional_only(target: Definition, params) -> int:
    """How many of ``params`` (the bound parameters of ``target``) are positional-only (``def f(a, /, **kw)``)."""
    node = target.node
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return 0
    dropped = len(signature(node)) - len(params)  # self / cls, bound
    return max(0, len(node.args.posonlyargs) - dropped)


def _returned_arities(func) -> set[int] | None:
    """The lengths of the tuples a def's ``return`` statements give (its own, not those of nested defs); None where
    one returns something else, nothing is returned, or it is a generator."""
    arities: set[int] = set()
    todo = list(func.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Yield, ast.YieldFrom)):
            return None
        if isinstance(node, ast.Return) and node.value is not None:
            if not isinstance(node.value, ast.Tuple) or any(isinstance(e, ast.Starred) for e in node.value.elts):
                return None
            arities.add(len(node.value.elts))
        todo.extend(ast.iter_child_nodes(node))
    return arities or None


def _add_edge(targets: dict[str, str], target: str, cond: str) -> None:
    """Record a call of ``target`` under ``cond``; an unconditional call of it wins."""
    if target not in targets or (targets[target] and not cond):
        targets[target] = cond


def _names_in(why: str, params, keywords) -> tuple[str, ...]:
    """The parameter names a binding failure is about (what a drift point that handles it matches on)."""
    if why.startswith("takes "):
        return ("*positional",)
    words = set(re.findall(r"\w+", why.split("argument", 1)[-1]))
    return tuple(sorted(words & ({p.name for p in params} | set(keywords))))


def _reads_of(parsed: ast.Module, class_name: str):
    """``(attribute, line, class, method)`` for each attribute read in ``parsed`` from a value its function
    annotates with ``class_name`` (a parameter, an annotated variable, an element of one: ``for x in xs``,
    ``xs[0]``); ``class`` and ``method`` name the enclosing method (None for a module-level function)."""
    word = re.compile(rf"\b{re.escape(class_name)}\b")
    functions = [(None, f) for f in parsed.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    functions += [(c.name, f) for c in parsed.body if isinstance(c, ast.ClassDef)
                  for f in c.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for owner, func in functions:
        typed = {a.arg for a in (*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs)
                 if a.annotation is not None and word.search(ast.unparse(a.annotation))}
        for node in walk(func):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and word.search(ast.unparse(node.annotation)):
                typed.add(node.target.id)
        if not typed:
            continue
        changed = True
        while changed:  # elements of typed values are typed
            changed = False
            for node in walk(func):
                if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and _root_name(node.iter) in typed:
                    for name in walk(node.target):
                        if isinstance(name, ast.Name) and name.id not in typed:
                            typed.add(name.id)
                            changed = True
        for node in walk(func):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                value = node.value.value if isinstance(node.value, ast.Subscript) else node.value
                if isinstance(value, ast.Name) and value.id in typed:
                    yield node.attr, node.lineno, owner, func.name


def _root_name(node) -> str | None:
    while isinstance(node, (ast.Call, ast.Attribute, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


# -------------------------------------------------------------------------------------------- the pair


def scan(plugin_tree: SourceTree, host_tree: SourceTree, plugin: str = "vllm_omni", host: str = "vllm"
         ) -> tuple[list[Finding], int, int]:
    """``(findings, checked, undecidable)`` of the plugin's modules that its entrypoints reach, against the host
    tree, not yet compared with any baseline."""
    graph = plugin_graph(plugin_tree, plugin, host, tuple(s for e in entrypoints_of(plugin) for s in e.scripts))
    modules: dict[str, set[str]] = {}
    for entrypoint in entrypoints_of(plugin):
        roots = [r for r in entrypoint.roots if r in graph.modules]
        roots += [called(s) for s in entrypoint.scripts if called(s) in graph.modules]
        for module in set().union(*(graph.reached(r) for r in roots)) if roots else ():
            modules.setdefault(module.removesuffix(" (functions)"), set()).add(entrypoint.id)
    model = CodeModel(plugin_tree, host_tree, plugin, host)
    _add_loaded_by_name(graph, modules, model)
    host_modules: dict[str, set[str]] = {}
    for imported in graph.host_imports:
        importer = imported.importer.removesuffix(" (functions)")
        for name in ((imported.module,) if imported.module else imported.names):
            host_modules.setdefault(name, set()).update(modules.get(importer, ()))
    run = _Scan(model, modules, host_modules)
    findings = run.run()
    paths = run.startup_paths({e.id: tuple(r for r in (*e.roots, *e.scripts) if r in graph.modules) + e.runs
                               for e in entrypoints_of(plugin)})

    def runs_at_start(finding: Finding, entrypoint_id: str) -> str | None:
        """The condition under which the entrypoint's start runs the site ("" always), None when it does not."""
        started = paths.get(entrypoint_id, {})
        if finding.kind == "abstract":  # the class is built (its constructor runs), else any method of it runs
            built = [c for p, c in started.items() if p in (finding.plugin_object, finding.plugin_object + ".__init__")]
            conds = built or [c for p, c in started.items() if p.startswith(finding.plugin_object + ".")]
            return None if not conds else "" if "" in conds else conds[0]
        if finding.kind == "attribute":  # read by vllm-omni's own functions: the first that runs decides
            conds = [started[r] for r in finding.readers if r in started]
            if not finding.readers and finding.endpoint() is None:
                # vLLM's own method reads it from a plugin object that a step builds and hands to vLLM (an inherited
                # method reading what a skipped __init__ sets): building the object is what runs it
                conds = [c for p, c in started.items() if p in (finding.plugin_object,
                                                                finding.plugin_object + ".__init__")]
            return None if not conds else "" if "" in conds else conds[0]
        if finding.kind not in ("call", "unpack") or finding.plugin_object not in started:
            return None
        return finding.condition or started[finding.plugin_object]

    findings = [dataclasses.replace(f, stops_in=tuple((e, c) for e in f.entrypoints
                                                       if (c := runs_at_start(f, e)) is not None))
                for f in findings]
    return findings, run.checked, run.undecidable


def _add_loaded_by_name(graph, modules: dict[str, set[str]], model: CodeModel) -> None:
    """Add to ``modules`` (plugin module -> the entrypoints reaching it) what the plugin loads by name: a class of
    its own written as a quoted import path anywhere in its files (``RUNNER = "pkg.mod.Runner"``, a registry's
    entry, a default a config names), whose module no import reaches. Where such a class derives a class of the
    plugin's that an entrypoint reaches, that entrypoint runs it in its base's place (the code that resolves the
    path builds it where the base goes), so it reaches the class's module and what that module imports. A mixin
    (a base named ``...Mixin``, as the convention goes) says nothing of where a class goes: it is not followed.
    Repeated until nothing is added (a class loaded by name may be the base of another)."""
    pattern = re.compile(rf"""["']({re.escape(graph.plugin)}(?:\.\w+)+)["']""")
    named: set[str] = set()
    for _, text in model.texts("plugin"):
        if graph.plugin in text:
            named.update(pattern.findall(text))
    classes = []
    for path in sorted(named):
        module, _, name = path.rpartition(".")
        found = model.resolve(module, name) if module in graph.modules else None
        if isinstance(found, Definition) and found.is_class and found.side == "plugin":
            classes.append(found)
    changed = True
    while changed:
        changed = False
        for found in classes:
            reach = set().union(*(modules.get(b.module, set()) for b in model.bases(found)
                                  if isinstance(b, Definition) and b.side == "plugin" and not b.name.endswith("Mixin")))
            if reach <= modules.get(found.module, set()):
                continue
            for module in graph.reached(found.module):
                entrypoints = modules.setdefault(module.removesuffix(" (functions)"), set())
                if not reach <= entrypoints:
                    entrypoints |= reach
                    changed = True


def own_vllm(omni_version: str | None) -> str | None:
    """The vLLM a vllm-omni release was made for: the ``.0`` of its own minor (vllm-omni 0.24.0 -> vLLM 0.24.0;
    each vllm-omni minor is released for the vLLM minor of the same number). None for an unknown version."""
    match = re.match(r"(\d+)\.(\d+)", omni_version or "")
    return f"{match.group(1)}.{match.group(2)}.0" if match else None


def check_behaviour_drift(plugin_tree: SourceTree, host_tree: SourceTree, omni_version: str | None,
                          baseline_tree=None) -> BehaviourDrift | None:
    """The behavioural drift of the vllm-omni in ``plugin_tree`` on the vLLM in ``host_tree``: what is new against
    the same scan on vllm-omni's own vLLM (``own_vllm``). That scan's findings come from the baselines this
    package ships (``behaviour_baselines``, made from the release wheels), else from ``baseline_tree`` (a callable
    returning the own vLLM's tree, or None when it cannot be had); without either every finding is reported and
    ``baseline_note`` says so. None when either package is absent."""
    if not plugin_tree.has_package("vllm_omni") or not host_tree.has_package("vllm"):
        return None
    from .behaviour_baselines import BASELINES

    findings, checked, undecidable = scan(plugin_tree, host_tree)
    own = own_vllm(omni_version)
    known, note = None, ""
    if omni_version in BASELINES:
        own, known = BASELINES[omni_version]
    elif callable(baseline_tree):
        tree, note = baseline_tree(own)
        known = {f.key for f in scan(plugin_tree, tree)[0]} if tree is not None else None
    else:
        note = f"no baseline for vllm-omni {omni_version or '?'} (its own vLLM {own or '?'} was not read)"
    new = []
    for finding in findings:
        if (known is None or finding.key not in known) and finding not in new:
            new.append(finding)
    return BehaviourDrift(tuple(new), checked, undecidable, own if known is not None else None, note)


def own_vllm_wheel(version: str | None, fetch: bool):
    """``(tree, note)`` of the vLLM ``version`` wheel: from the wheel cache, downloaded when ``fetch``; ``(None,
    why)`` when it cannot be had."""
    from .wheel_members import open_release
    from .wheels import WheelError

    if version is None:
        return None, "vllm-omni's version is unknown, so is its own vLLM"
    try:
        release = open_release("vllm", version, fetch=fetch)  # the cache, else its source members (range requests)
    except WheelError as exc:
        return None, f"vLLM {version} (vllm-omni's own) could not be fetched: {exc}"
    if release is None:
        return None, f"vLLM {version} (vllm-omni's own) is not in the wheel cache"
    return release.tree, ""

