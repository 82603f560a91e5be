"""Builds one of vllm-omni's own schedulers (``OmniARScheduler`` / ``OmniGenerationScheduler``) on CPU for a tiny
dense model the script writes, with vLLM's config saying Model Runner V2 (``VLLM_USE_V2_MODEL_RUNNER=1``, set once the
config is built: what vLLM 0.25+ says for dense models on a GPU with Triton; on this CPU the config's validation would
refuse V2 for want of Triton), schedules one request and prints, as JSON, what vllm-omni relies on: the scheduler's
runner flag, the V1 bookkeeping of the requests scheduled last step (from which the scheduler sends a resumed
request's ``all_token_ids``), whether a new request's data is V2's (with its prefill token ids), and vLLM <= 0.30's
``skipped_waiting`` queue, which vllm-omni's schedulers read (or the ``AttributeError`` of reading it and of
scheduling). Run (``run``) by ``tests/patches/test_scheduler_v1_runner.py`` and ``tests/bridges/test_scheduler_skipped_waiting.py``.

    python _scheduler_runner_worker.py MODEL_DIR {ar|generation}
"""

import json
import os
import sys
from pathlib import Path


def write_model(root: Path) -> None:
    """A tiny Qwen2 causal LM's config (dense: no experts); no weights, no tokenizer: the scheduler needs neither."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 320, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "max_position_embeddings": 2048, "torch_dtype": "float32", "eos_token_id": 256}))


SCHEDULERS = {"ar": ("vllm_omni.core.sched.omni_ar_scheduler", "OmniARScheduler"),
              "generation": ("vllm_omni.core.sched.omni_generation_scheduler", "OmniGenerationScheduler")}


def scheduler_class_of(where: tuple[str, str]):
    import importlib

    module, name = where
    return getattr(importlib.import_module(module), name)


def build_scheduler(model_dir: str, scheduler_class, **scheduler_options):
    """``scheduler_class`` (vLLM's real config, V2 model runner said, one KV group) for the tiny model written to
    ``model_dir``; returns it and its ``VllmConfig``. ``scheduler_options``: more ``SchedulerConfig`` fields."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    write_model(Path(model_dir))
    model_config = ModelConfig(model=model_dir, skip_tokenizer_init=True, dtype="float32", max_model_len=256)
    cache_config = CacheConfig(block_size=16)
    cache_config.num_gpu_blocks = 64
    scheduler_config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=256, max_model_len=256,
                                       is_encoder_decoder=False, **scheduler_options)
    config = VllmConfig(model_config=model_config, cache_config=cache_config, scheduler_config=scheduler_config,
                        device_config=DeviceConfig(device="cpu"))
    os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"  # vLLM reads it at each use_v2_model_runner
    kv_cache_config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer.0"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=32,
                                                        dtype=torch.float32))])
    scheduler = scheduler_class(vllm_config=config, kv_cache_config=kv_cache_config,
                                structured_output_manager=StructuredOutputManager(config), block_size=16)
    return scheduler, config


def main(model_dir: str, which: str) -> None:
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    from vllm_compat.drift import is_ours

    scheduler_class = scheduler_class_of(SCHEDULERS[which])
    scheduler, config = build_scheduler(model_dir, scheduler_class)
    request = Request(request_id="r0", prompt_token_ids=list(range(8)), sampling_params=SamplingParams(max_tokens=4),
                      pooling_params=None)
    scheduler.add_request(request)
    try:
        waiting = [r.request_id for r in scheduler.skipped_waiting]  # vLLM <= 0.30's queue, which vllm-omni reads
    except AttributeError as exc:
        waiting = f"AttributeError: {exc}"
    try:
        first = scheduler.schedule()
    except AttributeError as exc:  # the one failure the tests expect: a name vLLM removed
        print(json.dumps({"skipped_waiting": waiting, "schedule_error": f"AttributeError: {exc}"}))
        return
    print(json.dumps({
        "skipped_waiting": waiting,
        "wrapped": is_ours(vars(scheduler_class)["__init__"]),
        "config_says_v2": bool(config.use_v2_model_runner),
        "scheduler_v2": bool(scheduler.use_v2_model_runner),
        "scheduled": sorted(first.num_scheduled_tokens),
        "prev_step_scheduled": sorted(scheduler.prev_step_scheduled_req_ids),
        # V2's new-request data carries the prefill token ids (the V2 runner's input); V1's does not
        "new_request_prefill_ids": [getattr(r, "prefill_token_ids", None) is not None for r in first.scheduled_new_reqs],
    }))


def run(which: str, tmp_path: Path, env: dict | None = None) -> dict:
    """What ``main`` prints, run in a fresh interpreter of the tests' env (``conftest.run_python``, warm)."""
    from conftest import run_python  # the tests' helper; the script itself runs without it

    done = run_python(f"import runpy, sys; sys.argv = ['w', {str(tmp_path / 'lm')!r}, {which!r}]; "
                      f"runpy.run_path({__file__!r}, run_name='__main__')", env=env, warm=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
