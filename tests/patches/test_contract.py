"""The drift-point contract, for every catalogue row on this cell's real wheels (one fresh interpreter for all).

Each target module is imported for real (the startup hook's hooks install what the decisions say); where it does
not import here (a name no bridge provides, a package the cell lacks) the row is skipped with the error. Per row:
static facts (files) equal the runtime facts (imported module); the decision from either is the same; a second
install is a no-op; nothing of ours sits on the owner unless the decision is "patched"; a stand-in refuses to
provide a name the owner already defines (vLLM's own, here a stand-in object in vLLM's place; name stand-ins);
``revert()`` takes off exactly what is ours, and ``apply()`` after it installs the same thing again (the same
object, or around the same original; a stand-in module may be a new module object of the same entry).
"""

from __future__ import annotations

import json

import pytest

from conftest import run_python
from vllm_compat.catalogue import CATALOGUE

SCRIPT = r"""
import importlib, json, sys, types
import vllm_compat
from vllm_compat.catalogue import CATALOGUE
from vllm_compat.config import read_controls
from vllm_compat.decide import decide_entry
from vllm_compat.detect.static import StaticSite
from vllm_compat.drift import MARK, is_ours, unwrap
from vllm_compat.bridges._name_stand_in import NameStandIn
from vllm_compat.errors import PatchRefusedError

site = StaticSite.installed()
controls = read_controls()
out = {}
for entry in CATALOGUE:
    row = out[entry.id] = {}
    try:
        module = importlib.import_module(entry.target_module)
    except Exception as exc:  # noqa: BLE001 - reported as the skip reason
        row["skip"] = f"{entry.target_module} does not import here: {type(exc).__name__}: {exc}"[:300]
        continue
    point = entry.point
    static = site.facts(entry.id, point.detect_static)
    runtime = point.detect_runtime(module)
    row["differences"] = point.compare(static, runtime)
    decision = decide_entry(entry, runtime, controls)
    row["action"] = decision.action
    row["same_decision"] = [decision.action, decision.variant] == [
        decide_entry(entry, static, controls).action, decide_entry(entry, static, controls).variant]
    owner = point.locate(module)
    row["ours_in_place"] = owner is not None and point.is_installed(owner)
    if decision.action == "patched" and owner is not None:
        row["second_install"] = point.install(owner, decision, point.prepare(owner, runtime))
    if owner is not None and isinstance(point, NameStandIn) and isinstance(owner, types.ModuleType):
        name = getattr(point, "name", entry.target)
        fake = types.ModuleType(entry.target_module)
        own = type(name, (), {})  # the owner's own object where vLLM defines the name
        setattr(fake, name, own)
        try:
            point.prepare(fake, runtime)
            row["refuses_over_own"] = False
        except PatchRefusedError:
            row["refuses_over_own"] = getattr(fake, name) is own
def same_install(old, new):
    # the same entry's install again: around the same original, or (a stand-in module) a new module object
    if not (is_ours(old) and is_ours(new)) or getattr(old, MARK) != getattr(new, MARK):
        return False
    return unwrap(old) is unwrap(new) or isinstance(old, types.ModuleType)


def imported_meanwhile(old, new):
    # a submodule of the owner package imported since (the import system sets it on its parent): not an install
    return old is None and isinstance(new, types.ModuleType) and not is_ours(new)


def alias_attribute_dropped(owner, name, old, new):
    # the parent attribute an alias import had set (vLLM 0.33: vllm.entrypoints.chat_utils is vLLM's
    # vllm.renderers.chat_utils, through the moved_names finder): revert() takes it off with the alias, and apply()
    # leaves it to the next import of the old path to set again; vLLM's module object itself is untouched
    return (new is None and isinstance(old, types.ModuleType) and not is_ours(old)
            and old.__name__ != f"{owner.__name__}.{name}")


def lazy_loaded(old, new):
    # vLLM's LazyLoader (vllm.entrypoints.chat_utils' `transformers` on vLLM <= 0.31) puts the real module in its
    # place in the module's globals when an attribute is first read, as is_ours() above reads one: not an install
    return type(old).__name__ == "LazyLoader" and isinstance(new, types.ModuleType) and not is_ours(new)


targets = {entry.id: entry.target_module for entry in CATALOGUE}
snapshots = {}
for entry in CATALOGUE:
    module = sys.modules.get(entry.target_module)
    owner = entry.point.locate(module) if module is not None else None
    snapshots[entry.id] = (owner, dict(vars(owner)) if owner is not None else None)
vllm_compat.revert()
reverted = {i: (o, dict(vars(o)) if o is not None else None) for i, (o, _) in snapshots.items()}
vllm_compat.apply()
for entry_id, (owner, before) in snapshots.items():
    if owner is None or "skip" in out[entry_id]:
        continue
    after_revert = reverted[entry_id][1]
    out[entry_id]["ours_left_after_revert"] = sorted(k for k, v in after_revert.items() if is_ours(v, entry_id))
    # what was ours before comes off exactly: the wrapped original back, a provided name gone
    out[entry_id]["not_reverted_exactly"] = sorted(
        k for k, v in before.items() if is_ours(v, entry_id)
        and after_revert.get(k, None) is not (unwrap(v, entry_id) if hasattr(v, "__wrapped__") else None))
    now = dict(vars(owner))
    # a target path another bridge provided (moved_names' package, or its alias of vLLM's moved module) is out of
    # sys.modules after revert(): its next import runs the hooks again, so what any bridge had put on this owner stays off
    detached = sys.modules.get(targets[entry_id]) is not owner
    # what is not ours is the very same object; what is ours is this entry's again (a wrapper around the same)
    out[entry_id]["reapplied_other"] = sorted(
        k for k in set(before) | set(now) if not k.startswith("__") and before.get(k) is not now.get(k)
        and not same_install(before.get(k), now.get(k)) and not imported_meanwhile(before.get(k), now.get(k))
        and not alias_attribute_dropped(owner, k, before.get(k), now.get(k))
        and not lazy_loaded(before.get(k), now.get(k))
        and not (detached and is_ours(before.get(k)) and k not in now))
vllm_compat.revert()
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def contract():
    result = run_python(SCRIPT, timeout=900, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT", 1)[1])


@pytest.fixture
def row(contract, request):
    found = contract[request.param]
    if "skip" in found:
        pytest.skip(found["skip"])
    return found


IDS = [e.id for e in CATALOGUE]


@pytest.mark.parametrize("row", IDS, indirect=True)
def test_static_facts_equal_runtime_facts_and_decide_the_same(row):
    assert row["differences"] == []
    assert row["same_decision"]


@pytest.mark.parametrize("row", IDS, indirect=True)
def test_installed_only_where_decided_and_a_second_install_is_a_no_op(row):
    assert row["ours_in_place"] == (row["action"] == "patched"), row
    if row["action"] == "patched":
        assert row["second_install"] is False


@pytest.mark.parametrize("row", IDS, indirect=True)
def test_a_stand_in_refuses_to_replace_the_owners_own_name(row):
    if "refuses_over_own" not in row:
        pytest.skip("not a name put on a module")
    assert row["refuses_over_own"] is True


@pytest.mark.parametrize("row", IDS, indirect=True)
def test_revert_takes_off_exactly_ours_and_apply_puts_the_same_back(row):
    assert row["ours_left_after_revert"] == []
    assert row["not_reverted_exactly"] == []
    assert row["reapplied_other"] == [], "apply() after revert() left other objects than before"
