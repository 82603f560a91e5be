#!/usr/bin/env bash
# Build, from the repo alone, everything the served Qwen-Image check (issue 24 item 4; gpu/serve_check.py) needs on
# the GPU machine, and pack it into device-call-sized folders under gpu/.carry/serve/ (git-ignored).
#
# Nothing here installs torch: the GPU image has torch 2.11.0+cu130, torchvision 0.26 and torchaudio 2.11, the
# versions vLLM 0.24.0 and 0.25.1 pin. uv unpacks, for CPython 3.12 on x86-64 glibc 2.39 (the image), without
# dependencies and without a Python 3.12 here:
#   - vllm==0.24.0, vllm==0.25.1, vllm-omni==0.24.0 (PyPI wheels), into $B/{v024,v0251,omni024};
#   - the serving dependencies the image lacks: gpu/deps-serve-common.txt (both pairs) and
#     gpu/deps-serve-v0.24.0.txt / -v0.25.1.txt (the one or two that differ), into $B/deps{,024,0251}.
# Parts (tar.xz), unpacked on the device under /tmp/vcs by gpu/device_env_serve.sh:
#   deps        the common dependencies
#   py024       vLLM 0.24.0's pure-Python tree + dist-info + its own deps  (no .so, no vllm-rs, no C/CUDA sources)
#   py0251      the same for vLLM 0.25.1
#   omni024     vllm-omni 0.24.0 + dist-info
#   so024       vLLM 0.24.0's compiled kernels for torch 2.11: _C_stable_libtorch (111 MB) and the small ones
#               (spinloop, _qutlass_C, cumem_allocator, _rust_tool_parser, deep_gemm's cp312 _C); left out: FA2
#               (191 MB: vllm-omni's attention runs on TORCH_SDPA here), _moe_C, flashmla (not on an image's path)
#   fa3_024     vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so (153 MB): vLLM's CUDA platform imports
#               vllm.vllm_flash_attn, which raises ImportError without FA2 or FA3
#   so0251, fa3_0251   the same for vLLM 0.25.1
# xz level $XZ_LEVEL (default 1: this machine's two shared cores; -6 took ~4x as long for ~15 % less).
# Size knobs (environment):
#   CALL_MB   (default 56) the most MiB of slices in one call folder gpu/.carry/serve/callN/. The device tool carries
#             64 MiB a call, the working tree included: tracked files plus untracked files git does not ignore
#             (`git ls-files -z | xargs -0 du -cb`: 3.4 MiB at 6051031). 56 leaves ~4.6 MiB; the old 60 left
#             0.6 MiB. gpu/serve_calls.py, run at the end, measures the tree again and fails (exit 1) if a call would
#             leave less than MARGIN_MB (default 2) MiB.
#   SLICE_MB  (default 16) each part is cut into slices of at most this many MiB (at most CALL_MB); slices well
#             under CALL_MB let first fit fill each call folder close to CALL_MB.
#   XZ_LEVEL  (default 1, above); REUSE_PARTS=1: keep the parts built last time, only re-slice (seconds);
#   SERVE_BUILD (default gpu/.serve-build, git-ignored, ~1.8 GB): where the wheels are unpacked and the parts built.
# gpu/.carry/serve/MANIFEST lists part, slice count, sha256 and bytes; gpu/.carry/serve/calls.txt the folders in call
# order with their slices. Which call completes which part follows from those two files and nothing else:
# `python3 gpu/serve_calls.py` prints the device calls (one `run` per folder, back to back on one warm machine,
# `carry` = [gpu/.carry/serve/callN], command `bash gpu/serve_run.sh PHASE`, PHASE the next one whose parts are
# complete by then, else `unpack`; then the phases left, with no carry). gpu/device_env_serve.sh (sourced by
# serve_run.sh) keeps the slices under /tmp and unpacks a part when all its slices are there.
set -euo pipefail
cd "$(dirname "$0")/.."
B=$(realpath -m "${SERVE_BUILD:-gpu/.serve-build}")
C=gpu/.carry/serve
SLICE_MB=${SLICE_MB:-16}
CALL_MB=${CALL_MB:-56}
[ "$SLICE_MB" -le "$CALL_MB" ] || { echo "prepare_serve: SLICE_MB ($SLICE_MB) must not exceed CALL_MB ($CALL_MB)" >&2; exit 1; }
PLAT=(--python-version 3.12 --python-platform x86_64-manylinux_2_39 --only-binary :all: --no-deps --no-compile)
mkdir -p "$B"

# 1. vLLM and vllm-omni wheels, unpacked (kept between runs: delete $B to rebuild).
for spec in v024:vllm==0.24.0 v0251:vllm==0.25.1 omni024:vllm-omni==0.24.0; do
    d=$B/${spec%%:*}
    [ -d "$d" ] || uv pip install -q "${PLAT[@]}" --target "$d" "${spec#*:}"
done
P=$B/parts
if [ -z "${REUSE_PARTS:-}" ] || [ ! -f "$P/py024.tar.xz" ]; then  # REUSE_PARTS=1: only re-slice the parts built last time
# 2. Dependencies, from the deps files (always reinstalled: cheap from uv's cache).
rm -rf "$B/deps" "$B/deps024" "$B/deps0251"
uv pip install -q "${PLAT[@]}" --target "$B/deps" -r gpu/deps-serve-common.txt
uv pip install -q "${PLAT[@]}" --target "$B/deps024" -r gpu/deps-serve-v0.24.0.txt
uv pip install -q "${PLAT[@]}" --target "$B/deps0251" -r gpu/deps-serve-v0.25.1.txt

# 3. Parts.
rm -rf "$P" && mkdir -p "$P"
PURE=(--exclude='__pycache__' --exclude='*.so' --exclude='vllm/vllm-rs' --exclude='*.h' --exclude='*.hpp'
      --exclude='*.cuh' --exclude='*.cu' --exclude='*.inl')
xzpart() { xz -T0 "-${XZ_LEVEL:-1}" > "$P/$1.tar.xz"; }
tar -C "$B/deps" -cf - --exclude='__pycache__' --exclude='./bin' . | xzpart deps
for v in 024:0.24.0 0251:0.25.1; do
    tag=${v%%:*}; ver=${v#*:}
    tar -cf - "${PURE[@]}" -C "$B/v$tag" vllm "vllm-$ver.dist-info" -C "$B/deps$tag" --exclude='./bin' . | xzpart "py$tag"
    (cd "$B/v$tag" && tar -cf - vllm/_C_stable_libtorch.abi3.so vllm/spinloop.abi3.so vllm/_qutlass_C.abi3.so \
        vllm/cumem_allocator.abi3.so vllm/_rust_tool_parser.abi3.so \
        vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so) | xzpart "so$tag"
    (cd "$B/v$tag" && tar -cf - vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so) | xzpart "fa3_$tag"
done
tar -C "$B/omni024" -cf - --exclude='__pycache__' vllm_omni vllm_omni-0.24.0.dist-info | xzpart omni024
fi

# 4. Slices, manifest, call folders.
rm -rf "$C" && mkdir -p "$C"
S=$B/slices
rm -rf "$S" && mkdir -p "$S"
: > "$C/MANIFEST"
for part in so0251 py0251 deps fa3_0251 omni024 fa3_024 py024 so024; do
    split -b "${SLICE_MB}M" -d -a 2 "$P/$part.tar.xz" "$S/$part.tar.xz."
    n=$(ls "$S" | grep -c "^$part\.tar\.xz\.")
    echo "$part $n $(sha256sum < "$P/$part.tar.xz" | cut -d' ' -f1) $(stat -c %s "$P/$part.tar.xz")" >> "$C/MANIFEST"
done
# First fit over every call folder opened so far, parts in this order: the vLLM 0.25.1 set (+ deps, vllm-omni) is
# complete first, the 0.24.0 kernels come last (in which call depends on the knobs: gpu/serve_calls.py says).
python3 - "$C" "$S" "$CALL_MB" <<'PY'
import shutil, sys
from pathlib import Path
c, s, limit = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) * 1024 * 1024
calls: list[int] = []
order = ["so0251", "py0251", "deps", "fa3_0251", "omni024", "fa3_024", "py024", "so024"]
for part in order:
    for f in sorted(s.glob(part + ".tar.xz.*")):
        size = f.stat().st_size
        i = next((i for i, used in enumerate(calls) if used + size <= limit), None)
        if i is None:
            calls.append(0)
            i = len(calls) - 1
        calls[i] += size
        (c / f"call{i + 1}").mkdir(exist_ok=True)
        shutil.move(str(f), c / f"call{i + 1}" / f.name)
PY
for d in "$C"/call[0-9]*; do cp "$C/MANIFEST" "$d/"; done  # every call carries the manifest with its slices
for d in "$C"/call[0-9]*; do echo "$d $(du -sm "$d" | cut -f1) MiB: $(ls "$d" | tr '\n' ' ')"; done | sort -V | tee "$C/calls.txt"
cut -d' ' -f1,2,4 "$C/MANIFEST"
# The device calls these folders make (and the check that each fits beside the working tree).
python3 gpu/serve_calls.py --dir "$C" | tee "$C/device_calls.txt"
