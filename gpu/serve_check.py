"""`vllm serve <tiny Qwen-Image> --omni` and the offline `Omni` API on the GPU machine (issue 24 item 4, issue 35).

Subcommands, run by the device calls in gpu/results.md ("Served Qwen-Image", "GPU runs of issue 35"):

  write-model DIR     write a tiny but complete Qwen-Image pipeline in the diffusers layout, offline, from a fixed
                      seed: vllm-omni's QwenImagePipeline loads every component of it (scheduler config, a
                      Qwen2.5-VL text encoder, a byte-level Qwen2 tokenizer, the Qwen-Image VAE, and the
                      QwenImageTransformer2DModel weights through vllm-omni's own loader). Random weights, safetensors.
  write-llm DIR       write a tiny Qwen2 causal LM (the same byte-level tokenizer, a chat template), offline, from a
                      fixed seed: a model whose `vllm serve --omni` takes vllm-omni's LLM-stage branch, which builds
                      vLLM's chat / completion servings (and, on vLLM 0.24, OpenAIServingRender).
  serve NAME DIR OUT  start `vllm serve DIR --omni` (vLLM's own CLI entry point, which hands `--omni` to vllm-omni)
                      in a new process group, wait for /health (or for the process to end), ask /v1/models, then
                      one OpenAI-client `images.generate` (fixed seed, twice: the second must equal the first), then
                      SIGINT and the time the server takes to stop (`--chat`: a greedy chat completion instead of the
                      image, twice). Writes OUT/NAME.json, OUT/NAME.log (the server's
                      stdout+stderr) and OUT/NAME.png.
  omni NAME DIR OUT --stage-configs-path YAML
                      the offline API with one AR stage: in a child interpreter (a new process group, its output in
                      OUT/NAME.log), vllm-omni's `Omni(model=DIR, stage_configs_path=YAML)` and `generate` of PROMPT
                      with greedy SamplingParams (OFFLINE_MAX_TOKENS), twice (the second must equal the first); the
                      child writes what it got, the parent adds the log's error and warning lines and the times:
                      OUT/NAME.json.
  stage-config DIR YAML
                      what the installed vllm-omni's own loader makes of a legacy stage config (stage_args format):
                      `load_and_resolve_stage_configs`, `build_engine_args_dict` (the AR worker class the CUDA omni
                      platform names, filled in where the platform is not CUDA), `OmniEngineArgs`, and the deploy
                      reads 0.26.0+'s engine makes of `stage_configs_path`; JSON on stdout (CPU is enough:
                      tests/gpu/test_serve_tools.py runs it in the cell envs).

The interpreter, PYTHONPATH and whether vllm_compat is installed are the caller's (gpu/device_env_serve.sh): this
file never imports vLLM, vllm-omni or vllm_compat itself, except in the `omni` child and in `stage-config` (each its
own interpreter), and the server inherits the caller's environment plus the variables below.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

PROMPT = "a red cube on a blue table"
SEED = 1234
SIZE = "64x64"
STEPS = 4
TRACEBACK_GRACE_S = 60.0
OFFLINE_MAX_TOKENS = 8  # the served chat's and completion's max_tokens: the texts compare
# The tiny model's widths. The transformer's joint_attention_dim is the text encoder's hidden size; its
# in_channels = 4 * the VAE's z_dim (2x2 latent patches); axes_dims_rope sums to the head dim.
TEXT_HIDDEN = 64
HEAD_DIM = 32
HEADS = 2
LAYERS = 2
Z_DIM = 16

SERVER_ENV = {
    # NVLink multicast stays off (KINDS.md).
    "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
    # vllm-omni's FA backend calls vLLM's _vllm_fa2_C, which is not carried; attention is not under test.
    "DIFFUSION_ATTENTION_BACKEND": "TORCH_SDPA",
    "PYTHONUNBUFFERED": "1", "VLLM_LOGGING_COLOR": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
}


# ------------------------------------------------------------------------------------------------------------------
# The tiny pipeline.
# ------------------------------------------------------------------------------------------------------------------

def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / Qwen2 byte-level alphabet."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs), strict=True))


def _randomize(module, generator) -> None:
    """Every floating parameter from the seed: 2-D+ weights ~ N(0, 1/fan_in), norm scales ~ 1, biases small."""
    import torch

    with torch.no_grad():
        for name, p in sorted(module.named_parameters()):
            if not p.is_floating_point():
                continue
            if p.dim() >= 2:
                fan_in = p[0].numel()
                p.copy_(torch.randn(p.shape, generator=generator) / fan_in**0.5)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=generator))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=generator))


def _write_tokenizer(directory: Path, chat_template: str | None = None):
    """Byte-level BPE with no merges (one token per byte) plus Qwen's chat specials; returns it as loaded back."""
    from transformers import Qwen2Tokenizer

    vocab = {ch: i for i, ch in enumerate(_bytes_to_unicode().values())}
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    for i, sp in enumerate(specials):
        vocab[sp] = 256 + i
    tok = Qwen2Tokenizer(vocab=vocab, merges=[], unk_token=None, bos_token=None, eos_token="<|endoftext|>",
                         pad_token="<|endoftext|>")
    tok.add_special_tokens({"additional_special_tokens": specials[1:]})
    tok.model_max_length = 32768
    if chat_template:
        tok.chat_template = chat_template
    tok.save_pretrained(directory)
    tok = Qwen2Tokenizer.from_pretrained(directory)  # what the server loads
    assert tok("<|im_start|>ab")["input_ids"] == [257, vocab["a"], vocab["b"]], tok("<|im_start|>ab")
    return tok


def _file_digests(root: Path) -> tuple[dict, str]:
    files = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(root.rglob("*")) if p.is_file()}
    return files, hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_llm(root: Path, seed: int = 0) -> dict:
    """A tiny Qwen2 causal LM (2 layers, hidden 64, vocab 320), random weights from ``seed``, bf16 safetensors."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    root.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    tok = _write_tokenizer(root, CHAT_TEMPLATE)
    cfg = Qwen2Config(vocab_size=320, hidden_size=TEXT_HIDDEN, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                      bos_token_id=None, eos_token_id=256, pad_token_id=256, tie_word_embeddings=False,
                      torch_dtype="bfloat16")
    model = Qwen2ForCausalLM(cfg)
    _randomize(model, g)
    model.to(torch.bfloat16).save_pretrained(root, safe_serialization=True)
    files, digest = _file_digests(root)
    return {"dir": str(root), "seed": seed, "files": files, "digest": digest, "tokenizer_len": len(tok),
            "params": sum(p.numel() for p in model.parameters())}


def write_model(root: Path, seed: int = 0) -> dict:
    import torch
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    root.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)

    # Scheduler: Qwen-Image's own config.
    FlowMatchEulerDiscreteScheduler(
        base_image_seq_len=256, base_shift=0.5, invert_sigmas=False, max_image_seq_len=8192, max_shift=0.9,
        num_train_timesteps=1000, shift=1.0, shift_terminal=0.02, stochastic_sampling=False,
        time_shift_type="exponential", use_beta_sigmas=False, use_dynamic_shifting=True,
        use_exponential_sigmas=False, use_karras_sigmas=False,
    ).save_pretrained(root / "scheduler")

    # Tokenizer: byte-level BPE with no merges (one token per byte) plus Qwen's chat specials.
    tok = _write_tokenizer(root / "tokenizer")
    vocab_size = len(tok)

    # Text encoder: Qwen2.5-VL, one text layer (its vision tower is dropped by the pipeline, but built on load).
    te_cfg = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": 320, "hidden_size": TEXT_HIDDEN, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 2048,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]},
            "bos_token_id": None, "eos_token_id": 256, "pad_token_id": 256,
        },
        vision_config={
            "depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": TEXT_HIDDEN,
            "fullatt_block_indexes": [0],
        },
        vocab_size=320, hidden_size=TEXT_HIDDEN, bos_token_id=None, eos_token_id=256, pad_token_id=256,
    )
    assert vocab_size <= 320, vocab_size
    te = Qwen2_5_VLForConditionalGeneration(te_cfg)
    _randomize(te, g)
    te.to(torch.bfloat16).save_pretrained(root / "text_encoder", safe_serialization=True)

    # VAE: the Qwen-Image VAE, narrow (base_dim 16), same z_dim and downsampling (scale factor 8).
    vae = AutoencoderKLQwenImage(base_dim=16, z_dim=Z_DIM, dim_mult=[1, 2, 2, 2], num_res_blocks=1)
    _randomize(vae, g)
    vae.to(torch.bfloat16).save_pretrained(root / "vae", safe_serialization=True)

    # Transformer: diffusers' class for the checkpoint layout; vllm-omni's own class loads it.
    tr = QwenImageTransformer2DModel(
        patch_size=2, in_channels=4 * Z_DIM, out_channels=Z_DIM, num_layers=LAYERS, attention_head_dim=HEAD_DIM,
        num_attention_heads=HEADS, joint_attention_dim=TEXT_HIDDEN, guidance_embeds=False, axes_dims_rope=(8, 12, 12),
    )
    _randomize(tr, g)
    tr.to(torch.bfloat16).save_pretrained(root / "transformer", safe_serialization=True)

    (root / "model_index.json").write_text(json.dumps({
        "_class_name": "QwenImagePipeline", "_diffusers_version": "0.38.0",
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "QwenImageTransformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLQwenImage"],
    }, indent=2))
    files, digest = _file_digests(root)
    return {"dir": str(root), "seed": seed, "files": files, "digest": digest, "tokenizer_len": vocab_size,
            "params": {"text_encoder": sum(p.numel() for p in te.parameters()),
                       "vae": sum(p.numel() for p in vae.parameters()),
                       "transformer": sum(p.numel() for p in tr.parameters())}}


# ------------------------------------------------------------------------------------------------------------------
# The server run.
# ------------------------------------------------------------------------------------------------------------------

def _get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except Exception as e:  # noqa: BLE001 - any failure means "not up yet"
        return -1, f"{type(e).__name__}: {e}"


def _image_record(b64: str) -> dict:
    import numpy as np
    from PIL import Image

    png = base64.b64decode(b64)
    img = Image.open(io.BytesIO(png))
    arr = np.asarray(img.convert("RGB"))
    return {"png_sha256": hashlib.sha256(png).hexdigest(), "pixels_sha256": hashlib.sha256(arr.tobytes()).hexdigest(),
            "shape": list(arr.shape), "mean": float(arr.mean()), "std": float(arr.std()), "png_bytes": len(png)}, png


def finish_record(rec: dict, log_path: Path, out: Path, name: str, t0: float) -> dict:
    """A run's record completed from its log (errors and warnings apart, the tail) and wall time, written to
    ``out/name.json`` and printed without the tail."""
    text = log_path.read_text(errors="replace")
    errors, warnings = classify_log_lines(text.splitlines())
    rec["error_lines"] = errors[-8:]
    rec["warning_lines"] = warnings[-8:]
    rec["log_tail"] = text.splitlines()[-25:]
    rec["wall_s"] = round(time.monotonic() - t0, 1)
    (out / f"{name}.json").write_text(json.dumps(rec, indent=2))
    print(json.dumps({k: v for k, v in rec.items() if k != "log_tail"}, indent=1), flush=True)
    return rec

def serve(name: str, model: Path, out: Path, *, port: int, extra: list[str], startup_timeout: float,
          chat: bool = False) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    log_path = out / f"{name}.log"
    cmd = [sys.executable, "-c",
           "import sys; sys.argv[0] = 'vllm'; from vllm.entrypoints.cli.main import main; sys.exit(main())",
           "serve", str(model), "--omni", "--port", str(port), "--host", "127.0.0.1", *extra]
    env = {**os.environ, **SERVER_ENV}
    rec: dict = {"name": name, "cmd": ["vllm", *cmd[3:]], "pythonpath": env.get("PYTHONPATH", ""),
                 "seed": SEED, "size": SIZE, "steps": STEPS, "prompt": PROMPT}
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd="/tmp", start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    first_tb = None
    try:
        while True:
            if proc.poll() is not None:
                rec.update(started=False, exit_code=proc.returncode, exited_after_s=round(time.monotonic() - t0, 1))
                break
            if _get(base + "/health", 2.0)[0] == 200:
                rec.update(started=True, health_after_s=round(time.monotonic() - t0, 1))
                break
            if time.monotonic() - t0 > startup_timeout:
                rec.update(started=False, startup_timeout_s=startup_timeout)
                break
            # A stage that failed to load can leave the API process waiting: once the log shows a traceback,
            # give it TRACEBACK_GRACE_S more, then record it as not started (the log says where it stopped).
            if first_tb is None and "Traceback (most recent call last)" in log_path.read_text(errors="replace"):
                first_tb = time.monotonic()
            if first_tb is not None and time.monotonic() - first_tb > TRACEBACK_GRACE_S:
                rec.update(started=False, stopped_after_traceback_s=round(time.monotonic() - t0, 1))
                break
            time.sleep(1.0)
        if rec.get("started"):
            status, body = _get(base + "/v1/models")
            rec["models_status"] = status
            model_id = json.loads(body)["data"][0]["id"] if status == 200 else str(model)
            rec["model_id"] = model_id
            from openai import OpenAI

            client = OpenAI(base_url=base + "/v1", api_key="unused", timeout=120, max_retries=0)
            if chat:
                _chat_requests(client, model_id, rec)
            images = []
            for attempt in range(0 if chat else 2):
                t1 = time.monotonic()
                try:
                    resp = client.images.generate(
                        model=model_id, prompt=PROMPT, size=SIZE, n=1, response_format="b64_json",
                        extra_body={"seed": SEED, "num_inference_steps": STEPS},
                    )
                except Exception as e:  # noqa: BLE001 - recorded, the run goes on to the stop
                    rec[f"request{attempt}_error"] = f"{type(e).__name__}: {e}"[:2000]
                    break
                r, png = _image_record(resp.data[0].b64_json)
                r["request_s"] = round(time.monotonic() - t1, 2)
                images.append(r)
                if attempt == 0:
                    (out / f"{name}.png").write_bytes(png)
            if not chat:
                rec["images"] = images
            if len(images) == 2:
                rec["repeat_equal"] = images[0]["pixels_sha256"] == images[1]["pixels_sha256"]
            # SIGINT to the server (the CLI's main process), as Ctrl-C would; time until the whole group is gone.
            t2 = time.monotonic()
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=60)
                rec["sigint_stop_s"] = round(time.monotonic() - t2, 2)
                rec["sigint_exit_code"] = proc.returncode
            except subprocess.TimeoutExpired:
                rec["sigint_stop_s"] = None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        try:  # stage processes left in the group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return finish_record(rec, log_path, out, name, t0)


# The server log's lines (gpu/results/ records, `error_lines`):
#   vLLM's logger         "(APIServer pid=1050) WARNING 12-03 05:46:09 [system_utils.py:299] Found ulimit ..."
#                         ("(Name pid=N) " only in a child process's lines; then LEVEL, date, time, [file:line])
#   a traceback           "Traceback (most recent call last):", indented frames, then "ModuleNotFoundError: No ..."
#   Python's warnings     "/path/x.py:12: FutureWarning: ...", then the source line ("  warnings.warn(")
_PROC = re.compile(r"^\([^()]* pid=\d+\) ")
_LEVEL = re.compile(r"^(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d ")
_EXC_NAME = re.compile(r"\b[A-Za-z_][\w.]*(?:Error|Exception|Warning)\b")
_TB_LAST = re.compile(r"^[A-Za-z_][\w.]*(?:: |:$|$)")


def _error_like(line: str) -> bool:
    """The criterion error_lines always had: an exception's message line or a missing module."""
    return "Error" in line and ("No module named" in line or "Error:" in line)


def classify_log_lines(lines: list[str]) -> tuple[list[str], list[str]]:
    """Split a server log's error-like lines into (errors, warnings), each stripped, in log order.

    A line is looked at only if it meets the criterion error_lines always had (``_error_like``), or it ends a
    traceback with a ``...Warning`` class. Then, after the optional "(Name pid=N) " prefix:
      1. logged at a level (vLLM's logger): WARNING / WARN / INFO / DEBUG is a warning, whatever its text says
         (vLLM 0.24's "Failed to import from vllm._moe_C_stable_libtorch: ModuleNotFoundError(...)" and the ulimit
         notice naming ``OSError``); ERROR / CRITICAL is an error;
      2. the last line of a traceback (the first unindented line after "Traceback (most recent call last):" of the
         same process) is an error, even for a Warning class (a warning raised as an exception stopped something);
      3. any other line is a warning if it comes from Python's warnings module: it holds "warnings.warn(", or the
         first exception-like name on it (``...Error``, ``...Exception``, ``...Warning``) is a ``...Warning``
         ("/x.py:3: UserWarning: ... ValueError: ..."); otherwise it is an error.
    A traceback is always an error, also one a WARNING record printed with ``exc_info`` (its level-less lines
    cannot be told from a crash's); none of the records in gpu/results/ has one.
    """
    errors: list[str] = []
    warnings: list[str] = []
    in_tb: dict[str, bool] = {}  # per process prefix
    for raw in lines:
        text = raw.rstrip("\r\n")
        m = _PROC.match(text)
        proc = m.group(0) if m else ""
        indented = text[len(proc):][:1].isspace()  # a traceback's frames and source lines
        line, body = text.strip(), text[len(proc):].strip()
        lvl = _LEVEL.match(body)
        level = lvl.group(1) if lvl else None
        tb_end = False
        if level is None:
            if body.startswith("Traceback (most recent call last)"):
                in_tb[proc] = True
                continue
            # The exception line ends the traceback: unindented, a dotted name, then ": message" or nothing (the
            # "During handling ..." / "The above exception ..." lines between chained tracebacks do not match).
            if in_tb.get(proc) and not indented and _TB_LAST.match(body):
                in_tb[proc] = False
                tb_end = True
        raised_warning = tb_end and (m_exc := _EXC_NAME.match(body)) is not None and m_exc.group(0).endswith("Warning")
        if not (_error_like(body) or raised_warning):
            continue
        if level is not None:
            (warnings if level in ("DEBUG", "INFO", "WARNING", "WARN") else errors).append(line)
        elif tb_end:
            errors.append(line)
        else:
            first = _EXC_NAME.search(body)
            is_warning = "warnings.warn(" in body or (first is not None and first.group(0).endswith("Warning"))
            (warnings if is_warning else errors).append(line)
    return errors, warnings


def _chat_requests(client, model_id: str, rec: dict) -> None:
    """Two greedy chat completions of the same prompt (the second must equal the first), into ``rec["chats"]``."""
    chats = []
    for attempt in range(2):
        t1 = time.monotonic()
        try:
            resp = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": PROMPT}],
                                                  max_tokens=8, temperature=0.0, seed=SEED)
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on to the stop
            rec[f"request{attempt}_error"] = f"{type(e).__name__}: {e}"[:2000]
            break
        chats.append({"text": resp.choices[0].message.content, "finish_reason": resp.choices[0].finish_reason,
                      "request_s": round(time.monotonic() - t1, 2)})
    rec["chats"] = chats
    if len(chats) == 2:
        rec["repeat_equal"] = chats[0]["text"] == chats[1]["text"]
    try:  # /v1/completions: the second vLLM serving vllm-omni builds on the render serving
        resp = client.completions.create(model=model_id, prompt=PROMPT, max_tokens=8, temperature=0.0, seed=SEED)
        rec["completion"] = {"text": resp.choices[0].text, "finish_reason": resp.choices[0].finish_reason}
    except Exception as e:  # noqa: BLE001 - recorded, the run goes on to the stop
        rec["completion_error"] = f"{type(e).__name__}: {e}"[:2000]


# ------------------------------------------------------------------------------------------------------------------
# The offline API (issue 35): vllm-omni's Omni with one AR stage.
# ------------------------------------------------------------------------------------------------------------------

OMNI_CHILD = """
import json, os, sys, time, traceback
model, stages, result = sys.argv[1], sys.argv[2], sys.argv[3]
rec = {"generations": []}
def dump():
    with open(result, "w") as f:
        json.dump(rec, f, indent=2, default=str)
try:
    t0 = time.monotonic()
    from vllm import SamplingParams
    from vllm_omni.entrypoints.omni import Omni
    import vllm, vllm_omni
    rec["versions"] = {"vllm": vllm.__version__, "vllm_omni": getattr(vllm_omni, "__version__", None)}
    compat = sys.modules.get("vllm_compat")
    if compat is not None:  # this process's decisions (the stage process makes its own, through the same hook)
        rec["vllm_compat"] = {d.name: str(d.action) for d in compat.current_decisions()}
    omni = Omni(model=model, stage_configs_path=stages, stage_init_timeout=240, init_timeout=300)
    rec["init_s"] = round(time.monotonic() - t0, 1)
    dump()
    params = SamplingParams(temperature=0.0, max_tokens=int(os.environ["OFFLINE_MAX_TOKENS"]), seed=int(os.environ["SEED"]))
    for attempt in range(2):
        t1 = time.monotonic()
        outputs = omni.generate([os.environ["PROMPT"]], [params], use_tqdm=False)
        gens = []
        for out in outputs:
            completions = getattr(out, "outputs", None) or getattr(getattr(out, "request_output", None), "outputs", [])
            for c in completions:
                gens.append({"text": c.text, "token_ids": list(c.token_ids), "finish_reason": c.finish_reason})
        rec["generations"].append({"outputs": gens, "request_s": round(time.monotonic() - t1, 2)})
        dump()
    t2 = time.monotonic()
    omni.close()
    rec["close_s"] = round(time.monotonic() - t2, 2)
except BaseException as exc:
    rec["error"] = (type(exc).__name__ + ": " + str(exc))[:2000]
    rec["traceback_tail"] = traceback.format_exc().splitlines()[-12:]
dump()
sys.stdout.flush()
os._exit(0)
"""


def offline(name: str, model: Path, out: Path, *, stages: Path, timeout: float) -> dict:
    """The offline `Omni` AR-stage run in a child interpreter (module docstring, `omni`); returns the record."""
    out.mkdir(parents=True, exist_ok=True)
    log_path, result = out / f"{name}.log", out / f"{name}.child.json"
    result.unlink(missing_ok=True)
    env = {**os.environ, **SERVER_ENV, "PROMPT": PROMPT, "SEED": str(SEED), "OFFLINE_MAX_TOKENS": str(OFFLINE_MAX_TOKENS)}
    rec: dict = {"name": name, "model": str(model), "stage_configs_path": str(stages),
                 "pythonpath": env.get("PYTHONPATH", ""), "prompt": PROMPT, "seed": SEED,
                 "max_tokens": OFFLINE_MAX_TOKENS}
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", OMNI_CHILD, str(model), str(stages), str(result)], stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd="/tmp", start_new_session=True)
    first_tb = None
    try:
        while proc.poll() is None:
            if time.monotonic() - t0 > timeout:
                rec["timeout_s"] = timeout
                break
            # A stage that failed can leave the parent waiting on it: TRACEBACK_GRACE_S after the first traceback.
            if first_tb is None and "Traceback (most recent call last)" in log_path.read_text(errors="replace"):
                first_tb = time.monotonic()
            if first_tb is not None and time.monotonic() - first_tb > TRACEBACK_GRACE_S:
                rec["stopped_after_traceback_s"] = round(time.monotonic() - t0, 1)
                break
            time.sleep(1.0)
        rec["exit_code"] = proc.poll()
    finally:
        try:  # the child and the stage processes it started
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    if result.is_file():
        rec.update(json.loads(result.read_text()))
    gens = [g["outputs"][0]["text"] if g["outputs"] else None for g in rec.get("generations", [])]
    rec["generated"] = len(gens) == 2 and None not in gens and "error" not in rec
    if len(gens) == 2:
        rec["repeat_equal"] = gens[0] == gens[1]
    return finish_record(rec, log_path, out, name, t0)


def stage_config(model: Path, stages: Path) -> dict:
    """What the installed vllm-omni's loader makes of ``stages`` (module docstring, `stage-config`)."""
    import inspect

    from vllm_omni.engine.arg_utils import OmniEngineArgs
    from vllm_omni.engine.stage_init_utils import build_engine_args_dict
    from vllm_omni.entrypoints.utils import filter_dataclass_kwargs, load_and_resolve_stage_configs

    parameters = inspect.signature(load_and_resolve_stage_configs).parameters
    if "stage_configs_path" not in parameters:  # 0.28.0+: deploy configs only
        return {"legacy_stage_configs": False, "loader_parameters": list(parameters)}
    keywords = {"trust_remote_code": False} if "trust_remote_code" in parameters else {}
    _, configs = load_and_resolve_stage_configs(str(model), str(stages), {}, **keywords)[:2]
    rec: dict = {"legacy_stage_configs": True, "stages": len(configs)}
    stage = configs[0]
    rec["stage_type"] = str(getattr(stage, "stage_type", None))
    rec["engine_args"] = {k: (v if isinstance(v, (bool, int, float, str, type(None))) else str(v))
                          for k, v in dict(stage.engine_args).items()}
    # The AR worker class the CUDA omni platform names (CudaOmniPlatform.get_omni_ar_worker_cls); on a machine
    # without CUDA vllm-omni's platform names none.
    if not stage.engine_args.get("worker_cls"):
        stage.engine_args.worker_cls = "vllm_omni.worker.gpu_ar_worker.GPUARWorker"
    args = build_engine_args_dict(stage, str(model))
    kept = filter_dataclass_kwargs(OmniEngineArgs, args)
    rec["dropped_by_omni_engine_args"] = sorted(set(args) - set(kept))
    engine_args = OmniEngineArgs(**kept)
    rec["omni_engine_args"] = {k: getattr(engine_args, k, None) for k in (
        "model_arch", "model_stage", "worker_type", "worker_cls", "scheduler_cls", "async_scheduling",
        "engine_output_type", "enforce_eager", "max_model_len", "gpu_memory_utilization")}
    from importlib import import_module

    module, _, cls = str(engine_args.scheduler_cls).rpartition(".")
    rec["scheduler_mro"] = [c.__name__ for c in getattr(import_module(module), cls).__mro__[:4]]
    try:  # vllm-omni 0.26.0+'s engine reads stage_configs_path as a deploy config too (AsyncOmniEngine.__init__)
        from vllm_omni.config.config_factory import StageConfigFactory
        from vllm_omni.config.stage_config import load_deploy_config
    except ImportError:
        rec["deploy_reads"] = None
    else:
        if not hasattr(StageConfigFactory, "get_pipeline_config"):  # 0.24.0's engine does not read it so
            rec["deploy_reads"] = None
            return rec
        pipeline = StageConfigFactory.get_pipeline_config(model=str(model), trust_remote_code=False,
                                                          deploy_config_path=str(stages))
        rec["deploy_reads"] = {"pipeline_config": None if pipeline is None else type(pipeline).__name__,
                               "deploy_config": type(load_deploy_config(str(stages))).__name__}
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    w = sub.add_parser("write-model")
    w.add_argument("dir", type=Path)
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--json", type=Path)
    wl = sub.add_parser("write-llm")
    wl.add_argument("dir", type=Path)
    wl.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("serve")
    s.add_argument("name")
    s.add_argument("dir", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--port", type=int, default=8091)
    s.add_argument("--startup-timeout", type=float, default=240.0)
    s.add_argument("--chat", action="store_true", help="a chat completion instead of an image (a write-llm model)")
    o = sub.add_parser("omni")
    o.add_argument("name")
    o.add_argument("dir", type=Path)
    o.add_argument("out", type=Path)
    o.add_argument("--stage-configs-path", type=Path, required=True)
    o.add_argument("--timeout", type=float, default=420.0)
    c = sub.add_parser("stage-config")
    c.add_argument("dir", type=Path)
    c.add_argument("stages", type=Path)
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []  # more `vllm serve` arguments, after --
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.what == "write-model":
        t0 = time.monotonic()
        rec = write_model(args.dir, args.seed)
        rec["write_s"] = round(time.monotonic() - t0, 1)
        print(json.dumps(rec, indent=1))
        if args.json:
            args.json.write_text(json.dumps(rec, indent=2))
        return 0
    if args.what == "write-llm":
        print(json.dumps(write_llm(args.dir, args.seed), indent=1))
        return 0
    if args.what == "omni":
        rec = offline(args.name, args.dir, args.out, stages=args.stage_configs_path.resolve(), timeout=args.timeout)
        return 0 if rec["generated"] else 1
    if args.what == "stage-config":
        # One line, after vLLM's and vllm-omni's log lines (they go to stdout too).
        print("STAGE_CONFIG " + json.dumps(stage_config(args.dir, args.stages), default=str))
        return 0
    rec = serve(args.name, args.dir, args.out, port=args.port, extra=extra, startup_timeout=args.startup_timeout,
                chat=args.chat)
    return 0 if rec.get("images") or rec.get("chats") else 1


if __name__ == "__main__":
    sys.exit(main())
