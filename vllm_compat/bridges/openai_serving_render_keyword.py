"""Call adapter for vLLM's servings built by ``omni_init_app_state`` in ``vllm_omni.entrypoints.openai.api_server``: the ``openai_serving_render=`` keyword.

Why: vLLM 0.25 renamed the render parameter of its OpenAI servings (``OpenAIServingChat``, ``OpenAIServingCompletion``,
``OpenAIServingResponses``, ``AnthropicServingMessages``) from ``openai_serving_render`` to ``online_renderer``, and
the attribute they keep it in likewise. vllm-omni 0.24.0's LLM-stage branch of ``omni_init_app_state`` constructs
them (its ``OmniOpenAIServingChat`` subclasses vLLM's chat serving) with ``openai_serving_render=...``, so a server
with an LLM stage dies at startup with ``TypeError: ... unexpected keyword argument 'openai_serving_render'``, and
vllm-omni's chat serving reads ``self.openai_serving_render`` on every request, and ``self.tool_call_id_type``,
which vLLM 0.24's chat serving set in ``__init__`` and 0.25's no longer does (a 500 on every chat request, measured).
The render object itself is ``serve_render_serving``'s.
When: every one of those vLLM classes takes ``online_renderer`` and none takes ``openai_serving_render`` (read from
vLLM's files; at run time, each class's live signature), and the installed vllm-omni's ``api_server.py`` passes
``openai_serving_render=`` (read with ``ast``): each name vllm-omni calls that way is rebound, in vllm-omni's module
only, to a subclass of the same name that passes the keyword on as ``online_renderer=`` and keeps vLLM 0.24's
``openai_serving_render`` attribute (a chat serving also ``tool_call_id_type``, from vLLM's own
``get_tool_call_id_type``). vLLM's classes and its own callers are untouched. Where they still take
``openai_serving_render`` (vLLM 0.24) it stays out.
Serves: vllm-omni 0.24.0 on vLLM 0.25-0.34 (read from the 0.24.0, 0.25.1, 0.31 and 0.34 wheels; measured on an H200
with 0.25.1, and on CPU against vLLM 0.24.0's record of chat and completion requests).
Retire when: the oldest supported vllm-omni passes ``online_renderer=``.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, is_ours, replace, restore

CALLER_FILE = "vllm_omni/entrypoints/openai/api_server.py"
OLD_KEYWORD, NEW_KEYWORD = "openai_serving_render", "online_renderer"
# vLLM's servings that took ``openai_serving_render`` in 0.24: (file, class)
SERVINGS = (("vllm/entrypoints/openai/chat_completion/serving.py", "OpenAIServingChat"),
            ("vllm/entrypoints/openai/completion/serving.py", "OpenAIServingCompletion"),
            ("vllm/entrypoints/openai/responses/serving.py", "OpenAIServingResponses"),
            ("vllm/entrypoints/anthropic/serving.py", "AnthropicServingMessages"))


class Shape:
    RENAMED = "renamed"  # vLLM's servings take online_renderer, not openai_serving_render (0.25+)
    FITS = "fits"  # they take openai_serving_render (0.24) / vllm-omni does not pass it
    OLD_KEYWORD = "old_keyword"  # vllm-omni constructs some with openai_serving_render=
    UNKNOWN = "unknown"
    ABSENT = "absent"


@dataclass(frozen=True)
class ServingKeywordFacts:
    servings: str
    caller: str
    detail: str = ""
    names: tuple[str, ...] = ()  # what vllm-omni constructs with the old keyword

    def to_dict(self) -> dict:
        return asdict(self)


def keyword_shape(parameters) -> str:
    """RENAMED / FITS / UNKNOWN for one ``__init__``'s parameter names."""
    if OLD_KEYWORD in parameters:
        return Shape.FITS
    return Shape.RENAMED if NEW_KEYWORD in parameters else Shape.UNKNOWN


def servings_shape_from_files(read) -> tuple[str, str]:
    """The one shape of every class of ``SERVINGS`` in vLLM's files (``read(relpath)``: text or None)."""
    shapes = {}
    for relpath, name in SERVINGS:
        source = read(relpath)
        cls = source and next((n for n in parse_source(source).body if isinstance(n, ast.ClassDef) and n.name == name),
                              None)
        init = cls and next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        args = init and init.args
        shapes[name] = keyword_shape({a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}) if init else \
            Shape.UNKNOWN
    found = set(shapes.values())
    if len(found) == 1 and Shape.UNKNOWN not in found:
        return found.pop(), ""
    return Shape.UNKNOWN, "; ".join(f"{name}: {shape}" for name, shape in shapes.items())


def callers_from_source(source: str | None) -> tuple[str, tuple[str, ...]]:
    """(``Shape``, the names vllm-omni calls with ``openai_serving_render=``) in its ``api_server.py``."""
    if source is None:
        return Shape.ABSENT, ()
    names = sorted({n.func.id for n in ast.walk(parse_source(source)) if isinstance(n, ast.Call)
                    and isinstance(n.func, ast.Name) and any(k.arg == OLD_KEYWORD for k in n.keywords)})
    return (Shape.OLD_KEYWORD, tuple(names)) if names else (Shape.FITS, ())


def tool_call_id_type(model_config) -> str | None:
    """vLLM's own ``get_tool_call_id_type(model_config)``, wherever this vLLM defines it (0.34 moved it to
    ``vllm.renderers.chat_utils``); None where it defines none."""
    import importlib

    for module in ("vllm.renderers.chat_utils", "vllm.entrypoints.chat_utils"):
        try:
            return importlib.import_module(module).get_tool_call_id_type(model_config)
        except (ImportError, AttributeError):
            continue
    return None


def takes_old_keyword(cls: type) -> type:
    """A subclass of ``cls`` (same name and module) whose construction takes ``openai_serving_render=`` for
    ``online_renderer=`` and keeps it as ``openai_serving_render`` too; a chat serving (one with
    ``create_chat_completion``) also gets vLLM 0.24's ``tool_call_id_type``, which vllm-omni's chat serving reads."""
    chat = callable(getattr(cls, "create_chat_completion", None))

    def __init__(self, *args, **kwargs):
        if OLD_KEYWORD in kwargs:
            kwargs[NEW_KEYWORD] = kwargs.pop(OLD_KEYWORD)
        super(adapted, self).__init__(*args, **kwargs)
        self.openai_serving_render = getattr(self, NEW_KEYWORD, None)  # vLLM 0.24's attribute
        if chat and not hasattr(self, "tool_call_id_type"):  # vLLM 0.24's chat serving set it in __init__
            id_type = tool_call_id_type(self.model_config)
            if id_type is not None:
                self.tool_call_id_type = id_type

    adapted = type(cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__,
                                          "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
    return adapted


def needs_adapting(cls) -> bool:
    """Whether ``cls`` is a class whose ``__init__`` takes ``online_renderer`` and not ``openai_serving_render``."""
    import inspect

    return isinstance(cls, type) and keyword_shape(inspect.signature(cls.__init__).parameters) == Shape.RENAMED


class OpenAIServingRenderKeyword(DriftPoint):
    handles_drift = (("call", "*", "*", "openai_serving_render"),
                     # the attributes it sets on the servings it builds, which vLLM's no longer assign
                     ("attribute", "*.openai_serving_render", "*", "openai_serving_render"),
                     ("attribute", "*.tool_call_id_type", "*.OmniOpenAIServingChat", "tool_call_id_type"))
    def detect_static(self, site) -> ServingKeywordFacts:
        caller, names = callers_from_source(site.omni_tree.read(CALLER_FILE))
        if not names or not site.vllm_tree.has_package("vllm"):
            return ServingKeywordFacts(Shape.ABSENT, caller, "", names)
        servings, detail = servings_shape_from_files(site.vllm_tree.read)
        return ServingKeywordFacts(servings, caller, detail, names)

    def detect_runtime(self, module) -> ServingKeywordFacts:
        from .. import bridges

        caller, names = callers_from_source(bridges.installed_omni_tree().read(CALLER_FILE))
        if not names:
            return ServingKeywordFacts(Shape.ABSENT, caller)
        import inspect

        shapes = {name: keyword_shape(inspect.signature(cls.__init__).parameters) if isinstance(cls, type) else
                  Shape.UNKNOWN for name in names for cls in [self._original(module, name)]}
        found = set(shapes.values())
        if len(found) == 1 and Shape.UNKNOWN not in found:
            return ServingKeywordFacts(found.pop(), caller, "", names)
        return ServingKeywordFacts(Shape.UNKNOWN, caller, "; ".join(f"{n}: {s}" for n, s in shapes.items()), names)

    @staticmethod
    def _original(module, name: str):
        """vllm-omni's binding ``name`` without our adapter."""
        current = vars(module).get(name)
        return current.__wrapped__ if is_ours(current) else current

    def decide(self, facts: ServingKeywordFacts, controls=None):
        if facts.caller in (Shape.ABSENT, Shape.FITS):
            return self.decision(Action.SKIPPED, f"no installed vllm-omni passes {OLD_KEYWORD}= to vLLM's servings")
        if facts.servings == Shape.ABSENT:
            return self.decision(Action.PENDING, "vLLM is not installed; decided when vllm-omni's server is imported")
        if facts.servings == Shape.FITS:
            return self.decision(Action.SKIPPED, f"vLLM's servings take {OLD_KEYWORD}= as vllm-omni passes it")
        if facts.servings == Shape.UNKNOWN:
            return self.refused(f"vLLM's servings are not the measured shapes ({facts.detail})")
        return self.decision(Action.PATCHED, f"vLLM's servings take {NEW_KEYWORD}= (since 0.25) and vllm-omni "
                             f"passes {OLD_KEYWORD}=; its {', '.join(facts.names)} pass it on")

    def install(self, owner, decision, state) -> bool:
        from .. import bridges

        _, names = callers_from_source(bridges.installed_omni_tree().read(CALLER_FILE))
        added = False
        for name in names:
            if needs_adapting(self._original(owner, name)):
                added = replace(owner, name, takes_old_keyword, self.id) or added
        return added

    def uninstall(self, owner) -> bool:
        from .. import bridges

        _, names = callers_from_source(bridges.installed_omni_tree().read(CALLER_FILE))
        return any([restore(owner, name, self.id) for name in names])

    def in_place(self, owner):
        if owner is None:
            return None
        return next((value for value in vars(owner).values() if is_ours(value, self.id)), None)


DRIFT_POINT = OpenAIServingRenderKeyword()
