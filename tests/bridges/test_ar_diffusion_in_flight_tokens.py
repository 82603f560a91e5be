"""``ar_diffusion_in_flight_tokens``: vLLM 0.26+'s ``KVCacheManager`` reads ``request.num_in_flight_tokens``, which
vllm-omni 0.24.0's ``ARDiffusionRequestAdapter`` lacks.

In fresh interpreters, vllm-omni's own ``ARDiffusionKVCache`` (its adapter, its ``ChunkWindowSpec`` and manager) drives
vLLM's real ``KVCacheManager`` on CPU as its rollout does: two CFG branches (one with a prefill prefix), a chunk
allocated and committed at a time past the window, a two-chunk span through ``allocate_token_slots``, then both
requests ended. Unpatched on vLLM 0.26+ the first allocation raises the real ``AttributeError``; with the stand-in
every block table and free-block count is the native pair's. The oracle is that run on the native pair (vLLM 0.24.0
with vllm-omni 0.24.0, where the manager does not read the attribute), written out here as ``NATIVE``; on the native
pair the test re-measures it. vllm-omni's own tests under ``tests/ar_diffusion`` are the behavioural judge
(``peer/run.py --suite core``).
"""

from __future__ import annotations

import importlib
import json

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, needs_startup_hook, run_python
from vllm_compat.bridges import ar_diffusion_in_flight_tokens as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite
from vllm_compat.errors import PatchRefusedError

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
K, F = bridge.Kind, bridge.InFlightTokensFacts
acts = pytest.mark.skipif(POINT.decide(STATIC, Controls()).action != Action.PATCHED,
                          reason=f"acts where vLLM's KV cache manager reads num_in_flight_tokens (0.26+) and "
                                 f"vllm-omni's adapter lacks it (0.24.0); here {STATIC}")
native = pytest.mark.skipif((STATIC.vllm, STATIC.omni) != (K.FITS, K.LACKS),
                            reason=f"needs the native pair (vLLM 0.24 does not read it) with vllm-omni 0.24.0; here "
                                   f"{STATIC}")

# Measured on the native pair (vLLM 0.24.0 + vllm-omni 0.24.0) with SCRIPT: [what, request, block table, free
# blocks after] per call; block 0 is vLLM's null block (a slot evicted out of the window).
NATIVE = {"blocks": 16, "steps": [
    ["chunk", "pos", [1], 14], ["chunk", "neg", [2, 3, 4], 11],
    ["chunk", "pos", [1, 5], 10], ["chunk", "neg", [2, 3, 4, 6], 9],
    ["chunk", "pos", [1, 5, 7], 8], ["chunk", "neg", [0, 3, 4, 6, 2], 8],
    ["chunk", "pos", [1, 5, 7, 8], 7], ["chunk", "neg", [0, 0, 4, 6, 2, 3], 7],
    ["chunk", "pos", [0, 5, 7, 8, 1], 7], ["chunk", "neg", [0, 0, 0, 6, 2, 3, 4], 7],
    ["chunk", "pos", [0, 0, 7, 8, 1, 5], 7], ["chunk", "neg", [0, 0, 0, 0, 2, 3, 4, 6], 7],
    ["span", "pos", [0, 0, 0, 8, 1, 5, 7, 9], 6], ["span", "neg", [0, 0, 0, 0, 0, 3, 4, 6, 2, 10], 5],
    ["end", "pos", None, 10], ["end", "neg", None, 15],
]}

SCRIPT = r"""
import json, torch
import vllm_compat
from vllm_omni.experimental.ar_diffusion.kv_cache import ARDiffusionKVCache, ARDiffusionKVConfig
from vllm_omni.experimental.ar_diffusion.kv_cache import manager

out = {"decision": [d.action for d in vllm_compat.current_decisions() if d.name == "ar_diffusion_in_flight_tokens"]}
BLOCK, PAGE = 4, 2 * 4 * 1 * 8 * 4  # K and V x block x heads x head size x fp32: 16 blocks in 16 pages of budget
kv = ARDiffusionKVCache(ARDiffusionKVConfig(enable=True, chunk_size=BLOCK, window_chunks=2, sink_chunks=1,
                                            gpu_memory_fraction=1.0),
                        num_layers=1, num_kv_heads=1, head_size=8, dtype=torch.float32, block_size=BLOCK,
                        max_model_len=256, available_bytes=16 * PAGE, device=None)
free = kv.manager.block_pool.get_num_free_blocks
steps = []
pos, neg = kv.begin_request("pos"), kv.begin_request("neg", prefill_prefix_tokens=2 * BLOCK)
try:
    for _ in range(6):  # a chunk at a time, as ARDiffusionKVCache's callers do: allocate, write, commit
        for adapter in (pos, neg):
            steps.append(["chunk", adapter.request_id, kv.allocate_chunk(adapter), free()])
            kv.commit_chunk(adapter)
    for adapter in (pos, neg):  # the paged-attention path: a two-chunk span, committed after the forward
        steps.append(["span", adapter.request_id, kv.allocate_token_slots(adapter, 2 * BLOCK), free()])
        adapter.on_chunk_committed()
        adapter.on_chunk_committed()
    for adapter in (pos, neg):
        kv.end_request(adapter)
        steps.append(["end", adapter.request_id, None, free()])
except Exception as exc:
    steps.append(f"{type(exc).__name__}: {exc}")
out["allocation"] = {"blocks": kv.num_blocks, "steps": steps}
vllm_compat.revert()
out["after_revert"] = "num_in_flight_tokens" in vars(manager.ARDiffusionRequestAdapter)
print("RESULT", json.dumps(out))
"""


def _run(env: dict | None = None) -> dict:
    result = run_python(SCRIPT, env=env, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


@pytest.fixture(scope="module")
def as_installed() -> dict:
    """The scenario with vllm_compat as users get it (the startup hook's decisions)."""
    return _run()


# ---- decisions and detection ----

@pytest.mark.parametrize(("facts", "action"), [
    (F(K.READS, K.LACKS, ("a.py",)), Action.PATCHED),
    (F(K.FITS, K.LACKS), Action.SKIPPED),
    (F(K.READS, K.FITS, ("a.py",)), Action.SKIPPED),
    (F(K.READS, K.ABSENT, ("a.py",)), Action.SKIPPED),
    (F(K.ABSENT, K.LACKS), Action.PENDING),
], ids=["reads+lacks", "native", "omni-defines", "no-adapter", "no-vllm"])
def test_decision_table(facts, action):
    assert POINT.decide(facts, Controls()).action == action


def test_reads_and_definitions_are_told_apart():
    assert bridge.reads_it("def f(request):\n    return max(0, n - request.num_in_flight_tokens)\n")
    assert not bridge.reads_it("def f(request_id, num_in_flight_tokens):\n    return num_in_flight_tokens\n")
    assert not bridge.reads_it("def f(request):\n    request.num_in_flight_tokens = 0\n")
    lacks = "class ARDiffusionRequestAdapter:\n    def __init__(self):\n        self.status = 0\n"
    assigned = "class ARDiffusionRequestAdapter:\n    def __init__(self):\n        self.num_in_flight_tokens = 0\n"
    at_class = "class ARDiffusionRequestAdapter:\n    num_in_flight_tokens: int = 0\n"
    as_property = (
        "class ARDiffusionRequestAdapter:\n    @property\n    def num_in_flight_tokens(self):\n        return 0\n")
    assert bridge.adapter_defines_it(lacks) == K.LACKS
    assert {bridge.adapter_defines_it(s) for s in (assigned, at_class, as_property)} == {K.FITS}
    assert bridge.adapter_defines_it("class Other:\n    pass\n") == K.ABSENT


@needs_omni
@pytest.mark.skipif(VLLM_VERSION is None or OMNI_VERSION != "0.24.0", reason="needs vLLM and vllm-omni 0.24.0")
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    """vLLM 0.24.0 / 0.25.1 do not read it, 0.26.0-0.34.0 read it in kv_cache_manager.py (read from the wheels);
    vllm-omni 0.24.0's adapter does not define it (0.26.0+ assign it in __init__)."""
    reads = Version(VLLM_VERSION) >= Version("0.26")
    assert STATIC == F(K.READS if reads else K.FITS, K.LACKS, ("vllm/v1/core/kv_cache_manager.py",) if reads else ())
    assert POINT.detect_runtime(importlib.import_module(POINT.target_module)) == STATIC


# ---- vllm-omni's AR-diffusion KV cache on vLLM's real KVCacheManager ----

@native
def test_the_native_pair_allocates_as_recorded(as_installed):
    """The oracle, re-measured where it was taken."""
    assert as_installed["decision"] == ["skipped"]
    assert as_installed["allocation"] == NATIVE


@acts
def test_unpatched_allocation_fails_with_the_real_attribute_error():
    out = _run({"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
    assert out["allocation"]["steps"] == [
        "AttributeError: 'ARDiffusionRequestAdapter' object has no attribute 'num_in_flight_tokens'"], out


def _shape(allocation: dict) -> dict:
    """What the manager decides, apart from which free block vLLM's pool hands out: per call the table's
    length, which slots are evicted (vLLM's null block 0) and the free count. vLLM 0.27.x's pool, with caching
    off, puts a freed block at the end of its free queue, where 0.24 and 0.28+ hand it out next: the same
    allocation under other ids (block_pool.free_blocks, read from the 0.24.0, 0.26.0, 0.27.1 and 0.28.0 wheels)."""
    return {"blocks": allocation["blocks"], "steps": [
        [what, request, None if table is None else [block == 0 for block in table], free]
        for what, request, table, free in allocation["steps"]]}


@acts
@needs_startup_hook
def test_patched_allocates_the_blocks_the_native_pair_does(as_installed):
    assert as_installed["decision"] == ["patched"]
    steps = as_installed["allocation"]["steps"]
    assert _shape(as_installed["allocation"]) == _shape(NATIVE)
    for _, _, table, _ in steps:  # a block is held once: the live slots of a table are distinct blocks
        live = [block for block in table or () if block != 0]
        assert len(live) == len(set(live)), steps
    pos, neg = ([set(t) - {0} for what, r, t, _ in steps if r == request and t][-1] for request in ("pos", "neg"))
    assert not pos & neg, steps  # the two CFG branches never share a block
    assert as_installed["after_revert"] is False  # revert takes the stand-in off vllm-omni's class


# ---- install, uninstall, the contract check ----

@needs_omni
@acts
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    owner = POINT.locate(importlib.import_module(POINT.target_module))
    had = POINT.is_installed(owner)
    POINT.uninstall(owner)
    assert bridge.NAME not in vars(owner)
    POINT.prepare(owner, STATIC)  # vllm-omni 0.24.0's adapter: the premise holds
    assert POINT.install(owner, None, None) and not POINT.install(owner, None, None)
    adapter = owner("r0", chunk_size=4)
    assert adapter.num_in_flight_tokens == 0 and type(adapter.num_in_flight_tokens) is int
    if not had:
        POINT.uninstall(owner)


def test_refuses_an_adapter_whose_count_a_caller_can_advance():
    """Shapes no release has (written here): a settable ``num_computed_tokens`` (a caller could count tokens ahead
    of their step, which 0 would hide) and a base class that already gives the attribute."""
    class Settable:
        num_computed_tokens = 0

    class WithSetter:
        num_computed_tokens = property(lambda self: 0, lambda self, value: None)

    class Base:
        num_in_flight_tokens = 3

    class Inherits(Base):
        num_computed_tokens = property(lambda self: 0)

    class Committed:
        num_computed_tokens = property(lambda self: 0)

    POINT.prepare(Committed, STATIC)
    for owner in (Settable, WithSetter, Inherits):
        with pytest.raises(PatchRefusedError, match=owner.__name__):
            POINT.prepare(owner, STATIC)
