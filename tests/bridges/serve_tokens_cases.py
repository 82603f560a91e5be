"""Requests through ``ServingTokens`` (``/inference/v1/generate``, tokens in / tokens out) on real vLLM objects,
built offline, with an engine client shaped as vllm-omni 0.24.0's ``AsyncOmni``.

The model folder is ``preprocess_cases``' (a one-layer Llama ``config.json`` and a word-level tokenizer): vLLM builds
its ``ModelConfig``, ``VllmConfig``, renderer, ``OpenAIServingModels`` and the render serving from it as a server
would. No engine runs on this CPU-only machine, so the engine client's ``generate`` is ours: it takes exactly the
keywords of vllm-omni 0.24.0's ``AsyncOmni.generate`` (``OMNI_GENERATE_KEYWORDS``; a test checks them against the
installed file), records what it was given and yields vLLM's own ``RequestOutput`` objects, the same for every
vLLM, derived from the prompt's token ids: what vLLM's ``ServingTokens`` makes of them is what is compared.

``python -m tests.bridges.serve_tokens_cases OUT.json`` in a cell where vLLM has
``vllm.entrypoints.serve.disagg.serving`` (0.24) records what vLLM's own class returns, constructed as vllm-omni
0.24.0's ``omni_init_app_state`` constructs it (the checked-in oracle ``serve_tokens.vllm-0.24.0.json``); the tests run
the same cases through the class vllm_compat's bridge provides (0.25+) and compare.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

ORACLE = Path(__file__).with_name("serve_tokens.vllm-0.24.0.json")
MODEL_NAME = "tiny"
VOCAB = 13  # preprocess_cases.WORDS
# vllm-omni 0.24.0's AsyncOmni.generate (vllm_omni/entrypoints/async_omni.py): positional, then keyword-only names.
OMNI_GENERATE_POSITIONAL = ("prompt", "sampling_params", "request_id")
OMNI_GENERATE_KEYWORDS = ("prompt_text", "lora_request", "tokenization_kwargs", "sampling_params_list",
                          "output_modalities", "trace_headers", "priority", "data_parallel_rank", "reasoning_ended",
                          "reasoning_parser_kwargs", "arrival_time")

# (name, request body): the JSON an HTTP client posts to /inference/v1/generate.
CASES = [
    ("greedy", {"token_ids": [3, 4, 5], "sampling_params": {"max_tokens": 4, "temperature": 0.0}}),
    ("server_max_tokens", {"token_ids": [3, 4, 5], "sampling_params": {"temperature": 0.0}}),
    ("logprobs", {"token_ids": [6, 7], "sampling_params": {"max_tokens": 3, "logprobs": 2}}),
    ("prompt_logprobs", {"token_ids": [6, 7, 8], "sampling_params": {"max_tokens": 2, "prompt_logprobs": 1}}),
    ("n2", {"token_ids": [9], "sampling_params": {"max_tokens": 2, "n": 2, "temperature": 1.0, "seed": 1}}),
    ("stream", {"token_ids": [3, 4], "sampling_params": {"max_tokens": 3}, "stream": True,
                "stream_options": {"include_usage": True}}),
    ("stream_logprobs", {"token_ids": [10, 11], "sampling_params": {"max_tokens": 2, "logprobs": 1}, "stream": True}),
    ("model_named", {"token_ids": [3], "sampling_params": {"max_tokens": 1}, "model": MODEL_NAME}),
    ("unknown_model", {"token_ids": [3], "sampling_params": {"max_tokens": 1}, "model": "nope"}),
    ("n_over_max_num_seqs", {"token_ids": [3], "sampling_params": {"max_tokens": 1, "n": 1000}}),
]
# (name, the keywords vllm-omni 0.24.0 passes besides engine client, models and render serving): its defaults
# (``vllm serve --omni``), and --enable-prompt-tokens-details --tokens-only.
SERVERS = [
    ("defaults", dict(request_logger=None, return_tokens_as_token_ids=False, enable_prompt_tokens_details=False,
                      enable_log_outputs=False, force_no_detokenize=False)),
    ("details_tokens_only", dict(request_logger=None, return_tokens_as_token_ids=False,
                                 enable_prompt_tokens_details=True, enable_log_outputs=False,
                                 force_no_detokenize=True)),
]


class OmniShapedEngineClient:
    """What ``ServingTokens`` reads of its engine client (model and vLLM configs, renderer, ``errored``) and a
    ``generate`` with vllm-omni 0.24.0's ``AsyncOmni.generate`` parameters: no ``session_id``, no ``**kwargs``.
    ``engine_client_class()`` puts vLLM's ``EngineClient`` under it, as ``AsyncOmni(EngineClient, OmniBase)`` has
    (its defaults, e.g. vLLM 0.30+'s ``check_admission``, are AsyncOmni's too)."""

    errored = False
    dead_error = RuntimeError("engine dead")

    def __init__(self, vllm_config, renderer) -> None:
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.renderer = renderer
        self.input_processor = None
        self.calls: list[dict] = []

    async def generate(self, prompt, sampling_params=None, request_id="", *, prompt_text=None, lora_request=None,
                       tokenization_kwargs=None, sampling_params_list=None, output_modalities=None,
                       trace_headers=None, priority=0, data_parallel_rank=None, reasoning_ended=None,
                       reasoning_parser_kwargs=None, arrival_time=None):
        from vllm.logprobs import Logprob
        from vllm.outputs import CompletionOutput, RequestOutput
        from vllm.sampling_params import RequestOutputKind

        ids = list(prompt["prompt_token_ids"] if isinstance(prompt, dict) else prompt.prompt_token_ids)
        sp = sampling_params
        self.calls.append({"request_id": request_id, "prompt_token_ids": ids, "max_tokens": sp.max_tokens,
                           "detokenize": sp.detokenize, "output_kind": sp.output_kind.name, "priority": priority,
                           "lora_request": lora_request, "data_parallel_rank": data_parallel_rank,
                           "reasoning_ended": reasoning_ended})
        tokens = [[(sum(ids) + 3 * i + k) % VOCAB for k in range(sp.max_tokens)] for i in range(sp.n)]

        def logprobs(seq, start, stop):
            if sp.logprobs is None:
                return None
            return [{t: Logprob(-0.25 - 0.125 * k, rank=1), (t + 1) % VOCAB: Logprob(-2.0 - k, rank=2)}
                    for k, t in enumerate(seq[start:stop], start)]

        prompt_logprobs = None
        if sp.prompt_logprobs is not None:
            prompt_logprobs = [None] + [{t: Logprob(-1.0 - 0.5 * k, rank=1)} for k, t in enumerate(ids[1:])]

        def output(steps, finished):
            outs = []
            for i, seq in enumerate(tokens):
                start = steps[0]
                outs.append(CompletionOutput(index=i, text="", token_ids=seq[start:steps[1]], cumulative_logprob=None,
                                             logprobs=logprobs(seq, start, steps[1]),
                                             finish_reason="length" if finished else None))
            return RequestOutput(request_id=request_id, prompt=None, prompt_token_ids=ids,
                                 prompt_logprobs=prompt_logprobs, outputs=outs, finished=finished,
                                 num_cached_tokens=1, kv_transfer_params={"engine": "omni-shaped"})

        if sp.output_kind == RequestOutputKind.DELTA:
            for k in range(sp.max_tokens):
                yield output((k, k + 1), k + 1 == sp.max_tokens)
        else:
            yield output((0, sp.max_tokens), True)


def engine_client_class() -> type:
    """``OmniShapedEngineClient`` on the installed vLLM's ``EngineClient`` (its abstract methods none of these
    requests reach)."""
    from vllm.engine.protocol import EngineClient

    cls = type("OmniShapedEngineClient", (OmniShapedEngineClient, EngineClient), {})
    cls.__abstractmethods__ = frozenset()
    return cls


def write_model(folder: Path) -> Path:
    from tests.bridges.preprocess_cases import write_model as write

    return write(folder)


def build_parts(folder: Path, client_class: type | None = None):
    """(engine client, ``OpenAIServingModels``) on a real ``VllmConfig`` and renderer for ``folder``; the client is
    ``client_class`` (default: ``engine_client_class()``)."""
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels
    from vllm.renderers import renderer_from_config

    model_config = ModelConfig(model=str(folder), tokenizer=str(folder), max_model_len=32)
    config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    client = (client_class or engine_client_class())(config, renderer_from_config(config))
    models = OpenAIServingModels(engine_client=client, base_model_paths=[BaseModelPath(MODEL_NAME, str(folder))])
    return client, models


def plain(response) -> dict:
    """A response as its HTTP client sees it: JSON for a response object, the parsed ``data:`` events of a stream."""
    if hasattr(response, "model_dump"):
        return {"type": type(response).__name__, "json": json.loads(response.model_dump_json())}
    return {"type": "stream", "events": response}


async def _drain(result):
    if hasattr(result, "__aiter__"):
        events = []
        async for chunk in result:
            body = chunk.removeprefix("data: ").strip()
            events.append(body if body == "[DONE]" else json.loads(body))
        return events
    return result


def run_cases(serving_tokens, third_argument=None) -> dict:
    """Every case on every server: ``serving_tokens(engine_client, models, render, **keywords)``, as vllm-omni
    0.24.0 calls it; ``third_argument(engine_client, models)`` makes the render serving (default: vLLM 0.24's
    ``OpenAIServingRender`` as vllm-omni builds it). Returns {server: {case: {response, engine_calls}}}."""
    import tempfile

    protocol = request_protocol()
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_model(Path(tmp) / "tiny")
        for server, keywords in SERVERS:
            client, models = build_parts(folder)
            render = (third_argument or old_render_serving)(client, models)
            serving = serving_tokens(client, models, render, **keywords)
            results[server] = {}
            for name, body in CASES:
                client.calls.clear()
                request = protocol.model_validate({"request_id": f"case-{name}", **body})
                response = asyncio.run(_serve(serving, request))
                results[server][name] = {"response": plain(response), "engine_calls": list(client.calls)}
    return results


async def _serve(serving, request):
    return await _drain(await serving.serve_tokens(request, None))


def request_protocol():
    """The ``GenerateRequest`` the installed vLLM's router parses a body into."""
    import importlib

    for name in ("vllm.entrypoints.scale_out.token_in_token_out.protocol", "vllm.entrypoints.serve.disagg.protocol"):
        try:
            return importlib.import_module(name).GenerateRequest
        except ImportError:
            continue
    raise ImportError("no GenerateRequest in this vLLM")


def old_render_serving(client, models):
    """vLLM 0.24's ``OpenAIServingRender`` with the arguments vllm-omni 0.24.0's ``omni_init_app_state`` gives it
    (``vllm serve --omni`` defaults)."""
    from vllm.entrypoints.serve.render.serving import OpenAIServingRender

    return OpenAIServingRender(model_config=client.model_config, renderer=client.renderer,
                               model_registry=models.registry, request_logger=None, chat_template=None,
                               chat_template_content_format="auto", trust_request_chat_template=False,
                               enable_auto_tools=False, exclude_tools_when_tool_choice_none=False, tool_parser=None,
                               reasoning_parser=None, default_chat_template_kwargs=None, log_error_stack=False)


def old_fields_kept(old, new, path="") -> list[str]:
    """Where ``new`` lacks a field of ``old`` or has another value: every key of every dict in ``old`` (lists
    elementwise, the same length); fields only ``new`` has are vLLM's additions."""
    if isinstance(old, dict):
        if not isinstance(new, dict):
            return [f"{path}: {new!r} is not an object"]
        return [d for key, value in old.items() for d in (
            old_fields_kept(value, new[key], f"{path}.{key}") if key in new else [f"{path}.{key} missing"])]
    if isinstance(old, list):
        if not isinstance(new, list) or len(old) != len(new):
            return [f"{path}: {len(old)} items != {new!r}"]
        return [d for i, (a, b) in enumerate(zip(old, new, strict=True)) for d in old_fields_kept(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: {old!r} != {new!r}"]


if __name__ == "__main__":
    from vllm.entrypoints.serve.disagg.serving import ServingTokens

    Path(sys.argv[1]).write_text(json.dumps(run_cases(ServingTokens), indent=1, sort_keys=True) + "\n")
