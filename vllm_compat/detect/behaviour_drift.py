"""Static behavioural drift: what vllm-omni's code does with vLLM that a newer vLLM no longer accepts, found from the
files of both, before either is installed.

Import drift (``import_drift``) finds names that are gone. This finds what still imports but no longer fits:

* ``call``: a call from vllm-omni into a vLLM function or class (``super().__init__`` and ``super().m`` too, the
  constructor a vllm-omni class inherits from vLLM, and the one a vLLM dataclass or ``msgspec.Struct`` generates
  from its fields, where a field was dropped) that no longer binds: a required parameter
  added, a keyword renamed or removed, too many positionals (vLLM 0.25's ``setup_server(args, *, reuse_port)``);
  and ``self.x.m(...)`` where ``self.x`` holds the vLLM class a base's ``__init__`` assigns it, whose ``m`` is gone
  or no longer binds (a method of a manager a scheduler's base creates, removed);
* ``abstract``: a vllm-omni class deriving a vLLM class that declares abstract methods it does not define: it
  cannot be instantiated (vLLM 0.31 / 0.34's ``EngineClient``);
* ``override``: a vllm-omni method overriding a vLLM one whose signature no longer accepts what the base declares,
  which is how vLLM calls it (``EngineClient.generate(..., session_id=)``, vLLM 0.28);
* ``attribute``: an attribute vLLM's code reads from the objects vllm-omni hands it in place of its own (a vllm-omni
  override returns them where the vLLM base returns vLLM's class) that vllm-omni's class does not define
  (an attribute vLLM 0.26's completion serving reads from every request output, which vllm-omni's outputs lacked).

Differential: the same scan runs against the vLLM the vllm-omni release was made for (``own_vllm``) and only what
is new on the target is reported, so the noise of untyped code (a call the reading gets wrong, on both) never is.
Each finding is followed to the entrypoints whose modules reach its site (``entrypoints.ENTRYPOINTS``, as the
import drift is), and, for ``override`` / ``attribute``, to the vLLM module that calls or reads (its request
endpoint). A call with ``*args`` / ``**kwargs``, a constructor the files cannot tell (a pydantic ``BaseModel``, a
base from a third package), a class with a ``__getattr__`` or a call through an attribute that holds an abstract
class (whose subclass answers it) is counted as undecidable, never as a fit or a failure.

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
from .model import render_params, why_call_fails, why_override_narrows
from .source_tree import SourceTree

_SKIPPED_OVERRIDES = frozenset({"__init__", "__new__", "__post_init__", "__init_subclass__", "__class_getitem__"})


# ------------------------------------------------------------------------------------------------ the scan


def _walk(body, cls=None, func=None, cond=""):
    """``(node, enclosing top-level class, enclosing function name, condition)`` for every node under ``body``;
    ``condition`` is the test of the innermost ``if`` (statement or expression) or ``except`` of the enclosing
    function that the node runs under ("" where it runs whenever the function does)."""
    for node in body:
        yield node, cls, func, cond
        if isinstance(node, ast.ClassDef):
            yield from _walk(node.body, node if cls is None and func is None else cls, func, "")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _walk(node.body, cls, node.name if func is None else func, "" if func is None else cond)
            yield from _walk(node.decorator_list + [a for a in node.args.defaults], cls, func, cond)
        elif isinstance(node, (ast.If, ast.IfExp)) and func is not None:
            test = _short(ast.unparse(node.test))
            yield from _walk([node.test], cls, func, cond)
            yield from _walk(node.body if isinstance(node.body, list) else [node.body], cls, func, test)
            yield from _walk(node.orelse if isinstance(node.orelse, list) else [node.orelse], cls, func,
                             f"not ({test})")
        elif isinstance(node, ast.ExceptHandler) and func is not None:
            yield from _walk(node.body, cls, func, "an exception is handled")
        else:
            yield from _walk(list(ast.iter_child_nodes(node)), cls, func, cond)


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

    def run(self) -> list[Finding]:
        trees = {module: tree for module in sorted(self.modules)
                 if (tree := self.model.module_ast(module)) is not None}
        # the classes first: a call through an attribute asks which of them derive the class it holds
        self.classes = classes = [Definition("plugin", module, node.name, node) for module, tree in trees.items()
                                  for node in _module_classes(tree.body)]
        for module, tree in trees.items():
            for node, cls, func, cond in _walk(tree.body):
                if isinstance(node, ast.Call):
                    self._call(module, node, cls, func, cond)
                    if func is not None:
                        self._edge(module, node, cls, func, cond)
        parents = {base.path for c in classes for base in self.model.mro(c)[1:] if isinstance(base, Definition)}
        for cls in classes:
            self._class(cls, is_leaf=cls.path not in parents)
        return self.findings

    # ------------------------------------------------------------------------------------ startup paths

    def _edge(self, module: str, node: ast.Call, cls, func: str, cond: str) -> None:
        """Record what a call inside plugin function ``func`` runs of the plugin's own code: a function, a
        class's constructor (and the class as built), a method of its own class (``self.m()``, ``super().m()``)."""
        caller = ".".join(p for p in (module, cls.name if cls is not None else None, func) if p)
        callee = node.func
        targets = self.calls.setdefault(caller, {})
        here = Definition("plugin", module, cls.name, cls) if cls is not None else None
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
            _add_edge(targets, found.path, cond)
            init = self.model.constructor(found)[0] if found.is_class else None
            if init is not None and init.side == "plugin":
                _add_edge(targets, init.path, cond)

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
        """``{entrypoint id: {plugin function or class built: condition}}`` for what its start runs: everything the
        functions and the constructors of the classes of its root modules call of the plugin's own code,
        transitively (through ``self.m()`` and ``self.x.m()`` where ``self.x`` holds a plugin class it built; calls
        on other objects are not followed: what they run counts as "when used"). The condition is "" where every
        call on the way runs whenever its caller does, else the first ``if`` test on the way (a path without one
        wins)."""
        found = {}
        for entrypoint, modules in roots.items():
            reached = {caller: "" for caller in self.calls if caller.rpartition(".")[0] in modules
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
        return any((found := self.model.member(c, method)) is not None and found.side == "plugin"
                   for c in self.classes if any(isinstance(b, Definition) and b.path == holder.path
                                                for b in self.model.mro(c)[1:]))

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
        if any(isinstance(a, ast.Starred) for a in node.args) or any(k.arg is None for k in node.keywords):
            self.undecidable += 1
            return
        params = bound_params(target.node) if "." in target.name else signature(target.node)
        if params is None:
            return
        self.checked += 1
        keywords = tuple(k.arg for k in node.keywords)
        why = why_call_fails(params, len(node.args), keywords)
        if why is None:
            return
        names = _names_in(why, params, keywords)
        self._add("call", target.path, _where(module, cls, func), module, node.lineno, f"{written}(...) {why}",
                  names, signature=f"{target.name.rsplit('.', 1)[-1]}{render_params(params)}", condition=cond,
                  call_shape=_call_shape(node))

    def _held_callee(self, module: str, node: ast.Call, cls, func, cond: str) -> tuple[Definition | None, str]:
        """For ``self.<attribute>.<method>(...)`` where ``self.<attribute>`` holds a vLLM class (the one a vLLM
        base's ``__init__`` assigns it: ``CodeModel.attribute_class``): (the vLLM method it binds against, how
        vllm-omni writes the call). (None, "") for any other call, and where this decides it here: a method the
        class does not have is a finding; an abstract holder, or one whose bases the files cannot read, is
        undecidable; a vllm-omni method is not a call into vLLM."""
        callee = node.func
        if cls is None or not isinstance(callee, ast.Attribute) or not isinstance(callee.value, ast.Attribute) \
                or not isinstance(callee.value.value, ast.Name) or callee.value.value.id != "self":
            return None, ""
        attribute, method = callee.value.attr, callee.attr
        holder = self.model.attribute_class(Definition("plugin", module, cls.name, cls), attribute)
        host = next((c for c in self.model.mro(holder) if isinstance(c, Definition) and c.side == "host"), None) \
            if holder is not None else None
        if host is None:
            return None, ""
        written = f"self.{attribute}.{method}"
        if self._may_hold_a_subclass(holder, method):
            self.undecidable += 1
            return None, ""
        target = self.model.member(holder, method)
        if target is not None:
            return (target, written) if target.side == "host" else (None, "")
        names, complete = self.model.instance_attributes(holder)
        if method in names:
            return None, ""  # an attribute, not a method the files define: its call is not read
        if not complete:
            self.undecidable += 1
            return None, ""
        self.checked += 1
        self._add("call", f"{host.path}.{method}", _where(module, cls, func), module, node.lineno,
                  f"{written}(...): {holder.name} (what self.{attribute} holds) has no method {method}", (method,),
                  condition=cond, call_shape=_call_shape(node))
        return None, ""

    # ------------------------------------------------------------------------------------------ classes

    def _class(self, cls: Definition, is_leaf: bool) -> None:
        walk = self.model.mro(cls)
        if not any(isinstance(c, Definition) and c.side == "host" for c in walk):
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

    def _host_sources(self, needle: str):
        """``(host module, parsed)`` of the vLLM modules the plugin imports whose text holds ``needle``."""
        tree = self.model.trees["host"]
        for module in sorted(self.host_modules):
            relpath = self.model.module_file(module)
            text = tree.read(relpath) if relpath else None
            if text and needle in text:
                parsed = self.model.module_ast(module)
                if parsed is not None:
                    yield module, parsed

    def _caller_of(self, method: str, keyword: str) -> str | None:
        """The first vLLM module the plugin imports that calls ``.method(..., keyword=...)``."""
        for module, parsed in self._host_sources(f"{keyword}="):
            for node in ast.walk(parsed):
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
                    for node in ast.walk(item):
                        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                                and isinstance(node.func.value, ast.Name) and node.func.value.id == "self":
                            callers.setdefault(node.func.attr, set()).add(item.name)
            self.owners[key] = (subclasses, callers, {})
        subclasses, callers, known = self.owners[key]

        def skipped(name: str, seen: frozenset) -> bool:
            if name not in known:
                overridden = any((found := self.model.member(c, name)) is not None and found.side == "plugin"
                                 for c in subclasses)
                calling = callers.get(name, set()) - seen
                known[name] = overridden or (bool(calling) and all(skipped(c, seen | {name}) for c in calling))
            return known[name]

        return bool(subclasses) and skipped(method, frozenset())

    def _classes_in(self, module: str, annotation, side: str) -> list[Definition]:
        """The classes of ``side`` an annotation names (string forward references read too)."""
        found = []
        nodes = list(ast.walk(annotation))
        for node in list(nodes):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                try:
                    nodes += list(ast.walk(ast.parse(node.value, mode="eval")))
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


def _where(module: str, cls, func: str | None) -> str:
    """The dotted vllm-omni function a site is in (``module.Cls.method``)."""
    return ".".join(p for p in (module, cls.name if cls is not None else None, func) if p)


def _call_shape(node: ast.Call) -> str:
    """What a call passes, "<positionals>:<keywords>" (``Finding.call_shape``)."""
    return f"{len(node.args)}:{','.join(sorted(k.arg or '**' for k in node.keywords))}"


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
        for node in ast.walk(func):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                    and word.search(ast.unparse(node.annotation)):
                typed.add(node.target.id)
        if not typed:
            continue
        changed = True
        while changed:  # elements of typed values are typed
            changed = False
            for node in ast.walk(func):
                if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)) and _root_name(node.iter) in typed:
                    for name in ast.walk(node.target):
                        if isinstance(name, ast.Name) and name.id not in typed:
                            typed.add(name.id)
                            changed = True
        for node in ast.walk(func):
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
    host_modules: dict[str, set[str]] = {}
    for imported in graph.host_imports:
        importer = imported.importer.removesuffix(" (functions)")
        for name in ((imported.module,) if imported.module else imported.names):
            host_modules.setdefault(name, set()).update(modules.get(importer, ()))
    run = _Scan(CodeModel(plugin_tree, host_tree, plugin, host), modules, host_modules)
    findings = run.run()
    paths = run.startup_paths({e.id: tuple(r for r in (*e.roots, *e.scripts) if r in graph.modules)
                               for e in entrypoints_of(plugin)})

    def runs_at_start(finding: Finding, entrypoint_id: str) -> str | None:
        """The condition under which the entrypoint's start runs the site ("" always), None when it does not."""
        started = paths.get(entrypoint_id, {})
        if finding.kind == "abstract":  # the class is built (its constructor runs), else any method of it runs
            built = [c for p, c in started.items() if p in (finding.plugin_object, finding.plugin_object + ".__init__")]
            conds = built or [c for p, c in started.items() if p.startswith(finding.plugin_object + ".")]
            return None if not conds else "" if "" in conds else conds[0]
        if finding.kind != "call" or finding.plugin_object not in started:
            return None
        return finding.condition or started[finding.plugin_object]

    findings = [dataclasses.replace(f, stops_in=tuple((e, c) for e in f.entrypoints
                                                       if (c := runs_at_start(f, e)) is not None))
                for f in findings]
    return findings, run.checked, run.undecidable


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
    from .wheels import WheelError, cache_dir, cached_wheel, fetch_wheel

    if version is None:
        return None, "vllm-omni's version is unknown, so is its own vLLM"
    try:
        wheel = fetch_wheel("vllm", version)[0] if fetch else cached_wheel("vllm", version, cache_dir())
    except WheelError as exc:
        return None, f"vLLM {version} (vllm-omni's own) could not be fetched: {exc}"
    if wheel is None:
        return None, f"vLLM {version} (vllm-omni's own) is not in the wheel cache"
    return SourceTree(wheel), ""

