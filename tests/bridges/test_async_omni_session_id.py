"""``async_omni_session_id``: vLLM 0.28+'s servings pass ``session_id=`` to vllm-omni's ``AsyncOmni.generate``.

- The facts, read from the installed wheels (vLLM 0.28+'s completion serving passes it; vllm-omni 0.30.0's
  ``generate`` takes it, 0.24.0-0.28.0's do not), agree at run time; the decision table; the readers on small sources.
- vllm-omni's own ``AsyncOmni.generate``, called as vLLM's completion serving calls it, in a fresh interpreter:
  unpatched, the real ``TypeError``; through the startup hook, vllm-omni's own async generator with the arguments
  it was given (not run: no engine); revert puts vllm-omni's function back.
- Through vLLM's real completion serving: ``test_openai_serving_render_keyword`` (its engine client takes exactly
  what ``AsyncOmni.generate`` takes at the time).
"""

from __future__ import annotations

import importlib
import json

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_startup_hook, run_python
from vllm_compat.bridges import async_omni_session_id as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
S = bridge.Shape
F = bridge.SessionIdFacts


def _client_module():
    try:
        return importlib.import_module(POINT.entry.target_module)
    except ImportError as exc:  # CPU-torch cells: vllm-omni's async API imports torchvision
        pytest.skip(f"{POINT.entry.target_module} does not import here ({exc})")


acts = pytest.mark.skipif(POINT.decide(STATIC, Controls()).action != Action.PATCHED,
                          reason=f"acts on vLLM 0.28+ under vllm-omni 0.24.0-0.28.0; here {STATIC}")


@pytest.mark.parametrize(("facts", "action"), [
    (F(S.PASSES, S.LACKS), Action.PATCHED), (F(S.FITS, S.LACKS), Action.SKIPPED),
    (F(S.PASSES, S.FITS), Action.SKIPPED), (F(S.PASSES, S.ABSENT), Action.SKIPPED),
    (F(S.ABSENT, S.LACKS), Action.SKIPPED), (F(S.PASSES, S.UNKNOWN), Action.REFUSED),
])
def test_decision_table(facts, action):
    assert POINT.decide(facts, Controls()).action == action


def test_shapes_are_read_from_the_files():
    serving = "async def f(self):\n    g = self.engine_client.generate(p, sp, rid, session_id=s)\n"
    assert bridge.vllm_shape_from_source(serving) == S.PASSES
    assert bridge.vllm_shape_from_source(serving.replace("session_id", "priority")) == S.FITS
    assert bridge.vllm_shape_from_source(None) == S.ABSENT
    client = "class AsyncOmni(Base):\n    async def generate(self, prompt, sp=None, request_id='', {}): yield 1\n"
    assert bridge.omni_shape_from_source(client.format("*, priority=0")) == S.LACKS
    assert bridge.omni_shape_from_source(client.format("*, priority=0, session_id=None")) == S.FITS
    assert bridge.omni_shape_from_source(client.format("**kwargs")) == S.FITS
    assert bridge.omni_shape_from_source("class Other:\n    pass\n") == S.ABSENT


@pytest.mark.skipif(VLLM_VERSION is None or OMNI_VERSION is None, reason="needs vLLM and vllm-omni")
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    assert STATIC.vllm == (S.PASSES if Version(VLLM_VERSION) >= Version("0.28") else S.FITS)
    assert STATIC.omni == (S.FITS if Version(OMNI_VERSION) >= Version("0.30") else S.LACKS)
    assert POINT.detect_runtime(_client_module()) == STATIC


CALL = f"""
import json, sys
from vllm_omni.entrypoints.async_omni import AsyncOmni
import vllm_compat
from vllm_compat.drift import unwrap
original = unwrap(vars(AsyncOmni)["generate"])
out = {{}}
try:  # as vLLM's OpenAIServingCompletion calls its engine client's generate (0.28+)
    generator = AsyncOmni.generate(object(), {{"prompt_token_ids": [1, 2]}}, None, "r1", lora_request=None,
                                   trace_headers=None, priority=3, data_parallel_rank=None, session_id=None)
except TypeError as exc:
    out["error"] = str(exc)
else:
    out["vllm_omnis_own"] = generator.ag_code is original.__code__
    out["given"] = {{k: generator.ag_frame.f_locals[k] for k in ("request_id", "priority")}}
    out["decision"] = [d.action for d in vllm_compat.current_decisions() if d.name == "{POINT.id}"]
    vllm_compat.revert()
    out["reverted"] = vars(AsyncOmni)["generate"] is original
print("RESULT", json.dumps(out))
"""


def _call(env: dict | None = None) -> dict:
    result = run_python(CALL, env=env, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


@acts
def test_unpatched_generate_refuses_the_servings_call():
    _client_module()
    out = _call({"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
    assert "unexpected keyword argument 'session_id'" in out.get("error", ""), out


@acts
@needs_startup_hook
def test_generate_takes_the_call_into_vllm_omnis_own_and_revert_puts_it_back():
    _client_module()
    out = _call()
    assert out == {"vllm_omnis_own": True, "given": {"request_id": "r1", "priority": 3}, "decision": ["patched"],
                   "reverted": True}, out


@pytest.mark.skipif(POINT.decide(STATIC, Controls()).action != Action.SKIPPED or STATIC.omni == S.ABSENT,
                    reason=f"stays out where vLLM does not pass session_id or vllm-omni takes it; here {STATIC}")
def test_stays_out_and_leaves_vllm_omnis_generate_alone():
    module = _client_module()
    owner = POINT.locate(module)
    assert not POINT.is_installed(owner)
