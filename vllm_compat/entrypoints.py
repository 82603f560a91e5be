"""The ways a plugin is started, as data: what the static check follows and the verdict names one by one.

Each entrypoint is a name users know and the modules whose import is what starting that way runs (its roots).
The import-drift check (``detect.import_drift``) follows every root through its module-level imports; an
entrypoint starts only when no root reaches a vLLM name that is missing and unbridged. A root a release does not
ship is left out; an entrypoint with none of its roots in the tree is "absent" for that release (not judged).

vllm-omni (roots read from its 0.22.0-0.30.0 wheels, where all of them exist):

* ``offline``: the offline API, ``from vllm_omni import Omni`` / ``AsyncOmni`` (vllm-omni's ``__getattr__`` imports
  ``vllm_omni.entrypoints.omni`` / ``async_omni`` on first use);
* ``serve``: the OpenAI-compatible server, ``vllm serve <model> --omni``: vllm-omni's ``vllm`` console script
  (``vllm_omni.entrypoints.cli.main``, whose ``main()`` imports vLLM's CLI helpers when it runs: vLLM 0.34 moved
  ``cli_env_setup``) and the API server module it runs (``vllm_omni.entrypoints.openai.api_server``);
* ``diffusion_stage``: what a diffusion stage process imports beyond the package: the stage process, its engine
  (vllm-omni 0.30.0's diffusion KV-cache setup is reached from the engine, not from the worker) and the worker;
* ``llm_stage``, a part of the offline API and the server: the LLM / AR and generation stages a multi-stage model
  runs (Qwen-Omni's thinker and talker, AR-diffusion and TTS pipelines): their workers, their schedulers, the stage
  engine core process and the output processing, and what every step runs (``Entrypoint.runs``: the runners'
  ``execute_model`` / ``sample_tokens``, the schedulers' ``schedule`` / ``update_from_output``, the profiling run's
  ``_dummy_run``): a drift there stops the stages as a missing import would. A pure-diffusion model never starts them, so where they stop (vLLM
  0.34 removed the V1 model runner their workers subclass) the offline API and the server still start, and the
  verdict names the stages as left out. Every pair gives them a status of their own (``ImportDrift.part_statuses``).

This module imports nothing: it is read by detection, reporting and the matrix.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Entrypoint:
    """One way a plugin is started: ``id`` (the key in ``--json`` and the matrix), ``label`` (what the verdict
    calls it), ``roots`` (the modules that starting it imports) and ``scripts`` (roots whose functions starting
    it also runs, a console script's ``main``: the imports inside them run too)."""

    id: str
    label: str
    roots: tuple[str, ...]
    scripts: tuple[str, ...] = ()
    # the entrypoints this is a part of: not started on its own, so where it stops, those still start and it is
    # what they leave out (the verdict's "Left out: ...")
    part_of: tuple[str, ...] = ()
    # functions (dotted, ``module.Class.method``) that using it always runs beside its imports: a stage's model step
    # and its startup's profiling run. What they reach stops it as its start does: a stage whose every step raises
    # does not run.
    runs: tuple[str, ...] = ()


ENTRYPOINTS: dict[str, tuple[Entrypoint, ...]] = {
    "vllm_omni": (
        Entrypoint("offline", "the offline API (Omni / AsyncOmni)",
                   ("vllm_omni.entrypoints.omni", "vllm_omni.entrypoints.async_omni")),
        Entrypoint("serve", "`vllm serve --omni`",
                   ("vllm_omni.entrypoints.cli.main", "vllm_omni.entrypoints.openai.api_server"),
                   scripts=("vllm_omni.entrypoints.cli.main",)),
        Entrypoint("diffusion_stage", "the diffusion stage",
                   ("vllm_omni.diffusion.stage_diffusion_proc", "vllm_omni.diffusion.diffusion_engine",
                    "vllm_omni.diffusion.worker.diffusion_worker")),
        Entrypoint("llm_stage", "vllm-omni's LLM / AR stages",
                   ("vllm_omni.worker.gpu_ar_worker", "vllm_omni.worker.gpu_generation_worker",
                    "vllm_omni.core.sched.omni_ar_scheduler", "vllm_omni.core.sched.omni_generation_scheduler",
                    "vllm_omni.engine.stage_engine_core_proc", "vllm_omni.engine.output_processor"),
                   part_of=("offline", "serve"),
                   # each step: the engine core calls the scheduler's schedule / update_from_output and the worker
                   # the runner's execute_model / sample_tokens; at startup vLLM's profile_run calls _dummy_run
                   runs=tuple(f"vllm_omni.{cls}.{method}" for cls, methods in (
                       ("worker.gpu_ar_model_runner.GPUARModelRunner", ("execute_model", "sample_tokens")),
                       ("worker.gpu_generation_model_runner.GPUGenerationModelRunner",
                        ("execute_model", "sample_tokens", "_dummy_run")),
                       ("worker.gpu_model_runner.OmniGPUModelRunner", ("_dummy_run",)),
                       ("core.sched.omni_ar_scheduler.OmniARScheduler", ("schedule", "update_from_output")),
                       ("core.sched.omni_generation_scheduler.OmniGenerationScheduler",
                        ("schedule", "update_from_output"))) for method in methods)),
    ),
}

# vllm-omni's features by module prefix, in the words its users know: what a drift that stops a start only under a
# condition (a LoRA adapter given at startup) leaves out, named in the verdict ("WORKS WITH vllm_compat, except LoRA
# adapters in the diffusion stage"). The first matching prefix wins: specific ones first.
FEATURES = (
    ("vllm_omni.diffusion.lora", "LoRA adapters in the diffusion stage"),
    ("vllm_omni.lora", "LoRA adapters"),
    ("vllm_omni.quantization", "quantized checkpoints"),
    ("vllm_omni.diffusion.quantization", "quantized checkpoints in the diffusion stage"),
    ("vllm_omni.core.sched", "the LLM / AR stages' scheduling"),
    ("vllm_omni.worker", "the LLM / AR stages' model runners"),
    ("vllm_omni.engine", "the engine"),
    ("vllm_omni.entrypoints.duplex_omni", "full-duplex sessions (DuplexOmni)"),
    ("vllm_omni.entrypoints.openai", "the server's endpoints"),
    ("vllm_omni.diffusion", "the diffusion stage"),
)


def feature_of(plugin_object: str) -> str:
    """The feature ``plugin_object`` (a dotted vllm-omni name) belongs to (``FEATURES``); its module otherwise."""
    for prefix, words in FEATURES:
        if plugin_object == prefix or plugin_object.startswith(prefix + "."):
            return words
    return f"what {plugin_object.rsplit('.', 1)[0]} does"


DIFFUSION_STAGE = "diffusion_stage"  # the entrypoint the older ``worker_*`` fields of the import drift describe


# The request endpoints vLLM serves through its modules (by module prefix): where vLLM calls or reads what vllm-omni
# hands it while serving, a behavioural drift there fails that endpoint's requests.
ENDPOINTS = (
    ("vllm.entrypoints.openai.chat_completion", "/v1/chat/completions"),
    ("vllm.entrypoints.openai.serving_chat", "/v1/chat/completions"),
    ("vllm.entrypoints.openai.completion", "/v1/completions"),
    ("vllm.entrypoints.openai.serving_completion", "/v1/completions"),
    ("vllm.entrypoints.openai.responses", "/v1/responses"),
    ("vllm.entrypoints.openai.serving_responses", "/v1/responses"),
    ("vllm.entrypoints.anthropic", "/v1/messages"),
    ("vllm.entrypoints.openai.speech_to_text", "/v1/audio/transcriptions"),
    ("vllm.entrypoints.speech_to_text", "/v1/audio/transcriptions"),
    ("vllm.entrypoints.pooling", "/pooling"),
)


def endpoint_of(module: str) -> str | None:
    """The endpoint whose requests run through vLLM's ``module`` (``ENDPOINTS``); None for a module that serves
    none (an engine internal)."""
    for prefix, endpoint in ENDPOINTS:
        if module == prefix or module.startswith(prefix + "."):
            return endpoint
    return None


def called(script: str) -> str:
    """The import graph's node for what ``script``'s functions import when they run (a console script's ``main``);
    its parent in the graph is ``script`` itself."""
    return f"{script} (functions)"


def entrypoints_of(plugin: str, release=None, host_refs: tuple = ()) -> tuple[Entrypoint, ...]:
    """The entrypoints of ``plugin`` (a top-level package): the table's where it names them (vllm-omni's, as data);
    else those its release registers and names (``release``: a ``detect.plugin_entrypoints.PluginEntrypoints``,
    with ``host_refs``, what vLLM imports of it); none for a package the table does not know and no release."""
    if plugin in ENTRYPOINTS or release is None:
        return ENTRYPOINTS.get(plugin, ())
    return release.entrypoints(host_refs)
