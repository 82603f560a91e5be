"""``ar_scheduler_v1_runner`` on CPU, step by step: the first-request ``KeyError`` of a one-AR-stage vllm-omni, its
cause and its bounds, with vllm-omni's own scheduler classes on the installed vLLM (issue 35).

The H200 measured it on vLLM 0.25.1 + vllm-omni 0.24.0 (``gpu/results/serve_r5``: ``KeyError: 'chatcmpl-...'`` in the
stage engine at the first request without the patch, native answers with it). ``_scheduler_steps_worker.py`` drives
the scheduler a stage config names through one request in vLLM's async-scheduling engine loop, with vLLM's config
saying V2 (its default on a GPU since 0.25), and records every scheduled request the V1 runner vllm-omni's AR worker
forces would look up in ``all_token_ids`` (the runner's rule, read from the installed vllm-omni's file).

- ``OmniARScheduler`` (the sync class: ``gpu/llm_stage.yaml``, vllm-omni 0.24.0's own step_audio_2 / mammoth_moda2
  stage configs; in 0.26.0 / 0.28.0 only glm_image's NPU section) under async scheduling schedules nothing in every
  other step; the request comes back to the runner with an output token, and a scheduler following the config's V2
  sends no ``all_token_ids``: the ``KeyError`` at the first decode step. Unpatched first, then patched (sent every
  time).
- ``OmniARAsyncScheduler`` (what vllm-omni 0.26.0+'s pipelines resolve an AR stage to with async scheduling) schedules
  the request every step: no lookup, patched or not. The patch is needed there only for a request that skips a step
  (not reproduced here).
- ``OmniGenerationScheduler`` (``generation_scheduler_v1_runner``'s target): a generation request is done in one step,
  so it never returns to the runner; no lookup, patched or not (that drift point's failure is not reproduced here).
- vllm-omni 0.30.0's own schedulers (the oracle) send what the runner reads, with nothing of ours installed.
"""

from __future__ import annotations

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, needs_v1_model_runner
from tests.patches._scheduler_steps_worker import RUNNER_FILE, runner_reads_all_token_ids
from tests.patches._scheduler_steps_worker import run as run_steps
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite
from vllm_compat.patches import ar_scheduler_v1_runner

POINT = ar_scheduler_v1_runner.DRIFT_POINT
OFF = {"VLLM_COMPAT_DISABLE_PATCHES": POINT.id}
MAX_TOKENS = 4


def _pair() -> tuple | None:
    if VLLM_VERSION is None or OMNI_VERSION is None:
        return None
    return tuple(Version(v).release[:2] for v in (VLLM_VERSION, OMNI_VERSION))


# The pairs the claim is about: a vllm-omni on its own vLLM where vLLM's config says V2 for dense models (0.25-0.33:
# vllm-omni 0.26.0, 0.28.0, and 0.30.0 as the oracle), and vLLM 0.25.1 + vllm-omni 0.24.0, the pair the H200 measured.
# Elsewhere other drift comes first (vLLM 0.32 dropped StructuredOutputManager.should_advance, which vllm-omni
# 0.26.0's update_from_output calls), and vLLM 0.24 keeps dense models on V1.
needs_claimed_pair = pytest.mark.skipif(
    _pair() is None or not ((_pair()[0] == _pair()[1] and (0, 25) <= _pair()[0] < (0, 34))
                            or _pair() == ((0, 25), (0, 24))),
    reason=f"the claim's pairs: vllm-omni on its own vLLM 0.25-0.33, or vLLM 0.25.1 + vllm-omni 0.24.0 (measured on "
           f"the H200); here vLLM {VLLM_VERSION} + vllm-omni {OMNI_VERSION}")


def _decision():
    return POINT.decide(POINT.detect_static(StaticSite.installed()), Controls())


def test_the_runner_rule_on_small_sources():
    reads = ("def _update_states(self, req_data, req_id, num_output_tokens, batch):\n"
             "    unscheduled_req_ids = set()\n"
             "    if self.use_async_scheduling and num_output_tokens > 0:\n"
             "        ids = req_data.all_token_ids[req_id]\n")
    assert runner_reads_all_token_ids(reads)
    assert not runner_reads_all_token_ids(reads.replace("self.use_async_scheduling and ", ""))
    assert not runner_reads_all_token_ids(reads.replace("unscheduled_req_ids", "gone"))


@needs_omni
def test_the_runner_rule_is_the_installed_vllm_omnis():
    """The worker's runner rule, read from the installed vllm-omni: its V1 runner drops unscheduled requests from its
    batch and looks a returning one with output tokens up in ``all_token_ids`` under async scheduling (0.24.0-0.30.0)."""
    from vllm_compat.bridges import installed_omni_tree

    source = installed_omni_tree().read(RUNNER_FILE)
    if source is None:
        pytest.skip(f"this vllm-omni has no {RUNNER_FILE}")
    assert runner_reads_all_token_ids(source)


@needs_omni
@needs_v1_model_runner
@needs_claimed_pair
def test_sync_ar_scheduler_under_async_scheduling_leaves_out_what_the_v1_runner_reads(tmp_path):
    decision = _decision()
    unpatched = run_steps("ar", tmp_path, OFF, MAX_TOKENS)
    patched = run_steps("ar", tmp_path, None, MAX_TOKENS)
    for record in (unpatched, patched):
        assert record["config_says_v2"] and record["async_scheduling"] and record["queue_size"] == 2
        assert record["finished"] and len(record["tokens"]) == MAX_TOKENS
        # Every other step is empty: the request leaves the runner's batch and returns with an output token.
        assert [s["scheduled"] for s in record["steps"][:3]] == [["r0"], [], ["r0"]]
        assert record["steps"][2]["all_token_ids_lookups"] == ["r0"]
    assert not unpatched["wrapped"]
    assert patched["tokens"] == unpatched["tokens"]
    if Version(OMNI_VERSION) >= Version("0.30"):  # the oracle: vllm-omni's own scheduler agrees with its worker
        assert unpatched["missing_all_token_ids"] == [] and not unpatched["scheduler_v2"]
        assert decision.action != Action.PATCHED and not patched["wrapped"]
        return
    # vllm-omni 0.24.0-0.28.0: the first decode step's lookup fails unpatched (the H200's KeyError), on every
    # return after it too; patched, the scheduler sends what the runner reads.
    assert unpatched["scheduler_v2"] and unpatched["missing_all_token_ids"][0] == [2, "r0"]
    assert len(unpatched["missing_all_token_ids"]) == MAX_TOKENS - 1
    assert decision.action == Action.PATCHED, decision.reason
    assert patched["wrapped"] and not patched["scheduler_v2"] and patched["missing_all_token_ids"] == []
    assert all(s["all_token_ids_sent"] == s["all_token_ids_lookups"] for s in patched["steps"])


@needs_omni
@needs_v1_model_runner
@needs_claimed_pair
def test_async_ar_scheduler_schedules_every_step_and_needs_no_lookup(tmp_path):
    """The claim's bound: with vllm-omni's async AR scheduler one request stays in the runner's batch to its end."""
    for env in (OFF, None):
        record = run_steps("ar_async", tmp_path, env, MAX_TOKENS)
        assert record["config_says_v2"] and record["finished"] and len(record["tokens"]) == MAX_TOKENS
        assert record["missing_all_token_ids"] == []
        assert all(s["all_token_ids_lookups"] == [] for s in record["steps"])
        decode = [s["scheduled"] for s in record["steps"][:MAX_TOKENS]]
        assert decode == [["r0"]] * MAX_TOKENS, decode



@needs_omni
@needs_v1_model_runner
@needs_claimed_pair
def test_generation_scheduler_request_is_done_in_one_step(tmp_path):
    """``generation_scheduler_v1_runner``'s bound: its scheduler follows the config's V2 unpatched (the V2 branch,
    ``test_scheduler_v1_runner``), but one generation request finishes at its first output, so the V1 runner never
    looks it up; no failure of a one-request run to show, patched or not."""
    records = [run_steps("generation", tmp_path, env, MAX_TOKENS)
               for env in ({"VLLM_COMPAT_DISABLE_PATCHES": "generation_scheduler_v1_runner"}, None)]
    for record in records:
        assert record["config_says_v2"] and record["finished"] and len(record["tokens"]) == 1
        assert record["missing_all_token_ids"] == [] and all(not s["all_token_ids_lookups"] for s in record["steps"])
    assert records[0]["tokens"] == records[1]["tokens"]
