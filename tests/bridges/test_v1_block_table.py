"""The ``vllm.v1.worker.block_table`` module stand-in on the real wheels: vllm-omni 0.28.0 / 0.30.0's paged
diffusion KV module dies on vLLM 0.34 without it (the real ImportError, reproduced first), imports with it and gets
vLLM's own moved ``get_block_table_width`` (the value re-derived here from vLLM 0.33's formula), revert takes out
exactly it, and vLLM <= 0.33 keeps its own module."""

from __future__ import annotations

import json
import math

import pytest

from conftest import needs_startup_hook, needs_vllm, run_python
from tests.bridges import module_stand_in_cases as cases
from vllm_compat.bridges import HostKind
from vllm_compat.bridges import v1_block_table as bridge
from vllm_compat.detect.static import StaticSite

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
needs_missing_module = pytest.mark.skipif(
    STATIC.host != HostKind.LACKS or not STATIC.importers,
    reason=f"needs vLLM >= 0.34 (no {POINT.old_module}) with a vllm-omni that imports it (0.28.0 / 0.30.0); here: "
    f"vLLM {STATIC.host} it, importers {list(STATIC.importers) or 'none'}")
needs_vllm_module = pytest.mark.skipif(
    STATIC.host != HostKind.DEFINES, reason=f"needs a vLLM that ships {POINT.old_module} (<= 0.33); here: {STATIC.host}")
IMPORT_ERROR = "cannot import name 'block_table' from 'vllm.v1.worker'"
IMPORTER = "vllm_omni.diffusion.diffusion_kv.model_runner_backend"


def _width_033(max_num_blocks, block_size, token_alignment=128):
    """vLLM 0.33's get_block_table_width, re-derived (not imported): the width rounded up to whole token_alignment
    tokens' worth of blocks."""
    step = token_alignment // math.gcd(token_alignment, block_size)
    return -(-max_num_blocks // step) * step


@pytest.mark.parametrize(("facts", "action"), cases.DECISION_CASES, ids=cases.DECISION_IDS)
def test_decision_table(facts, action):
    cases.check_decision(POINT, facts, action)


@needs_vllm
def test_static_and_runtime_facts_agree():
    cases.check_static_and_runtime_agree(POINT, STATIC)


@needs_missing_module
def test_unpatched_diffusion_kv_module_fails_with_the_real_import_error():
    """With the stand-in disabled (the other bridges on), vllm-omni's paged diffusion KV module, which its
    diffusion worker, engine and stage process import, dies on the removed module."""
    assert IMPORT_ERROR in cases.unpatched_import_error(f"import {IMPORTER}", POINT.id)


@needs_missing_module
@needs_startup_hook
def test_vllm_omni_imports_with_the_stand_in_and_revert_removes_it():
    result = run_python(f"""
        import json, sys
        import {IMPORTER} as backend
        import vllm_compat
        from vllm.v1 import kv_cache_interface
        worker = sys.modules["vllm.v1.worker"]
        module = backend.native_block_table
        out = dict(
            same=module is sys.modules["vllm.v1.worker.block_table"] is worker.block_table,
            mark=module._vllm_compat_installed,
            vllms_own=module.get_block_table_width is kv_cache_interface.get_block_table_width,
            widths=[module.get_block_table_width(n, b) for n, b in [(100, 16), (1, 16), (8, 16), (9, 16), (5, 256),
                                                                     (33, 48)]],
            decision=[d.action for d in vllm_compat.current_decisions() if d.name == "{POINT.id}"],
        )
        try:
            module.BlockTable
        except AttributeError as exc:
            out["left_out"] = str(exc)
        vllm_compat.revert()
        out["reverted"] = [getattr(worker, "block_table", None) is None, "vllm.v1.worker.block_table" in sys.modules]
        vllm_compat.apply()
        out["back"] = sys.modules.get("vllm.v1.worker.block_table") is module and worker.block_table is module
        print("RESULT", json.dumps(out))
        """, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT ", 1)[1])
    assert "vLLM 0.34 removed vllm.v1.worker.block_table" in out.pop("left_out")
    assert out == {
        "same": True, "mark": POINT.id, "vllms_own": True,
        "widths": [_width_033(n, b) for n, b in [(100, 16), (1, 16), (8, 16), (9, 16), (5, 256), (33, 48)]],
        "decision": ["patched"], "reverted": [True, False], "back": True,
    }


@needs_missing_module
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    cases.check_install_uninstall_exact(POINT)


@needs_vllm_module
def test_stays_out_where_vllm_ships_the_module():
    cases.check_stays_out(POINT)
