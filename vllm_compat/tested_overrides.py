"""The resolver overrides the matrix cells install with (``overrides``, ``breakage_overrides`` and
``index_overrides`` in matrix/vllm.toml), as data for ``dependency_drift`` and ``resolution``: a suggested
override (a conflict's, a file clash's, a missing pin's) is "tested" when a cell of the same pair installs with
exactly that line. Generated from
matrix/vllm.toml; tests/test_dependency_drift.py fails, printing the new text, when the two differ. Keys:
(host, host version, plugin, plugin version); values: {cell id: (line, ...)}.
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
