"""The behavioural scan's capabilities, each on two tiny package trees (``tests.support.trees.write_tree``): a host
("vllm") before and after one change, and a plugin ("vllm_omni") that uses it the way vllm-omni used the real one.

Each test reads the plugin against the old host (nothing new) and against the new one through the differential
``check_behaviour_drift`` (the old host as the baseline), and names what must be found: the shape is the one of a
real drift the catalogue bridges (named in each test's docstring), never a target name. The real pairs are checked
by ``tests/detect/test_behaviour_drift.py`` (the retro sweep) and ``matrix/scan_recall.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.trees import write_tree
from vllm_compat.detect.behaviour_drift import check_behaviour_drift, scan
from vllm_compat.detect.code_model import CodeModel
from vllm_compat.detect.model import Param, ParamKind, why_open_call_fails

ROOTS = {"vllm/__init__.py": "", "vllm_omni/__init__.py": "", "vllm_omni/entrypoints/__init__.py": "",
         "vllm_omni/worker/__init__.py": ""}


def _drift(tmp_path: Path, plugin: dict, old: dict, new: dict):
    """(findings on the old host, the differential drift on the new one)."""
    plugin_tree = write_tree(tmp_path / "plugin", {**ROOTS, **plugin})
    old_tree = write_tree(tmp_path / "old", {**ROOTS, **old})
    new_tree = write_tree(tmp_path / "new", {**ROOTS, **new})
    before = scan(plugin_tree, old_tree)
    drift = check_behaviour_drift(plugin_tree, new_tree, None, baseline_tree=lambda version: (old_tree, ""))
    return before, drift


def _found(drift) -> set[tuple]:
    return {(f.kind, f.vllm_object.removeprefix("vllm."), f.names) for f in drift.findings}


# ---------------------------------------------------------------------------- calls through *args / **kwargs


def test_a_positional_only_parameter_keywords_cannot_fill_is_decided_through_kwargs(tmp_path):
    """The shape of vLLM 0.27.1's ``hash_kwargs(cls, algorithm, /, **kwargs)`` called ``hash_kwargs(model_id=...,
    **{modality: item})``: whatever ``**`` holds, nothing gives a positional-only parameter."""
    old = {"vllm/hasher.py": """
        class Hasher:
            @classmethod
            def hash(cls, **kwargs): ...
        """}
    new = {"vllm/hasher.py": """
        class Hasher:
            @classmethod
            def hash(cls, algorithm, /, **kwargs): ...
        """}
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.hasher import Hasher

        def key(model_id, modality, item):
            return Hasher.hash(model_id=model_id, **{modality: item})
        """}
    (before, _, undecidable_before), drift = _drift(tmp_path, plugin, old, new)
    assert before == [] and undecidable_before == 0  # decided on the old host too: **kwargs takes anything
    assert _found(drift) == {("call", "hasher.Hasher.hash", ("algorithm",))}
    assert "positional-only" in drift.findings[0].detail and drift.undecidable == 0


def test_what_an_open_call_leaves_to_its_star_arguments():
    positional = Param("a", ParamKind.POSITIONAL)
    keyword = Param("k", ParamKind.KEYWORD_ONLY)
    var_kw = Param("kw", ParamKind.VAR_KEYWORD)
    # a keyword-only parameter no explicit keyword gives, without **: fails whatever *args holds
    assert why_open_call_fails((positional, keyword), 0, (), True, False)[0].startswith("missing required keyword")
    # too many explicit positionals: *args only adds more
    assert why_open_call_fails((positional,), 2, (), True, False) == ("takes 1 positional argument(s), 2 given", True)
    # **kwargs may give what is required: undecided; with **kwargs taken and everything given: fits
    assert why_open_call_fails((positional, keyword), 1, (), False, True) == (None, False)
    assert why_open_call_fails((positional, var_kw), 1, (), False, True) == (None, True)


def test_an_override_passing_on_its_own_star_arguments_fits(tmp_path):
    """``super().__init__(*args, **kwargs)`` in an ``__init__`` taking ``*args, **kwargs`` (vllm-omni's schedulers):
    what vLLM built the class with is what vLLM's ``__init__`` gets."""
    host = {"vllm/sched.py": """
        class Scheduler:
            def __init__(self, config, *, cache): ...
        """}
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.sched import Scheduler

        class OmniScheduler(Scheduler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
        """}
    (findings, checked, undecidable), _ = _drift(tmp_path, plugin, host, host)
    assert findings == [] and undecidable == 0 and checked >= 1


# ------------------------------------------------------------------------------------------- returned tuples


def test_a_tuple_unpacked_from_an_inherited_vllm_method_is_held_to_its_length(tmp_path):
    """The shape of vLLM 0.30's ``_bookkeeping_sync`` returning 8 values where vllm-omni's runner unpacks 7."""
    old = {"vllm/runner.py": """
        class Runner:
            def bookkeeping(self, out):
                if out:
                    return out, 1, 2
                return None, 1, 2
        """}
    new = {"vllm/runner.py": old["vllm/runner.py"].replace("return out, 1, 2", "return out, 0, 1, 2").replace(
        "return None, 1, 2", "return None, 0, 1, 2")}
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.runner import Runner

        class OmniRunner(Runner):
            def step(self, out):
                first, second, third = self.bookkeeping(out)
                return first
        """}
    (before, _, _), drift = _drift(tmp_path, plugin, old, new)
    assert before == []
    assert _found(drift) == {("unpack", "runner.Runner.bookkeeping", ("bookkeeping",))}
    assert "3 values unpacked" in drift.findings[0].detail and "returns 4" in drift.findings[0].detail


# ------------------------------------------------------------------------------------- attributes of self


# vLLM's async output before and after it grew state only its own ``__init__`` sets (vLLM 0.30's ``_num_nans_cpu``)
ASYNC_OUTPUT_OLD = {"vllm/outputs.py": """
    class AsyncOutput:
        def __init__(self, tokens):
            self._tokens = tokens

        def get(self):
            return self._tokens
    """}
ASYNC_OUTPUT_NEW = {"vllm/outputs.py": """
    class AsyncOutput:
        def __init__(self, tokens, nans=None):
            self._tokens = tokens
            self._nans = nans

        def get(self):
            if self._nans is not None:
                del self._nans
            return self._tokens
    """}


def test_an_inherited_vllm_method_reading_what_a_skipped_base_init_sets(tmp_path):
    """The shape of vllm-omni's async runner output: its ``__init__`` sets vLLM 0.24's attributes itself and never
    calls vLLM's, whose later version sets one more that the inherited reader needs."""
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.outputs import AsyncOutput

        class OmniAsyncOutput(AsyncOutput):
            def __init__(self, tokens, builder):
                self._tokens = tokens
                self._builder = builder

            def get(self):
                return super().get(), self._builder()
        """}
    (before, _, _), drift = _drift(tmp_path, plugin, ASYNC_OUTPUT_OLD, ASYNC_OUTPUT_NEW)
    assert before == []
    assert _found(drift) == {("attribute", "outputs.AsyncOutput._nans", ("_nans",))}
    (finding,) = drift.findings
    assert finding.plugin_object == "vllm_omni.entrypoints.omni.OmniAsyncOutput" and finding.via == "vllm.outputs"


def test_an_attribute_a_vllm_base_stopped_assigning_that_vllm_omni_reads(tmp_path):
    """The shape of vLLM 0.31 dropping ``Scheduler.skipped_waiting``, which vllm-omni's scheduler (through a mixin)
    still reads; a read under ``hasattr`` is no finding, nor is one of what every object has."""
    old = {"vllm/sched.py": """
        class Scheduler:
            def __init__(self):
                self.waiting = []
                self.parked = []
        """}
    new = {"vllm/sched.py": """
        class Scheduler:
            def __init__(self):
                self.waiting = []
        """}
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.sched import Scheduler

        class Mixin:
            def drop(self, request):
                self.parked.remove(request)
                self.waiting.remove(request)
                if hasattr(self, "gone"):
                    self.gone.clear()
                return self.__class__

        class OmniScheduler(Mixin, Scheduler):
            pass
        """}
    (before, _, _), drift = _drift(tmp_path, plugin, old, new)
    assert before == []
    assert _found(drift) == {("attribute", "sched.Scheduler.parked", ("parked",))}
    assert drift.findings[0].plugin_object == "vllm_omni.entrypoints.omni.OmniScheduler"


STAGE = {"vllm_omni/worker/gpu_ar_worker.py": "from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner\n"}


@pytest.mark.parametrize("allowlisted", [True, False], ids=["setattr-allowlisted", "setattr-any-name"])
def test_a_step_reading_what_the_vllm_runner_stopped_assigning_stops_the_llm_stage(tmp_path, allowlisted):
    """The shape of vLLM 0.30 dropping ``GPUModelRunner.uses_xdrope_dim`` (XD-RoPE), which vllm-omni 0.24.0's runner
    reads on every step, and 0.28 growing ``_prepare_inputs``' tuple under vllm-omni's unpack: both sit in what the
    LLM / AR stage runs each step (``Entrypoint.runs``: the runner's ``execute_model``), not in what an import runs,
    and stop the stage as its start would. vLLM's runner sets configs by name in ``update_config``, checked against a
    literal set first: that sets nothing unknown; a ``setattr`` of any name leaves the class undecided."""
    guard = ('if name not in {"model_config", "load_config"}:\n' + " " * 24 + "raise ValueError(name)\n" + " " * 20
             if allowlisted else "")
    runner = """
        class GPUModelRunner:
            def __init__(self):
                self.model_config = None
                {flag}
            def update_config(self, overrides):
                for name, value in overrides.items():
                    {guard}setattr(self, name, value)
            def _prepare_inputs(self, batch):
                return ({returned})
        """
    old = {"vllm/runner.py": runner.format(flag="self.uses_feature = 0", guard=guard, returned="batch, None")}
    new = {"vllm/runner.py": runner.format(flag="", guard=guard, returned="batch, None, 1")}
    plugin = {**STAGE, "vllm_omni/worker/gpu_ar_model_runner.py": """
        from vllm.runner import GPUModelRunner

        class GPUARModelRunner(GPUModelRunner):
            def execute_model(self, batch):
                indices, spec = self._prepare_inputs(batch)
                if self.uses_feature > 0:
                    return indices
                return spec
        """}
    (before, _, _), drift = _drift(tmp_path, plugin, old, new)
    assert before == []
    found = {(f.kind, f.vllm_object.removeprefix("vllm."), f.names): f for f in drift.findings}
    unpack = found.pop(("unpack", "runner.GPUModelRunner._prepare_inputs", ("_prepare_inputs",)), None)
    assert unpack is not None, (found, drift)
    assert unpack.stops_in == (("llm_stage", ""),)  # each step runs it: the stage stops
    if not allowlisted:  # the class may set anything by name: its attributes are not judged
        assert found == {}
        return
    attribute = found.pop(("attribute", "runner.GPUModelRunner.uses_feature", ("uses_feature",)))
    assert found == {}
    assert attribute.readers == ("vllm_omni.worker.gpu_ar_model_runner.GPUARModelRunner.execute_model",)
    assert attribute.stops_in == (("llm_stage", ""),)


@pytest.mark.parametrize("picked", ["in-a-step", "elsewhere", "rebound"])
def test_an_object_a_step_builds_and_hands_to_vllm_reading_what_its_skipped_init_sets(tmp_path, picked):
    """The shape of vllm-omni 0.24.0's async runner output on vLLM 0.30: the AR runner's ``sample_tokens`` (a step)
    picks ``OmniAsyncOutput if use_async else AsyncOutput`` into a local and builds it; vLLM's engine then calls the
    inherited ``get``, which reads what only vLLM's skipped ``__init__`` sets. Building it in the step is what runs
    vLLM's reader, so the stage stops under the pick's test; built only in a function no step runs, or through a
    local bound again to something else before the call, it stays "when used"."""
    method = "debug_dump" if picked == "elsewhere" else "sample_tokens"
    rebind = "output_cls = self.output_factory" if picked == "rebound" else "pass"
    plugin = {**STAGE, "vllm_omni/worker/gpu_ar_model_runner.py": f"""
        from vllm.outputs import AsyncOutput

        class OmniAsyncOutput(AsyncOutput):
            def __init__(self, tokens):
                self._tokens = tokens

        class GPUARModelRunner:
            def {method}(self, tokens, use_async):
                output_cls = OmniAsyncOutput if use_async else AsyncOutput
                {rebind}
                return output_cls(tokens)
        """}
    (before, _, _), drift = _drift(tmp_path, plugin, ASYNC_OUTPUT_OLD, ASYNC_OUTPUT_NEW)
    assert before == []
    (finding,) = drift.findings
    assert (finding.kind, finding.names, finding.readers) == ("attribute", ("_nans",), ())
    assert finding.plugin_object == "vllm_omni.worker.gpu_ar_model_runner.OmniAsyncOutput"
    assert finding.stops_in == ((("llm_stage", "use_async"),) if picked == "in-a-step" else ())
    assert finding.effect("llm_stage") == ("stops_when" if picked == "in-a-step" else "when_used")


# ------------------------------------------------------------------------------- what an attribute holds


def test_a_method_called_on_an_attribute_whose_class_changed_under_it(tmp_path):
    """The shape of vLLM 0.34's ``Request._all_token_ids``: a list before, then a subclass of the standard library's
    ``array.array`` (annotated ``list[int]`` all the same) that has no ``clear``; vllm-omni calls it on a parameter
    annotated with vLLM's class. The standard library's class is asked (``array`` has no ``clear`` before Python
    3.13), and what a vllm-omni subclass of the request might assign is looked at."""
    import array

    old = {"vllm/request.py": """
        class Request:
            def __init__(self, prompt):
                self._tokens: list[int] = list(prompt)
        """}
    new = {"vllm/request.py": """
        from array import array

        class Buffer(array):
            def copy(self): ...

        class Request:
            def __init__(self, prompt):
                self._tokens: list[int] = Buffer(prompt)
        """}
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.request import Request

        def replace(session: Request, requests: dict[str, Request], new):
            session._tokens.clear()
            session._tokens.extend(new)
            for request in requests.values():
                request._tokens.clear()
        """}
    (before, _, _), drift = _drift(tmp_path, plugin, old, new)
    assert before == []
    if hasattr(array.array, "clear"):  # Python 3.13+: the running interpreter's array has it
        assert drift.findings == ()
        return
    found = [(f.vllm_object.removeprefix("vllm."), f.names, f.line) for f in drift.findings]
    assert found == [("request.Buffer.clear", ("clear",), 5), ("request.Buffer.clear", ("clear",), 8)]


def test_an_attribute_vllm_reads_from_a_duck_typed_stand_in_vllm_omni_passes(tmp_path):
    """The shape of vLLM 0.26's ``KVCacheManager.allocate_slots(request: Request, ...)`` reading
    ``request.num_in_flight_tokens`` where vllm-omni passes its own adapter, which does not derive ``Request``."""
    old = {"vllm/kv.py": """
        class Request:
            def __init__(self):
                self.request_id = ""
                self.num_computed_tokens = 0

        class Manager:
            def allocate(self, request: Request, num_new_tokens: int):
                return request.num_computed_tokens + num_new_tokens
        """}
    new = {"vllm/kv.py": old["vllm/kv.py"].replace(
        '                self.num_computed_tokens = 0\n',
        '                self.num_computed_tokens = 0\n                self.in_flight = 0\n').replace(
        "return request.num_computed_tokens + num_new_tokens",
        "return request.num_computed_tokens - request.in_flight + num_new_tokens")}
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.kv import Manager

        class Adapter:
            def __init__(self, request_id):
                self.request_id = request_id

            @property
            def num_computed_tokens(self):
                return 0

        class Cache:
            def __init__(self):
                self.manager = Manager()

            def allocate(self, adapter: Adapter):
                return self.manager.allocate(adapter, num_new_tokens=4)
        """}
    (before, _, _), drift = _drift(tmp_path, plugin, old, new)
    assert before == []
    assert _found(drift) == {("attribute", "kv.Request.in_flight", ("in_flight",))}
    assert drift.findings[0].plugin_object == "vllm_omni.entrypoints.omni.Adapter"


# ------------------------------------------------------------------------------------------- what is reached


def test_a_class_loaded_by_its_import_path_is_reached_where_its_base_is(tmp_path):
    """The shape of vllm-omni's AR-diffusion runner: no import reaches it; a quoted import path in another module
    (an engine's default runner) names it, and its base is the runner the diffusion stage imports. A class loaded by
    name with only a mixin in reach is not followed."""
    old = {"vllm/kv.py": """
        from dataclasses import dataclass

        @dataclass
        class Tensor:
            size: int
            shared_by: list
        """}
    new = {"vllm/kv.py": old["vllm/kv.py"].replace("shared_by: list", "layers: list")}
    plugin = {
        "vllm_omni/diffusion/__init__.py": "",
        "vllm_omni/diffusion/stage_diffusion_proc.py": "from vllm_omni.diffusion.runner import Runner, RunnerMixin\n",
        "vllm_omni/diffusion/runner.py": """
            class RunnerMixin: ...

            class Runner(RunnerMixin): ...
            """,
        "vllm_omni/experimental/__init__.py": "",
        "vllm_omni/experimental/engine.py": 'RUNNER = "vllm_omni.experimental.ar_runner.ARRunner"\n'
                                            'OTHER = "vllm_omni.experimental.mixed.Mixed"\n',
        "vllm_omni/experimental/ar_runner.py": """
            from vllm.kv import Tensor
            from vllm_omni.diffusion.runner import Runner

            class ARRunner(Runner):
                def build(self, size, names):
                    return Tensor(size=size, shared_by=names)
            """,
        "vllm_omni/experimental/mixed.py": """
            from vllm.kv import Tensor
            from vllm_omni.diffusion.runner import RunnerMixin

            class Mixed(RunnerMixin):
                def build(self, size, names):
                    return Tensor(size=size, shared_by=names)
            """,
    }
    (before, _, _), drift = _drift(tmp_path, plugin, old, new)
    assert before == []
    (finding,) = drift.findings
    assert (finding.kind, finding.names, finding.plugin_object) == (
        "call", ("shared_by",), "vllm_omni.experimental.ar_runner.ARRunner.build")
    assert finding.entrypoints == ("diffusion_stage",) and finding.effect("diffusion_stage") == "when_used"


def test_an_abstract_method_of_a_class_vllm_omni_builds_that_has_subclasses(tmp_path):
    """vllm-omni 0.30's ``AsyncOmni`` has a subclass (``DuplexOmni``), so it is no leaf; it is built all the same."""
    old = {"vllm/protocol.py": """
        from abc import ABC, abstractmethod

        class Client(ABC):
            @abstractmethod
            def generate(self): ...
        """}
    new = {"vllm/protocol.py": old["vllm/protocol.py"] + """
            @abstractmethod
            def release(self): ...
        """}
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.protocol import Client

        class OmniClient(Client):
            def generate(self): ...

        class DuplexClient(OmniClient):
            def release(self): ...

        def start():
            return OmniClient()
        """}
    (before, _, _), drift = _drift(tmp_path, plugin, old, new)
    assert before == []
    assert _found(drift) == {("abstract", "protocol.Client.release", ("release",))}
    assert drift.findings[0].plugin_object == "vllm_omni.entrypoints.omni.OmniClient"
    assert drift.findings[0].effect("offline") == "stops"


def test_an_inherited_vllm_method_called_on_self_is_checked(tmp_path):
    """A keyword change of a vLLM method vllm-omni reaches through inheritance (``self._make_data(...,
    resumed=...)``); a method a vllm-omni subclass overrides is vllm-omni's to call."""
    old = {"vllm/sched.py": """
        class Scheduler:
            def _make_data(self, running, resumed): ...
            def _other(self, x): ...
        """}
    new = {"vllm/sched.py": old["vllm/sched.py"].replace("running, resumed", "running").replace(
        "_other(self, x)", "_other(self)")}
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.sched import Scheduler

        class OmniScheduler(Scheduler):
            def schedule(self, running):
                self._other(1)
                return self._make_data(running, resumed=[])

        class Child(OmniScheduler):
            def _other(self, *args): ...
        """}
    (before, _, _), drift = _drift(tmp_path, plugin, old, new)
    assert before == []
    assert _found(drift) == {("call", "sched.Scheduler._make_data", ("resumed",))}


def test_a_write_to_a_vllm_object_that_nothing_reads_any_more(tmp_path):
    """The shape of ``Request.async_tokens_to_discard``: vllm-omni sets it, vLLM 0.27 stopped reading it."""
    old = {"vllm/request.py": """
        class Request:
            def __init__(self):
                self.discard = 0
                self.status = 0
        """, "vllm/sched.py": """
        def update(request):
            if request.discard > 0:
                request.discard -= 1
            return request.status
        """}
    new = {"vllm/request.py": old["vllm/request.py"].replace("                self.discard = 0\n", ""),
           "vllm/sched.py": "def update(request):\n    return request.status\n"}
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.request import Request

        def stop(request: Request):
            request.discard = 1
            request.status = 2
        """}
    (before, _, _), drift = _drift(tmp_path, plugin, old, new)
    assert before == []
    assert _found(drift) == {("unread", "request.Request.discard", ("discard",))}
    assert drift.findings[0].effect("offline") == "when_used"  # a report line: it starts and runs, differently


# -------------------------------------------------------------------------------- fewer undecidable sites


def test_a_name_vllm_moved_is_read_where_it_went(tmp_path):
    """A module vLLM moved whole (the import drift's alias bridges it) is read at its new home: a call of a class
    of it is checked, not undecidable; a same-named class of a module with another name is another class."""
    host = {"vllm/entrypoints/__init__.py": "", "vllm/entrypoints/launchers/__init__.py": "",
            "vllm/entrypoints/launchers/cli_args.py": "def make_parser(parser, *, strict): ...\n",
            "vllm/entrypoints/gpu/__init__.py": "", "vllm/entrypoints/gpu/runner.py": "class Runner:\n    pass\n"}
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.entrypoints.cli_args import make_parser
        from vllm.entrypoints.gpu_runner import Runner

        def start(parser):
            Runner(parser)
            return make_parser(parser)
        """}
    plugin_tree = write_tree(tmp_path / "plugin", {**ROOTS, **plugin})
    host_tree = write_tree(tmp_path / "host", {**ROOTS, **host})
    model = CodeModel(plugin_tree, host_tree)
    assert model.resolve("vllm.entrypoints.cli_args", "make_parser").module == "vllm.entrypoints.launchers.cli_args"
    assert model.resolve("vllm.entrypoints.gpu_runner", "Runner") is None
    findings, _, undecidable = scan(plugin_tree, host_tree)
    assert [(f.vllm_object, f.names) for f in findings] == [
        ("vllm.entrypoints.launchers.cli_args.make_parser", ("strict",))]
    assert undecidable == 1  # Runner(parser): a name the files cannot follow


def test_a_class_without_any_init_takes_no_arguments(tmp_path):
    host = {"vllm/cli.py": "class Command:\n    def run(self): ...\n"}
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.cli import Command

        class OmniCommand(Command):
            pass

        def start():
            return OmniCommand(), OmniCommand("extra")
        """}
    (findings, _, undecidable), _ = _drift(tmp_path, plugin, host, host)
    assert [(f.kind, f.names) for f in findings] == [("call", ("*positional",))] and undecidable == 0


def test_a_call_through_an_abstract_holder_that_declares_the_method_fits(tmp_path):
    """``self.waiting.pop()`` where ``self.waiting`` holds an abstract queue that declares ``pop()``: its
    implementations take that call. One the declaration does not take stays undecidable (an implementation may)."""
    host = {"vllm/sched.py": """
        from abc import ABC, abstractmethod

        class Queue(ABC):
            @abstractmethod
            def pop(self): ...

        class Scheduler:
            def __init__(self, waiting: Queue):
                self.waiting = waiting
        """}
    plugin = {"vllm_omni/entrypoints/omni.py": """
        from vllm.sched import Scheduler

        class OmniScheduler(Scheduler):
            def step(self):
                self.waiting.pop()
                self.waiting.pop(0)
        """}
    (findings, checked, undecidable), _ = _drift(tmp_path, plugin, host, host)
    assert findings == [] and undecidable == 1 and checked >= 1


@pytest.mark.parametrize("hidden", [False, True])
def test_local_types_follow_annotations_builds_and_containers(tmp_path, hidden):
    plugin = {"vllm_omni/entrypoints/omni.py": f"""
        from vllm.sched import Request

        def f(a: Request, xs: dict[str, Request], ys: list[Request] | None):
            b = Request()
            c = xs.get("k")
            for d in ys:
                pass
            for _, e in xs.items():
                pass
            {"b = 1" if hidden else "pass"}
        """}
    host = {"vllm/sched.py": "class Request:\n    pass\n"}
    tree = write_tree(tmp_path / "plugin", {**ROOTS, **plugin})
    model = CodeModel(tree, write_tree(tmp_path / "host", {**ROOTS, **host}))
    func = model.module_ast("vllm_omni.entrypoints.omni").body[1]
    found = {name: d.name for name, d in model.local_types("vllm_omni.entrypoints.omni", None, func).items()}
    expected = {"a": "Request", "b": "Request", "c": "Request", "d": "Request", "e": "Request"}
    assert found == ({k: v for k, v in expected.items() if k != "b"} if hidden else expected)
