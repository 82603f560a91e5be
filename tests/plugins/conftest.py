"""The plugins' releases are read once per CI run: in the one cell whose matrix/vllm.toml row says
``plugin_tests = true`` (it fetches what is not cached, ``releases.FETCH``), not again in every cell (they read release
files, not the cell's installed vLLM). Outside a cell (a developer's ``pytest``) they run on what is cached."""

from __future__ import annotations

import os

import pytest

from tests.plugins.releases import fetching


def pytest_collection_modifyitems(config, items):
    if not os.environ.get("VLLM_COMPAT_CELL") or fetching():
        return
    skip = pytest.mark.skip(reason="the plugins' releases are read in the one cell with plugin_tests = true "
                                   "(matrix/vllm.toml), not in every cell")
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)
