"""The ``vllm.inputs.preprocess`` stand-in on the real wheels: vllm-omni 0.24.0's diffusion worker module dies at
import on vLLM 0.29+ without it (the real ModuleNotFoundError, reproduced first), imports with it, vllm-omni's own
``OmniInputPreprocessor`` gives on it what it gives on vLLM 0.24's own class, and vLLM <= 0.28 keeps its module."""

from __future__ import annotations

import importlib
import json
import sys

import pytest

from conftest import STARTUP_HOOK, needs_omni, needs_startup_hook, needs_vllm, run_python
from vllm_compat.bridges import HostKind, StandInFacts, is_ours
from vllm_compat.bridges import input_preprocessor as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action, decide_entry
from vllm_compat.detect.static import StaticSite

STATIC = bridge.DRIFT_POINT.detect_static(StaticSite.installed())
TARGET = bridge.MODULE
WORKER = "vllm_omni.diffusion.worker.diffusion_worker"
IMPORTER = "vllm_omni.inputs.preprocess:5 (module)"
needs_missing_module = pytest.mark.skipif(
    STATIC.host != HostKind.LACKS or not STATIC.importers,
    reason=f"needs vLLM >= 0.29 (no {TARGET}) with a vllm-omni that imports it (0.24.0); here: vLLM {STATIC.host} "
    f"it, importers {list(STATIC.importers) or 'none'}",
)
needs_vllm_with_module = pytest.mark.skipif(
    STATIC.host != HostKind.DEFINES, reason=f"needs a vLLM that has {TARGET} (<= 0.28); here: {STATIC.host}"
)
needs_omni_importing_it = pytest.mark.skipif(
    not STATIC.importers or STATIC.host not in (HostKind.DEFINES, HostKind.LACKS),
    reason=f"needs a vllm-omni that imports {TARGET} (0.24.0) and a vLLM; here: importers "
    f"{list(STATIC.importers) or 'none'}, vLLM {STATIC.host} it",
)
NOT_FOUND = f"No module named '{TARGET}'"


@pytest.mark.parametrize(
    ("facts", "action"),
    [
        (StandInFacts(HostKind.LACKS, (IMPORTER,)), Action.PATCHED),
        (StandInFacts(HostKind.LACKS, ()), Action.SKIPPED),
        (StandInFacts(HostKind.DEFINES, (IMPORTER,)), Action.SKIPPED),
        (StandInFacts(HostKind.NO_MODULE, (IMPORTER,)), Action.SKIPPED),
        (StandInFacts(HostKind.ABSENT, ()), Action.PENDING),
        (StandInFacts(HostKind.UNKNOWN, (IMPORTER,)), Action.PENDING),
    ],
    ids=["lacks+imported", "lacks+unused", "defines", "no-module", "no-vllm", "unknown"],
)
def test_decision_table(facts, action):
    assert bridge.DRIFT_POINT.decide(facts, Controls()).action == action
    assert decide_entry(bridge.DRIFT_POINT.entry, facts, Controls(disabled_patches=frozenset({bridge.DRIFT_POINT.entry.id}))).action == (
        Action.DISABLED)


def test_importers_are_read_from_the_files_and_type_checking_ones_left_out():
    """vllm-omni 0.24.0 imports it at module level in inputs/preprocess.py and under TYPE_CHECKING in
    entrypoints/async_omni.py (which does not run); 0.30.0 nowhere."""
    if STATIC.importers:
        assert STATIC.importers == (IMPORTER,)
    else:
        pytest.skip(f"the installed vllm-omni does not import {TARGET} (or none is installed)")


@needs_vllm
def test_static_and_runtime_facts_agree():
    module = importlib.import_module(bridge.DRIFT_POINT.entry.target_module)
    assert bridge.DRIFT_POINT.compare(STATIC, bridge.DRIFT_POINT.detect_runtime(module)) == []


@needs_missing_module
def test_unpatched_diffusion_worker_fails_with_the_real_module_not_found_error():
    """Without the stand-in, ``import vllm_omni`` works and its diffusion worker module does not."""
    result = run_python(
        f"""
        import vllm_omni
        print("PACKAGE-IMPORTED")
        try:
            import {WORKER}
        except ImportError as exc:
            print("IMPORT-ERROR", type(exc).__name__, exc)
        else:
            print("IMPORTED")
        """,
        env={"VLLM_COMPAT_DISABLE_PATCHES": bridge.DRIFT_POINT.entry.id},
        warm=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "PACKAGE-IMPORTED" in result.stdout, result.stdout[-2000:]
    assert f"IMPORT-ERROR ModuleNotFoundError {NOT_FOUND}" in result.stdout, result.stdout[-2000:]


@needs_missing_module
@needs_startup_hook
def test_diffusion_worker_imports_with_the_stand_in_and_revert_removes_it():
    """The fixed run: a plain import of the worker module (the startup hook registered vllm_compat's hooks) works;
    vllm-omni's subclass sits on the stand-in; revert() takes out exactly the module entry and the attribute."""
    result = run_python(
        f"""
        import json, sys
        import {WORKER}
        import vllm_compat
        import vllm.inputs as parent
        from vllm.inputs.preprocess import InputPreprocessor
        from vllm_omni.inputs.preprocess import OmniInputPreprocessor
        module = sys.modules["{TARGET}"]
        out = dict(
            mark=getattr(module, "_vllm_compat_installed", None),
            attribute=parent.preprocess is module,
            subclass=issubclass(OmniInputPreprocessor, InputPreprocessor) and module.InputPreprocessor is InputPreprocessor,
            decision=[d.action for d in vllm_compat.current_decisions() if d.name == "{bridge.DRIFT_POINT.entry.id}"],
        )
        before = set(vars(parent))
        vllm_compat.revert()
        out["removed"] = sorted(before - set(vars(parent)))
        out["in_sys_modules"] = "{TARGET}" in sys.modules
        try:
            import vllm.inputs.preprocess
        except ImportError as exc:
            out["after_revert"] = str(exc)
        vllm_compat.apply()
        out["back"] = sys.modules.get("{TARGET}") is module and parent.preprocess is module
        print("RESULT", json.dumps(out))
        """,
        warm=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert out == {
        "mark": bridge.DRIFT_POINT.entry.id, "attribute": True, "subclass": True, "decision": ["patched"],
        "removed": ["preprocess"], "in_sys_modules": False, "after_revert": NOT_FOUND, "back": True,
    }


@needs_omni
@needs_omni_importing_it
def test_vllm_omni_preprocessor_gives_what_it_gives_on_vllm_024(tmp_path):
    """vllm-omni's own ``OmniInputPreprocessor``, built as ``build_stage0_input_processor`` builds it (a real
    renderer from a tiny local config, no tokenizer), on whichever base this env has: vLLM's own class (<= 0.28)
    or the stand-in (0.29+). The expected values are what vLLM 0.24.0's class gives (measured, and this same test
    on the 0.24 cell)."""
    torch = pytest.importorskip("torch")
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1, "vocab_size": 256,
        "max_position_embeddings": 128, "torch_dtype": "float32"}))
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.renderers import renderer_from_config
    from vllm_omni.inputs.preprocess import OmniInputPreprocessor

    base = sys.modules[TARGET].InputPreprocessor
    assert is_ours(base, bridge.DRIFT_POINT.entry.id) == (STATIC.host == HostKind.LACKS)
    model_config = ModelConfig(model=str(tmp_path), skip_tokenizer_init=True, max_model_len=16,
                               enable_prompt_embeds=True)
    config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    preprocessor = OmniInputPreprocessor(vllm_config=config, renderer=renderer_from_config(config))
    tokens = preprocessor.preprocess({"prompt_token_ids": [1, 2, 3], "additional_information": {"k": [1]},
                                      "cache_salt": "s"})
    assert tokens == {"type": "token", "prompt_token_ids": [1, 2, 3], "additional_information": {"k": [1]},
                      "cache_salt": "s"}
    embeds = preprocessor.preprocess({"prompt_embeds": torch.ones(1, 3, 4), "additional_information": {"k": [2]}})
    assert embeds["type"] == "embeds" and embeds["additional_information"] == {"k": [2]}
    assert torch.equal(embeds["prompt_embeds"], torch.ones(3, 4))  # squeezed by vLLM's renderer, as before
    assert preprocessor._truncate_inputs(list(range(10)), {"truncate_prompt_tokens": 4}) == [0, 1, 2, 3]


@needs_missing_module
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    parent = importlib.import_module(bridge.DRIFT_POINT.entry.target_module)  # vllm_compat's hook (pytest plugin) ran
    had = sys.modules.get(TARGET)
    try:
        bridge.DRIFT_POINT.uninstall(parent)
        names, modules = set(vars(parent)), set(sys.modules)
        decision = bridge.DRIFT_POINT.decide(bridge.DRIFT_POINT.detect_runtime(parent), Controls())
        assert decision.action == Action.PATCHED
        assert bridge.DRIFT_POINT.install(parent, decision, bridge.DRIFT_POINT.prepare(parent, STATIC)) is True
        assert bridge.DRIFT_POINT.install(parent, decision, None) is False  # already there: a no-op
        assert set(vars(parent)) - names == {bridge.NAME} and set(sys.modules) - modules == {TARGET}
        assert is_ours(sys.modules[TARGET], bridge.DRIFT_POINT.entry.id) and parent.preprocess is sys.modules[TARGET]
        assert bridge.DRIFT_POINT.uninstall(parent) is True and set(vars(parent)) == names and set(sys.modules) == modules
        assert bridge.DRIFT_POINT.uninstall(parent) is False
    finally:
        if had is not None:
            sys.modules[TARGET] = had
            setattr(parent, bridge.NAME, had)


@needs_vllm_with_module
def test_stays_out_where_vllm_has_the_module():
    import vllm_compat

    parent = importlib.import_module(bridge.DRIFT_POINT.entry.target_module)
    decisions = {d.name: d for d in vllm_compat.apply()}
    assert decisions[bridge.DRIFT_POINT.entry.id].action == Action.SKIPPED
    own = importlib.import_module(TARGET)
    assert not is_ours(own) and not is_ours(own.InputPreprocessor) and own.__file__.startswith(parent.__path__[0])
    with pytest.raises(Exception, match="never replaces a module vLLM defines"):
        bridge.DRIFT_POINT.prepare(parent, bridge.DRIFT_POINT.detect_runtime(parent))
    assert bridge.DRIFT_POINT.uninstall(parent) is False and sys.modules[TARGET] is own


@needs_missing_module
@pytest.mark.parametrize(
    ("controls", "bridged"),
    [(Controls(), True), (Controls(disabled_patches=frozenset({bridge.DRIFT_POINT.entry.id})), False)],
    ids=["on", "entry-disabled"],
)
def test_import_drift_counts_the_worker_name_as_bridged_only_while_the_bridge_acts(controls, bridged):
    from vllm_compat.decide import plan
    from vllm_compat.reporting import Report

    site = StaticSite.installed()
    drift = Report(mode="static", static=site.environment, patches=[d for _, _, d in plan(site, controls)]).import_drift
    assert TARGET in drift.worker_blocking_names and TARGET not in drift.blocking_names
    assert drift.bridged_by(TARGET) == (bridge.DRIFT_POINT.entry.id if bridged else None)
    assert (TARGET in drift.still_worker_blocking_names) == (not (bridged and STARTUP_HOOK))
