"""The ``MultiModalProcessingInfo`` stand-in on the real wheels: vllm-omni 0.30.0's Qwen2.5-Omni thinker (on its
diffusion worker's import chain) dies at its vLLM processor import on vLLM 0.31+ without it (the real ImportError,
reproduced first), gets past it with it, as far as the native pair (vllm-omni 0.30.0 on vLLM 0.30) gets; the
stand-in is vLLM 0.30's NamedTuple, stays out where vLLM has it, and what it does not bridge (the thinker's own
processing) fails loudly."""

from __future__ import annotations

import ast
import glob
import importlib
import importlib.util
import inspect
import json
import os
import zipfile

import pytest

from conftest import needs_startup_hook, needs_vllm, run_python
from tests.bridges import name_stand_in_cases as cases
from vllm_compat.bridges import HostKind, installed_omni_tree
from vllm_compat.bridges import multimodal_processing_info as bridge
from vllm_compat.detect.static import StaticSite

STATIC = bridge.DRIFT_POINT.detect_static(StaticSite.installed())
TARGET = bridge.DRIFT_POINT.entry.target_path
PROCESSOR = bridge.DRIFT_POINT.entry.target_module
THINKER = "vllm_omni.model_executor.models.qwen2_5_omni.qwen2_5_omni_thinker"
THINKER_FILE = bridge.IMPORTERS[0]
IMPORT_ERROR = f"ImportError: cannot import name '{bridge.NAME}' from '{PROCESSOR}'"
# As far as the native pair gets on this machine: the thinker imports vLLM's Qwen2.5-Omni model, whose qwen2_vl
# import reaches transformers' image processing, which needs torchvision (absent on the CPU test machine). vllm-omni
# 0.30.0 on vLLM 0.30 (its own) stops there too; that is the outcome the bridged import must reach.
NATIVE_OUTCOME = ("IMPORTED" if importlib.util.find_spec("torchvision") is not None
                  else "ModuleNotFoundError: No module named 'torchvision'")
needs_missing_name = pytest.mark.skipif(
    STATIC.host != HostKind.LACKS or not STATIC.importers,
    reason=f"needs vLLM >= 0.31 (no {TARGET}) with a vllm-omni that imports it (0.30.0); here: vLLM {STATIC.host} "
    f"it, importers {list(STATIC.importers) or 'none'}",
)
needs_vllm_defining_it = pytest.mark.skipif(
    STATIC.host != HostKind.DEFINES, reason=f"needs a vLLM that defines {TARGET} (<= 0.30); here: {STATIC.host}"
)
needs_thinker = pytest.mark.skipif(
    not STATIC.importers, reason=f"needs a vllm-omni whose {THINKER_FILE} imports {bridge.NAME} (0.30.0)")

# In a fresh interpreter: the thinker module's import (``module``; from its file under VLLM_COMPAT_DISABLE=1, where
# ``import vllm_omni`` itself dies earlier on RoutedExpertsLists), then its own vLLM processor import statement, read
# from its source and run as it is (``statement``): the line the module reaches once its other imports work.
THINKER_RUN = f"""
import ast, importlib, importlib.util, json, os, sys
import vllm_compat
DISABLED = os.environ.get("VLLM_COMPAT_DISABLE") == "1"
if not DISABLED:
    vllm_compat.apply()  # every bridge on, so `import vllm_omni` works (the startup hook does it too)

def outcome(run):
    try:
        run()
    except Exception as exc:
        return f"{{type(exc).__name__}}: {{exc}}"
    return "IMPORTED"

path = os.path.join(os.path.dirname(importlib.util.find_spec("vllm_omni").origin), {THINKER_FILE[len("vllm_omni/"):]!r})

def from_file():
    spec = importlib.util.spec_from_file_location({THINKER!r}, path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))

tree = ast.parse(open(path).read())
statement = next(node for node in tree.body if isinstance(node, ast.ImportFrom) and node.module == {PROCESSOR!r})
out = dict(
    module=outcome(from_file if DISABLED else lambda: importlib.import_module({THINKER!r})),
    statement=outcome(lambda: exec(compile(ast.Module([statement], []), path, "exec"), {{}})),
)
"""


def run_thinker(extra: str = "", env: dict | None = None) -> dict:
    result = run_python(THINKER_RUN + extra + '\nprint("RESULT", json.dumps(out))\n', env=env, timeout=900, warm=True)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT ", 1)[1])


@pytest.mark.parametrize(("facts", "action"), cases.DECISION_CASES, ids=cases.DECISION_IDS)
def test_decision_table(facts, action):
    cases.check_decision(bridge.DRIFT_POINT, facts, action)


@needs_vllm
def test_static_and_runtime_facts_agree():
    cases.check_static_and_runtime_agree(bridge.DRIFT_POINT, STATIC)


def test_fields_are_vllm_0_30_s():
    """The stand-in's fields (names, order, annotation names, no defaults) are those of vLLM 0.30's class, read from
    the 0.30.0 wheel when the check's wheel cache has it, else as recorded."""
    expected = (("kwargs", "MultiModalKwargsOptionalItems"), ("hashes", "MultiModalHashes"),
                ("prompt_updates", "MultiModalPromptUpdates"))
    wheels = glob.glob(os.path.join(os.environ.get("VLLM_COMPAT_WHEEL_CACHE", "/nonexistent"), "vllm-0.30.0-*.whl"))
    if wheels:
        with zipfile.ZipFile(wheels[0]) as wheel:
            source = wheel.read(PROCESSOR.replace(".", "/") + ".py").decode()
        node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == bridge.NAME)
        expected = tuple((s.target.id, ast.unparse(s.annotation)) for s in node.body if isinstance(s, ast.AnnAssign))
        assert not any(s.value for s in node.body if isinstance(s, ast.AnnAssign))  # no defaults
    assert bridge.FIELDS == expected
    standalone = bridge.build_stand_in(None)  # no vLLM module: every annotation is Any
    assert standalone._fields == tuple(f for f, _ in expected) and standalone._field_defaults == {}
    assert standalone(kwargs=1, hashes=2, prompt_updates=3) == (1, 2, 3)


@needs_missing_name
def test_stand_in_annotations_come_from_the_installed_vllm_and_vllm_s_successor_rejects_the_old_call():
    """On vLLM 0.31+ the three annotation names still live in the processor module (the stand-in uses them); vLLM's
    MultiModalProcessingResult requires prompt_ids, so vllm-omni's three-keyword construction would raise on an
    alias; the stand-in's prompt_ids (what vLLM reads) raises AttributeError, never a default."""
    module = importlib.import_module(PROCESSOR)
    stand_in = bridge.build_stand_in(module)
    assert stand_in.__annotations__ == {f: getattr(module, a) for f, a in bridge.FIELDS}
    assert stand_in.__module__ == PROCESSOR and stand_in.__name__ == bridge.NAME
    with pytest.raises(TypeError, match="prompt_ids"):
        module.MultiModalProcessingResult(kwargs={}, hashes={}, prompt_updates={})
    value = stand_in(kwargs={}, hashes={}, prompt_updates={})
    with pytest.raises(AttributeError, match="has no prompt_ids.*not bridged"):
        value.prompt_ids  # noqa: B018


@needs_missing_name
def test_the_thinker_s_processing_is_not_bridged_and_fails_loudly():
    """What the docstring says, checked on the installed pair (vllm-omni read from its files, not imported): vLLM's
    ``apply`` calls ``_cached_apply_hf_processor(inputs, timing_ctx)`` and then ``_maybe_apply_prompt_updates(mm_items=,
    mm_res=)``; vllm-omni 0.30.0's override of the first opens with ``self.cache`` (an AttributeError: vLLM 0.31+'s
    processor sets no such attribute) and calls ``self._get_hf_mm_data`` (gone), its override of the second takes no
    ``mm_res`` (a TypeError). Neither can return a stand-in value to vLLM."""
    module = importlib.import_module(PROCESSOR)
    base = module.BaseMultiModalProcessor
    apply_source = inspect.getsource(base.apply)
    assert "self._cached_apply_hf_processor(inputs, timing_ctx)" in apply_source and "mm_res=mm_res" in apply_source
    assert "mm_res" in inspect.signature(base._maybe_apply_prompt_updates).parameters
    assert "self.cache =" not in inspect.getsource(base) and not hasattr(base, "cache")
    assert not hasattr(base, "_get_hf_mm_data")
    tree = ast.parse(installed_omni_tree().read(THINKER_FILE))
    processor = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.endswith("ThinkerMultiModalProcessor"))
    methods = {n.name: n for n in processor.body if isinstance(n, ast.FunctionDef)}
    first = methods["_cached_apply_hf_processor"].body[1]  # after the docstring
    assert ast.unparse(first) == "cache = self.cache"
    assert "self._get_hf_mm_data(" in ast.unparse(methods["_cached_apply_hf_processor"])
    # vllm-omni 0.30.0 / 0.28.0: (self, mm_items, prompt_ids, mm_kwargs, mm_prompt_updates); 0.26.0 adds
    # is_update_applied. vLLM calls it with mm_res=, which none of them takes (no **kwargs either): a TypeError.
    prompt_updates = methods["_maybe_apply_prompt_updates"].args
    assert [a.arg for a in prompt_updates.args][:5] == ["self", "mm_items", "prompt_ids", "mm_kwargs",
                                                         "mm_prompt_updates"]
    assert "mm_res" not in [a.arg for a in prompt_updates.args + prompt_updates.kwonlyargs] and not prompt_updates.kwarg


@needs_missing_name
@pytest.mark.parametrize(
    "env", [{"VLLM_COMPAT_DISABLE": "1"}, {"VLLM_COMPAT_DISABLE_PATCHES": bridge.DRIFT_POINT.entry.id}],
    ids=["disabled", "entry-disabled"],
)
def test_unpatched_thinker_fails_with_the_real_import_error(env):
    """Without the stand-in, the thinker's vLLM processor import raises the real ImportError; the module import
    itself stops there, or earlier where the native pair stops too (torchvision, absent here)."""
    out = run_thinker(env=env)
    assert out["statement"].startswith(IMPORT_ERROR), out
    assert out["module"].startswith(IMPORT_ERROR) or out["module"] == NATIVE_OUTCOME != "IMPORTED", out


@needs_missing_name
@needs_startup_hook
def test_thinker_gets_as_far_as_the_native_pair_with_the_stand_in_and_revert_removes_it():
    """The fixed run: the thinker's processor import works, the module import reaches what vllm-omni 0.30.0 on vLLM
    0.30 reaches (``NATIVE_OUTCOME``, never an error naming the removed name), the name is ours, and revert() takes out
    exactly it from the processor module and apply() puts it back."""
    out = run_thinker(f"""
processor = sys.modules[{PROCESSOR!r}]
info = processor.{bridge.NAME}
out["mark"] = info._vllm_compat_installed
out["fields"] = list(info._fields)
out["decision"] = [d.action for d in vllm_compat.current_decisions() if d.name == {bridge.DRIFT_POINT.entry.id!r}]
before = set(vars(processor))
vllm_compat.revert()
out["removed"] = sorted(before - set(vars(processor)))
out["added"] = sorted(set(vars(processor)) - before)
vllm_compat.apply()
out["back"] = getattr(processor, {bridge.NAME!r}, None) is info
""")
    assert out == {
        "module": NATIVE_OUTCOME, "statement": "IMPORTED", "mark": bridge.DRIFT_POINT.entry.id,
        "fields": ["kwargs", "hashes", "prompt_updates"], "decision": ["patched"],
        "removed": [bridge.NAME], "added": [], "back": True,
    }


@needs_missing_name
def test_install_is_idempotent_and_uninstall_removes_exactly_ours():
    cases.check_install_uninstall_exact(bridge.DRIFT_POINT, STATIC, importlib.import_module(PROCESSOR))


@needs_vllm_defining_it
def test_stays_out_where_vllm_defines_it_and_matches_vllm_s_own():
    """vLLM <= 0.30: its own class is left in place, and the stand-in built on that module is the same NamedTuple
    (fields, annotations, no defaults)."""
    module = importlib.import_module(PROCESSOR)
    own = cases.check_stays_out_where_vllm_defines_it(bridge.DRIFT_POINT, module)
    stand_in = bridge.build_stand_in(module)
    assert (stand_in._fields, stand_in.__annotations__, stand_in._field_defaults) == (
        own._fields, own.__annotations__, own._field_defaults)


@needs_vllm_defining_it
@needs_thinker
def test_native_pair_gets_as_far_as_the_bridged_one():
    """vllm-omni 0.30.0 on vLLM 0.30, nothing bridged: the thinker's processor import works and the module import
    reaches ``NATIVE_OUTCOME``, the outcome the bridged import on vLLM 0.31+ is held to."""
    out = run_thinker()
    if out["module"] != NATIVE_OUTCOME and out["module"].startswith(
            ("ModuleNotFoundError: No module named 'vllm.", "ImportError: cannot import name")):
        # vLLM 0.24-0.28: vllm-omni 0.30.0 needs names these never had (issue 10, blocked), before the thinker.
        pytest.skip(f"this vLLM lacks a name vllm-omni 0.30.0 imports before the thinker's: {out['module']}")
    assert out == {"module": NATIVE_OUTCOME, "statement": "IMPORTED"}
