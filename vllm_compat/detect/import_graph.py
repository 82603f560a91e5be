"""The plugin side of import drift: which of a plugin's modules import which, and what each imports from the host.

One pass over the plugin's files (``source_scan.plugin_imports``, module-level imports only: what runs when the
module is imported) gives the graph of the plugin's own modules and the list of its imports of the host (vLLM).
``reached(root)`` is what ``import root`` executes: its parent packages, root, their module-level imports of the
plugin, and so on; an import drift is bound to stop ``import root`` when one of those modules imports a host name
that is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .source_scan import plugin_imports, unguarded_packages
from .source_tree import SourceTree


@dataclass(frozen=True)
class HostImport:
    """One module-level import of the host: ``from module import names`` (``names`` as bound in ``module``), or
    ``import names`` (dotted modules) when ``module`` is None."""

    importer: str
    line: int
    module: str | None
    names: tuple[str, ...]


@dataclass
class PluginGraph:
    """A plugin's modules (dotted name -> relative path), their module-level imports of each other (``edges``) and
    of the host (``host_imports``, in file and line order)."""

    plugin: str
    modules: dict[str, str]
    host: str = "vllm"
    edges: dict[str, set[str]] = field(default_factory=dict)
    host_imports: list[HostImport] = field(default_factory=list)
    _packages: dict[str, list[tuple[int, str]]] = field(default_factory=dict, repr=False)  # packages_needed's reads

    def reached(self, root: str) -> set[str]:
        """What ``import root`` executes (see the module docstring); empty when ``root`` is not a module here."""
        return reached(root, self.modules, self.edges)

    def packages_needed(self, tree: SourceTree, modules: set[str]) -> dict[str, tuple[str, int]]:
        """``{package: (first importer, line)}``: the top-level packages of other distributions (not the standard
        library, the plugin or the host) that ``modules`` import unguarded at module level, sorted by name. Each
        file is read once for all entrypoints (their reaches overlap)."""
        import sys

        found: dict[str, tuple[str, int]] = {}
        for module in sorted(modules):
            relpath = self.modules[module]
            if relpath not in self._packages:
                self._packages[relpath] = [
                    (line, package) for line, package in unguarded_packages(tree.read(relpath) or "")
                    if package not in sys.stdlib_module_names and package not in (self.plugin, "__future__")
                    and not is_under(package, self.host)]
            for line, package in self._packages[relpath]:
                found.setdefault(package, (module, line))
        return dict(sorted(found.items()))


def is_under(module: str | None, package: str) -> bool:
    return bool(module) and (module == package or module.startswith(package + "."))


def parents(module: str) -> list[str]:
    """``a.b.c`` -> ``[a, a.b, a.b.c]``."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def reached(root: str, modules: dict, edges: dict) -> set[str]:
    """What ``import root`` executes: its parent packages, root, their module-level imports, and so on (``modules``
    and ``edges`` as a ``PluginGraph`` holds them)."""
    found, todo = set(), [root]
    while todo:
        module = todo.pop()
        for candidate in parents(module):
            if candidate not in found and candidate in modules:
                found.add(candidate)
                todo.extend(edges.get(candidate, ()))
    return found


def plugin_graph(tree: SourceTree, plugin: str, host: str, scripts: tuple[str, ...] = ()) -> PluginGraph:
    """The ``PluginGraph`` of ``plugin`` in ``tree``, with its imports of the ``host`` package. For each module in
    ``scripts`` (a console script), the imports inside its functions hang from one more node,
    ``entrypoints.called(script)``, whose parent is the script: reached only from that node, never from the module."""
    from ..entrypoints import called

    files = tree.walk_py(plugin)
    graph = PluginGraph(plugin, {relpath[:-3].replace("/", ".").removesuffix(".__init__"): relpath
                                 for relpath in files}, host)
    # (graph node, the module whose file it reads, that file, the import context it follows)
    nodes = [(importer, importer, relpath, "module") for importer, relpath in graph.modules.items()]
    for script in scripts:
        if script in graph.modules:
            graph.modules[called(script)] = graph.modules[script]
            graph.edges[called(script)] = {script}
            nodes.append((called(script), script, graph.modules[script], "function"))
    for importer, module_name, relpath, runs in nodes:
        package = module_name if relpath.endswith("__init__.py") else module_name.rpartition(".")[0]
        targets = graph.edges.setdefault(importer, set())
        for line, level, module, names, context in plugin_imports(tree, relpath, plugin):
            if context != runs:
                continue
            if level == -1:  # import a.b.c
                hosts = tuple(name for name in names if is_under(name, host))
                if hosts:
                    graph.host_imports.append(HostImport(importer, line, None, hosts))
                targets.update(name for name in names if is_under(name, plugin))
                continue
            if level:
                base = package.split(".")[: len(package.split(".")) - (level - 1)]
                module = ".".join(base + ([module] if module else []))
            if is_under(module, plugin):
                targets.add(module)
                targets.update(f"{module}.{n}" for n in names if f"{module}.{n}" in graph.modules)
            elif is_under(module, host):
                graph.host_imports.append(HostImport(importer, line, module, tuple(names)))
    return graph
