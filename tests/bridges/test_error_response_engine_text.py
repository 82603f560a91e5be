"""The ``vllm.entrypoints.serve.utils.error_response`` adapter on the real wheels: vllm-omni 0.26.0 does not import
on vLLM 0.33+ without it (the real ModuleNotFoundError, reproduced first), imports with it, and its engine-error
responses carry the dead stage's own text as on vLLM 0.26-0.32 (the oracle: 0.26's rule, re-stated here: type
InternalServerError, code 500, param None, message str(exc)) where vLLM 0.33+'s own function gives the generic
CLIENT_MESSAGE; every other call is vLLM's unchanged; revert takes out exactly it; it stays out where vLLM ships the
module (<= 0.27) and where the moved function keeps the text (0.28-0.32, the reviewed alias serves it)."""

from __future__ import annotations

import json

import pytest

from conftest import OMNI_VERSION, needs_startup_hook, needs_vllm, run_python
from tests.bridges import module_stand_in_cases as cases
from vllm_compat.bridges import HostKind
from vllm_compat.bridges import error_response_adapter as bridge
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
ACTS = STATIC.host == HostKind.LACKS and bool(STATIC.importers) and STATIC.replacement == "known"
needs_adapter = pytest.mark.skipif(
    not ACTS, reason=f"needs vLLM >= 0.33 (no {POINT.old_module}; an engine error's text replaced) with a vllm-omni "
    f"that imports it (0.24.0 / 0.26.0); here: vLLM {STATIC.host} it, importers {list(STATIC.importers) or 'none'}, "
    f"replacement {STATIC.replacement}")
needs_omni_026 = pytest.mark.skipif(not (OMNI_VERSION or "").startswith("0.26."),
                                    reason=f"vllm-omni 0.26.0 imports it at `import vllm_omni`; here {OMNI_VERSION}")
IMPORT_ERROR = "No module named 'vllm.entrypoints.serve.utils.error_response'"
STAGE_TEXT = "Stage 1 (diffusion) died: CUDA error: out of memory"


@pytest.mark.parametrize(("facts", "action"), cases.DECISION_CASES, ids=cases.DECISION_IDS)
def test_decision_table(facts, action):
    cases.check_decision(POINT, facts, action)


def test_skipped_where_the_moved_function_keeps_the_text():
    from vllm_compat.bridges._module_stand_in import ModuleStandInFacts
    from vllm_compat.config import Controls

    decision = POINT.decide(ModuleStandInFacts(HostKind.LACKS, cases.IMPORTER, bridge.KEEPS_TEXT), Controls())
    assert decision.action == "skipped" and "moved_names aliases" in decision.reason


@needs_vllm
def test_static_and_runtime_facts_agree():
    cases.check_static_and_runtime_agree(POINT, STATIC)


@needs_adapter
@needs_omni_026
def test_unpatched_import_of_vllm_omni_fails_with_the_real_import_error():
    assert IMPORT_ERROR in cases.unpatched_import_error("import vllm_omni", POINT.id)


@needs_adapter
@needs_startup_hook
def test_engine_errors_keep_the_stage_text_and_revert_removes_it():
    result = run_python(f"""
        import json, sys
        from http import HTTPStatus
        {'import vllm_omni' if (OMNI_VERSION or '').startswith('0.26.') else ''}
        from vllm.entrypoints.serve.utils.error_response import create_error_response
        from vllm.entrypoints.serve.exception_handling import error_response as vllms
        from vllm.v1.engine.exceptions import EngineDeadError
        import vllm_compat
        out = {{}}
        class StageDead(EngineDeadError):  # as vllm-omni's OmniEngineDeadError: the stage's text as the message
            def __init__(self, message):
                Exception.__init__(self, message)
        dead = StageDead({STAGE_TEXT!r})
        out["dead"] = create_error_response(dead).model_dump()
        out["dead_vllm"] = vllms.create_error_response(dead).model_dump()
        out["plain_dead"] = create_error_response(EngineDeadError()).error.message
        calls = [((), dict(message="Batched chat completions are not yet supported by vLLM Omni.")),
                 ((ValueError("bad n"),), {{}}), ((RuntimeError("boom"),), {{}}),
                 (("nope", "NotFoundError", HTTPStatus.NOT_FOUND), {{}})]
        out["others_same"] = [create_error_response(*a, **k).model_dump() == vllms.create_error_response(*a, **k)
                              .model_dump() for a, k in calls]
        package = sys.modules["vllm.entrypoints.serve.utils"]
        module = sys.modules["vllm.entrypoints.serve.utils.error_response"]
        out["mark"] = module._vllm_compat_installed
        vllm_compat.revert()
        out["reverted"] = [hasattr(package, "error_response"), "vllm.entrypoints.serve.utils.error_response" in
                           sys.modules]
        vllm_compat.apply()
        out["back"] = sys.modules.get("vllm.entrypoints.serve.utils.error_response") is module
        print("RESULT", json.dumps(out))
        """, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    # vLLM 0.26-0.32's answer for an engine error (what vllm-omni 0.26.0 was written against):
    assert out.pop("dead") == {"error": {"message": STAGE_TEXT, "type": "InternalServerError", "code": 500,
                                         "param": None}}
    assert out.pop("dead_vllm")["error"]["message"] == "The server had an error while processing your request."
    assert out == {"plain_dead": "EngineCore encountered an issue. See stack trace (above) for the root cause.",
                   "others_same": [True, True, True, True], "mark": POINT.id, "reverted": [False, False],
                   "back": True}


@needs_adapter
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    cases.check_install_uninstall_exact(POINT)


@pytest.mark.skipif(STATIC.host != HostKind.DEFINES,
                    reason=f"needs a vLLM that ships {POINT.old_module} (<= 0.27); here: {STATIC.host}")
def test_stays_out_where_vllm_ships_the_module():
    cases.check_stays_out(POINT)
