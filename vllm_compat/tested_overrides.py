"""The resolver overrides the matrix cells install with (``overrides``, ``breakage_overrides`` and
``index_overrides`` in matrix/vllm.toml), as data for ``dependency_drift`` and ``resolution``: a suggested
override (a conflict's, a file clash's, a missing pin's) is "tested" when a cell of the same pair installs with
exactly that line. Generated from
matrix/vllm.toml; tests/test_dependency_drift.py fails, printing the new text, when the two differ. Keys:
(host, host version, plugin, plugin version); values: {cell id: (line, ...)}. ``TESTED_REASONS``: the reason a
cell gives for each ``breakage_overrides`` / ``index_overrides`` line (the first cell of the pair that has the line),
which ``check --overrides`` writes beside it.
"""

TESTED_OVERRIDES: dict[tuple[str, str, str, str], dict[str, tuple[str, ...]]] = {
    ('vllm', '0.32.0', 'vllm-omni', '0.28.0'): {'v0.32-omni0.28': ('transformers==5.19.0',)},
    ('vllm', '0.32.0', 'vllm-omni', '0.30.0'): {'v0.32-omni0.30': ('transformers==5.19.0',), 'v0.32-omni0.30-serve': ('transformers==5.19.0', 'cuda-python==13.4.4')},
    ('vllm', '0.33.0', 'vllm-omni', '0.24.0'): {'v0.33-omni0.24-serve': ('cuda-python==13.4.4',)},
    ('vllm', '0.33.0', 'vllm-omni', '0.28.0'): {'v0.33-omni0.28': ('transformers==5.20.2',)},
    ('vllm', '0.33.0', 'vllm-omni', '0.30.0'): {'v0.33-omni0.30': ('transformers==5.20.2',), 'v0.33-omni0.30-serve': ('transformers==5.20.2', 'cuda-python==13.4.4')},
    ('vllm', '0.34.0', 'vllm-omni', '0.24.0'): {'v0.34-omni0.24': ('huggingface-hub==2.4.0', 'flashinfer-python==0.7.4'), 'v0.34-omni0.24-serve': ('huggingface-hub==2.4.0', 'cuda-python==13.4.4', 'flashinfer-python==0.7.4')},
    ('vllm', '0.34.0', 'vllm-omni', '0.26.0'): {'v0.34-omni0.26': ('huggingface-hub==2.4.0', 'flashinfer-python==0.7.4')},
    ('vllm', '0.34.0', 'vllm-omni', '0.28.0'): {'v0.34-omni0.28': ('transformers==5.22.2', 'huggingface-hub==2.4.0', 'flashinfer-python==0.7.4')},
    ('vllm', '0.34.0', 'vllm-omni', '0.30.0'): {'v0.34-omni0.30': ('transformers==5.22.2', 'huggingface-hub==2.4.0', 'flashinfer-python==0.7.4'), 'v0.34-omni0.30-serve': ('transformers==5.22.2', 'huggingface-hub==2.4.0', 'cuda-python==13.4.4', 'flashinfer-python==0.7.4')},
}

TESTED_REASONS: dict[tuple[str, str, str, str], dict[str, str]] = {
    ('vllm', '0.32.0', 'vllm-omni', '0.30.0'): {'cuda-python==13.4.4': "found by check's resolution (issue 33 part 2), not by a failure: on 2026-12-05 `vllm-compat check vllm==0.32.0 vllm-omni==0.30.0` resolved cuda-python 12.6.2.post1 beside cuda-bindings 13.5.0 (28 shared files, 25 differ), the pair that broke the 0.33 serve cells one install in two; with 13.4.4 the re-resolution has no clash"},
    ('vllm', '0.33.0', 'vllm-omni', '0.24.0'): {'cuda-python==13.4.4': "vLLM's pinned CUDA torch: the resolver picks cuda-python 12.6.2.post1 (an old monolithic wheel) beside cuda-bindings 13.5.0; both install 28 cuda/bindings files and the one written last wins (nvidia_cutlass_dsl failed at import in one of two installs); 13.4.4 shares none (measured 2026-12-04; vllm_compat/known_clashes.py, tests/test_installed_env.py)"},
    ('vllm', '0.33.0', 'vllm-omni', '0.30.0'): {'cuda-python==13.4.4': "vLLM's pinned CUDA torch: the resolver picks cuda-python 12.6.2.post1 (an old monolithic wheel) beside cuda-bindings 13.5.0; both install 28 cuda/bindings files and the one written last wins (nvidia_cutlass_dsl failed at import in one of two installs); 13.4.4 shares none (measured 2026-12-04; vllm_compat/known_clashes.py, tests/test_installed_env.py)"},
    ('vllm', '0.34.0', 'vllm-omni', '0.24.0'): {'flashinfer-python==0.7.4': "vLLM 0.34.0 pins flashinfer-python==0.7.3, missing from this machine's index (0.7.4 is there); never imported on a CPU cell", 'cuda-python==13.4.4': "vLLM's pinned CUDA torch: the resolver picks cuda-python 12.6.2.post1 (an old monolithic wheel) beside cuda-bindings 13.5.0; both install 28 cuda/bindings files and the one written last wins (nvidia_cutlass_dsl failed at import in one of two installs); 13.4.4 shares none (measured 2026-12-04; vllm_compat/known_clashes.py, tests/test_installed_env.py)"},
    ('vllm', '0.34.0', 'vllm-omni', '0.26.0'): {'flashinfer-python==0.7.4': "vLLM 0.34.0 pins flashinfer-python==0.7.3, missing from this machine's index (0.7.4 is there); never imported on a CPU cell"},
    ('vllm', '0.34.0', 'vllm-omni', '0.28.0'): {'flashinfer-python==0.7.4': "vLLM 0.34.0 pins flashinfer-python==0.7.3, missing from this machine's index (0.7.4 is there); never imported on a CPU cell"},
    ('vllm', '0.34.0', 'vllm-omni', '0.30.0'): {'flashinfer-python==0.7.4': "vLLM 0.34.0 pins flashinfer-python==0.7.3, missing from this machine's index (0.7.4 is there); never imported on a CPU cell", 'cuda-python==13.4.4': "vLLM's pinned CUDA torch: the resolver picks cuda-python 12.6.2.post1 (an old monolithic wheel) beside cuda-bindings 13.5.0; both install 28 cuda/bindings files and the one written last wins (nvidia_cutlass_dsl failed at import in one of two installs); 13.4.4 shares none (measured 2026-12-04; vllm_compat/known_clashes.py, tests/test_installed_env.py)"},
}
