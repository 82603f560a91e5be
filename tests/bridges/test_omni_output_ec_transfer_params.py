"""``omni_output_ec_transfer_params``: vLLM 0.26+'s completion serving reads ``ec_transfer_params`` on vllm-omni's
``OmniRequestOutput``, which 0.24.0 / 0.26.0 do not define.

- The facts, read from the installed wheels (vLLM 0.26+ reads it; vllm-omni 0.28.0+ defines it), agree at run time;
  the decision table; the readers on small sources.
- vllm-omni's own ``OmniRequestOutput`` around an output, in a fresh interpreter: unpatched, the real
  ``AttributeError``; through the startup hook, the wrapped output's value (None without one); revert removes
  exactly the stand-in.
- Through vLLM's real completion serving: ``test_openai_serving_render_keyword`` (a non-streaming completion reads it).
"""

from __future__ import annotations

import importlib
import json

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_startup_hook, run_python
from vllm_compat.bridges import omni_output_ec_transfer_params as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
K = bridge.Kind
F = bridge.EcTransferFacts


def _output_module():
    try:
        return importlib.import_module(POINT.entry.target_module)
    except ImportError as exc:  # a CPU-torch cell where vllm-omni's outputs need what it lacks
        pytest.skip(f"{POINT.entry.target_module} does not import here ({exc})")


acts = pytest.mark.skipif(POINT.decide(STATIC, Controls()).action != Action.PATCHED,
                          reason=f"acts on vLLM 0.26+ under vllm-omni 0.24.0 / 0.26.0; here {STATIC}")


@pytest.mark.parametrize(("facts", "action"), [
    (F(K.READS, K.LACKS), Action.PATCHED), (F(K.FITS, K.LACKS), Action.SKIPPED), (F(K.ABSENT, K.LACKS), Action.SKIPPED),
    (F(K.READS, K.FITS), Action.SKIPPED), (F(K.READS, K.ABSENT), Action.SKIPPED),
])
def test_decision_table(facts, action):
    assert POINT.decide(facts, Controls()).action == action


def test_readers_on_sources():
    assert bridge.vllm_reads_it("def f(b):\n    x = b[0].ec_transfer_params\n") == K.READS
    assert bridge.vllm_reads_it("def f(b):\n    x = b[0].kv_transfer_params\n") == K.FITS
    output = "class OmniRequestOutput:\n    {}\n"
    assert bridge.omni_defines_it(output.format("kv_transfer_params = None")) == K.LACKS
    assert bridge.omni_defines_it(output.format("ec_transfer_params: dict | None = None")) == K.FITS
    assert bridge.omni_defines_it(output.format("def ec_transfer_params(self): pass")) == K.FITS
    assert bridge.omni_defines_it("class Other:\n    pass\n") == K.ABSENT


@pytest.mark.skipif(VLLM_VERSION is None or OMNI_VERSION is None, reason="needs vLLM and vllm-omni")
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    assert STATIC.vllm == (K.READS if Version(VLLM_VERSION) >= Version("0.26") else K.FITS)
    assert STATIC.omni == (K.FITS if Version(OMNI_VERSION) >= Version("0.28") else K.LACKS)
    assert POINT.detect_runtime(_output_module()) == STATIC


READ = f"""
import json
from types import SimpleNamespace
from vllm_omni.outputs import OmniRequestOutput
import vllm_compat
out = {{}}
def read(**fields):
    try:
        return OmniRequestOutput(request_id="r", finished=True, **fields).{bridge.NAME}
    except AttributeError as exc:
        return "AttributeError: " + str(exc)
out["wrapped"] = read(request_output=SimpleNamespace({bridge.NAME}={{"peer": 7}}))
out["none"] = read()
out["decision"] = [d.action for d in vllm_compat.current_decisions() if d.name == "{POINT.id}"]
before = set(vars(OmniRequestOutput))
vllm_compat.revert()
out["removed"] = sorted(before - set(vars(OmniRequestOutput)))
print("RESULT", json.dumps(out))
"""


def _read(env: dict | None = None) -> dict:
    result = run_python(READ, env=env, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


@acts
def test_unpatched_output_lacks_it():
    _output_module()
    out = _read({"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
    assert out["wrapped"].startswith("AttributeError") and bridge.NAME in out["wrapped"], out


@acts
@needs_startup_hook
def test_the_stand_in_reads_the_wrapped_output_and_revert_removes_exactly_it():
    _output_module()
    assert _read() == {"wrapped": {"peer": 7}, "none": None, "decision": ["patched"], "removed": [bridge.NAME]}
