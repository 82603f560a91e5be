"""Stand-in for vllm-omni's ``ARDiffusionRequestAdapter.num_in_flight_tokens``, read by vLLM 0.26+'s KV cache manager.

Why: vLLM 0.26 added ``Request.num_in_flight_tokens`` (the tokens of steps whose output is not processed yet, which
async scheduling and pipeline parallelism count in ``num_computed_tokens`` ahead of the GPU), and
``KVCacheManager.allocate_slots`` frees out-of-window blocks only below ``total_computed_tokens -
request.num_in_flight_tokens`` (vLLM 0.24 / 0.25 passed ``total_computed_tokens``; read in the 0.24.0-0.34.0 wheels,
0.30+ also reads it in ``finalize_partial_tail_offloads``, a scheduler path for KV producers). vllm-omni 0.24.0's
``ARDiffusionRequestAdapter`` stands in for a ``Request`` when its ``ARDiffusionKVCache`` drives vLLM's
``KVCacheManager`` and does not define it, so every chunk allocation dies on vLLM 0.26+ with ``AttributeError:
'ARDiffusionRequestAdapter' object has no attribute 'num_in_flight_tokens'`` (23 of vllm-omni 0.24.0's own tests
under ``tests/ar_diffusion`` on vLLM 0.30, 0.33 and 0.34 once ``kv_cache_tensor_shared_by`` builds the manager).
When: a file of vLLM's KV cache code (``vllm/v1/core``, the scheduler aside) reads ``.num_in_flight_tokens`` and the
installed vllm-omni's adapter class neither defines nor assigns it (both read from the files with ``ast``): the class
gets a read-only class attribute that reads 0. vLLM <= 0.25 does not read it; vllm-omni 0.26.0+ sets it to 0 itself.
Serves: vllm-omni 0.24.0's AR-diffusion KV cache on vLLM 0.26+ (read from the wheels; measured on 0.30, 0.33, 0.34).
Retire when: the oldest supported vllm-omni's ``ARDiffusionRequestAdapter`` defines ``num_in_flight_tokens``.

Why 0 is exact, not a guess: vLLM's ``Request`` starts it at 0, its scheduler adds a step's scheduled tokens when it
advances ``num_computed_tokens`` optimistically (``_update_after_schedule``) and takes them off when that step's
output is processed (``update_from_output``): it is the part of ``num_computed_tokens`` not yet backed by a finished
step. The adapter's ``num_computed_tokens`` is a read-only property (prefill + committed chunks x chunk size) that
advances only in ``on_chunk_committed``, which vllm-omni calls after the chunk's K/V is written
(``ARDiffusionKVCache.commit_chunk``, ``ARDiffusionKVState.commit_paged_context`` after a successful forward); the
adapter is handed to ``KVCacheManager`` only, never to a scheduler. So no token it counts is in flight at any read:
0 by vLLM's own definition, and ``allocate_slots`` frees below ``total_computed_tokens``, as vLLM 0.24 did (the same
block tables, measured against the native pair). vllm-omni 0.26.0 sets the same 0 with the same reasoning.
``prepare`` checks that premise (``num_computed_tokens`` a property without a setter) and refuses otherwise. A write
(nothing on this path writes it) would land on the instance, as over a plain class attribute.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ..errors import PatchRefusedError
from ._class_stand_in import ClassAttributeStandIn

CLASS_NAME, NAME = "ARDiffusionRequestAdapter", "num_in_flight_tokens"  # the catalogue row's target
ADAPTER_FILE = "vllm_omni/experimental/ar_diffusion/kv_cache/manager.py"
VLLM_KV_CACHE = "vllm/v1/core"  # the KV cache manager, its coordinator and single-type managers
VLLM_SCHEDULER = "vllm/v1/core/sched/"  # never handed the adapter: its reads are not this drift's
COUNT = "num_computed_tokens"  # the adapter's count whose optimism num_in_flight_tokens would undo


class Kind:
    ABSENT = "absent"  # vLLM's KV cache code / vllm-omni's adapter class not installed
    READS = "reads"  # vLLM's KV cache code reads .num_in_flight_tokens (0.26+)
    FITS = "fits"  # it does not (<= 0.25) / vllm-omni's adapter defines it (0.26.0+)
    LACKS = "lacks"  # vllm-omni's adapter does not define it (0.24.0)


@dataclass(frozen=True)
class InFlightTokensFacts:
    vllm: str
    omni: str
    readers: tuple[str, ...] = ()  # vLLM's KV cache files that read .num_in_flight_tokens

    def to_dict(self) -> dict:
        return asdict(self)


def reads_it(source: str | None) -> bool:
    """Whether ``source`` reads ``<something>.num_in_flight_tokens`` (a parameter of that name is not a read)."""
    return source is not None and any(isinstance(n, ast.Attribute) and n.attr == NAME and isinstance(n.ctx, ast.Load)
                                      for n in ast.walk(parse_source(source)))


def adapter_defines_it(source: str | None) -> str:
    """Whether the adapter class in ``source`` defines ``num_in_flight_tokens``: a class-level name (assignment,
    annotation, def / property) or an assignment ``self.num_in_flight_tokens = ...`` in any of its methods."""
    if source is None:
        return Kind.ABSENT
    cls = next((n for n in parse_source(source).body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME), None)
    if cls is None:
        return Kind.ABSENT
    for node in cls.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if getattr(node, "name", None) == NAME or any(getattr(t, "id", None) == NAME for t in targets):
            return Kind.FITS
    stores = (n for n in ast.walk(cls) if isinstance(n, ast.Attribute) and n.attr == NAME
              and isinstance(n.ctx, ast.Store))
    return Kind.FITS if any(stores) else Kind.LACKS


def facts_of(vllm_tree, omni_tree) -> InFlightTokensFacts:
    files = [p for p in vllm_tree.walk_py(VLLM_KV_CACHE) if not p.startswith(VLLM_SCHEDULER)]
    readers = tuple(p for p in files if reads_it(vllm_tree.read(p)))
    vllm = Kind.ABSENT if not files else Kind.READS if readers else Kind.FITS
    return InFlightTokensFacts(vllm, adapter_defines_it(omni_tree.read(ADAPTER_FILE)), readers)


class NoTokensInFlight:
    """vLLM 0.26+'s ``Request.num_in_flight_tokens`` on vllm-omni's ``ARDiffusionRequestAdapter``: always 0, since
    the adapter counts a chunk only once it is committed (vllm_compat's stand-in,
    ``vllm_compat.bridges.ar_diffusion_in_flight_tokens``). A non-data descriptor: a write lands on the instance."""

    def __get__(self, adapter, owner=None):
        return self if adapter is None else 0


STAND_IN = NoTokensInFlight()  # one object, so a revert and a second apply put back the same one


class ARDiffusionInFlightTokens(ClassAttributeStandIn):
    class_name, name, stand_in = CLASS_NAME, NAME, STAND_IN
    handles_drift = (("attribute", f"*.{NAME}", f"*.{CLASS_NAME}", NAME),)

    def detect_static(self, site) -> InFlightTokensFacts:
        return facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> InFlightTokensFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def decide(self, facts: InFlightTokensFacts, controls=None):
        if facts.vllm == Kind.ABSENT:
            return self.decision(Action.PENDING, "vLLM's KV cache code is not installed; decided when vllm-omni's "
                                 "AR-diffusion KV cache is imported")
        if facts.omni == Kind.ABSENT:
            return self.decision(Action.SKIPPED, f"no installed vllm-omni defines {CLASS_NAME}")
        if facts.omni == Kind.FITS:
            return self.decision(Action.SKIPPED, f"vllm-omni's {CLASS_NAME} defines {NAME}")
        if facts.vllm == Kind.FITS:
            return self.decision(Action.SKIPPED, f"vLLM's KV cache code does not read {NAME} (<= 0.25)")
        return self.decision(Action.PATCHED, f"vLLM's KV cache code reads request.{NAME} (0.26+: "
                             f"{', '.join(facts.readers)}) and vllm-omni's {CLASS_NAME} lacks it; it reads 0, as the "
                             "adapter counts a chunk only once committed")

    def prepare(self, owner, facts):
        """The premise of 0: the adapter's ``num_computed_tokens`` is a property without a setter (advanced by the
        adapter alone, on commit), and no base class already gives ``num_in_flight_tokens``."""
        count = inspect.getattr_static(owner, COUNT, None)
        inherited = next((base for base in owner.__mro__[1:] if NAME in vars(base)), None)
        problems = []
        if not isinstance(count, property) or count.fset is not None:
            problems.append(f"{owner.__qualname__}.{COUNT} is {count!r}, not a read-only property (a count a caller "
                            "could advance ahead of the GPU, for which 0 in flight would not be exact)")
        if inherited is not None:
            problems.append(f"{owner.__qualname__} inherits {NAME} from {inherited.__qualname__}")
        if problems:
            raise PatchRefusedError(f"{self.target_path} cannot be stood in: {'; '.join(problems)}. Left as it is; "
                                    f"set VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, or upgrade "
                                    "vllm_compat.")
        return None


DRIFT_POINT = ARDiffusionInFlightTokens()
