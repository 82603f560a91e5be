"""The diffusion path end to end, in every cell with a vllm-omni, against what the same vllm-omni does on its own
vLLM (the native record, ``matrix/native/``, written by ``nox -s native``):

* vllm-omni's own Qwen-Image and Z-Image transformers, loaded with online quant and stragglers through
  ``DiffusersPipelineLoader`` and run: bit for bit equal (every parameter after loading, and the complete
  checkpoint's output where the native record was made on a CPU of the same signature; from another CPU, whose
  kernels round differently, the output's abs mean within ``OTHER_CPU_OUTPUT_RTOL``: ``nox -s native`` re-records
  on this one), except what holds never-loaded elements, values vLLM materializes and the test does not control
  (they differ on vLLM 0.34, whose layerwise reload processes a layer with nothing loaded): those parameters
  materialized with the complete checkpoint's dtype and shape, their loaded rows equal to the checkpoint, and the
  stragglers checkpoint's forward run to an output of the complete one's shape (``model_differences``);
* the importable modules of the path (``vllm_omni.diffusion``, the quant configs, the ``Omni`` / ``AsyncOmni``
  entrypoints): the native set, except modules failing on a vLLM name that doctor reports unbridged.

What is recorded and why it is deterministic: ``tests/support/diffusion_path.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import tomllib

from conftest import OMNI_IMPORT_BLOCKERS, OMNI_VERSION, VLLM_VERSION, clean_env, run_python
from tests.support.cell_matrix import cell_unresolved, names_an_unresolved
from tests.support.diffusion_path import (
    missing_target,
    model_differences,
    module_differences,
    native_record_path,
    same_cpu,
)
from tests.support.warm_python import WARM
from vllm_compat.detect.versions import installed_version
from vllm_compat.entrypoints import DIFFUSION_STAGE, entrypoints_of

ROOT = Path(__file__).resolve().parents[2]
NATIVE = native_record_path(OMNI_VERSION) if OMNI_VERSION else None
TORCH = installed_version("torch")
_native = json.loads(NATIVE.read_text()) if NATIVE is not None and NATIVE.exists() else None


def _why_not_comparable() -> str | None:
    if OMNI_VERSION is None or VLLM_VERSION is None:
        return "needs vLLM and vllm-omni installed"
    if _native is None:
        return f"no native record for vllm-omni {OMNI_VERSION} ({NATIVE}); `nox -s native` writes it"
    if _native["torch"] != TORCH:
        return (f"the native record was made with torch {_native['torch']}, here {TORCH}: bit-equality across "
                "torch builds is not expected")
    return None


_NOT_COMPARABLE = _why_not_comparable()
needs_native_record = pytest.mark.skipif(_NOT_COMPARABLE is not None, reason=_NOT_COMPARABLE or "")
# vllm-omni 0.30.0 on vLLM 0.24-0.28 needs names those vLLMs never had (added in 0.28 / 0.29); no bridge provides
# them, so the cell is expected to differ, and a strict xfail notices the day it stops differing.
unbridged_import = pytest.mark.xfail(
    bool(OMNI_IMPORT_BLOCKERS), strict=True,
    reason=f"vllm-omni {OMNI_VERSION} does not import on vLLM {VLLM_VERSION}: {', '.join(OMNI_IMPORT_BLOCKERS)}",
)


def _record(out: Path, env: dict | None = None, *flags: str) -> dict:
    """The record of this cell, from a fresh interpreter's start (startup hook and import order as in a worker; a
    child of the warm server: ``tests/support/warm_python.py``)."""
    proc = WARM.run(["-m", "tests.support.diffusion_path", str(out), *flags], clean_env(env), ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def cell_record(tmp_path_factory) -> dict:
    return _record(tmp_path_factory.mktemp("diffusion-path") / "record.json")


def test_every_vllm_omni_in_the_matrix_has_one_native_cell_and_its_record():
    cells = tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]
    releases = {c["vllm_omni"] for c in cells if c.get("vllm_omni")}
    natives = {c["vllm_omni"]: c for c in cells if c.get("native")}
    assert set(natives) == releases and sum(bool(c.get("native")) for c in cells) == len(releases)
    for release, cell in natives.items():
        record = json.loads(native_record_path(release).read_text())
        assert (record["vllm"], record["vllm_omni"]) == (cell["vllm"], release), "re-record with `nox -s native`"


@needs_native_record
def test_native_record_is_a_working_load():
    """The reference itself loaded, quantized every linear and ran: equality with a broken record proves nothing."""
    assert _native["vllm_omni"] == OMNI_VERSION
    assert sum(error is None for error in _native["modules"].values()) > 100
    for arch, kinds in _native["models"].items():
        for kind, record in kinds.items():
            assert "load_error" not in record and "forward_error" not in record, (arch, kind, record)
            assert record["meta_left"] == [] and record["fp8_params"] > 0, (arch, kind)
        assert kinds["complete"]["output_finite"], arch


@pytest.fixture(scope="module")
def differences(cell_record) -> dict:
    """How the cell differs from the native record; also the matrix table's "diffusion path" column
    (``VLLM_COMPAT_DIFFUSION_PATH_OUT``, written by the first test that asks)."""
    from vllm_compat import report

    drift = report().import_drift  # static, with the bridges this cell installs
    unbridged = sorted({u.target for u in drift.unresolved if drift.bridged_by(u.target) is None}) if drift else []
    modules = module_differences(_native, cell_record) if "import_error" not in cell_record else {}

    def explained(here: str | None) -> str | None:
        missing = missing_target(here)
        return next((t for t in unbridged if missing and (t == missing or t.startswith(missing + "."))), None)

    result = {
        "native": f"vLLM {_native['vllm']}" + ("" if same_cpu(_native, cell_record) else
                                                 f", outputs by abs mean: recorded on {_native.get('cpu')}"),
        "import_error": cell_record.get("import_error"),
        "models": model_differences(_native, cell_record) if "import_error" not in cell_record else [],
        "modules": {name: here for name, (_, here) in modules.items()},
        "reported_unbridged": sorted({t for _, here in modules.values() if (t := explained(here))}),
        "unexplained": {name: [there, here] for name, (there, here) in modules.items() if not explained(here)},
    }
    summary = os.environ.get("VLLM_COMPAT_DIFFUSION_PATH_OUT")
    if summary:
        Path(summary).write_text(json.dumps(result))
    return result


@needs_native_record
@unbridged_import
def test_models_load_and_run_bit_equal_to_native(differences):
    assert differences["import_error"] is None
    assert differences["models"] == [], "\n".join(differences["models"])


@needs_native_record
@unbridged_import
def test_importable_modules_equal_native_but_for_what_doctor_reports_unbridged(differences):
    """A module of the path that imports natively and not here must fail on a vLLM name the static drift check
    reports unresolved and unbridged (so doctor and check say it); any other difference, either way, is a bug."""
    assert differences["import_error"] is None
    assert differences["unexplained"] == {}, json.dumps(differences["unexplained"], indent=1)


@needs_native_record
@unbridged_import
def test_without_vllm_compat_the_cell_fails_where_it_patches(cell_record, tmp_path):
    """Where vllm_compat patches or bridges something on this path, turning it off brings back the real failure
    (the meta-tensor RuntimeError from the legacy loader, or vllm-omni's ImportError); where it does nothing
    (vllm-omni's own vLLM with a gated loader), the cell is native-equal without it too."""
    expected = {"diffusers_loader_meta_device": "Cannot copy out of meta tensor",
                "routed_experts_lists": "RoutedExpertsLists", "input_preprocessor": "vllm.inputs.preprocess",
                "error_response_engine_text": "vllm.entrypoints.serve.utils.error_response",
                "v1_block_table": "block_table", "v1_sampler": "vllm.v1.sample.sampler",
                "v1_sampling_metadata": "vllm.v1.sample.metadata"}
    patched = sorted(name for name, action in cell_record["decisions"].items()
                     if name in expected and action == "patched")
    unpatched = _record(tmp_path / "unpatched.json", {"VLLM_COMPAT_DISABLE": "1"}, "--no-modules")
    failures = [unpatched.get("import_error"), unpatched.get("worker_error")] + [
        record.get("load_error") for kinds in unpatched.get("models", {}).values() for record in kinds.values()]
    failures = [f for f in failures if f]
    # A failure may also name an earlier name vllm-omni's import reaches that the cell's matrix lists as unresolved,
    # bridged by an entry not named above (vllm-omni 0.26.0 on 0.28-0.32: error_response, by moved_names).
    if not patched:  # none of the above acts here: native-equal, or stopped only by such a name
        assert all(names_an_unresolved(failure, cell_unresolved()) for failure in failures), failures
        return
    if not failures:  # the worker's path may not reach it: vllm-omni 0.28.0's engine imports vllm.inputs.preprocess
        failures = [_unpatched_stage_import_error()]  # on 0.29+, its worker does not; the whole stage, unpatched
    assert any(expected[name] in failure for name in patched for failure in failures) or any(
        names_an_unresolved(failure, cell_unresolved()) for failure in failures), (patched, failures)


def _unpatched_stage_import_error() -> str:
    """What importing every module of the diffusion stage (its process, engine and worker: the static check's roots)
    raises with vllm_compat off, as "Type: message"; "" when they all import."""
    roots = next(e.roots for e in entrypoints_of("vllm_omni") if e.id == DIFFUSION_STAGE)
    result = run_python(f"""
        import importlib
        try:
            for root in {list(roots)!r}:
                importlib.import_module(root)
        except ImportError as exc:
            print("STAGE-ERROR", type(exc).__name__ + ": " + str(exc))
    """, env={"VLLM_COMPAT_DISABLE": "1"}, timeout=1200)
    return result.stdout.partition("STAGE-ERROR ")[2].strip()
