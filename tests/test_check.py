"""``vllm-compat check`` on REAL release wheels, fetched by the check itself (``pip download --no-deps``).

Wheels go to VLLM_COMPAT_WHEEL_CACHE when set (nox sets one for every cell, shared with tests/test_scan.py, so
each wheel is downloaded once per run), else to a session temporary directory deleted afterwards. Every cell
runs the cheap tests: the errors (a wrong version, a file that is not a vLLM wheel, an unreachable index), the
cache, and one real pair (vLLM 0.31.0, the wheel test_scan.py downloads anyway, with vllm-omni 0.24.0). The
sweep over every vLLM 0.24-0.33 x vllm-omni 0.24.0 / 0.30.0 cell of matrix/vllm.toml (ten ~300 MB vLLM wheels)
runs in one place only: outside nox, or in the first default nox cell (``SWEEP_CELL``).
"""

from __future__ import annotations

import json
import os
import threading
import zipfile
from pathlib import Path

import pytest

from conftest import OMNI_VERSION, run_python
from tests.support.wheels import wheel_or_skip
from vllm_compat.catalogue import entry
from vllm_compat.cli import main
from vllm_compat.detect import wheels
from vllm_compat.detect.wheels import CACHE_VAR, WheelError, cached_wheel, fetch_wheel

tomllib = pytest.importorskip("tomllib", reason="reading matrix/vllm.toml needs Python >= 3.11 (tomllib)")

ROOT = Path(__file__).resolve().parent.parent
CELLS = tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]
SWEEP_CELL = next(c["id"] for c in CELLS if c.get("default"))
SWEEP = [c for c in CELLS if c.get("vllm_omni") and "expect" in c  # the serve cells repeat a pair, expecting nothing
         and (0, 24) <= tuple(map(int, c["vllm"].split(".")[:2])) <= (0, 33)]
LOADER_ENTRY = "diffusers_loader_meta_device"
ROUTED = "vllm.v1.outputs.RoutedExpertsLists"
sweep_here = pytest.mark.skipif(
    os.environ.get("VLLM_COMPAT_CELL") not in (None, SWEEP_CELL),
    reason=f"the 0.24-0.33 sweep downloads ten vLLM wheels: it runs in nox cell {SWEEP_CELL} only",
)


@pytest.fixture(scope="session")
def wheel_cache(tmp_path_factory):
    """The check's wheel cache for this run (VLLM_COMPAT_WHEEL_CACHE, or a temporary one removed afterwards)."""
    shared = os.environ.get(CACHE_VAR)
    directory = Path(shared) if shared else tmp_path_factory.mktemp("check-wheels")
    saved = os.environ.get(CACHE_VAR)
    os.environ[CACHE_VAR] = str(directory)
    try:
        yield directory
    finally:
        if saved is None:
            os.environ.pop(CACHE_VAR, None)
        if not shared:
            import shutil

            shutil.rmtree(directory, ignore_errors=True)  # up to ~3 GB: never left in pytest's kept tmp dirs


def _check(capsys, *args) -> tuple[int, dict]:
    code = main(["check", "--json", *map(str, args)])
    return code, json.loads(capsys.readouterr().out)


def _decision(data: dict, name: str = LOADER_ENTRY) -> dict:
    return next(p for p in data["patches"] if p["name"] == name)


# ------------------------------------------------------------------------------------------- the sweep


@sweep_here
@pytest.mark.parametrize("cell", SWEEP, ids=[c["id"] for c in SWEEP])
def test_check_agrees_with_the_matrix_cell(capsys, wheel_cache, cell):
    wheel_or_skip("vllm", cell["vllm"])  # a skip, not a usage error, when the index is unreachable
    code, data = _check(capsys, f"vllm=={cell['vllm']}", f"vllm-omni=={cell['vllm_omni']}")
    expect = cell["expect"]
    assert data["inputs"]["vllm"]["version"] == cell["vllm"] and data["inputs"]["vllm"]["source"] == "cache"
    assert data["vllm"]["level"] == expect["level"] and data["vllm_omni"]["loader_kind"] == expect["loader"]
    decision = _decision(data)
    assert (decision["action"], decision["variant"]) == (expect["action"], expect.get("variant"))
    # What the matrix measures: the names `import vllm_omni` reaches that this vLLM lacks (before any bridge).
    assert data["import_drift"]["blocking_names"] == sorted(cell["unresolved"])
    bridged = set(data["import_drift"]["bridged"])
    if "bridged" in cell:  # the matrix's `bridged`: the `unresolved` ones (worker-only names are bridged too)
        assert sorted(bridged & set(cell["unresolved"])) == sorted(cell["bridged"])
    still_import = [n for n in sorted(cell["unresolved"]) if n not in bridged]
    still_worker = [n for n in cell["worker_unresolved"] if n not in bridged]  # measured by `nox -s refresh`
    assert [b["target"] for b in data["still_blocking"]["import"]] == still_import
    assert [b["target"] for b in data["still_blocking"]["diffusion_worker"]] == still_worker
    # Each entrypoint as `nox -s refresh` measured it from the same wheels (matrix/vllm.toml `entrypoints`).
    statuses = {k: v["status"] for k, v in data["import_drift"]["entrypoints"].items()}
    if "entrypoints" in cell:
        assert statuses == cell["entrypoints"]
    # No behavioural drift stops or fails an entrypoint unhandled (vllm_compat/detect/behaviour_drift.py); on
    # vllm-omni's own vLLM nothing is new at all.
    assert [f for e in data["import_drift"]["entrypoints"].values() for f in e["behaviour_drift"]] == []
    if cell.get("native"):
        assert data["import_drift"]["behaviour_drift"]["findings"] == []
    assert data["still_blocking"]["diffusion_stage"] == data["still_blocking"]["diffusion_worker"]
    # The method patches besides the loader that act on this pair (matrix/vllm.toml `patched`, measured by refresh).
    patched = sorted(p["name"] for p in data["patches"] if p["action"] == "patched" and p["name"] != LOADER_ENTRY
                     and entry(p["name"]).kind == "patch")
    assert patched == cell.get("patched", [])
    if still_import or still_worker or "will_not_start" in statuses.values():
        kind = "will_not_start"
    elif expect["action"] == "patched" or bridged or patched:
        kind = "works_with_vllm_compat"
    else:
        kind = "works_natively"
    kind = cell.get("verdict", kind)  # a cell's measured exception, with its reason in matrix/vllm.toml
    assert data["verdict"]["kind"] == kind and code == data["exit_code"] == (1 if kind == "will_not_start" else 0)


@sweep_here
def test_newest_vllm_against_a_given_vllm_omni(capsys, wheel_cache):
    omni = wheel_or_skip("vllm-omni", "0.24.0")
    try:
        newest = wheels.newest_version("vllm")
    except WheelError as exc:
        pytest.skip(f"the index cannot name the newest vLLM: {exc}")
    wheel_or_skip("vllm", newest)
    code, data = _check(capsys, "--newest", omni)
    assert data["inputs"]["vllm"]["version"] == newest and data["vllm_omni"]["version"] == "0.24.0"
    assert code == data["exit_code"] in (0, 1) and data["verdict"]["kind"]


# ------------------------------------------------------------------------------- one real pair, every cell


def test_screen_and_json_for_vllm_031_with_vllm_omni_024(capsys, wheel_cache, monkeypatch):
    wheel_or_skip("vllm", "0.31.0")
    omni_wheel = wheel_or_skip("vllm-omni", "0.24.0")
    # RoutedExpertsLists stops `import vllm_omni` and vllm.inputs.preprocess the diffusion worker unless a bridge
    # provides them; with the input_preprocessor bridge off, the worker does not start.
    monkeypatch.setenv("VLLM_COMPAT_DISABLE_PATCHES", "input_preprocessor")
    assert main(["check", "--verbose", "vllm==0.31.0", "vllm-omni==0.24.0"]) == 1
    screen = capsys.readouterr().out
    assert "level: meta_device_with_finalize" in screen and "loader: legacy" in screen
    assert "verdict: WILL NOT START: " in screen and "(cached)" in screen
    assert "still stops import vllm_omni" not in screen and " bridged by vllm_compat" in screen  # RoutedExpertsLists
    assert "the diffusion stage (vllm.inputs.preprocess missing" in screen.partition("verdict: ")[2]  # named as stopped
    assert "still stops it: vllm.inputs.preprocess (in vllm_omni.inputs.preprocess:5)" in screen
    monkeypatch.delenv("VLLM_COMPAT_DISABLE_PATCHES")
    code = main(["check", "--verbose", "vllm==0.31.0", "vllm-omni==0.24.0"])
    screen = capsys.readouterr().out
    assert "still stops it: vllm.inputs.preprocess" not in screen
    code, data = _check(capsys, "vllm==0.31", "vllm_omni==0.24.0")  # "0.31" == "0.31.0", as pip's "==" says
    entrypoints = data["import_drift"]["entrypoints"]
    assert entrypoints["diffusion_stage"]["status"] == "works_with_vllm_compat"
    assert "vllm.inputs.preprocess" in entrypoints["diffusion_stage"]["bridged"]
    # The server: vLLM 0.29+ has no vllm.entrypoints.launcher, which `vllm serve --omni` of vllm-omni 0.24.0 imports
    # (issue 24: the real import fails there on vLLM 0.30 and 0.33); it starts only where a bridge provides it.
    serve = entrypoints["serve"]
    assert "vllm.entrypoints.launcher" in serve["missing"] + serve["bridged"]
    assert serve["status"] == ("will_not_start" if serve["missing"] else "works_with_vllm_compat")
    stopped = [k for k, v in entrypoints.items() if v["status"] == "will_not_start"]
    # vllm-omni 0.24.0's LLM-stage branch constructs OpenAIServingRender (read from its wheel), which vLLM 0.25+
    # removed: the adapter builds it on vLLM 0.31's OnlineRenderer (the measured shape), so nothing is left out,
    # and the AR stage's scheduler is patched to the V1 runner its worker forces.
    with zipfile.ZipFile(omni_wheel) as wheel:
        assert "OpenAIServingRender(" in wheel.read("vllm_omni/entrypoints/openai/api_server.py").decode()
    render = _decision(data, "serve_render_serving")
    assert render["action"] == "patched" and "OpenAIServingRender adapted" in render["reason"]
    assert not render.get("leaves_out") and not any("serve_render_serving" in v["left_out"] for v in entrypoints.values())
    assert "serve_render_serving" not in data["verdict"]["text"].partition("Left out: ")[2]  # others may be named
    assert _decision(data, "ar_scheduler_v1_runner")["action"] == "patched"
    assert data["verdict"]["kind"] == ("will_not_start" if stopped else "works_with_vllm_compat")
    assert code == (1 if stopped else 0) and ("WILL NOT START" in screen) == bool(stopped)
    assert data["import_drift"]["bridged"]["vllm.inputs.preprocess"] == "input_preprocessor"
    assert data["import_drift"]["blocking_names"] == [ROUTED] and data["import_drift"]["worker_module"]
    still = [b["target"] for b in data["still_blocking"]["import"]]
    assert still == ([] if ROUTED in data["import_drift"]["bridged"] else [ROUTED])
    assert {p["name"] for p in data["patches"]} >= {LOADER_ENTRY}  # every catalogue entry, decided
    assert _decision(data)["action"] == "patched"


def test_wheel_paths_work_offline_and_without_pip(capsys, wheel_cache, monkeypatch):
    vllm_wheel, omni_wheel = wheel_or_skip("vllm", "0.31.0"), wheel_or_skip("vllm-omni", "0.30.0")

    def no_pip():
        raise AssertionError("a cached wheel or a path must not call pip")

    monkeypatch.setattr(wheels, "pip_command", no_pip)
    code, by_path = _check(capsys, vllm_wheel, omni_wheel)
    code_cached, by_name = _check(capsys, "vllm==0.31.0", "vllm-omni==0.30.0")
    assert code == code_cached  # vLLM 0.31 + vllm-omni 0.30.0: package and diffusion stage through two stand-ins
    assert by_path["inputs"]["vllm"]["source"] == "path" and by_name["inputs"]["vllm"]["source"] == "cache"
    for key in ("vllm", "vllm_omni", "patches", "import_drift", "still_blocking", "verdict"):
        assert by_path[key] == by_name[key], key


def test_installed_vllm_omni_is_the_default(capsys, wheel_cache):
    wheel_or_skip("vllm", "0.31.0")
    code = main(["check", "--json", "vllm==0.31.0"])
    captured = capsys.readouterr()
    if OMNI_VERSION is None:
        assert code == 2 and "no vllm-omni is installed here" in captured.err
        return
    data = json.loads(captured.out)
    assert data["inputs"]["vllm_omni"]["source"] == "installed" and data["vllm_omni"]["version"] == OMNI_VERSION


def test_the_check_imports_no_vllm_vllm_omni_or_torch(wheel_cache):
    vllm_wheel, omni_wheel = wheel_or_skip("vllm", "0.31.0"), wheel_or_skip("vllm-omni", "0.24.0")
    result = run_python(
        f"""
        import sys
        from vllm_compat.cli import main
        code = main(["check", "--json", {str(vllm_wheel)!r}, {str(omni_wheel)!r}])
        heavy = sorted(m for m in sys.modules if m.split('.')[0] in ("torch", "vllm", "vllm_omni"))
        print("HEAVY", heavy, code, file=sys.stderr)
        """
    )
    assert "HEAVY [] " in result.stderr, result.stderr[-2000:]
    data = json.loads(result.stdout)
    assert data["import_drift"]["import_ok"]  # RoutedExpertsLists is bridged before `import vllm_omni`
    assert data["verdict"]["kind"] in ("works_with_vllm_compat", "will_not_start")
    assert f"HEAVY [] {data['exit_code']}" in result.stderr


def _resolving_beside_the_scans(monkeypatch, resolve_install) -> tuple:
    """check.run on vLLM 0.31.0 + vllm-omni 0.24.0 (wheel paths) with ``resolve_install`` standing in for uv's
    resolution (ours, not vLLM's); the event is set once the behavioural scan has answered."""
    from vllm_compat import check
    from vllm_compat.detect.static import StaticSite

    vllm_wheel, omni_wheel = wheel_or_skip("vllm", "0.31.0"), wheel_or_skip("vllm-omni", "0.24.0")
    scanned = threading.Event()
    kept = StaticSite._kept

    def kept_and_told(site, name, compute):
        value = kept(site, name, compute)
        if name == "behaviour_drift":
            scanned.set()
        return value

    monkeypatch.setattr(StaticSite, "_kept", kept_and_told)
    monkeypatch.setattr(check, "resolve_install", lambda result: resolve_install(result, scanned))
    return check, *check.resolve_inputs([str(vllm_wheel), str(omni_wheel)])


def test_the_resolution_runs_while_the_scans_run(monkeypatch, wheel_cache):
    """uv's resolution waits on the index; the scans parse Python: a cold check takes the longer, not the sum."""
    seen = {}

    def resolve_install(result, scanned):
        seen["in a thread of its own"] = threading.current_thread() is not threading.main_thread()
        if seen["in a thread of its own"]:
            seen["the scan answered meanwhile"] = scanned.wait(timeout=600)
        result.dependencies.not_resolved = "stood in for"

    check, vllm, omni = _resolving_beside_the_scans(monkeypatch, resolve_install)
    result = check.run(vllm, omni, resolve=True)
    assert seen == {"in a thread of its own": True, "the scan answered meanwhile": True}
    assert result.dependencies.not_resolved == "stood in for"  # the thread's result is there when run returns


def test_an_error_in_the_resolution_reaches_the_caller(monkeypatch, wheel_cache):
    def resolve_install(result, scanned):
        raise WheelError("no_network", "the index did not answer")

    check, vllm, omni = _resolving_beside_the_scans(monkeypatch, resolve_install)
    with pytest.raises(WheelError, match="the index did not answer"):
        check.run(vllm, omni, resolve=True)


# ------------------------------------------------------------------------------------------ the cache


def test_cached_wheel_matches_versions_as_pip_does(tmp_path):
    for name in ("vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl", "vllm_omni-0.24.0-py3-none-any.whl",
                 "vllm-0.25.1-cp38-abi3-manylinux_2_28_x86_64.whl", "not-a-wheel.whl"):
        (tmp_path / name).write_bytes(b"")
    assert cached_wheel("vllm", "0.25", tmp_path).name.startswith("vllm-0.25.0-")
    assert cached_wheel("vllm", "0.25.1", tmp_path).name.startswith("vllm-0.25.1-")
    assert cached_wheel("vllm", "0.24.0", tmp_path) is None  # vllm_omni-0.24.0 is another distribution
    assert cached_wheel("vllm-omni", "0.24.0", tmp_path).name.startswith("vllm_omni-")
    assert cached_wheel("vllm", "0.25", tmp_path / "missing") is None


def test_cache_location(monkeypatch, tmp_path):
    env = {"HOME": str(tmp_path)}
    assert wheels.cache_dir({**env, CACHE_VAR: "/x/wheels"}) == Path("/x/wheels")
    assert wheels.cache_dir({**env, "XDG_CACHE_HOME": "/xdg"}) == Path("/xdg/vllm-compat/wheels")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert wheels.cache_dir({}) == tmp_path / ".cache" / "vllm-compat" / "wheels"


def test_concurrent_fetches_leave_one_whole_wheel(tmp_path, wheel_cache):
    if cached_wheel("vllm-omni", "0.24.0", wheel_cache) is None:
        wheel_or_skip("vllm-omni", "0.24.0")  # skips when offline
    results, errors = [], []

    def fetch():
        try:
            results.append(fetch_wheel("vllm-omni", "0.24.0", tmp_path))
        except Exception as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["vllm_omni-0.24.0-py3-none-any.whl"]  # no .partial-* left
    assert zipfile.ZipFile(results[0][0]).testzip() is None
    assert fetch_wheel("vllm-omni", "0.24.0", tmp_path)[1] is True  # now from the cache


# ------------------------------------------------------------------------------------------ bad input


def _fake_tree(root: Path, package: str) -> Path:
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    return root


def test_a_version_that_does_not_exist_lists_the_nearest(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VAR, str(tmp_path / "cache"))
    omni = _fake_tree(tmp_path / "omni", "vllm_omni")  # no download beyond the failing one
    code = main(["check", "vllm==0.24.7", str(omni)])
    err = capsys.readouterr().err
    if "Could not reach the package index" in err or "lists no wheel" in err:
        pytest.skip(f"index unreachable: {err.strip().splitlines()[-1]}")
    assert code == 2
    assert "vllm 0.24.7 does not exist on the index" in err and "nearest versions:" in err
    assert "0.24.0" in err.split("nearest versions:")[1]
    assert not list((tmp_path / "cache").glob("*"))  # the failed download left nothing behind


def test_an_unreachable_index_says_so(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VAR, str(tmp_path / "cache"))
    for name, value in {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
                        "PIP_EXTRA_INDEX_URL": "", "PIP_FIND_LINKS": "", "PIP_RETRIES": "1",
                        "PIP_DEFAULT_TIMEOUT": "5"}.items():
        monkeypatch.setenv(name, value)
    omni = _fake_tree(tmp_path / "omni", "vllm_omni")
    code = main(["check", "vllm==0.24.0", str(omni)])
    err = capsys.readouterr().err
    assert code == 2 and "Could not reach the package index" in err and "pass wheel files" in err
    code = main(["check", "--json", "--newest", str(omni)])
    data = json.loads(capsys.readouterr().out)
    assert code == 2 and data["error"]["kind"] == "no_network"


def test_files_that_are_not_vllm_wheels(capsys, tmp_path):
    other = tmp_path / "requests-2.0.0-py3-none-any.whl"
    with zipfile.ZipFile(other, "w") as zf:
        zf.writestr("requests/__init__.py", "")
    text = tmp_path / "vllm-0.30.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    text.write_text("not a zip")
    omni = _fake_tree(tmp_path / "omni", "vllm_omni")
    assert main(["check", str(other), str(omni)]) == 2
    assert "holds neither vLLM" in capsys.readouterr().err
    assert main(["check", str(text), str(omni)]) == 2
    assert "is not a wheel" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    ([], "name the vLLM to check"),
    (["vllm>=0.30"], "is not one of vllm==VERSION"),
    # any distribution may be a vLLM plugin (issue 40: tpu-inference==0.22.0); without a vLLM it is refused unread
    (["torch==2.13.0"], "name the vLLM to check"),
    (["vllm==0.30.0", "torch>=2.13"], "is not one of vllm==VERSION"),
    (["vllm=="], "names no version"),
    (["vllm==0.30.0", "vllm==0.31.0"], "2 vllm inputs given"),
    (["/nonexistent/vllm.whl"], "does not exist"),
])
def test_usage_errors_exit_2_before_any_download(capsys, monkeypatch, args, message):
    monkeypatch.setattr(wheels, "pip_command", lambda: pytest.fail("a usage error must not reach pip"))
    assert main(["check", *args]) == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------------------ --constraints: the nearest set


def _recorded_set(home: Path, cell_id: str, vllm: str, omni: str, torch: str = "cpu") -> None:
    (home / f"{cell_id}.txt").write_text(f"# cell: {cell_id} (vllm=={vllm} vllm-omni=={omni})\n# torch: {torch}\n"
                                         f"# passed: 2026-12-05\nvllm=={vllm}\nvllm-omni=={omni}\n")


def test_the_nearest_recorded_pair_is_the_same_vllm_omni_on_the_nearest_vllm(tmp_path):
    from vllm_compat.tested_sets import nearest

    _recorded_set(tmp_path, "v0.24-omni0.24", "0.24.0", "0.24.0")
    _recorded_set(tmp_path, "v0.31-omni0.24", "0.31.0", "0.24.0")
    _recorded_set(tmp_path, "v0.33-omni0.30", "0.33.0", "0.30.0")
    _recorded_set(tmp_path, "v0.33-omni0.30-serve", "0.33.0", "0.30.0", torch="pinned")
    (tmp_path / "v0.33.txt").write_text("# cell: v0.33 (vllm==0.33.0)\n# torch: cpu\n# passed: 2026-12-05\nvllm==0.33.0\n")
    assert nearest("0.34.0", "0.24.0", tmp_path).cell == "v0.31-omni0.24"
    assert nearest("0.25.1", "0.24.0", tmp_path).cell == "v0.24-omni0.24"
    assert nearest("0.34.0", "0.30.0", tmp_path).cell == "v0.33-omni0.30-serve"  # pinned torch first
    assert nearest("0.33.0", "0.28.0", tmp_path).cell == "v0.33-omni0.30-serve"  # one vllm-omni minor off beats 4
    assert nearest("0.33.0", "0.26.0", tmp_path).cell == "v0.31-omni0.24"  # as near in vllm-omni: the nearer vLLM
    assert nearest("0.34.0", "0.24.0", tmp_path / "none") is None


def test_constraints_for_a_pair_without_a_set_name_the_nearest_pair_that_has_one(capsys, tmp_path, monkeypatch):
    """Issue 39: ``--constraints`` exited 2 "not recorded" for 0.33.0 + 0.30.0 and 0.34.0 + 0.24.0 with nothing to
    go on. Still exit 2 and nothing written, and the message names the nearest pair with a set and its command."""
    from vllm_compat import tested_sets

    vllm, omni = wheel_or_skip("vllm", "0.31.0"), wheel_or_skip("vllm-omni", "0.24.0")
    monkeypatch.setattr(tested_sets, "HOME", tmp_path / "sets")
    (tmp_path / "sets").mkdir()
    _recorded_set(tmp_path / "sets", "v0.30-omni0.24", "0.30.0", "0.24.0")
    target = tmp_path / "constraints.txt"
    assert main(["check", str(vllm), str(omni), "--constraints", str(target)]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert not target.exists()
    assert ("the nearest pair with a recorded set: vllm==0.30.0 vllm-omni==0.24.0 (cell v0.30-omni0.24, cpu torch, "
            "passed 2026-12-05): vllm-compat check vllm==0.30.0 vllm-omni==0.24.0 --constraints FILE") in err
