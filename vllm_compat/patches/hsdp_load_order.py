"""Patch ``vllm_omni...DiffusersPipelineLoader.load_model``: process weights before HSDP sharding.

Why: vllm-omni <= 0.24.0's HSDP path loads, then runs ``prepare_fp8_layers_for_fsdp`` and ``apply_hsdp_to_model``
inside ``_load_model_with_hsdp``, and ``load_model`` calls ``_process_weights_after_loading`` only afterwards, on
FSDP-sharded params: the quantized weight never reaches the forward (FSDP re-installs the unquantized one) and
sharded meta stragglers cannot be finalized. vllm-omni >= 0.26 processes first ("quantization methods must
finish while parameters are ordinary local tensors"), then prepares and shards.
When: the ``process_after_shard`` shape (vllm-omni <= 0.24.0), on the HSDP path only (``use_hsdp``); the
``process_before_shard`` shape (>= 0.26) and loaders without an HSDP path are left alone.
Serves: vllm-omni <= 0.24.0 with use_hsdp and a quantization config, on every vLLM.
Retire when: the oldest supported vllm-omni processes before sharding (0.26.0).

How: for one ``load_model`` call with ``use_hsdp``, the loader instance gets two attributes that shadow its
methods: ``load_weights`` runs the real one and then ``_process_weights_after_loading(model, device)`` (the
class's method, patched by ``diffusers_loader_meta_device`` or not), and ``_process_weights_after_loading``
skips the model processed that way once. Both go when the call ends, however it ends. No vllm-omni code is
copied: the order changes, every step is vllm-omni's own.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from dataclasses import asdict, dataclass

from ..decide import Action, Decision
from ..errors import PatchRefusedError
from ._method import MethodPatch, unwrap_ours

CLASS_NAME, METHOD_NAME = "DiffusersPipelineLoader", "load_model"  # the catalogue row's target
HSDP_LOADER = "_load_model_with_hsdp"
PROCESS = "_process_weights_after_loading"
LOAD_WEIGHTS = "load_weights"
SHARD_CALLS = ("apply_hsdp_to_model", "prepare_fp8_layers_for_fsdp")
VARIANT = "process_before_shard"


class OrderKind:
    ABSENT = "absent"  # vllm-omni (or its loader module) not installed / not found
    NO_HSDP = "no_hsdp"  # the loader has no HSDP path: nothing to reorder
    PROCESS_AFTER_SHARD = "process_after_shard"  # vllm-omni <= 0.24.0
    PROCESS_BEFORE_SHARD = "process_before_shard"  # vllm-omni >= 0.26.0: fixed upstream
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class LoadOrder:
    kind: str
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def _called_names(func: ast.FunctionDef) -> set[str]:
    names = set()
    for node in ast.walk(func):
        if isinstance(node, ast.Call):
            callee = node.func
            names.add(callee.attr if isinstance(callee, ast.Attribute) else getattr(callee, "id", ""))
    return names


def classify_load_order(load_model: ast.FunctionDef | None, hsdp_loader: ast.FunctionDef | None) -> LoadOrder:
    """Classify the HSDP load order from the two parsed methods (None: the class does not define it)."""
    if load_model is None:
        return LoadOrder(OrderKind.UNKNOWN, f"{CLASS_NAME} has no method {METHOD_NAME}")
    if hsdp_loader is None:
        return LoadOrder(OrderKind.NO_HSDP, f"{CLASS_NAME} has no {HSDP_LOADER}")
    in_hsdp, in_load_model = _called_names(hsdp_loader), _called_names(load_model)
    if PROCESS in in_hsdp:
        return LoadOrder(OrderKind.PROCESS_BEFORE_SHARD, f"{HSDP_LOADER} processes weights itself (fixed upstream)")
    shards = [name for name in SHARD_CALLS if name in in_hsdp]
    if LOAD_WEIGHTS in in_hsdp and "apply_hsdp_to_model" in shards and {HSDP_LOADER, PROCESS} <= in_load_model:
        return LoadOrder(OrderKind.PROCESS_AFTER_SHARD,
                         f"{HSDP_LOADER} loads and shards ({', '.join(shards)}); {METHOD_NAME} processes afterwards")
    return LoadOrder(OrderKind.UNKNOWN, f"{HSDP_LOADER} calls {sorted(in_hsdp & {LOAD_WEIGHTS, *SHARD_CALLS})} and "
                     f"{METHOD_NAME} calls {sorted(in_load_model & {HSDP_LOADER, PROCESS})}; shape not recognized")


def classify_class_source(source: str) -> LoadOrder:
    """Find ``DiffusersPipelineLoader`` in module (or class) ``source`` and classify its load order."""
    try:
        tree = ast.parse(textwrap.dedent(source))
    except SyntaxError as exc:
        return LoadOrder(OrderKind.UNKNOWN, f"source does not parse: {exc.msg} (line {exc.lineno})")
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == CLASS_NAME:
            methods = {item.name: item for item in node.body if isinstance(item, ast.FunctionDef)}
            return classify_load_order(methods.get(METHOD_NAME), methods.get(HSDP_LOADER))
    return LoadOrder(OrderKind.UNKNOWN, f"no class {CLASS_NAME} found")


def _parsed_method(cls: type, name: str) -> ast.FunctionDef | None:
    func = unwrap_ours(inspect.getattr_static(cls, name, None))
    if func is None:
        return None
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    return next((n for n in tree.body if isinstance(n, ast.FunctionDef)), None)


def load_with_processing_before_sharding(wrapped, loader, device, args, kwargs):
    """Run ``wrapped`` (the original ``load_model``) with the loader's ``load_weights`` followed by weight
    processing on ``device``, and the later processing of that same model skipped once."""
    load_weights = loader.load_weights
    process = loader._process_weights_after_loading  # the class's method: patched by the loader entry or not
    processed = []

    def load_weights_then_process(model, *args, **kwargs):
        result = load_weights(model, *args, **kwargs)
        process(model, device)
        processed.append(model)
        return result

    def process_unless_done(model, *args, **kwargs):
        if any(model is done for done in processed):
            import logging  # not at module level: the static doctor imports this module, and logging costs ~10 ms

            logging.getLogger("vllm_compat").debug("vllm_compat: weights of %s were processed before sharding; "
                                                   "not again", type(model).__name__)
            return None
        return process(model, *args, **kwargs)

    shadows = {LOAD_WEIGHTS: load_weights_then_process, PROCESS: process_unless_done}
    saved = {name: loader.__dict__[name] for name in shadows if name in loader.__dict__}
    loader.__dict__.update(shadows)
    try:
        return wrapped(*args, **kwargs)
    finally:
        for name in shadows:
            if name in saved:
                loader.__dict__[name] = saved[name]
            else:
                loader.__dict__.pop(name, None)


# ---- the drift point ----

class HsdpLoadOrder(MethodPatch):
    """Wraps ``load_model`` so that, on the HSDP path, weights are processed before sharding."""

    def detect_static(self, site) -> LoadOrder:
        source = site.omni_tree.read(self.target_module.replace(".", "/") + ".py")
        if source is None:
            return LoadOrder(OrderKind.ABSENT, "vllm-omni's diffusion loader is not installed")
        return classify_class_source(source)

    def detect_runtime(self, module) -> LoadOrder:
        cls = getattr(module, CLASS_NAME, None)
        if not isinstance(cls, type):
            return LoadOrder(OrderKind.UNKNOWN, f"{module.__name__} has no class {CLASS_NAME}")
        try:
            return classify_load_order(_parsed_method(cls, METHOD_NAME), _parsed_method(cls, HSDP_LOADER))
        except (OSError, TypeError, SyntaxError) as exc:
            return LoadOrder(OrderKind.UNKNOWN, f"source of {CLASS_NAME} is unavailable ({exc})")

    def decide(self, order: LoadOrder, controls) -> Decision:
        if order.kind == OrderKind.ABSENT:
            return self.decision(Action.PENDING, f"{order.detail}; handled when it is imported")
        if order.kind == OrderKind.PROCESS_AFTER_SHARD:
            return self.decision(Action.PATCHED, "legacy HSDP path processes weights after sharding; quantized "
                                 "weights would not reach the forward", VARIANT)
        if order.kind == OrderKind.UNKNOWN:
            return self.decision(Action.REFUSED, f"HSDP load order not recognized ({order.detail}); left "
                                 f"unpatched. Set VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this")
        return self.decision(Action.SKIPPED, order.detail)

    def prepare(self, owner, order: LoadOrder) -> inspect.Signature:
        """The contract: ``load_model(self, load_device, ..., device=...)``, and the class has the two methods the
        reordering calls. Returns the signature the wrapper binds against."""
        signature = inspect.signature(self.in_place(owner))
        missing_params = [p for p in ("self", "load_device", "device") if p not in signature.parameters]
        missing_methods = [m for m in (LOAD_WEIGHTS, PROCESS, HSDP_LOADER) if not callable(getattr(owner, m, None))]
        if missing_params or missing_methods:
            raise PatchRefusedError(
                f"{self.target_path} has signature {signature} and the class lacks {missing_methods or 'nothing'}; "
                f"expected parameters self, load_device, device (missing: {missing_params or 'none'}) and methods "
                f"{LOAD_WEIGHTS}, {PROCESS}, {HSDP_LOADER}. Left unpatched; set VLLM_COMPAT_DISABLE_PATCHES="
                f"{self.id} to silence this, or upgrade vllm_compat."
            )
        return signature

    def install(self, owner, decision: Decision, signature: inspect.Signature) -> bool:
        def call(wrapped, instance, args, kwargs):
            if instance is None or not getattr(getattr(instance, "parallel_config", None), "use_hsdp", False):
                return wrapped(*args, **kwargs)
            try:
                device = signature.bind(instance, *args, **kwargs).arguments.get("device")
            except TypeError:  # a call load_model itself rejects: let it say so in its own words
                device = None
            if device is None:  # vllm-omni's own HSDP path cannot run without one either
                return wrapped(*args, **kwargs)
            return load_with_processing_before_sharding(wrapped, instance, device, args, kwargs)

        return self.install_call(owner, decision.variant, call)

    def compare(self, static: LoadOrder, runtime: LoadOrder) -> list[str]:
        return [] if static.kind == runtime.kind else [f"HSDP load order {static.kind} != {runtime.kind}"]


DRIFT_POINT = HsdpLoadOrder()
