"""Call adapter for ``setup_openai_server`` (vLLM's ``vllm.entrypoints.openai.api_server.setup_server``) in ``vllm_omni.entrypoints.openai.api_server``.

Why: vLLM 0.25 added a required keyword-only ``reuse_port`` to ``setup_server(args, *, reuse_port: bool)`` (it
used to set ``SO_REUSEPORT`` on the server socket always; now only when asked: ``vllm serve`` passes
``num_api_servers > 1``). vllm-omni 0.24.0 imports it as ``setup_openai_server`` and calls ``setup_openai_server(args)``
in ``omni_run_server``, so once its server imports (``serve_render_serving`` and friends), ``vllm serve --omni``
dies with ``TypeError: setup_server() missing 1 required keyword-only argument: 'reuse_port'`` (measured on vLLM
0.25.1 by tests/serve, before the engine starts).
When: the installed vLLM's ``setup_server`` requires ``reuse_port`` (read from its source, and from the live
signature) and the installed vllm-omni calls ``setup_openai_server`` with ``args`` alone (read from its source with
``ast``): vllm-omni's module binding is rebound to a wrapper that passes ``reuse_port=True``, the socket vLLM 0.24
gave it (``SO_REUSEADDR`` and ``SO_REUSEPORT``). vLLM's own function and its own callers are untouched. Where the
call fits (vLLM 0.24, or a vllm-omni that passes ``reuse_port``) it stays out.
Serves: vllm-omni 0.24.0 on vLLM 0.25-0.34 (measured on 0.25.1 and 0.33; 0.33+ define it in
``vllm.entrypoints.launchers.launcher`` and re-export it, which the file reading follows).
Retire when: the oldest supported vllm-omni passes ``reuse_port`` (or vLLM gives it a default again).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, replace, restore, unwrap

CALLEE_MODULE = "vllm.entrypoints.openai.api_server"
CALLEE = "setup_server"
CALLER_FILE = "vllm_omni/entrypoints/openai/api_server.py"
CALLEE_FILE = "vllm/entrypoints/openai/api_server.py"
REUSE_PORT = True  # what vLLM 0.24's setup_server always did


class Shape:
    REQUIRES_REUSE_PORT = "requires_reuse_port"  # setup_server(args, *, reuse_port) without a default
    FITS = "fits"  # the old call works (no reuse_port, or one with a default) / the caller passes reuse_port
    ARGS_ONLY = "args_only"  # the caller: setup_openai_server(args)
    MISSING = "missing"  # vLLM's api_server has no setup_server: vllm-omni's import of it fails first
    UNKNOWN = "unknown"
    ABSENT = "absent"


@dataclass(frozen=True)
class SetupServerFacts:
    callee: str
    caller: str
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def callee_shape_from_files(vllm_tree) -> tuple[str, str]:
    """The shape of what ``from vllm.entrypoints.openai.api_server import setup_server`` binds in ``vllm_tree``,
    following re-exports (vLLM 0.33 moved the def to ``vllm.entrypoints.launchers.launcher`` and imports it there)."""
    from ..detect.definitions import Definitions

    found = Definitions(vllm_tree).find(CALLEE_MODULE, CALLEE)
    node = found[2] if found is not None else None
    if not isinstance(node, ast.FunctionDef):
        return Shape.MISSING, f"{CALLEE_MODULE} has no def {CALLEE} (in {CALLEE_FILE} or a module it imports it from)"
    names = [a.arg for a in node.args.kwonlyargs]
    if "reuse_port" not in names:
        return Shape.FITS, ""
    default = node.args.kw_defaults[names.index("reuse_port")]
    return (Shape.REQUIRES_REUSE_PORT if default is None else Shape.FITS), ""


def callee_shape_from_function(function) -> tuple[str, str]:
    import inspect

    parameter = inspect.signature(function).parameters.get("reuse_port")
    if parameter is None or parameter.default is not inspect.Parameter.empty:
        return Shape.FITS, ""
    return (Shape.REQUIRES_REUSE_PORT, "") if parameter.kind == parameter.KEYWORD_ONLY else (
        Shape.UNKNOWN, f"reuse_port is {parameter.kind.description}")


def caller_shape_from_source(source: str | None) -> tuple[str, str]:
    """How vllm-omni calls ``setup_openai_server``: every call ``(args)`` alone, or one passing ``reuse_port``."""
    if source is None:
        return Shape.ABSENT, ""
    tree = parse_source(source)
    bound = any(isinstance(n, ast.ImportFrom) and n.module == CALLEE_MODULE and
                any(a.name == CALLEE and a.asname == "setup_openai_server" for a in n.names) for n in ast.walk(tree))
    if not bound:
        return Shape.ABSENT, ""
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
             and n.func.id == "setup_openai_server"]
    if calls and all(len(c.args) == 1 and not c.keywords for c in calls):
        return Shape.ARGS_ONLY, ""
    if calls and all(any(k.arg == "reuse_port" for k in c.keywords) for c in calls):
        return Shape.FITS, ""
    return Shape.UNKNOWN, f"vllm-omni calls setup_openai_server in {len(calls)} other way(s)"


class SetupServerCall(DriftPoint):
    handles_drift = (("call", "*.setup_server", "*", "reuse_port"),)
    def _facts(self, callee, caller) -> SetupServerFacts:
        return SetupServerFacts(callee[0], caller[0], "; ".join(d for d in (callee[1], caller[1]) if d))

    def detect_static(self, site) -> SetupServerFacts:
        callee = callee_shape_from_files(site.vllm_tree) if site.vllm_tree.has_package("vllm") else (Shape.ABSENT, "")
        return self._facts(callee, caller_shape_from_source(site.omni_tree.read(CALLER_FILE)))

    def detect_runtime(self, module) -> SetupServerFacts:
        current = vars(module).get(self.target)
        callee = callee_shape_from_function(unwrap(current)) if current is not None else (Shape.ABSENT, "")
        from .. import bridges

        return self._facts(callee, caller_shape_from_source(bridges.installed_omni_tree().read(CALLER_FILE)))

    def decide(self, facts: SetupServerFacts, controls=None):
        # The caller first: where no installed vllm-omni binds setup_openai_server, vLLM's shape does not matter
        # (vllm-omni >= 0.26 does not), and an unrecognized shape there is no reason to refuse.
        if facts.callee == Shape.ABSENT:
            return self.decision(Action.PENDING, "vLLM is not installed; decided when vllm-omni's server is imported")
        if facts.caller in (Shape.ABSENT, Shape.FITS):
            return self.decision(Action.SKIPPED, "no installed vllm-omni calls setup_openai_server(args) alone")
        if facts.callee == Shape.MISSING:
            return self.decision(Action.SKIPPED, f"this vLLM's {CALLEE_MODULE} has no {CALLEE}: vllm-omni's server "
                                 "stops at importing it (the entrypoint check reports that), not at the call")
        if Shape.UNKNOWN in (facts.callee, facts.caller):
            return self.refused(f"the shapes are not the measured ones ({facts.detail})")
        if facts.callee != Shape.REQUIRES_REUSE_PORT:
            return self.decision(Action.SKIPPED, f"vLLM's {CALLEE} takes vllm-omni's call as it is")
        return self.decision(Action.PATCHED, f"vLLM's {CALLEE} requires reuse_port (since 0.25) and vllm-omni calls "
                             f"setup_openai_server(args); it gets reuse_port={REUSE_PORT}, vLLM 0.24's socket")

    def prepare(self, owner, facts):
        current = unwrap(vars(owner).get(self.target), self.id)
        if current is None or callee_shape_from_function(current)[0] != Shape.REQUIRES_REUSE_PORT:
            from ..errors import PatchRefusedError

            raise PatchRefusedError(f"{self.target_path} is not vLLM's setup_server(args, *, reuse_port) "
                                    f"({current!r}); left as it is.")
        return None

    def install(self, owner, decision, state) -> bool:
        def make_wrapper(original):
            @functools.wraps(original)
            def setup_openai_server(args, **kwargs):
                kwargs.setdefault("reuse_port", REUSE_PORT)
                return original(args, **kwargs)

            return setup_openai_server

        return replace(owner, self.target, make_wrapper, self.id)

    def uninstall(self, owner) -> bool:
        return restore(owner, self.target, self.id)


DRIFT_POINT = SetupServerCall()
