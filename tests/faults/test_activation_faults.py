"""Activation faults against the real vllm-omni loader, batched into one fresh interpreter per scenario group.

Already covered in ``tests/test_activate.py`` (not repeated here): one 16-thread race of the hook against
``apply()``; ``apply()`` after the hook; revert -> reload -> apply -> reload; VLLM_COMPAT_DISABLE at start;
an invalid VLLM_COMPAT_LOADER_VARIANT failing the import and a valid one then patching; ``apply()`` without
vllm-omni being pending; an invalid switch raising from ``apply()``. Strict mode over loader shapes no release
has, through the real import hook, is in ``test_environment.py``.

Here: the same race repeated (16 threads, 8 rounds, each round re-firing the hook by reloading the module)
with a check that the method is never wrapped twice; ``vllm_compat`` imported twice (including a purge of
``sys.modules`` and a re-import); ``apply()``/``revert()`` repeated in any order; ``importlib.reload``; the loader class replaced by a subclass (overriding, or inheriting the method); strict mode with the
real class's method replaced by one of unknown shape; VLLM_COMPAT_DISABLE switched on after patching.
"""

from __future__ import annotations

import pytest

from conftest import needs_omni, run_python

from ._support import LOADER_MODULE, result_of

pytestmark = [needs_omni, pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("activation")
    unknown = tmp_path / "unknown_shape.py"
    unknown.write_text("def _process_weights_after_loading(self, model, target_device):\n"
                       "    model.apply(lambda m: None)\n")
    code = f"""
import importlib, io, json, logging, os, sys, threading
stream = io.StringIO()
logging.getLogger("vllm_compat").addHandler(logging.StreamHandler(stream))
logging.getLogger("vllm_compat").setLevel(logging.DEBUG)  # the per-entry lines are at DEBUG
import vllm_compat
import vllm_compat  # a second import is the cached module
first_instance = importlib.import_module("vllm_compat.activate")
first_instance.install_import_hook()  # this copy's hooks, as a served package's first lookup registers them
# Purge and import again before the loader is imported: two copies of the package in one process.
for name in [m for m in sys.modules if m == "vllm_compat" or m.startswith("vllm_compat.")]:
    del sys.modules[name]
import vllm_compat
from vllm_compat.patches.diffusers_loader import installed_variant
from vllm_compat.activate import activate_entry
from vllm_compat.catalogue import entry as catalogue_entry
def patch_loader_module(module, controls):
    return activate_entry(catalogue_entry("diffusers_loader_meta_device"), module, controls)
from vllm_compat.config import Controls
from vllm_compat.errors import PatchRefusedError
out = {{"finders": sum(1 for f in sys.meta_path if getattr(f, "_vllm_compat_finder", False))}}

def ours(f):
    return getattr(f, "_vllm_compat_installed", False)

def depth(cls):
    f, n = vars(cls)["_process_weights_after_loading"], 0
    while ours(f):
        f, n = f.__wrapped__, n + 1
    return n

module = importlib.import_module({LOADER_MODULE!r})
cls = module.DiffusersPipelineLoader
out["after_double_import"] = [installed_variant(cls), depth(cls), [d.action for d in vllm_compat.current_decisions() if d.name == "diffusers_loader_meta_device"],
                              [d.action for d in first_instance.current_decisions() if d.name == "diffusers_loader_meta_device"]]
out["info_lines_after_double_import"] = stream.getvalue().count("vllm_compat: patched " + {LOADER_MODULE!r} + ".DiffusersPipelineLoader._process")
try:
    vllm_compat.revert()
    out["revert_after_reimport"] = "ok"
except Exception as exc:
    out["revert_after_reimport"] = repr(exc)
vllm_compat.apply()

# reload keeps the decision on the fresh class
auto_variant = installed_variant(module.DiffusersPipelineLoader)
importlib.reload(module)
out["auto_reload"] = [auto_variant, installed_variant(module.DiffusersPipelineLoader), depth(module.DiffusersPipelineLoader)]

# repeated races (forced from the start, so every env patches)
rounds = []
for r in range(8):
    barrier = threading.Barrier(16)
    errors = []
    def race(i):
        try:
            barrier.wait()
            if i == 0:
                importlib.reload(module)          # the hook fires on the reloaded module
            elif i % 3 == 0:
                vllm_compat.revert(); vllm_compat.apply()
            else:
                vllm_compat.apply()
        except BaseException as exc:
            errors.append(repr(exc))
    threads = [threading.Thread(target=race, args=(i,)) for i in range(16)]
    [t.start() for t in threads]; [t.join() for t in threads]
    vllm_compat.apply()
    c = module.DiffusersPipelineLoader
    rounds.append([installed_variant(c), depth(c), errors])
out["rounds"] = rounds

# revert / apply in any order
c = module.DiffusersPipelineLoader
vllm_compat.revert(); vllm_compat.revert()
out["revert_twice"] = [installed_variant(c), depth(c)]
vllm_compat.apply(); vllm_compat.apply()
out["apply_twice"] = [installed_variant(c), depth(c)]

# the class replaced by a subclass after patching
original = module.DiffusersPipelineLoader
class Overriding(original):
    def _process_weights_after_loading(self, model, target_device):
        super()._process_weights_after_loading(model, target_device)
class Inheriting(original):
    pass
subclass = {{}}
for sub in (Overriding, Inheriting):
    module.DiffusersPipelineLoader = sub
    d = vllm_compat.apply()[0]
    subclass[sub.__name__] = [d.action, d.reason[:160], installed_variant(sub), installed_variant(original),
                              "_process_weights_after_loading" in vars(sub) and ours(vars(sub)["_process_weights_after_loading"])]
    module.DiffusersPipelineLoader = original
out["subclass"] = subclass

# strict mode: the real class's method replaced by one of an unknown shape
saved = vars(original)["_process_weights_after_loading"]
sys.path.insert(0, {str(tmp_path)!r})
original._process_weights_after_loading = importlib.import_module("unknown_shape")._process_weights_after_loading
try:
    patch_loader_module(module, Controls(strict=True))
    out["strict"] = "no error"
except PatchRefusedError as exc:
    out["strict"] = "PatchRefusedError: " + str(exc)[:120]
out["strict_left_alone"] = not ours(vars(original)["_process_weights_after_loading"])
original._process_weights_after_loading = saved

# VLLM_COMPAT_DISABLE switched on after the patch is in
os.environ["VLLM_COMPAT_LOADER_VARIANT"] = "meta_safe"
vllm_compat.apply()
os.environ["VLLM_COMPAT_DISABLE"] = "1"
d = next(d for d in vllm_compat.apply() if d.name == "diffusers_loader_meta_device")
reported = next(p for p in vllm_compat.report().to_dict()["patches"] if p["name"] == "diffusers_loader_meta_device")
out["disable_late"] = [d.action, installed_variant(original), reported["action"]]
print("RESULT" + json.dumps(out))
"""
    # Forced, so a loader already fixed upstream (skipped under auto) is patched too and every check bites.
    return result_of(run_python(code, env={"VLLM_COMPAT_LOADER_VARIANT": "meta_safe"}, timeout=600, warm=True))


def test_vllm_compat_imported_twice_patches_once(out):
    assert out["finders"] == 1
    variant, depth, _, first_actions = out["after_double_import"]
    assert depth == (1 if variant else 0) and len(first_actions) == 1
    assert out["info_lines_after_double_import"] == (1 if variant else 0)


def test_reimported_vllm_compat_records_the_hook_decision(out):
    assert len(out["after_double_import"][2]) == 1


def test_revert_after_reimport_does_not_raise(out):
    assert out["revert_after_reimport"] == "ok"


def test_reload_keeps_the_decision(out):
    before, after, depth = out["auto_reload"]
    assert before == after and depth == (1 if after else 0)


def test_hook_racing_apply_and_revert_16_threads_8_rounds_never_double_wraps(out):
    assert len(out["rounds"]) == 8  # all() below holds for no round at all
    assert all(r == ["meta_safe", 1, []] for r in out["rounds"]), out["rounds"]


def test_revert_twice_then_apply_twice(out):
    assert out["revert_twice"] == [None, 0] and out["apply_twice"] == ["meta_safe", 1]


def test_class_replaced_by_an_overriding_subclass_gets_the_forced_variant(out):
    """Forced: the replacement class is patched on its own, the original keeps its patch (under auto an
    overriding subclass is refused: see test_environment.SHAPES["subclass_override"])."""
    action, _, sub_variant, base_variant, sub_ours = out["subclass"]["Overriding"]
    assert action == "patched" and sub_variant == "meta_safe" == base_variant and sub_ours


def test_class_replaced_by_an_inheriting_subclass_reports_the_inherited_patch(out):
    action, _, _, base_variant, _ = out["subclass"]["Inheriting"]
    assert base_variant is not None and action != "refused"


def test_strict_mode_with_a_refused_target_raises_and_leaves_it_alone(out):
    assert out["strict"].startswith("PatchRefusedError") and out["strict_left_alone"]


def test_disable_after_patching_is_reported_truthfully(out):
    """Switched off after the patch is in: the decision, the report and the class agree; "disabled" only where
    the patch came off, and the patch still there is reported as in place."""
    action, variant, reported = out["disable_late"]
    assert reported == action, out["disable_late"]
    assert (action == "disabled") == (variant is None), out["disable_late"]
