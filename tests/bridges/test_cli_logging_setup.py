"""The ``cli_logging_setup`` adapter on the real wheels: the shapes read from the installed files agree with what
vLLM does when ``vllm.logger`` is imported; driving vllm-omni's own CLI (``cli.main:main``, what ``vllm serve --omni``
hands over to) up to its serve command's ``validate``: unpatched on vLLM 0.31+ the ``vllm`` logger has no handler
and an INFO line is lost; with the adapter the logging setup equals the one vLLM's own CLI makes for the same flags
(the oracle: vLLM's ``vllm.entrypoints.cli.main:main`` run in its own process up to its serve command's validate);
``VLLM_CONFIGURE_LOGGING=0`` leaves logging alone as in vLLM's CLI; revert puts back vllm-omni's own method.
tests/serve runs the whole server through it (the INFO startup milestones)."""

from __future__ import annotations

import importlib.util
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import needs_startup_hook, run_python
from vllm_compat.bridges import cli_logging_setup as bridge
from vllm_compat.bridges.cli_logging_setup import CliLoggingFacts, Shape
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

STATIC = bridge.DRIFT_POINT.detect_static(StaticSite.installed())
DECISION = bridge.DRIFT_POINT.decide(STATIC, Controls())
_missing = [m for m in ("torchvision", "torchaudio") if importlib.util.find_spec(m) is None]
needs_cli = pytest.mark.skipif(
    bool(_missing) or STATIC.omni == Shape.ABSENT or STATIC.vllm == Shape.ABSENT,
    reason=f"needs vLLM, vllm-omni's CLI and torchvision / torchaudio (vllm-omni's serve command imports them); "
    f"here {STATIC}, missing {_missing}")
needs_drift = pytest.mark.skipif((STATIC.vllm, STATIC.omni) != (Shape.CLI_ONLY, Shape.NO_SETUP),
                                 reason=f"needs vLLM 0.31+'s CLI-only logging setup and a vllm-omni CLI without it; "
                                 f"here {STATIC}")
PROBE = "cli-logging-setup-probe"
# vllm-omni's main sets VLLM_LOGGING_COLOR=1 where it is unset (its own choice: colored logs even when piped), so
# vLLM's CLI, the oracle, runs with it set too: the formatter is then chosen the same way in both.
SAME_COLOR = {"VLLM_LOGGING_COLOR": "1"}

# The logging state both scripts print: the vllm logger's level, propagation and handlers, vLLM's record factory,
# the LoggingConfig vLLM last applied, and whether an INFO line of a vllm logger reached the output.
SNAPSHOT = f"""
def snapshot(error=None):
    import logging, sys
    import vllm.logger as vllm_logger
    vllm_logger.init_logger("vllm.probe").info("{PROBE}")
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    root = logging.getLogger("vllm")
    return dict(
        level=root.level, propagate=root.propagate,
        handlers=[[type(h).__name__, h.level, type(h.formatter).__name__, getattr(h.stream, "name", None)]
                  for h in root.handlers],
        factory=type(logging.getLogRecordFactory()).__name__,
        config=repr(getattr(vllm_logger, "_last_configured_logging_config", None)), error=error)
"""

# vllm-omni's own CLI as `vllm serve --omni` runs it, stopped by its serve command's own validation
# (`--stage-id` without a master address raises ValueError): nothing is served, no model is read.
OMNI_CLI = SNAPSHOT + """
import json, sys
sys.argv = ["vllm", "serve", "tiny", "--omni", "--stage-id", "1"] + FLAGS
from vllm_omni.entrypoints.cli.main import main
try:
    main()
    error = None
except ValueError as exc:
    error = str(exc)
out = snapshot(error)
from vllm_omni.entrypoints.cli.serve import OmniServeCommand
from vllm_compat.drift import is_ours
out["ours"] = is_ours(vars(OmniServeCommand)["validate"])
import vllm_compat
vllm_compat.revert()
own = vars(OmniServeCommand)["validate"]
out["reverted"] = not is_ours(own) and own.__code__.co_filename.endswith("vllm_omni/entrypoints/cli/serve.py")
print("RESULT", json.dumps(out))
"""

# The oracle: vLLM's own CLI (`vllm serve`, no vllm-omni code), stopped right after its logging setup by the test
# (its serve command's validate raises); on a CPU-only machine it gets the CPU platform its parser needs, as vLLM's
# main does for `vllm bench` and vllm-omni's CLI does for `serve`.
VLLM_CLI = SNAPSHOT + """
import json, sys
sys.argv = ["vllm", "serve", "tiny"] + FLAGS
from vllm import platforms
if platforms.current_platform.is_unspecified():
    from vllm.platforms.cpu import CpuPlatform
    platforms.current_platform = CpuPlatform()
import vllm.entrypoints.cli.serve as serve
class Stop(Exception):
    pass
def stop(self, args):
    raise Stop("stopped after vLLM's logging setup")
serve.ServeSubcommand.validate = stop
from vllm.entrypoints.cli.main import main
try:
    main()
    error = None
except Stop as exc:
    error = str(exc)
print("RESULT", json.dumps(snapshot(error)))
"""


def _run(code: str, flags: list[str], env: dict | None = None) -> dict:
    result = run_python(f"FLAGS = {flags!r}\n" + code, env=env, timeout=1500)
    assert "RESULT " in result.stdout, (result.stdout[-2000:], result.stderr[-3000:])
    out = json.loads(result.stdout.split("RESULT ", 1)[1].splitlines()[0])
    out["probe_logged"] = PROBE in result.stdout + result.stderr
    return out


def _setup(out: dict) -> dict:
    return {k: out[k] for k in ("level", "propagate", "handlers", "factory", "config", "probe_logged")}


@pytest.mark.parametrize(("vllm", "omni", "action"), [
    (Shape.CLI_ONLY, Shape.NO_SETUP, Action.PATCHED), (Shape.AT_IMPORT, Shape.NO_SETUP, Action.SKIPPED),
    (Shape.CLI_ONLY, Shape.SETS_UP, Action.SKIPPED), (Shape.CLI_ONLY, Shape.ABSENT, Action.SKIPPED),
    (Shape.AT_IMPORT, Shape.SETS_UP, Action.SKIPPED), (Shape.ABSENT, Shape.NO_SETUP, Action.PENDING),
    (Shape.UNKNOWN, Shape.NO_SETUP, Action.REFUSED), (Shape.CLI_ONLY, Shape.UNKNOWN, Action.REFUSED),
    (Shape.UNKNOWN, Shape.ABSENT, Action.SKIPPED),
])
def test_decision_table(vllm, omni, action):
    assert bridge.DRIFT_POINT.decide(CliLoggingFacts(vllm, omni), Controls()).action == action


def test_omni_shapes_read_from_source():
    main = "def main():\n    args = parser.parse_args()\n    cmds[args.subparser].validate(args)\n"
    serve = "class OmniServeCommand:\n    def validate(self, args):\n        pass\n"
    assert bridge.omni_shape_from_sources(main, serve)[0] == Shape.NO_SETUP
    configured = main.replace("    cmds", "    configure_logging_from_args(args)\n    cmds")
    assert bridge.omni_shape_from_sources(configured, serve)[0] == Shape.SETS_UP
    assert bridge.omni_shape_from_sources(main.replace(".validate(args)", ".run(args)"), serve)[0] == Shape.UNKNOWN
    assert bridge.omni_shape_from_sources(main, serve.replace("validate", "check"))[0] == Shape.ABSENT
    assert bridge.omni_shape_from_sources(None, serve)[0] == Shape.ABSENT


@pytest.mark.skipif(STATIC.vllm == Shape.ABSENT, reason="needs vLLM")
def test_vllm_shape_agrees_with_what_importing_vllm_logger_does():
    """The oracle is vLLM's behaviour: a fresh process that imports ``vllm.logger`` (and nothing of vllm_compat)
    has a handler on the ``vllm`` logger exactly where the files say vLLM configures at import."""
    result = run_python("import logging, vllm.logger\nprint('HANDLERS', len(logging.getLogger('vllm').handlers))",
                        env={"VLLM_COMPAT_DISABLE": "1"})
    assert "HANDLERS " in result.stdout, result.stderr[-3000:]
    configures_at_import = int(result.stdout.split("HANDLERS ", 1)[1].split()[0]) > 0
    assert STATIC.vllm == (Shape.AT_IMPORT if configures_at_import else Shape.CLI_ONLY)


@needs_cli
@needs_startup_hook
@pytest.mark.skipif(STATIC.vllm != Shape.AT_IMPORT, reason=f"vLLM configures logging only in its CLI here ({STATIC})")
def test_stays_out_where_vllm_configures_at_import():
    out = _run(OMNI_CLI, [])  # no logging flags: vLLM <= 0.30's parser has no --log-level
    assert out["error"] and "--stage-id" in out["error"]
    assert not out["ours"] and out["reverted"]
    assert out["probe_logged"] and out["handlers"]  # vLLM's import-time setup, no adapter needed


@needs_cli
@needs_drift
@needs_startup_hook
def test_unpatched_logs_nothing_and_the_adapter_sets_up_what_vllms_cli_does():
    flags = ["--log-level", "DEBUG"]
    with ThreadPoolExecutor(3) as pool:
        unpatched = pool.submit(_run, OMNI_CLI, flags, {"VLLM_COMPAT_DISABLE_PATCHES": bridge.DRIFT_POINT.id,
                                                        **SAME_COLOR})
        fixed = pool.submit(_run, OMNI_CLI, flags, SAME_COLOR)
        oracle = pool.submit(_run, VLLM_CLI, flags, SAME_COLOR)
        unpatched, fixed, oracle = unpatched.result(), fixed.result(), oracle.result()
    # both omni runs stop at vllm-omni's own validation, after the point where vLLM's CLI sets logging up
    assert "--stage-id" in unpatched["error"] and "--stage-id" in fixed["error"]
    assert not unpatched["ours"] and not unpatched["probe_logged"] and unpatched["handlers"] == []
    assert fixed["ours"] and fixed["reverted"]
    assert oracle["probe_logged"] and oracle["handlers"] and oracle["level"] == 10  # DEBUG, from --log-level
    assert _setup(fixed) == _setup(oracle)


@needs_cli
@needs_drift
@needs_startup_hook
def test_vllm_configure_logging_0_is_respected_as_in_vllms_cli():
    env = {"VLLM_CONFIGURE_LOGGING": "0", **SAME_COLOR}
    with ThreadPoolExecutor(2) as pool:
        fixed = pool.submit(_run, OMNI_CLI, [], env)
        oracle = pool.submit(_run, VLLM_CLI, [], env)
        fixed, oracle = fixed.result(), oracle.result()
    assert fixed["ours"] and "--stage-id" in fixed["error"]
    assert oracle["handlers"] == [] and not oracle["probe_logged"]
    assert _setup(fixed) == _setup(oracle)
