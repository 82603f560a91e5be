"""Prompts through an ``InputPreprocessor`` with a real renderer and a real tokenizer, built offline.

The model folder is written here: a one-layer Llama ``config.json`` and a word-level ``tokenizer.json`` (the
``tokenizers`` library, which transformers installs) whose post-processor puts ``<s>`` first, so the special-token
switch shows in the ids. vLLM builds its renderer and loads that tokenizer from the folder as it would a model's.

``python -m tests.bridges.preprocess_cases OUT.json`` in a cell with vLLM <= 0.28 records what vLLM's own class
gives (the checked-in oracle ``input_preprocessor.vllm-0.28.0.json``); the tests run the same cases on the
stand-in (vLLM 0.29+) and compare.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WORDS = ["<unk>", "<s>", "</s>", "hello", "world", "a", "cat", "sat", "on", "the", "mat", "red", "blue"]
ORACLE = Path(__file__).with_name("input_preprocessor.vllm-0.28.0.json")

# (name, prompt, tokenization_kwargs) through ``preprocess``: text, text with a salt, truncated text, text without
# special tokens, an unknown word, token ids (with and without kwargs), token ids with the prompt text beside them.
PREPROCESS_CASES = [
    ("text", "hello world", None),
    ("text_salted", {"prompt": "the cat sat on the mat", "cache_salt": "s1"}, None),
    ("text_truncated", "the cat sat on the mat", {"truncate_prompt_tokens": 3}),
    ("text_no_special", "red cat", {"add_special_tokens": False}),
    ("text_unknown_word", "hello purple world", None),
    ("tokens", {"prompt_token_ids": [5, 6, 7]}, None),
    ("tokens_salted", {"prompt_token_ids": [3, 4], "cache_salt": "s2"}, None),
    ("tokens_with_text", {"prompt_token_ids": [3, 4], "prompt": "hello world"}, None),
]
# (name, method, args): the helpers vllm-omni's OmniInputPreprocessor calls on its base.
HELPER_CASES = [
    ("tokenize", "_tokenize_prompt", ("a red cat", None)),
    ("tokenize_no_special", "_tokenize_prompt", ("a red cat", {"add_special_tokens": False})),
    ("tokenize_truncated", "_tokenize_prompt", ("the cat sat on the mat", {"truncate_prompt_tokens": 2})),
    ("truncate_none", "_truncate_inputs", ([9, 8, 7, 6], None)),
    ("truncate_two", "_truncate_inputs", ([9, 8, 7, 6], {"truncate_prompt_tokens": 2})),
]


def write_model(folder: Path) -> Path:
    """A tiny Llama folder with a word-level tokenizer; returns ``folder``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {word: i for i, word in enumerate(WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                             special_tokens=[("<s>", 1)])
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "model_max_length": 64}))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1, "vocab_size": len(WORDS),
        "max_position_embeddings": 64, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}))
    return folder


def build(preprocessor_class, folder: Path):
    """``preprocessor_class(vllm_config=..., renderer=...)`` as vllm-omni's ``build_stage0_input_processor`` builds
    it, on a real renderer with the folder's tokenizer."""
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig
    from vllm.renderers import renderer_from_config

    model_config = ModelConfig(model=str(folder), tokenizer=str(folder), max_model_len=32)
    config = VllmConfig(model_config=model_config, device_config=DeviceConfig(device="cpu"))
    return preprocessor_class(vllm_config=config, renderer=renderer_from_config(config))


def _plain(value):
    """JSON-able: dicts and lists as they are, anything else by its repr."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def run_cases(preprocessor) -> dict:
    """{case name: what the preprocessor returned, or ``"raises <Type>"``}."""
    out = {}
    for name, prompt, kwargs in PREPROCESS_CASES:
        try:
            out[name] = _plain(dict(preprocessor.preprocess(prompt, tokenization_kwargs=kwargs)))
        except Exception as exc:  # noqa: BLE001 - a refusal is a result to compare
            out[name] = f"raises {type(exc).__name__}"
    for name, method, args in HELPER_CASES:
        try:
            out[name] = _plain(getattr(preprocessor, method)(*args))
        except Exception as exc:  # noqa: BLE001
            out[name] = f"raises {type(exc).__name__}"
    return out


def record(out: Path, folder: Path) -> dict:
    """What the installed vLLM's own ``vllm.inputs.preprocess.InputPreprocessor`` gives, written to ``out``."""
    import vllm
    from vllm.inputs.preprocess import InputPreprocessor

    result = {"vllm": vllm.__version__, "cases": run_cases(build(InputPreprocessor, folder))}
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    return result


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(record(Path(sys.argv[1]), write_model(Path(tmp) / "model")), indent=1))
