"""pytest plugin (entry point ``pytest11``): a report-header line and capability/version markers.

    @pytest.mark.vllm_capability("meta_device")      skip unless vLLM can create meta params
    @pytest.mark.vllm_capability("layerwise_finalize")
    @pytest.mark.vllm_version(">=0.19")              skip unless the installed vLLM matches the specifier

Detection is static (files only), so the header costs milliseconds and imports no vLLM.
"""

from __future__ import annotations

import pytest

CAPABILITIES = {
    "meta_device": lambda caps: caps.has_uses_meta_device,
    "layerwise_finalize": lambda caps: caps.has_compatible_finalize,
    "vllm": lambda caps: caps.installed,
}


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "vllm_capability(name): skip unless the installed vLLM has the capability "
                            f"({', '.join(CAPABILITIES)})")
    config.addinivalue_line("markers", "vllm_version(spec): skip unless the installed vLLM version matches spec")


def pytest_report_header(config) -> str:
    from . import report

    try:
        return report().header_line()
    except Exception as exc:  # noqa: BLE001 - a header must never break a test run
        return f"vllm-compat: report unavailable ({type(exc).__name__}: {exc})"


def pytest_runtest_setup(item) -> None:
    from .detect.static import detect_static

    capability_marks = list(item.iter_markers("vllm_capability"))
    version_marks = list(item.iter_markers("vllm_version"))
    if not capability_marks and not version_marks:
        return
    env = detect_static()
    for mark in capability_marks:
        name = mark.args[0]
        if name not in CAPABILITIES:
            raise pytest.UsageError(f"unknown vllm_capability {name!r}; known: {', '.join(CAPABILITIES)}")
        if not CAPABILITIES[name](env.vllm):
            pytest.skip(f"needs vLLM capability {name!r}; installed vLLM {env.vllm_version or 'absent'} "
                        f"is at level {env.vllm.level}")
    for mark in version_marks:
        from packaging.specifiers import SpecifierSet

        spec = SpecifierSet(mark.args[0])
        if env.vllm_version is None or not spec.contains(env.vllm_version, prereleases=True):
            pytest.skip(f"needs vLLM {spec}; installed: {env.vllm_version or 'absent'}")
