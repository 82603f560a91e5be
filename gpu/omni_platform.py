"""A vllm-omni platform plugin (group ``vllm_omni.platform_plugins``, declared by gpu/platform_plugin/) that
selects vllm-omni's own ``UnspecifiedOmniPlatform``.

Why: on a GPU, vllm-omni's built-in CUDA platform imports ``vllm.platforms.cuda``, which imports the compiled
``vllm._C_stable_libtorch`` (built for torch 2.13; the GPU image has torch 2.11 and we carry no vLLM .so).
Out-of-tree platform plugins win over built-in ones, so this picks the same platform vllm-omni uses on a
machine without a GPU; the loader method under test does not consult the platform. No vLLM or vllm-omni
code is replaced.
"""


def unspecified_platform() -> str:
    return "vllm_omni.platforms.interface.UnspecifiedOmniPlatform"
