"""``structured_output_reasoning_trim``: vLLM 0.26-0.29's ``should_advance`` answers True in the step that ends
reasoning and leaves it to the caller to trim the reasoning off (``trim_reasoning_for_advance``), which vllm-omni's AR
scheduler never does.

The oracle is vLLM's own ``Scheduler`` on the same vLLM, beside vllm-omni's own ``OmniARScheduler``, both built by
``tests/patches/_scheduler_runner_worker.py``'s ``build_scheduler`` with vLLM's real ``StructuredOutputManager``
(xgrammar, the ``deepseek_r1`` reasoning parser, the word-level tokenizer of
``test_structured_output_should_advance``), each request driven as ``EngineCore.step`` does (``schedule``,
``get_grammar_bitmask``, ``update_from_output``) with the model's sampled tokens given. A step of several tokens is
what speculative decoding hands the scheduler (accepted drafts and the bonus token); the manager is told of
speculative decoding where the case says so (vLLM 0.25-0.26 answer True at the end of reasoning only there, for a
structural tag). Unpatched on vLLM 0.27.1 / 0.29.0 vllm-omni's scheduler feeds the grammar the ``</think>`` and
terminates every request ("grammar rejected tokens", finish reason ``error``), on vLLM 0.25.1 + vllm-omni 0.24.0 and
0.26.0 + vllm-omni 0.26.0 the speculative structural-tag one; patched it gives what vLLM's ``Scheduler`` gives, step by step. On the native pair
(vLLM 0.24.0) the two schedulers agree with no adapter.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, _has_v1_model_runner, needs_omni, run_python
from tests.bridges.test_structured_output_should_advance import RUNNER_WORKER, make_request, write_tokenizer
from vllm_compat.bridges import structured_output_reasoning_trim as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
K = bridge.Kind
ACTS = POINT.decide(STATIC, Controls()).action == Action.PATCHED
WORDS = ("<unk>", "<eos>", "<think>", "</think>", "yes", "no", "hmm", "so", "<a>", "</a>")
END = WORDS.index("</think>")
GRAMMAR = {"grammar": 'root ::= "yes" | "no"'}
# a structural tag whose output must open with its tag: a reasoning token fed to it is rejected
TAG = {"structural_tag": json.dumps({"type": "structural_tag", "format": {
    "type": "tag", "begin": "<a>", "content": {"type": "const_string", "value": "yes"}, "end": "</a>"}})}
PROMPT = ["so", "<think>", "so"]  # still reasoning

# name: (scheduler, structured output, speculative decoding said to the manager, the words sampled, a list a step)
CASES = {
    "end_alone": ("ar", GRAMMAR, False, [["hmm"], ["</think>"], ["yes"]]),
    "end_inside_a_step": ("ar", GRAMMAR, False, [["hmm"], ["so", "</think>", "yes"], ["<eos>"]]),
    "speculative_structural_tag": ("ar", TAG, True, [["hmm"], ["so", "</think>", "<a>"], ["yes"], ["</a>"]]),
    "generation_end_first": ("generation", GRAMMAR, False, [["</think>"]]),
}
# the cases in which vLLM's should_advance answers True where reasoning ends, from the vLLM that began to (read from
# the wheels and measured here: 0.25.1's and 0.26.0's only under speculative decoding with a structural tag, 0.27.1's
# always)
TRUE_AT_THE_END_FROM = {"end_alone": "0.27", "end_inside_a_step": "0.27", "speculative_structural_tag": "0.25"}


# ---- the worker: run in a fresh interpreter of the env (its source is sent there, see _observe) ----

def run_steps(worker, folder, vocab, which, case) -> list:
    """``which`` ("vllm": vLLM's own ``Scheduler``; else vllm-omni's) driving the case's request: per step its
    outputs (request, token ids, finish reason), ``reasoning_ended``, the tokens its grammar took, the grammar's
    class, and the grammar rejections vllm-omni's and vLLM's schedulers logged."""
    import logging
    import os

    from vllm.config import ParallelConfig, SpeculativeConfig
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.structured_output import StructuredOutputManager

    scheduler, structured, speculative, sampled = case
    os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)  # see test_structured_output_should_advance's build
    where = ("vllm.v1.core.sched.scheduler", "Scheduler") if which == "vllm" else worker["SCHEDULERS"][scheduler]
    sched, config = worker["build_scheduler"](folder, worker["scheduler_class_of"](where))
    config.model_config.skip_tokenizer_init = False
    config.structured_outputs_config.reasoning_parser = "deepseek_r1"
    if speculative:
        config.speculative_config = SpeculativeConfig(
            method="ngram", num_speculative_tokens=2, prompt_lookup_max=2, prompt_lookup_min=1,
            target_model_config=config.model_config, target_parallel_config=ParallelConfig())
    sched.structured_output_manager = StructuredOutputManager(config)
    rejected = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = lambda record: rejected.append(record.getMessage())
    loggers = [logging.getLogger(type(sched).__module__), logging.getLogger("vllm.v1.core.sched.scheduler")]
    for logger in loggers:
        logger.addHandler(handler)
    request = make_request(sched.structured_output_manager, vocab, ["so", "<think>", "so"], structured)
    sched.add_request(request)
    steps = []
    try:
        for words in sampled:
            out = sched.schedule()
            sched.get_grammar_bitmask(out)
            ids = list(out.num_scheduled_tokens)
            runner_output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                              sampled_token_ids=[[vocab[w] for w in words] for _ in ids])
            outputs = sched.update_from_output(out, runner_output)
            structured_req = request.structured_output_request
            steps.append({"outputs": [[o.request_id, list(o.new_token_ids),
                                       getattr(o.finish_reason, "name", "").lower() or None]
                                      for found in outputs.values() for o in found.outputs],
                          "reasoning_ended": structured_req.reasoning_ended,
                          "grammar_tokens": structured_req.grammar.num_processed_tokens,
                          "grammar": type(structured_req.grammar).__name__,  # vLLM's own once the step is done
                          "rejected": [m for m in rejected if "grammar rejected" in m]})
            rejected.clear()
            if request.is_finished():
                break
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    return steps


def observe(folder, runner_worker, words, cases) -> dict:
    """Every case on vLLM's ``Scheduler`` and on vllm-omni's."""
    import runpy

    worker = runpy.run_path(runner_worker)
    vocab = write_tokenizer(folder, words)
    return {name: {which: run_steps(worker, folder, vocab, which, case) for which in ("vllm", "omni")}
            for name, case in cases.items()}


def _observe(tmp_path, env: dict | None = None) -> dict:
    source = "\n\n".join(inspect.getsource(f) for f in (write_tokenizer, make_request, run_steps, observe))
    call = f"observe({str(tmp_path / 'lm')!r}, {str(RUNNER_WORKER)!r}, {list(WORDS)!r}, {CASES!r})"
    done = run_python(f"{source}\n\nimport json\nprint('RESULT' + json.dumps({call}))", env=env, warm=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT", 1)[1])


# ---- the tests ----

AR = bridge.TARGET
GENERATION = "vllm_omni/core/sched/omni_generation_scheduler.py:OmniGenerationScheduler"


@pytest.mark.parametrize(("facts", "action"), [
    (bridge.TrimFacts(K.TRIMS, (AR, GENERATION)), Action.PATCHED),
    (bridge.TrimFacts(K.TRIMS, (GENERATION,)), Action.SKIPPED),
    (bridge.TrimFacts(K.TRIMS, ()), Action.SKIPPED),
    (bridge.TrimFacts(K.NO_TRIM, (AR, GENERATION)), Action.SKIPPED),
    (bridge.TrimFacts(K.NO_ASK, (AR, GENERATION)), Action.SKIPPED),
    (bridge.TrimFacts(K.ABSENT), Action.PENDING),
], ids=["trims+untrimmed", "trims+ar-trims", "trims+none", "no-trim", "no-ask", "absent"])
def test_decision_table(facts, action):
    assert POINT.decide(facts, Controls()).action == action


def test_shapes_are_read_from_the_source():
    manager = "class StructuredOutputManager:\n    def should_advance(self, r):\n        return False\n"
    trim = "    def trim_reasoning_for_advance(self, r, t):\n        return t\n"
    assert bridge.manager_shape(manager) == K.NO_TRIM
    assert bridge.manager_shape(manager + trim) == K.TRIMS
    assert bridge.manager_shape("class StructuredOutputManager:\n" + trim) == K.NO_ASK
    assert bridge.manager_shape("class Other:\n    pass\n") == K.ABSENT
    update = ("class S:\n    def update_from_output(self, o):\n"
              "        if self.structured_output_manager.should_advance(r):\n"
              "            g.accept_tokens(i, {})\n")
    assert bridge.untrimmed_in(update.format("t"), "s.py") == ("s.py:S",)
    assert bridge.untrimmed_in(update.format("self.structured_output_manager.trim_reasoning_for_advance(r, t)"),
                               "s.py") == ()
    assert bridge.untrimmed_in(update.replace("update_from_output", "other").format("t"), "s.py") == ()


def test_the_view_leaves_bare_requests_and_managers_alone():
    """vllm-omni 0.26.0's own scheduler tests hand update_from_output requests without structured-output state and a
    manager of one lambda (test_omni_ar_scheduler_logprobs.py): the view answers what that manager answers, and a
    manager without the trim is not viewed at all."""
    from types import SimpleNamespace

    view = bridge.TrimmingView(SimpleNamespace(should_advance=lambda _request: False))
    assert view.should_advance(object()) is False and view._lent == []
    scheduler = SimpleNamespace(structured_output_manager=view._manager)
    seen = bridge.update_with_trim(lambda: scheduler.structured_output_manager, scheduler, (), {})
    assert seen is view._manager


@needs_omni
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    """vLLM 0.24.0 has should_advance without the trim, 0.25.0-0.29.0 both, 0.30.0+ neither (read from the
    wheels; here from the installed manager's text, not with the bridge's ast reading); vllm-omni 0.24.0's and 0.26.0's
    AR and generation schedulers ask it and never trim."""
    manager = Path(importlib.util.find_spec("vllm.v1.structured_output").origin).read_text()
    defined, asks, trims = (text in manager for text in (f"class {bridge.MANAGER_CLASS}", f"    def {bridge.ASK}(",
                                                         f"    def {bridge.TRIM}("))
    assert STATIC.host == (K.ABSENT if not defined else K.NO_ASK if not asks else K.TRIMS if trims else K.NO_TRIM)
    if Version(OMNI_VERSION) <= Version("0.26.0"):
        assert STATIC.untrimmed == (AR, GENERATION)
    assert POINT.detect_runtime(importlib.import_module(POINT.target_module)) == STATIC
    assert ACTS == (STATIC.host == K.TRIMS and AR in STATIC.untrimmed)


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """Both schedulers on every case: unpatched (where the adapter acts) and as installed."""
    tmp = tmp_path_factory.mktemp("reasoning_trim")
    return {"unpatched": _observe(tmp, {"VLLM_COMPAT_DISABLE_PATCHES": POINT.id}) if ACTS else None,
            "installed": _observe(tmp)}


needs_the_v1_scheduler_path = pytest.mark.skipif(
    not _has_v1_model_runner(), reason="vLLM 0.34+ removed the V1 model runner vllm-omni 0.24.0's stages run on")


@needs_omni
@needs_the_v1_scheduler_path
@pytest.mark.skipif(STATIC.host != K.NO_TRIM, reason=f"needs a vLLM without trim_reasoning_for_advance; here {STATIC}")
def test_without_the_trim_vllm_omnis_scheduler_is_vllms(observed):
    """The native pair: vllm-omni's copy of update_from_output feeds the grammar what vLLM's own does."""
    for name, by in observed["installed"].items():
        if CASES[name][0] == "ar":
            assert by["omni"] == by["vllm"], name


@needs_omni
@needs_the_v1_scheduler_path
@pytest.mark.skipif(not ACTS, reason=f"needs a vLLM whose should_advance leaves the trim to the caller (0.26-0.29) "
                                     f"and a vllm-omni AR scheduler that never trims; here {STATIC}")
@pytest.mark.parametrize("case", TRUE_AT_THE_END_FROM)
def test_unpatched_the_grammar_gets_the_end_marker_and_the_request_dies_patched_it_is_vllms(observed, case):
    unpatched, installed = observed["unpatched"][case], observed["installed"][case]
    assert installed["vllm"] == unpatched["vllm"]  # the oracle: nothing of vLLM's changes
    if Version(VLLM_VERSION) < Version(TRUE_AT_THE_END_FROM[case]):
        assert unpatched["omni"] == unpatched["vllm"] == installed["omni"]  # vLLM answers False there: no trim
        return
    # vLLM's Scheduler: the grammar never sees the reasoning, nor the request an error
    assert all(step["outputs"][0][2] is None and not step["rejected"] for step in unpatched["vllm"])
    # vllm-omni's: the step that ends reasoning is fed to the grammar whole, end marker and all, and kills the request
    ending = unpatched["omni"][-1]
    assert len(unpatched["omni"]) == 2 and ending["reasoning_ended"] is True and ending["outputs"][0][2] == "error"
    tokens = ending["outputs"][0][1]
    assert END in tokens and ending["rejected"] == [
        f"Unexpected: grammar rejected tokens {tokens} for request r0. Terminating request."]
    assert installed["omni"] == installed["vllm"]


@needs_omni
@needs_the_v1_scheduler_path
@pytest.mark.skipif(not ACTS, reason=f"needs the drift the adapter acts on; here {STATIC}")
def test_the_generation_scheduler_ignores_the_grammar_so_is_left_alone(observed):
    """Its request stops at its first output whatever the grammar says: the marker is rejected (logged by xgrammar,
    not by the scheduler) and the finish reason stays ``stop``, patched or not."""
    for state in ("unpatched", "installed"):
        (step,) = observed[state]["generation_end_first"]["omni"]
        assert step["outputs"] == [["r0", [END], "stop"]] and step["rejected"] == []


@needs_omni
@pytest.mark.skipif(not ACTS, reason=f"needs the drift the adapter acts on; here {STATIC}")
def test_install_is_idempotent_and_uninstall_puts_back_vllm_omnis_method():
    owner = POINT.locate(importlib.import_module(POINT.target_module))
    had = POINT.is_installed(owner)
    POINT.uninstall(owner)
    original = vars(owner)[bridge.UPDATE]
    assert not POINT.is_installed(owner)
    decision = POINT.decide(STATIC, Controls())
    assert POINT.install(owner, decision, None) and not POINT.install(owner, decision, None)
    assert vars(owner)[bridge.UPDATE].__wrapped__ is original
    if not had:
        POINT.uninstall(owner)
        assert vars(owner)[bridge.UPDATE] is original
