"""Stand-in for the module ``vllm.v1.sample.metadata`` (class ``SamplingMetadata``), removed in vLLM 0.34.0.

Why: vLLM 0.34 removed the v1 model runner (``vllm.v1.worker.gpu_model_runner``) and with it the v1 sampler's
``SamplingMetadata`` (its sampling moved to the model runner v2, ``vllm.v1.worker.gpu.sample``, whose shapes are not
0.33's). vllm-omni imports ``SamplingMetadata`` at module level in 22 model files (0.24.0-0.30.0: the Qwen2.5-Omni /
Qwen3-Omni thinkers and talkers, the TTS and audio models...); vllm-omni 0.30.0's diffusion stage reaches one of them
(``config.pipeline_registry`` -> ``models.breeze_tts_2.modeling_breeze``), so on vLLM 0.34 the diffusion worker,
engine and stage process die with ``ModuleNotFoundError: No module named 'vllm.v1.sample.metadata'``.

When: ``vllm.v1.sample`` is imported without a ``metadata`` submodule and an installed vllm-omni imports it (read
from its files): a module object holding our ``SamplingMetadata`` is registered as
``sys.modules["vllm.v1.sample.metadata"]`` and as the package's attribute (both marked). vLLM <= 0.33 keeps its own.

A raising stand-in, the smallest definition vllm-omni's source needs: vllm-omni only names the class (annotations of
``sample`` / ``compute_logits`` style methods, ``SamplingMetadata | None`` evaluated at definition time) and never
builds one; instances come from vLLM 0.33's v1 runner. Ours is a class for those annotations whose construction
raises ``RemovedByVLLMError`` naming the removal. What it leaves out: nothing of the diffusion path; every model's
own v1 sampling (the LLM / AR stages: vllm-omni's ``worker.gpu_model_runner`` / ``gpu_ar_model_runner`` subclass
vLLM's ``vllm.v1.worker.gpu_model_runner``, also gone in 0.34, so those stages do not start on 0.34 either way).

Serves: vllm-omni 0.24.0-0.30.0 on vLLM 0.34 (the import; 0.30.0's diffusion stage needs it; vLLM <= 0.33 keeps its
own).

Retire when: the oldest supported vllm-omni no longer imports ``vllm.v1.sample.metadata``.
"""

from __future__ import annotations

from ._module_stand_in import ModuleStandIn
from .v1_sampler import LLM_STAGES_LEFT_OUT

# The vllm-omni files that import it (0.24.0-0.30.0): read, never imported.
IMPORTERS = tuple(f"vllm_omni/{path}.py" for path in (
    "experimental/fullduplex/model_executor", "model_executor/duplex_sampling",
    *(f"model_executor/models/{model}" for model in (
        "breeze_tts_2/modeling_breeze", "cosyvoice3/cosyvoice3", "covo_audio/covo_audio",
        "covo_audio/covo_audio_code2wav", "dynin_omni/dynin_omni", "glm_tts/glm_tts",
        "higgs_audio_v3/higgs_audio_v3_talker", "hunyuan_image3/hunyuan_image3", "mimo_audio/mimo_audio",
        "mimo_audio/mimo_audio_code2wav", "ming_tts/ming_tts_llm", "minicpmo_4_5/minicpmo_4_5_omni",
        "moss_tts/modeling_moss_tts_talker", "nemotron_voicechat/nemotron_voicechat_thinker",
        "qwen2_5_omni/qwen2_5_omni", "qwen2_5_omni/qwen2_5_omni_talker", "qwen2_5_omni/qwen2_5_omni_token2wav",
        "qwen2_5_omni/qwen2_old", "qwen3_omni/qwen3_omni", "step_audio2/step_audio2_token2wav",
        "voxtral_tts/voxtral_tts"))))


class SamplingMetadataModule(ModuleStandIn):
    importers = IMPORTERS
    removed_in = "0.34"
    raises = {"SamplingMetadata": "vLLM 0.33's v1 model runner builds it. Run this vllm-omni model on vLLM <= 0.33."}
    leaves_out = LLM_STAGES_LEFT_OUT


DRIFT_POINT = SamplingMetadataModule()
