#!/usr/bin/env bash
# Build, from the repo alone, everything the served checks (issue 24 item 4: gpu/serve_check.py; issue 35: vLLM 0.26.0
# + vllm-omni 0.26.0 and the offline Omni API) need on the GPU machine, and pack it into device-call-sized folders under
# gpu/.carry/serve/ (git-ignored).
#
# Nothing here installs torch: the GPU image has torch 2.11.0+cu130, torchvision 0.26 and torchaudio 2.11, the
# versions vLLM 0.24.0, 0.25.1 and 0.26.0 pin. uv unpacks, for CPython 3.12 on x86-64 glibc 2.39 (the image), without
# dependencies and without a Python 3.12 here, one set per vLLM of SERVE_SETS:
#   026    vllm==0.26.0 + vllm-omni==0.26.0 (the native pair of issue 35)     into $B/{v026,omni026}
#   0251   vllm==0.25.1 + vllm-omni==0.24.0                                    into $B/{v0251,omni024}
#   024    vllm==0.24.0 + vllm-omni==0.24.0                                    into $B/{v024,omni024}
# and the serving dependencies the image lacks: gpu/deps-serve-common.txt (every set) and gpu/deps-serve-vVER.txt
# (the one to three that differ per vLLM), into $B/deps{,024,0251,026}.
# Parts (tar.xz), unpacked on the device under /tmp/vcs by gpu/device_env_serve.sh:
#   deps        the common dependencies
#   py024       vLLM 0.24.0's pure-Python tree + dist-info (no .so, no vllm-rs, no C/CUDA sources) + its own deps
#               (whole, compiled files included: pack_py below)
#   so024       vLLM 0.24.0's compiled kernels for torch 2.11: _C_stable_libtorch (111 MB) and the small ones
#               (spinloop, _qutlass_C, cumem_allocator, _rust_tool_parser, deep_gemm's cp312 _C); left out: FA2
#               (191 MB: vllm-omni's attention runs on TORCH_SDPA here), _moe_C, flashmla (not on an image's path)
#   fa3_024     vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so (153 MB): vLLM's CUDA platform imports
#               vllm.vllm_flash_attn, which raises ImportError without FA2 or FA3
#   py0251, so0251, fa3_0251, py026, so026, fa3_026   the same for vLLM 0.25.1 and 0.26.0
#   omni024, omni026   vllm-omni 0.24.0 / 0.26.0 + dist-info
# The set parts: SET_026 = so026 py026 deps fa3_026 omni026, SET_0251 = so0251 py0251 deps fa3_0251 omni024,
# SET_024 = so024 py024 deps fa3_024 omni024 (gpu/serve_calls.py has the same).
# xz level $XZ_LEVEL (default 1: this machine's two shared cores; -6 took ~4x as long for ~15 % less).
# Knobs (environment):
#   SERVE_SETS   (default "026 0251 024") the sets to build and carry, in carry order: the first set's parts come
#                first (issue 35's 0.26.0 phases run while the later sets are still being carried). SERVE_SETS=026
#                builds the 0.26.0 set alone (~90 MiB of parts; `SERVE_PHASES=llm026,image026,omni026` then).
#   SERVE_PHASES (default issue35) the phases gpu/serve_calls.py plans the calls for: a named list of its RERUNS
#                (issue35, issue35_all, issue24) or comma-separated phase names.
#   CALL_MB   (default 52) the most MiB of slices in one call folder gpu/.carry/serve/callN/. The device tool carries
#             64 MiB a call, the working tree included: tracked files plus untracked files git does not ignore
#             (`git ls-files -z | xargs -0 du -cb`: 3.4 MiB at 6051031, 8.7 MiB on 2026-12-06 with peer/). 52 leaves
#             ~3.3 MiB beside that tree; 56 left -0.6 MiB there, 4.6 MiB at 6051031. gpu/serve_calls.py, run at the end, measures the tree again and fails (exit 1) if a call would
#             leave less than MARGIN_MB (default 2) MiB.
#   SLICE_MB  (default 16) each part is cut into slices of at most this many MiB (at most CALL_MB); slices well
#             under CALL_MB let first fit fill each call folder close to CALL_MB.
#   XZ_LEVEL  (default 1, above); REUSE_PARTS=1: keep the parts built last time, only re-slice (seconds);
#   SERVE_BUILD (default gpu/.serve-build, git-ignored, ~1.8 GB for 0251 + 024, ~0.8 GB more for 026): where the
#             wheels are unpacked and the parts built.
# gpu/.carry/serve/MANIFEST lists part, slice count, sha256 and bytes; gpu/.carry/serve/calls.txt the folders in call
# order with their slices. Which call completes which part follows from those two files and nothing else:
# `python3 gpu/serve_calls.py --phases issue35` prints the device calls (one `run` per folder, back to back on one warm
# machine, `carry` = [gpu/.carry/serve/callN], command `bash gpu/serve_run.sh PHASE`, PHASE the next one whose parts
# are complete by then, else `unpack`; then the phases left, with no carry). gpu/device_env_serve.sh (sourced by
# serve_run.sh) keeps the slices under /tmp and unpacks a part when all its slices are there.
set -euo pipefail
# uv copies files out of its cache instead of hard-linking them: a hard-linked file is shared with every other install
# from the same cache, whose linking changes the file's ctime while tar reads it (2026-12-06: `tar:
# ./openai_harmony/openai_harmony.abi3.so: file changed as we read it`, the build stopped after 103 s).
export UV_LINK_MODE=copy
PURE=(--exclude='__pycache__' --exclude='*.so' --exclude='vllm/vllm-rs' --exclude='*.h' --exclude='*.hpp'
      --exclude='*.cuh' --exclude='*.cu' --exclude='*.inl')
# pack_py VTREE VER DEPS OUT: the part pyTAG, an uncompressed tar at OUT: vLLM VER's pure-Python tree from VTREE
# (PURE: no .so, no vllm-rs, no C/CUDA sources) and, appended in a second tar run, every file of DEPS (the set's own
# dependencies, compiled ones included) but __pycache__ and ./bin. GNU tar applies an --exclude to every member of the
# run, so one run with PURE would strip DEPS's .so files too (2026-12-06: apache-tvm-ffi's libtvm_ffi.so went missing
# from py026, whose copy of tvm_ffi precedes the deps part on PYTHONPATH: `import xgrammar` failed on the device).
# tests/gpu/test_serve_pack.py sources this file for it.
pack_py() {
    local vtree=$1 ver=$2 deps=$3 out=$4
    tar -cf "$out" "${PURE[@]}" -C "$vtree" vllm "vllm-$ver.dist-info"
    tar -rf "$out" --exclude='__pycache__' --exclude='./bin' -C "$deps" .
}
! (return 0 2> /dev/null) || return 0  # sourced (`source gpu/prepare_serve.sh`): the lines above only
cd "$(dirname "$0")/.."
B=$(realpath -m "${SERVE_BUILD:-gpu/.serve-build}")
C=gpu/.carry/serve
SLICE_MB=${SLICE_MB:-16}
CALL_MB=${CALL_MB:-52}
SETS=${SERVE_SETS:-026 0251 024}
[ "$SLICE_MB" -le "$CALL_MB" ] || { echo "prepare_serve: SLICE_MB ($SLICE_MB) must not exceed CALL_MB ($CALL_MB)" >&2; exit 1; }
PLAT=(--python-version 3.12 --python-platform x86_64-manylinux_2_39 --only-binary :all: --no-deps --no-compile)
mkdir -p "$B"
ver_of() { case $1 in 024) echo 0.24.0 ;; 0251) echo 0.25.1 ;; 026) echo 0.26.0 ;;
                      *) echo "prepare_serve: no set $1 (SERVE_SETS: 026 0251 024)" >&2; return 1 ;; esac; }
omni_of() { case $1 in 026) echo 026 ;; *) echo 024 ;; esac; }  # the vllm-omni each set carries
PARTS=()  # the parts in carry order: each set's, the first set first
for tag in $SETS; do
    ver_of "$tag" > /dev/null || exit 1
    for part in "so$tag" "py$tag" deps "fa3_$tag" "omni$(omni_of "$tag")"; do
        [[ " ${PARTS[*]} " == *" $part "* ]] || PARTS+=("$part")
    done
done

# 1. vLLM and vllm-omni wheels, unpacked (kept between runs: delete $B to rebuild).
for tag in $SETS; do
    o=$(omni_of "$tag")
    for spec in "v$tag:vllm==$(ver_of "$tag")" "omni$o:vllm-omni==$(ver_of "$o")"; do
        d=$B/${spec%%:*}
        [ -d "$d" ] || uv pip install -q "${PLAT[@]}" --target "$d" "${spec#*:}"
    done
done
P=$B/parts
have_parts() { for part in "${PARTS[@]}"; do [ -f "$P/$part.tar.xz" ] || return 1; done; }
if [ -z "${REUSE_PARTS:-}" ] || ! have_parts; then  # REUSE_PARTS=1: only re-slice the parts built last time
# 2. Dependencies, from the deps files (always reinstalled: cheap from uv's cache).
rm -rf "$B/deps"
uv pip install -q "${PLAT[@]}" --target "$B/deps" -r gpu/deps-serve-common.txt
for tag in $SETS; do
    rm -rf "$B/deps$tag"
    uv pip install -q "${PLAT[@]}" --target "$B/deps$tag" -r "gpu/deps-serve-v$(ver_of "$tag").txt"
done

# 3. Parts.
rm -rf "$P" && mkdir -p "$P"
xzpart() { xz -T0 "-${XZ_LEVEL:-1}" > "$P/$1.tar.xz"; }
tar -C "$B/deps" -cf - --exclude='__pycache__' --exclude='./bin' . | xzpart deps
for tag in $SETS; do
    ver=$(ver_of "$tag")
    pack_py "$B/v$tag" "$ver" "$B/deps$tag" "$P/py$tag.tar"
    xzpart "py$tag" < "$P/py$tag.tar" && rm "$P/py$tag.tar"
    (cd "$B/v$tag" && tar -cf - vllm/_C_stable_libtorch.abi3.so vllm/spinloop.abi3.so vllm/_qutlass_C.abi3.so \
        vllm/cumem_allocator.abi3.so vllm/_rust_tool_parser.abi3.so \
        vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so) | xzpart "so$tag"
    (cd "$B/v$tag" && tar -cf - vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so) | xzpart "fa3_$tag"
done
for part in "${PARTS[@]}"; do
    case $part in omni*)
        ver=$(ver_of "${part#omni}")
        tar -C "$B/$part" -cf - --exclude='__pycache__' vllm_omni "vllm_omni-$ver.dist-info" | xzpart "$part" ;;
    esac
done
fi

# 4. Slices, manifest, call folders.
rm -rf "$C" && mkdir -p "$C"
S=$B/slices
rm -rf "$S" && mkdir -p "$S"
: > "$C/MANIFEST"
for part in "${PARTS[@]}"; do
    split -b "${SLICE_MB}M" -d -a 2 "$P/$part.tar.xz" "$S/$part.tar.xz."
    n=$(ls "$S" | grep -c "^$part\.tar\.xz\.")
    echo "$part $n $(sha256sum < "$P/$part.tar.xz" | cut -d' ' -f1) $(stat -c %s "$P/$part.tar.xz")" >> "$C/MANIFEST"
done
# First fit over every call folder opened so far, parts in PARTS order: the first set of SERVE_SETS is complete first,
# the last set's kernels come last (in which call depends on the knobs: gpu/serve_calls.py says).
python3 gpu/serve_calls.py pack "$S" "$C" "$CALL_MB" "${PARTS[@]}"  # its first_fit
for d in "$C"/call[0-9]*; do cp "$C/MANIFEST" "$d/"; done  # every call carries the manifest with its slices
for d in "$C"/call[0-9]*; do echo "$d $(du -sm "$d" | cut -f1) MiB: $(ls "$d" | tr '\n' ' ')"; done | sort -V | tee "$C/calls.txt"
cut -d' ' -f1,2,4 "$C/MANIFEST"
# The device calls these folders make (and the check that each fits beside the working tree).
python3 gpu/serve_calls.py --dir "$C" --phases "${SERVE_PHASES:-issue35}" | tee "$C/device_calls.txt"
