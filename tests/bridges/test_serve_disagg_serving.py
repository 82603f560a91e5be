"""The ``serve_disagg_serving`` adapter on the real wheels.

The shared checks of the serving-layer module stand-ins (``serve_stand_in_cases``: decision table, static and runtime
facts agreeing, the real ModuleNotFoundError of vllm-omni's server without the bridge, its import with it, revert,
staying out where vLLM has the module), then what is this adapter's own:

- vllm-omni 0.24.0's call, read from its installed ``api_server.py`` (the oracle of the call's shape), is the one
  ``serve_tokens_cases`` makes; its engine client's ``generate`` takes what vllm-omni's ``AsyncOmni.generate`` takes.
- Unpatched, vLLM's new class fails that call (0.25+), and fails vllm-omni's engine client at the first request
  where its ``serve_tokens`` passes ``session_id`` (0.28+): both reproduced on the installed vLLM first.
- Through the bridge, ``from vllm.entrypoints.serve.disagg.serving import ServingTokens`` constructed as vllm-omni
  constructs it serves every case of ``serve_tokens_cases`` as vLLM 0.24's own class did (the checked-in record,
  ``serve_tokens.vllm-0.24.0.json``, written by vLLM 0.24.0's class: ``python -m tests.bridges.serve_tokens_cases``
  in the native pair's env): every field 0.24 returned, with its value, in every response and stream event, and the
  same engine calls. Where 0.24 differs, it was broken: its non-streaming ``request_id`` was a random id (the
  class's ``id=`` went nowhere), so there the adapter must return the request's own id.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from conftest import VLLM_VERSION, needs_startup_hook, needs_vllm, run_python
from tests.bridges import serve_tokens_cases
from tests.bridges.serve_stand_in_cases import cases
from tests.bridges.serve_tokens_cases import old_fields_kept
from vllm_compat.bridges import HostKind, installed_omni_tree
from vllm_compat.bridges import serve_disagg_serving as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

globals().update(cases(bridge))

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
HOST = STATIC.host
OMNI_TREE = installed_omni_tree()
API_SERVER = "vllm_omni/entrypoints/openai/api_server.py"
ORACLE = json.loads(serve_tokens_cases.ORACLE.read_text())
RECORD_VLLM = serve_tokens_cases.ORACLE.stem.rsplit("vllm-", 1)[1]  # the vLLM whose own class wrote the record
needs_omni_024_files = pytest.mark.skipif(
    not STATIC.importers,
    reason="needs an installed vllm-omni whose server imports vllm.entrypoints.serve.disagg.serving (0.24.0)")
needs_new_class = pytest.mark.skipif(
    HOST != HostKind.LACKS or STATIC.replacement != "known",
    reason=f"needs a vLLM without {POINT.old_module} whose {bridge.NEW_MODULE}.ServingTokens has the measured "
    f"shape (0.25-0.34); here: vLLM {HOST} it")


def _omni_source(relpath: str) -> str:
    return OMNI_TREE.read(relpath)


@needs_omni_024_files
def test_vllm_omni_builds_serving_tokens_with_the_call_the_cases_make():
    """vllm-omni 0.24.0's ``omni_init_app_state``: ``ServingTokens(engine_client, state.openai_serving_models,
    state.openai_serving_render, <keywords>)``, only past the pure-diffusion return and where "generate" is
    supported; the keywords are exactly those ``serve_tokens_cases.SERVERS`` pass."""
    tree = ast.parse(_omni_source(API_SERVER))
    init = next(n for n in ast.walk(tree) if isinstance(n, ast.AsyncFunctionDef) and n.name == "omni_init_app_state")
    calls = [n for n in ast.walk(init) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "ServingTokens"]
    assert len(calls) == 1
    call = calls[0]
    assert [ast.unparse(a) for a in call.args] == ["engine_client", "state.openai_serving_models",
                                                   "state.openai_serving_render"]
    for _, keywords in serve_tokens_cases.SERVERS:
        assert sorted(k.arg for k in call.keywords) == sorted(keywords)
    source = ast.unparse(init)
    assert source.index("if is_pure_diffusion:") < source.index("ServingTokens(")  # never for pure diffusion
    assert re.search(r"ServingTokens\([^)]*\) if 'generate' in supported_tasks else None", source)


@needs_omni_024_files
def test_engine_client_takes_what_async_omni_generate_takes():
    tree = ast.parse(_omni_source("vllm_omni/entrypoints/async_omni.py"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "AsyncOmni")
    generate = next(n for n in cls.body if isinstance(n, ast.AsyncFunctionDef) and n.name == "generate")
    positional = tuple(a.arg for a in generate.args.args)[1:]
    keywords = tuple(a.arg for a in generate.args.kwonlyargs)
    assert generate.args.kwarg is None and "session_id" not in keywords
    assert positional == serve_tokens_cases.OMNI_GENERATE_POSITIONAL
    assert keywords == serve_tokens_cases.OMNI_GENERATE_KEYWORDS
    import inspect

    fake = inspect.signature(serve_tokens_cases.OmniShapedEngineClient.generate).parameters
    assert tuple(fake)[1:] == positional + keywords


def test_oracle_is_vllm_024s_record():
    """The record holds every case on every server, and shows 0.24's own quirk: a random non-streaming id."""
    for server, _ in serve_tokens_cases.SERVERS:
        assert sorted(ORACLE[server]) == sorted(name for name, _ in serve_tokens_cases.CASES)
        greedy = ORACLE[server]["greedy"]["response"]
        assert greedy["type"] == "GenerateResponse" and re.fullmatch(r"[0-9a-f]{16}", greedy["json"]["request_id"])
        assert ORACLE[server]["stream"]["response"]["events"][0]["request_id"] == "generate-tokens-case-stream"


def test_decision_names_the_adapter_or_the_raising_class():
    known = POINT.decide(bridge.facts_for_table(HostKind.LACKS, ("x:1 (module)",)), Controls())
    unknown = POINT.decide(bridge.facts_for_table(HostKind.LACKS, ("x:1 (module)",), known=False), Controls())
    assert known.action == unknown.action == Action.PATCHED  # the import always works
    assert "adapted" in known.reason and "raises" in unknown.reason and "(a test)" in unknown.reason


def test_generate_keywords_dropped_only_where_not_taken():
    async def omni(prompt, sampling_params=None, request_id="", *, priority=0, reasoning_ended=None):
        return dict(priority=priority, reasoning_ended=reasoning_ended)

    async def open_ended(prompt, **kwargs):
        return kwargs

    assert bridge.keywords_not_taken(omni) == ("session_id", "reasoning_parser_kwargs")
    assert bridge.keywords_not_taken(open_ended) == ()

    class Client:
        generate = staticmethod(omni)
        errored = False

    wrapped = bridge.GenerateKeywordsDropped(Client(), bridge.keywords_not_taken(omni))
    import asyncio

    assert asyncio.run(wrapped.generate("p", None, "r", priority=3, session_id="s", reasoning_ended=True,
                                        reasoning_parser_kwargs=None)) == {"priority": 3, "reasoning_ended": True}
    assert wrapped.errored is False and wrapped.__wrapped__.errored is False
    wrapped.errored = True  # writes go to the wrapped client
    assert wrapped.__wrapped__.errored is True


def test_init_shape_reads_the_new_def():
    good = ("class ServingTokens(Base):\n    def __init__(self, engine_client, models, online_renderer, *, "
            "online_derenderer, request_logger, force_no_detokenize=False, return_tokens_as_token_ids=False, "
            "enable_prompt_tokens_details=False, enable_log_outputs=False): pass\n")
    assert bridge.init_shape(good) == ("known", "")
    assert bridge.init_shape(good.replace("online_derenderer,", "new_thing,"))[0] == "unknown"
    assert bridge.init_shape(good.replace("online_renderer", "openai_serving_render"))[0] == "unknown"
    assert bridge.init_shape(good.replace("enable_log_outputs=False", "x=1"))[0] == "unknown"
    assert bridge.init_shape(None)[0] == "unknown"


def as_024_logprobs(value, top: int):
    """vLLM 0.32+'s tokens-out logprobs (``{"token_id", "logprob", "rank", "top_logprobs"}``, every top entry the
    engine gave) in vLLM 0.24's form (``{"token": "token_id:N", "logprob", "bytes": None}``, the top entries cut at
    ``max(logprobs, 1)``), so that the values are compared; anything else as it is. vLLM 0.32 changed the format for
    every client of the route, its own too: the adapter serves vLLM's."""
    if isinstance(value, list):
        return [as_024_logprobs(v, top) for v in value]
    if not isinstance(value, dict):
        return value
    if "token_id" in value and "logprob" in value and "token" not in value:
        entry = {"token": f"token_id:{value['token_id']}", "logprob": value["logprob"], "bytes": None}
        if "top_logprobs" in value:
            entry["top_logprobs"] = [as_024_logprobs(t, top) for t in value["top_logprobs"][:top]]
        return entry
    return {k: as_024_logprobs(v, top) for k, v in value.items()}


def compare_with_oracle(results: dict) -> list[str]:
    """What ``results`` (``serve_tokens_cases.run_cases``) lose or change of vLLM 0.24's record (neither is
    modified)."""
    differences = []
    for server, by_case in ORACLE.items():
        for name, old in by_case.items():
            old, new = json.loads(json.dumps(old)), json.loads(json.dumps(results[server][name]))
            old_response, new_response = old["response"], new["response"]
            where = f"{server}/{name}"
            # the class's name is no client's business (vLLM 0.33 renamed it GenerateTokensResponse): its JSON is
            old_type, _ = old_response.pop("type"), new_response.pop("type", None)
            if old_type == "GenerateResponse":  # 0.24's random id; the request's own id now
                old_response["json"].pop("request_id")
                if new_response["json"]["request_id"] != f"generate-tokens-case-{name}":
                    differences.append(f"{where}: request_id {new_response['json']['request_id']!r}")
            top = max(dict(serve_tokens_cases.CASES)[name]["sampling_params"].get("logprobs") or 0, 1)
            new_response = as_024_logprobs(new_response, top)
            if "error" in old_response.get("json", {}):  # vLLM 0.32+ appends the valid names to the message
                message = new_response["json"]["error"]["message"]
                if message.startswith(old_response["json"]["error"]["message"]):
                    new_response["json"]["error"]["message"] = old_response["json"]["error"]["message"]
            differences += [f"{where}{d}" for d in old_fields_kept(old_response, new_response)]
            for call in old["engine_calls"] + new["engine_calls"]:  # 0.24: CUMULATIVE, 0.30+: FINAL_ONLY
                if call["output_kind"] != "DELTA":
                    call["output_kind"] = "not DELTA"
            if old["engine_calls"] != new["engine_calls"]:
                differences.append(f"{where}: engine calls {old['engine_calls']} != {new['engine_calls']}")
    return differences


def test_comparison_catches_a_changed_field():
    """The comparison itself: a value changed, a field dropped, or a foreign id fail it; additions do not."""
    same = json.loads(json.dumps(ORACLE))
    for by_case in same.values():
        for name, case in by_case.items():
            if case["response"]["type"] == "GenerateResponse":
                case["response"]["json"]["request_id"] = f"generate-tokens-case-{name}"
                case["response"]["json"]["usage"] = {"total_tokens": 1}
    assert compare_with_oracle(same) == []
    for mutate in (lambda r: r["choices"][0].update(token_ids=[0]), lambda r: r.pop("kv_transfer_params"),
                   lambda r: r.update(request_id="914336ba77868836")):
        changed = json.loads(json.dumps(same))
        mutate(changed["defaults"]["greedy"]["response"]["json"])
        assert compare_with_oracle(changed) != []


RUN = """
import json, sys, types
{prelude}
from tests.bridges import serve_tokens_cases as cases
out = {{}}
def attempt(name, serving_tokens, third):
    try:
        out[name] = cases.run_cases(serving_tokens, third_argument=third)
    except Exception as exc:
        out[name] = "{{}}: {{}}".format(type(exc).__name__, exc)
{body}
print("RESULT", json.dumps(out))
"""


def _run(body: str, prelude: str = "") -> dict:
    result = run_python(RUN.format(prelude=prelude, body=body), warm=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


OLD_RENDER = "lambda client, models: types.SimpleNamespace(model_config=client.model_config, renderer=client.renderer)"
ONLINE_RENDERER = ("lambda client, models: OnlineRenderer(client.model_config, client.renderer, request_logger=None, "
                   "chat_template=None, chat_template_content_format='auto')")


@needs_vllm
@needs_new_class
def test_unpatched_vllm_class_fails_vllm_omnis_call_and_client():
    """vLLM's new class, unpatched: the old call (an old render serving's attributes as the third argument) fails;
    given the renderer it wants, vllm-omni's engine client fails at the first request where vLLM passes
    ``generate(session_id=)`` (read from the installed file)."""
    out = _run(f"""
import inspect
from vllm.entrypoints.scale_out.token_in_token_out.serving import ServingTokens
from vllm.renderers.online_renderer import OnlineRenderer
def new_call(client, models, render, **keywords):  # what vLLM's own server passes (0.33+: a derenderer too)
    if "online_derenderer" in inspect.signature(ServingTokens.__init__).parameters:
        from vllm.renderers.online_derenderer import OnlineDerenderer
        keywords["online_derenderer"] = OnlineDerenderer(client.model_config, client.renderer, request_logger=None,
                                                         chat_template=None, chat_template_content_format="auto")
    return ServingTokens(client, models, render, **keywords)
attempt("old_call", ServingTokens, {OLD_RENDER})
attempt("new_renderer", new_call, {ONLINE_RENDERER})
""")
    assert isinstance(out["old_call"], str) and re.match(r"(TypeError|AttributeError)", out["old_call"])
    source = files_of_installed(bridge.NEW_FILE)
    if "session_id=session_id" in source:  # vLLM 0.28+
        assert re.match(r"TypeError: .*unexpected keyword argument 'session_id'", out["new_renderer"]), out
    elif "online_derenderer: OnlineDerenderer" not in source:  # 0.25-0.27: the new call serves
        assert isinstance(out["new_renderer"], dict)


def files_of_installed(relpath: str) -> str:
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    return (Path(spec.origin).parent.parent / relpath).read_text()


@needs_vllm
@needs_new_class
@needs_startup_hook
def test_adapter_serves_as_vllm_024_did():
    """vllm-omni 0.24.0's import and call, through the bridge: every case as vLLM 0.24's class served it, whether
    the third argument is old-render-shaped or vLLM's ``OnlineRenderer``; the class is vLLM's new one underneath.
    Where the bridge does not act (no installed vllm-omni imports the old module: vllm-omni 0.30.0 cells), the same
    class is taken from the bridge module, so the newest vLLM is checked too."""
    acts = POINT.decide(STATIC, Controls()).action == Action.PATCHED
    out = _run(f"""
{'from vllm.entrypoints.serve.disagg.serving import ServingTokens' if acts else
 'from vllm_compat.bridges.serve_disagg_serving import serving_tokens_class; ServingTokens = serving_tokens_class()'}
from vllm.entrypoints.scale_out.token_in_token_out.serving import ServingTokens as New
from vllm.renderers.online_renderer import OnlineRenderer
out["subclass"] = issubclass(ServingTokens, New) and ServingTokens is not New
out["mark"] = getattr(sys.modules.get("vllm.entrypoints.serve.disagg.serving"), "_vllm_compat_installed", None)
attempt("old_render", ServingTokens, {OLD_RENDER})
attempt("online_renderer", ServingTokens, {ONLINE_RENDERER})
""", prelude="import vllm.entrypoints.serve")
    assert out["subclass"] and out["mark"] == (POINT.id if acts else None)
    for third in ("old_render", "online_renderer"):
        assert isinstance(out[third], dict), out[third]
        assert compare_with_oracle(out[third]) == [], third


@needs_vllm
@pytest.mark.skipif(HOST != HostKind.DEFINES or VLLM_VERSION != RECORD_VLLM, reason=f"the record is vLLM "
                    f"{RECORD_VLLM}'s own class (older vLLM defines {POINT.old_module} with another engine-client "
                    f"contract: 0.18 reads io_processor); here vLLM {VLLM_VERSION}, {HOST}")
def test_native_class_reproduces_the_record():
    """In the native pair's env, vLLM 0.24's own class reproduces the checked-in record (ids aside): the record is
    what that class returns, and the cases are deterministic."""
    out = _run("""
from vllm.entrypoints.serve.disagg.serving import ServingTokens
attempt("native", ServingTokens, None)
""")
    native = out["native"]
    assert isinstance(native, dict), native
    for server, by_case in ORACLE.items():
        for name, old in by_case.items():
            new = json.loads(json.dumps(native[server][name]))
            if old["response"]["type"] == "GenerateResponse":
                new["response"]["json"]["request_id"] = old["response"]["json"]["request_id"]
            assert new == old, f"{server}/{name}"


# Where vLLM 0.24.0 + vllm-omni 0.24.0 (native) stop `vllm serve <tiny Llama> --omni` on a CPU-only machine: resolving
# the stage configs (vllm-omni has no CPU platform), inside AsyncOmni's construction, so before build_app and
# omni_init_app_state (measured 2026-12-03 in serve/v0.24-omni0.24; vLLM 0.25.1 + vllm-omni 0.24.0 with vllm_compat
# stopped on the same frame after the same milestones). The diffusion server stops there too (tests/serve/native).
NATIVE_CPU_STOP = "vllm_omni/platforms/interface.py:get_default_stage_config_path NotImplementedError"


def _serving_chain_imports_here() -> bool:
    import importlib.util

    from tests.bridges.serve_stand_in_cases import serve_stops_elsewhere

    deps = all(importlib.util.find_spec(m) is not None for m in ("torchvision", "torchaudio"))
    return deps and (HOST == HostKind.DEFINES or not serve_stops_elsewhere())


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


@needs_omni_024_files
@pytest.mark.skipif(_has_gpu(), reason="on a GPU an LLM stage goes further: the GPU runs are gpu/'s")
@pytest.mark.skipif(not _serving_chain_imports_here(), reason="vllm-omni's serving chain does not import in this env "
                    "(torchvision / torchaudio missing in a CPU-torch cell, or a name no bridge provides)")
def test_llm_stage_server_stops_where_the_native_pair_stops(tmp_path):
    """A real ``vllm serve <tiny Llama> --omni`` (an LLM stage: the servers that build ``ServingTokens``) on this
    CPU-only machine goes as far as the native pair's and stops on the same frame, never at this module."""
    import subprocess

    from tests.serve.test_serve import SERVER_TIMEOUT, free_port, outcome, start_server, stop

    model = serve_tokens_cases.write_model(tmp_path / "tiny-llama")
    log = tmp_path / "serve.log"
    process = start_server(model, free_port(), log)
    try:
        process.wait(SERVER_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the server neither served nor stopped in {SERVER_TIMEOUT} s: {log.read_text()[-3000:]}")
    finally:
        stop(process)
    text = log.read_text()
    assert outcome(text, served=False)["stop"] == NATIVE_CPU_STOP, text[-3000:]
    assert "[AsyncOmniEngine] Initializing" in text and "disagg" not in text
