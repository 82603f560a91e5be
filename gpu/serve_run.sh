# The device calls of the served checks (issue 24 item 4, issue 35). On the GPU machine, from the repo root (which
# call runs which phase: `python3 gpu/serve_calls.py --phases issue35` on the CPU machine, from what
# gpu/prepare_serve.sh built; the phase names and the parts each needs are gpu/serve_calls.py's PHASES, and a phase
# whose parts are not unpacked yet stops here with the names of those parts):
#   bash gpu/serve_run.sh unpack          a call that only carries slices (gpu/.carry/serve/callN)
#   bash gpu/serve_run.sh bug             (a) vLLM 0.25.1 + vllm-omni 0.24.0, unpatched
#   bash gpu/serve_run.sh native          (b) native 0.24.0, (b') native 0.24.0 --quantization fp8
#   bash gpu/serve_run.sh compat          vllm_compat installed: (c) 0.25.1, (d) 0.25.1 fp8, (d'') 0.25.1 fp8 without the
#                                         loader patch (VLLM_COMPAT_DISABLE_PATCHES); SERVE_COMPAT024=1: (d') 0.24.0 fp8
#   bash gpu/serve_run.sh llm             a tiny Qwen2 LM as one LLM stage (gpu/llm_stage.yaml: without it vllm-omni
#                                         0.24.0 looks a plain LM up as a diffusion model), greedy chat and completion
#                                         requests: native 0.24.0, then vllm_compat on 0.25.1 (gpu/results.md, "LLM
#                                         stage": serve_r5 ran main's bridges, serve_r4 commit 1015f58's first try)
#   bash gpu/serve_run.sh llm_noscheduler the llm phase's vllm_compat run with ar_scheduler_v1_runner left out
#   bash gpu/serve_run.sh llm_sync        the llm phase's vllm_compat run, the stage's async scheduling off
#   bash gpu/serve_run.sh llm_v1          the llm phase's vllm_compat run, VLLM_USE_V2_MODEL_RUNNER=0 (not run: the
#                                         scheduler patch, measured in serve_r5, is the bridge)
#   bash gpu/serve_run.sh diag            DIAGNOSTIC: vllm_compat + gpu/serve_diag_reuse_port.py, 0.25.1 and 0.25.1 fp8
#                                         (DIAG_ONLY_NOLOADER=1: 0.25.1 fp8 with the loader patch left out, only)
#   Issue 35 (vLLM 0.26.0 + vllm-omni 0.26.0, the native pair; the offline Omni API):
#   bash gpu/serve_run.sh llm026          the llm phase's model and stage config on vLLM 0.26.0 + vllm-omni 0.26.0:
#                                         native (llm_native026), then vllm_compat (llm_compat026)
#   bash gpu/serve_run.sh llm026_async    native, the stage on vllm-omni's async AR scheduler class
#                                         (gpu/llm_stage_async.yaml): llm_native026_async
#   bash gpu/serve_run.sh llm026_noec     vllm_compat with omni_output_ec_transfer_params left out: llm_compat026_noec
#   bash gpu/serve_run.sh omni026         the offline Omni API, the same AR stage, greedy generate twice: native
#                                         (omni_native026), then vllm_compat (omni_compat026)
#   bash gpu/serve_run.sh omni0251        the same offline run: native 0.24.0 (omni_native024), then vllm_compat on
#                                         vLLM 0.25.1 + vllm-omni 0.24.0 (omni_compat0251)
#   bash gpu/serve_run.sh omni0251_noscheduler   omni_compat0251 with ar_scheduler_v1_runner left out
#   bash gpu/serve_run.sh image026        the tiny Qwen-Image served on 0.26.0 + 0.26.0: native (image_native026),
#                                         then vllm_compat (image_compat026); pixels and PNG bytes compared
# Each phase writes $OUT/serve_<run>.json after each run, $OUT/serve_<phase>_logs.tar.gz (server logs, PNGs,
# records; renewed after each run) and $OUT/serve_<phase>.json (every run's record, the image comparisons and the texts
# of every run on this machine so far, grouped by equal text). The tiny models are written once per machine
# (deterministic: the same files from the same seed, digest in the record).
set -uo pipefail
cd "$(dirname "$0")/.."
source gpu/device_env_serve.sh || exit 1
phase=${1:-unpack}
[ "$phase" = unpack ] && exit 0
parts=$(python3 gpu/serve_calls.py needs "$phase") || exit 2  # an unknown phase: the list of phases is printed
for part in $parts; do
    [ -e "$VCS/$part.done" ] || { echo "serve_run: phase $phase needs part $part, not unpacked on this machine yet:" \
        "make the earlier calls of \`python3 gpu/serve_calls.py\` first (same machine, back to back)" >&2; exit 1; }
done
W=$VCS/out/$phase
rm -rf "$W" && mkdir -p "$W"
MODEL=$VCS/tiny-qwen-image
START=$(date +%s)
serve_env 024
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, torch.cuda.get_device_name())'
[ -f "$MODEL/model_index.json" ] || python3 gpu/serve_check.py write-model "$MODEL" --json $VCS/model.json > /dev/null || exit 1
cp $VCS/model.json "$W/model.json"
decisions() {  # what vllm_compat decided in an interpreter that imported vllm-omni's serving chain (vLLM $1)
    serve_env "$1"
    (cd /tmp && python3 -c "
import vllm_omni.entrypoints.cli.main, vllm_omni.entrypoints.openai.api_server, vllm, vllm_compat
import vllm_omni.diffusion.model_loader.diffusers_loader  # the loader patch decides when its module loads
import vllm_omni.core.sched.omni_ar_scheduler, vllm_omni.core.sched.omni_generation_scheduler  # the scheduler patches
import vllm_omni.outputs, vllm_omni.entrypoints.async_omni  # ec_transfer_params, session_id
print('vllm', vllm.__version__)
for d in vllm_compat.current_decisions():
    print(d.name, d.action, getattr(d, 'variant', ''), (d.reason or '')[:160], sep=' | ')
" > "$W/decisions_$1.txt" 2>&1)
    grep -v -E "WARNING|INFO" "$W/decisions_$1.txt" | tail -40
}
run() {  # name vllm-tag port [serve args...]; SERVE_CHAT=1: the tiny LM and a chat request
    local name=$1 tag=$2 port=$3; shift 3
    serve_env "$tag"
    echo "=== $name (vLLM $tag) $(date -u +%T)"
    if [ -n "${SERVE_CHAT:-}" ]; then
        python3 gpu/serve_check.py serve "$name" "$LLM" "$W" --port "$port" --startup-timeout 180 --chat -- \
            --stage-configs-path "${SERVE_STAGES:-$PWD/gpu/llm_stage.yaml}" "$@"
    else
        python3 gpu/serve_check.py serve "$name" "$MODEL" "$W" --port "$port" --startup-timeout 180 -- --enforce-eager "$@"
    fi
    # What is done so far comes back even if a later run outlasts the call.
    cp "$W/$name.json" "$OUT/serve_$name.json"
    tar -C $VCS/out -czf "$OUT/serve_${phase}_logs.tar.gz" "$phase"
}
offline() {  # name vllm-tag: the offline Omni API with one AR stage (gpu/llm_stage.yaml, or SERVE_STAGES)
    local name=$1 tag=$2
    serve_env "$tag"
    echo "=== $name (vLLM $tag, offline Omni) $(date -u +%T)"
    # 270 s each: two offline runs and the unpacking fit one 600 s call even if both hang (a stage init took 130-145 s
    # in the served runs; a failure with a traceback is cut 60 s after it).
    python3 gpu/serve_check.py omni "$name" "$LLM" "$W" --timeout 270 \
        --stage-configs-path "${SERVE_STAGES:-$PWD/gpu/llm_stage.yaml}"
    cp "$W/$name.json" "$OUT/serve_$name.json"
    tar -C $VCS/out -czf "$OUT/serve_${phase}_logs.tar.gz" "$phase"
}
llm_model() {  # the llm phases' tiny LM (written once per machine) and their switch
    LLM=$VCS/tiny-qwen2-lm
    # vLLM's sampler imports flashinfer for top-k / top-p on CUDA unless told not to; the carried deps have none
    # (measured: both pairs stopped there). vLLM's own switch, the same for both.
    export VLLM_USE_FLASHINFER_SAMPLER=0
    [ -f "$LLM/config.json" ] || python3 gpu/serve_check.py write-llm "$LLM" > "$OUT/llm_model.json" || exit 1
}
if [ "$phase" = bug ]; then
    compat_uninstall 2>/dev/null
    run bug0251 0251 8101
elif [ "$phase" = native ]; then
    compat_uninstall 2>/dev/null
    run native024 024 8102
    run native024_fp8 024 8103 --quantization fp8
elif [ "$phase" = compat ]; then
    compat_install || { echo "compat_install failed"; exit 1; }
    python3 -m pip show vllm-compat 2>/dev/null | head -2
    decisions 0251
    run compat0251 0251 8104
    run compat0251_fp8 0251 8105 --quantization fp8
    # The seed's failure class through the server: the serving bridges on, the loader patch left out.
    VLLM_COMPAT_DISABLE_PATCHES=diffusers_loader_meta_device run compat0251_fp8_noloader 0251 8109 --quantization fp8
    [ -n "${SERVE_COMPAT024:-}" ] && run compat024_fp8 024 8106 --quantization fp8
    compat_uninstall
elif [ "$phase" = llm ]; then
    llm_model
    compat_uninstall 2>/dev/null
    SERVE_CHAT=1 run llm_native024 024 8111
    compat_install || { echo "compat_install failed"; exit 1; }
    SERVE_CHAT=1 run llm_compat0251 0251 8112
    compat_uninstall
elif [ "$phase" = llm_noscheduler ]; then  # the llm phase's vllm_compat run with ar_scheduler_v1_runner left out
    llm_model
    compat_install || { echo "compat_install failed"; exit 1; }
    VLLM_COMPAT_DISABLE_PATCHES=ar_scheduler_v1_runner SERVE_CHAT=1 run llm_compat0251_noscheduler 0251 8115
    compat_uninstall
elif [ "$phase" = llm_sync ]; then  # the llm phase's vllm_compat run once more, the stage without async scheduling
    llm_model
    sed 's/^      enforce_eager: true$/      enforce_eager: true\n      async_scheduling: false/' gpu/llm_stage.yaml > $VCS/llm_stage_sync.yaml
    grep -q "async_scheduling: false" $VCS/llm_stage_sync.yaml || exit 1
    compat_install || { echo "compat_install failed"; exit 1; }
    SERVE_CHAT=1 SERVE_STAGES=$VCS/llm_stage_sync.yaml run llm_compat0251_sync 0251 8113
    compat_uninstall
elif [ "$phase" = llm_v1 ]; then  # the llm phase's vllm_compat run once more, vLLM's V1 model runner by default
    # vLLM 0.25 made Model Runner V2 the default for dense models; vllm-omni 0.24.0's AR worker forces its V1 runner
    # but the scheduler follows the config (skipping V1's all_token_ids bookkeeping): the KeyError of llm's run?
    llm_model
    export VLLM_USE_V2_MODEL_RUNNER=0
    compat_install || { echo "compat_install failed"; exit 1; }
    SERVE_CHAT=1 run llm_compat0251_v1 0251 8114
    compat_uninstall
elif [ "$phase" = llm026 ]; then  # issue 35 part 1, the server: native 0.26.0 + 0.26.0, then vllm_compat
    llm_model
    compat_uninstall 2>/dev/null
    SERVE_CHAT=1 run llm_native026 026 8121
    compat_install || { echo "compat_install failed"; exit 1; }
    decisions 026
    SERVE_CHAT=1 run llm_compat026 026 8122
    compat_uninstall
elif [ "$phase" = llm026_async ]; then  # native, the stage on vllm-omni's async AR scheduler class
    llm_model
    compat_uninstall 2>/dev/null
    SERVE_CHAT=1 SERVE_STAGES=$PWD/gpu/llm_stage_async.yaml run llm_native026_async 026 8123
elif [ "$phase" = llm026_noec ]; then  # vllm_compat without the ec_transfer_params stand-in: the completion's claim
    llm_model
    compat_install || { echo "compat_install failed"; exit 1; }
    VLLM_COMPAT_DISABLE_PATCHES=omni_output_ec_transfer_params SERVE_CHAT=1 run llm_compat026_noec 026 8124
    compat_uninstall
elif [ "$phase" = omni026 ]; then  # issue 35 part 1, the offline API: native 0.26.0 + 0.26.0, then vllm_compat
    llm_model
    compat_uninstall 2>/dev/null
    offline omni_native026 026
    compat_install || { echo "compat_install failed"; exit 1; }
    offline omni_compat026 026
    compat_uninstall
elif [ "$phase" = omni0251 ]; then  # issue 35 part 2: native 0.24.0, then vllm_compat on 0.25.1 + vllm-omni 0.24.0
    llm_model
    compat_uninstall 2>/dev/null
    offline omni_native024 024
    compat_install || { echo "compat_install failed"; exit 1; }
    offline omni_compat0251 0251
    compat_uninstall
elif [ "$phase" = omni0251_noscheduler ]; then  # omni0251's vllm_compat run with ar_scheduler_v1_runner left out
    llm_model
    compat_install || { echo "compat_install failed"; exit 1; }
    VLLM_COMPAT_DISABLE_PATCHES=ar_scheduler_v1_runner offline omni_compat0251_noscheduler 0251
    compat_uninstall
elif [ "$phase" = image026 ]; then  # issue 35 part 3: the tiny Qwen-Image on 0.26.0 + 0.26.0, native then vllm_compat
    compat_uninstall 2>/dev/null
    run image_native026 026 8125
    compat_install || { echo "compat_install failed"; exit 1; }
    run image_compat026 026 8126
    compat_uninstall
elif [ "$phase" = diag ]; then  # DIAGNOSTIC (gpu/serve_diag_reuse_port.py): past the setup_server stop, what next?
    compat_install || { echo "compat_install failed"; exit 1; }
    SP=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    mkdir -p "$VCS/diag" && cp gpu/serve_diag_reuse_port.py "$VCS/diag/"
    echo "import sys; sys.path.append('$VCS/diag'); import serve_diag_reuse_port" > "$SP/serve_diag_reuse_port.pth"
    decisions 0251
    if [ -n "${DIAG_ONLY_NOLOADER:-}" ]; then  # the second diag call: only the loader-patch-off FP8 run
        VLLM_COMPAT_DISABLE_PATCHES=diffusers_loader_meta_device run diag0251_fp8_noloader 0251 8110 --quantization fp8
    else
        run diag0251 0251 8107
        run diag0251_fp8 0251 8108 --quantization fp8
    fi
    rm -f "$SP/serve_diag_reuse_port.pth"
    compat_uninstall
fi
python3 - "$W" "$phase" "$OUT" "$START" <<'EOF'
import io, json, sys, time
from pathlib import Path
import numpy as np
from PIL import Image
w, phase, out, start = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
def records(folder):  # a run's record; the model's and the offline child's own files left out
    return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))
            if p.stem != "model" and not p.stem.endswith(".child")}
recs = records(w)
summary = {"phase": phase, "model": json.loads((w / "model.json").read_text()), "runs": recs,
           "phase_wall_s": round(time.time() - start, 1)}
# Image comparisons against every image of this machine so far (earlier phases kept under $VCS/out): the decoded
# pixels and the PNG bytes (each record's png_sha256).
everything = {k: v for d in sorted(w.parent.iterdir()) if d.is_dir() for k, v in records(d).items()}
pngs = {p.stem: p for p in sorted(w.parent.glob("*/*.png"))}
png_sha = {k: (r.get("images") or [{}])[0].get("png_sha256") for k, r in everything.items()}
arrs = {k: np.asarray(Image.open(p).convert("RGB")).astype(np.int16) for k, p in pngs.items()}
cmp = {}
for a in arrs:
    for b in arrs:
        if a < b:
            d = np.abs(arrs[a] - arrs[b])
            cmp[f"{a} vs {b}"] = {"equal": bool((d == 0).all()), "max_abs": int(d.max()), "mean_abs": float(d.mean()),
                                  "png_equal": png_sha.get(a) is not None and png_sha.get(a) == png_sha.get(b)}
summary["image_comparisons"] = cmp
# The texts of every run on this machine so far (served chat and completion, offline generate), grouped by text.
texts = {}
for k, r in everything.items():
    for i, c in enumerate(r.get("chats") or []):
        texts[f"{k}.chat{i}"] = c["text"]
    if r.get("completion"):
        texts[f"{k}.completion"] = r["completion"]["text"]
    for i, g in enumerate(r.get("generations") or []):
        if g.get("outputs"):
            texts[f"{k}.offline{i}"] = g["outputs"][0]["text"]
groups = {}
for k, t in texts.items():
    groups.setdefault(t, []).append(k)
summary["texts"] = texts
summary["equal_texts"] = [{"text": t, "runs": ks} for t, ks in groups.items()]
(out / f"serve_{phase}.json").write_text(json.dumps(summary, indent=2))
keys = ("started", "exit_code", "health_after_s", "init_s", "generated", "repeat_equal", "sigint_stop_s", "error",
        "error_lines")
print(json.dumps({k: {kk: v.get(kk) for kk in keys if kk in v} for k, v in recs.items()}, indent=1))
print(json.dumps(cmp, indent=1))
print(json.dumps(summary["equal_texts"], indent=1))
EOF
tar -C $VCS/out -czf "$OUT/serve_${phase}_logs.tar.gz" "$phase"
