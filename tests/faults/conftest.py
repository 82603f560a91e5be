"""Fixtures of the fault suite: the online-quant double, the resolved loader deps, the in-tree reference."""

from __future__ import annotations

import importlib

import pytest

from . import _support


@pytest.fixture(scope="session")
def oq():
    pytest.importorskip("vllm", reason="vLLM is not installed in this env")
    return importlib.import_module("tests.support.online_quant")


@pytest.fixture(scope="session")
def deps(oq):
    """What the hook would resolve on this vLLM (finalize where it is compatible)."""
    from vllm_compat.patches.diffusers_loader import resolve_deps

    return resolve_deps()


@pytest.fixture(scope="session")
def reference(oq):
    """vllm-omni 0.30.0's real gated method as ``fn(loader, model, target_device)``."""
    source, origin = _support.reference_source()
    if source is None:
        pytest.skip(origin)
    if not oq.HAS_FINALIZE:
        pytest.skip("the in-tree reference imports finalize_layerwise_processing, which this vLLM lacks")
    fn = _support.compile_reference(source)
    fn.origin = origin
    return fn


@pytest.fixture(scope="session")
def legacy_reference(oq):
    """vllm-omni <= 0.24.0's real legacy method, where the installed vllm-omni has it."""
    source, origin = _support.reference_source("legacy")
    if source is None:
        pytest.skip(origin)
    return _support.compile_reference(source)
