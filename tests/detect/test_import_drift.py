"""Static import drift: vllm-omni's runtime ``from vllm... import X`` checked against the vLLM beside it.

Real packages first (whatever this env installed), then the rules on small synthetic trees.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_vllm, run_python
from tests.support.trees import write_tree
from vllm_compat.detect.import_drift import (
    ImportDrift,
    UnresolvedImport,
    check_import_drift,
    detect_import_drift,
)
from vllm_compat.detect.static import SourceTree

ROUTED = "vllm.v1.outputs.RoutedExpertsLists"
MATRIX = Path(__file__).resolve().parents[2] / "matrix" / "vllm.toml"
both_installed = pytest.mark.skipif(
    VLLM_VERSION is None or OMNI_VERSION is None, reason="needs vLLM and vllm-omni installed (any versions)"
)


def _expected_blockers(vllm: str, omni: str) -> list[str] | None:
    """What the matrix measured from the real wheels (matrix/vllm.toml ``unresolved``); None for pairs it
    does not pin."""
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        tomllib = None
    for cell in tomllib.loads(MATRIX.read_text())["cell"] if tomllib else []:
        if (cell["vllm"], cell.get("vllm_omni")) == (vllm, omni) and "unresolved" in cell:
            return sorted(cell["unresolved"])
    v, o = Version(vllm).release[:2], Version(omni).release[:2]
    if v >= (0, 31) and o <= (0, 30):  # every released vllm-omni on every vLLM without RoutedExpertsLists
        return [ROUTED]
    return None


@both_installed
def test_installed_pair_matches_the_measured_drift():
    drift = detect_import_drift()
    assert drift is not None and drift.files > 500 and drift.checked > 1000
    expected = _expected_blockers(VLLM_VERSION, OMNI_VERSION)
    if expected is None:
        pytest.skip(f"no measured expectation for vLLM {VLLM_VERSION} + vllm-omni {OMNI_VERSION}")
    assert drift.blocking_names == expected
    assert drift.import_ok is (not expected)
    if expected:
        for blocker in drift.blocking:
            assert blocker.importer.startswith("vllm_omni.")
            assert blocker.reason == "name not defined" or blocker.reason.startswith("module not found")


@both_installed
def test_release_pair_resolves_cleanly():
    """A vllm-omni on the vLLM it was released for: not one unresolved import (no false positives)."""
    if Version(VLLM_VERSION).release[:2] != Version(OMNI_VERSION).release[:2]:
        pytest.skip(f"vLLM {VLLM_VERSION} is not the release vllm-omni {OMNI_VERSION} was built for")
    drift = detect_import_drift()
    assert drift.unresolved == (), [u.to_dict() for u in drift.unresolved[:10]]


@both_installed
def test_agrees_with_a_real_import():
    """Static "will not import" <=> ``import vllm_omni`` raises ImportError in a fresh interpreter."""
    drift = detect_import_drift()
    result = run_python(
        """
        try:
            import vllm_omni  # noqa: F401
            print("IMPORTED")
        except ImportError as exc:
            print("FAILED", exc)
        """,
        env={"VLLM_COMPAT_DISABLE": "1"},  # the raw check is about vLLM as it is: no bridge (startup hook) in place
        timeout=600,
        warm=True,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    imported = "IMPORTED" in result.stdout
    assert imported is drift.import_ok, result.stdout
    if not imported:
        # Python names the missing attribute, or the first missing package of a dotted module path.
        parts = [name.split(".") for name in drift.blocking_names]
        said = {p[-1] for p in parts} | {".".join(p[:i]) for p in parts for i in range(2, len(p) + 1)}
        failure = result.stdout.rsplit("FAILED", 1)[-1]
        assert any(f"'{s}'" in failure for s in said), (failure, drift.blocking_names)


@both_installed
def test_is_fast_and_imports_nothing_it_checks():
    result = run_python(
        """
        import json, sys, time
        start, cpu = time.perf_counter(), time.process_time()
        from vllm_compat.detect.import_drift import detect_import_drift
        drift = detect_import_drift()
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
        heavy = sorted(m for m in ("torch", "vllm", "vllm_omni") if m in sys.modules)
        print(json.dumps({"elapsed": elapsed, "cpu": cpu, "heavy": heavy, "files": drift.files}))
        """
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["heavy"] == []
    # ~0.8-1.0 s for vllm-omni's 1600 files on an idle 2-core box. CPU time, not wall time: a loaded CI machine
    # (a matrix running beside it) stretches wall time 3-4x.
    assert data["cpu"] < 2.5, data


@needs_vllm
def test_absent_plugin_is_not_checked(tmp_path):
    assert check_import_drift(SourceTree(tmp_path), SourceTree(tmp_path)) is None


# ------------------------------------------------------------------------------------ synthetic trees


_tree = write_tree


HOST = {
    "vllm/__init__.py": """
        import typing
        if typing.TYPE_CHECKING:
            from vllm.entry import LLM
        else:
            def __getattr__(name):
                raise AttributeError(name)
        """,
    "vllm/v1/__init__.py": "",
    "vllm/v1/outputs.py": """
        from __future__ import annotations
        from typing import NamedTuple
        X = 1
        A, B = 2, 3
        class Kept(NamedTuple):
            a: int
        def helper():
            from vllm.other import Inner  # function-local: binds nothing at module level
        if True:
            Conditional = 1
        try:
            from .fast import Fast
        except ImportError:
            Fast = None
        DOC = '''
        Gone = 1
        '''
        """,
    "vllm/v1/fast.py": "Fast = 1\n",
    "vllm/layers/__init__.py": """
        from .impl import *
        from .explicit import *
        from .linear import (
            Linear as ReLinear,
            Other,
        )
        """,
    "vllm/layers/impl.py": "Public = 1\n_private = 2\n",
    "vllm/layers/explicit.py": "__all__ = ['Listed']\nListed = 1\nUnlisted = 2\n",
    "vllm/layers/linear.py": "Linear = 1\nOther = 2\n",
    "vllm/lazy.py": "def __getattr__(name):\n    return name\n",
}


PLUGIN = {
    "plug/__init__.py": """
        from plug import core
        from .entry import run
        """,
    "plug/core.py": """
        '''Docstring: from vllm.v1.outputs import InDocstring'''
        from typing import TYPE_CHECKING
        import vllm.v1.outputs
        from vllm.v1.outputs import (  # a comment
            X, A, B as Bee,
            Kept,
            Conditional, Fast,
        )
        from vllm.v1 import outputs
        from vllm.layers import ReLinear, Public, Listed, Other
        from vllm.lazy import Anything
        from vllm import LLM
        if TYPE_CHECKING:
            from vllm.v1.outputs import OnlyForTypes
        try:
            from vllm.v1.outputs import Optional1
        except ImportError:
            from vllm.v1.outputs import Optional2
        try:
            from vllm.v1.outputs import Swallowed
        except (ModuleNotFoundError, ImportError):
            pass

        def f():
            from vllm.v1.outputs import Local

        class C:
            from vllm.v1.outputs import InClass
        """,
    "plug/entry.py": """
        if True:
            from vllm.v1.outputs import Gone
        from vllm.layers import _private, Unlisted, Inner
        """,
    "plug/tools/unreached.py": """
        import vllm.missing.module
        from vllm.v1.outputs import AlsoGone
        from vllm.v1.gone_module import Y
        """,
}


@pytest.fixture
def drift(tmp_path) -> ImportDrift:
    host = _tree(tmp_path / "host", HOST)
    plugin = _tree(tmp_path / "plugin", PLUGIN)
    result = check_import_drift(plugin, host, plugin="plug")
    assert result is not None
    return result


def test_rules_on_a_synthetic_tree(drift):
    found = {(u.importer, u.target, u.reason) for u in drift.unresolved}
    assert found == {
        ("plug.entry", "vllm.v1.outputs.Gone", "name not defined"),  # module-level `if`: runs on import
        ("plug.entry", "vllm.layers._private", "name not defined"),  # star imports skip private names
        ("plug.entry", "vllm.layers.Unlisted", "name not defined"),  # ...and names outside __all__
        ("plug.entry", "vllm.layers.Inner", "name not defined"),
        ("plug.tools.unreached", "vllm.missing.module", "module not found (no package vllm.missing)"),
        ("plug.tools.unreached", "vllm.v1.outputs.AlsoGone", "name not defined"),
        ("plug.tools.unreached", "vllm.v1.gone_module", "module not found"),
    }
    # vllm.lazy and vllm/__init__ have a module-level __getattr__: unknown, never missing.
    assert drift.unknown == 2


def test_blocking_is_what_the_package_import_reaches(drift):
    assert drift.blocking_names == ["vllm.layers.Inner", "vllm.layers.Unlisted", "vllm.layers._private",
                                    "vllm.v1.outputs.Gone"]
    assert not drift.import_ok
    data = drift.to_dict()
    assert data["import_ok"] is False and "vllm.v1.outputs.AlsoGone" in data["names"]
    assert {u["importer"] for u in data["blocking"]} == {"plug.entry"}


def test_a_wheel_is_read_like_a_directory(tmp_path):
    import zipfile

    plugin_dir = tmp_path / "plugin"
    _tree(plugin_dir, PLUGIN)
    wheel = tmp_path / "plug-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path in plugin_dir.rglob("*.py"):
            zf.write(path, path.relative_to(plugin_dir).as_posix())
    host = _tree(tmp_path / "host", HOST)
    from_wheel = check_import_drift(SourceTree(wheel), host, plugin="plug")
    from_dir = check_import_drift(SourceTree(plugin_dir), host, plugin="plug")
    assert from_wheel.to_dict() == from_dir.to_dict()


def test_report_says_the_plugin_will_not_import_and_exits_1():
    from vllm_compat.detect.static import detect_static
    from vllm_compat.reporting import Report

    blocker = UnresolvedImport("vllm_omni.core.sched.utils", 7, "vllm.v1.outputs", "RoutedExpertsLists",
                               "name not defined")
    drift = ImportDrift(plugin="vllm_omni", files=1, checked=1, unknown=0, unresolved=(blocker,),
                        blocking=(blocker,))
    report = Report(mode="static", static=detect_static(), patches=[], _import_drift=drift)
    assert report.exit_code == 1
    table = report.render_table()
    assert "WILL NOT IMPORT" in table and ROUTED in table and "vllm_omni.core.sched.utils:7" in table
    assert "WILL NOT START: vllm-omni will not import" in table
    assert report.to_dict()["import_drift"]["blocking_names"] == [ROUTED]
    clean = Report(mode="static", static=detect_static(), patches=[],
                   _import_drift=ImportDrift(plugin="vllm_omni", files=1, checked=1, unknown=0))
    assert clean.exit_code == 0 and "import drift: none" in clean.render_table()


@both_installed
def test_doctor_shows_the_drift_of_this_env():
    result = run_python("from vllm_compat.cli import main; raise SystemExit(main(['doctor', '--json']))", warm=True)
    data = json.loads(result.stdout)
    drift = data["import_drift"]
    assert drift is not None and drift["plugin"] == "vllm_omni"
    assert result.returncode == data["exit_code"]
    if not drift["import_ok"]:
        assert result.returncode == 1
        text = run_python("from vllm_compat.cli import main; raise SystemExit(main(['doctor']))", warm=True)
        assert "WILL NOT IMPORT" in text.stdout and "will not import" in text.stdout


@needs_vllm
def test_installed_drift_is_kept_in_the_one_fact_cache(tmp_path, monkeypatch):
    """doctor's drift of the installed pair is read back from the fact cache (``detect.fact_cache``, the only
    on-disk cache) on a warm run: equal to a fresh check, not recomputed."""
    from vllm_compat.detect import import_drift as drift_module
    from vllm_compat.detect.source_tree import tree_of
    from vllm_compat.detect.static import StaticSite

    monkeypatch.setenv("VLLM_COMPAT_CACHE_DIR", str(tmp_path))
    fresh = check_import_drift(tree_of("vllm_omni"), tree_of("vllm"))
    assert detect_import_drift() == fresh
    assert StaticSite.installed().installed_import_drift() == fresh
    if not list((tmp_path / "facts").glob("*.pickle")):
        pytest.skip("vllm, vllm-omni or torch is not installed from a distribution here: nothing is cached")
    assert not (tmp_path / "drift").exists()  # no second cache
    calls = []
    monkeypatch.setattr(drift_module, "detect_import_drift", lambda *a, **k: calls.append(1) or fresh)
    assert StaticSite.installed().installed_import_drift() == fresh and calls == []


# ------------------------------------------------------------------- guards and else branches, one rule each

GUARDS = {
    "plug/__init__.py": """
        try:
            from vllm.v1.outputs import ByException
        except Exception:
            ByException = None
        try:
            from vllm.v1.outputs import ByBaseException
        except BaseException:
            pass
        try:
            from vllm.v1.outputs import ByBare
        except:  # noqa: E722
            pass
        try:
            from vllm.v1.outputs import ByTuple
        except (ValueError, ModuleNotFoundError):
            pass
        try:
            from vllm.v1.outputs import NotCaught
        except ValueError:
            pass
        try:
            from vllm.v1.outputs import ReRaised
        except ModuleNotFoundError as exc:
            if exc.name != "vllm":
                raise
        try:
            from vllm.v1.outputs import ReRaisedOnOneLine
        except ImportError: raise
        try:
            import json
        except ImportError:
            pass
        else:
            from vllm.v1.outputs import InTryElse
        from typing import TYPE_CHECKING
        if TYPE_CHECKING:
            from vllm.v1.outputs import TypesOnly
        else:
            from vllm.v1.outputs import InTypeCheckingElse
        if json:
            pass
        else:
            from vllm.v1.outputs import InIfElse
        """,
}


def test_which_handlers_guard_an_import_and_which_else_branches_run(tmp_path):
    """An import in a ``try`` whose handler catches ImportError or a parent (``Exception``, ``BaseException``, bare)
    without raising is optional; one whose handlers do not catch it, or re-raise, runs unguarded; every ``else:``
    branch runs (of a try, of ``if TYPE_CHECKING``, of a plain ``if``). Each name below is one rule: a mutant
    of any one changes the set."""
    host = _tree(tmp_path / "host", HOST)
    drift = check_import_drift(_tree(tmp_path / "plugin", GUARDS), host, plugin="plug")
    assert drift.blocking_names == sorted(f"vllm.v1.outputs.{name}" for name in (
        "NotCaught", "ReRaised", "ReRaisedOnOneLine", "InTryElse", "InTypeCheckingElse", "InIfElse"))


def test_guards_on_the_real_vllm_omni_package_import(tmp_path):
    """vllm-omni's own ``__init__`` imports ``from . import patch`` under ``except ModuleNotFoundError`` whose body
    re-raises unless vLLM itself is missing: the patch module runs, so it is followed (the scan reads the real wheel's
    ``__init__`` when one is cached here)."""
    import glob
    import os

    from vllm_compat.detect.source_scan import plugin_imports
    from vllm_compat.detect.wheels import cache_dir

    wheels = sorted(glob.glob(os.path.join(cache_dir(), "vllm_omni-0.24.0-*.whl")))
    if not wheels:
        pytest.skip("no vllm-omni 0.24.0 wheel in the check's wheel cache (vllm-compat check fetches it)")
    contexts = {(module, tuple(names)): context
                for _, _, module, names, context in plugin_imports(SourceTree(Path(wheels[0])), "vllm_omni/__init__.py",
                                                                   "vllm_omni")}
    assert contexts[(None, ("patch",))] == "module"


GATES_HOST = {
    "vllm/__init__.py": "",
    "vllm/utils/__init__.py": """
        _DEPRECATED = {
            "kept": "math_utils",
        }
        def __getattr__(name):
            '''Deprecated names, as vLLM 0.11.1's vllm.utils answers them.'''
            if name in _DEPRECATED:
                return 1
            elif name == "also_kept" or name in ("third",):
                return 2
            raise AttributeError(name)
        """,
    "vllm/open.py": """
        def __getattr__(name):
            if name.startswith("x"):
                return 1
            raise AttributeError(name)
        """,
    "vllm/events.py": '''
        def send():
            # the end marker (-1, b""")
            return 1
        class AfterTheComment:
            pass
        ''',
}

GATES_PLUGIN = {
    "plug/__init__.py": """
        from vllm.utils import kept, also_kept, third, gone
        from vllm.open import xanything, other
        from vllm.events import AfterTheComment
        from plug.version import vllm_version_is
        _V2_SUPPORTED = not vllm_version_is("0.20.2")
        if not vllm_version_is("0.20.2"):
            from vllm.utils import GatedIf
        elif vllm_version_is("0.20.1"):
            from vllm.utils import GatedElif
        else:
            from vllm.utils import GatedElse
        if _V2_SUPPORTED:
            from vllm.utils import GatedByFlag
        version = None
        if version is None:
            from vllm.utils import NotAVersionTest
        """,
    "plug/version.py": "def vllm_version_is(v):\n    return False\n",
}


def test_literal_getattr_mappings_version_gates_and_triple_quotes_in_comments(tmp_path):
    """Each name is one rule: a ``__getattr__`` answering a literal mapping / ``==`` / tuple and raising for the rest
    makes any other name missing (``gone``; vLLM 0.11.1's ``vllm.utils``, tpu-inference#944); one that computes its
    answer stays unknown (``xanything``, ``other``); an import under an ``if`` / ``elif`` / ``else`` on the running
    version, or on a module flag set from one, runs only where the version says (vllm-ascend 0.20.2rc1 on its own
    vLLM 0.20.2), while ``if version is None`` is no version test; a triple quote inside a comment opens no string
    (vLLM 0.11.0's ``kv_events.py`` hid ``EventPublisherFactory`` that way)."""
    host = _tree(tmp_path / "host", GATES_HOST)
    drift = check_import_drift(_tree(tmp_path / "plugin", GATES_PLUGIN), host, plugin="plug")
    assert drift.blocking_names == ["vllm.utils.NotAVersionTest", "vllm.utils.gone"]
    assert drift.unknown == 2
