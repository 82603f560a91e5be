"""Behavioural drift (``vllm_compat.detect.behaviour_drift``): what vllm-omni's code does with vLLM that a newer vLLM
no longer accepts, found from the release wheels, per entrypoint, and how ``check`` reports it.

Expected values are the drift the catalogue's entries were written for, as the issues and the wheels state it (the
vLLM object, the parameter or method, the entrypoint it stops, measured by the serve cells and the H200), never
what the analysis returns. The retro sweep (each handled drift found once its drift point is off) downloads vLLM
0.34.0, so it runs in one cell only, as tests/test_check.py's sweep does; the rest reads vLLM 0.31.0 and vllm-omni
0.24.0, the wheels every cell fetches for tests/test_check.py anyway, or builds two tiny package trees for the shapes
no release pair has.
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import pytest

from tests.support.check_json import check_json
from tests.support.trees import write_tree
from tests.support.wheels import wheel_or_skip
from vllm_compat.detect.behaviour_drift import check_behaviour_drift, scan
from vllm_compat.detect.code_model import CodeModel, bound_params, dotted
from vllm_compat.detect.model import why_call_fails
from vllm_compat.detect.source_tree import SourceTree

tomllib = pytest.importorskip("tomllib", reason="reading matrix/vllm.toml needs Python >= 3.11 (tomllib)")

ROOT = Path(__file__).resolve().parents[2]
CELLS = tomllib.loads((ROOT / "matrix" / "vllm.toml").read_text())["cell"]
SWEEP_CELL = next(c["id"] for c in CELLS if c.get("default"))
sweep_here = pytest.mark.skipif(
    os.environ.get("VLLM_COMPAT_CELL") not in (None, SWEEP_CELL),
    reason=f"reads vLLM 0.34.0 and the four native pairs' wheels: it runs in nox cell {SWEEP_CELL} only",
)


@pytest.fixture(scope="module")
def wheel_cache(tmp_path_factory):
    """tests/test_check.py's wheel cache: VLLM_COMPAT_WHEEL_CACHE (nox shares one per run), else the user's."""
    return os.environ.get("VLLM_COMPAT_WHEEL_CACHE")


def _findings(data: dict, entrypoint: str, field: str = "behaviour_drift") -> list[dict]:
    return data["import_drift"]["entrypoints"][entrypoint][field]


# --------------------------------------------------------------------------------------------- the retro
# Each drift point that handles call / override / abstract-method / attribute drift, off in turn, on vLLM 0.34.0 +
# vllm-omni 0.24.0: (entrypoint, its status, kind, the vLLM object's last part, a name the drift is about). The
# vLLM objects and names are those of the drift points' "Why:" (vLLM 0.25's setup_server(args, *, reuse_port), 0.28's
# 6-argument wait_for_engine_startup and session_id=, 0.31 / 0.34's abstract EngineClient methods, 0.26's
# ec_transfer_params read by the completion serving, 0.25's online_renderer= keyword).
RETRO = {
    "setup_server_call": [("serve", "will_not_start", "call", "setup_server", "reuse_port")],
    "engine_client_methods": [(ep, "will_not_start", "abstract", method, method)
                              for ep in ("offline", "serve")
                              for method in ("checkpoint_prepare", "checkpoint_restore", "checkpoint_state",
                                             "release_kv_cache_memory")],
    "async_omni_session_id": [("serve", "fails_on_request", "override", "generate", "session_id")],
    "engine_startup_launch": [("diffusion_stage", "will_not_start", "call", "wait_for_engine_startup", "*positional")],
    "stage_engine_startup_launch": [(ep, "will_not_start", "call", "wait_for_engine_startup", "*positional")
                                    for ep in ("offline", "serve")],
    "omni_output_ec_transfer_params": [("serve", "fails_on_request", "attribute", "ec_transfer_params",
                                        "ec_transfer_params")],
}


@sweep_here
@pytest.mark.parametrize("entry_id", sorted(RETRO))
def test_a_handled_drift_stops_the_verdict_once_its_drift_point_is_off(capsys, monkeypatch, wheel_cache, entry_id):
    wheel_or_skip("vllm", "0.34.0")
    wheel_or_skip("vllm-omni", "0.24.0")
    code, on = check_json(capsys, monkeypatch, "0.34.0", "0.24.0")
    handled = [f for f in on["import_drift"]["behaviour_drift"]["findings"] if f["handled_by"] == entry_id]
    assert handled, f"{entry_id} handles nothing on vLLM 0.34.0 + vllm-omni 0.24.0"
    code, off = check_json(capsys, monkeypatch, "0.34.0", "0.24.0", disabled=entry_id)
    assert code == off["exit_code"] == 1 and off["verdict"]["kind"] in ("will_not_start", "fails_on_request")
    for entrypoint, status, kind, obj, name in RETRO[entry_id]:
        assert off["import_drift"]["entrypoints"][entrypoint]["status"] == status
        found = [f for f in _findings(off, entrypoint) if f["kind"] == kind and f["vllm_object"].endswith(obj)
                 and name in f["names"]]
        assert found, f"{entry_id} off: no {kind} drift of {obj} ({name}) under {entrypoint}"
        assert all(f["site"].startswith("vllm_omni.") and f["detail"] for f in found)
        if status == "fails_on_request":
            assert found[0]["endpoint"] in ("/v1/completions", "/v1/chat/completions")
    assert any(name in off["verdict"]["text"] for *_, name in RETRO[entry_id] if name != "*positional") or \
        "wait_for_engine_startup" in off["verdict"]["text"]


# Drift points whose drift fails a feature when it is used (a request, an AR-diffusion model), not a start: off in
# turn, each drift is named under the entrypoint whose feature it fails, in its
# "fails_when_used" list, and the verdict keeps its exit code. (vLLM, entry) -> [(entrypoint, kind, the vLLM object's
# last part, a name)]: the objects and names of the drift points' "Why:" (vLLM 0.27.1's positional-only algorithm,
# 0.30's KVCacheTensor fields, 0.26's num_in_flight_tokens read from vllm-omni's request adapter, 0.30's NaN state set
# by the AsyncGPUModelRunnerOutput __init__ vllm-omni skips, 0.34's TokenBuffer without clear, 0.27's stale-output bookkeeping that stopped reading async_tokens_to_discard).
RETRO_WHEN_USED = {
    ("0.34.0", "mm_hasher_algorithm"): [(ep, "call", "hash_kwargs", "algorithm") for ep in ("offline", "serve")],
    ("0.34.0", "kv_cache_tensor_shared_by"): [("diffusion_stage", "call", "KVCacheTensor.__init__", "shared_by")],
    ("0.34.0", "ar_diffusion_in_flight_tokens"): [("diffusion_stage", "attribute", "num_in_flight_tokens",
                                                   "num_in_flight_tokens")],
    ("0.34.0", "request_token_buffer_clear"): [("llm_stage", "call", "TokenBuffer.clear", "clear")],
    ("0.34.0", "async_tokens_to_discard"): [("llm_stage", "unread", "async_tokens_to_discard",
                                             "async_tokens_to_discard")],
    ("0.30.0", "async_runner_output_init_attrs"): [("llm_stage", "attribute", "_num_nans_cpu", "_num_nans_cpu")],
}


@sweep_here
@pytest.mark.parametrize("vllm, entry_id", sorted(RETRO_WHEN_USED), ids=lambda v: str(v))
def test_a_handled_drift_of_a_feature_is_named_once_its_drift_point_is_off(capsys, monkeypatch, wheel_cache, vllm,
                                                                            entry_id):
    wheel_or_skip("vllm", vllm)
    wheel_or_skip("vllm-omni", "0.24.0")
    code_on, on = check_json(capsys, monkeypatch, vllm, "0.24.0")
    handled = [f for f in on["import_drift"]["behaviour_drift"]["findings"] if f["handled_by"] == entry_id]
    assert handled, f"{entry_id} handles nothing on vLLM {vllm} + vllm-omni 0.24.0"
    code, off = check_json(capsys, monkeypatch, vllm, "0.24.0", disabled=entry_id)
    for entrypoint, kind, obj, name in RETRO_WHEN_USED[(vllm, entry_id)]:
        found = [f for f in _findings(off, entrypoint, "fails_when_used") if f["kind"] == kind
                 and f["vllm_object"].endswith(obj) and name in f["names"]]
        assert found, f"{entry_id} off: no {kind} drift of {obj} ({name}) under {entrypoint}"
        assert all(f["effect"] in ("when_used", "stops_when") and f["site"].startswith("vllm_omni.") for f in found)
        assert not [f for f in _findings(on, entrypoint, "fails_when_used") if f["kind"] == kind
                    and f["vllm_object"].endswith(obj) and name in f["names"]]  # handled while it acts
    assert code == code_on  # a feature that fails when used stops no start


# Drift points whose drift every step of an LLM / AR or generation stage runs (``Entrypoint.runs``): off in turn, the
# stages are left out, named with the drift, while the offline API and the server start (exit code kept). (vLLM,
# entry) -> (kind, the vLLM object's last part, a name), as in the drift points' "Why:": vLLM 0.28+'s 3-value
# _prepare_inputs, 0.30's 8-value _bookkeeping_sync and XD-RoPE removal, 0.31's routed experts and skipped_waiting
# leaving the runner and the scheduler, 0.32's cascade attention removal.
RETRO_STEP = {
    ("0.30.0", "ar_runner_prepare_inputs"): ("unpack", "_prepare_inputs", "_prepare_inputs"),
    ("0.30.0", "generation_runner_prepare_inputs"): ("unpack", "_prepare_inputs", "_prepare_inputs"),
    ("0.30.0", "ar_runner_bookkeeping_sync"): ("unpack", "_bookkeeping_sync", "_bookkeeping_sync"),
    ("0.30.0", "runner_xdrope_removed"): ("attribute", "uses_xdrope_dim", "uses_xdrope_dim"),
    ("0.33.0", "runner_routed_experts_removed"): ("attribute", "routed_experts_initialized",
                                                  "routed_experts_initialized"),
    ("0.33.0", "runner_cascade_attention_removed"): ("call", "_build_attention_metadata", "cascade_attn_prefix_lens"),
    ("0.33.0", "scheduler_skipped_waiting"): ("attribute", "skipped_waiting", "skipped_waiting"),
}


@sweep_here
@pytest.mark.parametrize("vllm, entry_id", sorted(RETRO_STEP), ids=lambda v: str(v))
def test_a_handled_drift_of_every_step_leaves_the_llm_stages_out_once_its_drift_point_is_off(
        capsys, monkeypatch, wheel_cache, vllm, entry_id):
    wheel_or_skip("vllm", vllm)
    wheel_or_skip("vllm-omni", "0.24.0")
    code_on, on = check_json(capsys, monkeypatch, vllm, "0.24.0")
    kind, obj, name = RETRO_STEP[(vllm, entry_id)]

    def found(data):
        return [f for f in _findings(data, "llm_stage") if f["kind"] == kind and f["vllm_object"].endswith(obj)
                and name in f["names"]]

    assert on["import_drift"]["entrypoints"]["llm_stage"]["status"] == "works_with_vllm_compat" and not found(on)
    code, off = check_json(capsys, monkeypatch, vllm, "0.24.0", disabled=entry_id)
    assert off["import_drift"]["entrypoints"]["llm_stage"]["status"] == "left_out"
    assert found(off), f"{entry_id} off: no {kind} drift of {obj} ({name}) under llm_stage"
    assert all(f["effect"] == "stops" and f["site"].startswith("vllm_omni.") for f in found(off))
    assert code == code_on == 0 and "LLM / AR stages" in off["verdict"]["text"]


@sweep_here
def test_the_serving_keyword_drift_is_named_as_what_an_llm_stage_server_loses(capsys, monkeypatch, wheel_cache):
    """vllm-omni 0.24.0 builds the chat / completion servings only `if "generate" in supported_tasks` (a model with
    an LLM stage): a diffusion server starts without openai_serving_render_keyword (measured: stop 29 served images
    on vLLM 0.25.1 before the entry existed), so the drift is a left-out feature with its condition, as the LLM
    stages are on vLLM 0.34, not a stopped server."""
    wheel_or_skip("vllm", "0.34.0")
    code, off = check_json(capsys, monkeypatch, "0.34.0", "0.24.0", disabled="openai_serving_render_keyword")
    serve = off["import_drift"]["entrypoints"]["serve"]
    conditional = [f for f in serve["fails_when_used"] if "openai_serving_render" in f["names"] and f["kind"] == "call"]
    assert {f["vllm_object"].rsplit(".", 2)[-2] for f in conditional} >= {"OpenAIServingChat", "OpenAIServingCompletion"}
    assert all(f["effect"] == "stops_when" and "generate" in f["when"] for f in conditional)
    # and the attribute vllm-omni's chat serving reads on every request, which vLLM's no longer assigns
    read = [f for f in serve["fails_when_used"] if f["kind"] == "attribute" and "openai_serving_render" in f["names"]]
    assert read and all(f["effect"] == "when_used" and "OmniOpenAIServingChat" in f["plugin_object"] for f in read)
    assert any("openai_serving_render" in text for text in serve["left_out"].values())
    assert code == 0 and serve["status"] == "works_with_vllm_compat"


@sweep_here
@pytest.mark.parametrize("omni", ["0.24.0", "0.26.0", "0.28.0", "0.30.0"])
def test_no_drift_that_stops_an_entrypoint_is_left_unhandled_on_vllm_034(capsys, monkeypatch, wheel_cache, omni):
    """With nothing disabled, behavioural drift stops or fails no entrypoint on the newest vLLM (tests/test_check.py's
    sweep asserts the same for every cell of vLLM 0.24-0.33); what is left is named as left out or used-only."""
    wheel_or_skip("vllm", "0.34.0")
    wheel_or_skip("vllm-omni", omni)
    code, data = check_json(capsys, monkeypatch, "0.34.0", omni)
    for entrypoint, status in data["import_drift"]["entrypoints"].items():
        if entrypoint == "llm_stage":  # stopped by its imports already (vLLM 0.34 removed the V1 runner): its steps'
            assert status["status"] == "left_out" and status["missing"], status  # drift is more of the same
            continue
        assert status["behaviour_drift"] == [], (omni, entrypoint, status["behaviour_drift"])
    assert code == 0 and data["import_drift"]["behaviour_drift"]["baseline"] == omni


@sweep_here
def test_the_shipped_baselines_are_the_scan_of_the_native_wheels(wheel_cache):
    sys.path.insert(0, str(ROOT / "matrix"))
    try:
        import behaviour_baselines
    finally:
        sys.path.remove(str(ROOT / "matrix"))
    pairs = behaviour_baselines.native_pairs(CELLS)
    assert {omni for _, omni in pairs} >= {"0.24.0", "0.26.0", "0.28.0", "0.30.0"}
    for vllm, omni in pairs:
        wheel_or_skip("vllm", vllm)
        wheel_or_skip("vllm-omni", omni)
    assert behaviour_baselines.MODULE.read_text() == behaviour_baselines.render(pairs), \
        "stale: run python matrix/behaviour_baselines.py"


# ------------------------------------------------------------------------------- one real pair, every cell


@pytest.fixture(scope="module")
def pair_031(wheel_cache):
    return SourceTree(wheel_or_skip("vllm-omni", "0.24.0")), SourceTree(wheel_or_skip("vllm", "0.31.0"))


def test_vllm_031_under_vllm_omni_024_finds_the_drift_its_drift_points_were_written_for(pair_031):
    omni, vllm = pair_031
    drift = check_behaviour_drift(omni, vllm, "0.24.0")
    assert drift.baseline == "0.24.0" and drift.checked > 100 and drift.undecidable > 0
    found = {(f.kind, f.vllm_object.rsplit(".", 1)[-1], name) for f in drift.findings for name in f.names}
    assert ("call", "setup_server", "reuse_port") in found  # vLLM 0.25
    assert ("call", "__init__", "openai_serving_render") in found  # vLLM 0.25's servings: online_renderer=
    assert ("call", "wait_for_engine_startup", "*positional") in found  # vLLM 0.28: 8 arguments -> 6
    assert ("override", "generate", "session_id") in found  # vLLM 0.28
    assert ("attribute", "ec_transfer_params", "ec_transfer_params") in found  # vLLM 0.26
    assert ("abstract", "release_kv_cache_memory", "release_kv_cache_memory") in found  # vLLM 0.31
    assert ("abstract", "checkpoint_prepare", "checkpoint_prepare") not in found  # vLLM 0.34's, not 0.31's
    # vLLM 0.30 removed StructuredOutputManager.should_advance, which the schedulers call through the attribute
    # vLLM's Scheduler.__init__ assigns
    assert ("call", "should_advance", "should_advance") in found
    advance = [f for f in drift.findings if f.vllm_object.endswith("StructuredOutputManager.should_advance")]
    assert {f.site for f in advance} == {"vllm_omni.core.sched.omni_ar_scheduler",
                                         "vllm_omni.core.sched.omni_generation_scheduler"}
    assert all("llm_stage" in f.entrypoints for f in advance)
    setup = next(f for f in drift.findings if f.vllm_object.endswith("setup_server"))
    assert setup.site == "vllm_omni.entrypoints.openai.api_server" and setup.entrypoints == ("serve",)
    assert setup.effect("serve") == "stops" and "reuse_port" in setup.signature


def test_without_a_baseline_every_finding_is_reported_and_the_report_says_so(pair_031, monkeypatch):
    omni, vllm = pair_031
    from vllm_compat.detect import behaviour_baselines

    monkeypatch.setattr(behaviour_baselines, "BASELINES", {})
    bare = check_behaviour_drift(omni, vllm, "0.24.0")
    assert bare.baseline is None and "0.24.0" in bare.baseline_note
    monkeypatch.undo()
    differential = check_behaviour_drift(omni, vllm, "0.24.0")
    assert {f.key for f in differential.findings} < {f.key for f in bare.findings}  # the native noise is gone


# ------------------------------------------------------------------------ shapes no release pair has


HOST_V1 = {
    "vllm/__init__.py": "",
    "vllm/api.py": """
        from abc import ABC, abstractmethod

        class Base:
            def __init__(self, model, dtype=None): ...

        def launch(config, *, port=0): ...

        class Client(ABC):
            @abstractmethod
            def generate(self, prompt, *, priority=0) -> "Output": ...

        class Output:
            def __init__(self):
                self.text = ""
        """,
    "vllm/serving.py": """
        from vllm.api import Output

        def render(out: Output):
            return out.text
        """,
}
HOST_V2 = {  # each change one kind of drift: a required keyword, a positional gone, an abstract method, a new read
    **HOST_V1,
    "vllm/api.py": """
        from abc import ABC, abstractmethod

        class Base:
            def __init__(self, model, *, cache): ...

        def launch(*, config, port=0): ...

        class Client(ABC):
            @abstractmethod
            def generate(self, prompt, *, priority=0, session=None) -> "Output": ...

            @abstractmethod
            def stop(self): ...

        class Output:
            def __init__(self):
                self.text = ""
                self.tokens = []
        """,
    "vllm/serving.py": """
        from vllm.api import Output

        def render(out: Output):
            return out.text, out.tokens

        async def serve(client):
            return client.generate("p", session="s")
        """,
}
PLUGIN = {
    "vllm_omni/__init__.py": "",
    "vllm_omni/entrypoints/__init__.py": "",
    "vllm_omni/entrypoints/omni.py": """
        from vllm.api import Base, Client, launch
        from vllm.serving import render, serve
        from vllm_omni.outputs import OmniOutput

        class Engine(Base):
            def __init__(self, model):
                super().__init__(model)

        class OmniClient(Client):
            def generate(self, prompt, *, priority=0) -> OmniOutput: ...

        def start(args, kwargs):
            launch(args)
            launch(*args, **kwargs)  # undecidable
            if args.remote:
                launch(args, 1)
            return Engine("m"), OmniClient()
        """,
    "vllm_omni/outputs.py": """
        class OmniOutput:
            def __init__(self):
                self.text = ""
        """,
}


def _tree(tmp_path: Path, name: str, files: dict) -> SourceTree:
    return write_tree(tmp_path / name, files)


def test_each_kind_is_found_against_the_old_host_and_only_what_changed(tmp_path):
    plugin = _tree(tmp_path, "plugin", PLUGIN)
    old, new = _tree(tmp_path, "v1", HOST_V1), _tree(tmp_path, "v2", HOST_V2)
    before, _, _ = scan(plugin, old)
    # on the old host only the call that never fitted: launch(args, 1) passes 2 positionals to (config, *, port)
    assert [(f.kind, f.names) for f in before] == [("call", ("*positional",))]
    drift = check_behaviour_drift(plugin, new, None, baseline_tree=lambda version: (old, ""))
    found = {(f.kind, f.plugin_object.rsplit(".", 1)[-1], f.names): f for f in drift.findings}
    assert len(found) == len(drift.findings)
    assert set(found) == {
        ("call", "__init__", ("cache",)),  # super().__init__(model): the base now requires keyword-only cache
        ("call", "start", ("*positional",)),  # launch(args): config became keyword-only (launch(args, 1) did not fit)
        ("abstract", "OmniClient", ("stop",)),
        ("override", "generate", ("session",)),  # vLLM's serve() passes session= to what generate() returns
        ("attribute", "OmniOutput", ("tokens",)),  # vLLM's render() reads .tokens from what stands in for Output
    }, drift.findings
    assert found[("call", "start", ("*positional",))].effect("offline") == "stops"  # start() is in a root module
    assert found[("override", "generate", ("session",))].via == "vllm.serving"
    assert drift.undecidable >= 1  # launch(*args, **kwargs)


def test_a_start_failure_under_an_if_is_named_with_its_condition(tmp_path):
    plugin_files = {**PLUGIN, "vllm_omni/entrypoints/omni.py": """
        from vllm.api import launch

        def start(args):
            if args.remote:
                launch(args)
        """}
    drift = check_behaviour_drift(_tree(tmp_path, "plugin", plugin_files), _tree(tmp_path, "v2", HOST_V2), None,
                                  baseline_tree=lambda version: (_tree(tmp_path, "v1", HOST_V1), ""))
    (finding,) = drift.findings
    assert finding.effect("offline") == "stops_when" and finding.stops_when("offline") == "args.remote"


def test_vllm_omni_024s_kv_cache_tensor_call_fits_its_own_vllms_dataclass_and_not_031s(pair_031):
    """vllm-omni 0.24.0's AR-diffusion KV manager builds ``KVCacheTensor(size=..., shared_by=...)``: vLLM 0.24.0's
    dataclass has the fields size, shared_by, offset, block_stride; vLLM 0.30 made it size, layers, layer_stride,
    block_stride, offset, host_resident (the wheels' vllm/v1/kv_cache_interface.py)."""
    omni, vllm_031 = pair_031
    vllm_024 = SourceTree(wheel_or_skip("vllm", "0.24.0"))
    site = "vllm_omni.experimental.ar_diffusion.kv_cache.manager"
    verdicts = {}
    for version, host in (("0.24.0", vllm_024), ("0.31.0", vllm_031)):
        model = CodeModel(omni, host)
        (call,) = [n for n in ast.walk(model.module_ast(site)) if isinstance(n, ast.Call)
                   and dotted(n.func) == "KVCacheTensor"]
        init, _ = model.constructor(model.resolve_expr(site, "KVCacheTensor"))
        verdicts[version] = why_call_fails(bound_params(init.node), len(call.args), [k.arg for k in call.keywords])
    assert verdicts == {"0.24.0": None, "0.31.0": "got an unexpected keyword argument shared_by"}


HELD_V1 = {
    "vllm/__init__.py": "",
    "vllm/sched.py": """
        from abc import ABC, abstractmethod
        from dataclasses import dataclass

        class Manager:
            def __init__(self, config): ...
            def advance(self, request): ...
            def accept(self, request, tokens): ...

        class Cache:
            def __init__(self, config): ...
            def lookup(self, key, extra=None): ...

        class Client(ABC):
            @abstractmethod
            def generate(self, prompt): ...

        @dataclass
        class Tensor:
            size: int
            shared_by: list
            offset: int = 0

        class Scheduler:
            def __init__(self, config, manager: Manager, client: "Client | None" = None):
                self.manager = manager
                self.cache = Cache(config)
                self.client = client
                self.other = config.thing
                self.spare = None
        """,
}
HELD_V2 = {  # advance() gone, lookup() without extra, the dataclass's shared_by field renamed
    **HELD_V1,
    "vllm/sched.py": HELD_V1["vllm/sched.py"].replace("            def advance(self, request): ...\n", "").replace(
        "def lookup(self, key, extra=None)", "def lookup(self, key)").replace("shared_by: list", "layers: list"),
}
HELD_PLUGIN = {
    "vllm_omni/__init__.py": "",
    "vllm_omni/entrypoints/__init__.py": "",
    "vllm_omni/entrypoints/omni.py": """
        from vllm.sched import Scheduler, Tensor

        class OmniScheduler(Scheduler):
            def step(self, request):
                self.manager.advance(request)
                self.manager.accept(request, [])
                self.cache.lookup("k", extra=1)
                self.client.generate("p", session=1)  # what an abstract class holds is a subclass: undecidable
                self.other.anything()  # a value the files cannot type: not read
                return Tensor(size=1, shared_by=[request])
        """,
}


def test_a_call_through_an_attribute_a_vllm_base_assigns_and_a_dataclass_call_are_checked(tmp_path):
    plugin = _tree(tmp_path, "plugin", HELD_PLUGIN)
    old, new = _tree(tmp_path, "v1", HELD_V1), _tree(tmp_path, "v2", HELD_V2)
    assert scan(plugin, old)[0] == []
    drift = check_behaviour_drift(plugin, new, None, baseline_tree=lambda version: (old, ""))
    found = {(f.vllm_object.removeprefix("vllm.sched."), f.names) for f in drift.findings}
    assert found == {("Manager.advance", ("advance",)), ("Cache.lookup", ("extra",)),
                     ("Tensor.__init__", ("shared_by",))}, drift.findings
    assert all(f.plugin_object == "vllm_omni.entrypoints.omni.OmniScheduler.step" for f in drift.findings)
    assert drift.undecidable == 1  # self.client.generate(...)
