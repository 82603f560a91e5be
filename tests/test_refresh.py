"""matrix/refresh.py's intake, the parts that need no index and no wheel: which releases a version list makes new,
the block a new cell gets (read back with tomllib, and beside the real matrix), the drift between two checks,
moved or removed. Every expected value is written out here from the inputs the test gives."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="matrix/refresh.py reads matrix/vllm.toml with tomllib (3.11+)")

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("matrix_refresh", ROOT / "matrix" / "refresh.py")
refresh = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refresh)

PIP_INDEX = """vllm (0.34.1)
Available versions: 0.35.0rc1, 0.34.1, 0.34.0, 0.33.1, 0.33.0, 0.32.0, 0.10.1.1, 0.8.5.post1
"""


def test_pip_index_output_is_read_as_listed():
    assert refresh.parse_index_versions(PIP_INDEX) == [
        "0.35.0rc1", "0.34.1", "0.34.0", "0.33.1", "0.33.0", "0.32.0", "0.10.1.1", "0.8.5.post1"]
    assert refresh.parse_index_versions("ERROR: No matching distribution found for vllm\n") == []


def test_a_new_minor_is_added_at_its_latest_patch_and_a_release_candidate_never():
    available = refresh.parse_index_versions(PIP_INDEX)
    assert refresh.newer_releases(available, ["0.16.0", "0.33.0", "0.32.0"]) == ["0.34.1"]
    assert refresh.newer_releases(available, ["0.34.0"]) == []  # 0.34.1 is a patch of a minor we have
    assert refresh.newer_releases(available, ["0.31.0"]) == ["0.32.0", "0.33.1", "0.34.1"]  # oldest first
    assert refresh.newer_releases(["0.36.0.dev3", "0.35.0rc1", "not-a-version"], ["0.34.0"]) == []


def test_a_newer_patch_of_a_known_minor_is_named_not_added():
    available = refresh.parse_index_versions(PIP_INDEX)
    assert refresh.newer_patches(available, ["0.33.0", "0.34.0", "0.32.0"]) == [("0.33.0", "0.33.1"),
                                                                                ("0.34.0", "0.34.1")]
    assert refresh.newer_patches(available, ["0.34.1", "0.33.1"]) == []


def test_columns_and_ids():
    cells = [{"vllm": "0.33.0"}, {"vllm": "0.30.0", "vllm_omni": "0.30.0"}, {"vllm": "0.34.0", "vllm_omni": "0.26.0"},
             {"vllm": "0.24.0", "vllm_omni": "0.24.0"}, {"vllm": "0.31.0", "vllm_omni": "0.30.0"}]
    assert refresh.omni_columns(cells) == ["0.24.0", "0.26.0", "0.30.0"]
    assert refresh.cell_id("0.34.1", "0.30.0") == "v0.34-omni0.30"
    assert refresh.cell_id("0.17.1", None) == "v0.17"
    assert refresh.cell_id("1.0.0", "1.2.3") == "v1.0-omni1.2"


MEASURED = {"expect": {"level": "meta_device_with_finalize", "loader": "gated", "action": "skipped"},
            "unresolved": ["vllm.v1.outputs.RoutedExpertsLists"],
            "worker_unresolved": ["vllm.v1.worker.block_table"], "all_unresolved": 14}


def test_a_rendered_block_reads_back_as_the_cell_it_describes():
    text = refresh.render_cell(
        "0.35.0", "0.30.0", MEASURED, why='vllm-omni 0.30.0 on "0.35.0"',
        overrides=[("huggingface-hub==2.4.0", "vLLM needs >=2.0.0, diffusers <2.0"), ("flashinfer-python==0.7.4", "")],
        bridged={"vllm.v1.outputs.RoutedExpertsLists": "routed_experts_lists", "vllm.v1.worker.block_table": "v1_block_table"})
    (cell,) = tomllib.loads(text)["cell"]
    assert cell == {
        "id": "v0.35-omni0.30", "vllm": "0.35.0", "vllm_omni": "0.30.0", "why": 'vllm-omni 0.30.0 on "0.35.0"',
        "overrides": ["huggingface-hub==2.4.0", "flashinfer-python==0.7.4"],
        "expect": {"level": "meta_device_with_finalize", "loader": "gated", "action": "skipped"},
        "unresolved": ["vllm.v1.outputs.RoutedExpertsLists"], "worker_unresolved": ["vllm.v1.worker.block_table"],
        # only import-blocking names, as tests/test_matrix_consistency.py reads `bridged`; the comment has both
        "bridged": ["vllm.v1.outputs.RoutedExpertsLists"],
    }
    assert "# vLLM needs >=2.0.0, diffusers <2.0" in text
    assert "block_table by v1_block_table" in text and "RoutedExpertsLists by routed_experts_lists" in text


def test_a_cell_without_vllm_omni_or_overrides_has_neither_key():
    measured = {"expect": {"level": "meta_device_with_finalize", "loader": "absent", "action": "pending"}}
    (cell,) = tomllib.loads(refresh.render_cell("0.35.0", None, measured, why="vLLM alone"))["cell"]
    assert cell == {"id": "v0.35", "vllm": "0.35.0", "why": "vLLM alone", "expect": measured["expect"]}


def test_appended_cells_keep_the_real_matrix_valid_and_every_cell_in_place():
    text = (ROOT / "matrix" / "vllm.toml").read_text()
    before = tomllib.loads(text)["cell"]
    blocks = [refresh.render_cell("9.1.0", omni, MEASURED, why="test") for omni in ("0.24.0", "0.30.0")]
    after = tomllib.loads(refresh.append_cells(text, "9.1.0", blocks))["cell"]
    assert after[: len(before)] == before
    assert [c["id"] for c in after[len(before):]] == ["v9.1-omni0.24", "v9.1-omni0.30"]
    ids = [c["id"] for c in after]
    assert len(ids) == len(set(ids))


CHECK_BEFORE = {"names": ["vllm.a.kept", "vllm.a.fixed_again"], "bridged": {}, "unresolved": [], "entrypoints": {}}
CHECK_AFTER = {
    "names": ["vllm.a.kept", "vllm.v1.worker.block_table", "vllm.v1.sample.sampler.Sampler"],
    "bridged": {"vllm.v1.worker.block_table": "v1_block_table"},
    "unresolved": [{"target": "vllm.v1.worker.block_table", "reason": "module not found", "importer": "x", "line": 1},
                   {"target": "vllm.v1.sample.sampler.Sampler", "reason": "name not defined", "importer": "y", "line": 2}],
    "entrypoints": {"offline": {"status": "works_natively", "missing": [], "bridged": []},
                    "diffusion_stage": {"status": "works_with_vllm_compat", "missing": [],
                                        "bridged": ["vllm.v1.worker.block_table"]},
                    "serve": {"status": "will_not_start", "missing": ["vllm.v1.sample.sampler.Sampler"], "bridged": []}},
}


def test_new_drift_is_what_the_new_vllm_added_with_its_bridge_and_entrypoints():
    drift = refresh.new_drift(CHECK_BEFORE, CHECK_AFTER)
    assert drift == {
        "added": [
            {"name": "vllm.v1.sample.sampler.Sampler", "bridged_by": None, "entrypoints": ["serve"],
             "reason": "name not defined"},
            {"name": "vllm.v1.worker.block_table", "bridged_by": "v1_block_table", "entrypoints": ["diffusion_stage"],
             "reason": "module not found"},
        ],
        "gone": ["vllm.a.fixed_again"],
    }
    # no previous check (a column new with this release): everything unresolved is new
    assert [r["name"] for r in refresh.new_drift(None, CHECK_AFTER)["added"]] == sorted(CHECK_AFTER["names"])


SOURCES = [
    ("vllm/v1/worker/gpu/block_table.py", "class BlockTable:\n    pass\n"),
    ("vllm/third_party/kernels/block_table.py", "X = 1\n"),
    ("vllm/v1/worker/gpu/sample/sampler.py", "class Sampler:\n    x: int = 0\n"),
    ("vllm/v1/outputs.py", "from typing import NamedTuple\nModelRunnerOutput: type = object\nasync def helper():\n    pass\n"),
    ("vllm/v1/sample/__init__.py", ""),
]


def test_definition_index_reads_module_level_names_and_module_basenames():
    names, modules = refresh.definition_index(SOURCES)
    assert names["BlockTable"] == {"vllm.v1.worker.gpu.block_table"}
    assert names["Sampler"] == {"vllm.v1.worker.gpu.sample.sampler"}
    assert names["ModelRunnerOutput"] == {"vllm.v1.outputs"} and names["helper"] == {"vllm.v1.outputs"}
    assert "x" not in names  # indented: a class attribute, not a module-level name
    assert modules["block_table"] == {"vllm.v1.worker.gpu.block_table", "vllm.third_party.kernels.block_table"}
    assert modules["sample"] == {"vllm.v1.sample"}


def test_moved_or_removed_names_the_closest_home_first():
    index = refresh.definition_index(SOURCES)
    assert refresh.moved_or_removed("vllm.v1.worker.block_table", "module not found", index) == (
        "moved? (same name in vllm.v1.worker.gpu.block_table, vllm.third_party.kernels.block_table)")
    assert refresh.moved_or_removed("vllm.v1.sample.sampler.Sampler", "name not defined", index) == (
        "moved? (same name in vllm.v1.worker.gpu.sample.sampler)")
    # `from vllm.v1.worker import block_table` reports a name not defined: a module of that name counts too
    assert refresh.moved_or_removed("vllm.v1.worker.block_table", "name not defined", index) == (
        "moved? (same name in vllm.v1.worker.gpu.block_table, vllm.third_party.kernels.block_table)")
    assert refresh.moved_or_removed("vllm.v1.sample.metadata", "module not found", index) == "removed"
    assert refresh.moved_or_removed("vllm.v1.outputs.RoutedExpertsLists", "name not defined", index) == "removed"


def test_overrides_come_from_the_checks_dependency_drift():
    check = {"dependency_drift": {"conflicts": [
        {"override": "huggingface-hub==2.4.0", "text": "huggingface-hub: vllm 0.34.0 needs >=2.0.0",
         "resolution": "override: huggingface-hub==2.4.0 (tested)"},
        {"override": None, "text": "x: plugin side", "resolution": "no override suggested"}]}}
    assert refresh.check_overrides(check) == [
        ("huggingface-hub==2.4.0", "huggingface-hub: vllm 0.34.0 needs >=2.0.0: override: huggingface-hub==2.4.0 (tested)")]
    assert refresh.check_overrides({}) == []


def test_rewrite_replaces_a_cells_measured_lines_and_nothing_else():
    text = ('[[cell]]\nid = "a"\nvllm = "0.1.0"\nwhy = "x"\nexpect = { level = "old" }\nunresolved = []\n\n'
            '[[cell]]\nid = "b"\nvllm = "0.2.0"\nexpect = { level = "keep" }\n')
    out = refresh.rewrite(text, "a", {"expect": {"level": "new"}, "unresolved": ["vllm.x.y"], "worker_unresolved": []})
    a, b = tomllib.loads(out)["cell"]
    assert a == {"id": "a", "vllm": "0.1.0", "why": "x", "expect": {"level": "new"}, "unresolved": ["vllm.x.y"],
                 "worker_unresolved": []}
    assert b == {"id": "b", "vllm": "0.2.0", "expect": {"level": "keep"}}


def test_rewrite_writes_the_acting_patches_and_drops_the_line_where_none_acts():
    text = '[[cell]]\nid = "a"\nvllm = "0.1.0"\nvllm_omni = "0.1.0"\nexpect = { level = "x" }\nunresolved = []\n'
    measured = {"expect": {"level": "x"}, "unresolved": [], "patched": ["p1", "p2"]}
    written = refresh.rewrite(text, "a", measured)
    assert tomllib.loads(written)["cell"][0]["patched"] == ["p1", "p2"]
    dropped = refresh.rewrite(written, "a", {"expect": {"level": "x"}, "unresolved": []})
    assert "patched" not in tomllib.loads(dropped)["cell"][0] and dropped == text
