"""Patch ``vllm_omni...DiffusersPipelineLoader._process_weights_after_loading``.

Why: vLLM's online quantization (``uses_meta_device = True``) leaves "straggler" layers on ``meta``; the
legacy loader's blanket ``module.to()`` raises "Cannot copy out of meta tensor" on them, and the first fix
(per-parameter ``.data`` moves) broke FSDP/HSDP-sharded DTensor params.
When: ``legacy`` serves vllm-omni <= 0.24.0 on a vLLM that creates no meta params (its exact semantics);
``meta_safe`` serves the legacy and ungated loaders wherever meta params can appear. A gated loader
(vllm-omni >= 0.26.0) is left alone unless a variant is forced.
Serves: vllm-omni <= 0.24.0 (legacy loader) and the ungated first fix, on vLLM >= 0.17.
Retire when: the oldest supported vllm-omni ships the gated loader (0.26.0).

Decision table (facts: ``facts.Environment``):

==========================  ==============================  ========================================
loader shape                meta params possible?           action (variant)
==========================  ==============================  ========================================
absent                      -                               pending (the import hook waits for it)
legacy                      no                              patched (legacy)
legacy                      yes                             patched (meta_safe)
ungated                     any                             patched (meta_safe)
gated                       any                             skipped: already fixed upstream
unknown                     any                             refused (warning; error under STRICT)
any present, forced         any                             patched (the forced variant)
==========================  ==============================  ========================================

"Meta params possible": the installed vLLM's ``QuantizeMethodBase`` has ``uses_meta_device`` or vllm-omni
ships its own quant classes that set it. Torch and vLLM are imported only by ``resolve_deps`` and ``install``.

The package owns everything about this drift point: its facts (``facts``: vLLM's meta-device level, the loader's
shape, vllm-omni's own meta-device quant classes, from files and from the imported modules), its variants
(``variants``), its control and its report lines. The control:

``VLLM_COMPAT_LOADER_VARIANT``   auto (default) | legacy | meta_safe; a forced variant also patches a loader that is
                                 already fixed upstream or of an unknown shape. Any other value is a ``ConfigError``
                                 naming the variable, the value and the allowed values.
"""

from __future__ import annotations

from ...decide import Action, Decision
from ...errors import ConfigError
from .._method import MethodPatch
from .facts import (
    LOADER_PARAMS,
    Environment,
    LoaderKind,
    LoaderShape,
    VllmCapabilities,
    VllmLevel,
    compare_environments,
    scan_tree,
)
from .variants import (  # noqa: F401 - the loader's API, read here by its tests and benchmarks
    CLASS_NAME,
    METHOD_NAME,
    PROCESSED_FLAG,
    VARIANT_FUNCTIONS,
    VARIANTS,
    LoaderDeps,
    check_contract,
    install_variant,
    installed_variant,
    process_legacy,
    process_meta_safe,
    resolve_deps,
    uses_online_quant,
)

VARIANT_VAR = "VLLM_COMPAT_LOADER_VARIANT"
LOADER_VARIANTS = ("auto", *VARIANTS)
# pytest markers (``@pytest.mark.vllm_capability(name)``) this drift point answers, from its static facts.
CAPABILITIES = {
    "meta_device": lambda env: env.vllm.has_uses_meta_device,
    "layerwise_finalize": lambda env: env.vllm.has_compatible_finalize,
}


def loader_variant(controls) -> str:
    """``VLLM_COMPAT_LOADER_VARIANT`` from ``controls`` (case and spaces ignored; "auto" when unset);
    ``ConfigError`` on a value outside ``LOADER_VARIANTS``."""
    raw = controls.switch(VARIANT_VAR, "auto")
    variant = raw.strip().lower() or "auto"
    if variant not in LOADER_VARIANTS:
        raise ConfigError(
            f"{VARIANT_VAR}={raw!r} is not a loader variant. Allowed values: "
            f"{', '.join(LOADER_VARIANTS)} (auto lets vllm_compat choose from what the installed vLLM can do)."
        )
    return variant


class DiffusersLoaderMetaDevice(MethodPatch):
    """Replaces the loader's weight processing with the variant the decision table picks."""

    capability_names = tuple(CAPABILITIES)
    switches = (VARIANT_VAR,)
    imported_by_doctor = True  # doctor --runtime loads vllm-omni's loader, as a worker does

    def detect_static(self, site) -> Environment:
        return scan_tree(site.vllm_tree, site.versions, omni_tree=site.omni_tree)

    def detect_runtime(self, module) -> Environment:
        from .facts import detect_runtime as detect

        return detect(module)

    def check_controls(self, controls) -> None:
        loader_variant(controls)

    def decide(self, env: Environment, controls) -> Decision:
        """The decision table above; each path says why in ``reason``."""
        kind = env.loader.kind
        forced = loader_variant(controls)
        if kind == LoaderKind.ABSENT:
            return self.decision(Action.PENDING, f"{env.loader.detail}; patched when it is imported")
        if forced != "auto":
            return self.decision(Action.PATCHED, f"{VARIANT_VAR}={forced} forces it over the {kind} loader", forced)
        if kind == LoaderKind.GATED:
            return self.decision(Action.SKIPPED, "vllm-omni's loader already has the gated meta-safe fix")
        if kind == LoaderKind.UNKNOWN:
            return self.decision(
                Action.REFUSED,
                f"loader shape not recognized ({env.loader.detail}); left unpatched. Set "
                f"{VARIANT_VAR}=meta_safe to force the patch if you have checked it",
            )
        if kind == LoaderKind.UNGATED:
            return self.decision(Action.PATCHED, "ungated loader breaks FSDP/HSDP-sharded params; meta-safe keeps "
                                 "them", "meta_safe")
        if env.can_create_meta_params:
            source = "vLLM (uses_meta_device)" if env.vllm.has_uses_meta_device else "vllm-omni's own quant methods"
            return self.decision(Action.PATCHED, f"legacy loader, and {source} can leave params on meta; "
                                 "module.to() would crash on them", "meta_safe")
        return self.decision(Action.PATCHED, "legacy loader, and no installed quant method creates meta params",
                             "legacy")

    def prepare(self, owner, env: Environment) -> LoaderDeps:
        check_contract(self.in_place(owner), env.loader)
        return resolve_deps()

    def install(self, owner, decision: Decision, deps: LoaderDeps) -> bool:
        return install_variant(owner, decision.variant, deps)

    def compare(self, static: Environment, runtime: Environment) -> list[str]:
        return compare_environments(static, runtime)

    def facts_dict(self, env: Environment) -> dict:
        return {"loader": env.loader.to_dict(), "level": env.vllm.level}

    # ---- reports: what doctor, check, scan and the pytest header show of these facts ----

    def report_lines(self, env: Environment) -> list[str]:
        from ...detect.model import render_params

        caps, yes = env.vllm, {True: "yes", False: "no"}
        level = f"vLLM level: {caps.level}"
        if caps.installed:
            finalize = "no"
            if caps.has_layerwise_finalize:
                finalize = f"yes {render_params(caps.finalize_params)}" + (
                    "" if caps.has_compatible_finalize else " INCOMPATIBLE: does not accept (model, model_config=None)")
            level += (f"   uses_meta_device: {yes[caps.has_uses_meta_device]}   layerwise finalize: {finalize}   "
                      f"initialize_online_processing: {yes[caps.has_initialize_online_processing]}")
        lines = [level]
        lines.append(f"vllm-omni loader: {env.loader.kind}" + (f" ({env.loader.detail})" if env.loader.detail else ""))
        if env.omni_meta_device_methods:
            lines.append("vllm-omni's own meta-device quant methods: "
                         + ", ".join(m.rsplit(":", 1)[-1] for m in env.omni_meta_device_methods))
        return lines

    def report_fields(self, env: Environment) -> dict:
        return {
            "vllm": {"level": env.vllm.level, "capabilities": env.vllm.to_dict()},
            "vllm_omni": {"loader_kind": env.loader.kind, "loader_detail": env.loader.detail,
                          "meta_device_methods": list(env.omni_meta_device_methods),
                          "quant_import_failures": list(env.omni_quant_import_failures)},
        }

    def header_note(self, env: Environment) -> str:
        return f"vLLM level {env.vllm.level}, loader {env.loader.kind}"

    def capabilities(self, env: Environment) -> dict:
        return {name: bool(test(env)) for name, test in CAPABILITIES.items()}


DRIFT_POINT = DiffusersLoaderMetaDevice()

__all__ = ["CAPABILITIES", "DRIFT_POINT", "LOADER_PARAMS", "LOADER_VARIANTS", "VARIANT_VAR", "Environment",
           "LoaderKind", "LoaderShape", "VllmCapabilities", "VllmLevel", "loader_variant"]
