"""Stand-in for ``OmniRequestOutput.ec_transfer_params`` (vllm-omni's output), which vLLM 0.26+'s completion serving reads.

Why: vLLM 0.26 added encoder-cache transfer (``RequestOutput.ec_transfer_params``), and its
``OpenAIServingCompletion`` puts ``final_res_batch[0].ec_transfer_params`` into every non-streaming completion
response. In ``vllm serve --omni`` those results are vllm-omni's ``OmniRequestOutput`` objects; 0.24.0 and 0.26.0
define ``kv_transfer_params`` (read through to the wrapped ``RequestOutput``) but not ``ec_transfer_params``, so every
non-streaming ``/v1/completions`` request of a server with an LLM stage fails with ``AttributeError:
'OmniRequestOutput' object has no attribute 'ec_transfer_params'`` (found on CPU through vLLM 0.34's completion
serving; read in the 0.26.0-0.34 wheels, 0.25.1 does not read it), vllm-omni 0.26.0 on its own vLLM 0.26 too.
vllm-omni 0.28.0 defines it.
When: vLLM's completion serving reads ``.ec_transfer_params`` and the installed vllm-omni's ``OmniRequestOutput``
does not define it (both read from the files with ``ast``): the class gets a read-only descriptor that reads it
through to the wrapped ``RequestOutput``, as vllm-omni 0.24.0 reads ``kv_transfer_params`` (None without one). A
vllm-omni that defines it keeps its own.
Serves: vllm-omni 0.24.0 / 0.26.0 on vLLM 0.26+ (read from the wheels; checked on CPU through vLLM's completion
serving in the pinned-torch serve cells).
Retire when: the oldest supported vllm-omni's ``OmniRequestOutput`` defines ``ec_transfer_params`` (0.28.0 does).
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass

from ..decide import Action
from ..detect.source_tree import parse_source
from ._class_stand_in import ClassAttributeStandIn

SERVING_FILE = "vllm/entrypoints/openai/completion/serving.py"
OUTPUT_FILES = ("vllm_omni/outputs.py", "vllm_omni/outputs/__init__.py")  # 0.24.0 / 0.26.0+
CLASS_NAME, NAME = "OmniRequestOutput", "ec_transfer_params"


class Kind:
    ABSENT = "absent"  # vLLM's completion serving or vllm-omni's output class not installed
    READS = "reads"  # vLLM's completion serving reads .ec_transfer_params (0.26+)
    FITS = "fits"  # it does not (<= 0.25) / vllm-omni's class defines it (0.28.0+)
    LACKS = "lacks"  # vllm-omni's class does not define it (0.24.0, 0.26.0)


@dataclass(frozen=True)
class EcTransferFacts:
    vllm: str
    omni: str

    def to_dict(self) -> dict:
        return asdict(self)


def vllm_reads_it(source: str | None) -> str:
    if source is None:
        return Kind.ABSENT
    return Kind.READS if any(isinstance(n, ast.Attribute) and n.attr == NAME and isinstance(n.ctx, ast.Load)
                             for n in ast.walk(parse_source(source))) else Kind.FITS


def omni_defines_it(source: str | None) -> str:
    """Whether ``OmniRequestOutput`` in ``source`` defines ``ec_transfer_params`` (a field, an assignment or a def)."""
    if source is None:
        return Kind.ABSENT
    cls = next((n for n in parse_source(source).body if isinstance(n, ast.ClassDef) and n.name == CLASS_NAME), None)
    if cls is None:
        return Kind.ABSENT
    for node in cls.body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if getattr(node, "name", None) == NAME or any(getattr(t, "id", None) == NAME for t in targets):
            return Kind.FITS
    return Kind.LACKS


def facts_of(vllm_tree, omni_tree) -> EcTransferFacts:
    source = next((text for path in OUTPUT_FILES if (text := omni_tree.read(path)) is not None), None)
    return EcTransferFacts(vllm_reads_it(vllm_tree.read(SERVING_FILE)), omni_defines_it(source))


class EcTransferParams:
    """vLLM 0.26+'s ``ec_transfer_params`` on vllm-omni's ``OmniRequestOutput``: the wrapped ``RequestOutput``'s, or
    None (vllm_compat's stand-in, ``vllm_compat.bridges.omni_output_ec_transfer_params``)."""

    def __get__(self, output, owner=None):
        if output is None:
            return self
        return getattr(getattr(output, "request_output", None), NAME, None)


STAND_IN = EcTransferParams()  # one object, so a revert and a second apply put back the same one


class OmniOutputEcTransferParams(ClassAttributeStandIn):
    handles_drift = (("attribute", "*.ec_transfer_params", "*.OmniRequestOutput", "ec_transfer_params"),)
    class_name, name, stand_in = CLASS_NAME, NAME, STAND_IN

    def detect_static(self, site) -> EcTransferFacts:
        return facts_of(site.vllm_tree, site.omni_tree)

    def detect_runtime(self, module) -> EcTransferFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"))

    def decide(self, facts: EcTransferFacts, controls=None):
        if facts.omni in (Kind.ABSENT, Kind.FITS):
            return self.decision(Action.SKIPPED, f"vllm-omni's {CLASS_NAME} defines {NAME}" if facts.omni == Kind.FITS
                                 else f"no installed vllm-omni defines {CLASS_NAME}")
        if facts.vllm != Kind.READS:
            return self.decision(Action.SKIPPED, f"vLLM's completion serving does not read {NAME} (<= 0.25)")
        return self.decision(Action.PATCHED, f"vLLM's completion serving reads {NAME} (0.26+) and vllm-omni's "
                             f"{CLASS_NAME} lacks it; it reads the wrapped RequestOutput's, as kv_transfer_params does")


DRIFT_POINT = OmniOutputEcTransferParams()
