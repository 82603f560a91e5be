#!/usr/bin/env bash
# Build gpu/.carry/ (git-ignored) for the real-model checks (issue 12; gpu/real_models.py), on the CPU machine.
#
#   vllm26_so.tar.xz  vLLM 0.26.0's compiled kernels for torch 2.11 (the device's torch): _C_stable_libtorch.abi3.so
#                     (79 MB, ~56 MB as xz) plus the small optional ones (_qutlass_C, cumem_allocator, fs_io_C,
#                     spinloop). Carried alone in the first device call (the carry limit is 64 MiB a call).
#   fa3.tar.xz        vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so (153 MB, 8 MB as xz -9): on its CUDA platform vLLM 0.26
#                     imports vllm.vllm_flash_attn on the way to the layerwise loader, and that package raises
#                     ImportError without _vllm_fa2_C or _vllm_fa3_C.
#   site26.tar.xz     cp312 wheels of gpu/deps-e26.txt installed with `pip install --no-deps --target`, plus vLLM
#                     0.26.0's pure-Python tree from $SP26 (no .so, no vllm-rs, no C/CUDA headers) and its dist-info.
#   omni24.tar.xz     vllm-omni 0.24.0 (package + dist-info) from $SP26.
#   omni30src.tar.xz  vllm-omni 0.30.0's diffusers_loader.py and host_weight_plan.py from $SP30 (the in-tree method is
#                     compiled out of them: vllm-omni 0.30.0 does not import on vLLM 0.26).
# Unpacked on the device by gpu/device_env_real.sh. The vLLM / vllm-omni trees come from the repo alone: uv unpacks
# the PyPI wheels vllm==0.26.0 + vllm-omni==0.24.0 and vllm-omni==0.30.0 (no deps, no torch, CPython 3.12 / x86-64)
# into gpu/.serve-build/real{26,30} (git-ignored), unless SP26 / SP30 name site-packages dirs that hold them.
set -euo pipefail
cd "$(dirname "$0")/.."
UVT=(--python-version 3.12 --python-platform x86_64-manylinux_2_39 --only-binary :all: --no-deps --no-compile)
if [ -z "${SP26:-}" ]; then
    SP26=gpu/.serve-build/real26
    [ -d "$SP26/vllm_omni" ] || uv pip install -q "${UVT[@]}" --target "$SP26" vllm==0.26.0 vllm-omni==0.24.0
fi
if [ -z "${SP30:-}" ]; then
    SP30=gpu/.serve-build/real30
    [ -d "$SP30/vllm_omni" ] || uv pip install -q "${UVT[@]}" --target "$SP30" vllm-omni==0.30.0
fi
C=gpu/.carry
PLATFORMS=(--python-version 3.12 --implementation cp --only-binary=:all:)
for n in 1 17 24 27 28 31 34 35; do
    case $n in 1) PLATFORMS+=(--platform manylinux1_x86_64) ;; 17) PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64) ;; *) PLATFORMS+=(--platform manylinux_2_${n}_x86_64) ;; esac
done
grep -q '^vllm-0.26.0.dist-info$' <(ls "$SP26") || { echo "$SP26 has no vLLM 0.26.0" >&2; exit 1; }

mkdir -p "$C/whl26"
rm -rf "$C/build26" && mkdir -p "$C/build26/site26" "$C/build26/omni24" "$C/build26/omni30src/vllm_omni/diffusion/model_loader"

# 1. Dependency wheels (one version each), for CPython 3.12 / x86-64, installed without their dependencies.
grep -v '^#' gpu/deps-e26.txt | grep . | while read -r req; do
    name=$(echo "${req%%==*}" | tr 'A-Z.-' 'a-z__'); version=${req#*==}
    ls "$C/whl26" | tr 'A-Z' 'a-z' | grep -q "^${name}-${version}-" && continue  # already there: keep one wheel
    python3 -m pip download -q --no-deps "${PLATFORMS[@]}" -d "$C/whl26" "$req"
done
python3 -m pip install -q --no-deps --no-compile --target "$C/build26/site26" "${PLATFORMS[@]}" "$C"/whl26/*.whl

# 2. vLLM 0.26.0, pure Python, and (separately) its compiled kernels.
tar -C "$SP26" -cf - --exclude='__pycache__' --exclude='*.so' --exclude='vllm/vllm-rs' \
    --exclude='*.h' --exclude='*.hpp' --exclude='*.cuh' --exclude='*.cu' --exclude='*.inl' \
    vllm vllm-0.26.0.dist-info | tar -C "$C/build26/site26" -xf -
[ -f "$C/vllm26_so.tar.xz" ] && [ -f "$C/fa3.tar.xz" ] && [ -z "${REBUILD_SO:-}" ] || {
tar -C "$SP26" -cf - vllm/_C_stable_libtorch.abi3.so vllm/_qutlass_C.abi3.so vllm/cumem_allocator.abi3.so \
    vllm/fs_io_C.abi3.so vllm/spinloop.abi3.so | xz -T0 -6 > "$C/vllm26_so.tar.xz"
tar -C "$SP26" -cf - vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so | xz -T0 -9 > "$C/fa3.tar.xz"
}  # kernels: rebuilt only when missing or REBUILD_SO=1

# 3. vllm-omni 0.24.0 whole; vllm-omni 0.30.0's two loader files.
tar -C "$SP26" -cf - --exclude='__pycache__' vllm_omni vllm_omni-0.24.0.dist-info | tar -C "$C/build26/omni24" -xf -
cp "$SP30"/vllm_omni/diffusion/model_loader/{diffusers_loader.py,host_weight_plan.py} \
    "$C/build26/omni30src/vllm_omni/diffusion/model_loader/"
cp "$SP30"/vllm_omni-0.30.0.dist-info/METADATA "$C/build26/omni30src/METADATA-vllm_omni-0.30.0"

for part in site26 omni24 omni30src; do
    tar -C "$C/build26" -cf - "$part" | xz -T0 -6 > "$C/$part.tar.xz"
done
rm -rf "$C/build26"
du -ch "$C"/vllm26_so.tar.xz "$C"/fa3.tar.xz "$C"/site26.tar.xz "$C"/omni24.tar.xz "$C"/omni30src.tar.xz
