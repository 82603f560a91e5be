"""The records detection produces, and the one classifier static and runtime detection share.

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
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import asdict, dataclass, field


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


class ParamKind:
    POSITIONAL = "positional"  # positional-only or positional-or-keyword
    KEYWORD_ONLY = "keyword_only"
    VAR_POSITIONAL = "var_positional"  # *args
    VAR_KEYWORD = "var_keyword"  # **kwargs


@dataclass(frozen=True)
class Param:
    """One parameter of a function, as both detections see it (from ``ast`` or from ``inspect``)."""

    name: str
    kind: str = ParamKind.POSITIONAL
    has_default: bool = False

    def render(self) -> str:
        prefix = {ParamKind.VAR_POSITIONAL: "*", ParamKind.VAR_KEYWORD: "**"}.get(self.kind, "")
        return f"{prefix}{self.name}{'=...' if self.has_default else ''}"


def render_params(params) -> str:
    """``(model, *, strict, dtype=...)``: the signature the way Python prints it, defaults elided."""
    parts, star_written = [], False
    for param in params:
        if param.kind == ParamKind.VAR_POSITIONAL:
            star_written = True
        elif param.kind == ParamKind.KEYWORD_ONLY and not star_written:
            parts.append("*")
            star_written = True
        parts.append(param.render())
    return f"({', '.join(parts)})"


def accepts_call(params, positional: tuple[str, ...], keywords: tuple[str, ...]) -> bool:
    """Whether a function with ``params`` accepts ``f(*positional, **{k: ... for k in keywords})``: the
    positional arguments fill its leading positional parameters (or ``*args``), each keyword names a
    parameter that takes a keyword (or lands in ``**kwargs``), and every parameter left unfilled has a default."""
    leading = [p for p in params if p.kind == ParamKind.POSITIONAL]
    var_positional = any(p.kind == ParamKind.VAR_POSITIONAL for p in params)
    var_keyword = any(p.kind == ParamKind.VAR_KEYWORD for p in params)
    if len(positional) > len(leading) and not var_positional:
        return False
    filled = {p.name for p in leading[: len(positional)]}
    by_keyword = {p.name for p in params[len(filled):] if p.kind in (ParamKind.POSITIONAL, ParamKind.KEYWORD_ONLY)}
    for keyword in keywords:
        if keyword in by_keyword:
            filled.add(keyword)
        elif not var_keyword:
            return False
    return all(
        p.name in filled or p.has_default
        for p in params
        if p.kind in (ParamKind.POSITIONAL, ParamKind.KEYWORD_ONLY)
    )


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
