"""vllm_compat.pytest_plugin (entry point ``pytest11``): the header line and the vllm_capability /
vllm_version markers, run in throwaway pytest sessions through ``pytester``."""

from __future__ import annotations

import pytest

from conftest import VLLM_VERSION
from vllm_compat.detect.static import detect_static
from vllm_compat.patches.diffusers_loader.facts import detect_static as detect_loader_facts

pytest_plugins = ["pytester"]

STATIC = detect_static()
LOADER = detect_loader_facts()  # the loader drift point's facts: the vLLM capabilities the markers ask about


def test_plugin_is_loaded_by_its_entry_point_and_prints_the_header(pytester):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"vllm-compat: vllm {VLLM_VERSION or 'absent'}, vllm-omni * (*vLLM level "
                                 f"{LOADER.vllm.level}, loader *"])


def test_plugin_can_be_disabled(pytester):
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("-p", "no:vllm_compat")
    result.assert_outcomes(passed=1)
    assert "vllm-compat:" not in result.stdout.str()


def test_markers_are_registered(pytester):
    result = pytester.runpytest("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.vllm_capability(name):*meta_device*",
                                 "@pytest.mark.vllm_version(spec):*"])


def _expect(condition) -> str:
    return "passed" if condition else "skipped"


@pytest.mark.parametrize("capability", ["vllm", "meta_device", "layerwise_finalize"])
def test_capability_marker_follows_static_detection(pytester, capability):
    pytester.makepyfile(
        f"""
        import pytest

        @pytest.mark.vllm_capability({capability!r})
        def test_needs_it():
            pass
        """
    )
    result = pytester.runpytest("--strict-markers", "-rs")
    have = {"vllm": LOADER.vllm.installed, "meta_device": LOADER.vllm.has_uses_meta_device,
            "layerwise_finalize": LOADER.vllm.has_compatible_finalize}[capability]
    result.assert_outcomes(**{_expect(have): 1})
    if not have:
        result.stdout.fnmatch_lines([f"*needs vLLM capability {capability!r}; the installed vLLM * lacks it*"])


def test_unknown_capability_is_a_usage_error(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.vllm_capability("time_travel")
        def test_typo():
            pass
        """
    )
    result = pytester.runpytest()
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*unknown vllm_capability 'time_travel'*"])


def test_version_marker(pytester):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.vllm_version(">=0.0.1")
        def test_any_vllm():
            pass

        @pytest.mark.vllm_version("<0.0.1")
        def test_no_real_vllm():
            pass

        @pytest.mark.vllm_version(">=0.0.1")
        @pytest.mark.vllm_capability("vllm")
        def test_both_marks():
            pass
        """
    )
    result = pytester.runpytest("--strict-markers", "-rs")
    if VLLM_VERSION is None:
        result.assert_outcomes(skipped=3)
        result.stdout.fnmatch_lines(["*needs vLLM*installed: absent*"])
    else:
        result.assert_outcomes(passed=2, skipped=1)
        result.stdout.fnmatch_lines([f"*needs vLLM <0.0.1; installed: {VLLM_VERSION}*"])


def test_unmarked_tests_never_run_detection(pytester, monkeypatch):
    """Only marked tests pay for detection (the hook returns before detect_static)."""
    import vllm_compat.detect.static as static

    calls = []
    installed = static.StaticSite.installed
    monkeypatch.setattr(static, "detect_static", lambda: calls.append(1) or STATIC)
    monkeypatch.setattr(static.StaticSite, "installed", classmethod(lambda cls: calls.append(1) or installed()))
    pytester.makepyfile("def test_plain():\n    pass\n\ndef test_plain_too():\n    pass\n")
    pytester.runpytest().assert_outcomes(passed=2)
    assert calls == [1]  # the report header's one detection; none for the two unmarked tests


def test_header_falls_back_when_the_report_fails(pytester):
    pytester.makeconftest(
        """
        import vllm_compat.reporting as report_module

        def broken(*args, **kwargs):
            raise RuntimeError("boom")

        report_module.build_report = broken
        """
    )
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["vllm-compat: report unavailable (*"])


def test_header_after_the_report_submodule_was_imported(pytester):
    # Regression: the module used to be named like the function, and importing it shadowed vllm_compat.report.
    pytester.makeconftest("import vllm_compat.reporting\n")
    pytester.makepyfile("def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess()
    result.stdout.fnmatch_lines(["vllm-compat: vllm *"])
