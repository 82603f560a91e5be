"""``vllm_compat.hooks``: the first-import hook that registers the catalogue's hooks before vLLM is looked up, and
what ``vllm_compat`` does with it. Each check runs in a fresh interpreter with the startup hook off, on a throwaway
package the check writes itself."""

import json

from conftest import run_python

PACKAGE = """
    import json, os, sys, tempfile, threading, time
    root = tempfile.mkdtemp()
    os.makedirs(os.path.join(root, "served", "sub"))
    open(os.path.join(root, "served", "__init__.py"), "w").write("import time; time.sleep(0.01)\\n")
    open(os.path.join(root, "served", "sub", "__init__.py"), "w").write("")
    sys.path.insert(0, root)
    from vllm_compat import hooks
    seen = []
"""
NO_STARTUP = {"VLLM_COMPAT_DISABLE": "1"}


def _run(code: str) -> dict:
    result = run_python(PACKAGE + code, env=NO_STARTUP)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_runs_once_before_the_first_module_of_the_package_is_looked_up():
    out = _run("""
    def on_first_import(package):
        seen.append([package, "served" in sys.modules, "served.sub" in sys.modules])
        hooks.register_post_import_hook("served.sub", lambda module: seen.append(module.__name__))
    hooks.register_first_import_hook("served", on_first_import)
    hooks.register_first_import_hook("served", on_first_import)  # the same callback: no-op
    import served.sub
    import importlib; importlib.reload(served)
    print(json.dumps(seen))
    """)
    # before anything of it was imported; its post-import hook (registered there) fired for the submodule; once
    assert out == [["served", False, False], "served.sub"]


def test_an_already_imported_package_gets_the_callback_at_once():
    out = _run("""
    import served
    hooks.register_first_import_hook("served", seen.append)
    print(json.dumps(seen))
    """)
    assert out == ["served"]


def test_another_thread_looking_the_package_up_waits_for_the_callbacks():
    out = _run("""
    import importlib.util
    finder = hooks._finder()
    def slow(package):
        time.sleep(0.3)
        hooks.register_post_import_hook("served.sub", lambda module: None)
        seen.append("callback")
    def look_up():
        importlib.util.find_spec("served")
        seen.append("served.sub" in finder._vllm_compat_callbacks)
    hooks.register_first_import_hook("served", slow)
    threads = [threading.Thread(target=look_up) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps(seen))
    """)
    # one thread ran the callback; every thread's lookup returned after it had registered its hook
    assert out == ["callback", True, True, True, True]


def test_a_callback_that_imports_the_package_does_not_recurse_and_a_failure_is_not_retried():
    out = _run("""
    def imports_it(package):
        seen.append("callback")
        import served.sub
        raise RuntimeError("boom")
    hooks.register_first_import_hook("served", imports_it)
    for _ in range(2):
        try:
            import served
        except RuntimeError as exc:
            seen.append(str(exc))
        sys.modules.pop("served", None)
        sys.modules.pop("served.sub", None)
    print(json.dumps(seen))
    """)
    assert out == ["callback", "boom"]


def test_vllm_compat_registers_the_catalogue_before_a_served_package_and_never_breaks_its_import():
    result = run_python("""
        import importlib.util, json, logging, sys
        logging.basicConfig(level=logging.ERROR, stream=sys.stderr)
        import vllm_compat
        finder = next(f for f in sys.meta_path if getattr(f, "_vllm_compat_finder", False))
        before = sorted(finder._vllm_compat_callbacks)
        sys.modules["vllm_compat.activate"] = None  # activation cannot load: the lookup must still succeed
        spec = importlib.util.find_spec("vllm")  # installed in every cell (vllm-omni is not)
        print(json.dumps([before, sorted(finder._vllm_compat_callbacks), spec is not None]))
        """, env=NO_STARTUP)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [[], [], True]
    assert "could not register its hooks before importing vllm; nothing is patched" in result.stderr


def test_imports_settled_runs_once_the_outermost_hooked_import_has_ended_even_when_it_fails():
    out = _run("""
    open(os.path.join(root, "served", "sub", "leaf.py"), "w").write("")
    open(os.path.join(root, "served", "broken.py"), "w").write("import served.sub.leaf\\nraise ValueError('x')\\n")
    def on_settled():
        seen.append(["settled", hooks.hooked_import_in_progress()])
    hooks.register_post_import_hook("served.sub.leaf", lambda module: seen.append(
        ["leaf", hooks.hooked_import_in_progress()]))
    hooks.register_imports_settled_hook(on_settled, watched=("served.sub",))
    hooks.register_imports_settled_hook(on_settled)  # the same callback: no-op
    import served.sub.leaf   # served.sub (watched) settles first, then the leaf with its callback
    seen.append("--")
    hooks.register_imports_settled_hook(on_settled, watched=("served.broken",))
    try:
        import served.broken  # the leaf is imported already: only the failing watched module counts
    except ValueError:
        seen.append("raised")
    print(json.dumps(seen))
    """)
    assert out == [["settled", False], ["leaf", True], ["settled", False], "--", ["settled", False], "raised"]
