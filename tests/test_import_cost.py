"""`import vllm_compat` runs in every worker: it must register the hook and import nothing heavy."""

from conftest import run_python

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
