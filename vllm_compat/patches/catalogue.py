"""The catalogue: every drift point vllm_compat handles, as data, and the only list of them.

Adding a drift point is one module in this package (the interface is in ``vllm_compat.patches``) and one
entry here; ``tests/patches/test_catalogue.py`` keeps the two in sync (no entry without a module, no module
without an entry, every module answering the whole interface) and checks that no other file of the package
names a target.
"""

# No `from __future__ import annotations`: see vllm_compat/__init__.py.


class PatchEntry:
    """One catalogue row. A plain slotted class, not a dataclass: this module is imported by
    ``import vllm_compat``, which must stay nearly free (dataclasses pulls in ``inspect``)."""

    __slots__ = ("id", "kind", "module", "target_module", "target", "why", "how", "upstream", "serves",
                 "retire_when")

    def __init__(self, *, id, kind, module, target_module, target, why, how, upstream, serves, retire_when):
        self.id = id  # stable name used in reports and in VLLM_COMPAT_DISABLE_PATCHES
        self.kind = kind  # "patch" (a method replaced), "stand-in" (a removed name defined), "alias", "adapter"
        self.module = module  # the vllm_compat module that implements it
        self.target_module = target_module  # the upstream module whose import triggers it
        self.target = target  # qualified name of the patched or provided attribute inside target_module
        self.why = why
        self.how = how
        self.upstream = upstream  # the upstream change that made it necessary (or that fixed it)
        self.serves = serves  # the vLLM / vllm-omni versions it is for, as measured
        self.retire_when = retire_when

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.__slots__}

    @property
    def target_path(self) -> str:
        return f"{self.target_module}.{self.target}"

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
        from ..decide import Decision

        return Decision(name=self.id, target=self.target_path, action=action, variant=variant, reason=reason,
                        provides=provides)


_OMNI_LOADER = "vllm_omni.diffusion.model_loader.diffusers_loader"

CATALOGUE: tuple[PatchEntry, ...] = (
    PatchEntry(
        id="diffusers_loader_meta_device",
        kind="patch",
        module="vllm_compat.patches.diffusers_loader",
        target_module=_OMNI_LOADER,
        target="DiffusersPipelineLoader._process_weights_after_loading",
        why=(
            "vLLM online quantization (uses_meta_device=True) leaves straggler layers on `meta`; vllm-omni <= "
            "0.24.0 moves each quant module with module.to(), which raises 'Cannot copy out of meta tensor'. The "
            "first upstream fix moved params one by one via .data and broke FSDP/HSDP DTensor params."
        ),
        how=(
            "Replace the method (a plain function keeping name, signature and __wrapped__) with the variant the decision "
            "table picks: legacy (0.24.0 semantics) or meta_safe (vLLM's finalize looked up at call time, skip "
            "processed layers, never move meta params, module-level moves for DTensor/tensor-subclass params)."
        ),
        upstream="vllm-omni 0.26.0 gated fix (meta-safe path only when online quant is in use)",
        serves="vllm-omni <= 0.24.0 (legacy loader) and the ungated first fix, on vLLM >= 0.17",
        retire_when="the oldest vllm-omni you support is >= 0.26.0 (its loader classifies as 'gated')",
    ),
    PatchEntry(
        id="hsdp_load_order",
        kind="patch",
        module="vllm_compat.patches.hsdp_load_order",
        target_module=_OMNI_LOADER,
        target="DiffusersPipelineLoader.load_model",
        why=(
            "vllm-omni <= 0.24.0 processes weights after HSDP sharding: _load_model_with_hsdp runs "
            "prepare_fp8_layers_for_fsdp and apply_hsdp_to_model, and load_model calls "
            "_process_weights_after_loading only afterwards. Quantization applied to FSDP-sharded params never "
            "reaches the forward (FSDP re-installs the unquantized weight), and sharded meta stragglers cannot "
            "be finalized: HSDP + quantization is silently unquantized or fails."
        ),
        how=(
            "Wrap load_model: on the HSDP path only, and only for that call, the loader's load_weights is "
            "followed by _process_weights_after_loading(model, device) (before prepare/shard, as vllm-omni >= "
            "0.26 does), and load_model's own later call for that same model is skipped once."
        ),
        upstream="vllm-omni 0.26.0: _load_model_with_hsdp processes weights before prepare_fp8_layers_for_fsdp",
        serves="vllm-omni <= 0.24.0 with use_hsdp and a quantization config, on every vLLM",
        retire_when="the oldest vllm-omni you support is >= 0.26.0 (load order classifies as 'process_before_shard')",
    ),
    PatchEntry(
        id="routed_experts_lists",
        kind="stand-in",
        module="vllm_compat.bridges.routed_experts_lists",
        target_module="vllm.v1.outputs",
        target="RoutedExpertsLists",
        why=(
            "vLLM 0.31 removed RoutedExpertsLists (a two-field NamedTuple: routing_data, slot_mapping); vllm-omni "
            "0.24.0 and 0.30.0 import it in vllm_omni/core/sched/utils.py, which `import vllm_omni` reaches, so "
            "both die at import on vLLM 0.31+."
        ),
        how=(
            "When vllm.v1.outputs is imported without the name and an installed vllm-omni imports it (read from "
            "its files), set our two-field NamedTuple there (marked _vllm_compat_stand_in); the startup .pth "
            "registers the hook before `import vllm_omni`. Never replaces vLLM's own."
        ),
        upstream="vLLM 0.31.0 removed vllm.v1.outputs.RoutedExpertsLists",
        serves="vllm-omni 0.24.0 and 0.30.0 on vLLM 0.31-0.33 (vLLM <= 0.30 keeps its own)",
        retire_when="the oldest vllm-omni you support no longer imports vllm.v1.outputs.RoutedExpertsLists",
    ),
    PatchEntry(
        id="input_preprocessor",
        kind="stand-in",
        module="vllm_compat.bridges.input_preprocessor",
        target_module="vllm.inputs",
        target="preprocess",
        why=(
            "vLLM 0.29 removed the module vllm.inputs.preprocess (InputPreprocessor, a prompt -> engine-input layer "
            "over the renderer); vllm-omni 0.24.0 subclasses it in vllm_omni/inputs/preprocess.py, which "
            "vllm_omni.engine.stage_init_utils imports, so its diffusion worker, executor and stage clients die with "
            "ModuleNotFoundError on vLLM 0.29+ while `import vllm_omni` works."
        ),
        how=(
            "When vllm.inputs is imported without that submodule and an installed vllm-omni imports it (read from "
            "its files), register a module object (marked _vllm_compat_stand_in) in sys.modules and on vllm.inputs, "
            "holding our InputPreprocessor: 0.28's constructor and the helpers vllm-omni calls, each delegating to "
            "vLLM 0.29+'s renderer. Never replaces vLLM's own."
        ),
        upstream="vLLM 0.29.0 removed vllm/inputs/preprocess.py (the renderer, vllm.renderers.BaseRenderer, does it all)",
        serves="vllm-omni 0.24.0 on vLLM 0.29-0.33 (vLLM <= 0.28 keeps its own; vllm-omni 0.30.0 does not import it)",
        retire_when="the oldest vllm-omni you support no longer imports vllm.inputs.preprocess (0.30.0 does not)",
    ),
    PatchEntry(
        id="engine_startup_launch",
        kind="adapter",
        module="vllm_compat.bridges.engine_startup_adapter",
        target_module="vllm_omni.diffusion.stage_diffusion_proc",
        target="wait_for_engine_startup",
        why=(
            "vLLM 0.28 changed vllm.v1.engine.utils.wait_for_engine_startup from 8 arguments (..., addresses, ..., "
            "proc_manager, coord_process) to 6 (..., launch: CoreEngineLaunch); vllm-omni 0.24.0's diffusion stage "
            "(StageDiffusionProcManager._wait_until_started, the default stage startup) calls the old form, so on "
            "vLLM 0.28+ it raises TypeError."
        ),
        how=(
            "Where vLLM's function takes launch (its source and live signature) and the module calls the 8-argument "
            "form (its source, read with ast), rebind the module's name to an adapter with the old signature that "
            "builds the CoreEngineLaunch as vLLM's launch_core_engines does (a proc manager that is not a "
            "CoreEngineProcManager goes through a view of one, so a dying diffusion process still fails the "
            "startup) and calls vLLM's function. Uninstall restores the original binding."
        ),
        upstream="vLLM 0.28.0 replaced wait_for_engine_startup's addresses / proc_manager / coord_process by launch",
        serves="vllm-omni 0.24.0 on vLLM 0.28-0.33 (vLLM <= 0.27 takes the old call; vllm-omni 0.30.0 makes the new)",
        retire_when="the oldest vllm-omni you support calls the 6-argument form (0.30.0 does)",
    ),
    PatchEntry(
        id="engine_zmq_addresses",
        kind="stand-in",
        module="vllm_compat.bridges.engine_zmq_addresses",
        target_module="vllm.v1.engine.utils",
        target="get_engine_zmq_addresses",
        why=(
            "vLLM 0.32 replaced get_engine_zmq_addresses(vllm_config, num_api_servers=1, *, defer_api_server_ports="
            "True) -> EngineZmqAddresses by get_engine_zmq_bind_addresses(vllm_config, num_api_servers=1) -> "
            "EngineZmqBindAddresses (inputs / outputs only); vllm-omni 0.24.0 and 0.30.0 import the old name at module "
            "level in vllm_omni/engine/stage_engine_startup.py (LLM stage replicas, remote engines), so that module "
            "dies with ImportError on vLLM 0.32+."
        ),
        how=(
            "When vllm.v1.engine.utils is imported without the name, an installed vllm-omni imports it (read from "
            "its files), its calls pass only vllm_config / num_api_servers, and the 0.32+ function and both address "
            "classes have the measured shapes, set our function there (marked _vllm_compat_stand_in): vLLM's "
            "get_engine_zmq_bind_addresses, looked up at each call, copied into vLLM's EngineZmqAddresses (what the "
            "old function returned with its default deferred ports). Never replaces vLLM's own."
        ),
        upstream="vLLM 0.32.0 replaced get_engine_zmq_addresses by get_engine_zmq_bind_addresses (frontend binds)",
        serves=("vllm-omni 0.24.0 and 0.30.0 (installed with vLLM's transformers range) on vLLM 0.32-0.33 (vLLM <= "
                "0.31 keeps its own)"),
        retire_when="the oldest vllm-omni you support no longer imports vllm.v1.engine.utils.get_engine_zmq_addresses",
    ),
    PatchEntry(
        id="stage_engine_startup_launch",
        kind="adapter",
        module="vllm_compat.bridges.stage_engine_startup_adapter",
        target_module="vllm_omni.engine.stage_engine_startup",
        target="wait_for_engine_startup",
        why=(
            "The same vLLM 0.28 change as engine_startup_launch (8 arguments -> 6 with launch: CoreEngineLaunch), "
            "in vllm-omni 0.24.0's other caller module: launch_stage_replica (colocated and master-registered LLM "
            "stage replicas, the default LLM stage startup), connect_remote_engine_cores and "
            "connect_remote_diffusion_proc make the old call, so on vLLM 0.28+ they raise TypeError."
        ),
        how=(
            "As engine_startup_launch (one shared adapter, bridges._engine_startup_call): where vLLM's function takes "
            "launch and the module's calls are all the 8-argument form, rebind the module's name to the old-signature "
            "adapter that builds the CoreEngineLaunch and calls vLLM's function; uninstall restores the binding."
        ),
        upstream="vLLM 0.28.0 replaced wait_for_engine_startup's addresses / proc_manager / coord_process by launch",
        serves="vllm-omni 0.24.0 on vLLM 0.28-0.33 (vLLM <= 0.27 takes the old call; vllm-omni 0.30.0 makes the new)",
        retire_when="the oldest vllm-omni you support calls the 6-argument form (0.30.0 does)",
    ),
    PatchEntry(
        id="fp8_copy_missing_attrs",
        kind="stand-in",
        module="vllm_compat.bridges.fp8_copy_missing_attrs",
        target_module="vllm.model_executor.layers.quantization.fp8",
        target="_copy_missing_attrs",
        why=(
            "vLLM 0.27 removed _copy_missing_attrs(old, new) from its fp8 quantization module (copies the attributes "
            "old has and new lacks via set_weight_attrs); vllm-omni 0.24.0 imports it at module level in "
            "vllm_omni/quantization/int8_config.py, mxfp8_config.py and mxfp4_config.py, so its diffusion quant "
            "configs (quantization='int8' / 'mxfp8' / 'mxfp4') die with ImportError on vLLM 0.27+."
        ),
        how=(
            "When the fp8 module is imported without the name, an installed vllm-omni imports it (read from its "
            "files) and vLLM's set_weight_attrs takes (weight, weight_attrs), set vLLM 0.26's definition there "
            "(marked _vllm_compat_stand_in), calling the installed set_weight_attrs. Never replaces vLLM's own."
        ),
        upstream="vLLM 0.27.0 removed vllm.model_executor.layers.quantization.fp8._copy_missing_attrs (dead code "
                 "to vLLM; vllm-omni 0.30.0 re-homed the same function)",
        serves=("vllm-omni 0.24.0 on vLLM 0.27-0.33 (vLLM <= 0.26 keeps its own; vllm-omni 0.30.0 imports its own "
                "copy)"),
        retire_when="the oldest vllm-omni you support no longer imports it from vLLM (0.30.0 does not)",
    ),
    PatchEntry(
        id="multimodal_processing_info",
        kind="stand-in",
        module="vllm_compat.bridges.multimodal_processing_info",
        target_module="vllm.multimodal.processing.processor",
        target="MultiModalProcessingInfo",
        why=(
            "vLLM 0.31 replaced MultiModalProcessingInfo (a NamedTuple: kwargs, hashes, prompt_updates) by "
            "MultiModalProcessingResult, which adds a required prompt_ids (so no alias); vllm-omni 0.30.0 imports it "
            "at module level in vllm_omni/model_executor/models/qwen2_5_omni/qwen2_5_omni_thinker.py, which its "
            "diffusion worker reaches (via config.pipeline_registry -> models.auk), so the worker does not start on "
            "vLLM 0.31+."
        ),
        how=(
            "When the processor module is imported without the name and an installed vllm-omni imports it (read from "
            "its files), set vLLM 0.30's three-field NamedTuple there (annotations from the installed module, Any "
            "where a name is gone; marked _vllm_compat_stand_in; its prompt_ids raises AttributeError). Only the "
            "import is bridged, not the thinker's multimodal processing (its 0.30-shaped overrides raise loudly on "
            "0.31+). Never replaces vLLM's own."
        ),
        upstream="vLLM 0.31.0 renamed MultiModalProcessingInfo to MultiModalProcessingResult and added prompt_ids",
        serves=("vllm-omni 0.30.0's diffusion worker import chain on vLLM 0.31-0.33 (vLLM <= 0.30 keeps its own; "
                "vllm-omni 0.24.0 does not import it)"),
        retire_when="the oldest vllm-omni you support no longer imports "
                    "vllm.multimodal.processing.processor.MultiModalProcessingInfo",
    ),
    PatchEntry(
        id="kv_cache_configs",
        kind="stand-in",
        module="vllm_compat.bridges.kv_cache_configs",
        target_module="vllm.v1.core.kv_cache_utils",
        target="get_kv_cache_configs",
        why=(
            "vLLM 0.33 moved get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory) to "
            "vllm.v1.core.kv_cache_planning and split it: get_global_kv_cache_groups(vllm_config, kv_cache_specs) "
            "groups (asking model_config.supports_kv_cache_grouping), get_kv_cache_configs(..., "
            "global_kv_cache_groups) plans (so no alias); vllm-omni 0.30.0 imports the old name at module level in "
            "vllm_omni/diffusion/diffusion_kv/initialization.py, which vllm_omni.diffusion.diffusion_engine imports, "
            "so the diffusion engine, stage process and worker die with ImportError on vLLM 0.33."
        ),
        how=(
            "When kv_cache_utils is imported without the name, an installed vllm-omni imports it (read from its "
            "files), its calls pass the three old arguments, and the planning module beside it has the measured "
            "shapes (read from its file), set our function there (marked _vllm_compat_stand_in): vLLM 0.33's "
            "get_global_kv_cache_groups on a view of vllm_config whose model_config answers "
            "supports_kv_cache_grouping=False (0.32's default grouping; vllm-omni's diffusion model config has no "
            "such attribute), then its get_kv_cache_configs with those groups, both looked up at each call. Never "
            "replaces vLLM's own."
        ),
        upstream="vLLM 0.33.0's KV-cache planning rewrite (vllm/v1/core/kv_cache_planning.py, KVCacheConfigBuilder)",
        serves=("vllm-omni 0.30.0's diffusion engine / paged diffusion KV setup on vLLM 0.33 (vLLM <= 0.32 keeps its "
                "own; vllm-omni 0.24.0 does not import it)"),
        retire_when="the oldest vllm-omni you support no longer imports vllm.v1.core.kv_cache_utils.get_kv_cache_configs",
    ),
    PatchEntry(
        id="moved_names",
        kind="alias",
        module="vllm_compat.bridges.moved_names",
        target_module="vllm.env_override",
        target="<alias table>",
        why=(
            "vLLM moves internals between releases; a pinned vllm-omni still imports the old path and dies with "
            "ImportError (e.g. vllm.entrypoints.launcher, moved to vllm.entrypoints.launchers.launcher in 0.29). Which "
            "name went where is data (bridges/_alias_table.py), generated from the release wheels by matrix/aliases.py "
            "matching definitions by normalized source, never by name alone."
        ),
        how=(
            "On import of vllm.env_override (the second module `import vllm` runs, before any vllm.x submodule; the "
            "startup .pth registers the hook), for every table row whose old path this vLLM lacks, whose new definition "
            "has the recorded source in the installed files, that is identical or reviewed 'accept', and that an "
            "installed vllm-omni imports: a post-import hook sets a moved name on its old module, a meta-path finder "
            "serves a moved module under its old path. Never replaces what vLLM defines; uninstall removes what it added."
        ),
        upstream="vLLM's refactors that moved definitions (launchers/ in 0.29, common/startup in 0.33, ...)",
        serves="vllm-omni 0.24.0 and 0.30.0 on vLLM 0.25-0.33, per row of the table (its vllm / omni fields)",
        retire_when="the oldest vllm-omni you support imports none of the table's old paths (the regenerated table "
                    "is empty)",
    ),
)
