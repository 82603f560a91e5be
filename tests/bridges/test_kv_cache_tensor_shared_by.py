"""The ``KVCacheTensor(size, shared_by)`` adapter on vllm-omni 0.24.0's AR-diffusion ``build_kv_manager``.

vLLM 0.30 replaced ``KVCacheTensor``'s ``shared_by`` with a placement (``layers, layer_stride, block_stride``);
vllm-omni 0.24.0's ``build_kv_manager`` still passes ``shared_by``. In fresh interpreters, with vllm-omni's and
vLLM's own classes: unpatched on vLLM 0.30+ the real ``TypeError``; adapted, the tensor holds the old meaning in the
new fields. The oracle is the native pair's meaning, read from vLLM 0.24.0's worker (``GPUModelRunner.
_allocate_kv_cache_tensors``: every ``shared_by`` layer gets the one raw tensor of ``size`` bytes, reshaped by the
group spec's pages, so block ``b`` of every layer is at byte ``b * page``), run on the native pair itself and
written out here as ``old_placement``; the page size is the attention spec's formula, not the spec's property.
Also measured: vLLM's ``KVCacheManager`` never reads ``kv_cache_tensors`` (every env), and vLLM 0.30+'s worker
allocator refuses the translated tensor loudly rather than mis-addressing it. vllm-omni's own tests under
``tests/ar_diffusion`` are the behavioural judge (``peer/run.py --suite core``).
"""

from __future__ import annotations

import importlib
import json
import types

import pytest
from packaging.version import Version

from conftest import OMNI_VERSION, VLLM_VERSION, needs_omni, needs_startup_hook, run_python
from vllm_compat.bridges import kv_cache_tensor_shared_by as bridge
from vllm_compat.config import Controls
from vllm_compat.decide import Action
from vllm_compat.detect.static import StaticSite
from vllm_compat.drift import unwrap
from vllm_compat.errors import PatchRefusedError

POINT = bridge.DRIFT_POINT
STATIC = POINT.detect_static(StaticSite.installed())
S, F = bridge.Shape, bridge.KVCacheTensorFacts
acts = pytest.mark.skipif(POINT.decide(STATIC, Controls()).action != Action.PATCHED,
                          reason=f"acts on vLLM 0.30+ (no shared_by) under vllm-omni 0.24.0; here {STATIC}")
native = pytest.mark.skipif((STATIC.fields, STATIC.calls) != (S.OLD, S.OLD),
                            reason=f"needs the native pair (vLLM 0.24 keeps shared_by) with vllm-omni 0.24.0; here "
                                   f"{STATIC}")

# The scenario: vllm-omni's ChunkWindowSpec as ARDiffusionKVCache builds it, three layers, 16 blocks.
BLOCK, HEADS, HEAD_SIZE, FP16_BYTES, LAYERS, BLOCKS = 4, 2, 8, 2, ["l0", "l1", "l2"], 16
PAGE = 2 * BLOCK * HEADS * HEAD_SIZE * FP16_BYTES  # AttentionSpec: K and V, block_size x heads x head_size x dtype


def old_placement(page: int, layers: list[str], num_blocks: int) -> dict:
    """vLLM 0.24's meaning of ``KVCacheTensor(size=page * num_blocks, shared_by=layers)``: one allocation of
    ``size`` bytes, every layer on it from byte 0, block ``b`` at ``b * page``."""
    return {"size": page * num_blocks, "starts": {name: [b * page for b in range(num_blocks)] for name in layers}}


SCRIPT = r"""
import json, dataclasses, torch
from vllm_omni.experimental.ar_diffusion.kv_cache import manager
from vllm_omni.experimental.ar_diffusion.kv_cache.paged import ChunkWindowSpec
import vllm_compat
BLOCK, HEADS, HEAD_SIZE, LAYERS, BLOCKS = %(scenario)s
out = {"decision": [d.action for d in vllm_compat.current_decisions() if d.name == "kv_cache_tensor_shared_by"]}
spec = ChunkWindowSpec(block_size=BLOCK, num_kv_heads=HEADS, head_size=HEAD_SIZE, dtype=torch.float16,
                       sliding_window=2 * BLOCK, chunk_size=BLOCK, window_chunks=2)


class Untouchable(list):
    # kv_cache_tensors that records, and fails, any read of its items
    reads = []

    def _read(self, how, *args):
        Untouchable.reads.append(how)
        raise AssertionError("kv_cache_tensors read: " + how)

    __iter__ = lambda self: self._read("iter")
    __len__ = lambda self: self._read("len")
    __bool__ = lambda self: self._read("bool")
    __getitem__ = lambda self, i: self._read("getitem")
    __contains__ = lambda self, x: self._read("contains")


try:
    kv = manager.build_kv_manager(spec, list(LAYERS), BLOCKS, 1024)
except Exception as exc:
    out["build"] = f"{type(exc).__name__}: {exc}"
else:
    config = kv.kv_cache_config
    (tensor,) = config.kv_cache_tensors
    out["build"] = "ok"
    out["tensor"] = {f.name: getattr(tensor, f.name) for f in dataclasses.fields(tensor)}
    field = "shared_by" if "shared_by" in out["tensor"] else "layers"
    out["same_list_as_group"] = getattr(tensor, field) is config.kv_cache_groups[0].layer_names
    if field == "layers":  # by vLLM's own formula: layer l, block b at offset + l * layer_stride + b * block_stride
        out["starts"] = {name: [tensor.offset + l * tensor.layer_stride + b * tensor.block_stride
                                for b in range(config.num_blocks)] for l, name in enumerate(tensor.layers)}
        try:
            from vllm.v1.kv_cache_layout import KVCacheLayout
            from vllm.v1.worker.utils import allocate_kv_cache
            allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout.LBNHC)
            out["vllm_allocator"] = "allocated"
        except Exception as exc:
            out["vllm_allocator"] = f"{type(exc).__name__}: {exc}"
    else:  # the native pair: vLLM 0.24's own worker allocation of this config
        from types import SimpleNamespace
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        raw = GPUModelRunner._allocate_kv_cache_tensors(
            SimpleNamespace(device=torch.device("cpu"), runner_only_attn_layers=set()), config)
        pages = {name: t.view(config.num_blocks, -1) for name, t in raw.items()}  # as _reshape_kv_cache_tensors
        base = raw[LAYERS[0]].data_ptr()
        out["size"] = raw[LAYERS[0]].numel()
        out["starts"] = {name: [p[b].data_ptr() - base for b in range(config.num_blocks)] for name, p in pages.items()}

    # vLLM's KVCacheManager over vllm-omni's config with kv_cache_tensors that fails on any read, driven as
    # ARDiffusionKVCache drives it: a chunk per step past the window, then free
    real_config = manager.KVCacheConfig
    manager.KVCacheConfig = lambda **kw: real_config(**{**kw, "kv_cache_tensors": Untouchable(kw["kv_cache_tensors"])})
    try:
        kv = manager.build_kv_manager(spec, list(LAYERS), BLOCKS, 1024)
        request = manager.ARDiffusionRequestAdapter("r0", chunk_size=BLOCK)
        if not hasattr(request, "num_in_flight_tokens"):
            # vLLM 0.26+'s allocate_slots reads it and vllm-omni 0.24.0's adapter lacks it (a drift of its own, not
            # this one's); later vllm-omni sets it to 0 on this adapter, as here
            request.num_in_flight_tokens = 0
        tables = []
        for _ in range(4):
            assert kv.allocate_slots(request, num_new_tokens=BLOCK) is not None
            tables.append(list(kv.get_block_ids("r0")[0]))
            request.on_chunk_committed()
        kv.free(request)
        out["manager"] = {"tables": len(tables), "reads": Untouchable.reads}
    except Exception as exc:
        out["manager"] = {"error": f"{type(exc).__name__}: {exc}", "reads": Untouchable.reads}
    finally:
        manager.KVCacheConfig = real_config

wrapped = manager.build_kv_manager
vllm_compat.revert()
out["reverted_to_original"] = manager.build_kv_manager is getattr(wrapped, "__wrapped__", wrapped)
print("RESULT", json.dumps(out))
""" % {"scenario": repr((BLOCK, HEADS, HEAD_SIZE, LAYERS, BLOCKS))}  # noqa: UP031 - the script holds braces


def _run(env: dict | None = None) -> dict:
    result = run_python(SCRIPT, env=env, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


@pytest.fixture(scope="module")
def as_installed() -> dict:
    """The scenario with vllm_compat as users get it (the startup hook's decisions)."""
    return _run()


# ---- decisions and shapes ----

@pytest.mark.parametrize(("fields", "calls", "action"), [
    (S.NEW, S.OLD, Action.PATCHED),
    (S.OLD, S.OLD, Action.SKIPPED),
    (S.NEW, S.NEW, Action.SKIPPED),
    (S.NEW, S.NO_CALL, Action.SKIPPED),
    (S.OLD, S.NEW, Action.REFUSED),
    (S.UNKNOWN, S.OLD, Action.REFUSED),
    (S.NEW, S.UNKNOWN, Action.REFUSED),
    (S.ABSENT, S.OLD, Action.PENDING),
    (S.NEW, S.ABSENT, Action.PENDING),
], ids=["adapt", "native", "both-new", "no-call", "new-caller-old-vllm", "unknown-fields", "unknown-call", "no-vllm",
        "no-omni"])
def test_decision_table(fields, calls, action):
    assert POINT.decide(F(fields, calls), Controls()).action == action


OLD_FIELDS = "class KVCacheTensor:\n    size: int\n    shared_by: list[str]\n    offset: int = 0\n    block_stride: int = 0\n"
NEW_FIELDS = ("class KVCacheTensor:\n    size: int\n    layers: list[str]\n    layer_stride: int\n    block_stride: int\n"
              "    offset: int = 0\n    host_resident: bool = False\n")
IMPORT = "from vllm.v1.kv_cache_interface import KVCacheTensor\n"


def _calls(body: str) -> str:
    return bridge.classify_calls(IMPORT + body)[0]


def test_shapes_on_sources():
    assert bridge.fields_shape(*bridge.fields_from_source(OLD_FIELDS)) == S.OLD
    assert bridge.fields_shape(*bridge.fields_from_source(NEW_FIELDS)) == S.NEW
    assert bridge.fields_shape(*bridge.fields_from_source(NEW_FIELDS + "    kind: str\n")) == S.UNKNOWN  # one more to fill
    assert bridge.fields_from_source("class Other:\n    size: int\n") is None
    old_call = "    return [KVCacheTensor(size=spec.page_size_bytes * n, shared_by=names)]\n"
    assert _calls("def build_kv_manager(spec, names, n):\n" + old_call) == S.OLD
    assert _calls("def other(spec, names, n):\n" + old_call) == S.UNKNOWN  # outside the function the adapter wraps
    assert _calls("def build_kv_manager(names, n):\n" + old_call) == S.UNKNOWN  # no spec: no page size
    assert _calls("def build_kv_manager(spec, names, n):\n    KVCacheTensor(size=1, shared_by=names, offset=8)\n") == S.UNKNOWN
    assert _calls("def build_kv_manager(spec, names, n):\n    KVCacheTensor(1, names)\n") == S.UNKNOWN
    assert _calls("def f(spec):\n    KVCacheTensor(size=1, layers=[], layer_stride=1, block_stride=1)\n") == S.NEW
    assert _calls("def f(spec):\n    pass\n") == S.NO_CALL
    assert bridge.classify_calls("def build_kv_manager(spec):\n    KVCacheTensor(size=1, shared_by=[])\n")[0] == S.NO_CALL


@needs_omni
@pytest.mark.skipif(VLLM_VERSION is None or OMNI_VERSION != "0.24.0", reason="needs vLLM and vllm-omni 0.24.0")
def test_facts_are_what_the_wheels_say_and_agree_at_run_time():
    """vLLM 0.24.0 has shared_by, 0.30.0 / 0.33.0 / 0.34.0 the placement (read from the wheels); vllm-omni 0.24.0's
    manager calls it once, with size= and shared_by=, in build_kv_manager."""
    vllm = Version(VLLM_VERSION)
    if Version("0.25") <= vllm < Version("0.30"):
        pytest.skip(f"vLLM {VLLM_VERSION}: between the wheels read (0.24.0 and 0.30.0+)")
    assert STATIC.fields == (S.OLD if vllm < Version("0.25") else S.NEW)
    assert (STATIC.calls, STATIC.call_lines) == (S.OLD, ("line 132: shared_by, size (in build_kv_manager)",))
    module = importlib.import_module(POINT.target_module)
    assert POINT.detect_runtime(module) == STATIC


# ---- vllm-omni's build_kv_manager on the real wheels ----

@native
def test_the_native_pair_shares_one_raw_tensor_paged_by_the_spec(as_installed):
    """The oracle, measured: vLLM 0.24's worker allocation of vllm-omni's own config."""
    out = as_installed
    assert out["decision"] == ["skipped"] and out["build"] == "ok"
    assert out["tensor"] == {"size": PAGE * BLOCKS, "shared_by": LAYERS, "offset": 0, "block_stride": 0}
    assert {"size": out["size"], "starts": out["starts"]} == old_placement(PAGE, LAYERS, BLOCKS)


@acts
def test_unpatched_build_kv_manager_fails_with_the_real_type_error():
    out = _run({"VLLM_COMPAT_DISABLE_PATCHES": POINT.id})
    assert out["build"] == "TypeError: KVCacheTensor.__init__() got an unexpected keyword argument 'shared_by'", out


@acts
@needs_startup_hook
def test_adapted_the_tensor_holds_the_old_meaning_in_the_new_fields(as_installed):
    out = as_installed
    assert out["decision"] == ["patched"] and out["build"] == "ok", out
    import dataclasses

    from vllm.v1.kv_cache_interface import KVCacheTensor

    # host_resident (default False, which the adapter leaves) is a field from vLLM 0.30 on; 0.29's tensor lacks it
    resident = {"host_resident": False} if "host_resident" in {f.name for f in dataclasses.fields(KVCacheTensor)} else {}
    assert out["tensor"] == {"size": PAGE * BLOCKS, "layers": LAYERS, "layer_stride": 0, "block_stride": PAGE,
                             "offset": 0, **resident}
    assert out["same_list_as_group"]  # layers is vllm-omni's list, as shared_by was
    assert {"size": out["tensor"]["size"], "starts": out["starts"]} == old_placement(PAGE, LAYERS, BLOCKS)
    # nothing in vLLM reads it on vllm-omni's path; vLLM's worker allocator, were it handed it, refuses loudly
    assert out["manager"] == {"tables": 4, "reads": []}
    assert out["vllm_allocator"].startswith("AssertionError"), out
    assert out["reverted_to_original"]


@needs_omni
def test_vllms_kv_cache_manager_never_reads_kv_cache_tensors(as_installed):
    """On every pair where vllm-omni's build_kv_manager runs (natively or adapted)."""
    out = as_installed
    if out["build"] != "ok":
        pytest.skip(f"build_kv_manager does not run here: {out['build']}")
    assert out["manager"] == {"tables": 4, "reads": []}


# ---- the contract check ----

@acts
def test_refuses_a_manager_of_another_shape():
    module = importlib.import_module(POINT.target_module)
    original = unwrap(vars(module)[bridge.NAME], POINT.id)

    def fake(**names):
        owner = types.ModuleType(POINT.target_module)
        vars(owner).update({bridge.NAME: original, bridge.TENSOR: module.KVCacheTensor, **names})
        return owner

    POINT.prepare(fake(), STATIC)  # vllm-omni's own shape: accepted
    old_shaped = type(bridge.TENSOR, (), {})  # not vLLM's class in the module's binding
    spec_free = types.FunctionType(compile("def build_kv_manager(layer_names): KVCacheTensor", "m", "exec").co_consts[0],
                                   {})
    for owner in (fake(**{bridge.TENSOR: old_shaped}), fake(**{bridge.NAME: spec_free})):
        with pytest.raises(PatchRefusedError):
            POINT.prepare(owner, STATIC)
