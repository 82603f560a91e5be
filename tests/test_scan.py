"""``vllm-compat scan`` on REAL release wheels (downloaded with ``pip download --no-deps``) and on this env.

Wheels: vllm-omni 0.24.0 and 0.30.0 (small) and ONE vLLM wheel, 0.31.0 (~300 MB): the first release without
``vllm.v1.outputs.RoutedExpertsLists``, so it also proves the import-drift check on wheels. They go to a
session-scoped temporary directory that is deleted afterwards, or to VLLM_COMPAT_WHEEL_CACHE when set (kept,
so matrix cells share one download). Without a reachable registry the wheel tests skip, saying so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import OMNI_VERSION, VLLM_VERSION, needs_vllm
from vllm_compat.cli import main

VLLM_WHEEL_VERSION = "0.31.0"
ROUTED = "vllm.v1.outputs.RoutedExpertsLists"


def _pip() -> list[str] | None:
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    if probe.returncode == 0:
        return [sys.executable, "-m", "pip"]
    pip = shutil.which("pip") or shutil.which("pip3")
    return [pip] if pip else None


@pytest.fixture(scope="session")
def wheels(tmp_path_factory):
    """{"vllm-omni 0.24.0": path, "vllm-omni 0.30.0": path, "vllm 0.31.0": path}."""
    cache = os.environ.get("VLLM_COMPAT_WHEEL_CACHE")
    directory = Path(cache) if cache else tmp_path_factory.mktemp("wheels")
    directory.mkdir(parents=True, exist_ok=True)
    pip = _pip()
    if pip is None:
        pytest.skip("no pip to download wheels with (neither `python -m pip` nor `pip` on PATH)")
    found = {}
    try:
        for distribution, version in [("vllm-omni", "0.24.0"), ("vllm-omni", "0.30.0"), ("vllm", VLLM_WHEEL_VERSION)]:
            pattern = f"{distribution.replace('-', '_')}-{version}-*.whl"
            if not list(directory.glob(pattern)):
                result = subprocess.run(
                    [*pip, "download", "-q", "--no-deps", "--only-binary", ":all:", f"{distribution}=={version}",
                     "-d", str(directory)],
                    capture_output=True, text=True, timeout=900,
                )
                if result.returncode != 0:
                    pytest.skip(f"registry unreachable or {distribution}=={version} not downloadable: "
                                f"{(result.stderr or result.stdout).strip().splitlines()[-1:]}")
            found[f"{distribution} {version}"] = next(directory.glob(pattern))
        yield found
    finally:
        if not cache:
            shutil.rmtree(directory, ignore_errors=True)  # ~300 MB: never left in pytest's kept tmp dirs


def _scan(capsys, *args) -> tuple[int, str]:
    code = main(["scan", *map(str, args)])
    return code, capsys.readouterr().out


def _scan_json(capsys, *args) -> list[dict]:
    code, out = _scan(capsys, "--json", *args)
    assert code == 0, out
    return json.loads(out)


def test_vllm_omni_wheels(capsys, wheels):
    legacy, gated = _scan_json(capsys, wheels["vllm-omni 0.24.0"], wheels["vllm-omni 0.30.0"])
    assert legacy["vllm_omni"]["version"] == "0.24.0" and legacy["vllm_omni"]["loader_kind"] == "legacy"
    assert gated["vllm_omni"]["version"] == "0.30.0" and gated["vllm_omni"]["loader_kind"] == "gated"
    for profile in (legacy, gated):
        assert profile["vllm"] == {"version": None, "level": "absent", "capabilities": profile["vllm"]["capabilities"]}
        assert profile["vllm"]["capabilities"]["installed"] is False
        assert profile["vllm_omni"]["meta_device_methods"]  # int8 / mxfp8 lazy-weight quant classes
        assert profile["import_drift"] is None  # no vLLM beside it and no --vllm: nothing to check against


def test_vllm_wheel(capsys, wheels):
    (profile,) = _scan_json(capsys, wheels[f"vllm {VLLM_WHEEL_VERSION}"])
    assert profile["vllm"]["version"] == VLLM_WHEEL_VERSION
    assert profile["vllm"]["level"] == "meta_device_with_finalize"
    caps = profile["vllm"]["capabilities"]
    assert caps["has_uses_meta_device"] and caps["finalize_signature"] == "(model, model_config)"
    assert profile["vllm_omni"]["loader_kind"] == "absent" and profile["import_drift"] is None


def test_vllm_omni_wheels_against_a_vllm_wheel_without_routed_experts(capsys, wheels):
    profiles = _scan_json(capsys, "--vllm", wheels[f"vllm {VLLM_WHEEL_VERSION}"],
                          wheels["vllm-omni 0.24.0"], wheels["vllm-omni 0.30.0"])
    for profile in profiles:
        drift = profile["import_drift"]
        assert drift["plugin"] == "vllm_omni" and drift["import_ok"] is False
        assert drift["blocking_names"] == [ROUTED]
        assert ROUTED in drift["names"] and drift["checked"] > 1000
        (blocker,) = [u for u in drift["blocking"] if u["target"] == ROUTED]
        assert blocker["importer"] == "vllm_omni.core.sched.utils" and blocker["reason"] == "name not defined"
    code, text = _scan(capsys, "--vllm", wheels[f"vllm {VLLM_WHEEL_VERSION}"], wheels["vllm-omni 0.30.0"])
    assert code == 0
    assert "WILL NOT IMPORT" in text and ROUTED in text and "vllm_omni.core.sched.utils:" in text


@needs_vllm
def test_installed_site_packages_matches_the_doctor(capsys):
    from vllm_compat.detect.static import installed_package_root
    from vllm_compat.reporting import (
        build_report,  # the package's report() is shadowed once this submodule loads
    )

    site = installed_package_root("vllm")
    (profile,) = _scan_json(capsys, site)
    doctor = build_report().to_dict()
    assert profile["vllm"]["version"] == VLLM_VERSION and profile["vllm"]["level"] == doctor["vllm"]["level"]
    if OMNI_VERSION is not None and installed_package_root("vllm_omni") == site:
        assert profile["vllm_omni"]["loader_kind"] == doctor["vllm_omni"]["loader_kind"]
        # What vLLM lacks is the same; doctor's view also applies the bridges it decided (scan decides nothing).
        found = ("plugin", "files", "checked", "unknown", "names", "blocking_names", "worker_module",
                 "worker_blocking_names", "unresolved", "blocking")
        assert {k: profile["import_drift"][k] for k in found} == {k: doctor["import_drift"][k] for k in found}


def test_missing_paths_are_usage_errors(capsys, tmp_path):
    assert main(["scan", str(tmp_path / "nope.whl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["scan", "--vllm", str(tmp_path / "nope"), str(tmp_path)]) == 2


def test_empty_tree_scans_as_nothing_installed(capsys, tmp_path):
    (profile,) = _scan_json(capsys, tmp_path)
    assert profile["vllm"]["level"] == "absent" and profile["vllm_omni"]["loader_kind"] == "absent"
    assert profile["import_drift"] is None
