# Source on the GPU machine from the repo root: `source gpu/device_env.sh 24` (or 30).
# Unpacks gpu/.carry/*.tar.xz (built by gpu/prepare.sh) under /tmp/vc once, then puts the repo, vllm-omni
# 0.$1.0 and the shipped site dir (deps + vLLM 0.30.0 pure Python) on PYTHONPATH, ahead of the image's packages.
VC=/tmp/vc
mkdir -p "$VC"
for part in site omni24 omni30; do
    [ -d "$VC/$part" ] || tar -C "$VC" -xJf "gpu/.carry/$part.tar.xz" || return 1
done
export PYTHONPATH="$PWD:$PWD/gpu/platform_plugin:$VC/omni${1:-30}:$VC/site"
# NVLink multicast stays off (KINDS.md); quieter vLLM.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING} PYTHONUNBUFFERED=1
# vllm/platforms/cuda.py imports the compiled vllm._C_stable_libtorch (78 MB, built for torch 2.13) unconditionally;
# the loader path under test is platform-independent, so vLLM is told (its own documented switch) to resolve its
# CPU platform. Tensors and the quant method still run on CUDA.
export VLLM_TARGET_DEVICE=cpu
