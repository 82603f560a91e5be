"""``async_tokens_to_discard``: vLLM 0.27 stopped dropping the in-flight output vllm-omni 0.24.0 / 0.26.0 mark with
``request.async_tokens_to_discard``.

vllm-omni's own AR async scheduler on the installed vLLM, on CPU, takes a streaming session of two input chunks in
vLLM's engine order (the reproduction of ``tests/patches/test_streaming_input_sessions.py``: each scheduled step
samples the next number from 100). The first turn's three tokens are 100-102; one more step is in flight when it
ends, and its token, 103, is the finished turn's: the native pair drops it, so the second turn streams 104-106
(measured on vLLM 0.24.0 + vllm-omni 0.24.0). Unpatched on vLLM 0.27+ the second turn starts with 103; patched it
streams as natively. vLLM 0.33+, where the session never takes its second chunk (``streaming_input_sessions``, left
out), runs the rest only. Then the facts per installed version, the readers, the decision table and revert.
"""

from __future__ import annotations

import importlib
import json

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, needs_v1_model_runner, run_python
from tests.patches.test_streaming_input_sessions import CHUNK, PROMPT, SCRIPT, WORKER
from vllm_compat.bridges import async_tokens_to_discard as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite
from vllm_compat.patches import streaming_input_sessions

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
K = bridge.Kind
NATIVE_TOKENS = [100, 101, 102, 104, 105, 106]  # the native pair's: the finished turn's in-flight 103 dropped
SESSIONS_LEFT_OUT = streaming_input_sessions.is_left_out(
    streaming_input_sessions.DRIFT_POINT.detect_static(StaticSite.installed()))


@pytest.mark.parametrize(("facts", "action"), [
    (bridge.DiscardFacts(K.IGNORES, ("a.py",)), Action.PATCHED),
    (bridge.DiscardFacts(K.IGNORES, ("a.py",), ("a.py",)), Action.SKIPPED),
    (bridge.DiscardFacts(K.IGNORES, ()), Action.SKIPPED),
    (bridge.DiscardFacts(K.READS, ("a.py",)), Action.SKIPPED),
    (bridge.DiscardFacts(K.ABSENT), Action.PENDING),
], ids=["ignored+set", "ignored+omni_reads_it", "ignored+unset", "vllm_reads_it", "absent"])
def test_decision_table(facts, action):
    assert POINT.decide(facts, Controls()).action == action


def test_reads_and_assignments_are_told_apart():
    assert bridge.uses("if r.async_tokens_to_discard > 0:\n    pass\n", bridge.ast.Load)
    assert bridge.uses("n = int(getattr(r, 'async_tokens_to_discard', 0))\n", bridge.ast.Load)
    assert not bridge.uses("r.async_tokens_to_discard = 1\n", bridge.ast.Load)
    assert bridge.uses("r.async_tokens_to_discard = 1\n", bridge.ast.Store)
    assert not bridge.uses("# async_tokens_to_discard\nx = 1\n", bridge.ast.Store)


@needs_omni
@pytest.mark.skipif(VLLM_VERSION is None or Version(VLLM_VERSION) < Version("0.24"), reason="vLLM 0.24+")
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    """vLLM <= 0.26's AsyncScheduler reads the counter, 0.27+ not (read from the 0.26.0, 0.27.1, 0.30.0 and 0.34.0
    wheels); vllm-omni 0.24.0 / 0.26.0 set it and never read it, 0.28.0+ read it themselves."""
    assert STATIC.host == (K.IGNORES if Version(VLLM_VERSION) >= Version("0.27") else K.READS)
    assert STATIC.setters == ("vllm_omni/core/sched/omni_ar_scheduler.py",)
    assert bool(STATIC.readers) == (Version(OMNI_VERSION) >= Version("0.28"))
    assert POINT.detect_runtime(importlib.import_module(POINT.target_module)) == STATIC


def _tokens(env=None) -> list[int]:
    argv = ["session", str(WORKER), "lm", "ar_async", json.dumps(PROMPT), json.dumps(CHUNK)]
    done = run_python(f"import sys, tempfile; sys.argv = {argv!r}; sys.argv[2] = tempfile.mkdtemp() + '/lm'; "
                      f"exec(compile({SCRIPT!r}, 'session', 'exec'))", env=env, warm=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT", 1)[1])["tokens"]


@needs_omni
@needs_v1_model_runner
@pytest.mark.skipif(SESSIONS_LEFT_OUT, reason="vLLM 0.33+: a streaming session never takes its next chunk "
                    "(streaming_input_sessions, left out)")
@pytest.mark.skipif(OMNI_VERSION != "0.24.0", reason=f"the native tokens were measured with vllm-omni 0.24.0's "
                    f"scheduler; this env has {OMNI_VERSION}")
def test_the_finished_turns_in_flight_token_is_dropped_as_natively():
    if POINT.decide(STATIC, Controls()).action == Action.PATCHED:  # vLLM 0.27+: the token leaks into the next turn
        unpatched = _tokens({"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
        assert unpatched != NATIVE_TOKENS and unpatched[3] == 103
    assert _tokens() == NATIVE_TOKENS


@needs_omni
@pytest.mark.skipif(POINT.decide(STATIC, Controls()).action != Action.PATCHED,
                    reason=f"acts only where vLLM ignores the counter vllm-omni sets; here {STATIC}")
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    from vllm_omni.request import OmniRequest

    owner = POINT.locate(importlib.import_module(POINT.target_module))
    had = POINT.is_installed(owner)
    POINT.uninstall(owner)
    assert bridge.METHOD not in vars(owner) and bridge.COUNTER not in vars(OmniRequest)
    assert POINT.install(owner, None, OmniRequest) and not POINT.install(owner, None, OmniRequest)
    assert vars(owner)[bridge.METHOD] is bridge._update_request_with_output
    assert vars(OmniRequest)[bridge.COUNTER] is bridge.COUNTER_DEFAULT
    if not had:
        POINT.uninstall(owner)
