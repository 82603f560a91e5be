"""Stand-in for ``vllm.v1.core.kv_cache_utils.get_kv_cache_configs``, moved and split in two by vLLM 0.33.0.

Why: vLLM <= 0.32 has ``get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory) -> list[KVCacheConfig]``
in ``kv_cache_utils`` (merge the workers' specs, group the layers, auto-fit / check memory, one config per worker
with the smallest block count); vLLM 0.33's KV-cache planning rewrite moved it to ``vllm.v1.core.kv_cache_planning``
and cut the grouping out: ``get_global_kv_cache_groups(vllm_config, kv_cache_specs)`` groups (through a platform
``KVCacheConfigBuilder``, which asks ``model_config.supports_kv_cache_grouping`` whether the model groups its own
layers), and ``get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory, global_kv_cache_groups)`` plans.
vllm-omni 0.30.0 imports the old name at module level in ``vllm_omni/diffusion/diffusion_kv/initialization.py``,
which ``vllm_omni.diffusion.diffusion_engine`` imports, so on vLLM 0.33 that module, the diffusion engine, its stage
clients and process, and LingBot-World's modules (which reach it) die with ``ImportError`` (on the CPU test machine,
7 modules that import with vllm-omni 0.30.0's own vLLM, ``matrix/native/vllm-omni-0.30.0.json``).
When: ``kv_cache_utils`` lacks the name and an installed vllm-omni imports it (read from its files); installed only
where vllm-omni's calls pass the three old arguments and nothing else, and vLLM's two 0.33 functions and the grouping
question have the shapes below (otherwise refused). A vLLM that defines it (<= 0.32) keeps its own. The hook on
``kv_cache_utils`` (registered by the startup ``.pth``) puts it there before the importer runs.
Serves: vllm-omni 0.30.0's diffusion engine / paged diffusion KV setup on vLLM 0.33 (vLLM <= 0.32 keeps its own;
vllm-omni 0.24.0 does not import it).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.v1.core.kv_cache_utils.get_kv_cache_configs``.

The definition is the smallest that satisfies the caller: vllm-omni 0.30.0 calls it once, in
``build_native_kv_cache_configs`` (paged diffusion KV, ``diffusion_kv_mode=paged_scheduler``; the default dense mode
never calls it), as ``get_kv_cache_configs(vllm_config, worker_specs, available_memory)``, and hands the list to
vLLM's ``generate_scheduler_kv_cache_config`` and to its workers. The stand-in makes vLLM 0.33's own two calls (its
``EngineCore`` makes the same pair): ``get_global_kv_cache_groups``, then ``get_kv_cache_configs`` with those
groups, both looked up at each call (the planning module is imported then, never by the hook, which runs while
vLLM's KV modules are still loading). One difference is bridged: vLLM 0.32 had no model-declared grouping, and
vllm-omni's diffusion ``model_config`` (``_DiffusionVllmModelConfig``, not a vLLM ``ModelConfig``) has no
``supports_kv_cache_grouping``, so 0.33's default builder would raise ``AttributeError``; the grouping call gets a
view of ``vllm_config`` whose ``model_config`` answers ``False`` (vLLM's default grouping, what 0.32 always did) and
passes every other read and write through. The planning call gets the real ``vllm_config`` (auto-fit writes its
``max_model_len`` there, as 0.32 did). Measured (``tests/bridges/test_kv_cache_configs.py``): for full-attention,
hybrid sliding-window, two-rank, pipeline-stage, auto-fit, block-override, attention-free and too-little-memory
inputs, the stand-in on vLLM 0.33 returns field for field what vLLM 0.32's function returns (0.30's too, on the
fields 0.30 has) and raises the same error. Not reproduced: 0.33's EngineCore also calls
``adjust_dcp_kv_cache_interleave_size`` (NIXL with decode-context parallelism; never part of the old function), and a
platform with its own ``KVCacheConfigBuilder`` places tensors its way, as it does for vLLM 0.33's engine. ``revert()``
takes it off vLLM's module; a vllm-omni module that imported it already keeps its own reference, as with every
stand-in.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from ..detect.source_tree import parse_source
from ._name_stand_in import FunctionStandIn, FunctionStandInFacts, Shape

MODULE, NAME = "vllm.v1.core.kv_cache_utils", "get_kv_cache_configs"  # the catalogue row's target
# The vllm-omni file that imports it (0.30.0; 0.24.0 has no diffusion KV): read, never imported.
IMPORTERS = ("vllm_omni/diffusion/diffusion_kv/initialization.py",)
# vLLM 0.33's planning module, beside kv_cache_utils, and the shapes the stand-in relies on.
PLANNING_MODULE = "vllm.v1.core.kv_cache_planning"
PLANNING_FILE = PLANNING_MODULE.replace(".", "/") + ".py"
GROUPING, GROUPING_PARAMS = "get_global_kv_cache_groups", ("vllm_config", "kv_cache_specs")
PLANNER, PLANNER_PARAMS = NAME, ("vllm_config", "kv_cache_specs", "available_memory", "global_kv_cache_groups")
GROUPING_FLAG = "supports_kv_cache_grouping"  # read on vllm_config.model_config by 0.33's default builder
CALL_ARGS = ("vllm_config", "kv_cache_specs", "available_memory")  # the old function's, all required
KVCacheConfigsFacts = FunctionStandInFacts


class _PassThrough:
    """Reads and writes go to the wrapped object, except what the subclass defines itself."""

    __slots__ = ("_vllm_compat_target",)

    def __init__(self, target):
        object.__setattr__(self, "_vllm_compat_target", target)

    def __getattr__(self, name):
        return getattr(self._vllm_compat_target, name)

    def __setattr__(self, name, value):
        setattr(self._vllm_compat_target, name, value)


class _ModelConfigWithoutOwnGrouping(_PassThrough):
    __slots__ = ()
    supports_kv_cache_grouping = False  # vLLM <= 0.32 had no model-declared KV-cache grouping


class _ConfigForOldGrouping(_PassThrough):
    """``vllm_config`` for the grouping call: its ``model_config`` answers ``supports_kv_cache_grouping = False``."""

    __slots__ = ()

    @property
    def model_config(self):
        return _ModelConfigWithoutOwnGrouping(self._vllm_compat_target.model_config)


def get_kv_cache_configs(vllm_config, kv_cache_specs, available_memory):
    """vLLM <= 0.32's per-worker KV-cache configs (stand-in by vllm_compat): vLLM 0.33's
    ``get_global_kv_cache_groups`` (default grouping, as 0.32 always did) then its ``get_kv_cache_configs``."""
    planning = importlib.import_module(PLANNING_MODULE)
    groups = getattr(planning, GROUPING)(_ConfigForOldGrouping(vllm_config), kv_cache_specs)
    return getattr(planning, PLANNER)(vllm_config, kv_cache_specs, available_memory, groups)


# ---- shapes: vLLM's replacement (its files) and vllm-omni's calls (files) ----

def _replacement_from_source(source: str | None) -> tuple[str, str]:
    """(``Shape``, detail) of vLLM 0.33's planning module from its source: both functions at module level taking
    exactly the measured positional parameters, and the grouping flag read on a ``model_config``."""
    if source is None:
        return Shape.UNKNOWN, f"{PLANNING_FILE} is missing or unreadable, and {MODULE} has no {NAME}"
    tree = parse_source(source)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    problems = []
    for name, expected in ((GROUPING, GROUPING_PARAMS), (PLANNER, PLANNER_PARAMS)):
        func = functions.get(name)
        if func is None:
            problems.append(f"{PLANNING_MODULE} has no {name}")
            continue
        params = tuple(a.arg for a in func.args.posonlyargs + func.args.args)
        extra = func.args.vararg or func.args.kwarg or func.args.kwonlyargs or func.args.defaults
        if params != expected or extra:
            problems.append(f"{PLANNING_MODULE}.{name} takes {params}{' and more (or defaults)' if extra else ''}, "
                            f"not {expected}")
    flag_read = any(isinstance(n, ast.Attribute) and n.attr == GROUPING_FLAG and isinstance(n.value, ast.Attribute)
                    and n.value.attr == "model_config" for n in ast.walk(tree))
    if not flag_read:
        problems.append(f"{PLANNING_MODULE} does not read model_config.{GROUPING_FLAG}, the question the stand-in "
                        "answers for vllm-omni's diffusion model config")
    if problems:
        return Shape.UNKNOWN, "; ".join(problems)
    return Shape.KNOWN, ""


def _planning_source_beside(module) -> str | None:
    """The planning module's source, read from the directory of the imported ``kv_cache_utils`` (the file that an
    import of it will run): not imported here, the hook runs while vLLM's KV modules are still loading."""
    path = getattr(module, "__file__", None)
    if not path:
        return None
    try:
        return Path(path).with_name(Path(PLANNING_FILE).name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


# ---- the drift point ----

class KVCacheConfigsStandIn(FunctionStandIn):
    importers = IMPORTERS
    removed_in = "0.33"
    call_args = CALL_ARGS
    all_required = True
    built_on = f"{PLANNING_MODULE}.{GROUPING} + {PLANNER}"

    def build(self, owner):
        return get_kv_cache_configs

    def replacement_from_files(self, site) -> tuple[str, str]:
        return _replacement_from_source(site.vllm_tree.read(PLANNING_FILE))

    def replacement_from_module(self, module) -> tuple[str, str]:
        """From the planning module's file beside the imported ``kv_cache_utils`` (what an import of it runs)."""
        return _replacement_from_source(_planning_source_beside(module))


DRIFT_POINT = KVCacheConfigsStandIn()
