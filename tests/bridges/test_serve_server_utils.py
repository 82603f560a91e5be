"""The ``serve_server_utils`` bridge on the real wheels (the shared checks: ``serve_stand_in_cases``, probed with the
old module itself: on vLLM 0.32+ vllm-omni 0.24.0's server may still stop earlier, on a module another bridge owns),
and its oracle: vLLM 0.24.0's ``get_uvicorn_log_config`` (with 0.24's ``create_uvicorn_log_config``), read from its
wheel, gives what vLLM's own function served at the old path gives, on the args vLLM's serve parser makes."""

from __future__ import annotations

import argparse
import ast
import json
import logging

import pytest

from tests.bridges.serve_stand_in_cases import cases
from vllm_compat.bridges import HostKind
from vllm_compat.bridges import serve_server_utils as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action

CASES = cases(bridge, probe=bridge.OLD_MODULE)
globals().update(CASES)
STATIC = CASES["STATIC"]
STATES = dict(getattr(STATIC, "definitions", ()))
needs_reviewed_definition = pytest.mark.skipif(
    STATIC.host != HostKind.LACKS or not str(STATES.get("get_uvicorn_log_config", "")).startswith("accepted"),
    reason=f"needs vLLM 0.32+ (no {bridge.OLD_MODULE}, the reviewed get_uvicorn_log_config); here: vLLM "
    f"{STATIC.host} it, definitions {STATES or 'not read'}")


def test_refused_where_the_definition_is_unreviewed_and_skipped_where_the_alias_table_serves_it():
    from vllm_compat.bridges._reviewed_module_alias import AliasedModuleFacts

    importers = ("vllm_omni.entrypoints.openai.api_server:79 (module)",)
    decision = bridge.DRIFT_POINT.decide(bridge.facts_for_table(HostKind.LACKS, importers, changed=True), Controls())
    assert decision.action == Action.REFUSED and "get_uvicorn_log_config: changed" in decision.reason
    served = AliasedModuleFacts(HostKind.LACKS, importers, (("get_uvicorn_log_config", "elsewhere (412e41643ff96d74)"),))
    decision = bridge.DRIFT_POINT.decide(served, Controls())
    assert decision.action == Action.SKIPPED and "moved_names" in decision.reason


def test_definition_state_on_this_vllm():
    """The keys re-derived from the wheels: 0.32-0.34 accepted, 0.29-0.31 the alias table's (elsewhere)."""
    from conftest import VLLM_VERSION

    if STATIC.host != HostKind.LACKS:
        pytest.skip(f"vLLM {STATIC.host} {bridge.OLD_MODULE}")
    state = STATES["get_uvicorn_log_config"]
    major_minor = tuple(int(p) for p in VLLM_VERSION.split(".")[:2])
    assert state.split(" ")[0] == ("accepted" if major_minor >= (0, 32) else "elsewhere"), state


def old_function():
    """vLLM 0.24.0's ``get_uvicorn_log_config``, ``load_log_config`` and ``create_uvicorn_log_config``, compiled from
    its cached wheel (never from vLLM's installed files nor the bridge)."""
    from vllm_compat.detect.source_tree import SourceTree
    from vllm_compat.detect.wheels import cache_dir, cached_wheel

    wheel = cached_wheel("vllm", "0.24.0", cache_dir())
    if wheel is None:
        pytest.skip(f"vLLM 0.24.0's wheel is not in {cache_dir()} (`vllm-compat check vllm==0.24.0` fetches it)")
    tree = SourceTree(wheel)
    namespace: dict = {"json": json, "logger": logging.getLogger("vllm-0.24.0-oracle"), "Namespace": argparse.Namespace}
    exec(tree.read("vllm/logging_utils/access_log_filter.py"), namespace)  # logging and urllib only
    wanted = {"load_log_config", "get_uvicorn_log_config"}
    module = ast.parse(tree.read("vllm/entrypoints/serve/utils/server_utils.py"))
    nodes = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    assert {n.name for n in nodes} == wanted
    for node in nodes:  # its local `from vllm.logging_utils import create_uvicorn_log_config`: 0.24's, not ours
        node.body = [s for s in node.body if not isinstance(s, ast.ImportFrom)]
    exec(compile(ast.Module(nodes, []), "vllm-0.24.0/vllm/entrypoints/serve/utils/server_utils.py", "exec"), namespace)
    return namespace["get_uvicorn_log_config"]


def parsed(**given) -> argparse.Namespace:
    """What vLLM's serve parser leaves on the args for these flags: ``disable_access_log_for_endpoints`` (default
    None) and ``uvicorn_log_level`` (default "info") always; ``log_config_file`` on vLLM <= 0.30 always (default
    None), on 0.31+ only where ``--log-config-file`` is given (``argparse.SUPPRESS``); ``logging_config`` only where
    ``--logging-config`` is given (0.31+)."""
    args = argparse.Namespace(disable_access_log_for_endpoints=None, uvicorn_log_level="info")
    vars(args).update(given)
    return args


def scenarios(tmp_path) -> dict:
    config = {"version": 1, "disable_existing_loggers": False, "formatters": {}, "handlers": {}, "loggers": {}}
    path = tmp_path / "log.json"
    path.write_text(json.dumps(config))
    return {
        "defaults": {},
        "endpoints-filtered": {"disable_access_log_for_endpoints": "/health, /metrics,,/ping"},
        "debug-level-filter": {"disable_access_log_for_endpoints": "/health", "uvicorn_log_level": "debug"},
        "log-config-file": {"log_config_file": str(path)},
        "log-config-file-wins": {"log_config_file": str(path), "disable_access_log_for_endpoints": "/health"},
        "unreadable-file": {"log_config_file": str(tmp_path / "missing.json"), "disable_access_log_for_endpoints": "/x"},
    }


def comparable(config):
    """A log config with its filter objects as what they filter (the classes differ between the two vLLMs)."""
    if not isinstance(config, dict):
        return config
    out = json.loads(json.dumps(config, default=lambda o: f"<{type(o).__name__}>"))
    for spec in out.get("filters", {}).values():
        spec.pop("()", None)
    return out


@needs_reviewed_definition
@pytest.mark.parametrize("name", ["defaults", "endpoints-filtered", "debug-level-filter", "log-config-file",
                                  "log-config-file-wins", "unreadable-file"])
def test_vllm_s_function_at_the_old_path_gives_what_vllm_0_24_gave(name, tmp_path):
    import importlib

    served = importlib.import_module(bridge.NEW_MODULE).get_uvicorn_log_config  # what the old path serves
    if bridge.DRIFT_POINT.decide(STATIC, Controls()).action == Action.PATCHED:  # a vllm-omni imports the old path
        assert importlib.import_module(bridge.OLD_MODULE).get_uvicorn_log_config is served
    given = scenarios(tmp_path)[name]
    old_args = parsed(**({"log_config_file": None} | given))  # 0.24's parser always sets log_config_file
    new = served(parsed(**given))
    assert comparable(new) == comparable(old_function()(old_args))
    if name == "defaults":
        assert new is None
