"""The layer every name stand-in shares (``bridges._name_stand_in``), in the pytest process.

What the layer promises, checked where it can be seen without a second interpreter:

- ``NameStandIn``: the imported module's answer (it lacks the name where nothing, or only this entry's object, is
  there), the contract check before install (never over an object it did not put there), install / uninstall of
  exactly the entry's object, idempotent, on the real vLLM modules that lack a stand-in's name here.
- the facts read from files agree with the imported vLLM (whether it binds the name natively) and with vllm-omni's
  own source (the import statements of the name, re-read here with ``ast``).
- ``FunctionStandIn``: which calls of the old name it takes (the oracle is Python's own argument binding against the
  old signature the docstrings name), the scan of a vllm-omni file written here, when it asks vLLM's replacement
  at all, the decision table over shapes, the refusal in ``prepare`` and the comparison of both detections.

A probe subclass of a real stand-in (its module set to the stand-in's, so it finds the same catalogue row) stands in
for vLLM's replacement where a test needs a shape the installed vLLM does not have; the layer's own code is what runs.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import itertools
import types

import pytest

from conftest import needs_omni, needs_vllm
from vllm_compat.bridges import HostKind, StandInFacts
from vllm_compat.bridges import engine_zmq_addresses as zmq
from vllm_compat.bridges import kv_cache_configs as kv
from vllm_compat.bridges._name_stand_in import FunctionStandIn, FunctionStandInFacts, NameStandIn, Shape
from vllm_compat.catalogue import CATALOGUE
from vllm_compat.decide import Action
from vllm_compat.detect.source_tree import SourceTree
from vllm_compat.detect.static import StaticSite
from vllm_compat.drift import MARK, is_ours, mark, provide
from vllm_compat.errors import PatchRefusedError

STAND_INS = [e for e in CATALOGUE if isinstance(e.point, NameStandIn)]
# The stand-ins that keep the layer's own install / uninstall / module answer (no override in their class).
PLAIN = [e for e in STAND_INS if not e.point.provides_module and all(
    getattr(type(e.point), name) is getattr(NameStandIn, name) for name in ("install", "uninstall", "host_in_module"))]
ZMQ, KV = zmq.DRIFT_POINT, kv.DRIFT_POINT
PATCHED = Action.PATCHED


def _probe(point, **overrides):
    """A subclass of ``point``'s class defined "in" its module (so ``entry`` is the same row), with ``overrides``."""
    cls = type(f"Probe{type(point).__name__}", (type(point),), {"__module__": type(point).__module__, **overrides})
    return cls()


def _scratch(point, **names):
    """A fresh module object named as ``point``'s target module, holding ``names``."""
    module = types.ModuleType(point.target_module)
    vars(module).update(names)
    return module


# ---- NameStandIn on a scratch module: the imported module's answer, prepare, install, uninstall ----

@pytest.mark.parametrize("entry", PLAIN, ids=[e.id for e in PLAIN])
def test_the_imported_module_lacks_the_name_only_where_nothing_or_this_entry_s_object_is_there(entry):
    point = entry.point
    other = next(e.id for e in STAND_INS if e.id != entry.id)
    assert point.host_in_module(_scratch(point)) == HostKind.LACKS
    assert point.host_in_module(_scratch(point, **{point.name: None})) == HostKind.LACKS
    assert point.host_in_module(_scratch(point, **{point.name: object()})) == HostKind.DEFINES
    assert point.host_in_module(_scratch(point, **{point.name: mark(types.SimpleNamespace(), entry.id)})) == HostKind.LACKS
    # another entry's object is not this entry's: the name is taken
    assert point.host_in_module(_scratch(point, **{point.name: mark(types.SimpleNamespace(), other)})) == HostKind.DEFINES
    # a different name on the module does not count
    assert point.host_in_module(_scratch(point, **{point.name + "_other": object()})) == HostKind.LACKS


def test_the_name_is_the_catalogue_target():
    for entry in STAND_INS:
        assert entry.point.name == entry.target, entry


def test_a_stand_in_without_build_says_so():
    bare = _probe(ZMQ, build=NameStandIn.build)
    with pytest.raises(NotImplementedError, match="^ProbeEngineZmqAddressesStandIn must define build"):
        bare.build(_scratch(ZMQ))
    with pytest.raises(NotImplementedError):
        FunctionStandIn.replacement_from_files(ZMQ, None)
    with pytest.raises(NotImplementedError):
        FunctionStandIn.replacement_from_module(ZMQ, None)


def test_prepare_install_uninstall_on_a_module_that_lacks_the_name():
    """The routed-experts stand-in's layer, on a module that lacks the name: what ``prepare`` returns is what
    ``install`` binds, marked with the entry id; a second install is a no-op; uninstall takes exactly it away."""
    point = next(e.point for e in PLAIN if e.id == "routed_experts_lists")
    owner = _scratch(point)
    facts = StandInFacts(HostKind.LACKS, ("m:1 (module)",))
    decision = point.decide(facts)
    assert decision.action == PATCHED
    built = point.prepare(owner, facts)
    assert built is not None and point.name not in vars(owner)  # prepare binds nothing
    assert point.install(owner, decision, built) is True
    assert vars(owner)[point.name] is built and getattr(built, MARK) == point.id
    assert point.host_in_module(owner) == HostKind.LACKS  # ours does not count as vLLM's
    assert point.prepare(owner, facts) is built  # ours there: prepare hands back that one, builds nothing new
    assert point.install(owner, decision, built) is False and vars(owner)[point.name] is built
    assert point.install(owner, decision, None) is False and vars(owner)[point.name] is built
    assert point.uninstall(owner) is True and point.name not in vars(owner)
    assert point.uninstall(owner) is False
    # without a prepared state, install builds one itself
    assert point.install(owner, decision, None) is True
    rebuilt = vars(owner)[point.name]
    assert is_ours(rebuilt, point.id) and rebuilt.__name__ == point.name
    assert point.uninstall(owner) is True and point.name not in vars(owner)


@pytest.mark.parametrize("entry", PLAIN, ids=[e.id for e in PLAIN])
def test_prepare_refuses_a_name_it_did_not_put_there_and_leaves_it(entry):
    point = entry.point
    own = types.SimpleNamespace()
    foreign = mark(types.SimpleNamespace(), next(e.id for e in STAND_INS if e.id != entry.id))
    for there in (own, foreign):
        owner = _scratch(point, **{point.name: there})
        with pytest.raises(PatchRefusedError, match="never replaces a name vLLM defines"):
            point.prepare(owner, StandInFacts(HostKind.DEFINES, ()))
        assert vars(owner)[point.name] is there and not is_ours(there, point.id)
        assert point.uninstall(owner) is False and vars(owner)[point.name] is there


def test_prepare_and_install_build_on_the_owner_and_keep_what_is_there():
    """With a ``build`` that makes a new object per call (as multimodal_processing_info's does): ``prepare`` hands
    back the one of ours already in place, ``install`` binds the prepared state (not a new build), and each build
    is asked with the owner."""
    built_for = []

    def build(self, owner):
        built_for.append(owner)
        return types.SimpleNamespace(built=len(built_for))

    point = _probe(next(e.point for e in PLAIN if e.id == "routed_experts_lists"), build=build)
    owner = _scratch(point)
    facts = StandInFacts(HostKind.LACKS, ("m:1 (module)",))
    state = point.prepare(owner, facts)
    assert built_for == [owner] and state.built == 1
    assert point.install(owner, point.decide(facts), state) is True and vars(owner)[point.name] is state
    assert point.prepare(owner, facts) is state and built_for == [owner]  # nothing new built
    assert point.uninstall(owner) is True
    assert point.install(owner, point.decide(facts), None) is True
    assert built_for == [owner, owner] and vars(owner)[point.name].built == 2


def test_uninstall_leaves_another_entry_s_object():
    point = next(e.point for e in PLAIN if e.id == "routed_experts_lists")
    other = mark(types.SimpleNamespace(), ZMQ.id)
    owner = _scratch(point, **{point.name: other})
    assert point.uninstall(owner) is False and vars(owner)[point.name] is other


# ---- NameStandIn on the real vLLM modules ----

def _imported(entry):
    try:
        return importlib.import_module(entry.target_module)
    except Exception as exc:  # noqa: BLE001 - a vLLM module that needs a GPU stack
        pytest.skip(f"{entry.target_module} does not import here: {type(exc).__name__}: {exc}")


@needs_vllm
@pytest.mark.parametrize("entry", PLAIN, ids=[e.id for e in PLAIN])
def test_install_cycle_on_vllm_s_module_where_it_lacks_the_name(entry):
    point = entry.point
    module = _imported(entry)
    before = vars(module).get(point.name)
    if before is not None and not is_ours(before):
        assert point.host_in_module(module) == HostKind.DEFINES
        pytest.skip(f"vLLM {module.__name__} defines {point.name} here ({before!r})")
    try:
        assert point.uninstall(module) is (before is not None)
        assert point.name not in vars(module) and point.host_in_module(module) == HostKind.LACKS
        facts = point.detect_runtime(module)
        try:
            state = point.prepare(module, facts)
        except PatchRefusedError as exc:
            pytest.skip(f"{entry.id}'s contract does not hold on this vLLM: {exc}")
        forced = entry.decision(PATCHED, "forced by the test")
        assert point.install(module, forced, state) is True
        assert vars(module)[point.name] is state and is_ours(state, point.id)
        assert point.is_installed(module) and point.host_in_module(module) == HostKind.LACKS
        assert point.install(module, forced, state) is False and vars(module)[point.name] is state
        assert point.detect_runtime(module) == facts  # ours in place: the same facts as before it
        assert point.uninstall(module) is True and point.name not in vars(module)
        assert point.uninstall(module) is False
    finally:
        point.uninstall(module)
        if before is not None:
            provide(module, point.name, before, point.id)
    assert vars(module).get(point.name) is before


# ---- facts from files: against the imported vLLM and vllm-omni's own source ----

def _imports_of_name(source: str, module: str, name: str) -> list[int]:
    """Lines of ``from module import name`` in ``source`` outside ``if TYPE_CHECKING:`` blocks (written here)."""
    tree = ast.parse(source)
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(n) for child in node.body for n in ast.walk(child))
    return sorted(node.lineno for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and id(node) not in hidden
                  and node.module == module and not node.level and any(a.name == name for a in node.names))


@needs_vllm
@pytest.mark.parametrize("entry", PLAIN, ids=[e.id for e in PLAIN])
def test_facts_from_files_match_the_imported_vllm_and_vllm_omni_s_source(entry):
    point = entry.point
    site = StaticSite.installed()
    facts = point.facts_from_files(site)
    module = _imported(entry)
    if facts.host == HostKind.UNKNOWN:
        pytest.skip(f"the files of this vLLM cannot tell whether {entry.target_path} is there (lazy or compiled)")
    own = vars(module).get(point.name)
    natively = own is not None and not is_ours(own)
    assert facts.host == (HostKind.DEFINES if natively else HostKind.LACKS), (facts, own)
    expected = []
    for relpath in point.importers:
        source = site.omni_tree.read(relpath)
        if source is not None:
            expected += [f"{relpath[:-3].replace('/', '.')}:{line}"
                         for line in _imports_of_name(source, point.target_module, point.name)]
    assert [i.split(" (")[0] for i in facts.importers] == expected
    assert facts.importers == point.importers_in(site.omni_tree)
    runtime = point.facts_from_module(module)
    assert runtime.stand_in == facts.stand_in


MODULE_STAND_INS = [e for e in STAND_INS if e.point.provides_module
                    and type(e.point).importers_in is NameStandIn.importers_in]


def _imports_of_module(source: str, module: str) -> list[int]:
    """Lines of ``import module`` / ``from module import ...`` outside ``if TYPE_CHECKING:`` (written here)."""
    tree = ast.parse(source)
    hidden = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            hidden.update(id(n) for child in node.body for n in ast.walk(child))
    return sorted(node.lineno for node in ast.walk(tree) if id(node) not in hidden and (
        (isinstance(node, ast.ImportFrom) and node.module == module and not node.level)
        or (isinstance(node, ast.Import) and any(a.name == module for a in node.names))))


@needs_omni
@pytest.mark.parametrize("entry", MODULE_STAND_INS, ids=[e.id for e in MODULE_STAND_INS])
def test_a_module_stand_in_s_importers_are_the_imports_of_the_module(entry):
    point = entry.point
    tree = StaticSite.installed().omni_tree
    expected = []
    for relpath in point.importers:
        source = tree.read(relpath)
        if source is not None:
            expected += [f"{relpath[:-3].replace('/', '.')}:{line}" for line in _imports_of_module(source, entry.target_path)]
    assert [i.split(" (")[0] for i in point.importers_in(tree)] == expected


# ---- FunctionStandIn: which calls it takes (Python's binding is the oracle) ----

def _old_signature(point):
    """The old vLLM function's parameters the stand-in serves (from the modules' docstrings): the zmq one
    ``(vllm_config, num_api_servers=1)``, the KV one ``(vllm_config, kv_cache_specs, available_memory)``."""
    if point is ZMQ:
        return inspect.Signature([inspect.Parameter("vllm_config", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                                  inspect.Parameter("num_api_servers", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                    default=1)])
    return inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                              for n in ("vllm_config", "kv_cache_specs", "available_memory")])


def _binds(signature, positional: int, keywords, partial: bool) -> bool:
    try:
        (signature.bind_partial if partial else signature.bind)(*range(positional), **{k: 0 for k in keywords})
    except TypeError:
        return False
    return True


@pytest.mark.parametrize("point", [ZMQ, KV], ids=["zmq", "kv"])
def test_call_fits_exactly_the_calls_the_old_signature_binds(point):
    """All arguments required (the KV one): the call binds to the old signature. Otherwise the scan judges only what
    is passed (a call missing ``vllm_config`` failed on the old function as it fails on the stand-in): it binds
    partially, no unknown keyword, no argument twice, no more positionals than parameters."""
    signature = _old_signature(point)
    names = list(signature.parameters) + ["defer_api_server_ports"]
    checked = 0
    for positional in range(0, 5):
        for count in range(0, 3):
            for keywords in itertools.permutations(names, count):
                expected = _binds(signature, positional, keywords, partial=not point.all_required)
                assert point.call_fits(positional, list(keywords)) is expected, (positional, keywords)
                checked += 1
    assert checked >= 50
    assert point.call_fits(1, [None]) is False  # f(x, **kwargs): what it passes is unknown
    assert point.call_fits(1, ["num_api_servers", "num_api_servers"]) is False


# ---- FunctionStandIn: the scan of vllm-omni's calls ----

CALLER = """\
from vllm.v1.engine.utils import get_engine_zmq_addresses as get
import vllm.v1.engine.utils as utils


def launch(config, n):
    a = get(config)
    b = get(config, num_api_servers=n)
    c = utils.get_engine_zmq_addresses(config, 1, 2)  # not the imported name: someone else's call
    return a, b, c
"""


def _omni_tree(tmp_path, files: dict) -> SourceTree:
    for relpath, text in files.items():
        path = tmp_path / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return SourceTree(tmp_path)


def test_the_calls_are_listed_per_file_and_line(tmp_path):
    importer = ZMQ.importers[0]
    module = importer[:-3].replace("/", ".")
    tree = _omni_tree(tmp_path, {importer: CALLER})
    shape, calls, detail = ZMQ.callers(tree)
    assert (shape, detail) == (Shape.KNOWN, "")
    assert calls == (f"{module}:6: 1 positional", f"{module}:7: 1 positional, keywords num_api_servers")


@pytest.mark.parametrize(
    ("call", "known"),
    [("get(config, 2)", True), ("get(vllm_config=config)", True), ("get(*args)", False), ("get(config, *rest)", False),
     ("get(config, defer_api_server_ports=False)", False), ("get(config, 2, 3)", False), ("get(**options)", False)],
)
def test_a_call_the_stand_in_does_not_take_makes_the_callers_unknown(tmp_path, call, known):
    importer = ZMQ.importers[0]
    tree = _omni_tree(tmp_path, {importer: CALLER.replace("get(config)", call)})
    shape, calls, detail = ZMQ.callers(tree)
    assert len(calls) == 2
    if known:
        assert (shape, detail) == (Shape.KNOWN, "")
    else:
        line = f"{importer[:-3].replace('/', '.')}:6:"
        assert shape == Shape.UNKNOWN and line in detail and "vllm_config, num_api_servers" in detail, detail
        assert ":7:" not in detail  # the call that fits is not named


def test_every_importer_file_is_read_and_every_call_named(tmp_path):
    """Two importer files, the first absent from the tree; calls with two keywords and two calls it does not take."""
    first, second = "vllm_omni/absent.py", ZMQ.importers[0]
    probe = _probe(ZMQ, importers=(first, second))
    body = CALLER.replace("get(config, num_api_servers=n)", "get(vllm_config=config, num_api_servers=n)")
    body = body.replace("    return a, b, c", "    d = get(*config)\n    e = get(config, 1, 2)\n    return a, b, c, d, e")
    shape, calls, detail = probe.callers(_omni_tree(tmp_path, {second: body}))
    module = second[:-3].replace("/", ".")
    assert calls == (f"{module}:6: 1 positional", f"{module}:7: 0 positional, keywords vllm_config, num_api_servers",
                     f"{module}:9: 1 positional", f"{module}:10: 3 positional")
    assert shape == Shape.UNKNOWN
    assert f"({module}:9: 1 positional; {module}:10: 3 positional; it takes vllm_config, num_api_servers)" in detail


def test_no_importer_file_means_no_calls(tmp_path):
    assert ZMQ.callers(_omni_tree(tmp_path, {"vllm_omni/__init__.py": ""})) == (Shape.KNOWN, (), "")


@needs_omni
def test_the_installed_vllm_omni_s_calls_are_those_its_source_has():
    """The scan against vllm-omni's own file, re-read here: every ``name(`` call after the import, with its line."""
    site = StaticSite.installed()
    for point in (ZMQ, KV):
        shape, calls, _ = point.callers(site.omni_tree)
        lines = []
        for relpath in point.importers:
            source = site.omni_tree.read(relpath)
            if source is None or not _imports_of_name(source, point.target_module, point.name):
                continue
            lines += [i for i, text in enumerate(source.splitlines(), 1)
                      if f"{point.name}(" in text and "import" not in text and "def " not in text]
        assert [int(c.split(":")[1]) for c in calls] == lines, (point.id, calls)
        assert shape == Shape.KNOWN


# ---- FunctionStandIn: facts, when the replacement is asked, the decision, prepare, compare ----

def _asking(point, answer=(Shape.KNOWN, "")):
    """A probe whose replacement answers ``answer`` from files and module, recording each question."""
    asked = []

    def from_files(self, site):
        asked.append(("files", site))
        return answer

    def from_module(self, module):
        asked.append(("module", module))
        return answer

    return _probe(point, replacement_from_files=from_files, replacement_from_module=from_module), asked


def _vllm_tree(tmp_path, utils_source: str | None) -> SourceTree:
    files = {"vllm/__init__.py": "", "vllm/v1/__init__.py": "", "vllm/v1/engine/__init__.py": ""}
    if utils_source is not None:
        files["vllm/v1/engine/utils.py"] = utils_source
    return _omni_tree(tmp_path / "vllm_site", files)


@pytest.mark.parametrize(
    ("utils_source", "host", "asked"),
    [("def get_engine_zmq_addresses(vllm_config, num_api_servers=1):\n    pass\n", HostKind.DEFINES, False),
     ("def get_engine_zmq_bind_addresses(vllm_config, num_api_servers=1):\n    pass\n", HostKind.LACKS, True),
     ("def __getattr__(name):\n    raise AttributeError(name)\n", HostKind.UNKNOWN, True),
     (None, HostKind.NO_MODULE, False)],
    ids=["defines", "lacks", "lazy", "no-module"],
)
def test_detect_static_asks_the_replacement_only_where_vllm_may_lack_the_name(tmp_path, utils_source, host, asked):
    probe, questions = _asking(ZMQ, (Shape.UNKNOWN, "the replacement's detail"))
    omni = _omni_tree(tmp_path / "omni", {ZMQ.importers[0]: CALLER})
    site = StaticSite(_vllm_tree(tmp_path, utils_source), omni)
    facts = probe.detect_static(site)
    assert facts.host == host
    assert [q[0] for q in questions] == (["files"] if asked else [])
    assert facts.replacement == (Shape.UNKNOWN if asked else Shape.ABSENT)
    assert facts.detail == ("the replacement's detail" if asked else "")
    assert facts.callers == Shape.KNOWN and len(facts.calls) == 2
    assert facts.importers == ZMQ.importers_in(omni) and len(facts.importers) == 1
    if asked:
        assert questions[0][1] is site


def test_detect_static_without_vllm_is_absent_and_pending(tmp_path):
    probe, questions = _asking(ZMQ)
    facts = probe.detect_static(StaticSite(SourceTree(tmp_path / "none"), SourceTree(tmp_path / "none")))
    assert (facts.host, facts.replacement, questions) == (HostKind.ABSENT, Shape.ABSENT, [])
    assert probe.decide(facts).action == Action.PENDING


def test_detect_runtime_asks_the_module_only_where_it_lacks_the_name():
    probe, questions = _asking(ZMQ, (Shape.KNOWN, ""))
    lacking = _scratch(ZMQ)
    facts = probe.detect_runtime(lacking)
    assert facts.host == HostKind.LACKS and facts.replacement == Shape.KNOWN and questions == [("module", lacking)]
    assert facts.importers == ZMQ.importers_in(StaticSite.installed().omni_tree)
    assert facts.calls == ZMQ.callers(StaticSite.installed().omni_tree)[1]
    questions.clear()
    defining = _scratch(ZMQ, **{ZMQ.name: lambda vllm_config, num_api_servers=1: None})
    facts = probe.detect_runtime(defining)
    assert (facts.host, facts.replacement, facts.detail, questions) == (HostKind.DEFINES, Shape.ABSENT, "", [])


def test_facts_join_both_details():
    class Tree:
        def read(self, relpath):
            return ("from vllm.v1.engine.utils import get_engine_zmq_addresses\nget_engine_zmq_addresses(*a)\n"
                    if relpath == ZMQ.importers[0] else None)

    facts = ZMQ.facts(HostKind.LACKS, Tree(), (Shape.UNKNOWN, "replacement detail"))
    assert isinstance(facts, FunctionStandInFacts)
    assert (facts.host, facts.replacement, facts.callers) == (HostKind.LACKS, Shape.UNKNOWN, Shape.UNKNOWN)
    first, second = facts.detail.split("; ", 1)
    assert first == "replacement detail" and "calls get_engine_zmq_addresses with arguments" in second
    assert len(facts.calls) == 1 and len(facts.importers) == 1
    only_calls = ZMQ.facts(HostKind.LACKS, Tree(), (Shape.KNOWN, ""))
    assert only_calls.detail == second  # no separator before a missing first detail
    assert only_calls.replacement == Shape.KNOWN


def _facts(host=HostKind.LACKS, importers=("m:1 (module)",), replacement=Shape.KNOWN, callers=Shape.KNOWN,
           calls=("m:2: 1 positional",), detail=""):
    return FunctionStandInFacts(host, importers, replacement, callers, calls, detail)


@pytest.mark.parametrize("point", [ZMQ, KV], ids=["zmq", "kv"])
def test_the_decision_over_shapes(point):
    patched = point.decide(_facts())
    assert patched.action == PATCHED and patched.name == point.id and f"lacks {point.target_path} (" in patched.reason
    assert patched.reason.endswith(f", over vLLM's {point.built_on}") and f"removed in {point.removed_in}" in patched.reason
    assert "m:1 (module)" in patched.reason
    for unknown in (_facts(replacement=Shape.UNKNOWN, detail="why A"), _facts(callers=Shape.UNKNOWN, detail="why A"),
                    _facts(replacement=Shape.UNKNOWN, callers=Shape.UNKNOWN, detail="why A")):
        refused = point.decide(unknown)
        assert refused.action == Action.REFUSED and "(why A)" in refused.reason, refused
        assert f"VLLM_COMPAT_DISABLE_PATCHES={point.id}" in refused.reason and point.target_path in refused.reason
    # the shapes do not matter where the stand-in is not needed
    assert point.decide(_facts(host=HostKind.DEFINES, replacement=Shape.UNKNOWN)).action == Action.SKIPPED
    assert point.decide(_facts(importers=(), callers=Shape.UNKNOWN)).action == Action.SKIPPED
    assert point.decide(_facts(host=HostKind.UNKNOWN, replacement=Shape.UNKNOWN)).action == Action.PENDING


def test_removed_in_is_the_release_the_docstrings_name():
    assert "removed in 0.32" in ZMQ.decide(_facts()).reason
    assert "removed in 0.33" in KV.decide(_facts()).reason


def test_prepare_checks_the_name_first_then_the_replacement():
    known, asked = _asking(ZMQ, (Shape.KNOWN, ""))
    owner = _scratch(ZMQ)
    assert known.prepare(owner, _facts()) is zmq.get_engine_zmq_addresses and asked == [("module", owner)]
    assert ZMQ.name not in vars(owner)
    unknown, asked = _asking(ZMQ, (Shape.UNKNOWN, "the replacement takes (x,)"))
    with pytest.raises(PatchRefusedError, match=r"cannot be provided: the replacement takes \(x,\)") as raised:
        unknown.prepare(owner, _facts())
    assert f"VLLM_COMPAT_DISABLE_PATCHES={ZMQ.id}" in str(raised.value) and ZMQ.name not in vars(owner)
    absent, _ = _asking(ZMQ, (Shape.ABSENT, "not there"))
    with pytest.raises(PatchRefusedError, match="not there"):
        absent.prepare(owner, _facts())
    own = lambda vllm_config: None  # noqa: E731 - vLLM's own function, as far as the layer can tell
    defining = _scratch(ZMQ, **{ZMQ.name: own})
    with pytest.raises(PatchRefusedError, match="never replaces"):
        known.prepare(defining, _facts())
    assert vars(defining)[ZMQ.name] is own


def test_compare_names_each_difference():
    same = _facts()
    assert ZMQ.compare(same, _facts()) == []
    replacement = ZMQ.compare(_facts(replacement=Shape.UNKNOWN, detail="files say"), same)
    assert len(replacement) == 1 and ZMQ.built_on in replacement[0] and "files say" in replacement[0]
    assert "unknown (files) != known (imported)" in replacement[0]
    assert "imported say" in ZMQ.compare(same, _facts(replacement=Shape.UNKNOWN, detail="imported say"))[0]
    # an absent vLLM on either side is no disagreement about its replacement
    assert ZMQ.compare(_facts(host=HostKind.ABSENT, replacement=Shape.ABSENT), same) == []
    assert ZMQ.compare(same, _facts(host=HostKind.ABSENT, replacement=Shape.ABSENT)) == []
    calls = ZMQ.compare(same, _facts(calls=("m:3: 2 positional",)))
    assert len(calls) == 1 and "m:2: 1 positional" in calls[0] and "m:3: 2 positional" in calls[0] and ZMQ.name in calls[0]
    host = ZMQ.compare(_facts(host=HostKind.DEFINES, replacement=Shape.ABSENT), _facts(host=HostKind.LACKS,
                                                                                      replacement=Shape.ABSENT))
    assert len(host) == 1 and f"{ZMQ.target_path}: vLLM defines (files) != lacks (imported)" in host[0]
    importers = ZMQ.compare(same, _facts(importers=("m:9 (module)",)))
    assert len(importers) == 1 and "m:9 (module)" in importers[0]
    both = ZMQ.compare(_facts(replacement=Shape.UNKNOWN), _facts(calls=()))
    assert len(both) == 2


@needs_vllm
@pytest.mark.parametrize("point", [ZMQ, KV], ids=["zmq", "kv"])
def test_static_and_runtime_agree_on_the_installed_vllm(point):
    module = _imported(point.entry)
    static = point.detect_static(StaticSite.installed())
    runtime = point.detect_runtime(module)
    assert point.compare(static, runtime) == [], (static, runtime)
    assert (static.host, static.replacement, static.calls) == (runtime.host, runtime.replacement, runtime.calls)
    own = vars(module).get(point.name)
    if own is not None and not is_ours(own):  # vLLM's own: the replacement is never asked
        assert static.replacement == runtime.replacement == Shape.ABSENT
        assert point.decide(static).action == Action.SKIPPED
