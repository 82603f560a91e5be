"""``omni_output_ec_transfer_params`` and ``async_omni_session_id`` on the native pairs (issue 35): a
``/v1/completions`` request through the completion serving vllm-omni 0.26.0+'s own server builds on its own vLLM
(``native_completion_cases``), unpatched and with vllm_compat.

What the wheels say, re-derived here from the versions (not from the drift points): vLLM 0.26+'s completion serving
reads ``ec_transfer_params`` of a non-streaming request's first output, which vllm-omni 0.24.0 / 0.26.0's
``OmniRequestOutput`` lacks (0.28.0 defines it); vLLM 0.28+'s passes ``session_id=`` to ``generate``, which vllm-omni
< 0.30's ``AsyncOmni.generate`` does not take. So, unpatched: vLLM 0.26 / 0.27 + vllm-omni 0.26.0, the non-streaming
completion raises ``AttributeError`` (a 500) while a stream answers; vLLM 0.28+ + vllm-omni 0.26.0 / 0.28.0, both
fail on ``session_id`` (``TypeError``; a stream's error event); vllm-omni 0.30.0 answers natively. With vllm_compat
both answer, and the response carries the wrapped output's ``kv_transfer_params`` and ``ec_transfer_params`` (None).
"""

from __future__ import annotations

import json

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, needs_startup_hook, run_python
from tests.bridges.native_completion_cases import SERVER_FILE, builds_completion_with_online_renderer


def _vllm_omni_builds_it() -> bool:
    if OMNI_VERSION is None or VLLM_VERSION is None:
        return False
    from vllm_compat.bridges import installed_omni_tree

    return builds_completion_with_online_renderer(installed_omni_tree().read(SERVER_FILE))


def _native() -> bool:
    return (VLLM_VERSION is not None and OMNI_VERSION is not None
            and Version(VLLM_VERSION).release[:2] == Version(OMNI_VERSION).release[:2])


needs_online_renderer_server = pytest.mark.skipif(
    not (_native() and _vllm_omni_builds_it()),
    reason=f"needs a native pair (vllm-omni on its own vLLM) whose server builds vLLM's completion serving with "
           f"online_renderer= (0.26.0+; elsewhere other drift comes first); here vLLM {VLLM_VERSION} + vllm-omni "
           f"{OMNI_VERSION}")
# What noxfile.BROKEN_BESIDE_CPU_TORCH uninstalls from a CPU-torch cell: a serving that needs one cannot answer here.
CPU_CELL_LACKS = ("torchvision", "torchaudio", "torchcodec")


def _run(env: dict | None) -> dict:
    done = run_python("import runpy; runpy.run_module('tests.bridges.native_completion_cases', run_name='__main__')",
                      env=env, warm=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.split("RESULT ", 1)[1])
    lacking = [name for name in CPU_CELL_LACKS if f"No module named '{name}'" in json.dumps(out)]
    if lacking:
        pytest.skip(f"vLLM {VLLM_VERSION}'s completion serving imports {lacking[0]}, which this CPU-torch cell "
                    "does not install (the pinned-torch serve cells do)")
    return out


def _answered(response, max_tokens: int) -> bool:
    if not isinstance(response, dict):
        return False
    if response["type"] == "stream":
        events = [e for e in response["events"] if isinstance(e, dict)]
        return all("error" not in e for e in events) and events[-1]["choices"][0]["finish_reason"] == "length"
    body = response["json"]
    return body["usage"]["completion_tokens"] == max_tokens and body["choices"][0]["finish_reason"] == "length"


def test_reads_vllm_omnis_construction_on_small_sources():
    new = ("from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion\n"
           "def f(e, m, r):\n    return OpenAIServingCompletion(e, m, online_renderer=r)\n")
    assert builds_completion_with_online_renderer(new)
    assert not builds_completion_with_online_renderer(new.replace("online_renderer", "openai_serving_render"))
    assert not builds_completion_with_online_renderer(None)


@needs_omni
@needs_online_renderer_server
def test_native_pair_unpatched_fails_as_the_wheels_say():
    out = _run({"VLLM_COMPAT_DISABLE": "1"})
    vllm, omni = Version(VLLM_VERSION), Version(OMNI_VERSION)
    if omni >= Version("0.30"):
        assert _answered(out["completion"], 3) and _answered(out["completion_stream"], 2), out
    elif vllm >= Version("0.28"):
        message = "AsyncOmni.generate() got an unexpected keyword argument 'session_id'"
        assert out["completion"] == f"TypeError: {message}", out
        assert out["completion_stream"]["events"][0]["error"]["message"] == message, out
    elif omni < Version("0.28"):
        assert out["completion"] == ("AttributeError: 'OmniRequestOutput' object has no attribute "
                                     "'ec_transfer_params'"), out
        assert _answered(out["completion_stream"], 2), out  # a stream never reads it
    else:
        pytest.skip(f"no claim for vLLM {vllm} + vllm-omni {omni}")


@needs_omni
@needs_online_renderer_server
@needs_startup_hook
def test_with_vllm_compat_both_answer():
    out = _run(None)
    assert _answered(out["completion"], 3) and _answered(out["completion_stream"], 2), out
    body = out["completion"]["json"]
    assert body["kv_transfer_params"] == {"engine": "omni-shaped"} and body["ec_transfer_params"] is None
