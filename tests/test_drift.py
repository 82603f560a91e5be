"""The install primitive (``drift.mark`` / ``provide`` / ``withdraw`` / ``replace`` / ``restore`` / ``unwrap``) and the
``DriftPoint`` defaults, in the pytest process.

The primitive's promises (``vllm_compat/drift.py``): one mark (the entry id) on everything installed; ``provide``
never over a name the owner binds itself; ``replace`` keeps the exact original as ``__wrapped__`` and a second
variant replaces the first, never wraps it; ``restore`` and ``unwrap`` take off exactly our wrappers, never another
library's (a ``functools.wraps`` wrapper, as ``wrapt`` or a profiler would put there). They are checked on classes and
modules made here and, for the method primitive, on a real vLLM class imported in the test process (restored exactly).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import types

import pytest

from conftest import needs_vllm
from vllm_compat.bridges import engine_zmq_addresses
from vllm_compat.decide import Action, Decision
from vllm_compat.drift import (
    MARK,
    VARIANT_MARK,
    DriftPoint,
    is_ours,
    mark,
    provide,
    replace,
    restore,
    unwrap,
    variant_of,
    withdraw,
)
from vllm_compat.errors import PatchRefusedError

A, B = "entry_a", "entry_b"


def _fn():
    def f(x):
        return x

    return f


def _foreign_wrapper(original):
    """Another library's wrapper: ``functools.wraps`` sets ``__wrapped__``, no mark of ours."""
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        return ("foreign", original(*args, **kwargs))

    return wrapper


def _ours_around(tag):
    def make(original):
        def wrapper(*args, **kwargs):
            return (tag, original(*args, **kwargs))

        return wrapper

    return make


# ---- mark / is_ours / variant_of / unwrap ----

def test_mark_sets_the_entry_and_the_variant_only_when_given():
    plain, variant = _fn(), _fn()
    assert mark(plain, A) is plain and getattr(plain, MARK) == A and not hasattr(plain, VARIANT_MARK)
    assert mark(variant, A, "v1") is variant and getattr(variant, VARIANT_MARK) == "v1"


def test_is_ours_by_entry():
    f = _fn()
    assert not is_ours(f) and not is_ours(f, A) and not is_ours(None)
    mark(f, A)
    assert is_ours(f) and is_ours(f, A) and not is_ours(f, B)
    empty = _fn()
    setattr(empty, MARK, "")  # an empty mark is no entry's
    assert not is_ours(empty) and not is_ours(empty, "")


def test_variant_of_reads_only_our_objects():
    assert variant_of(mark(_fn(), A, "meta_safe")) == "meta_safe"
    assert variant_of(mark(_fn(), A)) is None
    stray = _fn()
    setattr(stray, VARIANT_MARK, "meta_safe")  # not ours: its variant mark means nothing
    assert variant_of(stray) is None


def test_unwrap_takes_off_our_wrappers_only():
    original = _fn()
    foreign = _foreign_wrapper(original)
    inner = mark(_ours_around("b")(foreign), B)
    inner.__wrapped__ = foreign
    outer = mark(_ours_around("a")(inner), A)
    outer.__wrapped__ = inner
    assert unwrap(outer) is foreign  # both of ours, not the other library's
    assert unwrap(outer, A) is inner  # only A's
    assert unwrap(outer, B) is outer  # the outermost is not B's: nothing taken off
    assert unwrap(foreign) is foreign and unwrap(original) is original
    marked_plain = mark(_fn(), A)  # ours but wrapping nothing (a provided name)
    assert unwrap(marked_plain) is marked_plain


# ---- provide / withdraw ----

@pytest.mark.parametrize("kind", ["module", "class"])
def test_provide_and_withdraw(kind):
    owner = types.ModuleType("scratch_owner") if kind == "module" else type("ScratchOwner", (), {})
    value = _fn()
    assert provide(owner, "name", value, A) is True
    assert vars(owner)["name"] is value and getattr(value, MARK) == A
    assert provide(owner, "name", _fn(), A) is False and vars(owner)["name"] is value  # ours there: a no-op
    with pytest.raises(PatchRefusedError):  # another entry's object is not this entry's to keep
        provide(owner, "name", _fn(), B)
    assert withdraw(owner, "name", B) is False and vars(owner)["name"] is value
    assert withdraw(owner, "name", A) is True and "name" not in vars(owner)
    assert withdraw(owner, "name", A) is False


@pytest.mark.parametrize("own", [_fn(), None, 0], ids=["function", "None", "zero"])
def test_provide_never_replaces_what_the_owner_binds(own):
    owner = types.ModuleType("vllm_like")
    owner.name = own
    with pytest.raises(PatchRefusedError, match=r"vllm_like\.name exists \(") as raised:
        provide(owner, "name", _fn(), A)
    assert "not vllm_compat's stand-in" in str(raised.value)
    assert vars(owner)["name"] is own
    if own is not None:
        assert not is_ours(own)


def test_provide_names_a_class_owner_by_its_qualname_and_others_by_repr():
    class Owner:
        name = 1

    with pytest.raises(PatchRefusedError, match=r"test_provide_names_a_class_owner_by_its_qualname_and_others_by_"
                                                 r"repr\.<locals>\.Owner\.name exists"):
        provide(Owner, "name", _fn(), A)

    class Plain:
        pass

    holder = Plain()
    holder.name = 1
    with pytest.raises(PatchRefusedError, match=r"<.*Plain object at 0x[0-9a-f]+>\.name exists"):
        provide(holder, "name", _fn(), A)


# ---- replace / restore ----

def _owner_with_method():
    class Owner:
        def method(self, x):
            return x * 2

    return Owner, vars(Owner)["method"]


def test_replace_wraps_the_original_and_marks_the_wrapper():
    Owner, original = _owner_with_method()
    assert replace(Owner, "method", _ours_around("v1"), A, "v1") is True
    wrapper = vars(Owner)["method"]
    assert wrapper.__wrapped__ is original and getattr(wrapper, MARK) == A and variant_of(wrapper) == "v1"
    assert Owner().method(3) == ("v1", 6)
    assert replace(Owner, "method", _ours_around("v1"), A, "v1") is False  # the same variant: a no-op
    assert vars(Owner)["method"] is wrapper
    assert replace(Owner, "method", _ours_around("v2"), A, "v2") is True  # another variant replaces, never stacks
    second = vars(Owner)["method"]
    assert second.__wrapped__ is original and variant_of(second) == "v2" and Owner().method(3) == ("v2", 6)
    assert restore(Owner, "method", A) is True and vars(Owner)["method"] is original
    assert restore(Owner, "method", A) is False and vars(Owner)["method"] is original


def test_replace_without_a_variant_is_idempotent_too():
    Owner, original = _owner_with_method()
    assert replace(Owner, "method", _ours_around("x"), A) is True
    first = vars(Owner)["method"]
    assert replace(Owner, "method", _ours_around("x"), A) is False and vars(Owner)["method"] is first
    assert variant_of(first) is None and not hasattr(first, VARIANT_MARK)
    restore(Owner, "method", A)
    assert vars(Owner)["method"] is original


def test_replace_over_another_library_s_wrapper_and_another_entry_s():
    Owner, original = _owner_with_method()
    foreign = _foreign_wrapper(original)
    Owner.method = foreign
    assert replace(Owner, "method", _ours_around("a"), A, "v") is True
    assert vars(Owner)["method"].__wrapped__ is foreign and Owner().method(2) == ("a", ("foreign", 4))
    assert restore(Owner, "method", B) is False  # another entry's restore leaves ours
    assert replace(Owner, "method", _ours_around("b"), B) is True  # B wraps A's wrapper (A's is not B's)
    b_wrapper = vars(Owner)["method"]
    assert getattr(b_wrapper.__wrapped__, MARK) == A
    assert restore(Owner, "method", A) is False and vars(Owner)["method"] is b_wrapper  # not A's on top
    assert restore(Owner, "method", B) is True and getattr(vars(Owner)["method"], MARK) == A
    assert restore(Owner, "method", A) is True and vars(Owner)["method"] is foreign  # never the other library's
    assert restore(Owner, "method", A) is False and vars(Owner)["method"] is foreign


def test_replace_needs_the_owner_to_bind_the_name():
    class Owner:
        pass

    with pytest.raises(KeyError):
        replace(Owner, "missing", _ours_around("x"), A)
    assert "missing" not in vars(Owner)


@needs_vllm
def test_replace_and_restore_on_a_real_vllm_class():
    """vLLM's ``SamplingParams.clone``, wrapped and restored in this process: the exact object comes back."""
    sampling = importlib.import_module("vllm.sampling_params")
    cls = sampling.SamplingParams
    if "clone" not in vars(cls):
        pytest.skip("this vLLM's SamplingParams defines no clone")
    original = vars(cls)["clone"]
    calls = []

    def make(wrapped):
        def clone(self):
            calls.append(self)
            return wrapped(self)

        return clone

    try:
        assert replace(cls, "clone", make, A, "v") is True
        params = cls(temperature=0.5)
        copy = params.clone()
        assert calls == [params] and copy.temperature == 0.5 and copy is not params
        assert unwrap(vars(cls)["clone"]) is original
    finally:
        assert restore(cls, "clone", A) is True
    assert vars(cls)["clone"] is original and not is_ours(vars(cls)["clone"])


# ---- the DriftPoint defaults ----

def _base_point():
    """A ``DriftPoint`` with only the defaults, found as the engine_zmq_addresses row (its class's module)."""
    return type("BarePoint", (DriftPoint,), {"__module__": engine_zmq_addresses.__name__})()


def test_identity_is_the_catalogue_row_of_its_module():
    point = _base_point()
    assert point.id == "engine_zmq_addresses"
    assert (point.target_module, point.target) == ("vllm.v1.engine.utils", "get_engine_zmq_addresses")
    assert point.target_path == "vllm.v1.engine.utils.get_engine_zmq_addresses"
    assert point.entry is point.entry  # resolved once
    nowhere = type("Nowhere", (DriftPoint,), {"__module__": "tests.not_a_drift_point"})()
    with pytest.raises(KeyError):
        _ = nowhere.id


def test_decision_and_refused():
    point = _base_point()
    decision = point.decision(Action.PATCHED, "why", "v", ("a.b",))
    assert decision == Decision(point.id, point.target_path, Action.PATCHED, "v", "why", ("a.b",))
    refused = point.refused("found X")
    assert refused.action == Action.REFUSED and refused.variant is None
    assert refused.reason.startswith("found X; left unpatched.")
    assert refused.reason.endswith(f"VLLM_COMPAT_DISABLE_PATCHES={point.id} to silence this, or upgrade vllm_compat")


def test_the_required_methods_say_so():
    point = _base_point()
    for call in (lambda: point.detect_static(None), lambda: point.detect_runtime(None),
                 lambda: point.decide(None, None), lambda: point.install(None, None, None),
                 lambda: point.uninstall(None)):
        with pytest.raises(NotImplementedError, match="BarePoint must define"):
            call()


def test_the_optional_defaults():
    point = _base_point()
    owner = types.ModuleType("owner")
    assert point.locate(owner) is owner and point.prepare(owner, None) is None
    assert point.check_controls(None) is None
    assert (point.report_lines(1), point.report_fields(1), point.header_note(1), point.capabilities(1)) == ([], {}, "", {})
    assert point.in_place(None) is None and point.in_place(owner) is None and point.is_installed(None) is False
    owner.get_engine_zmq_addresses = own = _fn()
    assert point.in_place(owner) is own and point.is_installed(owner) is False
    mark(own, "another_entry")
    assert point.is_installed(owner) is False
    mark(own, point.id)
    assert point.is_installed(owner) is True
    assert point.capability_names == () and point.imported_by_doctor is False


def test_compare_and_facts_dict_defaults():
    point = _base_point()
    assert point.compare((1, 2), (1, 2)) == []
    (line,) = point.compare("static-x", "runtime-y")
    assert "static-x" in line and "runtime-y" in line and line.index("static-x") < line.index("runtime-y")

    @dataclasses.dataclass
    class Facts:
        a: int
        b: tuple = ()

    class WithToDict:
        def to_dict(self):
            return {"own": True}

    assert point.facts_dict(Facts(1, (2,))) == {"a": 1, "b": (2,)}
    assert point.facts_dict(WithToDict()) == {"own": True}



def test_entries_stack_and_a_new_variant_replaces_only_its_own_layer():
    """A's wrapper (no variant), then B's (no variant): B installs over A; B's next variant replaces B's layer and
    keeps A's under it."""
    Owner, original = _owner_with_method()
    assert replace(Owner, "method", _ours_around("a"), A) is True
    a_wrapper = vars(Owner)["method"]
    assert replace(Owner, "method", _ours_around("b"), B) is True  # A's is not B's: B is not "already there"
    assert vars(Owner)["method"].__wrapped__ is a_wrapper and Owner().method(1) == ("b", ("a", 2))
    assert replace(Owner, "method", _ours_around("b2"), B, "v2") is True
    assert vars(Owner)["method"].__wrapped__ is a_wrapper and Owner().method(1) == ("b2", ("a", 2))
    assert restore(Owner, "method", B) is True and vars(Owner)["method"] is a_wrapper
    assert restore(Owner, "method", A) is True and vars(Owner)["method"] is original
