"""Call adapter for vLLM's CLI logging setup (``vllm.logger.configure_logging_from_args``) in ``vllm serve --omni``: ``OmniServeCommand.validate`` in ``vllm_omni.entrypoints.cli.serve``.

Why: up to vLLM 0.30, ``vllm/logger.py`` configured the ``vllm`` logger when it was imported (a stream handler at
``VLLM_LOGGING_LEVEL``, unless ``VLLM_CONFIGURE_LOGGING=0``). vLLM 0.31 removed that: logging is configured by
``configure_logging_from_args(args)``, which vLLM's own CLI (``vllm.entrypoints.cli.main``) calls after parsing the
arguments and before ``cmd.validate(args)``. ``vllm serve --omni`` hands over to vllm-omni's ``cli.main:main``
before that, and vllm-omni (0.24.0 and 0.30.0) parses and validates without calling it, so the server logs none of
vLLM's or vllm-omni's INFO lines (measured with tests/serve: no startup milestone on vLLM 0.33 + vllm-omni 0.24.0
and vLLM 0.34 + vllm-omni 0.30.0; vLLM 0.30 + vllm-omni 0.24.0 logs them), and ``--log-level`` /
``--logging-config`` are ignored.
When: vLLM's ``vllm/logger.py`` defines ``configure_logging_from_args`` and does not configure at import, and the
installed vllm-omni's CLI (``cli/main.py``, ``cli/serve.py``) calls ``validate(args)`` on its serve command and
calls none of vLLM's logging setup functions (all read from the files): ``OmniServeCommand.validate`` gets a wrapper
that first calls vLLM's own ``configure_logging_from_args(args)`` with the parsed arguments, the call and the order
of vLLM's CLI; ``VLLM_CONFIGURE_LOGGING=0`` and the logging flags act as they do there, since vLLM's function reads
them. Nothing vLLM defines is replaced. A vLLM that configures at import, or a vllm-omni that sets logging up
itself, keeps its own.
Serves: vllm-omni 0.24.0 and 0.30.0 on vLLM 0.31-0.34 (read from the wheels; measured on 0.33 and 0.34).
Retire when: the oldest supported vllm-omni's CLI calls ``configure_logging_from_args`` itself.

What it leaves out: the line vLLM's own ``main`` logs before it hands over (``Delegating entrypoint handling to
vllm-omni``) is logged before any CLI configures logging, so vLLM 0.31+ drops it with or without vllm-omni; and
vllm-omni's ``bench`` subcommand (a client, not the server) stays as it is.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import asdict, dataclass
from pathlib import Path

from ..decide import Action
from ..detect.source_tree import parse_source
from ..drift import DriftPoint, replace, restore, unwrap

LOGGER_FILE = "vllm/logger.py"
CLI_MAIN_FILE = "vllm_omni/entrypoints/cli/main.py"
CLI_SERVE_FILE = "vllm_omni/entrypoints/cli/serve.py"
CONFIGURE = "configure_logging_from_args"  # what vLLM's CLI main calls after parse_args, before cmd.validate
IMPORT_TIME_CONFIGURE = "_configure_vllm_root_logger"  # vLLM <= 0.30 called it at module level
# vLLM's logging setup functions: a vllm-omni CLI that calls any of them sets logging up itself
SETUP_FUNCTIONS = frozenset({CONFIGURE, IMPORT_TIME_CONFIGURE, "configure_logging", "configure_logging_if_needed"})
COMMAND, METHOD = "OmniServeCommand", "validate"


class Shape:
    AT_IMPORT = "configures_at_import"  # vLLM's logger.py configures the vllm logger when imported (<= 0.30)
    CLI_ONLY = "cli_only"  # vLLM's logger.py defines configure_logging_from_args and configures nothing at import
    NO_SETUP = "no_setup"  # vllm-omni's CLI validates its serve command and sets up no logging
    SETS_UP = "sets_up"  # vllm-omni's CLI calls one of vLLM's logging setup functions itself
    UNKNOWN = "unknown"
    ABSENT = "absent"


@dataclass(frozen=True)
class CliLoggingFacts:
    vllm: str
    omni: str
    detail: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def vllm_shape_from_source(source: str | None) -> tuple[str, str]:
    """How vLLM's ``logger.py`` sets logging up: at import (a module-level call of ``_configure_vllm_root_logger``)
    or only through ``configure_logging_from_args`` (defined, no module-level call)."""
    if source is None:
        return Shape.ABSENT, ""
    tree = parse_source(source)
    at_import = any(isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                    and getattr(node.value.func, "id", None) == IMPORT_TIME_CONFIGURE for node in tree.body)
    if at_import:
        return Shape.AT_IMPORT, ""
    if any(isinstance(node, ast.FunctionDef) and node.name == CONFIGURE for node in tree.body):
        return Shape.CLI_ONLY, ""
    return Shape.UNKNOWN, f"{LOGGER_FILE} neither configures at import nor defines {CONFIGURE}"


def _names(tree) -> set[str]:
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}


def omni_shape_from_sources(main: str | None, serve: str | None) -> tuple[str, str]:
    """How vllm-omni's CLI treats logging: ``sets_up`` where ``cli/main.py`` or ``cli/serve.py`` names one of vLLM's
    setup functions; ``no_setup`` where ``main.py`` calls ``.validate(args)`` and ``serve.py`` defines
    ``OmniServeCommand.validate`` (the call this adapter precedes); ``absent`` without the serve command."""
    if main is None or serve is None:
        return Shape.ABSENT, ""
    main_tree, serve_tree = parse_source(main), parse_source(serve)
    if (_names(main_tree) | _names(serve_tree)) & SETUP_FUNCTIONS:
        return Shape.SETS_UP, ""
    command = next((n for n in serve_tree.body if isinstance(n, ast.ClassDef) and n.name == COMMAND), None)
    if command is None or not any(isinstance(f, ast.FunctionDef) and f.name == METHOD for f in command.body):
        return Shape.ABSENT, ""
    validates = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == METHOD
                    for n in ast.walk(main_tree))
    return (Shape.NO_SETUP, "") if validates else (
        Shape.UNKNOWN, f"{CLI_MAIN_FILE} does not call {METHOD}(args) on its commands")


def _read(path) -> str | None:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, TypeError):
        return None


class CliLoggingSetup(DriftPoint):
    def _facts(self, vllm, omni) -> CliLoggingFacts:
        return CliLoggingFacts(vllm[0], omni[0], "; ".join(d for d in (vllm[1], omni[1]) if d))

    def detect_static(self, site) -> CliLoggingFacts:
        vllm = vllm_shape_from_source(site.vllm_tree.read(LOGGER_FILE)) if site.vllm_tree.has_package(
            "vllm") else (Shape.ABSENT, "")
        return self._facts(vllm, omni_shape_from_sources(site.omni_tree.read(CLI_MAIN_FILE),
                                                         site.omni_tree.read(CLI_SERVE_FILE)))

    def detect_runtime(self, module) -> CliLoggingFacts:
        """The same facts from the files of the imported modules (``vllm.logger``, this serve module, its
        ``main.py``): whether vLLM configured at import is a property of its module's code, not of a live object."""
        import importlib

        logger = importlib.import_module("vllm.logger")
        serve_file = getattr(module, "__file__", None)
        main_file = Path(serve_file).with_name("main.py") if serve_file else None
        return self._facts(vllm_shape_from_source(_read(logger.__file__)),
                           omni_shape_from_sources(_read(main_file), _read(serve_file)))

    def decide(self, facts: CliLoggingFacts, controls=None):
        if facts.vllm == Shape.ABSENT:
            return self.decision(Action.PENDING, "vLLM is not installed; decided when vllm-omni's CLI is imported")
        if facts.omni in (Shape.ABSENT, Shape.SETS_UP):
            return self.decision(Action.SKIPPED, "no installed vllm-omni CLI validates its serve command without "
                                 "setting logging up" if facts.omni == Shape.ABSENT else
                                 "vllm-omni's CLI sets vLLM's logging up itself")
        if facts.vllm == Shape.AT_IMPORT:
            return self.decision(Action.SKIPPED, "vLLM configures its logging when vllm.logger is imported (<= 0.30)")
        if Shape.UNKNOWN in (facts.vllm, facts.omni):
            return self.refused(f"the shapes are not the measured ones ({facts.detail})")
        return self.decision(Action.PATCHED, f"vLLM configures logging only in its own CLI ({CONFIGURE}, 0.31+), "
                             "which vllm-omni's CLI does not call; it is called with the parsed args before "
                             f"{COMMAND}.{METHOD}, as vLLM's CLI does")

    def locate(self, module):
        command = getattr(module, COMMAND, None)
        return command if isinstance(command, type) and METHOD in vars(command) else None

    def in_place(self, owner):
        return vars(owner).get(METHOD) if owner is not None else None

    def prepare(self, owner, facts):
        import inspect

        from ..errors import PatchRefusedError

        logger = __import__("vllm.logger", fromlist=[CONFIGURE])
        configure = getattr(logger, CONFIGURE, None)
        current = unwrap(vars(owner).get(METHOD), self.id)
        try:
            fits = (callable(configure) and list(inspect.signature(configure).parameters) == ["args"]
                    and list(inspect.signature(current).parameters)[:2] == ["self", "args"])
        except (TypeError, ValueError):
            fits = False
        if not fits:
            raise PatchRefusedError(f"expected vLLM's {CONFIGURE}(args) and vllm-omni's {COMMAND}.{METHOD}(self, args); "
                                    f"found {configure!r} and {current!r}; left as they are.")
        return None

    def install(self, owner, decision, state) -> bool:
        def make_wrapper(original):
            @functools.wraps(original)
            def validate(self, args, *rest, **kwargs):
                from vllm.logger import configure_logging_from_args  # vLLM's own, looked up at each call

                configure_logging_from_args(args)
                return original(self, args, *rest, **kwargs)

            return validate

        return replace(owner, METHOD, make_wrapper, self.id)

    def uninstall(self, owner) -> bool:
        return restore(owner, METHOD, self.id)


DRIFT_POINT = CliLoggingSetup()
