"""What the two scheduler patches share (``ar_scheduler_v1_runner``, ``generation_scheduler_v1_runner``): a vllm-omni
scheduler made to agree with its worker about the model runner.

vLLM's ``Scheduler`` takes ``use_v2_model_runner`` from the config, and shapes its output by it: with V2 it sends
resumed requests as new ones and keeps no ``prev_step_scheduled_req_ids``, so a running request's ``all_token_ids``
are never sent; the V1 runner reads them (``_update_states``). vllm-omni <= 0.28.0's AR and generation workers force
the V1 runner ("v2 model runner does not yet include omni hooks") while their schedulers follow the config; vllm-omni
0.30.0 makes its schedulers agree (``OmniSchedulerMixin._init_omni_io_scheduling_state``: "the scheduler has to
agree or the two disagree about what the SchedulerOutput carries"). The patch does what 0.30.0 does, after the
scheduler's own ``__init__``: ``use_v2_model_runner = False``.

The facts, from files (the same at run time, from the installed trees): vLLM's ``Scheduler.__init__`` assigns the
flag from the config, and the config says V2 for dense models by default (0.25+); the worker file assigns
``self.use_v2_model_runner = False``; no file of ``vllm_omni/core/sched/`` assigns it (0.30.0's does).
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass

from ..decide import Action, Decision
from ..detect.source_tree import parse_source
from ._method import MethodPatch

FLAG = "use_v2_model_runner"
VLLM_SCHEDULER = "vllm/v1/core/sched/scheduler.py"
VLLM_CONFIG = "vllm/config/vllm.py"
DEFAULT_MODELS = "_is_default_v2_model_runner_model"  # vLLM <= 0.28's list of the models V2 is the default for
OMNI_SCHEDULERS = "vllm_omni/core/sched"
VARIANT = "v1_runner"


class Agreement:
    ABSENT = "absent"  # vllm-omni's scheduler (or vLLM) is not installed
    FOLLOWS_CONFIG = "follows_config"  # the worker forces V1, the scheduler follows vLLM's config: patched
    AGREES = "agrees"  # vllm-omni's scheduler sets the flag itself (0.30.0), or the worker does not force V1
    NO_FLAG = "no_flag"  # vLLM's Scheduler does not read the flag: nothing to agree on
    V1_DEFAULT = "v1_default"  # vLLM's config keeps dense models on V1 (<= 0.24): they agree unless told otherwise


@dataclass(frozen=True)
class RunnerAgreement:
    kind: str
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def assigns_flag(source: str | None, value=None) -> bool:
    """Whether ``source`` assigns ``self.use_v2_model_runner`` (to the constant ``value``, when given)."""
    if source is None:
        return False
    for node in ast.walk(parse_source(source)):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Attribute) and t.attr == FLAG and isinstance(t.value, ast.Name)
                and t.value.id == "self" for t in node.targets):
            if value is None or (isinstance(node.value, ast.Constant) and node.value.value is value):
                return True
    return False


def _function(tree: ast.AST, name: str) -> ast.FunctionDef | None:
    return next((n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name), None)


def v2_default_for_dense_models(config_source: str | None) -> bool:
    """Whether ``VllmConfig.use_v2_model_runner`` says V2 for a dense model by default: it does not ask
    ``_is_default_v2_model_runner_model`` (vLLM 0.29+), or that asks ``not ... .is_moe`` (0.25-0.28); vLLM 0.24's
    asks only for its listed architectures."""
    if config_source is None:
        return False
    tree = parse_source(config_source)
    prop = _function(tree, FLAG)
    if prop is None:
        return False
    asks = any(isinstance(n, ast.Attribute) and n.attr == DEFAULT_MODELS for n in ast.walk(prop))
    if not asks:
        return True
    models = _function(tree, DEFAULT_MODELS)
    return models is not None and any(
        isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not) and isinstance(n.operand, ast.Attribute)
        and n.operand.attr == "is_moe" for n in ast.walk(models))


def classify(vllm_tree, omni_tree, worker_file: str, scheduler_file: str) -> RunnerAgreement:
    scheduler = omni_tree.read(scheduler_file)
    if scheduler is None or not vllm_tree.has_package("vllm"):
        return RunnerAgreement(Agreement.ABSENT, f"{scheduler_file} or vLLM is not installed")
    if not assigns_flag(vllm_tree.read(VLLM_SCHEDULER)):
        return RunnerAgreement(Agreement.NO_FLAG, f"vLLM's Scheduler does not read {FLAG}")
    if not v2_default_for_dense_models(vllm_tree.read(VLLM_CONFIG)):
        return RunnerAgreement(Agreement.V1_DEFAULT, "vLLM's config keeps dense models on the V1 runner, which "
                               "vllm-omni's workers force")
    if not assigns_flag(omni_tree.read(worker_file), False):
        return RunnerAgreement(Agreement.AGREES, f"{worker_file} does not force the V1 runner")
    setters = [path for path in omni_tree.walk_py(OMNI_SCHEDULERS) if assigns_flag(omni_tree.read(path))]
    if setters:
        return RunnerAgreement(Agreement.AGREES, f"vllm-omni's schedulers set {FLAG} themselves ({setters[0]})")
    return RunnerAgreement(Agreement.FOLLOWS_CONFIG, f"{worker_file} forces the V1 runner; {scheduler_file} "
                           "follows vLLM's config")


def agree_with_worker(wrapped, instance, args, kwargs):
    """The scheduler's own ``__init__``, then the V1 runner its worker runs."""
    result = wrapped(*args, **kwargs)
    if getattr(instance, FLAG, False):
        import logging  # not at module level: the static doctor imports this module

        logging.getLogger("vllm_compat").debug("vllm_compat: %s schedules for the V1 model runner its worker forces",
                                               type(instance).__name__)
        setattr(instance, FLAG, False)
    return result


class SchedulerRunnerPatch(MethodPatch):
    """``<Scheduler>.__init__`` of one vllm-omni scheduler; a subclass names its files."""

    worker_file: str
    scheduler_file: str

    def detect_static(self, site) -> RunnerAgreement:
        return classify(site.vllm_tree, site.omni_tree, self.worker_file, self.scheduler_file)

    def detect_runtime(self, module) -> RunnerAgreement:
        from ..detect.source_tree import tree_of

        return classify(tree_of("vllm"), tree_of("vllm_omni"), self.worker_file, self.scheduler_file)

    def decide(self, facts: RunnerAgreement, controls=None) -> Decision:
        if facts.kind == Agreement.ABSENT:
            return self.decision(Action.PENDING, f"{facts.detail}; decided when it is imported")
        if facts.kind == Agreement.FOLLOWS_CONFIG:
            return self.decision(Action.PATCHED, f"{facts.detail}: it schedules for the V1 runner, as vllm-omni "
                                 "0.30.0's do (with vLLM's default V2, the V1 runner fails on the first requests)",
                                 VARIANT)
        return self.decision(Action.SKIPPED, facts.detail)

    def install(self, owner, decision: Decision, state) -> bool:
        return self.install_call(owner, decision.variant, agree_with_worker)
