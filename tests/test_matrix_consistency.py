"""In a nox matrix cell: static scan == runtime detection == the expectations written in matrix/vllm.toml."""

import os

import pytest

from conftest import omni_importable_or_absent
from vllm_compat import report

EXPECTED = {key: os.environ.get(f"VLLM_COMPAT_EXPECT_{key.upper()}") for key in ("level", "loader", "action", "variant")}
pytestmark = pytest.mark.skipif(
    not os.environ.get("VLLM_COMPAT_CELL"), reason="runs inside a nox matrix cell (VLLM_COMPAT_CELL unset)"
)


@pytest.mark.parametrize(
    "runtime", [False, pytest.param(True, marks=omni_importable_or_absent)], ids=["static", "runtime"]
)
def test_cell_matches_matrix_expectations(runtime):
    result = report(runtime=runtime)
    data = result.to_dict()
    found = {
        "level": data["vllm"]["level"],
        "loader": data["vllm_omni"]["loader_kind"],
        "action": data["patches"][0]["action"],
        "variant": data["patches"][0]["variant"],
    }
    assert {k: v for k, v in found.items() if EXPECTED[k] is not None} == {
        k: v for k, v in EXPECTED.items() if v is not None
    }, f"cell {os.environ['VLLM_COMPAT_CELL']}"
    assert result.mismatches == [] and result.runtime_error is None


def test_cell_import_drift_matches_matrix():
    """``unresolved`` in matrix/vllm.toml: the names `import vllm_omni` reaches that the cell's vLLM lacks (measured
    before bridges); ``bridged``: those a vllm_compat bridge provides. The rest keep vllm-omni from importing."""
    expected = os.environ.get("VLLM_COMPAT_EXPECT_UNRESOLVED")
    if expected is None:
        pytest.skip("the cell has no vllm-omni")
    drift = report().import_drift
    assert drift is not None
    cell = os.environ["VLLM_COMPAT_CELL"]
    unresolved = sorted(n for n in expected.split(",") if n)
    bridged = sorted(n for n in os.environ.get("VLLM_COMPAT_EXPECT_BRIDGED", "").split(",") if n)
    assert drift.blocking_names == unresolved, f"cell {cell}"
    assert sorted(n for n in drift.blocking_names if drift.bridged_by(n)) == bridged, f"cell {cell}"
    if drift.early:  # the startup hook is installed: bridged names no longer stop the import
        assert drift.still_blocking_names == [n for n in unresolved if n not in bridged], f"cell {cell}"


def test_cell_diffusion_worker_drift_matches_matrix():
    """``worker_unresolved`` in matrix/vllm.toml: the further names vllm-omni's diffusion worker module reaches
    that the cell's vLLM lacks; doctor's verdict says the diffusion stage (the worker, the engine, the stage process)
    will not start while one of them is unbridged."""
    expected = os.environ.get("VLLM_COMPAT_EXPECT_WORKER_UNRESOLVED")
    if expected is None or os.environ.get("VLLM_COMPAT_EXPECT_UNRESOLVED") is None:
        pytest.skip("the cell has no vllm-omni")
    result = report()
    drift = result.import_drift
    cell = os.environ["VLLM_COMPAT_CELL"]
    worker_only = [n for n in drift.worker_blocking_names if n not in drift.blocking_names]
    assert worker_only == sorted(n for n in expected.split(",") if n), f"cell {cell}"
    if drift.import_ok and not drift.worker_ok:
        assert result.verdict().kind == "will_not_start" and "diffusion stage" in result.verdict().text
        assert result.exit_code == 1


def test_cell_entrypoints_match_matrix():
    """``entrypoints`` in matrix/vllm.toml (measured from the wheels by ``nox -s refresh``): whether vllm-omni's
    offline API, ``vllm serve --omni`` and diffusion stage start in this cell as a user who installs vllm_compat
    gets them (the bridges in place before vllm-omni is imported). The doctor's static view of the installed pair
    must say the same, and its verdict says WORKS only when all of them start."""
    expected = os.environ.get("VLLM_COMPAT_EXPECT_ENTRYPOINTS")
    if expected is None:
        pytest.skip("the cell has no vllm-omni (or no entrypoints measured)")
    from vllm_compat.bridges import drift_handler, provided_by_decisions
    from vllm_compat.config import Controls
    from vllm_compat.decide import plan
    from vllm_compat.detect.static import StaticSite

    result = report()
    drift = result.import_drift  # judged against this env: a CPU-torch cell lacks the server's torchaudio
    # the wheels' view, as refresh measures it (a user's install brings the requirements; default controls; the
    # startup hook), from a fresh plan of the installed pair: nothing another test did in this process counts;
    # with the behavioural drift the acting drift points handle, as check reports it
    site = StaticSite.installed()
    decisions = [decision for _, _, decision in plan(site, Controls())]
    provided = provided_by_decisions(decisions)
    as_installed = site.installed_import_drift().with_bridges(provided, early=True).with_behaviour(
        site.behaviour_drift, drift_handler(decisions))
    found = {status.id: status.status for status in as_installed.all_statuses}  # the LLM / AR stages too
    assert found == dict(item.split("=", 1) for item in expected.split(",")), f"cell {os.environ['VLLM_COMPAT_CELL']}"
    judged = drift.with_bridges(provided, early=True).with_behaviour(site.behaviour_drift,
                                                                     drift_handler(decisions)).statuses
    for here, measured in zip(judged, as_installed.statuses, strict=True):  # the env only ever takes away
        assert here.status == measured.status or (here.status == "will_not_start" and here.not_installed), here
    if drift.early:
        stopped = [s for s in drift.statuses if s.status == "will_not_start"]
        assert (result.verdict().kind == "will_not_start") == bool(stopped or not drift.import_ok)
        for status in stopped if drift.import_ok else ():  # else the verdict names what stops the import
            assert status.label in result.verdict().text and all(n in result.verdict().text for n in status.missing)
