"""``openai_serving_render_keyword`` with ``serve_render_serving``: the servings of vllm-omni 0.24.0's LLM-stage server.

- vllm-omni 0.24.0's own call, read from its installed ``api_server.py``: the classes it constructs with
  ``openai_serving_render=`` are the ones the drift point reads, and ``serving_chat_cases`` constructs the chat and
  completion servings with exactly those keywords.
- Unpatched (vLLM 0.25+), that construction fails (``TypeError`` on the keyword): reproduced first.
- Through the bridges, chat and completion requests (``serving_chat_cases``: vllm-omni's own ``OmniOpenAIServingChat``
  and vLLM's ``OpenAIServingCompletion`` on real vLLM objects, with the render serving ``serve_render_serving``
  provides) return every field vLLM 0.24.0 + vllm-omni 0.24.0 returned, with its value (the checked-in record
  ``serving_chat.vllm-0.24.0.json``, written in the native pair's serve cell); the chat serving keeps vLLM 0.24's
  ``openai_serving_render`` and ``tool_call_id_type``.
"""

from __future__ import annotations

import ast
import json

import pytest

from conftest import VLLM_VERSION, needs_v1_model_runner, run_python
from tests.bridges import serving_chat_cases
from tests.bridges.serve_stand_in_cases import serve_stops_elsewhere
from tests.bridges.serve_tokens_cases import old_fields_kept
from vllm_compat.bridges import HostKind, installed_omni_tree, serve_render_serving
from vllm_compat.bridges import openai_serving_render_keyword as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
ORACLE = json.loads(serving_chat_cases.ORACLE.read_text())
RECORD_VLLM = serving_chat_cases.ORACLE.stem.rsplit("vllm-", 1)[1]
S = bridge.Shape


def _serving_chain_imports_here() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("torchvision", "torchaudio")) and \
        not serve_stops_elsewhere()


needs_serving_chain = pytest.mark.skipif(
    STATIC.caller != S.OLD_KEYWORD or not _serving_chain_imports_here(),
    reason="needs a vllm-omni whose server passes openai_serving_render= (0.24.0) and a serving chain that imports "
    "here (vLLM's pinned torch with torchvision / torchaudio, nothing else stopping it)")
acts = pytest.mark.skipif(POINT.decide(STATIC, Controls()).action != Action.PATCHED,
                          reason=f"the keyword adapter acts on vLLM 0.25+ under vllm-omni 0.24.0; here {STATIC}")


@pytest.mark.parametrize(("caller", "servings", "action"), [
    (S.OLD_KEYWORD, S.RENAMED, Action.PATCHED), (S.OLD_KEYWORD, S.FITS, Action.SKIPPED),
    (S.FITS, S.RENAMED, Action.SKIPPED), (S.ABSENT, S.ABSENT, Action.SKIPPED),
    (S.OLD_KEYWORD, S.ABSENT, Action.PENDING), (S.OLD_KEYWORD, S.UNKNOWN, Action.REFUSED),
])
def test_decision_table(caller, servings, action):
    facts = bridge.ServingKeywordFacts(servings, caller, "detail", ("OmniOpenAIServingChat",))
    assert POINT.decide(facts, Controls()).action == action


def test_callers_and_servings_are_read_from_the_files():
    source = ("def f(state):\n    A(e, m, openai_serving_render=r)\n    B(e, online_renderer=r)\n"
              "    x.C(openai_serving_render=r)\n")
    assert bridge.callers_from_source(source) == (S.OLD_KEYWORD, ("A",))  # names only: what the module binds
    assert bridge.callers_from_source("A(e, online_renderer=r)\n") == (S.FITS, ())
    assert bridge.callers_from_source(None) == (S.ABSENT, ())
    files = {path: f"class {name}(Base):\n    def __init__(self, engine_client, models, *, online_renderer, x=1): "
                   "pass\n" for path, name in bridge.SERVINGS}
    assert bridge.servings_shape_from_files(files.get) == (S.RENAMED, "")
    old = {path: text.replace("online_renderer", "openai_serving_render") for path, text in files.items()}
    assert bridge.servings_shape_from_files(old.get) == (S.FITS, "")
    mixed = dict(files, **{bridge.SERVINGS[0][0]: None})
    assert bridge.servings_shape_from_files(mixed.get)[0] == S.UNKNOWN


@pytest.mark.skipif(STATIC.caller != S.OLD_KEYWORD, reason="needs vllm-omni 0.24.0's api_server.py")
def test_vllm_omni_constructs_the_servings_as_the_cases_do():
    """vllm-omni 0.24.0's ``omni_init_app_state`` passes ``openai_serving_render=`` to its chat serving and to vLLM's
    completion, responses and Anthropic servings; ``serving_chat_cases.servings`` passes the keywords it passes."""
    tree = ast.parse(installed_omni_tree().read(bridge.CALLER_FILE))
    calls = {n.func.id: n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert STATIC.names == ("AnthropicServingMessages", "OmniOpenAIServingChat", "OpenAIServingCompletion",
                            "OpenAIServingResponses")
    cases = {n.func.attr: n for n in ast.walk(ast.parse(open(serving_chat_cases.__file__).read()))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in calls}
    for name in ("OmniOpenAIServingChat", "OpenAIServingCompletion"):
        assert sorted(k.arg for k in cases[name].keywords) == sorted(k.arg for k in calls[name].keywords), name
        assert len(cases[name].args) == len(calls[name].args), name


RUN = """
import json
from tests.bridges import serving_chat_cases as cases
try:
    out = cases.run_cases()
except Exception as exc:
    out = "{}: {}".format(type(exc).__name__, exc)
print("RESULT", json.dumps(out, default=str))
"""


def _run(env: dict | None = None):
    result = run_python(RUN, env=env, warm=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


def compare_with_oracle(results) -> list[str]:
    """Every field of every case the record holds, with its value (fields only the new vLLM has are its own)."""
    if not isinstance(results, dict):
        return [f"no results: {results}"]
    return [f"{case}{d}" for case, old in ORACLE.items() for d in old_fields_kept(old, results.get(case))]


def test_comparison_catches_a_changed_field():
    same = json.loads(json.dumps(ORACLE))
    same["chat"]["response"]["json"]["added_by_vllm"] = 1
    assert compare_with_oracle(same) == []
    for mutate in (lambda r: r["chat"]["engine_calls"][0].update(prompt_token_ids=[0]),
                   lambda r: r["servings"].update(tool_call_id_type=None),
                   lambda r: r["completion"]["response"]["json"].pop("usage")):
        changed = json.loads(json.dumps(ORACLE))
        mutate(changed)
        assert compare_with_oracle(changed) != []


@needs_serving_chain
@acts
def test_unpatched_servings_refuse_vllm_omnis_keyword():
    out = _run({"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
    assert isinstance(out, str) and out.startswith("TypeError") and bridge.OLD_KEYWORD in out, out


@needs_serving_chain
@acts
@needs_v1_model_runner  # vLLM 0.34: no LLM stage starts to serve them (its responses also drop null fields)
def test_servings_answer_as_the_native_pair():
    out = _run()
    assert compare_with_oracle(out) == [], out


@needs_serving_chain
@pytest.mark.skipif(VLLM_VERSION != RECORD_VLLM, reason=f"the record is vLLM {RECORD_VLLM}'s (native pair); here "
                    f"vLLM {VLLM_VERSION}")
def test_native_pair_reproduces_the_record():
    assert POINT.decide(STATIC, Controls()).action == Action.SKIPPED
    assert _run() == ORACLE


def test_render_adapter_leaves_the_llm_stage_out_only_where_it_cannot_adapt():
    importers = ("vllm_omni.entrypoints.openai.api_server:1 (module)",)
    point = serve_render_serving.DRIFT_POINT
    known = point.decide(serve_render_serving.facts_for_table(HostKind.LACKS, importers), Controls())
    unknown = point.decide(serve_render_serving.facts_for_table(HostKind.LACKS, importers, known=False), Controls())
    assert known.action == unknown.action == Action.PATCHED  # the import always works
    assert "adapted" in known.reason and not known.leaves_out
    assert "raises" in unknown.reason and unknown.leaves_out == serve_render_serving.LEAVES_OUT
