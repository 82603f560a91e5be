"""The loader drift point's facts: what the installed vLLM can do about meta params, and the shape of vllm-omni's
loader method, read from files (``scan_*``) or asked of the imported modules (``probe_*``, ``detect_runtime``).

Capability flags, each with the upstream change that made it matter:

``has_uses_meta_device``        ``QuantizeMethodBase.uses_meta_device`` exists (vLLM 0.17, online quantization
                                creates weights on ``meta``). Without it no vLLM quant method leaves meta params.
``has_layerwise_finalize``      ``reload.layerwise.finalize_layerwise_processing(model, model_config)`` exists
                                (vLLM 0.19). It materializes "straggler" layers left on ``meta``. The older
                                ``finalize_layerwise_reload`` (0.16-0.18) is NOT a substitute: it needs a prior
                                reload setup.
``has_initialize_online_processing``  the layerwise loader wrapper online methods install (vLLM 0.19).
``omni_meta_device_methods``    vllm-omni's own quant classes with ``uses_meta_device = True`` (int8 from
                                vllm-omni 0.18, mxfp8 from 0.22): meta params even where vLLM cannot make them.

Static and runtime detection produce the same records, so a test can hold them equal (``compare_environments``).
Nothing here imports vLLM, vllm-omni or torch at module level.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from dataclasses import asdict, dataclass, field

from ...detect.model import Param, accepts_call, render_params
from ...detect.runtime import import_optional, live_params
from ...detect.source_tree import SourceTree, parse_source
from ...detect.static import function_params
from ...detect.versions import installed_version

BASE_CONFIG_FILE = "vllm/model_executor/layers/quantization/base_config.py"
LAYERWISE_FILE = "vllm/model_executor/model_loader/reload/layerwise.py"
OMNI_LOADER_FILE = "vllm_omni/diffusion/model_loader/diffusers_loader.py"
OMNI_QUANTIZATION_DIR = "vllm_omni/quantization/"
LOADER_CLASS = "DiffusersPipelineLoader"
LOADER_METHOD = "_process_weights_after_loading"
LOADER_MODULE = OMNI_LOADER_FILE[:-3].replace("/", ".")
_OMNI_QUANTIZATION_PACKAGE = OMNI_QUANTIZATION_DIR.rstrip("/").replace("/", ".")


class VllmLevel:
    """Capability levels of vLLM, named by what a loader must do about meta params."""

    ABSENT = "absent"  # vLLM not installed
    UNKNOWN = "unknown"  # installed, but its files could not be read
    NO_META_DEVICE = "no_meta_device"  # vLLM <= 0.16: no quant method creates meta params
    META_DEVICE_WITHOUT_FINALIZE = "meta_device_without_finalize"  # 0.17-0.18: meta params, no finalize
    META_DEVICE_WITH_FINALIZE = "meta_device_with_finalize"  # 0.19+: meta params, layerwise finalize


FINALIZE_MODULE = "vllm.model_executor.model_loader.reload.layerwise"
FINALIZE_NAME = "finalize_layerwise_processing"
# The call every loader makes (vllm-omni >= 0.26's in-tree fix, and ours): finalize(model, model_config=None).
FINALIZE_CALL_POSITIONAL = ("model",)
FINALIZE_CALL_KEYWORDS = ("model_config",)


@dataclass(frozen=True)
class VllmCapabilities:
    installed: bool
    has_uses_meta_device: bool = False
    has_layerwise_finalize: bool = False
    finalize_params: tuple[Param, ...] = ()
    has_initialize_online_processing: bool = False
    readable: bool = True

    @property
    def has_compatible_finalize(self) -> bool:
        """Finalize exists and accepts ``(model, model_config=None)``, the call the loader makes."""
        return self.has_layerwise_finalize and accepts_call(
            self.finalize_params, FINALIZE_CALL_POSITIONAL, FINALIZE_CALL_KEYWORDS
        )

    @property
    def level(self) -> str:
        if not self.installed:
            return VllmLevel.ABSENT
        if not self.readable:
            return VllmLevel.UNKNOWN
        if not self.has_uses_meta_device:
            return VllmLevel.NO_META_DEVICE
        if not self.has_compatible_finalize:
            return VllmLevel.META_DEVICE_WITHOUT_FINALIZE
        return VllmLevel.META_DEVICE_WITH_FINALIZE

    def to_dict(self) -> dict:
        data = asdict(self)
        data["finalize_params"] = [asdict(p) for p in self.finalize_params]
        data["finalize_signature"] = render_params(self.finalize_params) if self.has_layerwise_finalize else None
        data["has_compatible_finalize"] = self.has_compatible_finalize
        return data


class LoaderKind:
    """Shapes of vllm-omni's ``DiffusersPipelineLoader._process_weights_after_loading``."""

    ABSENT = "absent"  # vllm-omni (or its diffusion loader module) not installed
    LEGACY = "legacy"  # <= 0.24.0: blanket module.to() around each quant method; crashes on meta params
    UNGATED = "ungated"  # first fix: always finalize + per-parameter .data moves; breaks FSDP/HSDP
    GATED = "gated"  # >= 0.26.0: meta-safe path gated on online quant; module.to() otherwise
    UNKNOWN = "unknown"  # present, but not a shape we recognize: never patched blindly


@dataclass(frozen=True)
class LoaderShape:
    kind: str
    detail: str = ""
    params: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {"kind": self.kind, "detail": self.detail, "params": list(self.params)}


# The loader call contract every variant implements: (self, model, target_device, [extras with defaults]).
LOADER_PARAMS = ("self", "model", "target_device")


def _identifiers(node: ast.AST) -> set[str]:
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            names.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            names.add(sub.attr)
        elif isinstance(sub, ast.alias):
            names.add(sub.name.rsplit(".", 1)[-1])
    return names


def _is_data_assignment(node: ast.AST) -> bool:
    return isinstance(node, ast.Assign) and any(
        isinstance(target, ast.Attribute) and target.attr == "data" for target in node.targets
    )


def _is_whole_module_move(node: ast.AST) -> bool:
    # `module.to(x)`: a `.to()` call on a bare name, as a statement (not `param.data.to(...)` in an assignment).
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr == "to"
        and isinstance(node.value.func.value, ast.Name)
    )


def _is_online_quant_gate(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    names = _identifiers(node.test)
    return any("online" in name or "meta_device" in name for name in names)


def _function_params(func: ast.FunctionDef) -> tuple[tuple[str, ...], bool]:
    """Return the parameter names and whether every parameter past the loader contract has a default."""
    args = func.args
    positional = [a.arg for a in (*args.posonlyargs, *args.args)]
    names = [*positional, *(a.arg for a in args.kwonlyargs)]
    required_positional = len(positional) - len(args.defaults)
    extras_defaulted = required_positional <= len(LOADER_PARAMS) and all(
        default is not None for default in args.kw_defaults
    )
    return tuple(names), extras_defaulted


def classify_loader_function(func: ast.FunctionDef) -> LoaderShape:
    """Classify a parsed ``_process_weights_after_loading`` by what its body does.

    legacy: processes quant methods around whole-module ``.to()`` moves, no finalize, no ``.data`` moves.
    ungated: finalizes or moves ``param.data`` with no online-quant gate. gated: finalize and ``.data`` moves
    under an ``if`` on online quant / meta device, with a whole-module move kept for the other branch.
    Anything else, or a signature not starting with ``(self, model, target_device)`` or with extra required
    parameters, is unknown; ``detail`` says which.
    """
    params, extras_defaulted = _function_params(func)
    if params[: len(LOADER_PARAMS)] != LOADER_PARAMS or not extras_defaulted:
        return LoaderShape(
            LoaderKind.UNKNOWN,
            f"signature is ({', '.join(params)}); expected ({', '.join(LOADER_PARAMS)}[, optional extras])",
            params,
        )
    nodes = list(ast.walk(func))
    names = _identifiers(func)
    processes = "process_weights_after_loading" in names
    finalizes = "finalize_layerwise_processing" in names
    moves_data = any(_is_data_assignment(node) for node in nodes)
    moves_module = any(_is_whole_module_move(node) for node in nodes)
    gated = any(_is_online_quant_gate(node) for node in nodes)

    if not processes:
        return LoaderShape(LoaderKind.UNKNOWN, "does not call process_weights_after_loading", params)
    if (finalizes or moves_data) and gated and moves_module:
        return LoaderShape(LoaderKind.GATED, "meta-safe path gated on online quant (fixed upstream)", params)
    if finalizes or moves_data:
        return LoaderShape(LoaderKind.UNGATED, "per-parameter .data moves without an online-quant gate", params)
    if moves_module:
        return LoaderShape(LoaderKind.LEGACY, "blanket module.to() around process_weights_after_loading", params)
    return LoaderShape(LoaderKind.UNKNOWN, "moves no module and no parameter; shape not recognized", params)


def classify_loader_source(source: str, class_name: str, method_name: str) -> LoaderShape:
    """Find ``class_name.method_name`` in module or function ``source`` and classify it.

    Accepts a whole module (static detection) or the method's own source (runtime, from ``inspect``).
    Unparseable source or a missing class/method is ``unknown`` with the reason in ``detail``.
    """
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError as exc:
        return LoaderShape(LoaderKind.UNKNOWN, f"source does not parse: {exc.msg} (line {exc.lineno})")
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == method_name:
            return classify_loader_function(node)
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method_name:
                    return classify_loader_function(item)
            return LoaderShape(LoaderKind.UNKNOWN, f"{class_name} has no method {method_name}")
    return LoaderShape(LoaderKind.UNKNOWN, f"no class {class_name} defining {method_name} found")


@dataclass(frozen=True)
class Environment:
    """Everything a decision needs, from one detection pass (``source`` is "static" or "runtime")."""

    source: str
    vllm_version: str | None
    vllm_omni_version: str | None
    torch_version: str | None
    vllm: VllmCapabilities
    loader: LoaderShape
    omni_meta_device_methods: tuple[str, ...] = ()
    # Runtime only: vllm-omni quantization modules that failed to import (e.g. vllm-omni 0.24.0's int8/mxfp8 on
    # vLLM 0.27+); their classes can be declared in the files yet unusable in the process.
    omni_quant_import_failures: tuple[str, ...] = ()

    @property
    def can_create_meta_params(self) -> bool:
        """Whether any installed quant method may leave parameters on ``meta`` for the loader to meet."""
        return self.vllm.has_uses_meta_device or bool(self.omni_meta_device_methods)


def compare_environments(static: Environment, runtime: Environment) -> list[str]:
    """Human-readable differences between what the files say and what the imported modules say."""
    mismatches = []
    if static.vllm.to_dict() != runtime.vllm.to_dict():
        mismatches.append(f"vllm capabilities {static.vllm.to_dict()} != {runtime.vllm.to_dict()}")
    if static.loader.kind != runtime.loader.kind:
        mismatches.append(f"loader kind {static.loader.kind} != {runtime.loader.kind}")
    # A class declared in a file whose module fails to import is not a disagreement: the file says it exists,
    # the process cannot use it. Only unexplained differences count.
    unimportable = set(runtime.omni_quant_import_failures)
    static_methods = {m for m in static.omni_meta_device_methods if m.split(":", 1)[0] not in unimportable}
    if static_methods != set(runtime.omni_meta_device_methods):
        mismatches.append(
            f"vllm-omni meta-device methods {sorted(static.omni_meta_device_methods)} != "
            f"{sorted(runtime.omni_meta_device_methods)}"
        )
    return mismatches


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


def _parse(tree: SourceTree, relpath: str) -> ast.Module | None:
    text = tree.read(relpath)
    if text is None:
        return None
    try:
        return parse_source(text)
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
        module = parse_source(text)
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



def probe_vllm() -> VllmCapabilities:
    """Capabilities of the imported vLLM (importing it if needed)."""
    base_config = import_optional("vllm.model_executor.layers.quantization.base_config")
    if base_config is None:
        installed = installed_version("vllm") is not None
        return VllmCapabilities(installed=installed, readable=not installed)
    layerwise = import_optional(FINALIZE_MODULE)
    finalize = getattr(layerwise, FINALIZE_NAME, None)
    finalize_params = live_params(finalize) if finalize is not None else ()
    return VllmCapabilities(
        installed=True,
        has_uses_meta_device=hasattr(base_config.QuantizeMethodBase, "uses_meta_device"),
        has_layerwise_finalize=finalize is not None,
        finalize_params=finalize_params,
        has_initialize_online_processing=hasattr(layerwise, "initialize_online_processing"),
    )


def original_loader_function(loader_class: type):
    """The loader method as vllm-omni defined it: unwraps our own wrapper, never anyone else's."""
    from ...drift import unwrap

    return unwrap(inspect.getattr_static(loader_class, LOADER_METHOD, None))


def classify_loader_class(loader_class: type) -> LoaderShape:
    """Shape of ``loader_class``'s live loader method, read from its source via ``inspect``."""
    func = original_loader_function(loader_class)
    if func is None:
        return LoaderShape(LoaderKind.UNKNOWN, f"{loader_class.__qualname__} has no method {LOADER_METHOD}")
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError) as exc:
        return LoaderShape(LoaderKind.UNKNOWN, f"source of {LOADER_METHOD} is unavailable ({exc})")
    return classify_loader_source(source, LOADER_CLASS, LOADER_METHOD)


def probe_omni_meta_device_methods() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(``module:Class`` of imported vllm-omni quant classes with ``uses_meta_device = True``, modules of
    vllm-omni's quantization package that failed to import), one module at a time."""
    package = import_optional(_OMNI_QUANTIZATION_PACKAGE)
    if package is None:
        return (), ()
    import pkgutil

    found, failed = [], []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.ispkg:
            continue  # static detection reads the package's own files only
        name = f"{_OMNI_QUANTIZATION_PACKAGE}.{info.name}"
        try:
            module = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional quant backend that does not import is not our failure
            failed.append(name)
            continue
        for attr, value in vars(module).items():
            if (
                isinstance(value, type)
                and value.__module__ == name
                and vars(value).get("uses_meta_device") is True
            ):
                found.append(f"{name}:{attr}")
    return tuple(sorted(found)), tuple(failed)


def detect_runtime(loader_module=None) -> Environment:
    """Runtime detection. Imports vLLM and vllm-omni's loader module unless ``loader_module`` (the already
    imported module, as the post-import hook has it) is given."""
    if loader_module is None:
        # Found by import, not by metadata: static detection reads the files even without a dist-info.
        loader_module = import_optional(LOADER_MODULE)
    loader_class = getattr(loader_module, LOADER_CLASS, None) if loader_module is not None else None
    if loader_module is None:
        loader = LoaderShape(LoaderKind.ABSENT, "vllm-omni is not installed")
    elif loader_class is None:
        loader = LoaderShape(LoaderKind.UNKNOWN, f"{LOADER_MODULE} has no class {LOADER_CLASS}")
    else:
        loader = classify_loader_class(loader_class)
    meta_methods, import_failures = probe_omni_meta_device_methods() if loader_module is not None else ((), ())
    return Environment(
        source="runtime",
        vllm_version=installed_version("vllm"),
        vllm_omni_version=installed_version("vllm-omni"),
        torch_version=installed_version("torch"),
        vllm=probe_vllm(),
        loader=loader,
        omni_meta_device_methods=meta_methods,
        omni_quant_import_failures=import_failures,
    )


def detect_static() -> Environment:
    """The loader's static facts of the installed packages: versions from distribution metadata, capabilities
    and the loader's shape from the installed files. Imports none of vllm, vllm_omni or torch."""
    from ...detect.static import StaticSite

    site = StaticSite.installed()
    return scan_tree(site.vllm_tree, site.versions, omni_tree=site.omni_tree)
