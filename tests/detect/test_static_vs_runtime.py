"""Static detection (files) and runtime detection (imports) must agree on the installed vLLM / vllm-omni."""

import pytest

from conftest import needs_vllm, omni_importable_or_absent
from vllm_compat.patches.diffusers_loader.facts import compare_environments, detect_runtime, detect_static


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
        "import sys; from vllm_compat.patches.diffusers_loader.facts import detect_static; env = detect_static(); "
        "print(sorted(m for m in ('torch', 'vllm', 'vllm_omni') if m in sys.modules), env.vllm.level)"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("[] ")


FINALIZE_SHAPES = {
    # source of a finalize: (rendered signature, accepts the loaders' call finalize(model, model_config=None))
    "def f(model, model_config): ...": ("(model, model_config)", True),
    "def f(model, model_config=None): ...": ("(model, model_config=...)", True),
    "def f(model, *, model_config=None, strict=False): ...": ("(model, *, model_config=..., strict=...)", True),
    "def f(model, *, strict, dtype): ...": ("(model, *, strict, dtype)", False),
    "def f(model_config, model, *extra): ...": ("(model_config, model, *extra)", False),
    "def f(*args, **kwargs): ...": ("(*args, **kwargs)", True),
    "def f(model, /, model_config, *, strict=True, **kw): ...": ("(model, model_config, *, strict=..., **kw)", True),
    "def f(model): ...": ("(model)", False),
}


@pytest.mark.parametrize("source", list(FINALIZE_SHAPES))
def test_finalize_params_static_and_live_agree_with_kinds_and_defaults(source):
    """Every parameter is reported (keyword-only ones too, with whether they have a default), the same from the
    file and from the live function, so doctor can say what an incompatible finalize looks like."""
    import ast

    from vllm_compat.detect.model import accepts_call, render_params
    from vllm_compat.detect.runtime import live_params
    from vllm_compat.detect.static import function_params
    from vllm_compat.patches.diffusers_loader.facts import VllmCapabilities

    namespace = {}
    exec(source, namespace)  # noqa: S102 - the test's own one-line function
    static = function_params(ast.parse(source).body[0])
    live = live_params(namespace["f"])
    assert static == live
    rendered, compatible = FINALIZE_SHAPES[source]
    assert render_params(static) == rendered
    assert accepts_call(static, ("model",), ("model_config",)) is compatible
    caps = VllmCapabilities(installed=True, has_uses_meta_device=True, has_layerwise_finalize=True,
                            finalize_params=static)
    assert caps.has_compatible_finalize is compatible
    assert caps.level == ("meta_device_with_finalize" if compatible else "meta_device_without_finalize")


def test_doctor_shows_an_incompatible_finalize_plainly():
    import ast

    from vllm_compat.detect.static import SiteFacts, function_params
    from vllm_compat.patches.diffusers_loader.facts import Environment, LoaderShape, VllmCapabilities
    from vllm_compat.reporting import Report

    params = function_params(ast.parse("def f(model, *, strict, dtype): ...").body[0])
    caps = VllmCapabilities(installed=True, has_uses_meta_device=True, has_layerwise_finalize=True,
                            finalize_params=params)
    env = Environment(source="static", vllm_version="9.9.9", vllm_omni_version=None, torch_version=None,
                      vllm=caps, loader=LoaderShape("absent", "vllm-omni is not installed"))
    env = SiteFacts("static", {"vllm": "9.9.9"}, {"diffusers_loader_meta_device": env})
    table = Report(mode="static", static=env, patches=[], _import_drift=None).render_table()
    assert "layerwise finalize: yes (model, *, strict, dtype) INCOMPATIBLE: does not accept (model, " \
           "model_config=None)" in table
    assert Report(mode="static", static=env, patches=[], _import_drift=None).to_dict()["vllm"]["capabilities"][
        "finalize_signature"] == "(model, *, strict, dtype)"
