"""Activation against the real vllm-omni loader, each case in a fresh interpreter."""

import json

import pytest

from conftest import OMNI_NEEDS_STARTUP_BRIDGES, needs_omni, run_python

LOADER = "vllm_omni.diffusion.model_loader.diffusers_loader"


@needs_omni
def test_hook_patches_once_under_racing_threads_reload_and_revert():
    result = run_python(
        f"""
        import importlib, inspect, io, json, logging, sys, threading
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
        logging.getLogger("vllm_compat").addHandler(handler)
        logging.getLogger("vllm_compat").setLevel(logging.DEBUG)  # the per-entry lines are at DEBUG
        import vllm_compat
        from vllm_compat.patches.diffusers_loader import installed_variant

        barrier = threading.Barrier(16)
        def race(i):
            barrier.wait()
            if i % 2:
                importlib.import_module("{LOADER}")
            else:
                vllm_compat.apply()
        threads = [threading.Thread(target=race, args=(i,)) for i in range(16)]
        [t.start() for t in threads]; [t.join() for t in threads]
        vllm_compat.apply(); vllm_compat.apply()          # after the hook fired: no-ops
        module = sys.modules["{LOADER}"]
        cls = module.DiffusersPipelineLoader
        patched = vars(cls)["_process_weights_after_loading"]
        original = patched.__wrapped__
        out = dict(
            variant=installed_variant(cls),
            entry_lines=stream.getvalue().count("DEBUG vllm_compat: patched {LOADER}.DiffusersPipelineLoader._process_"),
            entry_lines_total=stream.getvalue().count("DEBUG vllm_compat: patched"),
            info=[line for line in stream.getvalue().splitlines() if line.startswith("INFO")],
            # the drift points whose DEBUG line came before the INFO line, in the log's own order
            before_info=sorted(d.name for d in vllm_compat.apply() if d.action == "patched"
                               and stream.getvalue().find(f"DEBUG vllm_compat: patched {{d.target}}")
                               < stream.getvalue().find("INFO")),
            patched_total=sum(d.action == "patched" for d in vllm_compat.apply()),
            name=patched.__name__, doc=patched.__doc__ == original.__doc__,
            signature=str(inspect.signature(patched)) == str(inspect.signature(original)),
            decisions=[d.to_dict() for d in vllm_compat.apply() if d.name == "diffusers_loader_meta_device"],
        )
        vllm_compat.revert()
        out["reverted_exact"] = vars(cls)["_process_weights_after_loading"] is original
        importlib.reload(module)                          # suspended: the reloaded class stays original
        out["after_revert_reload"] = installed_variant(module.DiffusersPipelineLoader)
        vllm_compat.apply()
        out["after_apply"] = installed_variant(module.DiffusersPipelineLoader)
        importlib.reload(module)                          # hooked again on reload
        out["after_reload"] = installed_variant(module.DiffusersPipelineLoader)
        print("RESULT" + json.dumps(out))
        """,
        # Forced, so a loader that is already fixed upstream (skipped under auto) is patched too.
        env={"VLLM_COMPAT_LOADER_VARIANT": "meta_safe"},
        warm=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT", 1)[1])
    assert out["variant"] == "meta_safe" and out["decisions"][0]["action"] == "patched"
    assert out["entry_lines"] == 1
    assert out["entry_lines_total"] == out["patched_total"]  # one DEBUG line per patched entry, however often
    # One INFO line, logged when the first hooked import that installed something had ended: it names exactly
    # the drift points installed by then (vllm-omni's own import may bridge names before the loader is imported)
    assert len(out["info"]) == 1, out["info"]
    named = out["info"][0].split(": ", 1)[1].split(" (per entry")[0].split(": ", 1)[1].split(", ")
    assert sorted(name.split(" (")[0] for name in named) == out["before_info"], (out["info"], out["before_info"])
    assert out["name"] == "_process_weights_after_loading" and out["doc"] and out["signature"]
    assert out["reverted_exact"] is True
    assert out["after_revert_reload"] is None
    assert out["after_apply"] == "meta_safe" == out["after_reload"]


@needs_omni
@pytest.mark.skipif(OMNI_NEEDS_STARTUP_BRIDGES, reason="vllm-omni imports here only through bridges the startup "
                    "hook puts in place first; this test takes vllm_compat out to show the entry points alone")
def test_real_omni_plugin_loader_activates_the_shim_in_a_spawned_process(tmp_path):
    # vllm-omni's own load_omni_general_plugins() finds our entry point and calls it in a spawned worker,
    # which never imported vllm_compat itself.
    result = run_python(
        f"""
        import multiprocessing as mp

        def worker(queue):
            import sys
            # The startup .pth imported vllm_compat in this interpreter; take it out again, finder included, so
            # this worker shows the entry-point path on its own (an env installed without the .pth).
            for name in [m for m in sys.modules if m == "vllm_compat" or m.startswith("vllm_compat.")]:
                del sys.modules[name]
            sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "_vllm_compat_finder", False)]
            from vllm_omni.plugins import load_omni_general_plugins
            assert "vllm_compat" not in sys.modules
            load_omni_general_plugins()
            load_omni_general_plugins()
            import importlib
            module = importlib.import_module("{LOADER}")
            from vllm_compat import current_decisions
            from vllm_compat.patches.diffusers_loader import installed_variant
            queue.put((installed_variant(module.DiffusersPipelineLoader), [d.action for d in current_decisions() if d.name == "diffusers_loader_meta_device"]))

        if __name__ == "__main__":
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            process = ctx.Process(target=worker, args=(queue,))
            process.start()
            print("RESULT", queue.get(timeout=240))
            process.join()
        """,
        script=tmp_path / "spawn_worker.py",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    variant, actions = eval(result.stdout.split("RESULT", 1)[1])
    assert actions in (["patched"], ["skipped"])
    assert (variant is not None) == (actions == ["patched"])


@needs_omni
@pytest.mark.skipif(OMNI_NEEDS_STARTUP_BRIDGES, reason="vllm-omni imports here only through vllm_compat's bridges, "
                    "which VLLM_COMPAT_DISABLE=1 turns off too")
def test_disable_leaves_the_loader_untouched():
    result = run_python(
        f"""
        import importlib, vllm_compat
        module = importlib.import_module("{LOADER}")
        from vllm_compat.patches.diffusers_loader import installed_variant
        print(installed_variant(module.DiffusersPipelineLoader), [d.action for d in vllm_compat.apply() if d.name == "diffusers_loader_meta_device"],
              vllm_compat.report().to_dict()["patches"][0]["action"])
        """,
        env={"VLLM_COMPAT_DISABLE": "1"},
        warm=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-3:] == ["None", "['disabled']", "disabled"]


@needs_omni
def test_invalid_variant_leaves_the_import_alive_and_refused_apply_raises_then_a_valid_one_patches():
    """A worker is never told of a typo mid-import: the loader imports, unpatched and refused with the message;
    ``apply()`` raises it; once it is fixed, ``apply()`` patches."""
    result = run_python(
        f"""
        import importlib, os, sys, vllm_compat
        from vllm_compat.errors import ConfigError
        module = importlib.import_module("{LOADER}")
        from vllm_compat.patches.diffusers_loader import installed_variant
        decided = {{d.name: d for d in vllm_compat.current_decisions()}}["diffusers_loader_meta_device"]
        print("IMPORTED", installed_variant(module.DiffusersPipelineLoader), decided.action, decided.reason)
        try:
            vllm_compat.apply()
        except ConfigError as exc:
            print("ERROR", exc)
        os.environ["VLLM_COMPAT_LOADER_VARIANT"] = "legacy"
        vllm_compat.apply()
        print("VARIANT", installed_variant(module.DiffusersPipelineLoader))
        """,
        env={"VLLM_COMPAT_LOADER_VARIANT": "fastest"},
        warm=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "IMPORTED None refused VLLM_COMPAT_LOADER_VARIANT='fastest' is not a loader variant" in result.stdout
    assert "ERROR VLLM_COMPAT_LOADER_VARIANT='fastest' is not a loader variant" in result.stdout
    assert "VARIANT legacy" in result.stdout  # forced: patched whatever the loader shape


@needs_omni
def test_a_worker_logs_at_most_one_info_line_and_every_entry_at_debug():
    """What a vllm-omni worker goes through: ``import vllm_omni`` (the startup hook's bridges), vLLM's and
    vllm-omni's plugin loading (our entry point), the diffusion loader's import and its worker module's (which may
    stop here on a name no bridge provides). vLLM users read these logs in every process: one INFO line."""
    result = run_python(
        f"""
        import importlib, json, logging
        records = []
        class Keep(logging.Handler):
            def emit(self, record):
                records.append((record.levelname, record.getMessage()))
        logging.getLogger("vllm_compat").addHandler(Keep())
        logging.getLogger("vllm_compat").setLevel(logging.DEBUG)
        import vllm_omni
        records.append(("MARK", "import vllm_omni returned"))
        from vllm.plugins import load_general_plugins
        load_general_plugins()
        from vllm_omni.plugins import load_omni_general_plugins
        load_omni_general_plugins()
        importlib.import_module("{LOADER}")
        try:
            importlib.import_module("vllm_omni.diffusion.worker.diffusion_worker")
        except Exception:
            pass
        import vllm_compat
        decided = [d.name for d in vllm_compat.current_decisions() if d.action != "pending"]
        targets = {{d.target: d.name for d in vllm_compat.current_decisions() if d.action == "patched"}}
        print("RESULT" + json.dumps(dict(records=records, decided=decided, targets=targets)))
        """,
        warm=True,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.split("RESULT", 1)[1])
    info = [message for level, message in out["records"] if level == "INFO"]
    debug = [message for level, message in out["records"] if level == "DEBUG"]
    assert len(info) <= 1, info
    assert len(debug) + sum(level == "WARNING" for level, _ in out["records"]) >= len(out["decided"]), out
    if info:
        assert info[0].startswith("vllm_compat: patched or bridged"), info
    # What `import vllm_omni` installed (bridges deep inside it included) is in the INFO line, logged before that
    # import returned: the line waits for the outermost hooked import instead of naming its first install alone.
    mark = out["records"].index(["MARK", "import vllm_omni returned"])
    during_import = {name for target, name in out["targets"].items()
                     if any(message == f"vllm_compat: patched {target}" or message.startswith(
                         (f"vllm_compat: patched {target}:", f"vllm_compat: patched {target} ("))
                         for _, message in out["records"][:mark])}
    if during_import:
        assert ["INFO", info[0]] in out["records"][:mark], out["records"]
        assert all(name in info[0] for name in during_import), (info, during_import)


def test_apply_without_vllm_omni_loaded_is_pending_and_imports_nothing():
    result = run_python(
        """
        import sys, vllm_compat
        decisions = vllm_compat.apply()
        print(decisions[0].action, sorted(m for m in ("torch", "vllm", "vllm_omni") if m in sys.modules))
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "pending []"


def test_invalid_control_raises_from_apply():
    result = run_python("import vllm_compat; vllm_compat.apply()", env={"VLLM_COMPAT_STRICT": "sometimes"})
    assert result.returncode == 1
    assert "ConfigError: VLLM_COMPAT_STRICT='sometimes' is not a valid switch" in result.stderr


# ---- bad controls answered early (issue 34): apply() raises, activation warns, a hook refuses; no vLLM needed ----

BAD_CONTROLS = [  # (variable, value, words of the allowed values the message must name)
    ("VLLM_COMPAT_LOADER_VARIANT", "turbo", "auto, legacy, meta_safe"),
    ("VLLM_COMPAT_LOADER_VARIANTS", "legacy", "VLLM_COMPAT_LOADER_VARIANT "),  # a typo in the name: the known ones
    ("VLLM_COMPAT_STRICT", "sometimes", "1/true/yes/on"),
]
FINDER_STATE = """
        import json, sys
        finder = next((f for f in sys.meta_path if getattr(f, "_vllm_compat_finder", False)), None)
        hooked = sorted(getattr(finder, "_vllm_compat_callbacks", {}))
"""  # indented as the code it is appended to


@pytest.mark.parametrize(("name", "value", "allowed"), BAD_CONTROLS)
def test_apply_raises_a_bad_control_before_any_target_is_imported_and_registers_nothing(name, value, allowed):
    result = run_python(
        """
        import vllm_compat
        from vllm_compat.errors import ConfigError
        try:
            vllm_compat.apply()
        except ConfigError as exc:
            print("ERROR", exc)
        """ + FINDER_STATE + """
        print("HOOKED", json.dumps(hooked), sorted(m for m in ("vllm", "vllm_omni", "torch") if m in sys.modules))
        """,
        env={name: value},
    )
    assert result.returncode == 0, result.stderr
    error = result.stdout.split("ERROR ", 1)[1].split("\n", 1)[0]
    assert error.startswith(f"{name}={value!r} ") and allowed in error, error
    assert 'HOOKED [] []' in result.stdout  # raised before registering a hook; imported nothing


@pytest.mark.parametrize(("name", "value", "allowed"), BAD_CONTROLS)
def test_activation_warns_of_a_bad_control_once_and_never_raises(name, value, allowed):
    """What a worker's first ``import vllm`` does (the startup hook's first-import hook; vLLM need not be
    installed: the lookup alone fires it): every hook is registered, one WARNING names the variable, the value
    and the allowed values, and the interpreter goes on."""
    from vllm_compat.catalogue import CATALOGUE

    result = run_python(
        """
        import importlib.util, vllm_compat
        importlib.util.find_spec("vllm")
        importlib.util.find_spec("vllm_omni")
        vllm_compat.install_import_hook()  # again: no second warning
        """ + FINDER_STATE + """
        print("HOOKED", json.dumps(hooked))
        """,
        env={name: value},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.split("HOOKED ", 1)[1]) == sorted({e.target_module for e in CATALOGUE})
    warnings = [line for line in result.stderr.splitlines() if line.startswith("vllm_compat: ")]
    assert len(warnings) == 1 and "Traceback" not in result.stderr, result.stderr
    assert warnings[0].startswith(f"vllm_compat: {name}={value!r} ") and allowed in warnings[0], warnings
    assert "vllm_compat.apply() raises this error" in warnings[0]


def test_activation_with_valid_controls_is_silent():
    result = run_python('import importlib.util, vllm_compat; importlib.util.find_spec("vllm")',
                        env={"VLLM_COMPAT_LOADER_VARIANT": "meta_safe", "VLLM_COMPAT_STRICT": "0",
                             "VLLM_COMPAT_CELL": "x"})
    assert (result.returncode, result.stderr) == (0, "")


@pytest.mark.parametrize(("name", "value", "allowed"), BAD_CONTROLS)
def test_a_hook_refuses_its_entry_on_a_bad_control_instead_of_raising_mid_import(name, value, allowed):
    """Post-import hooks fired on a bare module of their target's name (the controls are checked before the
    target's shape is read): an entry whose control is bad is refused with the message, nothing is raised. A bad
    core control concerns every entry; a drift point's switch, the entries that read it; an unknown name, none
    (activation warned of it, ``apply()`` raises it). Under a valid ``VLLM_COMPAT_STRICT=1`` the hook raises."""
    from vllm_compat.catalogue import CATALOGUE

    readers = sorted(e.id for e in CATALOGUE if "VLLM_COMPAT_LOADER_VARIANT" in e.point.switches)
    fired = [e.id for e in CATALOGUE] if name == "VLLM_COMPAT_STRICT" else readers
    refused = {"VLLM_COMPAT_STRICT": fired, "VLLM_COMPAT_LOADER_VARIANT": readers}.get(name, [])
    result = run_python(
        f"""
        import json, types, vllm_compat
        from vllm_compat import activate
        from vllm_compat.catalogue import entry
        for entry_id in {fired!r}:
            activate._HOOKS[entry_id](types.ModuleType(entry(entry_id).target_module))
        print("DECIDED", json.dumps({{d.name: [d.action, d.reason] for d in vllm_compat.current_decisions()}}))
        """,
        env={name: value},
    )
    assert result.returncode == 0, result.stderr
    decided = json.loads(result.stdout.split("DECIDED ", 1)[1])
    # every fired entry is decided; one decided normally (an unknown name refuses none) may import vLLM, whose own
    # targets' hooks then decide too
    assert readers and (sorted(decided) == sorted(fired) if refused else set(fired) <= set(decided)), decided
    for entry_id, (action, reason) in decided.items():
        if entry_id in refused:
            assert action == "refused" and reason.startswith(f"{name}={value!r} ") and allowed in reason, reason
        else:
            assert not reason.startswith(name), reason  # decided as if the unknown variable were not there
    warnings = [line for line in result.stderr.splitlines() if line.startswith(f"vllm_compat: {name}=")]
    assert len(warnings) == 1 if refused else len(warnings) <= 1, result.stderr  # once, not once per entry

    strict = run_python(
        """
        import types
        from vllm_compat import activate
        from vllm_compat.catalogue import CATALOGUE
        from vllm_compat.errors import ConfigError
        entry = next(e for e in CATALOGUE if e.point.switches)
        try:
            activate._HOOKS[entry.id](types.ModuleType(entry.target_module))
        except ConfigError as exc:
            print("RAISED", exc)
        """,
        env={"VLLM_COMPAT_STRICT": "1", "VLLM_COMPAT_LOADER_VARIANT": "turbo"},
    )
    assert "RAISED VLLM_COMPAT_LOADER_VARIANT='turbo' is not a loader variant" in strict.stdout, strict.stderr


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
