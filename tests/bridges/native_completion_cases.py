"""A ``/v1/completions`` request through the completion serving vllm-omni 0.26.0+'s LLM-stage server builds, on real
vLLM objects, built offline: the native pairs' failures ``omni_output_ec_transfer_params`` and ``async_omni_session_id``
name, without a GPU (issue 35).

vllm-omni 0.26.0+'s ``omni_init_app_state`` builds vLLM's own ``OpenAIServingCompletion`` (imported from
``vllm.entrypoints.openai.completion.serving``) with ``online_renderer=`` vLLM's ``OnlineRenderer``; its engine client
is ``AsyncOmni``, whose ``generate`` yields vllm-omni's ``OmniRequestOutput``. Here the same serving class, imported
where vllm-omni imports it (vllm-omni's ``api_server`` itself needs torchaudio, which a CPU-torch cell lacks), is
constructed with the keywords of ``vllm serve --omni``'s defaults, and its engine client is
``serving_chat_cases.OmniChatEngineClient``'s (vLLM's configs and renderer for a tiny model; no engine runs on a
CPU): its ``generate`` takes exactly the calls the installed ``AsyncOmni.generate`` takes (its ``TypeError`` is
raised) and yields the installed vllm-omni's own ``OmniRequestOutput`` around each ``RequestOutput``, built as its
``AsyncOmni`` builds an LLM stage's (``from_stage_output`` in 0.28.0+, ``request_output=`` before).

    python -m tests.bridges.native_completion_cases      prints ``RESULT {case: response or "Error: ..."}``
"""

from __future__ import annotations

import asyncio
import inspect
import json
import tempfile
from pathlib import Path

from tests.bridges import serve_tokens_cases, serving_chat_cases

SERVER_FILE = "vllm_omni/entrypoints/openai/api_server.py"
CASES = [
    ("completion", {"prompt": "hello world", "max_tokens": 3, "temperature": 0}),
    ("completion_stream", {"prompt": "the cat", "max_tokens": 2, "stream": True}),
]


def builds_completion_with_online_renderer(source: str | None) -> bool:
    """Whether vllm-omni's ``api_server.py`` imports vLLM's ``OpenAIServingCompletion`` and constructs it with
    ``online_renderer=`` (0.26.0+; 0.24.0 passes ``openai_serving_render=``)."""
    import ast

    if source is None:
        return False
    tree = ast.parse(source)
    imported = any(isinstance(n, ast.ImportFrom) and n.module == "vllm.entrypoints.openai.completion.serving"
                   and any(a.name == "OpenAIServingCompletion" for a in n.names) for n in ast.walk(tree))
    built = any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "OpenAIServingCompletion"
                and any(k.arg == "online_renderer" for k in n.keywords) for n in ast.walk(tree))
    return imported and built


def _wrap(output):
    """The installed vllm-omni's ``OmniRequestOutput`` around an LLM stage's ``RequestOutput``."""
    from vllm_omni.outputs import OmniRequestOutput

    if hasattr(OmniRequestOutput, "from_stage_output"):  # 0.28.0+: a RequestOutput subclass
        return OmniRequestOutput.from_stage_output(output, stage_id=0, final_output_type="text")
    return OmniRequestOutput(request_id=output.request_id, finished=output.finished, stage_id=0,
                             final_output_type="text", request_output=output)


class NativeOmniEngineClient(serving_chat_cases.OmniChatEngineClient):
    """``OmniChatEngineClient`` whose outputs are built as the installed vllm-omni builds them."""

    async def generate(self, prompt, sampling_params=None, request_id="", *, sampling_params_list=None, **keywords):
        from vllm_omni.entrypoints.async_omni import AsyncOmni

        # The serving's call as the installed AsyncOmni.generate (with whatever vllm_compat put on it) takes it.
        AsyncOmni.generate(self, prompt, sampling_params, request_id, sampling_params_list=sampling_params_list,
                           **keywords)
        base = super(serving_chat_cases.OmniChatEngineClient, self).generate  # the fake engine's
        taken = inspect.signature(base).parameters
        keywords = {name: value for name, value in keywords.items() if name in taken}
        async for output in base(prompt, sampling_params or sampling_params_list[0], request_id, **keywords):
            yield _wrap(output)


def completion_serving(client, models):
    """vLLM's ``OpenAIServingCompletion`` as vllm-omni 0.26.0's ``omni_init_app_state`` builds it (defaults)."""
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.renderers.online_renderer import OnlineRenderer

    renderer = OnlineRenderer(model_config=client.model_config, renderer=client.renderer, request_logger=None,
                              chat_template=None, chat_template_content_format="auto",
                              trust_request_chat_template=False, enable_auto_tools=False,
                              exclude_tools_when_tool_choice_none=False, tool_parser=None, reasoning_parser=None,
                              default_chat_template_kwargs=None, log_error_stack=False)
    return OpenAIServingCompletion(client, models, online_renderer=renderer, request_logger=None,
                                   return_tokens_as_token_ids=False, enable_prompt_tokens_details=False,
                                   enable_force_include_usage=False)


def run_cases() -> dict:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    client_class = type("NativeOmniEngineClient", (NativeOmniEngineClient, serve_tokens_cases.engine_client_class()),
                        {})
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = serve_tokens_cases.write_model(Path(tmp) / "tiny")
        for name, body in CASES:
            client, models = serve_tokens_cases.build_parts(folder, client_class)
            serving = completion_serving(client, models)

            async def serve(serving=serving, body=body):
                request = CompletionRequest.model_validate({"model": serve_tokens_cases.MODEL_NAME, **body})
                return await serve_tokens_cases._drain(await serving.create_completion(request, None))

            try:
                results[name] = serve_tokens_cases.plain(asyncio.run(serve()))
            except Exception as exc:  # noqa: BLE001 - what the HTTP layer would turn into a 500
                results[name] = f"{type(exc).__name__}: {exc}"
    return results


if __name__ == "__main__":
    print("RESULT " + json.dumps(run_cases(), default=str))
