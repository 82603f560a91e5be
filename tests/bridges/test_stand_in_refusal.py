"""The refusal inside ``provide()`` on the real wheels: where the installed vLLM defines a name a stand-in stands in
for, installing the stand-in anyway (the decision and ``prepare`` bypassed, as a hook racing a reload or a caller of
the drift-point API would) raises ``PatchRefusedError`` and leaves vLLM's own object where it was, unmarked.

The expectation is vLLM's module itself: the object bound before the call is the one bound after it.
"""

from __future__ import annotations

import importlib

import pytest

from conftest import needs_vllm
from vllm_compat.bridges import HostKind
from vllm_compat.bridges._name_stand_in import NameStandIn
from vllm_compat.catalogue import CATALOGUE
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite
from vllm_compat.drift import is_ours, provide
from vllm_compat.errors import PatchRefusedError

STAND_INS = [e for e in CATALOGUE if isinstance(e.point, NameStandIn)]


def _defined_here(entry):
    """(module, vLLM's own object) where the installed vLLM defines the stand-in's name, else a skip reason."""
    point = entry.point
    facts = point.detect_static(StaticSite.installed())
    host = getattr(facts, "host", None) or getattr(getattr(facts, "stand_in", None), "host", None)
    if host != HostKind.DEFINES:
        return None, f"the installed vLLM does not define {entry.target_path} ({host})"
    try:
        module = importlib.import_module(entry.target_module)
    except Exception as exc:  # noqa: BLE001 - a module of this vLLM that does not import without a GPU stack
        return None, f"{entry.target_module} does not import here: {type(exc).__name__}: {exc}"
    return module, None


@needs_vllm
@pytest.mark.parametrize("entry", STAND_INS, ids=[e.id for e in STAND_INS])
def test_installing_over_vllm_s_own_name_raises_and_leaves_it(entry):
    module, reason = _defined_here(entry)
    if module is None:
        pytest.skip(reason)
    point = entry.point
    if point.name not in vars(module):  # a submodule vLLM ships is bound on its parent once imported
        try:
            importlib.import_module(f"{module.__name__}.{point.name}")
        except ImportError:
            pass
    if point.name not in vars(module):
        pytest.skip(f"{entry.target_path} is not bound on the imported {module.__name__}")
    own = vars(module)[point.name]
    assert not is_ours(own), f"{entry.target_path} is already a stand-in: {own!r}"
    stand_in = type(point.name, (), {})
    forced = entry.decision(Action.PATCHED, "forced by the test")
    with pytest.raises(PatchRefusedError, match="not vllm_compat's stand-in"):
        point.install(module, forced, stand_in)
    assert vars(module)[point.name] is own and not is_ours(own) and not is_ours(stand_in)
    with pytest.raises(PatchRefusedError):
        provide(module, point.name, stand_in, entry.id)
    assert vars(module)[point.name] is own
    assert point.uninstall(module) is False and vars(module)[point.name] is own  # never withdraws vLLM's own


@needs_vllm
def test_some_stand_in_name_is_vllm_s_own_here_or_the_cell_says_why():
    """The parametrized test above must not pass by skipping everywhere: on vLLM 0.30 four names are vLLM's own."""
    defined = [e.id for e in STAND_INS if _defined_here(e)[0] is not None]
    if not defined:
        pytest.skip("no stand-in's name is defined by this vLLM (vLLM 0.31+ removed them all)")
    assert defined
