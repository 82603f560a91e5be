"""Call adapter for ``vllm_omni.entrypoints.async_omni.AsyncOmni.generate``: the ``session_id=`` keyword vLLM's servings pass.

Why: vLLM 0.28's OpenAI servings pass ``session_id=`` to ``engine_client.generate`` on every request
(``OpenAIServingCompletion.create_completion``, the responses serving, beam search: ``self._get_session_id(...)``,
None unless the request names a session). In ``vllm serve --omni`` the engine client is vllm-omni's ``AsyncOmni``;
0.24.0-0.28.0's ``generate`` takes neither ``session_id`` nor ``**kwargs``, so every ``/v1/completions`` request of
a server with an LLM stage fails with ``TypeError: ... generate() got an unexpected keyword argument 'session_id'``
(found on vLLM 0.34 with vllm-omni 0.24.0's servings, read in the 0.28-0.34 wheels; vllm-omni 0.28.0 on its own
vLLM 0.28 too). vllm-omni's own chat serving calls ``generate`` itself, without it. vllm-omni 0.30.0 takes it.
When: vLLM's completion serving passes ``session_id=`` to ``generate`` and the installed vllm-omni's
``AsyncOmni.generate`` takes neither it nor ``**kwargs`` (both read from the files with ``ast``; at run time, the
method's signature): ``AsyncOmni.generate`` takes ``session_id`` and calls vllm-omni's own method without it, as
vLLM <= 0.27 called it. vLLM's servings are untouched. Where either side fits it stays out.
Serves: vllm-omni 0.24.0-0.28.0 on vLLM 0.28+ (read from the wheels; checked on CPU through vLLM's completion
serving in the pinned-torch serve cells).
Retire when: the oldest supported vllm-omni's ``AsyncOmni.generate`` takes ``session_id`` (0.30.0 does).

What it leaves out: vllm-omni < 0.30 has no sessions; a request naming one is served as vLLM 0.27 served it, with
the session ignored.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, replace, restore, unwrap

SERVING_FILE = "vllm/entrypoints/openai/completion/serving.py"
CLIENT_FILE = "vllm_omni/entrypoints/async_omni.py"
CLIENT, METHOD, KEYWORD = "AsyncOmni", "generate", "session_id"


class Shape:
    PASSES = "passes"  # vLLM's completion serving calls generate(..., session_id=...) (0.28+)
    FITS = "fits"  # vLLM does not pass it (<= 0.27) / vllm-omni's generate takes it or **kwargs (0.30.0)
    LACKS = "lacks"  # vllm-omni's AsyncOmni.generate takes neither session_id nor **kwargs (0.24.0-0.28.0)
    UNKNOWN = "unknown"
    ABSENT = "absent"


@dataclass(frozen=True)
class SessionIdFacts:
    vllm: str
    omni: str
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def vllm_shape_from_source(source: str | None) -> str:
    """Whether vLLM's completion serving passes ``session_id=`` to a ``.generate(...)`` call."""
    if source is None:
        return Shape.ABSENT
    passes = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == METHOD
                 and any(k.arg == KEYWORD for k in n.keywords) for n in ast.walk(parse_source(source)))
    return Shape.PASSES if passes else Shape.FITS


def _takes(names, has_var_keyword: bool) -> str:
    return Shape.FITS if has_var_keyword or KEYWORD in names else Shape.LACKS


def omni_shape_from_source(source: str | None) -> str:
    """Whether vllm-omni's ``AsyncOmni.generate`` (its file) takes ``session_id`` or ``**kwargs``."""
    if source is None:
        return Shape.ABSENT
    cls = next((n for n in parse_source(source).body if isinstance(n, ast.ClassDef) and n.name == CLIENT), None)
    method = cls and next((n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                           and n.name == METHOD), None)
    if method is None:
        return Shape.ABSENT
    args = method.args
    return _takes({a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}, args.kwarg is not None)


def omni_shape_from_function(function) -> str:
    import inspect

    try:
        params = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return Shape.UNKNOWN
    return _takes(params, any(p.kind == p.VAR_KEYWORD for p in params.values()))


class AsyncOmniSessionId(DriftPoint):
    handles_drift = (("override", "*.EngineClient.generate", "*.AsyncOmni.generate", "session_id"),)
    def detect_static(self, site) -> SessionIdFacts:
        vllm = vllm_shape_from_source(site.vllm_tree.read(SERVING_FILE)) if site.vllm_tree.has_package(
            "vllm") else Shape.ABSENT
        return SessionIdFacts(vllm, omni_shape_from_source(site.omni_tree.read(CLIENT_FILE)))

    def detect_runtime(self, module) -> SessionIdFacts:
        from ..detect.source_tree import tree_of

        method = self.in_place(self.locate(module))
        omni = omni_shape_from_function(unwrap(method, self.id)) if method is not None else Shape.ABSENT
        return SessionIdFacts(vllm_shape_from_source(tree_of("vllm").read(SERVING_FILE)), omni)

    def decide(self, facts: SessionIdFacts, controls=None):
        if facts.omni in (Shape.ABSENT, Shape.FITS):
            return self.decision(Action.SKIPPED, f"vllm-omni's {CLIENT}.{METHOD} takes {KEYWORD}" if facts.omni ==
                                 Shape.FITS else f"no installed vllm-omni defines {CLIENT}.{METHOD}")
        if facts.vllm == Shape.ABSENT:
            # vLLM absent, or a vLLM without this serving file (older than any vllm-omni release): nothing calls it
            return self.decision(Action.SKIPPED, f"this vLLM has no {SERVING_FILE} to pass {KEYWORD}")
        if facts.vllm == Shape.FITS:
            return self.decision(Action.SKIPPED, f"vLLM's completion serving does not pass {KEYWORD} (<= 0.27)")
        if Shape.UNKNOWN in (facts.vllm, facts.omni):
            return self.refused(f"the shapes are not the measured ones ({facts})")
        return self.decision(Action.PATCHED, f"vLLM's servings pass {KEYWORD}= to the engine client's {METHOD} "
                             f"(since 0.28), which vllm-omni's {CLIENT}.{METHOD} does not take; it takes it and calls "
                             "vllm-omni's own without it, as vLLM <= 0.27 did (vllm-omni < 0.30 has no sessions)")

    def locate(self, module):
        cls = getattr(module, CLIENT, None)
        return cls if isinstance(cls, type) and METHOD in vars(cls) else None

    def in_place(self, owner):
        return vars(owner).get(METHOD) if owner is not None else None

    def prepare(self, owner, facts):
        current = unwrap(self.in_place(owner), self.id)
        if current is None or omni_shape_from_function(current) != Shape.LACKS:
            from ..errors import PatchRefusedError

            raise PatchRefusedError(f"{CLIENT}.{METHOD} is not vllm-omni's generate without {KEYWORD} "
                                    f"({current!r}); left as it is.")
        return None

    def install(self, owner, decision, state) -> bool:
        def make_wrapper(original):
            @functools.wraps(original)
            def generate(self, *args, session_id=None, **kwargs):
                return original(self, *args, **kwargs)  # vllm-omni's async generator, as vLLM <= 0.27 called it

            return generate

        return replace(owner, METHOD, make_wrapper, self.id)

    def uninstall(self, owner) -> bool:
        return restore(owner, METHOD, self.id)


DRIFT_POINT = AsyncOmniSessionId()
