"""pytest plugin (entry point ``pytest11``): a report-header line and capability/version markers.

    @pytest.mark.vllm_capability("vllm")             skip unless vLLM is installed
    @pytest.mark.vllm_capability(name)               skip unless a drift point answers yes for ``name`` (the marker's
                                                     help lists them; each is ``DriftPoint.capabilities``)
    @pytest.mark.vllm_version(">=0.19")              skip unless the installed vLLM matches the specifier

Detection is static (files only), so the header costs milliseconds and imports no vLLM.
"""

from __future__ import annotations

import pytest


def capability_names() -> list[str]:
    from .catalogue import CATALOGUE

    return ["vllm", *(name for entry in CATALOGUE for name in entry.point.capability_names)]


def capabilities(facts) -> dict:
    """Every capability's answer from one static detection (``detect.static.SiteFacts``)."""
    from .catalogue import CATALOGUE

    found = {"vllm": facts.versions.get("vllm") is not None}
    for entry in CATALOGUE:
        if entry.id in facts.facts:
            found.update(entry.point.capabilities(facts.facts[entry.id]))
    return found


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "vllm_capability(name): skip unless the installed vLLM has the capability "
                            f"({', '.join(capability_names())})")
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
    facts = detect_static()
    version = facts.versions.get("vllm")
    if capability_marks:
        answers = capabilities(facts)
        for mark in capability_marks:
            name = mark.args[0]
            if name not in answers:
                raise pytest.UsageError(f"unknown vllm_capability {name!r}; known: {', '.join(answers)}")
            if not answers[name]:
                pytest.skip(f"needs vLLM capability {name!r}; the installed vLLM {version or 'absent'} lacks it")
    for mark in version_marks:
        from packaging.specifiers import SpecifierSet

        spec = SpecifierSet(mark.args[0])
        if version is None or not spec.contains(version, prereleases=True):
            pytest.skip(f"needs vLLM {spec}; installed: {version or 'absent'}")
