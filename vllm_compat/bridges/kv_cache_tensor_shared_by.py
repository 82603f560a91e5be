"""Adapter for vllm-omni's ``build_kv_manager`` (AR-diffusion KV), which builds vLLM <= 0.2x's ``KVCacheTensor``.

Why: vLLM's ``vllm.v1.kv_cache_interface.KVCacheTensor`` had the fields ``size, shared_by, offset=0,
block_stride=0`` (every layer in ``shared_by`` views the same ``size`` bytes); vLLM 0.30 (0.29 by vllm-omni's own
later code) replaced them with an explicit placement, ``size, layers, layer_stride, block_stride, offset=0,
host_resident=False``: layer ``l``'s page for block ``b`` starts at ``offset + l * layer_stride + b * block_stride``,
and overlapping ranges alias the same bytes. vllm-omni 0.24.0's
``vllm_omni.experimental.ar_diffusion.kv_cache.manager.build_kv_manager`` still calls ``KVCacheTensor(size=...,
shared_by=layer_names)``, so every AR-diffusion KV cache (``ARDiffusionKVCache``) dies on vLLM 0.30+ with
``TypeError: KVCacheTensor.__init__() got an unexpected keyword argument 'shared_by'`` (37 of vllm-omni 0.24.0's own
tests under ``tests/ar_diffusion`` on vLLM 0.30, 0.33 and 0.34; with this adapter 14 pass and 23 reach the next drift,
vLLM 0.26+'s ``allocate_slots`` reading ``num_in_flight_tokens``, which vllm-omni 0.24.0's request adapter lacks).
When: vLLM's ``KVCacheTensor`` has the placement fields and no ``shared_by`` (read from its dataclass with ``ast``),
and the installed vllm-omni's manager calls it with ``size=`` and ``shared_by=`` only, inside ``build_kv_manager``,
which takes the group's ``spec`` (read from its file): ``build_kv_manager`` is wrapped so that vllm-omni's own body
runs with its ``KVCacheTensor`` resolved, for that call only, to a translator into the new shape. Where vLLM keeps
``shared_by`` (<= 0.2x) it stays out; other call shapes are refused.
Serves: vllm-omni 0.24.0's AR-diffusion KV manager on vLLM 0.30+ (measured on 0.30, 0.33 and 0.34).
Retire when: the oldest supported vllm-omni builds its tensor in the placement shape (later vllm-omni does, through
``vllm_omni.diffusion.diffusion_kv.layout.build_kv_cache_tensor``).

The translation is the old meaning written in the new fields: ``layers=shared_by`` (the same list), ``layer_stride=0``
(every listed layer at the same bytes: aliased, as the old worker gave each of them the one raw tensor),
``block_stride=spec.page_size_bytes`` (an unpacked old tensor was cut into pages of the group spec's page size, block
``b`` at ``b * page``; ``size`` is ``page * num_blocks``), ``offset=0`` (the old default, which vllm-omni leaves;
the old worker ignored ``offset`` on an unpacked tensor, so the translator takes no ``offset`` or ``block_stride`` and a
call with them is refused, not guessed). The page size comes from the ``spec`` the wrapped call is given: the
translator is bound per call, by running ``build_kv_manager``'s code with a copy of its module's globals in which
``KVCacheTensor`` is the translator; vLLM's class stays as it is everywhere, vllm-omni's module binding included.

Who reads the result: nobody. vllm-omni hands the ``KVCacheConfig`` only to vLLM's ``KVCacheManager`` and allocates its
own K/V pools (``allocate_kv_pool_with_views``); vLLM 0.30-0.34's ``KVCacheManager`` (with its coordinator,
single-type managers and block pool) reads ``num_blocks``, ``kv_cache_groups`` and properties derived from the groups,
never ``kv_cache_tensors`` (read from the wheels, and measured: a list that raises on any read goes through
allocation and freeing untouched). Were the tensor ever handed to vLLM's worker allocation (``allocate_kv_cache``), it
would fail there loudly, not mis-address: ``compute_layout_strides`` asserts every stride is positive, and vLLM itself
writes aliased layers as one tensor per layer at the same offset (its GLM-5 layout), which one call returning one
tensor cannot. Later vllm-omni lays the layers side by side instead (a larger allocation), a change of layout, not
what 0.24.0 wrote.
"""

from __future__ import annotations

import ast
import functools
import inspect
import sys
import types
from dataclasses import asdict, dataclass

from ..decide import Action, Decision
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, mark, replace, restore, unwrap
from ..errors import PatchRefusedError
from . import calls_of

NAME = "build_kv_manager"  # the catalogue row's target: vllm-omni's function, wrapped
TENSOR_MODULE, TENSOR = "vllm.v1.kv_cache_interface", "KVCacheTensor"
TENSOR_FILE = TENSOR_MODULE.replace(".", "/") + ".py"
SPEC_PARAM = "spec"  # build_kv_manager's parameter whose page_size_bytes is the block stride
OLD_CALL = ("shared_by", "size")  # the keywords vllm-omni 0.24.0 passes (vLLM <= 0.2x's first two fields)
# vLLM 0.30+: the fields without a default (the translator fills them) and the one with a default it sets.
NEW_REQUIRED = ("block_stride", "layer_stride", "layers", "size")
NEW_SET = "offset"
NO_VLLM = "vLLM is not installed"


class Shape:
    OLD = "shared_by"  # vLLM <= 0.2x's fields / a call with size= and shared_by=
    NEW = "placement"  # vLLM 0.30+'s fields / a call with layers= (the placement)
    NO_CALL = "no_call"  # the manager does not call KVCacheTensor
    ABSENT = "absent"  # vLLM (or vllm-omni's manager) is not installed
    UNKNOWN = "unknown"  # a shape the adapter does not know: refused


@dataclass(frozen=True)
class KVCacheTensorFacts:
    """vLLM's ``KVCacheTensor`` fields (required, with defaults) and their shape; the manager's calls (``"line N:
    keywords (in function)"``) and their shape; what was found where a side is not a known shape."""

    fields: str
    calls: str
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    call_lines: tuple[str, ...] = ()
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


# ---- shapes: vLLM's dataclass, vllm-omni's calls (the static and runtime detections share these) ----

def fields_shape(required: tuple[str, ...], optional: tuple[str, ...]) -> str:
    if "shared_by" in required + optional:
        return Shape.OLD
    if tuple(sorted(required)) == NEW_REQUIRED and NEW_SET in optional:
        return Shape.NEW
    return Shape.UNKNOWN


def fields_from_source(source: str | None) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(required, with default) field names of the ``KVCacheTensor`` dataclass in ``source``; None without it."""
    if source is None:
        return None
    cls = next((n for n in parse_source(source).body if isinstance(n, ast.ClassDef) and n.name == TENSOR), None)
    if cls is None:
        return None
    fields = [n for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
              and "ClassVar" not in ast.unparse(n.annotation)]
    return (tuple(f.target.id for f in fields if f.value is None),
            tuple(f.target.id for f in fields if f.value is not None))


def fields_from_class(cls) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    from dataclasses import MISSING, fields, is_dataclass

    if not (isinstance(cls, type) and is_dataclass(cls)):
        return None
    found = fields(cls)
    required = tuple(f.name for f in found if f.default is MISSING and f.default_factory is MISSING)
    return required, tuple(f.name for f in found if f.name not in required)


def classify_calls(source: str) -> tuple[str, tuple[str, ...], str]:
    """(``Shape``, ``"line N: keywords (in function)"`` per call, detail) of the calls of vLLM's ``KVCacheTensor``
    in the manager's ``source``. Old-shaped means: keywords ``size`` and ``shared_by`` only, inside
    ``build_kv_manager`` (the function the adapter wraps), which takes ``spec``."""
    try:
        tree = parse_source(source)
        found = calls_of(source, TENSOR_MODULE, TENSOR)
    except SyntaxError as exc:
        return Shape.UNKNOWN, (), f"the manager does not parse: {exc.msg} (line {exc.lineno})"
    if not found:
        return Shape.NO_CALL, (), f"the manager does not call {TENSOR}"
    builder = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == NAME), None)
    span = range(builder.lineno, builder.end_lineno + 1) if builder is not None else range(0)
    takes_spec = builder is not None and SPEC_PARAM in [a.arg for a in builder.args.posonlyargs + builder.args.args]
    shapes, lines = set(), []
    for call in found:
        keywords = tuple(sorted(str(k.arg) for k in call.keywords))
        shape = Shape.UNKNOWN
        if not call.args and "layers" in keywords:
            shape = Shape.NEW
        elif not call.args and keywords == OLD_CALL and call.lineno in span and takes_spec:
            shape = Shape.OLD
        shapes.add(shape)
        where = NAME if call.lineno in span else "elsewhere"
        lines.append(f"line {call.lineno}: {', '.join(keywords)}{' +positional' if call.args else ''} (in {where})")
    if len(shapes) == 1:
        return shapes.pop(), tuple(lines), ""
    return Shape.UNKNOWN, tuple(lines), "the calls have different shapes"


def facts_from(fields, caller: tuple[str, tuple[str, ...], str], fields_detail: str = "") -> KVCacheTensorFacts:
    """The facts from ``fields`` (``(required, with default)``, None where vLLM's class was not found: ``Shape.ABSENT``
    without vLLM, else unknown) and the manager's ``caller`` shape."""
    if fields is None:
        required, optional, shape = (), (), Shape.ABSENT if fields_detail == NO_VLLM else Shape.UNKNOWN
    else:
        (required, optional), shape = fields, fields_shape(*fields)
        if shape == Shape.UNKNOWN:
            fields_detail = f"{TENSOR} has required fields {list(required)} and defaulted {list(optional)}"
    details = [d for d in (fields_detail, caller[2]) if d]
    return KVCacheTensorFacts(shape, caller[0], required, optional, caller[1], "; ".join(details))


# ---- the adapter ----

def as_placement(tensor_cls, page_size: int, size: int, shared_by):
    """vLLM <= 0.2x's ``KVCacheTensor(size, shared_by)``, every listed layer viewing the same ``size`` bytes in pages
    of ``page_size``, as vLLM 0.30+'s placement: the layers aliased (layer stride 0), block ``b`` at ``b * page``."""
    return tensor_cls(size=size, layers=shared_by, layer_stride=0, block_stride=page_size, offset=0)


def make_adapter(original, tensor_cls, entry_id: str):
    """``build_kv_manager`` running vllm-omni's own code, its ``KVCacheTensor`` bound to ``as_placement`` for the
    call's ``spec`` (in a copy of the module's globals, made per call: the module keeps vLLM's class)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def build_kv_manager(*args, **kwargs):
        spec = signature.bind(*args, **kwargs).arguments[SPEC_PARAM]
        namespace = dict(original.__globals__)
        namespace[TENSOR] = functools.partial(as_placement, tensor_cls, spec.page_size_bytes)
        body = types.FunctionType(original.__code__, namespace, original.__name__, original.__defaults__)
        body.__kwdefaults__ = original.__kwdefaults__
        return body(*args, **kwargs)

    build_kv_manager.__doc__ = (f"{original.__doc__ or ''}\n\n(vllm_compat's adapter, {entry_id}: the old "
                                f"{TENSOR}(size, shared_by) built as vLLM 0.30+'s placement.)")
    return mark(build_kv_manager, entry_id)


@dataclass(frozen=True)
class _Target:
    original: object
    tensor_cls: type


class KVCacheTensorSharedBy(DriftPoint):
    # the behavioural scan's finding: the dataclass's generated constructor takes no shared_by
    handles_drift = (("call", "*.KVCacheTensor.__init__", "*.build_kv_manager", "shared_by"),)

    @property
    def manager_file(self) -> str:
        return self.target_module.replace(".", "/") + ".py"

    def detect_static(self, site) -> KVCacheTensorFacts:
        fields, fields_detail = None, NO_VLLM
        if site.vllm_tree.has_package("vllm"):
            fields = fields_from_source(site.vllm_tree.read(TENSOR_FILE))
            fields_detail = "" if fields is not None else f"{TENSOR_FILE} defines no {TENSOR}"
        source = site.omni_tree.read(self.manager_file)
        if source is not None:
            caller = classify_calls(source)
        elif site.omni_tree.has_package("vllm_omni"):
            caller = (Shape.NO_CALL, (), f"this vllm-omni has no {self.manager_file}")
        else:
            caller = (Shape.ABSENT, (), "vllm-omni is not installed")
        return facts_from(fields, caller, fields_detail)

    def detect_runtime(self, module) -> KVCacheTensorFacts:
        """The fields from vLLM's live class (``dataclasses.fields``); the calls from the imported manager's file."""
        try:
            caller = classify_calls(inspect.getsource(module))
        except (OSError, TypeError) as exc:
            caller = (Shape.UNKNOWN, (), f"source of {module.__name__} is unavailable ({exc})")
        cls = getattr(sys.modules.get(TENSOR_MODULE), TENSOR, None)
        fields = fields_from_class(cls)
        return facts_from(fields, caller, "" if fields is not None else f"{TENSOR_MODULE}.{TENSOR} is {cls!r}")

    def decide(self, facts: KVCacheTensorFacts, controls=None) -> Decision:
        if Shape.ABSENT in (facts.fields, facts.calls):
            return self.decision(Action.PENDING, f"vLLM or vllm-omni is not installed ({facts.detail}); decided "
                                 f"when {self.target_module} is imported")
        if facts.calls == Shape.NO_CALL:
            return self.decision(Action.SKIPPED, facts.detail)
        if Shape.UNKNOWN in (facts.fields, facts.calls):
            return self.refused(f"{TENSOR} or its calls have a shape the adapter does not know ({facts.detail}; "
                                f"calls: {list(facts.call_lines)})")
        if facts.fields == facts.calls:
            return self.decision(Action.SKIPPED, f"vllm-omni builds {TENSOR} the way this vLLM defines it "
                                 f"({facts.fields})")
        if facts.calls == Shape.OLD:
            return self.decision(Action.PATCHED, f"vLLM's {TENSOR} has no shared_by (0.30+: layers, layer_stride, "
                                 f"block_stride) and vllm-omni's {NAME} passes it; built as the placement (layers "
                                 "aliased, pages of the spec's page size)")
        return self.refused(f"vllm-omni builds {TENSOR} with layers= (vLLM 0.30+), but this vLLM has shared_by; "
                            "vllm_compat adapts only old callers to new vLLMs")

    def prepare(self, owner, facts) -> _Target:
        """The contract: ``build_kv_manager`` is a plain function without closure that names ``KVCacheTensor`` and
        takes ``spec``; the module's ``KVCacheTensor`` is vLLM's live class, with the placement fields."""
        original = unwrap(vars(owner).get(NAME), self.id)
        bound = vars(owner).get(TENSOR)
        live = getattr(sys.modules.get(TENSOR_MODULE), TENSOR, None)
        problems = []
        if not isinstance(original, types.FunctionType):
            problems.append(f"{owner.__name__}.{NAME} is {original!r}, not a function")
        elif (original.__code__.co_freevars or TENSOR not in original.__code__.co_names
              or SPEC_PARAM not in inspect.signature(original).parameters):
            problems.append(f"{NAME}{inspect.signature(original)} (free variables "
                            f"{list(original.__code__.co_freevars)}) does not read the global {TENSOR} with a "
                            f"{SPEC_PARAM} parameter")
        if bound is None or bound is not live:
            problems.append(f"{owner.__name__}.{TENSOR} is {bound!r}, not {TENSOR_MODULE}.{TENSOR} ({live!r})")
        fields = fields_from_class(live)
        if fields is None or fields_shape(*fields) != Shape.NEW:
            problems.append(f"{TENSOR_MODULE}.{TENSOR} has fields {fields}, not the placement "
                            f"({', '.join(NEW_REQUIRED)}, {NEW_SET}=0)")
        if problems:
            raise PatchRefusedError(f"{self.target_path} cannot be adapted: {'; '.join(problems)}. Left as it is; "
                                    f"set VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, or upgrade "
                                    "vllm_compat.")
        return _Target(original, live)

    def install(self, owner, decision, target: _Target) -> bool:
        """Wrap the module's ``build_kv_manager``; False when ours is already there."""
        return replace(owner, NAME, lambda original: make_adapter(target.original, target.tensor_cls, self.id),
                       self.id)

    def uninstall(self, owner) -> bool:
        """Put back vllm-omni's exact function; False when the binding is not ours."""
        return restore(owner, NAME, self.id)


DRIFT_POINT = KVCacheTensorSharedBy()
