# Source on the GPU machine from the repo root: `source gpu/device_env_real.sh` (real-model checks, issue 12).
# Unpacks what gpu/prepare_real.sh built under /tmp/vc (each part once; a part whose tarball did not travel in this
# call is skipped, so the 54 MB kernel tarball can travel alone in an earlier call on the same machine) and puts the
# repo, vllm-omni 0.24.0 and site26 (deps + vLLM 0.26.0, its compiled kernels included) on PYTHONPATH.
# vLLM resolves its real CUDA platform: no VLLM_TARGET_DEVICE, no platform plugin.
VC=/tmp/vc
mkdir -p "$VC"
for part in site26 omni24 omni30src; do
    if [ ! -e "$VC/$part.done" ] && [ -f "gpu/.carry/$part.tar.xz" ]; then
        tar -C "$VC" -xJf "gpu/.carry/$part.tar.xz" && touch "$VC/$part.done" || return 1
    fi
done
for part in vllm26_so fa3; do  # compiled vLLM kernels, kept apart until site26 is there
    if [ ! -e "$VC/$part.done" ] && [ -f "gpu/.carry/$part.tar.xz" ]; then
        mkdir -p "$VC/so26" && tar -C "$VC/so26" -xJf "gpu/.carry/$part.tar.xz" && touch "$VC/$part.done" || return 1
    fi
done
if [ -d "$VC/site26/vllm" ] && [ -d "$VC/so26/vllm" ]; then
    cp -r --update=none "$VC"/so26/vllm/. "$VC/site26/vllm/"
fi
export PYTHONPATH="$PWD:$VC/omni24:$VC/site26"
export OMNI30_DIR="$VC/omni30src"
# NVLink multicast stays off (KINDS.md); quieter vLLM.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_LOGGING_LEVEL=${VLLM_LOGGING_LEVEL:-WARNING} PYTHONUNBUFFERED=1
unset VLLM_TARGET_DEVICE
