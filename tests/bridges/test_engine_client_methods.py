"""engine_client_methods: vllm-omni's AsyncOmni can be built on a vLLM whose EngineClient gained abstract methods.

The oracle is Python's own: ``AsyncOmni.__new__(AsyncOmni)`` raises ``TypeError: Can't instantiate abstract class``
exactly when vLLM's ``EngineClient`` declares an abstract method vllm-omni does not define (the check ``object.__new__``
makes before any ``__init__``), and the expected names are read from vLLM's live class, not from the bridge."""

from __future__ import annotations

import asyncio
import json

import pytest

from conftest import needs_startup_hook, needs_vllm, run_python
from vllm_compat.bridges import engine_client_methods as bridge
from vllm_compat.bridges.engine_client_methods import EngineClientFacts
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite

STATIC = bridge.DRIFT_POINT.detect_static(StaticSite.installed())
needs_drift = pytest.mark.skipif(not STATIC.missing or STATIC.missing == (bridge.ABSENT,),
                                 reason=f"needs a vLLM whose EngineClient declares abstract methods vllm-omni's AsyncOmni "
                                 f"lacks (0.31+) with a vllm-omni installed; here {STATIC}")
PROBE = """
import json, sys
try:
    from vllm_omni.entrypoints.async_omni import AsyncOmni
except ImportError as exc:  # a CPU-torch cell may lack what vLLM's requirements import (torchvision)
    print(json.dumps({"import_error": str(exc)})); sys.exit(0)
from vllm.engine.protocol import EngineClient
declared = sorted(EngineClient.__abstractmethods__)
defined = sorted(n for n in declared if any(n in vars(c) for c in AsyncOmni.__mro__
                                            if c is not EngineClient and c.__module__.startswith("vllm_omni")))
try:
    AsyncOmni.__new__(AsyncOmni)
    built = None
except TypeError as exc:
    built = str(exc)
print(json.dumps({"declared": declared, "defined": defined, "built": built}))
"""


def _probe(**env) -> dict:
    result = run_python(PROBE, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    data = json.loads(result.stdout.strip().splitlines()[-1])
    if "import_error" in data:
        pytest.skip(f"vllm_omni.entrypoints.async_omni does not import here: {data['import_error']}")
    return data


@pytest.mark.parametrize(("missing", "action"), [
    (("release_kv_cache_memory",), Action.PATCHED), ((), Action.SKIPPED), ((bridge.ABSENT,), Action.PENDING)])
def test_decision_table(missing, action):
    assert bridge.DRIFT_POINT.decide(EngineClientFacts(missing)).action == action


def test_static_facts_read_both_packages_files(tmp_path):
    """Abstract methods from vLLM's file, definitions followed through vllm-omni's own base classes."""
    from vllm_compat.detect.source_tree import SourceTree

    files = {
        "vllm/__init__.py": "",
        "vllm/engine/protocol.py": "from abc import ABC, abstractmethod\nclass EngineClient(ABC):\n"
                                   "    @abstractmethod\n    async def kept(self): ...\n"
                                   "    @abstractmethod\n    async def added(self): ...\n"
                                   "    def concrete(self): ...\n",
        "vllm_omni/__init__.py": "",
        "vllm_omni/entrypoints/__init__.py": "",
        "vllm_omni/entrypoints/base.py": "class Base:\n    async def kept(self): ...\n",
        "vllm_omni/entrypoints/async_omni.py": "from vllm.engine.protocol import EngineClient\n"
                                               "from vllm_omni.entrypoints.base import Base\n"
                                               "class AsyncOmni(Base, EngineClient):\n    pass\n",
    }
    for relpath, text in files.items():
        (tmp_path / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relpath).write_text(text)
    tree = SourceTree(tmp_path)
    site = StaticSite(tree, tree, {"vllm": None, "vllm-omni": None, "torch": None})
    assert bridge.DRIFT_POINT.detect_static(site) == EngineClientFacts(("added",))


@needs_vllm
@needs_drift
@needs_startup_hook
def test_unpatched_asyncomni_cannot_be_built_and_the_bridge_builds_it():
    unpatched = _probe(VLLM_COMPAT_DISABLE_PATCHES="engine_client_methods")
    missing = sorted(set(unpatched["declared"]) - set(unpatched["defined"]))
    assert missing == list(STATIC.missing)  # the static facts are vLLM's own abstract set minus vllm-omni's
    assert unpatched["built"] is not None and "Can't instantiate abstract class AsyncOmni" in unpatched["built"]
    assert all(name in unpatched["built"] for name in missing)
    assert _probe()["built"] is None  # with vllm_compat (the startup hook): AsyncOmni builds


@needs_vllm
@needs_drift
def test_the_methods_raise_naming_themselves_and_revert_is_exact():
    import abc

    import vllm_compat

    vllm_compat.apply()
    try:
        from vllm_omni.entrypoints.async_omni import AsyncOmni
    except ImportError as exc:  # a CPU-torch cell lacks torchvision, which vLLM's requirements import
        pytest.skip(f"vllm_omni.entrypoints.async_omni does not import here: {exc}")
    client = AsyncOmni.__new__(AsyncOmni)
    for name in STATIC.missing:
        with pytest.raises(bridge.EngineClientMethodError, match=f"EngineClient.{name}"):
            result = getattr(client, name)()
            if asyncio.iscoroutine(result):
                asyncio.run(result)
    vllm_compat.revert()
    assert sorted(AsyncOmni.__abstractmethods__) == list(STATIC.missing)
    assert not any(getattr(v, "_vllm_compat_installed", None) for v in vars(AsyncOmni).values())
    vllm_compat.apply()
    assert not AsyncOmni.__abstractmethods__ and isinstance(AsyncOmni, abc.ABCMeta)


@needs_vllm
def test_stays_out_where_asyncomni_implements_every_abstract_method():
    if STATIC.missing:
        pytest.skip(f"vLLM's EngineClient declares {STATIC.missing} that AsyncOmni lacks here")
    import vllm_compat

    decisions = {d.name: d for d in vllm_compat.apply()}
    assert decisions["engine_client_methods"].action in (Action.SKIPPED, Action.PENDING)
    try:
        from vllm_omni.entrypoints.async_omni import AsyncOmni
    except ImportError as exc:
        pytest.skip(f"vllm_omni.entrypoints.async_omni does not import here: {exc}")
    # nothing of this entry's (async_omni_session_id may wrap generate here: vLLM 0.28+ under vllm-omni <= 0.28.0)
    assert not any(getattr(v, "_vllm_compat_installed", None) == "engine_client_methods"
                   for v in vars(AsyncOmni).values())
