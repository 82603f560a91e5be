"""Call adapter for vLLM's ``MultiModalHasher.hash_kwargs`` in vllm-omni's ``AsyncOmniEngine._ensure_stage_replica_mm_uuids``: the ``algorithm``.

Why: up to vLLM 0.27.0, ``MultiModalHasher.hash_kwargs(**kwargs)`` chose its hash itself (the
``VLLM_MM_HASHER_ALGORITHM`` environment variable, default ``blake3``). vLLM 0.27.1 moved the choice into the engine's
config (vllm-project/vllm#49686: ``MultiModalConfig.mm_hasher_algorithm``, ``--mm-hasher-algorithm``, default
``blake3``; the variable is gone)
and made it ``hash_kwargs``'s first, positional-only argument, which vLLM's own callers take from the model config
(the multimodal processor: ``self.info.ctx.get_mm_config().mm_hasher_algorithm``). vllm-omni 0.24.0 scopes stage-0
multimodal cache keys to a replica with content hashes of its own, ``MultiModalHasher.hash_kwargs(model_id=...,
**{modality: item})``, so every request with multimodal data to an LLM stage 0 with several replicas (offline and
served) fails with ``TypeError: MultiModalHasher.hash_kwargs() missing 1 required positional argument:
'algorithm'`` (3 of vllm-omni 0.24.0's own tests on vLLM 0.30, 0.33 and 0.34).
When: vLLM's ``hash_kwargs`` takes a required positional argument and the installed vllm-omni's method calls it with
keywords only (both read from the files with ``ast``; at run time, the method's own source):
``AsyncOmniEngine._ensure_stage_replica_mm_uuids`` gets a wrapper that first gives each item without a UUID its
content hash, computed by vLLM's ``hash_kwargs`` with the arguments vllm-omni passes plus the algorithm of the engine's
stage-0 model config (``input_processor.model_config.multimodal_config.mm_hasher_algorithm``, where vLLM's processor
reads it; vLLM's ``MultiModalConfig`` default where the engine has none), then calls vllm-omni's own method, which
scopes those UUIDs to the replica as it scoped its own hashes. vLLM's hasher is untouched. A vLLM whose
``hash_kwargs`` chooses the algorithm itself (<= 0.27.0), or a vllm-omni that passes it, stays as it is.
Serves: vllm-omni 0.24.0 on vLLM 0.27.1+ (read from the 0.24.0, 0.30.0, 0.33.0 and 0.34.0 wheels; vllm-omni's own
tests measured on 0.30, 0.33 and 0.34).
Retire when: the oldest supported vllm-omni passes the algorithm to ``MultiModalHasher.hash_kwargs``.

The UUIDs are the ones the native pair gives (vllm-omni 0.24.0 on vLLM 0.24 hashed with vLLM's configured algorithm):
vLLM's own content hash of the item (``ProcessorInputs.get_mm_hashes`` for a request without processor kwargs, which
vllm-omni's hash never included) under the algorithm vLLM's processor uses for the same engine.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, replace, restore, unwrap

HASHER_FILE = "vllm/multimodal/hasher.py"
ENGINE_FILE = "vllm_omni/engine/async_omni_engine.py"
HASHER, HASH = "MultiModalHasher", "hash_kwargs"
ENGINE, METHOD = "AsyncOmniEngine", "_ensure_stage_replica_mm_uuids"
ITEMS = "_iter_multimodal_items"  # vllm-omni's own helper the method lists a modality's items with
METHOD_PARAMETERS = ("self", "prompt", "stage_id", "replica_id")  # vllm-omni 0.24.0's; the last two keyword-only


class Shape:
    REQUIRES = "requires"  # vLLM's hash_kwargs takes the algorithm as a required positional argument (0.27.1+)
    CHOOSES = "chooses"  # vLLM's hash_kwargs(**kwargs) chooses the algorithm itself (<= 0.27.0)
    OMITS = "omits"  # vllm-omni's method calls hash_kwargs with keywords only (0.24.0)
    PASSES = "passes"  # vllm-omni's method passes a positional argument (the algorithm)
    UNKNOWN = "unknown"
    ABSENT = "absent"


@dataclass(frozen=True)
class HasherAlgorithmFacts:
    vllm: str
    omni: str

    def to_dict(self) -> dict:
        return asdict(self)


def _member(nodes, kind, name):
    return next((n for n in nodes if isinstance(n, kind) and n.name == name), None)


def vllm_shape_from_source(source: str | None) -> str:
    """Whether vLLM's ``MultiModalHasher.hash_kwargs`` (its file) requires a positional argument after ``cls``."""
    hasher = _member(parse_source(source).body, ast.ClassDef, HASHER) if source is not None else None
    method = hasher and _member(hasher.body, ast.FunctionDef, HASH)
    if method is None:
        return Shape.ABSENT
    args = method.args
    positional = (args.posonlyargs + args.args)[1:]  # after cls
    if len(positional) > len(args.defaults):
        return Shape.REQUIRES
    return Shape.CHOOSES if args.kwarg is not None else Shape.UNKNOWN


def omni_shape_from_method(method: ast.AST | None) -> str:
    """How the method (its ``def`` node) calls ``*.hash_kwargs``: with keywords only, or with a positional."""
    calls = [n for n in ast.walk(method) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and n.func.attr == HASH] if method is not None else []
    if not calls:
        return Shape.ABSENT
    return Shape.OMITS if any(not call.args for call in calls) else Shape.PASSES


def omni_shape_from_source(source: str | None) -> str:
    engine = _member(parse_source(source).body, ast.ClassDef, ENGINE) if source is not None else None
    return omni_shape_from_method(engine and _member(engine.body, ast.FunctionDef, METHOD))


def omni_shape_from_function(function) -> str:
    """The same, from the live function's source (``inspect.getsource``)."""
    import inspect
    import textwrap

    try:
        source = textwrap.dedent(inspect.getsource(function))
    except (OSError, TypeError):
        return Shape.UNKNOWN
    return omni_shape_from_method(_member(parse_source(source).body, ast.FunctionDef, function.__name__))


@dataclass(frozen=True)
class VllmAlgorithms:
    """What vLLM's config allows and gives an engine that names no algorithm (read in ``prepare``)."""
    names: tuple[str, ...]
    default: str


def field_default(field) -> object:
    """The value a config dataclass gives ``field`` when it is not passed: its default, or what its default factory
    makes, either written plainly or through pydantic's ``Field(default=...)`` / ``Field(default_factory=...)``
    (vLLM 0.27.1-0.29's ``mm_hasher_algorithm``, whose factory still reads the deprecated
    ``VLLM_MM_HASHER_ALGORITHM``; 0.30+ writes ``"blake3"``)."""
    import dataclasses

    if field.default is dataclasses.MISSING:
        return field.default_factory()  # TypeError from MISSING's call: the caller's refusal
    if type(field.default).__name__ != "FieldInfo":
        return field.default
    info = field.default
    return info.default_factory() if info.default_factory is not None else info.default


def vllm_algorithms() -> VllmAlgorithms:
    """The names of vLLM's ``MMHasherAlgorithm`` and ``MultiModalConfig.mm_hasher_algorithm``'s default (what
    ``EngineArgs`` gives without ``--mm-hasher-algorithm``); ``PatchRefusedError`` where vLLM's config has neither."""
    import dataclasses
    import typing

    from ..errors import PatchRefusedError

    try:
        from vllm.config import multimodal

        names = typing.get_args(multimodal.MMHasherAlgorithm)
        field = {f.name: f for f in dataclasses.fields(multimodal.MultiModalConfig)}["mm_hasher_algorithm"]
        default = field_default(field)
    except (ImportError, AttributeError, KeyError, TypeError) as exc:
        raise PatchRefusedError(f"vLLM's hash_kwargs requires an algorithm, but vllm.config.multimodal does not say "
                                f"which ones there are and which is the default (MMHasherAlgorithm, MultiModalConfig."
                                f"mm_hasher_algorithm: {type(exc).__name__}: {exc}); left as it is.") from exc
    if default not in names:
        raise PatchRefusedError(f"vLLM's MultiModalConfig.mm_hasher_algorithm default {default!r} is not one of "
                                f"MMHasherAlgorithm {names!r}; left as it is.")
    return VllmAlgorithms(tuple(names), default)


def engine_algorithm(engine, algorithms: VllmAlgorithms) -> str:
    """The algorithm vLLM's multimodal processor hashes the engine's stage-0 requests with: its input processor's
    model config's ``multimodal_config.mm_hasher_algorithm``; vLLM's default where there is none (a text-only model
    config, or an engine built without one, as vllm-omni's tests build it)."""
    model_config = getattr(getattr(engine, "input_processor", None), "model_config", None)
    name = getattr(getattr(model_config, "multimodal_config", None), "mm_hasher_algorithm", None)
    return name if isinstance(name, str) and name in algorithms.names else algorithms.default


def give_content_uuids(engine, prompt, algorithm: str) -> None:
    """Give each multimodal item of ``prompt`` without a UUID the content hash vllm-omni's method would compute
    (``hash_kwargs(model_id=..., **{modality: item})``, with ``algorithm``), in ``multi_modal_uuids``, walking the
    items as the method does; the method then finds a UUID for every item and scopes it. Prompts the method leaves
    alone (not a dict, no multimodal data, no items) are left alone."""
    if not isinstance(prompt, dict):
        return
    mm_data = prompt.get("multi_modal_data")
    if not isinstance(mm_data, dict) or not mm_data:
        return
    from vllm.multimodal.hasher import MultiModalHasher

    given = prompt.get("multi_modal_uuids")
    given = given if isinstance(given, dict) else {}
    model_id = str(getattr(engine, "model", ""))
    uuids = dict(given)
    for modality, raw_items in mm_data.items():
        items = engine._iter_multimodal_items(raw_items)
        if not items:
            continue
        own = given.get(modality)
        own = own if isinstance(own, list) else [own] if own is not None else []
        uuids[modality] = [
            own[i] if i < len(own) and own[i] is not None else None if item is None
            else MultiModalHasher.hash_kwargs(algorithm, model_id=model_id, **{modality: item})
            for i, item in enumerate(items)]
    if uuids != given:
        prompt["multi_modal_uuids"] = uuids


def method_shape_problem(function) -> str | None:
    """What is wrong with ``function`` as vllm-omni 0.24.0's method, or None."""
    import inspect

    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return f"{function!r} has no signature"
    keyword_only = all(params[name].kind == params[name].KEYWORD_ONLY for name in METHOD_PARAMETERS[2:]
                       if name in params)
    if tuple(params) != METHOD_PARAMETERS or not keyword_only:
        return f"its parameters are {tuple(params)!r}, expected (self, prompt, *, stage_id, replica_id)"
    return None


class MmHasherAlgorithm(DriftPoint):
    handles_drift = (("call", "*.MultiModalHasher.hash_kwargs", "*._ensure_stage_replica_mm_uuids", "algorithm"),)

    def detect_static(self, site) -> HasherAlgorithmFacts:
        return HasherAlgorithmFacts(vllm_shape_from_source(site.vllm_tree.read(HASHER_FILE)),
                                    omni_shape_from_source(site.omni_tree.read(ENGINE_FILE)))

    def detect_runtime(self, module) -> HasherAlgorithmFacts:
        from ..detect.source_tree import tree_of

        method = self.in_place(self.locate(module))
        omni = omni_shape_from_function(unwrap(method, self.id)) if method is not None else Shape.ABSENT
        return HasherAlgorithmFacts(vllm_shape_from_source(tree_of("vllm").read(HASHER_FILE)), omni)

    def decide(self, facts: HasherAlgorithmFacts, controls=None):
        where = f"{ENGINE}.{METHOD}"
        if facts.omni == Shape.ABSENT:
            return self.decision(Action.SKIPPED, f"no installed vllm-omni calls {HASHER}.{HASH} in {where}")
        if facts.omni == Shape.PASSES:
            return self.decision(Action.SKIPPED, f"vllm-omni's {where} passes the algorithm to {HASH}")
        if facts.vllm == Shape.ABSENT:
            return self.decision(Action.SKIPPED, f"this vLLM has no {HASHER}.{HASH} ({HASHER_FILE})")
        if facts.vllm == Shape.CHOOSES:
            return self.decision(Action.SKIPPED, f"vLLM's {HASH} chooses the algorithm itself (<= 0.27.0)")
        if Shape.UNKNOWN in (facts.vllm, facts.omni):
            return self.refused(f"the shapes are not the measured ones ({facts})")
        return self.decision(Action.PATCHED, f"vLLM's {HASH} requires the algorithm (0.27.1+), which vllm-omni's "
                             f"{where} does not pass; the items get their content hashes with the engine's "
                             "mm_hasher_algorithm before vllm-omni's method scopes them")

    def locate(self, module):
        cls = getattr(module, ENGINE, None)
        return cls if isinstance(cls, type) and METHOD in vars(cls) else None

    def in_place(self, owner):
        return vars(owner).get(METHOD) if owner is not None else None

    def prepare(self, owner, facts) -> VllmAlgorithms:
        from ..errors import PatchRefusedError

        current = unwrap(self.in_place(owner), self.id)
        problem = ("it is not there" if current is None else method_shape_problem(current)
                   or (None if callable(getattr(owner, ITEMS, None)) else f"{ENGINE}.{ITEMS} is missing"))
        if problem:
            raise PatchRefusedError(f"{ENGINE}.{METHOD} is not vllm-omni 0.24.0's ({problem}); left as it is.")
        return vllm_algorithms()

    def install(self, owner, decision, state: VllmAlgorithms) -> bool:
        algorithms = state or vllm_algorithms()

        def make_wrapper(original):
            @functools.wraps(original)
            def _ensure_stage_replica_mm_uuids(self, prompt, *args, **kwargs):
                give_content_uuids(self, prompt, engine_algorithm(self, algorithms))
                return original(self, prompt, *args, **kwargs)  # vllm-omni's own: scopes them to the replica

            return _ensure_stage_replica_mm_uuids

        return replace(owner, METHOD, make_wrapper, self.id)

    def uninstall(self, owner) -> bool:
        return restore(owner, METHOD, self.id)


DRIFT_POINT = MmHasherAlgorithm()
