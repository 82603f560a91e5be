#!/usr/bin/env bash
# Build gpu/.carry/ (git-ignored) on the CPU machine: everything the GPU image lacks for the loader path.
#
#   site.tar.xz   cp312 wheels of gpu/deps-e30.txt installed with `pip install --no-deps --target`
#                 (the GPU image's own packages are left alone), plus vLLM 0.30.0's pure-Python tree from
#                 $E30 (no compiled .so extensions, no vllm-rs binary, no C/CUDA headers) and its dist-info.
#   omni24.tar.xz vllm-omni 0.24.0 (package + dist-info) from $E24.
#   omni30.tar.xz vllm-omni 0.30.0 (package + dist-info) from $E30.
#
# vllm_compat and the tests travel with the working tree. Unpacked on the device by gpu/device_env.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
E24=${E24:-/work/envs/e24}
E30=${E30:-/work/envs/e30}
SP24=$(echo "$E24"/lib/python3.*/site-packages)
SP30=$(echo "$E30"/lib/python3.*/site-packages)
C=gpu/.carry
PLATFORMS=(--python-version 3.12 --implementation cp --only-binary=:all:)
for n in 1 17 24 27 28 31 34 35; do
    case $n in 1) PLATFORMS+=(--platform manylinux1_x86_64) ;; 17) PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64) ;; *) PLATFORMS+=(--platform manylinux_2_${n}_x86_64) ;; esac
done

mkdir -p "$C/whl"
rm -rf "$C/build" && mkdir -p "$C/build/site" "$C/build/omni24" "$C/build/omni30"

# 1. Dependency wheels (one version each), installed for CPython 3.12 / x86-64 without their dependencies.
grep -v '^#' gpu/deps-e30.txt | grep . | while read -r req; do
    name=$(echo "${req%%==*}" | tr 'A-Z.-' 'a-z__'); version=${req#*==}
    ls "$C/whl" | tr 'A-Z' 'a-z' | grep -q "^${name}-${version}-" && continue  # already there: keep one wheel
    python3 -m pip download -q --no-deps "${PLATFORMS[@]}" -d "$C/whl" "$req"
done
python3 -m pip install -q --no-deps --no-compile --target "$C/build/site" "${PLATFORMS[@]}" "$C"/whl/*.whl

# 2. vLLM 0.30.0, pure Python only.
tar -C "$SP30" -cf - --exclude='__pycache__' --exclude='*.so' --exclude='vllm/vllm-rs' \
    --exclude='*.h' --exclude='*.hpp' --exclude='*.cuh' --exclude='*.cu' --exclude='*.inl' \
    vllm vllm-0.30.0.dist-info | tar -C "$C/build/site" -xf -

# 3. vllm-omni 0.24.0 and 0.30.0.
tar -C "$SP24" -cf - --exclude='__pycache__' vllm_omni vllm_omni-0.24.0.dist-info | tar -C "$C/build/omni24" -xf -
tar -C "$SP30" -cf - --exclude='__pycache__' vllm_omni vllm_omni-0.30.0.dist-info | tar -C "$C/build/omni30" -xf -

for part in site omni24 omni30; do
    tar -C "$C/build" -cf - "$part" | xz -T0 -6 > "$C/$part.tar.xz"
done
rm -rf "$C/build"
du -ch "$C"/*.tar.xz
