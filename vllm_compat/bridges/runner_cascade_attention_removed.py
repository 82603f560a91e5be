"""Adapter for vllm-omni's runners' cascade-attention lines: vLLM 0.32 removed cascade attention from ``GPUModelRunner``.

Why: vllm-omni 0.24.0-0.30.0's ``GPUARModelRunner.execute_model`` and ``GPUGenerationModelRunner.execute_model``
(``vllm_omni/worker/gpu_ar_model_runner.py``, ``gpu_generation_model_runner.py``) copy what vLLM 0.24's
``execute_model`` did: ``cascade_attn_prefix_lens = None``; only ``if self.cascade_attn_enabled and not
self.parallel_config.use_ubatching`` (cascade attention switched on in the config, ``disable_cascade_attn=False``,
without micro-batching), ``self._compute_cascade_attn_prefix_lens(...)``; then, every step,
``self._build_attention_metadata(..., cascade_attn_prefix_lens=cascade_attn_prefix_lens, ...)``. vLLM 0.32 removed
cascade attention: ``GPUModelRunner`` lost ``_compute_cascade_attn_prefix_lens``, its ``_build_attention_metadata``
lost the ``cascade_attn_prefix_lens`` parameter, and its ``__init__`` pins ``cascade_attn_enabled = False`` ("kept for
out-of-tree model runners"). So on vLLM 0.32-0.33 every AR and generation step that schedules tokens dies with
``TypeError: GPUModelRunner._build_attention_metadata() got an unexpected keyword argument
'cascade_attn_prefix_lens'``; a runner whose ``cascade_attn_enabled`` is true (set by something other than vLLM's
``__init__``) dies one line earlier with ``AttributeError: ... '_compute_cascade_attn_prefix_lens'``.
When: vLLM's ``GPUModelRunner`` lacks ``_compute_cascade_attn_prefix_lens`` and a vllm-omni runner calls it with
vLLM 0.31's three arguments, and / or vLLM's ``_build_attention_metadata`` takes no ``cascade_attn_prefix_lens`` and a
vllm-omni runner passes it (all read from the files with ``ast``). vllm-omni's base ``OmniGPUModelRunner`` (never
vLLM's class) is given ``_compute_cascade_attn_prefix_lens`` returning None (no cascade: what vLLM 0.32+ does for
every batch) and a ``_build_attention_metadata`` calling vLLM's that drops ``cascade_attn_prefix_lens`` where the
method it calls does not take it and the value is None; a value that is not None is refused with
``CascadeAttentionRemovedError`` (never silently a different attention). vLLM 0.31 and older (both there), a
vllm-omni whose runners use neither: nothing to do. A call of another arity, a caller class not deriving ``OmniGPUModelRunner``,
a vLLM runner without ``_build_attention_metadata``: refused.
Serves: vllm-omni 0.24.0 / 0.26.0 / 0.28.0 / 0.30.0 on vLLM 0.32-0.33 (read from the 0.31.0-0.34.0 wheels; 0.34 has
no V1 model runner, so those stages are left out there).
Retire when: the oldest supported vllm-omni's runners no longer compute or pass ``cascade_attn_prefix_lens``.

Nothing is left out: vLLM 0.32+ itself runs every batch without cascade attention, which is what the runners get.
Why the base class and no context variable: the two runners live in two modules (the generation runner's imports the
AR runner's), both derive ``OmniGPUModelRunner``, whose module both import first; and no caller that works today is
changed, since only a call passing ``cascade_attn_prefix_lens`` to a method that does not take it (a ``TypeError``
without us) is adapted: vLLM 0.32+'s own callers never pass it, and a call without it goes straight through. Both
methods defer to the next class of the runner's MRO: vllm-omni's NPU runners (``OmniGPUModelRunner`` first, then
vllm-ascend's ``NPUModelRunner``) keep vllm-ascend's ``_compute_cascade_attn_prefix_lens`` and a
``_build_attention_metadata`` that still takes the keyword gets it.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, provide, withdraw
from ..errors import VllmCompatError

VLLM_RUNNER = "vllm/v1/worker/gpu_model_runner.py"
VLLM_CLASS, OMNI_BASE = "GPUModelRunner", "OmniGPUModelRunner"  # vllm-omni's base of its GPU runners: the owner
OMNI_RUNNERS = ("vllm_omni/worker/gpu_ar_model_runner.py", "vllm_omni/worker/gpu_generation_model_runner.py")
COMPUTE, BUILD, KEYWORD = "_compute_cascade_attn_prefix_lens", "_build_attention_metadata", "cascade_attn_prefix_lens"
COMPUTE_ARGS = 3  # vLLM 0.31's (num_scheduled_tokens, num_computed_tokens, num_common_prefix_blocks)


class Shape:
    NOT_INSTALLED = "not-installed"  # vLLM or vllm-omni not installed
    NO_V1_RUNNER = "no-v1-runner"  # vLLM has no V1 GPUModelRunner (0.34 removed it)
    NO_CALLER = "no-caller"  # no vllm-omni GPU runner computes or passes cascade prefix lengths
    KEPT = "kept"  # vLLM still has both (<= 0.31)
    REMOVED = "removed"  # vLLM lacks what vllm-omni's runners call (0.32, 0.33)


@dataclass(frozen=True)
class CascadeFacts:
    shape: str
    callers: tuple[str, ...] = ()  # "Class.method: what" of each old-shape call in vllm-omni's GPU runners
    provides: tuple[str, ...] = ()  # the methods to give OmniGPUModelRunner (COMPUTE and / or BUILD)
    misfits: tuple[str, ...] = ()  # what the adapter cannot serve (each a phrase): refused

    def to_dict(self) -> dict:
        return asdict(self)


class CascadeAttentionRemovedError(VllmCompatError, TypeError):
    """A vllm-omni runner passed cascade prefix lengths to a vLLM that no longer does cascade attention."""


# ---- reading the files ----

def _class(tree, name: str):
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)


def _methods(cls) -> dict:
    return {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}


def _self_calls(function, name: str) -> list[ast.Call]:
    """The calls ``self.<name>(...)`` in ``function``'s body."""
    return [n for n in ast.walk(function) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == name and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"]


def takes_keyword(function) -> bool:
    """Whether the parsed ``function`` takes ``cascade_attn_prefix_lens`` (by name or through ``**kwargs``)."""
    args = function.args
    return args.kwarg is not None or KEYWORD in {a.arg for a in args.args + args.kwonlyargs}


def old_shape_calls(tree) -> tuple[list[str], list[str], list[str]]:
    """In vllm-omni's runner module ``tree``: (calls of ``_compute_cascade_attn_prefix_lens``, calls of
    ``_build_attention_metadata`` passing ``cascade_attn_prefix_lens``, misfits), each call as ``Class.method``."""
    computes, passes, misfits = [], [], []
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        bases = {getattr(b, "id", None) or getattr(b, "attr", None) for b in cls.bases}
        for name, method in _methods(cls).items():
            where = f"{cls.name}.{name}"
            for call in _self_calls(method, COMPUTE):
                computes.append(where)
                if len(call.args) != COMPUTE_ARGS or call.keywords:
                    misfits.append(f"{where} calls {COMPUTE} with {len(call.args)} positional arguments and "
                                   f"{len(call.keywords)} keywords, not vLLM 0.31's {COMPUTE_ARGS} positional ones")
            if any(k.arg == KEYWORD for call in _self_calls(method, BUILD) for k in call.keywords):
                passes.append(where)
            if where in computes + passes and OMNI_BASE not in bases and cls.name != OMNI_BASE:
                misfits.append(f"{cls.name} does not derive {OMNI_BASE}, which the adapter gives the methods")
    return computes, passes, misfits


def facts_of(vllm_tree, omni_tree) -> CascadeFacts:
    if not (vllm_tree.has_package("vllm") and omni_tree.has_package("vllm_omni")):
        return CascadeFacts(Shape.NOT_INSTALLED)
    runner = vllm_tree.read(VLLM_RUNNER)
    cls = _class(parse_source(runner), VLLM_CLASS) if runner is not None else None
    if cls is None:
        return CascadeFacts(Shape.NO_V1_RUNNER)
    computes, passes, misfits = [], [], []
    for path in OMNI_RUNNERS:
        source = omni_tree.read(path)
        if source is not None:
            found = old_shape_calls(parse_source(source))
            computes, passes, misfits = computes + found[0], passes + found[1], misfits + found[2]
    if not computes and not passes:
        return CascadeFacts(Shape.NO_CALLER)
    methods = _methods(cls)
    callers = tuple(dict.fromkeys([f"{c}: calls {COMPUTE}" for c in computes] + [f"{c}: passes {KEYWORD}" for c in passes]))
    if passes and BUILD not in methods:
        misfits.append(f"vLLM's {VLLM_CLASS} has no {BUILD} to call")
    provides = tuple(name for name, needed in (
        (COMPUTE, computes and COMPUTE not in methods),
        (BUILD, passes and BUILD in methods and not takes_keyword(methods[BUILD]))) if needed)
    if not provides and not misfits:
        return CascadeFacts(Shape.KEPT, callers)
    return CascadeFacts(Shape.REMOVED, callers, provides, tuple(dict.fromkeys(misfits)))


# ---- what is installed on OmniGPUModelRunner ----

def _next_in_mro(runner, function, name: str):
    """``name`` as the class after the one holding ``function`` (ours) in ``runner``'s MRO gives it; None if none."""
    owner = next(k for k in type(runner).__mro__ if vars(k).get(name) is function)
    return getattr(super(owner, runner), name, None)


@functools.cache
def _accepts_keyword(function) -> bool:
    import inspect

    parameters = inspect.signature(function).parameters.values()
    return any(p.name == KEYWORD or p.kind is p.VAR_KEYWORD for p in parameters)


def _compute_cascade_attn_prefix_lens(self, num_scheduled_tokens, num_computed_tokens, num_common_prefix_blocks):
    """None: no cascade attention, which is what vLLM 0.32+ runs every batch with (vllm_compat's adapter,
    ``vllm_compat.bridges.runner_cascade_attention_removed``; vLLM 0.31's signature). Where a later class of the
    runner still defines it (vllm-ascend's NPU runner), its answer."""
    inherited = _next_in_mro(self, _compute_cascade_attn_prefix_lens, COMPUTE)
    if inherited is not None:
        return inherited(num_scheduled_tokens, num_computed_tokens, num_common_prefix_blocks)
    return None


def _build_attention_metadata(self, *args, **kwargs):
    """vLLM's ``GPUModelRunner._build_attention_metadata``; a ``cascade_attn_prefix_lens=None`` it does not take (vLLM
    0.32+) is dropped, one that is not None refused (vllm_compat's adapter,
    ``vllm_compat.bridges.runner_cascade_attention_removed``)."""
    method = _next_in_mro(self, _build_attention_metadata, BUILD)
    if KEYWORD in kwargs and not _accepts_keyword(getattr(method, "__func__", method)):
        if kwargs[KEYWORD] is not None:
            raise CascadeAttentionRemovedError(
                f"{type(self).__name__} passed {KEYWORD}={kwargs[KEYWORD]!r} to vLLM's {BUILD}, which no longer "
                "does cascade attention (removed in vLLM 0.32) and has no such parameter. Dropping it would change "
                "the attention computed, so vllm_compat refuses: set disable_cascade_attn=True (vLLM's default) or "
                "run this vllm-omni on the vLLM it was made for.")
        kwargs = {k: v for k, v in kwargs.items() if k != KEYWORD}
    return method(*args, **kwargs)


PROVIDED = {COMPUTE: _compute_cascade_attn_prefix_lens, BUILD: _build_attention_metadata}


# ---- the drift point ----

class RunnerCascadeAttentionRemoved(DriftPoint):
    handles_drift = (("attribute", f"*.{VLLM_CLASS}.{COMPUTE}", "*", COMPUTE),
                     ("call", f"*.{VLLM_CLASS}.{BUILD}", "*", KEYWORD))

    def detect_static(self, site) -> CascadeFacts:
        return facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> CascadeFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def decide(self, facts: CascadeFacts, controls=None):
        if facts.shape == Shape.NOT_INSTALLED:
            return self.decision(Action.PENDING, "vLLM or vllm-omni is not installed; decided when vllm-omni's GPU "
                                 "runners are imported")
        if facts.shape == Shape.NO_V1_RUNNER:
            return self.decision(Action.SKIPPED, f"vLLM has no V1 {VLLM_CLASS} ({VLLM_RUNNER} is absent, removed in "
                                 "0.34): vllm-omni's AR and generation runners do not run on this vLLM")
        if facts.shape == Shape.NO_CALLER:
            return self.decision(Action.SKIPPED, "the installed vllm-omni's GPU runners neither compute nor pass "
                                 "cascade attention prefix lengths")
        if facts.shape == Shape.KEPT:
            return self.decision(Action.SKIPPED, f"vLLM's {VLLM_CLASS} still has {COMPUTE} and a {BUILD} taking "
                                 f"{KEYWORD}, as vllm-omni's runners expect")
        if facts.misfits:
            return self.refused("; ".join(facts.misfits))
        gives = " and ".join({COMPUTE: f"{COMPUTE} returning None", BUILD: f"a {BUILD} dropping {KEYWORD}=None "
                              "(a value that is not None is refused)"}[name] for name in facts.provides)
        return self.decision(Action.PATCHED, f"vLLM's {VLLM_CLASS} no longer does cascade attention (removed in "
                             f"0.32) where vllm-omni's {', '.join(dict.fromkeys(c.split(':')[0] for c in facts.callers))}"
                             f" still use it; {OMNI_BASE} gets {gives}. Nothing is left out: vLLM itself runs every "
                             "batch without cascade attention")

    def locate(self, module):
        cls = getattr(module, OMNI_BASE, None)
        return cls if isinstance(cls, type) else None

    def in_place(self, owner):
        return next((vars(owner)[name] for name in PROVIDED if name in vars(owner)), None) if owner is not None \
            else None

    def prepare(self, owner, facts: CascadeFacts) -> tuple[str, ...]:
        """The contract on the imported class: vllm-omni's own ``OmniGPUModelRunner`` deriving vLLM's
        ``GPUModelRunner``, defining neither method itself, inheriting vLLM's ``_build_attention_metadata`` without
        the keyword and no ``_compute_cascade_attn_prefix_lens`` (as the files said); returns the names to provide."""
        from ..errors import PatchRefusedError

        bases = [k for k in getattr(owner, "__mro__", ())[1:] if k.__name__ == VLLM_CLASS]
        if owner is None or not bases or not owner.__module__.startswith("vllm_omni."):
            raise PatchRefusedError(f"{OMNI_BASE} ({owner!r}) is not vllm-omni's class deriving vLLM's {VLLM_CLASS}; "
                                    "left as it is.")
        for name in facts.provides:
            own = vars(owner).get(name)
            if own is not None and own is not PROVIDED[name]:
                raise PatchRefusedError(f"{OMNI_BASE} defines its own {name} ({own!r}), which the files did not show; "
                                        "left as it is.")
            inherited = getattr(bases[0], name, None)
            if name == COMPUTE and inherited is not None:
                raise PatchRefusedError(f"vLLM's {VLLM_CLASS} has {COMPUTE} ({inherited!r}), which the files did not "
                                        "show; left as it is.")
            if name == BUILD and (inherited is None or _accepts_keyword(inherited)):
                raise PatchRefusedError(f"vLLM's {VLLM_CLASS}.{BUILD} ({inherited!r}) is absent or takes {KEYWORD}, "
                                        "which the files did not show; left as it is.")
        return facts.provides

    def install(self, owner, decision, state: tuple[str, ...]) -> bool:
        return any([provide(owner, name, PROVIDED[name], self.id) for name in state])

    def uninstall(self, owner) -> bool:
        return any([withdraw(owner, name, self.id) for name in PROVIDED])


DRIFT_POINT = RunnerCascadeAttentionRemoved()
