"""Patch ``vllm_omni.request.OmniRequest.__init__``: its token buffer keeps the ``clear()`` vllm-omni calls.

Why: vLLM 0.34 keeps ``Request._all_token_ids`` in a ``TokenBuffer`` (``vllm/v1/token_buffer.py``: an int32
``array`` subclass; vLLM <= 0.33 kept a ``list``), which has list's ``extend``, slicing and ``del`` but no
``clear()``. vllm-omni 0.24.0 replaces a request's tokens in place with ``request._all_token_ids.clear()`` then
``.extend(...)``: ``OmniGenerationScheduler._update_request_as_session`` (a streaming session's next input chunk)
and ``OmniSchedulingCoordinator.update_request_metadata`` (a generation stage's prompt resized or replaced by the
codes the previous stage sent). On vLLM 0.34 both die (``AttributeError: 'TokenBuffer' object has no attribute
'clear'``, reproduced on CPU with vllm-omni's own scheduler and coordinator).
When: vLLM's ``Request.__init__`` builds ``_all_token_ids`` as a ``TokenBuffer`` whose class defines no ``clear``,
and an installed vllm-omni file calls ``._all_token_ids.clear()`` (all read from the files with ``ast``): after
``OmniRequest.__init__`` (every request of a vllm-omni engine: vllm-omni puts ``OmniRequest`` in place of vLLM's
``Request``), the request's buffer becomes an instance of a subclass of vLLM's ``TokenBuffer`` that adds ``clear()``
(``del self[:]``, list's meaning). The buffer stays the same object, so ``Request.all_token_ids`` (a view of it)
follows, and a ``TokenBuffer`` for everything vLLM checks: ``isinstance``, the int32 storage, pickling (which
rebuilds vLLM's own class). A vLLM that keeps a list, or whose buffer has ``clear``, is left alone.
Serves: vllm-omni 0.24.0's generation scheduler and scheduling coordinator on vLLM 0.34 (measured on CPU; on 0.34
vllm-omni 0.24.0's LLM / AR stages are left out for want of the V1 model runner, so what it serves there is those
classes, as vllm-omni's own tests run them).
Retire when: the oldest supported vllm-omni no longer calls ``_all_token_ids.clear()``.

Not vLLM's class: ``TokenBuffer`` itself gains nothing; only the buffers of vllm-omni's requests change class, and
only where vllm-omni's files call the method vLLM's buffer lacks.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass

from ..decide import Action, Decision
from ..detect.source_tree import parse_source
from ..errors import PatchRefusedError
from ._method import MethodPatch

BUFFER = "_all_token_ids"  # the Request attribute vllm-omni calls list's clear() on
BUFFER_CLASS = "TokenBuffer"
VLLM_REQUEST = "vllm/v1/request.py"
VLLM_TOKEN_BUFFER = "vllm/v1/token_buffer.py"
OMNI_REQUEST = "vllm_omni/request.py"
VARIANT = "buffer_with_clear"


class Kind:
    ABSENT = "absent"  # vLLM's or vllm-omni's request module is not installed
    LIST = "list"  # vLLM's Request keeps _all_token_ids in a list (<= 0.33)
    HAS_CLEAR = "has_clear"  # a TokenBuffer that defines clear(): nothing to add
    LACKS = "lacks"  # a TokenBuffer without clear() (0.34)


@dataclass(frozen=True)
class TokenBufferFacts:
    host: str
    callers: tuple[str, ...] = ()  # vllm-omni files that call ._all_token_ids.clear()

    def to_dict(self) -> dict:
        return asdict(self)


def calls_clear(source: str | None) -> bool:
    """Whether ``source`` calls ``<...>._all_token_ids.clear()``."""
    return source is not None and BUFFER in source and any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "clear"
        and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == BUFFER
        for n in ast.walk(parse_source(source)))


def builds_token_buffer(request_source: str | None) -> bool:
    """Whether ``Request`` assigns ``self._all_token_ids`` a ``TokenBuffer(...)`` (vLLM 0.34) rather than a list."""
    return request_source is not None and any(
        isinstance(n, (ast.Assign, ast.AnnAssign)) and isinstance(n.value, ast.Call)
        and isinstance(n.value.func, ast.Name) and n.value.func.id == BUFFER_CLASS
        and any(isinstance(t, ast.Attribute) and t.attr == BUFFER
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]))
        for n in ast.walk(parse_source(request_source)))


def buffer_has_clear(buffer_source: str | None) -> bool:
    """Whether the ``TokenBuffer`` class vLLM runs (not its ``if TYPE_CHECKING:`` stand-in, typed as a list) defines
    ``clear`` or derives from ``list``."""
    if buffer_source is None:
        return False
    tree = parse_source(buffer_source)
    type_checking_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                          and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                          for stmt in node.body for n in ast.walk(stmt)}
    runtime = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == BUFFER_CLASS
               and id(n) not in type_checking_only]
    return any(any(isinstance(m, ast.FunctionDef) and m.name == "clear" for m in cls.body)
               or any(isinstance(b, ast.Name) and b.id == "list" for b in cls.bases) for cls in runtime)


def facts_of(vllm_tree, omni_tree) -> TokenBufferFacts:
    request = vllm_tree.read(VLLM_REQUEST)
    if request is None or omni_tree.read(OMNI_REQUEST) is None:
        return TokenBufferFacts(Kind.ABSENT)
    callers = tuple(path for path in omni_tree.walk_py("vllm_omni") if calls_clear(omni_tree.read(path)))
    if not builds_token_buffer(request):
        return TokenBufferFacts(Kind.LIST, callers)
    host = Kind.HAS_CLEAR if buffer_has_clear(vllm_tree.read(VLLM_TOKEN_BUFFER)) else Kind.LACKS
    return TokenBufferFacts(host, callers)


def buffer_with_clear(token_buffer: type) -> type:
    """A subclass of vLLM's ``token_buffer`` class with list's ``clear()``; same layout (no slots added), so a
    buffer can take it as its class in place."""

    def clear(self) -> None:
        """Remove every token in place, as ``list.clear`` (vllm_compat, ``request_token_buffer_clear``)."""
        del self[:]

    return type(token_buffer.__name__, (token_buffer,), {"__slots__": (), "clear": clear, "__module__": __name__})


class RequestTokenBufferClear(MethodPatch):
    handles_drift = (("call", "*.TokenBuffer.clear", "*", "clear"),)

    def detect_static(self, site) -> TokenBufferFacts:
        return facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> TokenBufferFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def decide(self, facts: TokenBufferFacts, controls=None) -> Decision:
        if facts.host == Kind.ABSENT:
            return self.decision(Action.PENDING, "vLLM's or vllm-omni's request module is not installed; decided when "
                                 "it is imported")
        if facts.host == Kind.LIST:
            return self.decision(Action.SKIPPED, f"vLLM's Request keeps {BUFFER} in a list, whose clear() vllm-omni "
                                 "calls")
        if facts.host == Kind.HAS_CLEAR:
            return self.decision(Action.SKIPPED, f"vLLM's {BUFFER_CLASS} has clear(); vllm-omni's calls work")
        if not facts.callers:
            return self.decision(Action.SKIPPED, f"vLLM's Request keeps {BUFFER} in a {BUFFER_CLASS} without clear() "
                                 "(vLLM 0.34), but no installed vllm-omni file calls it")
        return self.decision(Action.PATCHED, f"vLLM's Request keeps {BUFFER} in a {BUFFER_CLASS} without clear() "
                             f"(vLLM 0.34) and vllm-omni calls {BUFFER}.clear() ({', '.join(facts.callers)}); each "
                             "OmniRequest's buffer gets list's clear()", VARIANT)

    def prepare(self, owner, facts):
        """The contract on the imported classes: vLLM's buffer class lacks ``clear`` and a buffer can take the
        subclass as its class (same layout); returns ``(vLLM's class, the subclass)``."""
        from vllm.v1.token_buffer import TokenBuffer

        with_clear, problem = buffer_with_clear(TokenBuffer), None
        if hasattr(TokenBuffer, "clear"):
            problem = f"it has clear ({TokenBuffer.clear!r})"
        else:
            try:
                TokenBuffer().__class__ = with_clear
            except TypeError as exc:
                problem = f"a buffer cannot take a subclass as its class ({exc})"
        if problem:
            raise PatchRefusedError(
                f"vllm.v1.token_buffer.{BUFFER_CLASS} is not the class this patch knows: {problem}; left unpatched. "
                f"Set VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, or upgrade vllm_compat.")
        return TokenBuffer, with_clear

    def install(self, owner, decision: Decision, state) -> bool:
        token_buffer, with_clear = state

        def give_buffer_clear(wrapped, instance, args, kwargs):
            """vllm-omni's ``OmniRequest.__init__``, then list's ``clear()`` on the request's token buffer."""
            result = wrapped(*args, **kwargs)
            tokens = instance.__dict__.get(BUFFER)
            if type(tokens) is token_buffer:
                tokens.__class__ = with_clear
            return result

        return self.install_call(owner, decision.variant, give_buffer_clear)


DRIFT_POINT = RequestTokenBufferClear()
