"""`import vllm_compat` runs in every worker: it must register the hook and import nothing heavy."""

import pytest

from conftest import OMNI_VERSION, VLLM_VERSION, run_python

HEAVY = ["torch", "vllm", "vllm_omni", "wrapt", "logging", "asyncio", "dataclasses", "inspect", "packaging"]


def test_import_loads_no_heavy_module_and_registers_the_hook():
    result = run_python(
        f"""
        import sys
        before = set(sys.modules)
        import vllm_compat
        loaded = set(sys.modules) - before
        heavy = sorted(m for m in loaded if m.split('.')[0] in {HEAVY!r})
        finders = [type(f).__name__ for f in sys.meta_path if getattr(f, '_vllm_compat_finder', False)]
        print(heavy, finders)
        """,
        env={"VLLM_COMPAT_DISABLE": "1"},  # else the startup hook (tests/test_startup.py) imported it already
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] ['PostImportFinder']"


def test_reimporting_does_not_stack_finders():
    result = run_python(
        """
        import importlib, sys, vllm_compat, vllm_compat.hooks
        importlib.reload(vllm_compat)
        vllm_compat.install_import_hook()
        print(sum(getattr(f, '_vllm_compat_finder', False) for f in sys.meta_path))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"


def test_on_a_bare_interpreter_import_adds_only_our_own_modules():
    """What the startup hook adds to every interpreter: nothing a bare start (no site, so no editable finder or
    other .pth having loaded pathlib, __future__ and the like) has not loaded, but vllm_compat's own modules."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); before = set(sys.modules); import vllm_compat; "
            "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] != 'vllm_compat'))")
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_COMPAT_")}
    result = subprocess.run([sys.executable, "-S", "-c", code, root], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# What the warm static doctor's default screen (`vllm-compat doctor`) leaves unimported, each loaded only on the
# path that needs it: packaging, importlib.metadata and the METADATA parser where the dependency drift is computed
# again (a stamp changed), the drift points (and typing, hashlib with them) where facts are read (--verbose,
# --json) or decided again, the static readers and the RECORD scan where detection runs or --verbose asks, json
# for --json, shutil where help is printed (cli._HelpFormatter). Measured on the warm path before each was made
# lazy (docs/performance.md, issue 34 part 5).
LAZY_FOR_THE_SHORT_DOCTOR = ("packaging", "importlib.metadata", "email.parser", "json", "hashlib", "typing", "shutil",
                             "vllm_compat.detect.requirements", "vllm_compat.detect.wheels",
                             "vllm_compat.detect.file_owners", "vllm_compat.detect.host_index",
                             "vllm_compat.detect.import_graph", "vllm_compat.detect.source_scan",
                             "vllm_compat.detect.code_model", "vllm_compat.detect.behaviour_drift",
                             "vllm_compat.known_clashes", "vllm_compat.tested_overrides")


def _is_lazy(module: str) -> bool:
    # a drift point's module (the packages' own __init__, which the verdict's bridge lookups read, stays)
    return (module.startswith(("vllm_compat.bridges.", "vllm_compat.patches."))
            or any(module == lazy or module.startswith(lazy + ".") for lazy in LAZY_FOR_THE_SHORT_DOCTOR))


@pytest.mark.skipif(VLLM_VERSION is None or OMNI_VERSION is None, reason="needs vLLM and vllm-omni installed")
def test_the_warm_doctors_short_screen_imports_only_what_it_prints():
    """`vllm-compat doctor` on a warm fact cache (the first run here warms it where nothing did: the noxfile's
    doctor before pytest usually has) imports none of ``LAZY_FOR_THE_SHORT_DOCTOR``: they are the report's
    other paths. Counted in a fresh interpreter, against what it loads before the command runs."""
    code = """
        import contextlib, io, sys
        before = set(sys.modules)
        from vllm_compat.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            main(["doctor"])
        added = sorted(set(sys.modules) - before)
        from vllm_compat.detect import fact_cache  # whether this env has a cache key at all (imported after)
        from vllm_compat.detect.source_tree import installed_package_root
        roots = {p: installed_package_root(p) for p in fact_cache.PACKAGES}
        cached = fact_cache.installed_key({p: str(r) if r else None for p, r in roots.items()}) is not None
        print(cached, " ".join(added))
        """
    first = run_python(code)
    assert first.returncode == 0, first.stderr
    loaded = run_python(code)
    assert loaded.returncode == 0, loaded.stderr
    cached, *added = loaded.stdout.split()
    if cached != "True":
        pytest.skip("nothing is cached here (vllm, vllm-omni or torch not installed from a distribution): every "
                    "doctor detects again")
    assert "vllm_compat.reporting" in added  # the count sees the doctor's imports at all
    assert [m for m in added if _is_lazy(m)] == []
