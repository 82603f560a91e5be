"""Test sessions over real vLLM / vllm-omni releases, built from matrix/vllm.toml.

    nox -s tests          the default cells (CI)
    nox -s "cell(ID)"     one matrix cell, any release (`nox -l` lists every cell id)
    nox -s rotation       CI's rotating share of the other cells (VLLM_COMPAT_ROTATION a run, by commit count)
    nox -s matrix         every cell, one after another, ending with a table (also in matrix/last-run.md)
    nox -s refresh        add cells for new vLLM releases on the index, re-measure every cell's expectations
    nox -s native         record each vllm-omni's diffusion path on its own vLLM (matrix/native/, checked in)
    nox -s "peer(ID)"     vllm-omni's own CPU tests (peer/, unchanged) in one cell; every cell run includes them
    nox -s lint           ruff
    nox -s bench          benchmarks (bench/run.py), off by default

`matrix` picks cells with VLLM_COMPAT_CELLS="id,id" (default: all), passes posargs to pytest, and deletes each
cell's venv after it ran unless VLLM_COMPAT_MATRIX_KEEP=1 (a cell env is 6-7 GB before uv's hardlinks).

Torch: vLLM wheels pin an exact CUDA torch. On a CPU machine we override it with the CPU build named by
VLLM_COMPAT_TORCH (default "2.13.0", looked up in VLLM_COMPAT_FIND_LINKS, default /opt/wheels when it exists).
Set VLLM_COMPAT_TORCH=pinned on a GPU machine to keep vLLM's own pin.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import nox
import tomllib

nox.options.default_venv_backend = "uv"
nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True

ROOT = Path(__file__).parent
CELLS = tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]
DEFAULT_CELLS = [c for c in CELLS if c.get("default")]
# PyPI's torchvision/torchaudio/torchcodec fail to import beside a CPU torch override; transformers and
# diffusers work without them.
BROKEN_BESIDE_CPU_TORCH = ["torchvision", "torchaudio", "torchcodec"]
# pytest-xdist: one worker per core (VLLM_COMPAT_TEST_WORKERS=N, or 0 for none), whole files per worker so a
# module's fixtures (the diffusion-path record, the HSDP runs) are built once. Each worker has its own warm
# server for its subprocess checks (tests/support/warm_python.py).
TEST_WORKERS = ["-n", os.environ.get("VLLM_COMPAT_TEST_WORKERS", "auto"), "--dist", "loadfile"]


def _torch(cell: dict) -> str:
    """The cell's torch: its own ``torch`` key ("pinned": vLLM's own CUDA torch, torchvision and torchaudio kept, as
    the serve cells need: vllm-omni's server imports both), else VLLM_COMPAT_TORCH (default the CPU build)."""
    return cell.get("torch") or os.environ.get("VLLM_COMPAT_TORCH", "2.13.0")


def _override_args(session: nox.Session, cell: dict) -> list[str]:
    """uv's --override file: the CPU torch (unless VLLM_COMPAT_TORCH=pinned) and the cell's own ``overrides``
    (resolver conflicts between a vLLM and a vllm-omni), ``breakage_overrides`` (resolver-made breakage: two
    distributions owning one file) and ``index_overrides`` (what this machine's index lacks),
    each with its reason in matrix/vllm.toml."""
    torch = _torch(cell)
    lines = list(cell.get("overrides", [])) + [o["line"] for o in (*cell.get("index_overrides", []),
                                                                   *cell.get("breakage_overrides", []))]
    args = []
    if torch != "pinned":
        lines.append(f"torch=={torch}")
        args += ["--index-strategy", "unsafe-best-match"]
        find_links = os.environ.get("VLLM_COMPAT_FIND_LINKS", "/opt/wheels")
        if Path(find_links).exists():
            args += ["--find-links", find_links]
    if not lines:
        return args
    overrides = Path(session.create_tmp()) / f"overrides-{cell['id']}.txt"
    overrides.write_text("".join(f"{line}\n" for line in lines))
    return ["--override", str(overrides), *args]


def _requirements(cell: dict) -> list[str]:
    """What a cell installs: its vLLM, its vllm-omni, this checkout with the test extras."""
    packages = [f"vllm=={cell['vllm']}"] + ([f"vllm-omni=={cell['vllm_omni']}"] if cell.get("vllm_omni") else [])
    return [*packages, "-e", ".[test]"]


def _constraint_args(cell: dict) -> list[str]:
    """``-c`` the set the cell last passed with (vllm_compat/tested_sets/, issue 33), so a CI run installs what was
    tested, not today's resolution; none where none is recorded or VLLM_COMPAT_FRESH_RESOLVE=1 (refresh)."""
    recorded = ROOT / "vllm_compat" / "tested_sets" / f"{cell['id']}.txt"
    if os.environ.get("VLLM_COMPAT_FRESH_RESOLVE") == "1" or not recorded.is_file():
        return []
    return ["-c", str(recorded)]


def _install(session: nox.Session, cell: dict, python: str) -> None:
    """Install the cell into the env of interpreter ``python``: its requirements with its overrides and tested
    set; a CPU-torch cell without the three that fail beside it; overlays the install order broke reinstalled."""
    session.run("uv", "pip", "install", "-q", "--python", python, *_requirements(cell),
                *_override_args(session, cell), *_constraint_args(cell), external=True)
    if _torch(cell) != "pinned":
        session.run("uv", "pip", "uninstall", "-q", "--python", python, *BROKEN_BESIDE_CPU_TORCH, external=True,
                    silent=True)
    _reinstall_lost_overlays(session, python)


def _install_cell(session: nox.Session, cell: dict) -> None:
    _install(session, cell, _session_python(session))


def _session_python(session: nox.Session) -> str:
    return os.path.join(session.virtualenv.location, "bin", "python")


REINSTALL_QUERY = ("from vllm_compat.dependency_drift import file_clashes_dict; "
                   "from vllm_compat.detect.file_owners import find_file_clashes; "
                   "print(' '.join(file_clashes_dict(find_file_clashes())['reinstall']))")


def _reinstall_lost_overlays(session: nox.Session, python: str) -> None:
    """uv unpacks wheels in parallel: where one distribution overlays another's files by design
    (vllm_compat/known_clashes.py rows with ``wins``), either's bytes may end on disk (CI's v0.24-omni0.24 env had
    nvidia-cutlass-dsl-libs-base's, this machine's libs-cu13's). Reinstall the overlay the doctor names."""
    output = session.run(python, "-c", REINSTALL_QUERY, silent=True, external=True)
    lost = output.splitlines()[-1].split() if output.strip() else []  # stderr (log lines) comes first
    if lost:
        session.log(f"reinstalling overlays whose files the install order overwrote: {' '.join(lost)}")
        session.run("uv", "pip", "install", "-q", "--python", python, "--reinstall", "--no-deps", *lost,
                    external=True)


def _record_set(session: nox.Session, cell: dict, python: str) -> None:
    """VLLM_COMPAT_RECORD_SETS=1, after the cell passed: write the exact set it passed with
    (matrix/tested_sets.py record)."""
    if os.environ.get("VLLM_COMPAT_RECORD_SETS") == "1":
        session.run(python, "matrix/tested_sets.py", "record", cell["id"], "--python", python, external=True)


def _cell_env(cell: dict) -> dict:
    """The VLLM_COMPAT_EXPECT_* variables tests/test_matrix_consistency.py checks the cell against."""
    expect = cell.get("expect", {})
    env = {f"VLLM_COMPAT_EXPECT_{key.upper()}": value for key, value in expect.items()}
    if "unresolved" in cell:
        env["VLLM_COMPAT_EXPECT_UNRESOLVED"] = ",".join(cell["unresolved"])
        env["VLLM_COMPAT_EXPECT_BRIDGED"] = ",".join(cell.get("bridged", []))
        env["VLLM_COMPAT_EXPECT_WORKER_UNRESOLVED"] = ",".join(cell.get("worker_unresolved", []))
    if "entrypoints" in cell:  # per entrypoint: works / works_with_vllm_compat / will_not_start / absent
        env["VLLM_COMPAT_EXPECT_ENTRYPOINTS"] = ",".join(f"{k}={v}" for k, v in cell["entrypoints"].items())
    env["VLLM_COMPAT_CELL"] = cell["id"]
    if cell.get("plugin_tests"):  # tests/plugins read the plugins' releases here, fetching what is not cached
        env["VLLM_COMPAT_FETCH_PLUGIN_RELEASES"] = "1"
    # Let the cell's interpreters write bytecode (empty = unset for Python): uv installs none, and where the
    # environment sets PYTHONDONTWRITEBYTECODE (these CI machines do) every new interpreter compiled vLLM and
    # vllm-omni again: importing vllm-omni's loader took 62 s of CPU without .pyc files, 31 s with (vLLM 0.30).
    env["PYTHONDONTWRITEBYTECODE"] = ""
    # tests/test_scan.py downloads real wheels (one vLLM wheel, ~300 MB): once for all cells, not per cell.
    env["VLLM_COMPAT_WHEEL_CACHE"] = os.environ.get("VLLM_COMPAT_WHEEL_CACHE", str(ROOT / ".nox" / "wheels"))
    return env


def _run_cell(session: nox.Session, cell: dict) -> None:
    """Install the cell, print the doctor, run the whole suite with the cell's expectations, then vllm-omni's own
    tests where peer/ holds its release's."""
    _install_cell(session, cell)
    env = _cell_env(cell)
    session.run("python", "-m", "vllm_compat", "doctor", env=env, success_codes=[0, 1, 3])
    session.run("pytest", "--strict-markers", *TEST_WORKERS, *session.posargs, env=env)
    _run_peer(session, cell)
    _record_set(session, cell, _session_python(session))


# the releases peer/ holds tests and a native record for (peer/run.py judges against the record)
PEER_RELEASES = {path.name.removeprefix("vllm-omni-").removesuffix(".native.toml")
                 for path in (ROOT / "peer").glob("vllm-omni-*.native.toml")}
PEER_CELLS = [c for c in CELLS if c.get("vllm_omni") in PEER_RELEASES and _torch(c) != "pinned"]


def _run_peer(session: nox.Session, cell: dict) -> None:
    """vllm-omni's own CPU tests (peer/vllm-omni-RELEASE/, stored unchanged) in the cell: with vllm_compat off on
    the release's own vLLM (the reference, peer/vllm-omni-RELEASE.native.toml), with it on elsewhere; fails on a
    test that fails here and not natively (peer/run.py). CPU-torch cells only: the reference was measured there."""
    if cell not in PEER_CELLS:
        return
    python = _session_python(session)
    session.run("uv", "pip", "install", "-q", "--python", python, "-e", ".[test,peer]", *_constraint_args(cell),
                external=True)
    session.run(python, "peer/run.py", "--python", python, "--release", cell["vllm_omni"], "--cell", cell["id"],
                "--suite", "core", *(["--native"] if cell.get("native") else []), external=True,
                env={"PYTHONDONTWRITEBYTECODE": ""})


@nox.session(name="peer")
@nox.parametrize("cell", PEER_CELLS, ids=[c["id"] for c in PEER_CELLS])
def peer(session: nox.Session, cell: dict) -> None:
    """vllm-omni's own CPU tests alone in one cell (peer/): nox -s "peer(v0.33-omni0.24)"."""
    _install_cell(session, cell)
    _run_peer(session, cell)


@nox.session(name="tests")
@nox.parametrize("cell", DEFAULT_CELLS, ids=[c["id"] for c in DEFAULT_CELLS])
def tests(session: nox.Session, cell: dict) -> None:
    """Full test suite on the default matrix cells (the ones CI runs)."""
    _run_cell(session, cell)


@nox.session(name="cell")
@nox.parametrize("cell", CELLS, ids=[c["id"] for c in CELLS])
def one_cell(session: nox.Session, cell: dict) -> None:
    """Full test suite on one matrix cell, any release: nox -s "cell(v0.31-omni0.24)" (nox -l lists them)."""
    _run_cell(session, cell)


def _junit_counts(path: Path) -> dict:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {"passed": 0, "failed": 0, "skipped": 0}
    suites = [root] if root.tag == "testsuite" else list(root)
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return {"passed": total - failed - skipped, "failed": failed, "skipped": skipped}


def _matrix_cell(session: nox.Session, cell: dict, workdir: Path) -> dict:
    """Build the cell's venv with uv, run doctor --json and pytest in it; the row of the final table."""
    venv = workdir / cell["id"]
    python = str(venv / "bin" / "python")
    row = {"cell": cell["id"], "ok": False}
    started = time.monotonic()
    cold = not venv.exists()
    try:
        if cold:
            session.run("uv", "venv", "-q", "-p", "3.11", str(venv), external=True)
        _install(session, cell, python)
    except nox.command.CommandFailed as exc:
        row.update(error=f"install failed: {exc.reason}", build_s=time.monotonic() - started, test_s=0.0)
        return row
    row["build_s"] = time.monotonic() - started
    row["build"] = "cold" if cold else "warm"
    diffusion_path = workdir / f"{cell['id']}.diffusion-path.json"
    diffusion_path.unlink(missing_ok=True)
    env = {**os.environ, **_cell_env(cell), "VLLM_COMPAT_DIFFUSION_PATH_OUT": str(diffusion_path)}
    session.run(python, "-m", "vllm_compat", "doctor", env=env, external=True, success_codes=[0, 1, 3])
    import subprocess

    # stdout alone: doctor keeps it for the JSON (vLLM's own output goes to stderr), so it parses whole.
    doctor = subprocess.run([python, "-m", "vllm_compat", "doctor", "--json"], env=env, capture_output=True,
                            text=True)
    try:
        data = json.loads(doctor.stdout)
        drift = data.get("import_drift")
        row.update(
            level=data["vllm"]["level"], loader=data["vllm_omni"]["loader_kind"],
            decision=_decisions_cell(data["patches"]),
            drift="-" if drift is None else _drift_cell(drift), verdict=data["verdict"]["kind"],
            entrypoints="-" if drift is None else _entrypoints_cell(drift),
        )
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        row["error"] = f"doctor --json unreadable: {exc}"
    junit = workdir / f"{cell['id']}.junit.xml"
    test_started = time.monotonic()
    try:
        session.run(python, "-m", "pytest", "--strict-markers", "-q", f"--junitxml={junit}", *TEST_WORKERS,
                    *session.posargs, env=env, external=True)
        row["ok"] = "error" not in row
        if row["ok"]:
            _record_set(session, cell, python)
    except nox.command.CommandFailed:
        pass
    row["test_s"] = time.monotonic() - test_started
    row.update(_junit_counts(junit))
    row["diffusion_path"] = _diffusion_path_cell(cell, diffusion_path)
    return row


def _decisions_cell(decisions: list[dict]) -> str:
    """The matrix table's decisions column: every catalogue entry doctor did not skip or leave pending."""
    acted = [f"{d['name']} {d['action']}" + (f"/{d['variant']}" if d["variant"] else "")
             for d in decisions if d["action"] not in ("skipped", "pending")]
    return ", ".join(acted) or "none (all skipped or pending)"


def _diffusion_path_cell(cell: dict, summary: Path) -> str:
    """The matrix table's "diffusion path" column, from tests/bridges/test_diffusion_path.py's summary."""
    if not cell.get("vllm_omni"):
        return "-"
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError):
        return "not run (see the test's skip reason)"
    if data["import_error"]:
        return f"differs: vllm_omni does not import ({data['import_error']})"
    if data["models"]:
        more = f" (+{len(data['models']) - 1} more)" if len(data["models"]) > 1 else ""
        return f"differs: {data['models'][0]}{more}"
    if data["modules"]:
        names = ", ".join(name.rsplit(".", 1)[-1] for name in data["reported_unbridged"]) or "unexplained"
        return f"models native-equal; {len(data['modules'])} module(s) differ (unbridged: {names})"
    return f"native-equal ({data['native']})"


def _drift_cell(drift: dict) -> str:
    """The matrix table's import-drift column: what vLLM lacks, and what of it still stops vllm-omni."""
    if drift["ok"]:
        return "clean"
    short = lambda names: ", ".join(n.rsplit(".", 1)[-1] for n in names)  # noqa: E731
    if not drift["import_ok"]:
        return "WILL NOT IMPORT: " + short(drift["still_blocking_names"])
    if not drift["worker_ok"]:
        return f"{len(drift['unresolved'])} unresolved; WORKER WILL NOT START: " + short(
            drift["still_worker_blocking_names"])
    bridged = f", bridged: {short(drift['bridged'])}" if drift["bridged"] else ""
    return f"{len(drift['unresolved'])} unresolved{bridged}"


def _entrypoints_cell(drift: dict) -> str:
    """The matrix table's entrypoint column: each entrypoint's status in doctor's --json, in the table's order."""
    short = {"works": "works", "works_with_vllm_compat": "with vllm_compat", "will_not_start": "WILL NOT START",
             "fails_on_request": "FAILS ON REQUEST", "left_out": "left out", "absent": "absent"}
    # a status this table does not know yet is shown as doctor wrote it, never a failed cell
    return " / ".join(short.get(e["status"], e["status"]) for e in drift.get("entrypoints", {}).values()) or "-"


def _render_matrix(rows: list[dict]) -> str:
    header = ["cell", "level", "loader kind", "decisions", "import drift",
              "offline / serve / diffusion stage / LLM-AR stages",
              "verdict", "diffusion path",
              "tests passed/failed/skipped", "seconds (build+tests)", "result"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        tests = f"{r.get('passed', 0)}/{r.get('failed', 0)}/{r.get('skipped', 0)}" if "passed" in r else "-"
        seconds = f"{r.get('build_s', 0):.0f} ({r.get('build', '-')}) + {r.get('test_s', 0):.0f}"
        lines.append("| " + " | ".join([
            r["cell"], r.get("level", "-"), r.get("loader", "-"), r.get("decision", "-"), r.get("drift", "-"),
            r.get("entrypoints", "-"),
            r.get("verdict", "-"), r.get("diffusion_path", "-"), tests, seconds, "ok" if r["ok"] else f"FAIL{': ' + r['error'] if r.get('error') else ''}",
        ]) + " |")
    return "\n".join(lines)


def _run_matrix(session: nox.Session, cells: list[dict], title: str) -> list[str]:
    """Each cell in a venv of its own, one after another (deleted afterwards unless VLLM_COMPAT_MATRIX_KEEP=1),
    ending with a table, also written to matrix/last-run.md after every cell (a long run leaves a partial one);
    returns the ids of the cells that failed."""
    workdir = ROOT / ".nox" / "matrix-cells"
    workdir.mkdir(parents=True, exist_ok=True)
    keep = os.environ.get("VLLM_COMPAT_MATRIX_KEEP") == "1"
    rows = []
    for cell in cells:
        session.log(f"=== cell {cell['id']}: vllm {cell['vllm']}, vllm-omni {cell.get('vllm_omni', '-')} ===")
        rows.append(_matrix_cell(session, cell, workdir))
        if not keep:
            shutil.rmtree(workdir / cell["id"], ignore_errors=True)
        table = _render_matrix(rows)
        (ROOT / "matrix" / "last-run.md").write_text(f"# {title}, {time.strftime('%Y-%m-%d %H:%M')}\n\n{table}\n")
    print(table)
    return [r["cell"] for r in rows if not r["ok"]]


def _fail_on(session: nox.Session, failed: list[str]) -> None:
    if failed:
        session.error(f"cells failed: {', '.join(failed)}")


@nox.session(python=False)
def matrix(session: nox.Session) -> None:
    """Full test suite on every matrix cell (or VLLM_COMPAT_CELLS), ending with a table in matrix/last-run.md."""
    wanted = [c for c in os.environ.get("VLLM_COMPAT_CELLS", "").split(",") if c]
    unknown = set(wanted) - {c["id"] for c in CELLS}
    if unknown:
        session.error(f"unknown cells {sorted(unknown)}; known: {[c['id'] for c in CELLS]}")
    _fail_on(session, _run_matrix(session, [c for c in CELLS if not wanted or c["id"] in wanted], "nox -s matrix"))


def _rotation_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("matrix_rotation", ROOT / "matrix" / "rotation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# `rotation = false`: a cell listed (nox -l, the GitHub workflow) whose whole suite has not passed here yet; CI's
# rotation leaves it out until a run confirms it (matrix/vllm.toml says why per cell).
ROTATING_CELLS = [c for c in CELLS if _rotation_module().rotates(c)]


def rotation_share(seed: int, per_run: int) -> list[dict]:
    """The ``per_run`` non-default cells for submission number ``seed`` (matrix/rotation.py: dealt by stride, so
    every cell runs once in every ceil(len(ROTATING_CELLS) / per_run) submissions and neighbours in the file, such
    as the serve cells, land in different runs)."""
    return _rotation_module().rotation_share(ROTATING_CELLS, seed, per_run)


@nox.session(python=False)
def rotation(session: nox.Session) -> None:
    """CI's share of the non-default cells (VLLM_COMPAT_ROTATION cells, default 3), picked by the commit count."""
    import subprocess

    per_run = int(os.environ.get("VLLM_COMPAT_ROTATION", "3"))
    seed = os.environ.get("VLLM_COMPAT_ROTATION_SEED") or subprocess.run(
        ["git", "rev-list", "--count", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip() or "0"
    cells = rotation_share(int(seed), per_run)
    if not cells:
        session.skip(f"no rotating cells (VLLM_COMPAT_ROTATION={per_run}, {len(ROTATING_CELLS)} non-default cells)")
    session.log(f"rotation {seed}: {', '.join(c['id'] for c in cells)} (every cell once in "
                f"{_rotation_module().rotation_period(len(ROTATING_CELLS), per_run)} submissions)")
    _fail_on(session, _run_matrix(session, cells, f"nox -s rotation (seed {seed})"))


NATIVE_CELLS = [c for c in CELLS if c.get("native")]


@nox.session(name="native")
@nox.parametrize("cell", NATIVE_CELLS, ids=[c["id"] for c in NATIVE_CELLS])
def native(session: nox.Session, cell: dict) -> None:
    """Record what each vllm-omni release's diffusion path does on its own vLLM (matrix/native/, checked in):
    the reference tests/bridges/test_diffusion_path.py holds every other cell to."""
    _install_cell(session, cell)
    out = ROOT / "matrix" / "native" / f"vllm-omni-{cell['vllm_omni']}.json"
    session.run("python", "-m", "tests.support.diffusion_path", str(out), env={"VLLM_COMPAT_CELL": cell["id"]})


@nox.session
def refresh(session: nox.Session) -> None:
    """New vLLM releases on the index -> their cells and drift; then every cell's expectations re-measured from the
    release wheels (posargs: --write, --no-intake, cell ids; docs/new-vllm-release.md); then the recorded tested
    sets re-resolved, the cells whose set moved re-run and re-recorded where they pass (--no-sets skips it)."""
    session.install("pip", "-e", ".")
    args = [arg for arg in session.posargs if arg != "--no-sets"]
    failed = []
    if "--no-sets" not in session.posargs:
        wanted = [arg for arg in args if not arg.startswith("-")]
        failed = _refresh_sets(session, [c for c in CELLS if not wanted or c["id"] in wanted])
    session.run("python", "matrix/refresh.py", *args)
    if failed:
        session.error(f"cells whose tested set moved failed on the fresh resolution (old sets kept): {failed}")


def _refresh_sets(session: nox.Session, cells: list[dict]) -> list[str]:
    """Each cell's install resolved afresh (``uv pip compile``, the same requirements and overrides, no tested set),
    compared with its recorded set (matrix/tested_sets.py moved: what moved, per cell); the cells whose set moved
    run their whole suite on the fresh resolution, and each that passes is recorded anew. A failing one keeps its
    old file and is returned (the session fails naming it)."""
    compiled = []
    for cell in cells:
        if not (ROOT / "vllm_compat" / "tested_sets" / f"{cell['id']}.txt").is_file():
            session.log(f"{cell['id']}: no recorded set (VLLM_COMPAT_RECORD_SETS=1 nox -s \"cell({cell['id']})\")")
            continue
        out = Path(session.create_tmp()) / f"compiled-{cell['id']}.txt"
        out.unlink(missing_ok=True)  # uv pip compile prefers the versions of an existing output file
        requirements = Path(session.create_tmp()) / f"requirements-{cell['id']}.txt"
        packages = _requirements(cell)[:-2]  # the checkout by its absolute path: a requirements file is elsewhere
        requirements.write_text("".join(f"{line}\n" for line in [*packages, f"-e {ROOT}[test]"]))
        try:
            session.run("uv", "pip", "compile", "-q", "--python-version", "3.11", "--no-header", "--no-annotate",
                        str(requirements), *_override_args(session, cell), "-o", str(out), external=True)
        except nox.command.CommandFailed:  # uv printed why (a pin the index lacks, a conflict): nothing to run
            session.warn(f"{cell['id']}: its install does not resolve today; its recorded set is kept")
            continue
        compiled.append(f"{cell['id']}={out}")
    if not compiled:
        return []
    report = session.run("python", "matrix/tested_sets.py", "moved", *compiled, silent=True)
    print(report)
    moved = report.strip().splitlines()[-1].removeprefix("moved:").split()
    if not moved:
        return []
    os.environ.update(VLLM_COMPAT_FRESH_RESOLVE="1", VLLM_COMPAT_RECORD_SETS="1")
    return _run_matrix(session, [c for c in cells if c["id"] in moved], "nox -s refresh: cells whose tested set moved")


@nox.session(python=False)
def lint(session: nox.Session) -> None:
    """ruff over the package, tests, matrix/ and this file."""
    session.run("uvx", "ruff", "check", "vllm_compat", "tests", "noxfile.py", "matrix")


@nox.session(name="bench")
def bench(session: nox.Session) -> None:
    """Benchmarks (bench/run.py) on vLLM 0.30.0 + vllm-omni 0.30.0; prints the table, writes bench/results.md."""
    cell = next(c for c in CELLS if c["id"] == "v0.30-omni0.30")
    _install_cell(session, cell)
    session.run("python", "bench/run.py", *session.posargs)


@nox.session(name="mutants")
def mutants(session: nox.Session) -> None:
    """Mutation testing (mutmut) of the drift-point and decision modules on v0.30-omni0.24; not in CI (docs/mutation.md)."""
    cell = next(c for c in CELLS if c["id"] == "v0.30-omni0.24")
    _install_cell(session, cell)
    session.install("mutmut==3.8.1")
    session.run("python", "mutation/run.py", *session.posargs, env=_cell_env(cell))
