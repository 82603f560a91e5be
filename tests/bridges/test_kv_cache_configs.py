"""The ``get_kv_cache_configs`` stand-in on the real wheels.

vLLM 0.33 moved ``vllm.v1.core.kv_cache_utils.get_kv_cache_configs`` to ``kv_cache_planning`` and split the grouping
out of it; vllm-omni 0.30.0's ``vllm_omni.diffusion.diffusion_kv.initialization`` (imported by its diffusion engine)
imports the old name. Unpatched on vLLM 0.33 both modules raise the real ImportError (reproduced first, in fresh
interpreters); with the stand-in they import. The oracle is vLLM 0.32.0's own function: its results for eight inputs
the test controls (``tests/support/kv_cache_plans.py``), recorded field for field in
``kv_cache_configs.vllm-0.32.0.json`` (``python -m tests.support.kv_cache_plans`` on vLLM 0.32), are checked against
vLLM's own function where it has one (0.29-0.32; 0.29-0.31 on the fields they have) and against the stand-in where
it does not (0.33). vllm-omni's own caller, ``build_native_kv_cache_configs``, is held to the same numbers. Where vLLM
has the name the stand-in stays out.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
from packaging.version import Version

import vllm_compat
from conftest import VLLM_VERSION, needs_omni, needs_startup_hook, needs_vllm, run_python
from tests.bridges import name_stand_in_cases as cases
from tests.support.kv_cache_plans import (
    RECORD,
    SCENARIOS,
    canonical,
    field_names,
    has_block_layout,
    outcome,
    scenario,
    shared,
)
from vllm_compat.bridges import HostKind, is_ours
from vllm_compat.bridges import kv_cache_configs as stand_in
from vllm_compat.bridges.kv_cache_configs import Shape
from vllm_compat.detect.static import StaticSite
from vllm_compat.errors import PatchRefusedError

STATIC = stand_in.DRIFT_POINT.detect_static(StaticSite.installed())
UTILS = stand_in.DRIFT_POINT.entry.target_module
IMPORTER = "vllm_omni.diffusion.diffusion_kv.initialization"
ENGINE = "vllm_omni.diffusion.diffusion_engine"
IMPORT_ERROR = f"ImportError: cannot import name '{stand_in.NAME}' from '{UTILS}'"
_HERE = f"here: vLLM {STATIC.host} the name; vllm-omni importers {list(STATIC.importers)}"
needs_stand_in = pytest.mark.skipif(
    STATIC.host != HostKind.LACKS or not STATIC.importers,
    reason=f"needs vLLM >= 0.33 (no {stand_in.DRIFT_POINT.entry.target_path}) with vllm-omni 0.30.0 (imports it); {_HERE}",
)
needs_importer = pytest.mark.skipif(
    not STATIC.importers, reason=f"needs a vllm-omni whose {stand_in.IMPORTERS[0]} imports {stand_in.NAME} (0.30.0; "
                                 f"0.24.0 has no diffusion KV); {_HERE}")
needs_vllms_own = pytest.mark.skipif(STATIC.host != HostKind.DEFINES,
                                     reason=f"needs vLLM <= 0.32 (defines {stand_in.NAME}), e.g. env e32; {_HERE}")

@pytest.fixture(scope="module")
def utils():
    module = importlib.import_module(UTILS)
    vllm_compat.apply()
    return module


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


# ---- decisions and shapes ----

@pytest.mark.parametrize(("facts", "action"), cases.FUNCTION_DECISION_CASES, ids=cases.FUNCTION_DECISION_IDS)
def test_decision_table(facts, action):
    cases.check_decision(stand_in.DRIFT_POINT, facts, action)


def test_shapes_the_stand_in_does_not_know_are_unknown():
    """Planning modules and calls no release has (so written here): another signature of either function, no
    grouping question on model_config, calls passing what the old function did not take."""
    grouping = "def get_global_kv_cache_groups(vllm_config, kv_cache_specs):\n    pass\n"
    planner = ("def get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory, global_kv_cache_groups):\n"
               "    pass\n")
    builder = "def f(vllm_config):\n    return vllm_config.model_config.supports_kv_cache_grouping\n"

    def replacement(source):
        return stand_in._replacement_from_source(source)[0]

    assert replacement(grouping + planner + builder) == Shape.KNOWN
    assert replacement(grouping + builder) == Shape.UNKNOWN  # no planner
    assert replacement(planner + builder) == Shape.UNKNOWN  # no grouping function
    assert replacement(grouping + planner) == Shape.UNKNOWN  # nobody asks the model config
    assert replacement(grouping + planner.replace("global_kv_cache_groups)", "global_kv_cache_groups=None)")
                       + builder) == Shape.UNKNOWN
    assert replacement(grouping + planner.replace(", global_kv_cache_groups", "") + builder) == Shape.UNKNOWN
    assert replacement(grouping.replace("kv_cache_specs)", "kv_cache_specs, *, builder)") + planner
                       + builder) == Shape.UNKNOWN
    assert replacement(None) == Shape.UNKNOWN

    class Tree:  # a vllm-omni source tree of one file, for call shapes no release makes
        def __init__(self, body):
            self.body = body

        def read(self, relpath):
            imports = f"from {UTILS} import get_kv_cache_configs as plan\n"
            return imports + self.body if relpath == stand_in.IMPORTERS[0] else None

    assert stand_in.DRIFT_POINT.callers(Tree("plan(c, s, m)\nplan(c, s, available_memory=m)\n"
                                  "plan(vllm_config=c, kv_cache_specs=s, available_memory=m)\nself.plan(c)\n"))[0] == (
        Shape.KNOWN)
    assert stand_in.DRIFT_POINT.callers(Tree("plan(c, s, m, groups)\n"))[0] == Shape.UNKNOWN
    assert stand_in.DRIFT_POINT.callers(Tree("plan(c, s)\n"))[0] == Shape.UNKNOWN
    assert stand_in.DRIFT_POINT.callers(Tree("plan(*args)\n"))[0] == Shape.UNKNOWN
    assert stand_in.DRIFT_POINT.callers(Tree("plan(c, s, m, global_kv_cache_groups=g)\n"))[0] == Shape.UNKNOWN


@needs_omni
@needs_importer
def test_vllm_omnis_calls_are_the_one_measured():
    assert STATIC.callers == Shape.KNOWN, STATIC
    # one call, get_kv_cache_configs(vllm_config, worker_specs, available_memory) in build_native_kv_cache_configs
    (call,) = STATIC.calls
    assert call.startswith(f"{IMPORTER}:") and call.endswith(": 3 positional"), call
    (importer,) = STATIC.importers  # at module level, line 10 in 0.30.0
    assert importer.startswith(f"{IMPORTER}:") and importer.endswith(" (module)"), importer


@needs_vllm
def test_static_and_runtime_facts_agree(utils):
    runtime = stand_in.DRIFT_POINT.detect_runtime(utils)
    assert stand_in.DRIFT_POINT.compare(STATIC, runtime) == []
    assert runtime.replacement == (Shape.KNOWN if STATIC.host == HostKind.LACKS else Shape.ABSENT), runtime


# ---- the oracle: vLLM 0.32's function's results, from vLLM's own or from the stand-in ----

@needs_vllm
@pytest.mark.parametrize("name", SCENARIOS)
def test_returns_what_vllm_0_32_returned(utils, record, name):
    if STATIC.host == HostKind.LACKS and not STATIC.importers:
        pytest.skip(f"vLLM lacks {stand_in.NAME} and no installed vllm-omni imports it: nothing provides it; {_HERE}")
    if not has_block_layout():
        pytest.skip("vLLM <= 0.28 plans one KV tensor per layer (KVCacheTensor.shared_by); the record is vLLM "
                    "0.29+'s block-stride layout")
    function = utils.get_kv_cache_configs
    assert is_ours(function, stand_in.DRIFT_POINT.entry.id) == (STATIC.host == HostKind.LACKS)
    found, expected = outcome(function, name), record["results"][name]
    assert_matches_the_0_32_record(found, expected, advice_may_differ=Version(VLLM_VERSION) >= Version("0.34"))


def assert_matches_the_0_32_record(found: dict, expected: dict, *, advice_may_differ: bool = False) -> None:
    """Same fields as vLLM 0.32 (0.32, and 0.33's same classes): every field equal. Fewer (0.29-0.31: no
    kv_tp_replicas, ...): the ones they have equal. More (0.34: needs_kv_cache_zeroing on KVCacheConfig,
    kv_head_major_slots on the attention specs): every field 0.32 had is there and equal, the new ones are not
    judged (0.32 says nothing about them). Fields both added and removed: a vLLM this oracle does not describe.
    An error: the same text; with ``advice_may_differ`` (vLLM 0.34 reworded the advice after "Try ..."), the same
    statement up to it (exception type, model length, memory needed and available, the estimated length)."""
    if advice_may_differ and "error" in found and "error" in expected:
        statement = found["error"].split(" Try ", 1)[0]
        assert statement == expected["error"].split(" Try ", 1)[0] and " Try " in found["error"], found
        return
    here, there = field_names(found), field_names(expected)
    if here == there:
        assert found == expected
    elif here < there:
        assert shared(found, expected) == shared(expected, found)
    else:
        assert here > there, f"vLLM 0.32 fields missing here: {sorted(there - here, key=str)}"
        assert shared(found, expected) == expected


def test_the_oracle_rule_allows_new_fields_only():
    """The comparison itself, on a plan cut down to one group: a newer vLLM's extra fields pass; a 0.32 field
    changed, or gone, fails, whether or not new fields came along."""
    spec = {"__class__": "FullAttentionSpec", "block_size": 16, "num_kv_heads": 2}
    plan = {"configs": [{"__class__": "KVCacheConfig", "num_blocks": 320,
                         "kv_cache_groups": [{"__class__": "KVCacheGroupSpec", "kv_cache_spec": spec}]}]}

    def edited(change) -> dict:
        out = json.loads(json.dumps(plan))
        change(out["configs"][0], out["configs"][0]["kv_cache_groups"][0]["kv_cache_spec"])
        return out

    def newer(config, spec):
        config["needs_kv_cache_zeroing"] = False
        spec["kv_head_major_slots"] = False

    assert_matches_the_0_32_record(plan, plan)
    error = {"error": "ValueError: needs 0.12 GiB, 0.0 GiB available. Try increasing `gpu_memory_utilization`."}
    reworded = {"error": error["error"].replace("increasing", "raising")}
    assert_matches_the_0_32_record(reworded, error, advice_may_differ=True)
    for broken, allowed in ((reworded, False), ({"error": error["error"].replace("0.12", "0.13")}, True),
                            ({"error": "ValueError: needs 0.12 GiB, 0.0 GiB available."}, True)):
        with pytest.raises(AssertionError):
            assert_matches_the_0_32_record(broken, error, advice_may_differ=allowed)
    assert_matches_the_0_32_record(edited(newer), plan)
    assert_matches_the_0_32_record(edited(lambda config, spec: spec.pop("num_kv_heads")), plan)  # an older vLLM
    for broken in (lambda c, s: (newer(c, s), c.update(num_blocks=321)),
                   lambda c, s: (newer(c, s), s.update(block_size=32)),
                   lambda c, s: (newer(c, s), s.pop("num_kv_heads")),
                   lambda c, s: c.update(num_blocks=321)):
        with pytest.raises(AssertionError):
            assert_matches_the_0_32_record(edited(broken), plan)


def test_the_record_is_vllm_0_32_s_and_plans_something(record):
    """The oracle itself: recorded on vLLM 0.32.0, every input planned or (the one meant to) failed, and what makes
    the inputs differ shows (the smaller rank's blocks, pipeline stages, hybrid grouping, the override, auto-fit)."""
    assert record["vllm"] == "0.32.0" and sorted(record["results"]) == sorted(SCENARIOS)
    results = record["results"]
    assert results["too_little_memory"]["error"].startswith(
        "ValueError: To serve at least one request with the model's max seq len (65536)")
    assert all("configs" in r for n, r in results.items() if n != "too_little_memory")
    blocks = {n: [c["num_blocks"] for c in r["configs"]] for n, r in results.items() if "configs" in r}
    assert blocks == {"one_worker": [320], "two_ranks_min_blocks": [288, 288], "pipeline_stages": [384, 384],
                      "hybrid": [1024], "auto_fit": [96], "blocks_override": [300], "attention_free": [1]}
    assert results["auto_fit"]["max_model_len"] == 1520
    hybrid = results["hybrid"]["configs"][0]
    assert [(g["layer_names"], g["kv_cache_spec"]["__class__"]) for g in hybrid["kv_cache_groups"]] == [
        (["f0", "f1"], "FullAttentionSpec"), (["s0", "s1"], "SlidingWindowSpec")]


# ---- vllm-omni's own caller, and why the stand-in is not just vLLM 0.33's two calls ----

@needs_omni
@needs_importer
def test_vllm_omnis_build_native_kv_cache_configs_gets_the_same_plan(utils, record):
    """vllm-omni 0.30.0's ``build_native_kv_cache_configs`` (its only call) with its own diffusion model config:
    the same worker plans as the record (vLLM's own function on 0.32, the stand-in on 0.33), the scheduler config
    vLLM derives from them, and the block sizes it resolves."""
    import torch
    from vllm_omni.diffusion.diffusion_kv import initialization
    from vllm_omni.diffusion.diffusion_kv.initialization import build_native_kv_cache_configs
    from vllm_omni.diffusion.vllm_config import _DiffusionVllmModelConfig

    config, specs, memory = scenario("two_ranks_min_blocks")
    resolves_layout = hasattr(initialization, "resolve_diffusion_kv_cache_layout")
    if resolves_layout:
        config.cache_config.kv_cache_layout = None  # vllm-omni 0.30.0 resolves it itself
    # else (0.28.0 sets no layout anywhere; vLLM 0.34's planning raises "KV cache layout has not been resolved
    # yet" without one, vLLM's engine core resolves it): the scenario's, as pinned before the call
    # the specs' block size, as an engine has it (the recorded default was 16 up to vLLM 0.33; 0.34's is 64)
    config.cache_config.block_size = 16
    config.model_config = _DiffusionVllmModelConfig(model=None, dtype=torch.bfloat16, max_model_len=4096,
                                                    original_max_model_len=4096)
    assert not hasattr(config.model_config, stand_in.GROUPING_FLAG)
    workers, scheduler = build_native_kv_cache_configs(config, specs, memory)
    expected = record["results"]["two_ranks_min_blocks"]["configs"]
    fields = set(type(workers[0]).__dataclass_fields__)
    if "kv_cache_layout" not in fields:  # vLLM 0.28: KVCacheConfig without a layout, one tensor per layer
        pytest.skip(f"the record is vLLM {record['vllm']}'s plan (KVCacheConfig with kv_cache_layout, strided shared "
                    f"tensors); this vLLM plans otherwise (KVCacheConfig fields {sorted(fields)}) with its own "
                    "function, which vllm_compat leaves alone: no record of that plan")
    for worker, recorded in zip(workers, expected, strict=True):
        found = canonical(worker)
        # vllm-omni 0.30.0 sets it on every config afterwards; 0.28.0 leaves vLLM's (None, as recorded)
        assert found.pop("kv_cache_layout") == ("LBNHC" if resolves_layout else recorded["kv_cache_layout"])
        recorded = {k: v for k, v in recorded.items() if k != "kv_cache_layout"}
        assert shared(found, recorded) == shared(recorded, found)
    assert scheduler.num_blocks == 288 and [t.size for t in scheduler.kv_cache_tensors] == [9437184]
    assert utils.resolve_kv_cache_block_sizes(scheduler, config) == (16, 16)


@needs_omni
@needs_stand_in
def test_vllm_0_33_s_own_grouping_fails_on_vllm_omnis_model_config(utils):
    """Why the grouping call gets a view: vLLM 0.33's default builder asks ``model_config.supports_kv_cache_grouping``,
    which vllm-omni's diffusion model config does not have; the stand-in answers False there (vLLM 0.32's default
    grouping) and leaves vllm-omni's object as it was."""
    import torch
    from vllm_omni.diffusion.vllm_config import _DiffusionVllmModelConfig

    planning = importlib.import_module(stand_in.PLANNING_MODULE)
    config, specs, memory = scenario("one_worker")
    config.model_config = _DiffusionVllmModelConfig(model=None, dtype=torch.bfloat16, max_model_len=4096,
                                                    original_max_model_len=4096)
    with pytest.raises(AttributeError, match=stand_in.GROUPING_FLAG):
        planning.get_global_kv_cache_groups(config, specs)
    before = dict(vars(config.model_config))
    (plan,) = utils.get_kv_cache_configs(config, specs, memory)
    assert plan.num_blocks == 320 and vars(config.model_config) == before


# ---- unpatched, in place, out of place ----

# In a fresh interpreter: the importer run from its file (under VLLM_COMPAT_DISABLE=1 `import vllm_omni` itself dies
# earlier, on RoutedExpertsLists; the file's kv_cache_utils import comes before any vllm_omni one), its own import
# statement of the name read from its source and run as it is, and the diffusion engine's import.
IMPORTER_RUN = f"""
import ast, importlib, importlib.util, json, os, sys
import vllm_compat
DISABLED = os.environ.get("VLLM_COMPAT_DISABLE") == "1"
if not DISABLED:
    vllm_compat.apply()  # every bridge on (the startup hook does it too), so `import vllm_omni` works

def outcome(run):
    try:
        run()
    except Exception as exc:
        return f"{{type(exc).__name__}}: {{exc}}"
    return "IMPORTED"

path = os.path.join(os.path.dirname(importlib.util.find_spec("vllm_omni").origin),
                    {stand_in.IMPORTERS[0][len("vllm_omni/"):]!r})

def from_file():
    spec = importlib.util.spec_from_file_location({IMPORTER!r}, path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))

tree = ast.parse(open(path).read())
statement = next(node for node in tree.body if isinstance(node, ast.ImportFrom) and node.module == {UTILS!r})
out = dict(
    module=outcome(from_file if DISABLED else lambda: importlib.import_module({IMPORTER!r})),
    planning_loaded=({stand_in.PLANNING_MODULE!r} in sys.modules),  # right after the importer, before the engine
    statement=outcome(lambda: exec(compile(ast.Module([statement], []), path, "exec"), {{}})),
    engine=outcome(lambda: importlib.import_module({ENGINE!r})),
    decision=[d.action for d in vllm_compat.current_decisions() if d.name == {stand_in.DRIFT_POINT.entry.id!r}],
)
"""


def run_importer(extra: str = "", env: dict | None = None) -> dict:
    result = run_python(IMPORTER_RUN + extra + '\nprint("RESULT", json.dumps(out))\n', env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


@needs_stand_in
@pytest.mark.parametrize(
    "env", [{"VLLM_COMPAT_DISABLE": "1"}, {"VLLM_COMPAT_DISABLE_PATCHES": stand_in.DRIFT_POINT.entry.id}],
    ids=["disabled", "entry-disabled"],
)
def test_unpatched_the_importer_and_the_engine_raise_the_real_import_error(env):
    out = run_importer(env=env)
    assert out["module"].startswith(IMPORT_ERROR) and out["statement"].startswith(IMPORT_ERROR), out
    if "VLLM_COMPAT_DISABLE" in env:  # nothing bridged: `import vllm_omni` stops first
        assert out["engine"].startswith("ImportError: cannot import name 'RoutedExpertsLists' from "
                                        "'vllm.v1.outputs'"), out
    else:  # every other bridge on: the engine gets as far as this name
        assert out["engine"].startswith(IMPORT_ERROR) and out["decision"] == ["disabled"], out


@needs_stand_in
@needs_startup_hook
def test_with_the_stand_in_both_import_and_revert_removes_exactly_it():
    """The fixed run: the importer and the diffusion engine import (as they do natively, vllm-omni 0.30.0 on vLLM
    0.30: ``matrix/native/vllm-omni-0.30.0.json``), the name is ours, revert() takes out exactly it from
    kv_cache_utils, and apply() puts the same function back."""
    out = run_importer(f"""
utils = sys.modules[{UTILS!r}]
function = utils.{stand_in.NAME}
out["mark"] = function._vllm_compat_installed
before = set(vars(utils))
vllm_compat.revert()
out["removed"] = sorted(before - set(vars(utils)))
out["added"] = sorted(set(vars(utils)) - before)
vllm_compat.apply()
out["back"] = getattr(utils, {stand_in.NAME!r}, None) is function
""")
    assert out == {
        "module": "IMPORTED", "statement": "IMPORTED", "engine": "IMPORTED", "decision": ["patched"],
        "mark": stand_in.DRIFT_POINT.entry.id, "planning_loaded": False,
        "removed": [stand_in.NAME], "added": [], "back": True,
    }


@needs_stand_in
def test_install_is_idempotent_and_uninstall_removes_exactly_ours(utils):
    cases.check_install_uninstall_exact(stand_in.DRIFT_POINT, STATIC, utils)


@needs_stand_in
def test_calls_vllms_planning_at_call_time_grouping_through_the_view(utils, monkeypatch):
    """Both of vLLM's functions are looked up at each call (a later wrapper is the one called); the grouping call
    sees model_config answer False, every other read (and write) goes to the real objects; the planning call gets the
    real config and the groups."""
    planning = importlib.import_module(stand_in.PLANNING_MODULE)
    calls = []
    real_grouping, real_planner = planning.get_global_kv_cache_groups, planning.get_kv_cache_configs

    def grouping(vllm_config, kv_cache_specs):
        model = vllm_config.model_config
        calls.append(("grouping", model.supports_kv_cache_grouping, model.max_model_len,
                      vllm_config.cache_config is config.cache_config))
        model.max_model_len = 4000  # a write reaches the real model config
        return real_grouping(vllm_config, kv_cache_specs)

    def planner(vllm_config, kv_cache_specs, available_memory, groups):
        calls.append(("planner", vllm_config is config, [g.layer_names for g in groups]))
        return real_planner(vllm_config, kv_cache_specs, available_memory, groups)

    monkeypatch.setattr(planning, "get_global_kv_cache_groups", grouping)
    monkeypatch.setattr(planning, "get_kv_cache_configs", planner)
    config, specs, memory = scenario("one_worker")
    utils.get_kv_cache_configs(config, specs, memory)
    assert calls == [("grouping", False, 4096, True), ("planner", True, [["l0", "l1", "l2", "l3"]])]
    assert config.model_config.max_model_len == 4000 and not hasattr(config.model_config, stand_in.GROUPING_FLAG)


@needs_stand_in
def test_refuses_a_planning_module_of_another_shape(utils, tmp_path):
    source = Path(utils.__file__).with_name("kv_cache_planning.py").read_text()
    old = "    available_memory: list[int],\n    global_kv_cache_groups: list[KVCacheGroupSpec],\n)"
    assert source.count(old) == 1  # get_kv_cache_configs' last two parameters
    changed = source.replace(old, old.replace("list[KVCacheGroupSpec],", "list[KVCacheGroupSpec] | None = None,"))
    (tmp_path / "kv_cache_planning.py").write_text(changed)
    owner = type(sys)(UTILS)
    owner.__file__ = str(tmp_path / "kv_cache_utils.py")
    with pytest.raises(PatchRefusedError, match=r"kv_cache_planning.get_kv_cache_configs takes .* and more"):
        stand_in.DRIFT_POINT.prepare(owner, stand_in.DRIFT_POINT.detect_runtime(owner))


@needs_vllms_own
def test_stays_out_where_vllm_has_it(utils):
    cases.check_stays_out_where_vllm_defines_it(stand_in.DRIFT_POINT, utils)
