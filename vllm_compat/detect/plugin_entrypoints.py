"""Any vLLM plugin's entrypoints, read from its release files: what vLLM loads of it, and the vLLM range it declares.

vllm-omni's entrypoints are data (``vllm_compat.entrypoints.ENTRYPOINTS``). Another plugin's come from its wheel (or
sdist, or an unpacked tree), read without importing or building it (stdlib + ``packaging``):

* **registered callables**: every entry point of a ``vllm.*`` group in ``entry_points.txt`` (``vllm.platform_plugins``,
  ``vllm.general_plugins``, ...; an sdist's ``*.egg-info/entry_points.txt``, ``pyproject.toml`` or a literal
  ``setup.py``), resolved to the ``def`` it names (through an alias, a re-export or a module ``__getattr__``:
  vllm-metal 0.1.0 serves ``register`` from one), with the modules its body imports and the qualified names it
  returns (a platform plugin returns its platform class: ``"vllm_spyre.platform.SpyrePlatform"``);
* **startup hooks**: a ``*.pth`` file the distribution ships at its root and the modules it imports (kvcached's
  ``kvcached_autopatch.pth`` imports ``kvcached.autopatch`` in every interpreter);
* **classes named by string**: every qualified name of the plugin's own code written as a string (``worker_cls =
  "..."``, the value ``get_attn_backend_cls`` returns, ``scheduler_cls``, ``get_punica_wrapper``), with the role vLLM
  loads it in (worker, attention backend, scheduler, ...), where it is written and whether the tree defines it;
  ``f"vllm_spyre{'.v1' if V1 else ''}.worker..."`` gives both spellings;
* **classes vLLM builds from a configured module path**: a top-level class deriving a ``LOADED_BY_PATH`` base of
  vLLM's (a KV connector: ``kv_connector_module_path``), which nothing imports or names (tpu-inference 0.11.1's
  ``TPUConnector``), is a class of that role too;
* **vLLM names written as strings** (``host_refs``): ``importlib.import_module("vllm.v1.core.block_pool")``,
  ``"vllm.distributed...TpuCommunicator"``: names an import scan cannot see, for the host side to check;
* **the declared vLLM range**: every ``Requires-Dist: vllm ...`` with its marker (``vllm>=0.13.0; extra ==
  "vllm"`` for vllm-metal 0.1.0; none for tpu-inference, whose CI pins a vLLM commit).

The reverse direction, vLLM importing the plugin (``vllm/platforms/tpu.py`` imports ``tpu_inference``; vLLM's LMCache
connector imports ``lmcache.integration.vllm``), is read from the vLLM tree: ``host_references``.

``PluginEntrypoints.entrypoints()`` turns all of it into ``vllm_compat.entrypoints.Entrypoint`` records (one per
registered callable, one per startup hook, one per role of the classes named by string, one for what vLLM imports),
the shape ``detect.import_drift`` follows for vllm-omni today. Nothing here judges drift: it says where to look.

Limits (all found in the plugins' own files, none guessed): a name built at run time beyond constants, f-strings and
conditional expressions is not seen; a callable defined through ``exec`` or a decorator that replaces it resolves
to its ``def``; a site-packages directory needs the distribution's name (its ``RECORD`` says which packages are its).
"""

from __future__ import annotations

import ast
import itertools
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

from ..entrypoints import Entrypoint
from .definitions import module_bindings
from .source_tree import SourceTree, parse_source

HOST = "vllm"
PLUGIN_GROUPS = ("vllm.platform_plugins", "vllm.general_plugins")  # the groups vLLM's plugin loader calls
_NOT_PLUGIN_CODE = {"tests", "test", "testing", "docs", "examples", "benchmarks", "tools", "scripts", "csrc", "build"}
_DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")

# where a qualified string is written -> the role vLLM loads it in (assignment targets, keywords, enclosing methods)
_ROLE_BY_TARGET = {
    "worker_cls": "worker", "worker_class": "worker", "sd_worker_cls": "worker", "worker_class_fn": "worker",
    "scheduler_cls": "scheduler", "model_runner_cls": "model_runner", "executor_cls": "executor",
    "distributed_executor_backend": "executor", "device_communicator_cls": "communicator",
    "kv_connector_module_path": "kv_connector", "attn_backend": "attention_backend",
}
_ROLE_BY_FUNCTION = (
    ("get_attn_backend_cls", "attention_backend"), ("get_mamba_attn_backend", "attention_backend"),
    ("get_attn_backend", "attention_backend"), ("get_punica_wrapper", "lora"),
    ("get_device_communicator_cls", "communicator"), ("get_static_graph_wrapper_cls", "graph_wrapper"),
    ("get_pass_manager_cls", "compilation"), ("get_compile_backend", "compilation"),
    ("get_worker_cls", "worker"), ("get_model_runner", "model_runner"),
)
# the class name's ending when the context says nothing (first match wins)
_ROLE_BY_NAME = (
    ("ModelRunner", "model_runner"), ("Runner", "model_runner"), ("Worker", "worker"),
    ("AttentionBackend", "attention_backend"), ("AttnBackend", "attention_backend"), ("Scheduler", "scheduler"),
    ("Communicator", "communicator"), ("Platform", "platform"), ("Connector", "kv_connector"),
    ("PunicaWrapper", "lora"), ("Executor", "executor"),
)
ROLE_WORDS = {
    "platform": "the platform class", "worker": "the worker", "model_runner": "the model runner",
    "attention_backend": "the attention backends", "scheduler": "the scheduler", "communicator": "the communicator",
    "kv_connector": "the KV connector", "lora": "LoRA (the punica wrapper)", "executor": "the executor",
    "graph_wrapper": "the graph wrapper", "compilation": "the compilation passes",
}
# vLLM's bases whose subclasses vLLM builds from a module path the user configures (``--kv-transfer-config
# '{"kv_connector_module_path": ...}'``), not from anything it imports: a plugin class deriving one runs as that role
# once configured (tpu-inference 0.11.1's TPUConnector: tpu-inference#965)
LOADED_BY_PATH = {"KVConnectorBase": "kv_connector", "KVConnectorBase_V1": "kv_connector"}
# roles that are no way of being started: the plugin loading its own module by name (an edge of its import graph,
# run when the enclosing function runs) and names vLLM is not known to load
NOT_STARTED = ("dynamic_import", "other")
# calls whose string argument is a module or a qualified name that will be imported
_IMPORTING_CALLS = {"import_module", "when_imported", "register_post_import_hook", "resolve_obj_by_qualname",
                    "find_spec", "__import__", "import_from_string", "locate"}


# ------------------------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class DeclaredRange:
    """One ``Requires-Dist`` on vLLM: ``specifier`` ("" when any version), ``marker`` (None when unconditional: an
    ``extra == "vllm"`` one applies only to ``pip install PLUGIN[vllm]``), ``source`` (the file it was read from)."""

    requirement: str
    specifier: str
    marker: str | None
    source: str

    def allows(self, version: str) -> bool | None:
        """Whether ``version`` satisfies the specifier (pre-releases and dev builds included: a plugin pinned to
        ``vllm>=0.24.0,<0.24.1`` accepts 0.24.0 only); None when ``version`` does not parse."""
        from packaging.specifiers import SpecifierSet
        from packaging.version import InvalidVersion, Version

        try:
            return SpecifierSet(self.specifier).contains(Version(version), prereleases=True)
        except InvalidVersion:
            return None


@dataclass(frozen=True)
class RegisteredCallable:
    """One entry point of a ``vllm.*`` group: ``value`` as written (``"vllm_spyre:register"``), ``function`` the
    ``def`` it resolves to (``"vllm_metal._register"``; None when it cannot be found: then only its module is a root),
    ``imports`` the modules its body imports (absolute, any package), ``returns`` the qualified names it returns."""

    group: str
    name: str
    value: str
    module: str
    attr: str
    function: str | None = None
    line: int | None = None
    imports: tuple[str, ...] = ()
    returns: tuple[str, ...] = ()

    @property
    def kind(self) -> str:
        """"platform", "general", or the group's last word for another ``vllm.*`` group."""
        tail = self.group.rsplit(".", 1)[-1]
        return tail.removesuffix("_plugins") if tail.endswith("_plugins") else tail


@dataclass(frozen=True)
class NamedClass:
    """A qualified name of the plugin's code written as a string: ``qualname`` (as vLLM resolves it), ``module`` (the
    longest prefix that is a module of the tree; the whole name's parent when none is), ``role`` (what vLLM loads it as),
    ``where`` (the function or class that writes it), ``line``, ``via`` (the assignment target, keyword, ``return`` or
    call it is written in) and ``defined`` (the tree defines the name: False for a dangling string)."""

    qualname: str
    module: str
    role: str
    where: str
    line: int
    via: str
    defined: bool


@dataclass(frozen=True)
class HostRef:
    """A vLLM name the plugin writes as a string (``where``, ``line``, ``via`` as ``NamedClass``): checked against the
    vLLM tree, it is drift an import scan does not see."""

    name: str
    where: str
    line: int
    via: str


@dataclass(frozen=True)
class StartupHook:
    """A ``.pth`` file at the distribution's root and the modules its lines import (every interpreter runs them)."""

    file: str
    imports: tuple[str, ...]


@dataclass(frozen=True)
class HostReference:
    """The reverse direction: vLLM's ``importer`` (module, ``line``) imports or names ``target`` of the plugin
    (``how``: "import" or "string"); ``module`` is the plugin module an import loads ("" for a string, whose split
    into module and name only the plugin's tree can tell)."""

    importer: str
    line: int
    target: str
    how: str
    module: str = ""


@dataclass(frozen=True)
class PluginEntrypoints:
    """What one plugin release registers with vLLM and names to it (see the module docstring)."""

    distribution: str  # as METADATA spells it ("vllm-spyre")
    version: str | None
    source: str  # "wheel" | "sdist" | "tree"
    packages: tuple[str, ...]  # its top-level import packages
    callables: tuple[RegisteredCallable, ...] = ()
    startup: tuple[StartupHook, ...] = ()
    named: tuple[NamedClass, ...] = ()
    host_refs: tuple[HostRef, ...] = ()
    scripts: tuple[tuple[str, str], ...] = ()  # (console script, "module:attr")
    vllm_requirements: tuple[DeclaredRange, ...] = ()
    modules: tuple[str, ...] = field(default=(), repr=False)  # every module of its packages

    @property
    def declared_vllm(self) -> DeclaredRange | None:
        """The range a plain ``pip install`` of the plugin brings (the unconditional ``Requires-Dist``), else the
        first conditional one; None when the release declares no vLLM at all."""
        plain = [r for r in self.vllm_requirements if r.marker is None]
        return (plain or list(self.vllm_requirements) or [None])[0]

    def allows_vllm(self, version: str) -> bool | None:
        """Whether the declared range admits vLLM ``version``; None when nothing is declared or it does not parse."""
        declared = self.declared_vllm
        return None if declared is None else declared.allows(version)

    def roles(self) -> dict[str, tuple[NamedClass, ...]]:
        found: dict[str, list[NamedClass]] = {}
        for named in self.named:
            found.setdefault(named.role, []).append(named)
        return {role: tuple(items) for role, items in found.items()}

    def entrypoints(self, host_refs: tuple[HostReference, ...] = (), include_scripts: bool = False
                    ) -> tuple[Entrypoint, ...]:
        """The ways vLLM starts this plugin, as ``Entrypoint`` records whose roots are modules of its tree: one per
        registered callable (its module, the plugin modules its body imports, the modules of the names it returns),
        one per startup hook, one per role of the classes named by string that vLLM loads (a platform's worker,
        attention backends, ...; the platform role is its callable's; ``NOT_STARTED`` roles are edges, not starts),
        one for what vLLM itself imports (``host_refs``, from
        ``host_references``) and, with ``include_scripts``, one per console script. A record whose roots are all
        outside the tree is left out."""
        mine = set(self.modules)
        found: list[Entrypoint] = []

        def add(id_: str, label: str, roots, scripts=()):
            roots = tuple(dict.fromkeys(r for r in roots if r in mine))
            if roots:
                found.append(Entrypoint(id_, label, roots, tuple(s for s in scripts if s in roots)))

        for c in self.callables:
            returned = [_module_of(q, mine) for q in c.returns]
            add(f"{c.kind}:{c.name}", f"{c.kind} plugin `{c.name}` ({c.value})",
                [c.module, *c.imports, *[m for m in returned if m]])
        for hook in self.startup:  # a .pth line imports the module and calls into it: its functions' imports run too
            add(f"startup:{hook.file}", f"startup hook {hook.file}", hook.imports, scripts=hook.imports)
        for role, items in self.roles().items():
            if role in NOT_STARTED or role == "platform" and any(c.kind == "platform" for c in self.callables):
                continue
            add(role, f"{ROLE_WORDS.get(role, role)} vLLM loads by name ({', '.join(sorted({n.qualname for n in items}))})",
                [n.module for n in items if n.defined])
        if host_refs:
            add("imported_by_vllm", "what vLLM imports of it (" + ", ".join(sorted({r.importer for r in host_refs})) + ")",
                [r.module if r.how == "import" else _module_of(r.target, mine) for r in host_refs
                 if r.how == "import" or self._names_code(r.target)])
        if include_scripts:
            for name, value in self.scripts:
                module = value.split(":", 1)[0].strip()
                add(f"script:{name}", f"`{name}` ({value})", [module], scripts=(module,))
        return tuple(found)

    def _names_code(self, qualname: str) -> bool:
        """Whether a string vLLM writes names this plugin's code: a module of it, or one name in a module below the
        top-level package (``"lmcache.skip_save"`` is a config key, ``"tpu_inference.platforms.tpu_platform.TpuPlatform"``
        a class)."""
        module = _module_of(qualname, set(self.modules))
        if module is None:
            return False
        rest = qualname[len(module) + 1:]
        return not rest or ("." not in rest and module not in self.packages)

    def missing_for_host(self, host_refs: tuple[HostReference, ...]) -> tuple[HostReference, ...]:
        """The imports vLLM makes of this plugin (``host_references``) whose module this release does not ship: the
        reverse direction's import drift (vLLM 0.24's LMCache connector imports
        ``lmcache.v1.plugin.runtime_plugin_launcher``, which lmcache 0.3.10 lacks). Whether vLLM guards that import
        is the import scan's question, not this one's."""
        mine = set(self.modules)
        return tuple(r for r in host_refs if r.how == "import" and r.module not in mine)

    def to_dict(self) -> dict:
        return {
            "distribution": self.distribution, "version": self.version, "source": self.source,
            "packages": list(self.packages),
            "callables": [{"group": c.group, "name": c.name, "value": c.value, "function": c.function,
                           "imports": list(c.imports), "returns": list(c.returns)} for c in self.callables],
            "startup": [{"file": h.file, "imports": list(h.imports)} for h in self.startup],
            "named": [{"qualname": n.qualname, "role": n.role, "where": n.where, "line": n.line, "via": n.via,
                       "defined": n.defined} for n in self.named],
            "host_refs": [{"name": r.name, "where": r.where, "line": r.line, "via": r.via} for r in self.host_refs],
            "declared_vllm": [{"requirement": r.requirement, "marker": r.marker, "source": r.source}
                              for r in self.vllm_requirements],
        }


# ------------------------------------------------------------------------------------------------ reading files


class ArchiveTree:
    """A source archive (``.tar.gz`` sdist) read as a ``SourceTree`` is: paths relative to the directory holding its
    packages (the archive's top folder, or its ``src/``). Nothing is extracted or built."""

    def __init__(self, path: Path):
        self.root = Path(path)
        self._tar = tarfile.open(self.root)
        self._members = {m.name: m for m in self._tar.getmembers() if m.isfile()}
        tops = {name.split("/", 1)[0] for name in self._members}
        self.top = next(iter(tops)) + "/" if len(tops) == 1 else ""
        self.prefix = self.top
        if not any(n.startswith(self.top) and n.count("/") == 2 and n.endswith("/__init__.py") for n in self._members) \
                and any(n.startswith(self.top + "src/") for n in self._members):
            self.prefix = self.top + "src/"

    # "an archive with a full name list", as the readers use the flag: host_index / tree_metadata index namelist()
    # instead of listing directories, and fact_cache may key what is read by the archive's path, as a wheel's
    is_zip = True

    def read(self, relpath: str, base: str | None = None) -> str | None:
        member = self._members.get((self.prefix if base is None else base) + relpath)
        if member is None:
            return None
        try:
            return self._tar.extractfile(member).read().decode("utf-8")
        except (OSError, UnicodeDecodeError, AttributeError):
            return None

    def read_meta(self, relpath: str) -> str | None:
        """A file relative to the archive's top folder (PKG-INFO, pyproject.toml, *.egg-info/...)."""
        return self.read(relpath, base=self.top)

    def namelist(self) -> list[str]:
        return sorted(n[len(self.prefix):] for n in self._members if n.startswith(self.prefix))

    def meta_names(self) -> list[str]:
        return sorted(n[len(self.top):] for n in self._members if n.startswith(self.top))

    def walk_py(self, package: str) -> list[str]:
        return [n for n in self.namelist() if n.startswith(f"{package}/") and n.endswith(".py")]

    def has_package(self, name: str) -> bool:
        return f"{self.prefix}{name}/__init__.py" in self._members


@dataclass
class _Files:
    """The plugin's files: ``code`` answers ``read`` / ``walk_py`` for its packages; ``meta(name)`` reads a
    metadata file; ``meta_names`` lists the paths metadata may be found at."""

    code: object
    meta_names: list[str]
    meta: object
    source: str


def _open(path: Path, distribution: str | None) -> _Files:
    path = Path(path)
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar")):
        archive = ArchiveTree(path)
        return _Files(archive, archive.meta_names(), archive.read_meta, "sdist")
    if path.is_file():
        tree = SourceTree(path)
        return _Files(tree, tree.namelist(), tree.read, "wheel")
    # a directory: an unpacked wheel, an installed site-packages, or an unpacked sdist / checkout (maybe src/ layout)
    names = []
    for entry in sorted(os.listdir(path)):
        if entry.endswith((".dist-info", ".egg-info")) and (path / entry).is_dir():
            names.extend(f"{entry}/{f}" for f in sorted(os.listdir(path / entry)))
        else:
            names.append(entry + ("/" if (path / entry).is_dir() else ""))
    meta = SourceTree(path)
    has_package = any((path / n.rstrip("/") / "__init__.py").is_file() for n in names
                      if n.endswith("/") and n.rstrip("/") not in _NOT_PLUGIN_CODE)
    code_root = path / "src" if not has_package and (path / "src").is_dir() else path
    source = "tree"
    return _Files(SourceTree(code_root), names, meta.read, source)


def _dist_info(files: _Files, distribution: str | None) -> str | None:
    """The ``*.dist-info`` (or ``*.egg-info``) folder of ``distribution`` (any when None and there is one)."""
    folders = sorted({n.split("/", 1)[0] for n in files.meta_names if n.split("/", 1)[0].endswith((".dist-info",
                                                                                                   ".egg-info"))})
    if distribution is not None:
        want = re.sub(r"[-_.]+", "_", distribution).lower()
        folders = [f for f in folders if re.sub(r"[-_.]+", "_", f.split("-", 1)[0] if f.endswith(".dist-info")
                                                else f.removesuffix(".egg-info")).lower() == want]
    return folders[0] if len(folders) == 1 or (folders and distribution is not None) else None


def _headers(text: str | None):
    if not text:
        return None
    from email.parser import HeaderParser

    return HeaderParser().parsestr(text)


def _parse_entry_points(text: str) -> list[tuple[str, str, str]]:
    """(group, name, value) of an ``entry_points.txt`` (INI-like; names keep their case)."""
    found, group = [], None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1].strip()
            continue
        if group is not None and "=" in line:
            name, value = line.split("=", 1)
            found.append((group, name.strip(), value.strip()))
    return found


def _pyproject_entry_points(text: str | None) -> tuple[list[tuple[str, str, str]], list[str], str | None, str | None]:
    """(entry points, dependencies, name, version) of a ``pyproject.toml``'s ``[project]`` table."""
    if not text:
        return [], [], None, None
    try:
        import tomllib
    except ImportError:  # Python 3.10: the sdist's other metadata files serve
        return [], [], None, None
    try:
        project = tomllib.loads(text).get("project", {})
    except tomllib.TOMLDecodeError:
        return [], [], None, None
    points = [(group, name, value) for group, table in (project.get("entry-points") or {}).items()
              for name, value in table.items()]
    points += [("console_scripts", name, value) for name, value in (project.get("scripts") or {}).items()]
    dependencies = list(project.get("dependencies") or [])
    for extra, items in (project.get("optional-dependencies") or {}).items():
        dependencies += [f'{item}; extra == "{extra}"' for item in items]
    version = project.get("version") if "version" not in (project.get("dynamic") or []) else None
    return points, dependencies, project.get("name"), version


def _setup_py_entry_points(text: str | None) -> tuple[list[tuple[str, str, str]], list[str]]:
    """The literal ``entry_points=`` and ``install_requires=`` of a ``setup(...)`` call (nothing computed)."""
    points, requires = [], []
    if not text:
        return points, requires
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return points, requires
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "setup"):
            continue
        for keyword in node.keywords:
            try:
                value = ast.literal_eval(keyword.value)
            except ValueError:
                continue
            if keyword.arg == "entry_points" and isinstance(value, dict):
                for group, items in value.items():
                    items = items.splitlines() if isinstance(items, str) else items
                    points += [(group, *[p.strip() for p in item.split("=", 1)]) for item in items if "=" in item]
            elif keyword.arg == "install_requires" and isinstance(value, (list, tuple)):
                requires += [str(v) for v in value]
    return points, requires


def _egg_requires(text: str | None) -> list[str]:
    """``requires.txt`` lines as Requires-Dist strings (``[extra]`` and ``[:marker]`` sections become markers)."""
    found, marker = [], None
    for raw in (text or "").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            extra, _, condition = line[1:-1].partition(":")
            parts = ([f'extra == "{extra}"'] if extra else []) + ([f"({condition})"] if condition else [])
            marker = " and ".join(parts) or None
            continue
        found.append(f"{line}; {marker}" if marker else line)
    return found


def _vllm_ranges(requires: list[str], source: str) -> tuple[DeclaredRange, ...]:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name

    found = []
    for text in requires:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) == HOST:
            found.append(DeclaredRange(text.strip(), str(requirement.specifier),
                                       str(requirement.marker) if requirement.marker else None, source))
    return tuple(found)


# ------------------------------------------------------------------------------------------------ the code


def _module_files(code, packages) -> dict[str, str]:
    """dotted module -> relative path, for every ``.py`` of ``packages``."""
    modules = {}
    for package in packages:
        for relpath in code.walk_py(package):
            modules[relpath[:-3].replace("/", ".").removesuffix(".__init__")] = relpath
    return modules


def _module_of(qualname: str, modules) -> str | None:
    """The longest dotted prefix of ``qualname`` that is one of ``modules`` (the name itself included)."""
    parts = qualname.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _absolute(module: str | None, level: int, importer: str, is_package: bool) -> str | None:
    if not level:
        return module
    base = importer.split(".") if is_package else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([module] if module else [])) or None


def _strings(node, limit: int = 8) -> list[str]:
    """The strings an expression can evaluate to, from constants alone: a literal, an f-string, ``+``, a conditional
    expression (both branches); [] when any part is not constant. At most ``limit`` spellings."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.IfExp):
        return (_strings(node.body, limit) + _strings(node.orelse, limit))[:limit]
    if isinstance(node, ast.FormattedValue) and node.format_spec is None:
        return _strings(node.value, limit)
    parts = (node.values if isinstance(node, ast.JoinedStr)
             else [node.left, node.right] if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) else None)
    if parts is None:
        return []
    options = [_strings(p, limit) for p in parts]
    if not all(options):
        return []
    return ["".join(combo) for combo in itertools.islice(itertools.product(*options), limit)]


def _defined_names(tree: ast.Module) -> set[str]:
    """Names a module binds at top level (defs, classes, assignments, imports), under ``if`` / ``try`` too."""
    names: set[str] = set()

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                visit(getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return names


class _Reader:
    """Parses the plugin's modules on demand (``parse_source`` caches per text) and answers where names live."""

    def __init__(self, code, packages):
        self.code = code
        self.packages = tuple(packages)
        self.files = _module_files(code, packages)
        self._defined: dict[str, set[str]] = {}

    def tree(self, module: str) -> ast.Module | None:
        relpath = self.files.get(module)
        text = self.code.read(relpath) if relpath else None
        if text is None:
            return None
        try:
            return parse_source(text)
        except SyntaxError:
            return None

    def is_package(self, module: str) -> bool:
        return self.files.get(module, "").endswith("__init__.py")

    def defines(self, module: str, name: str) -> bool:
        if module not in self._defined:
            tree = self.tree(module)
            self._defined[module] = _defined_names(tree) if tree is not None else set()
        return name in self._defined[module] or f"{module}.{name}" in self.files

    def is_mine(self, name: str) -> bool:
        return name.split(".", 1)[0] in self.packages


def _body_imports(function: ast.AST, importer: str, is_package: bool) -> tuple[str, ...]:
    """Modules a function's body imports when it runs (import statements and ``import_module("...")``)."""
    found = []
    for node in ast.walk(function):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node.module, node.level, importer, is_package)
            if base:
                found.append(base)
                found += [f"{base}.{a.name}" for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call) and _call_name(node) in ("import_module", "__import__") and node.args:
            found += _strings(node.args[0])
    return tuple(dict.fromkeys(found))


def _call_name(node: ast.Call) -> str | None:
    return getattr(node.func, "attr", None) or getattr(node.func, "id", None)


def _find_def(reader: _Reader, module: str, attr: str, depth: int = 0):
    """``(module, def node)`` for ``module:attr``: a ``def`` at top level, an alias ``attr = other``, a re-export
    ``from x import attr`` (followed), or what a module ``__getattr__`` returns for ``name == "attr"``."""
    tree = reader.tree(module)
    if tree is None or depth > 3:
        return None
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    if attr in defs:
        return module, defs[attr]
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and any(
                isinstance(t, ast.Name) and t.id == attr for t in node.targets):
            return _find_def(reader, module, node.value.id, depth + 1)
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == attr:
                    source = _absolute(node.module, node.level, module, reader.is_package(module))
                    if source and reader.is_mine(source):
                        return _find_def(reader, source, alias.name, depth + 1)
    getattr_def = defs.get("__getattr__")
    if getattr_def is not None:  # if name == "attr": return _impl
        for node in ast.walk(getattr_def):
            if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and any(
                    isinstance(c, ast.Constant) and c.value == attr for c in node.test.comparators):
                for statement in node.body:
                    if isinstance(statement, ast.Return) and isinstance(statement.value, ast.Name):
                        return _find_def(reader, module, statement.value.id, depth + 1)
    return None


def _registered(reader: _Reader, group: str, name: str, value: str) -> RegisteredCallable:
    target = value.split("[", 1)[0].strip()
    module, _, attr = target.partition(":")
    module, attr = module.strip(), attr.strip()
    found = _find_def(reader, module, attr.split(".")[0]) if attr else None
    if found is None:
        return RegisteredCallable(group, name, value, module, attr)
    where, node = found
    returns = []
    for inner in ast.walk(node):
        if isinstance(inner, ast.Return) and inner.value is not None:
            returns += [s for s in _strings(inner.value) if _DOTTED.fullmatch(s)]
    return RegisteredCallable(group, name, value, module, attr, f"{where}.{node.name}", node.lineno,
                              _body_imports(node, where, reader.is_package(where)), tuple(dict.fromkeys(returns)))


def _role(qualname: str, via: str, where: str) -> str:
    words = re.findall(r"\w+", via)
    target = words[-1] if words else ""
    if target in _ROLE_BY_TARGET:
        return _ROLE_BY_TARGET[target]
    function = where.rsplit(".", 1)[-1]
    for prefix, role in _ROLE_BY_FUNCTION:
        if function.startswith(prefix):
            return role
    last = qualname.rsplit(".", 1)[-1]
    for suffix, role in _ROLE_BY_NAME:
        if last.endswith(suffix):
            return role
    return "other"


class _StringScan(ast.NodeVisitor):
    """Walks one module, keeping the enclosing defs and the statement a string is written in."""

    def __init__(self, module: str):
        self.module = module
        self.stack: list[str] = []
        self.found: list[tuple[str, str, int, str]] = []  # (string, where, line, via)
        self._via = ""

    def _scoped(self, node):
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def _with_via(self, via: str, values):
        saved, self._via = self._via, via
        for value in values:
            self.visit(value)
        self._via = saved

    def visit_Expr(self, node):  # a docstring or a bare string says nothing
        if not (isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            self.generic_visit(node)

    def visit_Assign(self, node):
        target = node.targets[0]
        via = ast.unparse(target) if isinstance(target, (ast.Attribute, ast.Name, ast.Subscript)) else "="
        self._with_via(f"{via} =", [node.value])

    def visit_AnnAssign(self, node):
        if node.value is not None:
            self._with_via(f"{ast.unparse(node.target)} =", [node.value])

    def visit_Return(self, node):
        if node.value is not None:
            self._with_via("return", [node.value])

    def visit_Call(self, node):
        self.visit(node.func)
        name = _call_name(node) or "call"
        self._with_via(f"{name}()", node.args)
        for keyword in node.keywords:
            self._with_via(f"keyword {keyword.arg}" if keyword.arg else f"{name}()", [keyword.value])

    def visit_Compare(self, node):  # `if name == "vllm.x"` compares, it does not name
        return

    def visit_Dict(self, node):  # {"worker_cls": "pkg.Worker"}: the key says what the value is
        for key, value in zip(node.keys, node.values, strict=True):
            if key is not None:
                self.visit(key)
            label = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else self._via
            self._with_via(f"{label} =" if label != self._via else label, [value])

    def _string(self, node):
        values = _strings(node)
        if values:
            for value in values:
                if _DOTTED.fullmatch(value):
                    self.found.append((value, ".".join([self.module, *self.stack]), node.lineno,
                                       self._via.removesuffix(" =").strip() or "expression"))
            return
        self.generic_visit(node)

    visit_Constant = visit_JoinedStr = visit_IfExp = _string

    def visit_BinOp(self, node):
        if isinstance(node.op, ast.Add) and _strings(node):
            self._string(node)
        else:
            self.generic_visit(node)


def _derived_from_loaded_by_path(reader: _Reader, host: str) -> tuple[NamedClass, ...]:
    """The plugin's top-level classes deriving a ``LOADED_BY_PATH`` base imported from the host (``from
    vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1``, or the dotted name): each a
    ``NamedClass`` of that base's role, ``via`` the base. Only files whose text names such a base are parsed."""
    quick = re.compile(r"\b(?:" + "|".join(map(re.escape, LOADED_BY_PATH)) + r")\b")
    found = []
    for module, relpath in sorted(reader.files.items()):
        if not quick.search(reader.code.read(relpath) or ""):
            continue
        tree = reader.tree(module)
        if tree is None:
            continue
        # what each module-level name is bound to last, as at run time (definitions.module_bindings)
        from_host = {bound: alias.name for bound, node in dict(module_bindings(tree.body)).items()
                     if isinstance(node, ast.ImportFrom) and not node.level
                     and (node.module or "").split(".", 1)[0] == host
                     for alias in node.names if (alias.asname or alias.name) == bound}
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            for base in cls.bases:
                dotted = ast.unparse(base)
                name = from_host.get(dotted) or (dotted.rsplit(".", 1)[-1] if dotted.startswith(host + ".") else None)
                if name in LOADED_BY_PATH:
                    found.append(NamedClass(f"{module}.{cls.name}", module, LOADED_BY_PATH[name], module, cls.lineno,
                                            f"derives {name}", True))
                    break
    return tuple(found)


def _scan_strings(reader: _Reader, host: str) -> tuple[tuple[NamedClass, ...], tuple[HostRef, ...]]:
    """Every qualified name of the plugin (resolved in its tree) or of the host written as a string in its modules.
    Only files whose text holds a quoted dotted name of either are parsed."""
    prefixes = tuple(reader.packages) + (host,)
    alternatives = "|".join(map(re.escape, prefixes))
    quick = re.compile(r"""(?:["']|\{[^}]*\}|f["'])(?:""" + alternatives + r""")[."'{]""")
    named: dict[tuple, NamedClass] = {}
    refs: dict[tuple, HostRef] = {}
    for module, relpath in sorted(reader.files.items()):
        text = reader.code.read(relpath) or ""
        if not quick.search(text):
            continue
        tree = reader.tree(module)
        if tree is None:
            continue
        scan = _StringScan(module)
        scan.visit(tree)
        for value, where, line, via in scan.found:
            first = value.split(".", 1)[0]
            if first == host:
                refs.setdefault((value, where, line), HostRef(value, where, line, via))
                continue
            if first not in reader.packages:
                continue
            owner = _module_of(value, reader.files)
            importing = via.rstrip("()") in _IMPORTING_CALLS
            if owner is None:
                if not importing and _role(value, via, where) == "other":
                    continue  # a config key or a logger name, not code
                owner, defined = value.rsplit(".", 1)[0], False
            elif owner == value:  # a module: code only where something imports it by this name
                if not importing and via not in _ROLE_BY_TARGET and not via.endswith(tuple(_ROLE_BY_TARGET)):
                    continue
                defined = True
            else:
                rest = value[len(owner) + 1:]
                defined = reader.defines(owner, rest.split(".", 1)[0])
                if not defined and not importing and _role(value, via, where) == "other" and not rest[:1].isupper():
                    continue  # "pkg.mod.key": a key, not a name of the code
            role = "dynamic_import" if importing and owner == value else _role(value, via, where)
            named.setdefault((value, where, line), NamedClass(value, owner, role, where, line, via, defined))
    return tuple(named.values()), tuple(refs.values())


def _pth_imports(text: str) -> tuple[str, ...]:
    """Modules a ``.pth`` file imports: its ``import`` lines, parsed, including ``import_module("x")`` calls."""
    found = []
    for line in text.splitlines():
        if not line.startswith(("import ", "import\t")):
            continue
        try:
            tree = ast.parse(line)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.append(node.module)
            elif isinstance(node, ast.Call) and _call_name(node) in ("import_module", "find_spec") and node.args:
                found += _strings(node.args[0])
    return tuple(dict.fromkeys(found))


# ------------------------------------------------------------------------------------------------ the entry


def read_plugin(path, distribution: str | None = None) -> PluginEntrypoints:
    """The entrypoints of the plugin in ``path``: a wheel, an sdist (``.tar.gz``), an unpacked wheel or sdist, or a
    site-packages directory (then ``distribution`` names which). Reads files only; imports and builds nothing.

    Metadata, first found wins: a ``*.dist-info`` (wheel, installed); else an sdist's ``PKG-INFO`` and
    ``*.egg-info/`` (``entry_points.txt``, ``requires.txt``), ``pyproject.toml`` and a literal ``setup.py``. The
    packages are ``top_level.txt``'s, else those the ``RECORD`` lists, else every top-level folder with an
    ``__init__.py`` that is not a test, docs or examples folder. Raises ``ValueError`` (a sentence naming what was
    looked for) when no package is found."""
    path = Path(path)
    files = _open(path, distribution)
    info = _dist_info(files, distribution)
    name, version, requires, points, packages = distribution, None, [], [], []
    meta_source = None
    if info is not None:
        headers = _headers(files.meta(f"{info}/METADATA") or files.meta(f"{info}/PKG-INFO"))
        if headers is not None:
            name, version = headers.get("Name") or name, headers.get("Version")
            requires = headers.get_all("Requires-Dist") or []
            meta_source = f"{info}/METADATA"
        points = _parse_entry_points(files.meta(f"{info}/entry_points.txt") or "")
        if info.endswith(".egg-info") and not requires:
            requires = _egg_requires(files.meta(f"{info}/requires.txt"))
            meta_source = f"{info}/requires.txt"
        packages = [p.strip() for p in (files.meta(f"{info}/top_level.txt") or "").split() if p.strip()]
        if not packages and files.meta(f"{info}/RECORD"):
            packages = sorted({row.split("/", 1)[0] for row in files.meta(f"{info}/RECORD").splitlines()
                               if "/" in row and row.split("/", 1)[1].startswith("__init__.py")})
    if info is None or files.source == "sdist":
        headers = _headers(files.meta("PKG-INFO"))
        if headers is not None:
            name, version = headers.get("Name") or name, headers.get("Version") or version
            if not requires and headers.get_all("Requires-Dist"):
                requires, meta_source = headers.get_all("Requires-Dist"), "PKG-INFO"
        py_points, py_requires, py_name, py_version = _pyproject_entry_points(files.meta("pyproject.toml"))
        setup_points, setup_requires = _setup_py_entry_points(files.meta("setup.py"))
        points = points or py_points or setup_points
        if not requires and (py_requires or setup_requires):
            requires = py_requires or setup_requires
            meta_source = "pyproject.toml" if py_requires else "setup.py"
        name, version = name or py_name, version or py_version
    if not packages or not all(files.code.has_package(p) for p in packages):
        candidates = sorted({n.split("/", 1)[0] for n in files.code.namelist() if n.count("/") == 1
                             and n.endswith("/__init__.py")}) if files.code.namelist() else sorted(
            p.name for p in Path(files.code.root).iterdir() if (p / "__init__.py").is_file())
        packages = [p for p in packages if files.code.has_package(p)] or candidates
    packages = [p for p in packages if p not in _NOT_PLUGIN_CODE]
    if not packages:
        raise ValueError(f"No Python package found in {path} (looked for top-level folders with an __init__.py"
                         f"{', and the RECORD of ' + info if info else ''}); pass a wheel, an sdist or an unpacked "
                         f"tree of the plugin.")
    reader = _Reader(files.code, packages)
    callables = tuple(_registered(reader, group, entry, value) for group, entry, value in points
                      if group.startswith(HOST + "."))
    scripts = tuple((entry, value) for group, entry, value in points if group == "console_scripts")
    startup = tuple(StartupHook(n, _pth_imports(files.meta(n) or "")) for n in files.meta_names
                    if n.endswith(".pth") and "/" not in n)
    startup = tuple(h for h in startup if any(reader.is_mine(m) for m in h.imports))
    named, host_refs = _scan_strings(reader, HOST)
    written = {n.qualname for n in named}
    named += tuple(c for c in _derived_from_loaded_by_path(reader, HOST) if c.qualname not in written)
    return PluginEntrypoints(
        distribution=name or path.name, version=version, source=files.source, packages=tuple(packages),
        callables=callables, startup=startup, named=named, host_refs=host_refs, scripts=scripts,
        vllm_requirements=_vllm_ranges(requires, meta_source or "METADATA"), modules=tuple(sorted(reader.files)))


def host_references(host_tree, packages) -> tuple[HostReference, ...]:
    """Where vLLM (``host_tree``: a ``SourceTree`` of a vLLM wheel or install) imports or names a module of
    ``packages`` (the plugin's top-level packages): ``vllm/platforms/tpu.py`` importing ``tpu_inference.platforms``,
    the built-in platform string ``"tpu_inference.platforms.tpu_platform.TpuPlatform"``, vLLM's LMCache connector
    importing ``lmcache.integration.vllm.vllm_v1_adapter``. Only files whose text holds a package's name are parsed
    (all of vLLM 0.24: ~1.5 s, a handful of files parsed)."""
    packages = tuple(packages)
    quick = re.compile(r"\b(?:" + "|".join(map(re.escape, packages)) + r")\b")
    found: dict[tuple, HostReference] = {}
    for relpath in host_tree.walk_py(HOST):
        text = host_tree.read(relpath) or ""
        if not quick.search(text):
            continue
        try:
            tree = parse_source(text)
        except SyntaxError:
            continue
        importer = relpath[:-3].replace("/", ".").removesuffix(".__init__")
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and node.module and \
                    node.module.split(".", 1)[0] in packages:
                for alias in node.names:
                    target = f"{node.module}.{alias.name}" if alias.name != "*" else node.module
                    found.setdefault((importer, target), HostReference(importer, node.lineno, target, "import",
                                                                        node.module))
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".", 1)[0] in packages:
                        found.setdefault((importer, alias.name), HostReference(importer, node.lineno, alias.name,
                                                                                "import", alias.name))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _DOTTED.fullmatch(node.value) \
                    and node.value.split(".", 1)[0] in packages:
                found.setdefault((importer, node.value), HostReference(importer, node.lineno, node.value, "string"))
    return tuple(sorted(found.values(), key=lambda r: (r.importer, r.line, r.target)))
