"""``structured_output_should_advance``: vLLM 0.30 removed ``StructuredOutputManager.should_advance``, which vllm-omni
0.24.0's AR and generation schedulers call at every output.

vllm-omni's own ``OmniARScheduler`` / ``OmniGenerationScheduler`` on the installed vLLM, on CPU: built by
``tests/patches/_scheduler_runner_worker.py``'s ``build_scheduler`` (a tiny dense model's config), with a word-level
tokenizer written beside it and vLLM's real ``StructuredOutputManager`` (xgrammar, the ``deepseek_r1`` reasoning
parser), each request driven as vLLM's ``EngineCore.step`` does (``schedule``, ``get_grammar_bitmask``,
``update_from_output``), the model's sampled tokens given. Unpatched on vLLM 0.30+ the first output dies with the
``AttributeError``; patched every step completes with what the native pair (vLLM 0.24.0 + vllm-omni 0.24.0, whose
manager has its own ``should_advance``) gives for the same request: ``NATIVE`` below, measured there and checked
again whenever this file runs in that cell. The cases the schedulers cannot reach on CPU (speculative decoding, a
structural tag) are asked of the method directly, against vLLM 0.24.0's own answers (``NATIVE_DIRECT``).
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import (
    OMNI_VERSION,
    VLLM_VERSION,
    _has_v1_model_runner,
    needs_omni,
    needs_v1_model_runner,
    run_python,
)
from vllm_compat.bridges import structured_output_should_advance as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
K = bridge.Kind
RUNNER_WORKER = Path(__file__).parents[1] / "patches" / "_scheduler_runner_worker.py"
WORDS = ("<unk>", "<eos>", "<think>", "</think>", "yes", "no", "hmm", "so")
GRAMMAR = 'root ::= "yes" | "no"'

# name: (scheduler, reasoning parser, enable_in_reasoning, structured, prompt words, the words sampled, one a step)
CASES = {
    "plain": ("ar", "", False, False, ["so"] * 6, ["hmm", "so"]),
    "plain_generation": ("generation", "", False, False, ["so"] * 6, ["hmm"]),
    "grammar": ("ar", "", False, True, ["so"] * 6, ["yes"]),
    "grammar_generation": ("generation", "", False, True, ["so"] * 6, ["yes"]),
    "reasoning": ("ar", "deepseek_r1", False, True, ["so", "<think>", "so"], ["hmm", "</think>", "yes"]),
    "reasoning_ended_in_prompt": ("ar", "deepseek_r1", False, True, ["so", "<think>", "</think>"], ["yes"]),
    "enable_in_reasoning": ("ar", "deepseek_r1", True, True, ["so", "<think>", "so"], ["yes"]),
}
# name: (speculative decoding, structural tag, the step's words after a prompt still reasoning), asked of the method
DIRECT = {
    "spec_json_ends_mid_step": (True, False, ["hmm", "</think>", "yes"]),
    "spec_structural_tag_ends_mid_step": (True, True, ["hmm", "</think>", "yes"]),
    "spec_structural_tag_still_reasoning": (True, True, ["hmm", "so"]),
    "structural_tag_ends": (False, True, ["</think>"]),
}

# Measured on vLLM 0.24.0 + vllm-omni 0.24.0 (the native pair; test_the_native_pair_gives_these checks it there): per
# step, the scheduler's outputs (request, token ids, finish reason), reasoning_ended, and the tokens the grammar took.
NATIVE = {
    "plain": [{"outputs": [["r0", [6], None]]}, {"outputs": [["r0", [7], None]]}],
    "plain_generation": [{"outputs": [["r0", [6], "stop"]]}],
    "grammar": [{"outputs": [["r0", [4], None]], "reasoning_ended": None, "grammar_tokens": 1}],
    "grammar_generation": [{"outputs": [["r0", [4], "stop"]], "reasoning_ended": None, "grammar_tokens": 1}],
    "reasoning": [{"outputs": [["r0", [6], None]], "reasoning_ended": False, "grammar_tokens": 0},
                  {"outputs": [["r0", [3], None]], "reasoning_ended": True, "grammar_tokens": 0},
                  {"outputs": [["r0", [4], None]], "reasoning_ended": True, "grammar_tokens": 1}],
    "reasoning_ended_in_prompt": [{"outputs": [["r0", [4], None]], "reasoning_ended": True, "grammar_tokens": 1}],
    "enable_in_reasoning": [{"outputs": [["r0", [4], None]], "reasoning_ended": None, "grammar_tokens": 1}],
}
NATIVE_DIRECT = {  # should_advance, then reasoning_ended
    "spec_json_ends_mid_step": [False, True],
    "spec_structural_tag_ends_mid_step": [True, True],
    "spec_structural_tag_still_reasoning": [False, False],
    "structural_tag_ends": [False, True],
}


# ---- the worker: run in a fresh interpreter of the env (its source is sent there, see _observe) ----

def write_tokenizer(folder: str, words) -> dict:
    """A word-level tokenizer of ``words`` in ``folder`` (beside the model config ``build_scheduler`` writes);
    returns its vocabulary."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer, models, pre_tokenizers

    Path(folder).mkdir(parents=True, exist_ok=True)
    vocab = {word: i for i, word in enumerate(words)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(f"{folder}/tokenizer.json")
    Path(folder, "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<eos>", "unk_token": "<unk>"}))
    return vocab


def build(worker, folder, scheduler, parser, in_reasoning, speculative=False):
    """vllm-omni's ``scheduler`` (``build_scheduler``'s) with a structured-output manager of vLLM's own on the
    folder's tokenizer, ``parser`` as its reasoning parser."""
    import os

    from vllm.config import ParallelConfig, SpeculativeConfig
    from vllm.v1.structured_output import StructuredOutputManager

    # build_scheduler says V2 once the config is built; a second config built with it said is refused on CPU
    os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    sched, config = worker["build_scheduler"](folder, worker["scheduler_class_of"](worker["SCHEDULERS"][scheduler]))
    config.model_config.skip_tokenizer_init = False  # build_scheduler skips it; the manager reads the tokenizer
    config.structured_outputs_config.reasoning_parser = parser
    config.structured_outputs_config.enable_in_reasoning = in_reasoning
    if speculative:
        config.speculative_config = SpeculativeConfig(
            method="ngram", num_speculative_tokens=2, prompt_lookup_max=2, prompt_lookup_min=1,
            target_model_config=config.model_config, target_parallel_config=ParallelConfig())
    sched.structured_output_manager = StructuredOutputManager(config)
    return sched


def make_request(manager, vocab, prompt, structured=None):
    """A request as vLLM's engine hands it to the scheduler: the backend resolved, the grammar compiled."""
    from vllm.sampling_params import SamplingParams, StructuredOutputsParams
    from vllm.v1.request import Request

    params = None
    if structured is not None:
        params = StructuredOutputsParams(**structured)
        params._backend = "xgrammar"  # what vLLM's input processor resolves
    request = Request(request_id="r0", prompt_token_ids=[vocab[w] for w in prompt], pooling_params=None,
                      sampling_params=SamplingParams(max_tokens=8, structured_outputs=params))
    if structured is not None:
        manager.grammar_init(request)
        pending = request.structured_output_request._grammar
        if hasattr(pending, "result"):
            pending.result()
    return request


def run_case(worker, folder, vocab, case, grammar) -> list | str:
    """The request's steps, as ``EngineCore.step`` runs them: per step its outputs, then (structured) its
    ``reasoning_ended`` and how many tokens its grammar took; or the ``AttributeError`` a step raised."""
    from vllm.v1.outputs import ModelRunnerOutput

    scheduler, parser, in_reasoning, structured, prompt, sampled = case
    sched = build(worker, folder, scheduler, parser, in_reasoning)
    request = make_request(sched.structured_output_manager, vocab, prompt, {"grammar": grammar} if structured else None)
    sched.add_request(request)
    steps = []
    for word in sampled:
        out = sched.schedule()
        sched.get_grammar_bitmask(out)
        ids = list(out.num_scheduled_tokens)
        runner_output = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                          sampled_token_ids=[[vocab[word]] for _ in ids])
        try:
            outputs = sched.update_from_output(out, runner_output)
        except AttributeError as exc:
            return f"AttributeError: {exc}"
        step = {"outputs": [[o.request_id, list(o.new_token_ids), getattr(o.finish_reason, "name", "").lower() or None]
                            for found in outputs.values() for o in found.outputs]}
        if structured:
            step["reasoning_ended"] = request.structured_output_request.reasoning_ended
            step["grammar_tokens"] = request.structured_output_request.grammar.num_processed_tokens
        steps.append(step)
    return steps


def ask_directly(worker, folder, vocab, case) -> list | str:
    """``[should_advance(request), reasoning_ended]`` for a request whose step just sampled the case's words after
    a prompt still reasoning (``update_from_output``'s state when it asks), or the ``AttributeError``."""
    import json

    speculative, structural_tag, sampled = case
    sched = build(worker, folder, "ar", "deepseek_r1", False, speculative)
    tag = {"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": ["<a>"]}
    request = make_request(sched.structured_output_manager, vocab, ["so", "<think>", "so"],
                           {"structural_tag": json.dumps(tag)} if structural_tag else {"json": {"type": "object"}})
    request.structured_output_request.reasoning_ended = False  # what vLLM's bitmask found: the prompt still reasons
    request.num_computed_tokens = request.num_tokens  # the step's tokens are the ones not computed yet
    request.append_output_token_ids([vocab[w] for w in sampled])
    try:
        answer = sched.structured_output_manager.should_advance(request)
    except AttributeError as exc:
        return f"AttributeError: {exc}"
    return [answer, request.structured_output_request.reasoning_ended]


def observe(folder, runner_worker, words, grammar, cases, direct) -> dict:
    """Every case and every direct question, and the warnings vllm_compat logged meanwhile."""
    import logging
    import runpy

    worker = runpy.run_path(runner_worker)
    vocab = write_tokenizer(folder, words)
    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("vllm_compat").addHandler(handler)
    return {"cases": {name: run_case(worker, folder, vocab, case, grammar) for name, case in cases.items()},
            "direct": {name: ask_directly(worker, folder, vocab, case) for name, case in direct.items()},
            "left_out_warnings": sum("left out" in w for w in warnings)}


def _observe(tmp_path, env: dict | None = None) -> dict:
    """``observe`` in a fresh interpreter of this env (``conftest.run_python``, warm); the scheduler cases only where
    vLLM has the V1 model runner vllm-omni's stages run on (vLLM 0.34 changed the runner output they are fed too)."""
    source = "\n\n".join(inspect.getsource(f) for f in (write_tokenizer, build, make_request, run_case, ask_directly,
                                                        observe))
    cases = CASES if _has_v1_model_runner() else {}
    call = (f"observe({str(tmp_path / 'lm')!r}, {str(RUNNER_WORKER)!r}, {list(WORDS)!r}, {GRAMMAR!r}, "
            f"{cases!r}, {DIRECT!r})")
    done = run_python(f"{source}\n\nimport json\nprint('RESULT' + json.dumps({call}))", env=env, warm=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split("RESULT", 1)[1])


# ---- the tests ----

@pytest.mark.parametrize(("facts", "action"), [
    (bridge.ShouldAdvanceFacts(K.LACKS, ("a.py",)), Action.PATCHED),
    (bridge.ShouldAdvanceFacts(K.LACKS, ()), Action.SKIPPED),
    (bridge.ShouldAdvanceFacts(K.LACKS, ("a.py",), ("_get_reasoner",)), Action.REFUSED),
    (bridge.ShouldAdvanceFacts(K.DEFINES, ("a.py",)), Action.SKIPPED),
    (bridge.ShouldAdvanceFacts(K.ABSENT), Action.PENDING),
], ids=["lacks+called", "lacks+uncalled", "lacks+shape-gone", "defines", "absent"])
def test_decision_table(facts, action):
    decision = POINT.decide(facts, Controls())
    assert decision.action == action
    # the reasoning case it leaves out, named in the decision and in doctor's lines wherever it acts
    assert bool(decision.leaves_out) == bool(POINT.report_lines(facts)) == (action == Action.PATCHED)


def test_calls_and_shapes_are_read_from_the_source():
    assert bridge.calls_it("def f(self, r):\n    return self.structured_output_manager.should_advance(r)\n")
    assert not bridge.calls_it("def f(self, r):\n    return self.structured_output_manager.accept_tokens(r, [])\n")
    manager = ("class StructuredOutputManager:\n    def __init__(self):\n        self.enable_in_reasoning = False\n"
               "    def _get_reasoner(self, r):\n        return None\n")
    assert bridge.manager_shape(manager) == (K.LACKS, ())
    assert bridge.manager_shape(manager + "    def should_advance(self, r):\n        return False\n")[0] == K.DEFINES
    assert bridge.manager_shape(manager.replace("_get_reasoner", "_reasoner")) == (K.LACKS, ("_get_reasoner",))
    assert bridge.manager_shape("class Other:\n    pass\n") == (K.ABSENT, ())


@needs_omni
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    """vLLM 0.24.0 defines it, 0.30.0 / 0.33.0 / 0.34.0 do not (read from the wheels); vllm-omni 0.24.0's AR and
    generation schedulers call it."""
    defines = Version(VLLM_VERSION) < Version("0.30")
    assert STATIC.host == (K.DEFINES if defines else K.LACKS) and STATIC.missing == ()
    if Version(OMNI_VERSION) < Version("0.26"):
        assert STATIC.callers == ("vllm_omni/core/sched/omni_ar_scheduler.py",
                                  "vllm_omni/core/sched/omni_generation_scheduler.py")
    assert POINT.detect_runtime(importlib.import_module(POINT.target_module)) == STATIC
    assert POINT.decide(STATIC, Controls()).action == (
        Action.SKIPPED if defines or not STATIC.callers else Action.PATCHED)


ERROR = "AttributeError: 'StructuredOutputManager' object has no attribute 'should_advance'"
ACTS = POINT.decide(STATIC, Controls()).action == Action.PATCHED
needs_the_drift = pytest.mark.skipif(
    STATIC.host != K.LACKS or not STATIC.callers,
    reason=f"needs a vLLM without should_advance (0.30+) and a vllm-omni calling it; here {STATIC}")


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """What vllm-omni's schedulers do here: unpatched (where the stand-in acts) and as installed."""
    tmp = tmp_path_factory.mktemp("should_advance")
    return {"unpatched": _observe(tmp, {"VLLM_COMPAT_DISABLE_PATCHES": POINT.id}) if ACTS else None,
            "installed": _observe(tmp)}


@needs_omni
@needs_v1_model_runner
@pytest.mark.skipif(STATIC.host != K.DEFINES or not STATIC.callers or VLLM_VERSION != "0.24.0",
                    reason="NATIVE was measured on vLLM 0.24.0's own should_advance; vLLM 0.25-0.29 define their own "
                           "(0.29's answers spec-decode and structural-tag ends differently, 2026-12-07)")
def test_the_native_pair_gives_these(observed):
    assert observed["installed"] == {"cases": NATIVE, "direct": NATIVE_DIRECT, "left_out_warnings": 0}


@needs_omni
@needs_v1_model_runner
@needs_the_drift
@pytest.mark.parametrize("case", CASES)
def test_vllm_omnis_schedulers_die_at_the_first_output_unpatched_and_match_the_native_pair_patched(observed, case):
    installed = observed["installed"]["cases"][case]
    if isinstance(installed, str) and "should_advance" not in installed:  # the step fails before it asks
        pytest.skip(f"another drift stops this request first here: {installed}")
    assert observed["unpatched"]["cases"][case] == ERROR  # every request, structured or not, at its first output
    assert installed == NATIVE[case]


@needs_omni
@needs_the_drift
@pytest.mark.parametrize("case", DIRECT)
def test_what_the_schedulers_cannot_reach_on_cpu_is_answered_as_vllm_024_did(observed, case):
    assert observed["unpatched"]["direct"][case] == ERROR
    assert observed["installed"]["direct"][case] == NATIVE_DIRECT[case]


@needs_omni
@needs_the_drift
def test_what_it_leaves_out_is_said_where_it_happens(observed):
    """Reasoning ending inside a speculative step: the grammar misses that step's content (0.24's rule), said once."""
    assert POINT.decide(STATIC, Controls()).leaves_out == bridge.LEAVES_OUT
    assert observed["unpatched"]["left_out_warnings"] == 0 and observed["installed"]["left_out_warnings"] == 1


@needs_omni
@pytest.mark.skipif(STATIC.host != K.LACKS, reason=f"needs vLLM 0.30+; here {STATIC}")
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    owner = POINT.locate(importlib.import_module(POINT.target_module))
    had = POINT.is_installed(owner)
    POINT.uninstall(owner)
    assert bridge.NAME not in vars(owner)
    assert POINT.install(owner, None, None) and not POINT.install(owner, None, None)
    assert vars(owner)[bridge.NAME] is bridge.should_advance
    if not had:
        POINT.uninstall(owner)
