"""Adapter for the module ``vllm.entrypoints.serve.utils.error_response`` (``create_error_response``), which vLLM 0.28
moved to ``vllm.entrypoints.serve.exception_handling.error_response`` and vLLM 0.33 changed for engine errors.

Why: vllm-omni 0.26.0 imports ``create_error_response`` from the old module at module level in
``vllm_omni/config/endpoint_policy.py`` (``import vllm_omni`` reaches it) and ``entrypoints/openai/api_server.py``,
so on vLLM 0.28+ ``import vllm_omni`` dies with ``ModuleNotFoundError``. On 0.28-0.32 the moved function behaves as
0.26's for every call vllm-omni makes, and the alias table serves the old path (``moved_names``, reviewed
"accept"). vLLM 0.33 changed one branch: an ``EngineDeadError`` now gets the fixed ``EngineDeadError.CLIENT_MESSAGE``
("The server had an error while processing your request.") instead of its own text, and vllm-omni raises
``OmniEngineDeadError(<the dead stage's error>, error_stage_id=...)`` and returns that message in its engine-error
JSON (``api_server``'s exception handlers call ``create_error_response(exc)``), so the alias was rejected there: it
would silently replace the stage's error text by the generic one.

When: ``vllm.entrypoints.serve.utils`` is imported without an ``error_response`` submodule, an installed vllm-omni
imports it (read from its files), and vLLM's moved ``create_error_response(message, err_type, status_code, param)``
replaces an ``EngineDeadError``'s message by ``CLIENT_MESSAGE`` (read from its file: vLLM 0.33, 0.34): a module object
is registered as ``sys.modules["vllm.entrypoints.serve.utils.error_response"]`` and on the package (marked), holding
our ``create_error_response``: vLLM's own (looked up at each call) with the same arguments, whose response then
carries the engine error's own text, sanitized by vLLM's ``sanitize_message``, where the argument is an
``EngineDeadError`` (vLLM 0.26-0.32's behaviour, the one vllm-omni 0.26.0 was written against). Every other call,
``create_error_response(message=reason)`` (the endpoint policy's 400) included, is vLLM's unchanged. Where the moved
function keeps the text (0.28-0.32) the alias serves the old path and this adapter stays out; vLLM <= 0.27 has the
module itself.

Serves: vllm-omni 0.26.0 on vLLM 0.33-0.34 (vllm-omni 0.28.0 imports the new path first; 0.30.0 only the new one).

Retire when: the oldest supported vllm-omni no longer imports ``vllm.entrypoints.serve.utils.error_response``.
"""

from __future__ import annotations

import ast

from ..decide import Action
from . import HostKind, installed_omni_tree
from ._module_stand_in import ModuleStandIn, Shape, files_of_installed_vllm, vllm_function

NEW_MODULE = "vllm.entrypoints.serve.exception_handling.error_response"
NEW_FILE = "vllm/entrypoints/serve/exception_handling/error_response.py"
FUNCTION = "create_error_response"
PARAMS = "message, err_type, status_code, param"  # vLLM 0.26-0.34's
# The vllm-omni files that import it (0.26.0; 0.28.0 tries the new home first, in a try block): read, never imported.
IMPORTERS = ("vllm_omni/config/endpoint_policy.py", "vllm_omni/entrypoints/openai/api_server.py")
KEEPS_TEXT = "keeps_text"  # the replacement's shape where an engine error keeps its text (0.28-0.32): alias suffices


def _engine_error_shape(func) -> tuple[str, str]:
    """(``Shape`` or ``KEEPS_TEXT``, detail) of vLLM's moved ``create_error_response`` (its parsed def): whether an
    ``EngineDeadError`` gets ``CLIENT_MESSAGE`` instead of its own text."""
    names = {n.attr for n in ast.walk(func) if isinstance(n, ast.Attribute)} | {
        n.id for n in ast.walk(func) if isinstance(n, ast.Name)}
    if "CLIENT_MESSAGE" not in names:
        return KEEPS_TEXT, ""
    if "EngineDeadError" not in names:
        return Shape.UNKNOWN, f"{NEW_MODULE}.{FUNCTION} reads a CLIENT_MESSAGE, but not on EngineDeadError"
    return Shape.KNOWN, ""


def create_error_response(message, err_type="BadRequestError", status_code=None, param=None):
    """vLLM's ``create_error_response`` (looked up at each call); an ``EngineDeadError`` keeps its own text, as on
    vLLM 0.26-0.32 (stand-in by vllm_compat)."""
    import importlib

    new = importlib.import_module(NEW_MODULE)
    if status_code is None:
        from http import HTTPStatus

        status_code = HTTPStatus.BAD_REQUEST
    response = new.create_error_response(message, err_type, status_code, param)
    if isinstance(message, Exception):
        from vllm.v1.engine.exceptions import EngineDeadError

        if isinstance(message, EngineDeadError):
            response.error.message = new.sanitize_message(str(message))
    return response


def _is_alias_of_new_home(old: str, package) -> bool:
    """Whether ``old`` is in ``sys.modules`` as vLLM's moved module itself (its ``__name__`` the new one) and the
    imported ``package`` has no file for it: an alias, not a module vLLM ships."""
    import sys
    from importlib.machinery import PathFinder

    current = sys.modules.get(old)
    if current is None or getattr(current, "__name__", None) != NEW_MODULE:
        return False
    path = getattr(package, "__path__", None)
    return path is None or PathFinder.find_spec(old, path) is None


class ErrorResponseAdapter(ModuleStandIn):
    importers = IMPORTERS
    removed_in = "0.28"
    built_on = (NEW_FILE, FUNCTION, PARAMS)

    def replacement_from_source(self, read) -> tuple[str, str]:
        """The def's parameters (``vllm_function``), then what it does with an engine error."""
        func, detail = vllm_function(read, *self.built_on)
        return _engine_error_shape(func) if func is not None else (Shape.UNKNOWN, detail)

    def members(self) -> dict:
        return {FUNCTION: create_error_response}

    def detect_runtime(self, module):
        """As every module stand-in's, but where ``sys.modules`` holds vLLM's moved module under the old name (the
        moved_names alias, vLLM 0.28-0.32) and vLLM ships no file for the old one, vLLM still lacks it: the files
        say so too, so static and runtime facts (and decisions: skipped, the alias serves it) agree."""
        host = self.host_in_module(module)
        if host == HostKind.DEFINES and _is_alias_of_new_home(self.target_path, module):
            host = HostKind.LACKS
        return self.facts(host, installed_omni_tree(), files_of_installed_vllm)

    def decide(self, facts, controls=None):
        if facts.replacement == KEEPS_TEXT and facts.importers:
            return self.decision(Action.SKIPPED, f"vLLM's {NEW_MODULE}.{FUNCTION} keeps an engine error's text, as "
                                 f"the old one did: moved_names aliases {self.old_module} (reviewed)")
        return super().decide(facts, controls)


DRIFT_POINT = ErrorResponseAdapter()
