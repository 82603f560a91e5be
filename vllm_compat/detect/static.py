"""Static detection: read vLLM's and vllm-omni's files (installed, unpacked, or inside a wheel) and never
import them. Fast enough for ``vllm-compat doctor`` to run before a worker starts.
"""

from __future__ import annotations

import ast

from .model import (
    FINALIZE_NAME,
    Environment,
    LoaderKind,
    LoaderShape,
    Param,
    ParamKind,
    VllmCapabilities,
    classify_loader_source,
)
from .source_tree import SourceTree, installed_package_root, tree_at
from .versions import installed_version

BASE_CONFIG_FILE = "vllm/model_executor/layers/quantization/base_config.py"
LAYERWISE_FILE = "vllm/model_executor/model_loader/reload/layerwise.py"
OMNI_LOADER_FILE = "vllm_omni/diffusion/model_loader/diffusers_loader.py"
OMNI_QUANTIZATION_DIR = "vllm_omni/quantization/"
LOADER_CLASS = "DiffusersPipelineLoader"
LOADER_METHOD = "_process_weights_after_loading"


def _class_body(tree: ast.Module, class_name: str) -> list[ast.stmt] | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            return node.body
    return None


def _assigns_name(body: list[ast.stmt], name: str, value: object = ...) -> bool:
    """Whether ``body`` assigns ``name`` (optionally to the constant ``value``) at class level."""
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            assigned = node.value
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            assigned = node.value
        elif isinstance(node, ast.FunctionDef) and node.name == name:
            return value is ...  # a property counts as presence, not as a constant value
        else:
            continue
        return value is ... or (isinstance(assigned, ast.Constant) and assigned.value is value)
    return False


def _module_function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def function_params(func: ast.FunctionDef) -> tuple[Param, ...]:
    """Every parameter of a parsed function, in order, with its kind and whether it has a default."""
    args = func.args
    positional = [*args.posonlyargs, *args.args]
    first_defaulted = len(positional) - len(args.defaults)
    params = [Param(a.arg, ParamKind.POSITIONAL, i >= first_defaulted) for i, a in enumerate(positional)]
    if args.vararg is not None:
        params.append(Param(args.vararg.arg, ParamKind.VAR_POSITIONAL))
    params += [Param(a.arg, ParamKind.KEYWORD_ONLY, d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg is not None:
        params.append(Param(args.kwarg.arg, ParamKind.VAR_KEYWORD))
    return tuple(params)


def _parse(tree: SourceTree, relpath: str) -> ast.Module | None:
    text = tree.read(relpath)
    if text is None:
        return None
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def scan_vllm(tree: SourceTree) -> VllmCapabilities:
    """Capabilities of the vLLM under ``tree`` from its source. Not installed: ``installed=False``; base
    config unreadable: ``readable=False`` (level "unknown")."""
    if not tree.has_package("vllm"):
        return VllmCapabilities(installed=False)
    base_config = _parse(tree, BASE_CONFIG_FILE)
    base_body = _class_body(base_config, "QuantizeMethodBase") if base_config else None
    if base_body is None:
        return VllmCapabilities(installed=True, readable=False)
    layerwise = _parse(tree, LAYERWISE_FILE)
    finalize = _module_function(layerwise, FINALIZE_NAME) if layerwise else None
    finalize_params = function_params(finalize) if finalize is not None else ()
    return VllmCapabilities(
        installed=True,
        has_uses_meta_device=_assigns_name(base_body, "uses_meta_device"),
        has_layerwise_finalize=finalize is not None,
        finalize_params=finalize_params,
        has_initialize_online_processing=bool(layerwise and _module_function(layerwise, "initialize_online_processing")),
    )


def scan_omni_loader(tree: SourceTree) -> LoaderShape:
    """Shape of vllm-omni's diffusion loader method under ``tree``; "absent" when vllm-omni or the loader
    module is not there."""
    if not tree.has_package("vllm_omni"):
        return LoaderShape(LoaderKind.ABSENT, "vllm-omni is not installed")
    source = tree.read(OMNI_LOADER_FILE)
    if source is None:
        return LoaderShape(LoaderKind.ABSENT, f"vllm-omni has no {OMNI_LOADER_FILE}")
    return classify_loader_source(source, LOADER_CLASS, LOADER_METHOD)


def scan_omni_meta_device_methods(tree: SourceTree) -> tuple[str, ...]:
    """``module:Class`` of every vllm-omni quant class declaring ``uses_meta_device = True``."""
    found = []
    for relpath in tree.list_dir(OMNI_QUANTIZATION_DIR):
        if not relpath.endswith(".py"):
            continue
        text = tree.read(relpath)
        if not text or "uses_meta_device" not in text:
            continue  # cheap pre-filter: most files never mention it
        module = ast.parse(text)
        for node in module.body:
            if isinstance(node, ast.ClassDef) and _assigns_name(node.body, "uses_meta_device", True):
                found.append(f"{relpath[:-3].replace('/', '.')}:{node.name}")
    return tuple(found)


def scan_tree(tree: SourceTree, versions: dict[str, str | None] | None = None, omni_tree: SourceTree | None = None) -> Environment:
    """One static detection pass over ``tree`` (and ``omni_tree`` for vllm-omni when it lives elsewhere);
    ``versions`` overrides the versions read from the tree's dist-info."""
    omni_tree = omni_tree or tree
    versions = versions or {d: tree.distribution_version(d) for d in ("vllm", "vllm-omni", "torch")}
    return Environment(
        source="static",
        vllm_version=versions.get("vllm"),
        vllm_omni_version=versions.get("vllm-omni"),
        torch_version=versions.get("torch"),
        vllm=scan_vllm(tree),
        loader=scan_omni_loader(omni_tree),
        omni_meta_device_methods=scan_omni_meta_device_methods(omni_tree),
    )


class StaticSite:
    """A vLLM tree and a vllm-omni tree (installed, unpacked or wheels), with the detections that several drift
    points read computed once, on first use. Drift points read files through it, never by their own paths.

    The installed site (``installed()``) also keeps what it detects on disk (``detect.fact_cache``): its
    ``environment`` and each entry's ``facts``; a warm run reads them back instead of parsing anything."""

    def __init__(self, vllm_tree: SourceTree, omni_tree: SourceTree, versions: dict[str, str | None] | None = None):
        self.vllm_tree = vllm_tree
        self.omni_tree = omni_tree
        self._versions = versions
        self._environment = None
        self._import_drift = ...
        self._cache_key = None  # set by installed(): files of other trees are not cached
        self._cached: dict = {}
        self._unsaved = False

    @classmethod
    def installed(cls) -> StaticSite:
        """The installed environment: versions from distribution metadata (read when first needed), files from
        where the packages are."""
        from . import fact_cache

        roots = {package: installed_package_root(package) for package in fact_cache.PACKAGES}
        site = cls(tree_at(roots["vllm"]), tree_at(roots["vllm_omni"]))
        site._versions = _installed_versions
        site._cache_key = fact_cache.installed_key({p: str(r) if r is not None else None for p, r in roots.items()})
        site._cached = fact_cache.load(site._cache_key)
        return site

    @property
    def environment(self) -> Environment:
        if self._environment is None:
            self._environment = self._cached.get("environment")
        if self._environment is None:
            versions = self._versions() if callable(self._versions) else self._versions
            self._environment = scan_tree(self.vllm_tree, versions, omni_tree=self.omni_tree)
            self._unsaved = self._cache_key is not None
        return self._environment

    def facts(self, entry_id: str, detect):
        """``detect(self)`` for catalogue entry ``entry_id`` (its ``detect_static``), or what an earlier run of the
        same installed files found (``save()`` keeps it)."""
        cached = self._cached.setdefault("facts", {})
        if entry_id not in cached:
            cached[entry_id] = detect(self)
            self._unsaved = self._cache_key is not None
        return cached[entry_id]

    def save(self) -> None:
        """Write what this run detected beyond the cache to the cache (installed sites only)."""
        if not self._unsaved:
            return
        from . import fact_cache

        if self._environment is not None:
            self._cached["environment"] = self._environment
        fact_cache.store(self._cache_key, self._cached)
        self._unsaved = False

    def installed_import_drift(self):
        """``detect_import_drift()`` (the installed pair, this site's trees when it is ``installed()``), kept with
        the facts: a warm run reads it back with them."""
        if "import_drift" not in self._cached:
            from .import_drift import detect_import_drift

            self._cached["import_drift"] = detect_import_drift()
            self._unsaved = self._cache_key is not None
            self.save()
        return self._cached["import_drift"]

    @property
    def import_drift(self):
        """vllm-omni's imports checked against the vLLM tree (``detect.import_drift``); None without both."""
        if self._import_drift is ...:
            from .import_drift import check_import_drift

            self._import_drift = check_import_drift(self.omni_tree, self.vllm_tree)
        return self._import_drift

    def read_omni_loader(self) -> str | None:
        return self.omni_tree.read(OMNI_LOADER_FILE)


def _installed_versions() -> dict[str, str | None]:
    return {d: installed_version(d) for d in ("vllm", "vllm-omni", "torch")}


def detect_static() -> Environment:
    """Static detection of the installed environment: versions from distribution metadata, capabilities
    from the installed source files. Imports none of vllm, vllm_omni or torch."""
    return StaticSite.installed().environment
