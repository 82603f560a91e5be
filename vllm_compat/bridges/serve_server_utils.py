"""Alias for the module ``vllm.entrypoints.serve.utils.server_utils`` (``get_uvicorn_log_config``) on vLLM 0.32+.

Why: vLLM 0.29 moved ``vllm/entrypoints/serve/utils/server_utils.py`` to ``vllm/entrypoints/launchers/utils/``;
vllm-omni 0.24.0's server imports ``get_uvicorn_log_config`` from the old path at module level, so ``vllm serve
--omni`` dies with ModuleNotFoundError. The alias table (``moved_names``) serves 0.29-0.31, where the module moved
whole (0.31's function reviewed and accepted); on 0.32 the new module gained the server's ``lifespan`` and
``get_uvicorn_log_config`` JSON access logs, and the table finds no match for the module any more.
When: ``vllm.entrypoints.serve.utils`` is imported without ``server_utils``, an installed vllm-omni imports it (read
from its files), and vLLM's ``launchers.utils.server_utils.get_uvicorn_log_config`` has a reviewed source (``KEYS``):
then a module object holding vLLM's own function is registered under the old path. Where the function has the
source the alias table serves (0.29-0.31) it stays out; an unreviewed source is a refusal saying what was found.
Serves: vllm-omni 0.24.0 on vLLM 0.32-0.34 (0.29-0.31: ``moved_names``; <= 0.28: vLLM's own module).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.entrypoints.serve.utils.server_utils``.

What vllm-omni 0.24.0 relies on: ``get_uvicorn_log_config(args)`` on the args its server parsed with the installed
vLLM's parser, returning the dict of ``--log-config-file`` where given, else a uvicorn config whose access log leaves
out ``--disable-access-log-for-endpoints``, else None (uvicorn's defaults). vLLM 0.32-0.34's function does exactly
that for text logs; it reads the log file from ``args.logging_config.pylogging_config_file`` where vLLM's parser
made a ``--logging-config`` (0.31+: ``--log-config-file`` is then a suppressed alias of it), and builds a config for
``--logging-config.formatter json`` too (JSON access logs, as ``vllm serve`` gives on that release).
``tests/bridges/test_serve_server_utils.py`` compares it with vLLM 0.24.0's function, read from its wheel, on the
args the installed parser makes.
"""

from __future__ import annotations

from ._reviewed_module_alias import ReviewedModuleAlias

OLD_MODULE = "vllm.entrypoints.serve.utils.server_utils"
NEW_MODULE = "vllm.entrypoints.launchers.utils.server_utils"
MOVED = {"get_uvicorn_log_config": "get_uvicorn_log_config"}
# Definition keys (normalized source, detect.definitions), re-derived from each vLLM wheel.
KEYS = {"get_uvicorn_log_config": {
    "a164b296ff1bda29": "0.32-0.34: the log file from args.logging_config where present, JSON access logs on request",
}}
ELSEWHERE = {"get_uvicorn_log_config": {
    "c43ec3da840f4aeb": "moved_names aliases the whole module on vLLM 0.29-0.30 (identical)",
    "412e41643ff96d74": "moved_names aliases the whole module on vLLM 0.31 (reviewed: accept)",
}}
IMPORTERS = ("vllm_omni/entrypoints/openai/api_server.py",)


class ServeServerUtilsAlias(ReviewedModuleAlias):
    importers = IMPORTERS
    removed_in = "0.29"
    old_module = OLD_MODULE
    new_module = NEW_MODULE
    moved_names = MOVED
    keys = KEYS
    elsewhere = ELSEWHERE


DRIFT_POINT = ServeServerUtilsAlias()


def facts_for_table(host: str, importers: tuple[str, ...], changed: bool = False):
    """Facts for a decision-table row (tests): the reviewed 0.32+ definition, or an unreviewed change."""
    return DRIFT_POINT.facts_for_table(host, importers, "changed (0000000000000000)" if changed else
                                       "accepted (a164b296ff1bda29)")
