"""Static detection (files) and runtime detection (imports) must agree on the installed vLLM / vllm-omni."""

import pytest

from conftest import needs_vllm, omni_importable_or_absent
from vllm_compat.detect.runtime import detect_runtime
from vllm_compat.detect.static import detect_static
from vllm_compat.detect.model import compare_environments


@pytest.fixture(scope="module")
def environments():
    return detect_static(), detect_runtime()


@needs_vllm
@omni_importable_or_absent
def test_static_and_runtime_detection_agree(environments):
    static, runtime = environments
    assert compare_environments(static, runtime) == []
    assert static.vllm.level == runtime.vllm.level
    assert (static.vllm_version, static.vllm_omni_version) == (runtime.vllm_version, runtime.vllm_omni_version)


@needs_vllm
def test_finalize_signature_is_the_one_loaders_call():
    static = detect_static()
    if static.vllm.has_layerwise_finalize:
        assert [p.name for p in static.vllm.finalize_params] == ["model", "model_config"]


def test_static_detection_imports_nothing_it_scans():
    from conftest import run_python

    result = run_python(
        "import sys; from vllm_compat.detect.static import detect_static; env = detect_static(); "
        "print(sorted(m for m in ('torch', 'vllm', 'vllm_omni') if m in sys.modules), env.vllm.level)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("[] ")
