"""Chat and completion requests through the servings vllm-omni 0.24.0's LLM-stage server builds, on real vLLM objects,
built offline (``serve_tokens_cases``' model folder, engine client and models).

vllm-omni 0.24.0's ``omni_init_app_state`` builds ``OpenAIServingRender(...)`` and hands it to its own
``OmniOpenAIServingChat`` and to vLLM's ``OpenAIServingCompletion`` as ``openai_serving_render=``. Here the same
classes, as bound in ``vllm_omni.entrypoints.openai.api_server`` (where vllm_compat's ``openai_serving_render_keyword``
rebinds them on vLLM 0.25+), are constructed with the keywords of ``vllm serve --omni``'s defaults and serve
``CASES``; the render serving is ``serve_tokens_cases.old_render_serving`` (vLLM 0.24's own class, or on 0.25+ the one
``serve_render_serving`` provides).

``python -m tests.bridges.serving_chat_cases OUT.json`` in the native pair's serve cell (vLLM 0.24.0, vllm-omni
0.24.0) records what they return (the checked-in oracle ``serving_chat.vllm-0.24.0.json``); the tests serve the same
cases through vllm_compat's bridges on 0.25+ and compare.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from pathlib import Path

from tests.bridges import serve_tokens_cases

ORACLE = Path(__file__).with_name("serving_chat.vllm-0.24.0.json")
SERVER = "vllm_omni.entrypoints.openai.api_server"
CHAT_TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
# (name, kind, request body): what an OpenAI client posts to /v1/chat/completions or /v1/completions.
CASES = [
    ("chat", "chat", {"messages": [{"role": "user", "content": "hello world"}], "max_tokens": 3, "temperature": 0}),
    ("chat_two_turns", "chat", {"messages": [{"role": "user", "content": "the cat"},
                                             {"role": "assistant", "content": "sat on"},
                                             {"role": "user", "content": "the mat"}], "max_tokens": 2}),
    ("chat_seeded", "chat", {"messages": [{"role": "user", "content": "red cat"}], "max_tokens": 2, "seed": 7,
                             "top_p": 0.5}),
    ("chat_stream", "chat", {"messages": [{"role": "user", "content": "blue mat"}], "max_tokens": 2, "stream": True,
                             "stream_options": {"include_usage": True}}),
    ("completion", "completion", {"prompt": "hello world", "max_tokens": 3, "temperature": 0}),
    ("completion_tokens", "completion", {"prompt": [3, 4, 5], "max_tokens": 2}),
    ("completion_stream", "completion", {"prompt": "the cat", "max_tokens": 2, "stream": True}),
]
# Fields that differ on every run, whoever serves: ids and clocks.
VOLATILE = ("id", "created", "system_fingerprint")


class OmniChatEngineClient:
    """``serve_tokens_cases.OmniShapedEngineClient`` with what vllm-omni's chat serving reads of ``AsyncOmni`` besides
    (one text stage: ``output_modalities``, ``stage_configs``, ``default_sampling_params_list``), whose
    ``generate`` takes exactly the calls vllm-omni's own ``AsyncOmni.generate`` takes (the completion serving's
    ``session_id=`` on vLLM 0.28+: ``async_omni_session_id``) and yields vllm-omni's own ``OmniRequestOutput``
    around the ``RequestOutput`` objects of the base, as an LLM stage's output reaches the serving."""

    output_modalities = ["text"]

    @property
    def stage_configs(self) -> list:
        """One LLM stage, the comprehension stage (what the chat serving looks for), as ``gpu/llm_stage.yaml``."""
        from types import SimpleNamespace

        return [SimpleNamespace(stage_id=0, stage_type="llm", is_comprehension=True, final_output=True,
                                final_output_type="text")]

    @property
    def default_sampling_params_list(self):
        from vllm.sampling_params import SamplingParams

        return [SamplingParams()]

    async def generate(self, prompt, sampling_params=None, request_id="", *, sampling_params_list=None, **keywords):
        import inspect

        from vllm_omni.entrypoints.async_omni import AsyncOmni
        from vllm_omni.outputs import OmniRequestOutput

        # The call vLLM's or vllm-omni's serving makes, as vllm-omni's own AsyncOmni.generate (with whatever
        # vllm_compat put on it) takes it: its TypeError is raised here; the generator it returns is never run.
        AsyncOmni.generate(self, prompt, sampling_params, request_id, sampling_params_list=sampling_params_list,
                           **keywords)
        taken = inspect.signature(super().generate).parameters  # the keywords the fake engine below reads
        keywords = {name: value for name, value in keywords.items() if name in taken}
        if sampling_params is None:
            sampling_params = sampling_params_list[0]
        if isinstance(prompt, dict) and "prompt_token_ids" not in prompt:  # the chat serving's text prompt
            prompt = {"prompt_token_ids": self.renderer.get_tokenizer().encode(prompt["prompt"])}
        async for output in super().generate(prompt, sampling_params, request_id, **keywords):
            yield OmniRequestOutput(request_id=request_id, finished=output.finished, stage_id=0,
                                    final_output_type="text", request_output=output)


def engine_client_class() -> type:
    return type("OmniChatEngineClient", (OmniChatEngineClient, serve_tokens_cases.engine_client_class()), {})


def servings(client, models, render):
    """(chat, completion) as vllm-omni 0.24.0's ``omni_init_app_state`` constructs them with ``vllm serve --omni``'s
    defaults and ``CHAT_TEMPLATE`` as its resolved chat template."""
    import importlib

    server = importlib.import_module(SERVER)
    chat = server.OmniOpenAIServingChat(
        client, models, "assistant", openai_serving_render=render, request_logger=None, chat_template=CHAT_TEMPLATE,
        chat_template_content_format="auto", default_chat_template_kwargs=None, trust_request_chat_template=False,
        return_tokens_as_token_ids=False, enable_auto_tools=False, exclude_tools_when_tool_choice_none=False,
        tool_parser=None, reasoning_parser=None, enable_prompt_tokens_details=False, enable_force_include_usage=False,
        enable_log_outputs=False, enable_log_deltas=True)
    completion = server.OpenAIServingCompletion(
        client, models, openai_serving_render=render, request_logger=None, return_tokens_as_token_ids=False,
        enable_prompt_tokens_details=False, enable_force_include_usage=False)
    return chat, completion


def render_serving(client, models):
    """vLLM 0.24's ``OpenAIServingRender`` (or the bridge's) as vllm-omni builds it, with ``CHAT_TEMPLATE``."""
    from vllm.entrypoints.serve.render.serving import OpenAIServingRender

    return OpenAIServingRender(model_config=client.model_config, renderer=client.renderer,
                               model_registry=models.registry, request_logger=None, chat_template=CHAT_TEMPLATE,
                               chat_template_content_format="auto", trust_request_chat_template=False,
                               enable_auto_tools=False, exclude_tools_when_tool_choice_none=False, tool_parser=None,
                               reasoning_parser=None, default_chat_template_kwargs=None, log_error_stack=False)


def _without_volatile(value):
    if isinstance(value, dict):
        return {k: _without_volatile(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_without_volatile(v) for v in value]
    return value


async def _serve(chat, completion, kind: str, body: dict):
    if kind == "chat":
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        result = await chat.create_chat_completion(ChatCompletionRequest.model_validate(body), None)
    else:
        from vllm.entrypoints.openai.completion.protocol import CompletionRequest

        result = await completion.create_completion(CompletionRequest.model_validate(body), None)
    return await serve_tokens_cases._drain(result)


def run_cases() -> dict:
    """{case: {response, engine_calls}} (each case on fresh servings, the response as its HTTP client sees it
    without ``VOLATILE`` fields), and {"servings": the attributes vllm-omni reads}."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = serve_tokens_cases.write_model(Path(tmp) / "tiny")
        client, models = serve_tokens_cases.build_parts(folder, engine_client_class())
        render = render_serving(client, models)
        chat, completion = servings(client, models, render)
        # What vllm-omni's chat serving reads of vLLM 0.24's attributes: the render serving it was given, and
        # tool_call_id_type (its tool-call ids), which vLLM 0.25+ no longer sets.
        results["servings"] = {"chat_render": chat.openai_serving_render is render,
                               "completion_render": completion.openai_serving_render is render,
                               "tool_call_id_type": chat.tool_call_id_type}
        for name, kind, body in CASES:
            client, models = serve_tokens_cases.build_parts(folder, engine_client_class())
            chat, completion = servings(client, models, render_serving(client, models))
            response = asyncio.run(_serve(chat, completion, kind, {"model": serve_tokens_cases.MODEL_NAME, **body}))
            calls = [{k: v for k, v in call.items() if k != "request_id"} for call in client.calls]
            results[name] = {"response": _without_volatile(serve_tokens_cases.plain(response)), "engine_calls": calls}
    return results


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(run_cases(), indent=1, sort_keys=True, default=str) + "\n")
