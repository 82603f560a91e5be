"""Alias targets re-derived from the wheels: each old path the alias bridge serves here, imported with the bridge in
place, is the definition that vLLM 0.24.0 had at that path (vllm-omni 0.24.0's own vLLM), moved.

The oracle is ``moved_names.vllm-0.24.0.json`` (``python -m tests.bridges.alias_targets OUT.json`` in the
v0.24-omni0.24 cell: each old path's kind, qualname and normalized source, read from the objects vLLM 0.24.0 binds).
Here, for every name the old path gives: the same normalized source, or the same kind and qualname (a definition
edited in place), or, for a rename, the same kind and a similar source; and in every case the object is, of all the
definitions in its new module, the one whose source is closest to the old one. A row pointing at another existing
name of the new module fails the last check even where it passes the others.
"""

from __future__ import annotations

import importlib
import inspect
import json

import pytest

from conftest import needs_vllm
from tests.bridges import alias_targets as targets
from vllm_compat.bridges import moved_names as bridge
from vllm_compat.detect.static import StaticSite

ORACLE = json.loads(targets.ORACLE.read_text())["old_paths"]
RENAME_SIMILARITY = 0.6  # the least measured for a real rename: CopyNumelCounter -> CopyCounter, 0.65 (vLLM 0.30)


def _installable():
    return bridge.DRIFT_POINT.detect_static(StaticSite.installed()).installable


def _closest_in_module(obj, old_source: str):
    """The definition of ``obj``'s module (classes and functions defined there) whose source is closest."""
    module = importlib.import_module(obj.__module__)
    best, best_score = None, -1.0
    for _, candidate in inspect.getmembers(module, lambda o: inspect.isclass(o) or inspect.isfunction(o)):
        if getattr(candidate, "__module__", None) != module.__name__:
            continue
        source = targets.normalized_source(candidate)
        score = targets.similarity(old_source, source) if source is not None else -1.0
        if score > best_score:
            best, best_score = candidate, score
    return best


@needs_vllm
def test_every_served_old_path_is_the_definition_vllm_0_24_had_there():
    import vllm_compat

    vllm_compat.apply()
    checked, not_in_024 = [], []
    for fact in _installable():
        old = ORACLE.get(fact.old, {"error": "not in the table when the oracle was recorded"})
        if "error" in old:
            not_in_024.append(fact.old)  # an old path of a newer vllm-omni: vLLM 0.24.0 never had it
            continue
        if fact.kind == "module":
            module = importlib.import_module(fact.old)
            # a split module holds the names the installed vllm-omni takes from it (vllm-omni 0.28.0: 13 of the
            # 14 vLLM 0.24.0 had in openai.engine.protocol, no PromptTokenUsageInfo); a whole module, all of them
            served = {name for name, _ in fact.moved} or set(old)
            got = {name: getattr(module, name) for name in old if name in served}
            assert got, (fact.old, sorted(served))
        else:
            parent, name = fact.old.rsplit(".", 1)
            got = {name: getattr(importlib.import_module(parent), name)}
        for name, obj in got.items():
            then, now = old[name], targets.describe(obj)
            where = f"{fact.old} ({name}) -> {getattr(obj, '__module__', '?')}.{now['qualname']}"
            assert now["kind"] == then["kind"], where
            if then["source"] is None:  # a constant or a typing alias: the value / qualname is the definition
                assert (now["value"], now["qualname"]) == (then["value"], then["qualname"]), where
            elif now["digest"] != then["digest"]:
                similar = targets.similarity(then["source"], now["source"] or "")
                assert now["qualname"] == then["qualname"] or similar >= RENAME_SIMILARITY, (where, similar)
                assert _closest_in_module(obj, then["source"]) is obj, where
            checked.append(f"{fact.old}:{name}")
    if not checked:
        pytest.skip(f"the alias bridge serves no old path of vLLM 0.24.0 here (installable: "
                    f"{[f.old for f in _installable()] or 'none'}; only newer vllm-omni's: {not_in_024})")


def test_a_row_pointing_at_another_existing_name_is_told_apart():
    """The check itself, on this file's own two functions standing in for a module's definitions: the closest
    definition to ``_closest_in_module``'s source is itself, not its neighbour."""
    source = targets.normalized_source(_closest_in_module)
    assert _closest_in_module(_closest_in_module, source) is _closest_in_module
    assert _closest_in_module(_installable, source) is _closest_in_module  # same module: the wrong name loses
