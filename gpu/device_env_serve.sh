# Source on the GPU machine from the repo root: `source gpu/device_env_serve.sh` (the served checks, issue 24 item 4
# and issue 35). Keeps the slices that this call carried (gpu/.carry/serve/callN/, built by gpu/prepare_serve.sh) under
# /tmp/vcs/slices, and unpacks every part whose slices are all there, once, checking its sha256 against MANIFEST:
#   deps -> /tmp/vcs/deps; py024, so024, fa3_024 -> /tmp/vcs/py024; py0251, so0251, fa3_0251 -> /tmp/vcs/py0251;
#   py026, so026, fa3_026 -> /tmp/vcs/py026; omni024 -> /tmp/vcs/omni024; omni026 -> /tmp/vcs/omni026.
# Then defines:
#   serve_env 024|0251|026   PYTHONPATH = that vLLM (+ its kernels and own deps), its vllm-omni (0.26.0 for 026,
#                        0.24.0 otherwise), the common deps.
#                        The repo root is NOT on it: its vllm_compat.egg-info would hand vLLM vllm_compat's plugin
#                        entry point, so a "native" run would not be native.
#   compat_install       installs vllm_compat as a user does: `pip install` of this tree (no deps, no index) into
#                        the image's own site-packages, so its vllm_compat_startup.pth runs in every interpreter,
#                        the stage processes included, and its vllm.general_plugins entry point is seen.
#   compat_uninstall     removes it again (the image is shared by every run of the call).
# The image's torch 2.11.0+cu130 / torchvision / torchaudio are used as they are. NVLink multicast stays off.
VCS=${VCS:-/tmp/vcs}
mkdir -p "$VCS/slices"
for d in gpu/.carry/serve/call*; do
    [ -d "$d" ] && cp -n "$d"/* "$VCS/slices/" 2>/dev/null
done
[ -f "$VCS/slices/MANIFEST" ] || { echo "device_env_serve: no MANIFEST carried" >&2; return 1; }
_vcs_dest() { case $1 in deps) echo deps ;; omni*) echo "$1" ;; *0251) echo py0251 ;; *026) echo py026 ;;
                          *024) echo py024 ;; esac; }
while read -r part n sha size; do
    [ -e "$VCS/$part.done" ] && continue
    have=$(ls "$VCS/slices" | grep -c "^$part\.tar\.xz\.[0-9][0-9]$")
    [ "$have" -eq "$n" ] || { echo "device_env_serve: $part has $have of $n slices (later call)"; continue; }
    got=$(cat "$VCS/slices/$part".tar.xz.?? | sha256sum | cut -d' ' -f1)
    [ "$got" = "$sha" ] || { echo "device_env_serve: $part sha256 mismatch" >&2; return 1; }
    mkdir -p "$VCS/$(_vcs_dest "$part")"
    cat "$VCS/slices/$part".tar.xz.?? | xz -d -T0 | tar -C "$VCS/$(_vcs_dest "$part")" -xf - || return 1
    rm -f "$VCS/slices/$part".tar.xz.??
    touch "$VCS/$part.done"
    echo "device_env_serve: unpacked $part ($size bytes xz)"
done < "$VCS/slices/MANIFEST"

serve_env() {
    local omni=omni024
    [ "$1" = 026 ] && omni=omni026
    export PYTHONPATH="$VCS/py$1:$VCS/$omni:$VCS/deps"
}
compat_install() {
    python3 -m pip install -q --no-deps --no-index --no-build-isolation --no-cache-dir --disable-pip-version-check \
        --root-user-action=ignore . >/dev/null || return 1
    local sp
    sp=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    ls "$sp"/vllm_compat_startup.pth "$sp"/vllm_compat-*.dist-info/entry_points.txt >/dev/null || return 1
}
compat_uninstall() {
    python3 -m pip uninstall -q -y --root-user-action=ignore vllm-compat >/dev/null
}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
unset VLLM_TARGET_DEVICE
