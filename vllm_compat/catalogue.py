"""The catalogue: every drift point vllm_compat handles, as routing data, and the only list of them.

One row per drift point: its id, its kind, the module that implements it and the upstream module whose import
triggers it (and, where it has one, the attribute it acts on). Activation needs nothing else to register its
hooks; what the drift point is for (why, which upstream shape each variant serves, when to retire it) is the
drift-point module's docstring, the one home of that text (``docs/drift-points.md`` is generated from it).

Adding a drift point is one module deriving ``vllm_compat.drift.DriftPoint`` (exporting ``DRIFT_POINT``) and one
row here (``docs/adding-a-drift-point.md``); ``tests/patches/test_catalogue.py`` keeps the two in sync and checks
that no other file of the package names a target. Drift-point modules never import this module: the drift point
finds its row through ``drift.DriftPoint.entry``.
"""

# No `from __future__ import annotations`: see vllm_compat/__init__.py.

KINDS = ("patch", "stand-in", "alias", "adapter")


class Entry:
    """One catalogue row. A plain slotted class, not a dataclass: activation loads this module in every process
    that imports vLLM, and it must stay nearly free (dataclasses pulls in ``inspect``)."""

    __slots__ = ("id", "kind", "module", "target_module", "target")

    def __init__(self, id, kind, module, target_module, target=""):
        self.id = id  # stable name used in reports and in VLLM_COMPAT_DISABLE_PATCHES
        self.kind = kind  # "patch" (a method replaced), "stand-in" (a removed name defined), "alias", "adapter"
        self.module = module  # the vllm_compat module that implements it
        self.target_module = target_module  # the upstream module whose import triggers it
        self.target = target  # the attribute inside target_module it acts on ("" where there is no single one)

    def __repr__(self) -> str:
        return f"Entry({self.id!r}, {self.kind!r}, {self.module!r}, {self.target_module!r}, {self.target!r})"

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    @property
    def target_path(self) -> str:
        return f"{self.target_module}.{self.target}" if self.target else self.target_module

    @property
    def provides(self) -> tuple[str, ...]:
        """The ``module.name`` targets a bridge makes importable wherever it acts: its one target for a stand-in or
        adapter; nothing for a patch, nor for an alias entry, whose many old paths depend on the installed vLLM and
        are named by each of its Decisions (``Decision.provides``). Import-drift reports match their unresolved names
        against both."""
        return (self.target_path,) if self.kind in ("stand-in", "adapter") else ()

    @property
    def distribution(self) -> str:
        """The distribution that ships the target module ("vllm-omni" for ``vllm_omni.*``)."""
        return self.target_module.split(".", 1)[0].replace("_", "-")

    def decision(self, action: str, reason: str, variant: str | None = None, provides: tuple[str, ...] = ()):
        from .decide import Decision

        return Decision(name=self.id, target=self.target_path, action=action, variant=variant, reason=reason,
                        provides=provides)

    @property
    def point(self):
        """The drift point implementing this row (its module's ``DRIFT_POINT``, imported on first use)."""
        import importlib

        return importlib.import_module(self.module).DRIFT_POINT


PatchEntry = Entry  # the name before the catalogue moved out of patches/ (issue 23)

_LOADER = "vllm_omni.diffusion.model_loader.diffusers_loader"
_P, _B = "vllm_compat.patches.", "vllm_compat.bridges."

CATALOGUE: tuple[Entry, ...] = (
    # id                              kind        module                                  target module, target
    Entry("diffusers_loader_meta_device", "patch", _P + "diffusers_loader", _LOADER,
          "DiffusersPipelineLoader._process_weights_after_loading"),
    Entry("hsdp_load_order", "patch", _P + "hsdp_load_order", _LOADER, "DiffusersPipelineLoader.load_model"),
    Entry("ar_scheduler_v1_runner", "patch", _P + "ar_scheduler_v1_runner", "vllm_omni.core.sched.omni_ar_scheduler",
          "OmniARScheduler.__init__"),
    Entry("generation_scheduler_v1_runner", "patch", _P + "generation_scheduler_v1_runner",
          "vllm_omni.core.sched.omni_generation_scheduler", "OmniGenerationScheduler.__init__"),
    Entry("scheduler_skipped_waiting", "stand-in", _B + "scheduler_skipped_waiting",
          "vllm_omni.core.sched.omni_scheduler_mixin", "OmniSchedulerMixin.skipped_waiting"),
    Entry("streaming_input_sessions", "patch", _P + "streaming_input_sessions", "vllm_omni.core.sched.omni_ar_scheduler",
          "OmniARScheduler._update_request_as_session"),
    Entry("request_token_buffer_clear", "patch", _P + "request_token_buffer_clear", "vllm_omni.request",
          "OmniRequest.__init__"),
    Entry("async_tokens_to_discard", "adapter", _B + "async_tokens_to_discard", "vllm_omni.core.sched.omni_ar_scheduler",
          "OmniARAsyncScheduler._update_request_with_output"),
    Entry("structured_output_should_advance", "stand-in", _B + "structured_output_should_advance",
          "vllm.v1.structured_output", "StructuredOutputManager.should_advance"),
    Entry("structured_output_reasoning_trim", "adapter", _B + "structured_output_reasoning_trim",
          "vllm_omni.core.sched.omni_ar_scheduler", "OmniARScheduler.update_from_output"),
    Entry("async_runner_output_init_attrs", "adapter", _B + "async_runner_output_init_attrs",
          "vllm_omni.worker.gpu_ar_model_runner", "OmniAsyncGPUModelRunnerOutput.get_output"),
    Entry("ar_runner_prepare_inputs", "adapter", _B + "ar_runner_prepare_inputs",
          "vllm_omni.worker.gpu_ar_model_runner", "GPUARModelRunner.execute_model"),
    Entry("generation_runner_prepare_inputs", "adapter", _B + "generation_runner_prepare_inputs",
          "vllm_omni.worker.gpu_generation_model_runner", "GPUGenerationModelRunner.execute_model"),
    Entry("ar_runner_bookkeeping_sync", "adapter", _B + "ar_runner_bookkeeping_sync",
          "vllm_omni.worker.gpu_ar_model_runner", "GPUARModelRunner.sample_tokens"),
    Entry("runner_xdrope_removed", "stand-in", _B + "runner_xdrope_removed", "vllm_omni.worker.gpu_model_runner",
          "OmniGPUModelRunner.uses_xdrope_dim"),
    Entry("runner_routed_experts_removed", "stand-in", _B + "runner_routed_experts_removed",
          "vllm_omni.worker.gpu_model_runner", "OmniGPUModelRunner.routed_experts_initialized"),
    Entry("routed_experts_clear_buffer", "patch", _P + "routed_experts_clear_buffer",
          "vllm_omni.worker.gpu_ar_model_runner", "GPUARModelRunner.execute_model"),
    Entry("runner_cascade_attention_removed", "adapter", _B + "runner_cascade_attention_removed",
          "vllm_omni.worker.gpu_model_runner", "OmniGPUModelRunner._build_attention_metadata"),
    Entry("routed_experts_lists", "stand-in", _B + "routed_experts_lists", "vllm.v1.outputs", "RoutedExpertsLists"),
    Entry("input_preprocessor", "stand-in", _B + "input_preprocessor", "vllm.inputs", "preprocess"),
    Entry("engine_startup_launch", "adapter", _B + "engine_startup_adapter", "vllm_omni.diffusion.stage_diffusion_proc",
          "wait_for_engine_startup"),
    Entry("engine_zmq_addresses", "stand-in", _B + "engine_zmq_addresses", "vllm.v1.engine.utils",
          "get_engine_zmq_addresses"),
    Entry("stage_engine_startup_launch", "adapter", _B + "stage_engine_startup_adapter",
          "vllm_omni.engine.stage_engine_startup", "wait_for_engine_startup"),
    Entry("fp8_copy_missing_attrs", "stand-in", _B + "fp8_copy_missing_attrs",
          "vllm.model_executor.layers.quantization.fp8", "_copy_missing_attrs"),
    Entry("multimodal_processing_info", "stand-in", _B + "multimodal_processing_info",
          "vllm.multimodal.processing.processor", "MultiModalProcessingInfo"),
    Entry("kv_cache_configs", "stand-in", _B + "kv_cache_configs", "vllm.v1.core.kv_cache_utils", "get_kv_cache_configs"),
    # before moved_names: their target modules may be moved_names' (vLLM 0.29+: the package openai.engine, 0.32+: the
    # alias chat_utils), which its revert() takes out of sys.modules; theirs must come off first
    Entry("openai_engine_serving", "alias", _B + "openai_engine_serving", "vllm.entrypoints.openai.engine", "serving"),
    Entry("history_tool_calls_cnt", "stand-in", _B + "history_tool_calls_cnt", "vllm.entrypoints.chat_utils",
          "get_history_tool_calls_cnt"),
    Entry("moved_names", "alias", _B + "moved_names", "vllm.env_override", "<alias table>"),
    Entry("v1_block_table", "stand-in", _B + "v1_block_table", "vllm.v1.worker", "block_table"),
    Entry("v1_sampling_metadata", "stand-in", _B + "v1_sampling_metadata", "vllm.v1.sample", "metadata"),
    Entry("v1_sampler", "stand-in", _B + "v1_sampler", "vllm.v1.sample", "sampler"),
    Entry("residual_scattered_for_sp", "stand-in", _B + "residual_scattered_for_sp", "vllm.v1.worker.utils",
          "is_residual_scattered_for_sp"),
    Entry("error_response_engine_text", "adapter", _B + "error_response_adapter", "vllm.entrypoints.serve.utils",
          "error_response"),
    # vllm-omni 0.24.0's server (`vllm serve --omni`) on vLLM 0.25+ (issue 24, helper H6)
    Entry("serve_server_utils", "alias", _B + "serve_server_utils", "vllm.entrypoints.serve.utils", "server_utils"),
    Entry("serve_render_serving", "adapter", _B + "serve_render_serving", "vllm.entrypoints.serve", "render"),
    Entry("serve_disagg_serving", "adapter", _B + "serve_disagg_serving", "vllm.entrypoints.serve", "disagg"),
    Entry("launcher_adapter", "adapter", _B + "launcher_adapter", "vllm.entrypoints", "launcher"),
    Entry("engine_client_methods", "adapter", _B + "engine_client_methods", "vllm_omni.entrypoints.async_omni",
          "AsyncOmni"),
    Entry("async_omni_session_id", "adapter", _B + "async_omni_session_id", "vllm_omni.entrypoints.async_omni",
          "AsyncOmni.generate"),
    Entry("omni_output_ec_transfer_params", "stand-in", _B + "omni_output_ec_transfer_params", "vllm_omni.outputs",
          "OmniRequestOutput.ec_transfer_params"),
    Entry("setup_server_call", "adapter", _B + "setup_server_call", "vllm_omni.entrypoints.openai.api_server",
          "setup_openai_server"),
    Entry("openai_serving_render_keyword", "adapter", _B + "openai_serving_render_keyword",
          "vllm_omni.entrypoints.openai.api_server", "omni_init_app_state"),
    Entry("cli_logging_setup", "adapter", _B + "cli_logging_setup", "vllm_omni.entrypoints.cli.serve",
          "OmniServeCommand.validate"),
    Entry("mm_hasher_algorithm", "adapter", _B + "mm_hasher_algorithm", "vllm_omni.engine.async_omni_engine",
          "AsyncOmniEngine._ensure_stage_replica_mm_uuids"),
    Entry("kv_cache_tensor_shared_by", "adapter", _B + "kv_cache_tensor_shared_by",
          "vllm_omni.experimental.ar_diffusion.kv_cache.manager", "build_kv_manager"),
    Entry("ar_diffusion_in_flight_tokens", "stand-in", _B + "ar_diffusion_in_flight_tokens",
          "vllm_omni.experimental.ar_diffusion.kv_cache.manager", "ARDiffusionRequestAdapter.num_in_flight_tokens"),
)


def _row(field: str, value: str, missing: str) -> Entry:
    """The row whose ``field`` is ``value``; ``KeyError(missing)`` otherwise (``{value}`` and ``{known}``, the known
    ids, filled in)."""
    for candidate in CATALOGUE:
        if getattr(candidate, field) == value:
            return candidate
    raise KeyError(missing.format(value=value, known=", ".join(e.id for e in CATALOGUE)))


# The drift point vllm_compat began with (README): vllm-omni's diffusion loader under vLLM's meta-device quantization.
# Its decision has a line of its own on the short doctor / check screen, under this label (reporting.py).
HEADLINE = ("diffusers_loader_meta_device", "loader")


def entry(entry_id: str) -> Entry:
    """The row with ``entry_id``; ``KeyError`` naming the known ids otherwise."""
    return _row("id", entry_id, "no catalogue entry {value!r}; known: {known}")


def entry_for_module(module: str) -> Entry:
    """The row implemented by ``module`` (a drift-point module's ``__name__``); ``KeyError`` otherwise."""
    return _row("module", module, "no catalogue entry is implemented by {value}; add its row to "
                "vllm_compat/catalogue.py")


def drift_point(catalogue_entry: Entry):
    """The drift point implementing ``catalogue_entry`` (imported on first use)."""
    return catalogue_entry.point
