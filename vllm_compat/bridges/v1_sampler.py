"""Stand-in for the module ``vllm.v1.sample.sampler`` (class ``Sampler``), removed in vLLM 0.34.0.

Why: vLLM 0.34 removed the v1 model runner and its ``Sampler`` (an ``nn.Module`` called as ``sampler(logits,
sampling_metadata)``; the model runner v2 has its own, ``vllm.v1.worker.gpu.sample.sampler.Sampler``, built and
called differently). vllm-omni imports ``Sampler`` at module level in 21 files (0.24.0-0.30.0: the Qwen2.5-Omni /
Qwen3-Omni models, TTS and audio models, an NPU patch); vllm-omni 0.30.0's diffusion stage reaches one of them
(``config.pipeline_registry`` -> ``models.auk.auk``), so on vLLM 0.34 the diffusion worker, engine and stage
process die with ``ModuleNotFoundError: No module named 'vllm.v1.sample.sampler'``.

When: ``vllm.v1.sample`` is imported without a ``sampler`` submodule and an installed vllm-omni imports it (read
from its files): a module object holding our ``Sampler`` is registered as ``sys.modules["vllm.v1.sample.sampler"]``
and as the package's attribute (both marked). vLLM <= 0.33 keeps its own.

A raising stand-in, the smallest definition vllm-omni's source needs: vllm-omni builds ``Sampler()`` only inside
functions (a model's ``sampler`` property or ``__init__``, or a sampling call) and never subclasses it; ours is a
class whose construction raises ``RemovedByVLLMError`` naming the removal. What it leaves out: nothing of the
diffusion path; the models whose own code builds the v1 sampler (Qwen2.5-Omni and its talker / token2wav,
Qwen3-Omni, AuK's sampler when its thinker has none, Ming-Flash-Omni's Bailing MoE, Voxtral TTS, Dynin-Omni,
HunyuanImage-3's AR sampling, CoVo-Audio, GLM-TTS, Higgs-Audio v2 / v3 talkers, CosyVoice3, MiniCPM-o 4.5, Step-Audio2,
MiMo-Audio, Ming-TTS) fail when they build it, loudly. Those are LLM / AR stages, which need vLLM's v1 model runner
(``vllm.v1.worker.gpu_model_runner``, gone in 0.34) through vllm-omni's own runners, so they do not start on 0.34
either way.

Serves: vllm-omni 0.24.0-0.30.0 on vLLM 0.34 (the import; 0.30.0's diffusion stage needs it; vLLM <= 0.33 keeps its
own).

Retire when: the oldest supported vllm-omni no longer imports ``vllm.v1.sample.sampler``.
"""

from __future__ import annotations

from ._module_stand_in import ModuleStandIn

# What the report says this leaves out (v1_sampling_metadata's too: the same removal).
LLM_STAGES_LEFT_OUT = ("vllm-omni's LLM / AR stages (Qwen2.5-Omni, Qwen3-Omni, the TTS and audio models) do not start: "
                       "vLLM 0.34 removed the v1 model runner they run on; diffusion models run")

# The vllm-omni files that import it (0.24.0-0.30.0): read, never imported.
IMPORTERS = tuple(f"vllm_omni/{path}.py" for path in (
    "platforms/npu/_310p/patch/worker",
    *(f"model_executor/models/{model}" for model in (
        "auk/auk", "cosyvoice3/cosyvoice3", "covo_audio/covo_audio_code2wav", "dynin_omni/dynin_omni",
        "glm_tts/glm_tts", "higgs_audio_v2/higgs_audio_v2_talker", "higgs_audio_v3/higgs_audio_v3_talker",
        "hunyuan_image3/hunyuan_image3", "mimo_audio/mimo_audio", "mimo_audio/mimo_audio_code2wav",
        "ming_flash_omni/modeling_bailing_moe_v2", "ming_tts/ming_tts", "minicpmo_4_5/minicpmo_4_5_omni",
        "minicpmo_4_5/minicpmo_4_5_omni_tts", "qwen2_5_omni/qwen2_5_omni", "qwen2_5_omni/qwen2_5_omni_talker",
        "qwen2_5_omni/qwen2_5_omni_token2wav", "qwen2_5_omni/qwen2_old", "qwen3_omni/qwen3_omni",
        "step_audio2/step_audio2_token2wav", "voxtral_tts/voxtral_tts"))))


class SamplerModule(ModuleStandIn):
    importers = IMPORTERS
    removed_in = "0.34"
    raises = {"Sampler": "the model runner v2 samples differently. Run this vllm-omni model on vLLM <= 0.33."}
    leaves_out = LLM_STAGES_LEFT_OUT


DRIFT_POINT = SamplerModule()
