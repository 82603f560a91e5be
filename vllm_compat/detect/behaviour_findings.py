"""The records of behavioural drift (``behaviour_drift``): one ``Finding`` and the ``BehaviourDrift`` of a pair.

Apart from the scan so that reading them costs little: the warm doctor reads a pair's ``BehaviourDrift`` back from
the fact cache (``detect.fact_cache``), and unpickling it imports this module only, not the scan's readers
(``code_model``, ``import_graph``, ``host_index``: ~8 ms of imports). ``behaviour_drift`` re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

from ..entrypoints import endpoint_of

KINDS = ("call", "abstract", "override", "attribute", "unpack", "unread")


@dataclass(frozen=True)
class Finding:
    """One behavioural drift: ``kind`` (``KINDS``), the vLLM object (``vllm_object``), the vllm-omni site (``site``
    module, ``line``, ``plugin_object``), what no longer binds (``detail``) and the names it involves (parameters,
    methods, attributes); ``via``: the vLLM module that calls or reads, for ``override`` / ``attribute``;
    ``entrypoints``: the ids of the entrypoints whose modules reach it."""

    kind: str
    vllm_object: str
    plugin_object: str
    site: str
    line: int
    detail: str
    names: tuple[str, ...] = ()
    via: str | None = None
    entrypoints: tuple[str, ...] = ()
    # (entrypoint id, condition) of the entrypoints whose start or step runs the site (``call``, ``unpack``,
    # ``abstract``, an ``attribute`` vllm-omni reads): condition "" where it always does, else the ``if`` test it runs
    # under (a LoRA given at startup, an LLM stage)
    stops_in: tuple[tuple[str, str], ...] = ()
    signature: str = ""  # ``call``: the vLLM callable's parameters on the target
    condition: str = ""  # the ``if`` test the site runs under in its function ("" none)
    call_shape: str = ""  # ``call``: what vllm-omni passes, "<positionals>:<keywords>"
    readers: tuple[str, ...] = ()  # ``attribute``: the vllm-omni functions reading it ("" where vLLM's method reads)

    def effect(self, entrypoint_id: str) -> str:
        """What it does to an entrypoint it reaches: "stops" it (its start always runs the site), "stops_when" a
        condition holds (its start runs the site under an ``if``: a LoRA given at startup, an LLM stage), fails
        "request"s (vLLM calls or reads it serving one), or fails "when_used" (a feature whose code its start does
        not run)."""
        if entrypoint_id in dict(self.stops_in):
            return "stops_when" if self.stops_when(entrypoint_id) else "stops"
        return "request" if self.endpoint() is not None else "when_used"

    def stops_when(self, entrypoint_id: str) -> str:
        """The condition under which it stops ``entrypoint_id``'s start ("" always)."""
        return dict(self.stops_in).get(entrypoint_id, "")

    def endpoint(self) -> str | None:
        """The request endpoint vLLM serves through the module that calls or reads (``via``)."""
        return endpoint_of(self.via) if self.via and self.kind in ("override", "attribute") else None

    @property
    def key(self) -> str:
        """What compares one finding across vLLM releases: kind, vllm-omni object, the vLLM object's last two parts
        (its module moves between releases), the names involved and, for a call, the arguments vllm-omni passes (two
        calls of one function in one place differ there); lines left out."""
        return "|".join((self.kind, self.plugin_object, ".".join(self.vllm_object.rsplit(".", 2)[-2:]),
                         ",".join(self.names), self.call_shape))

    def matches(self, kind: str, vllm_object: str = "*", plugin_object: str = "*", name: str = "*") -> bool:
        """Whether this finding is of ``kind`` and its vLLM object, vllm-omni object and one of its names match the
        glob patterns (what a drift point says it handles: ``DriftPoint.handles_drift``)."""
        return kind == self.kind and fnmatchcase(self.vllm_object, vllm_object) \
            and fnmatchcase(self.plugin_object, plugin_object) and any(fnmatchcase(n, name) for n in self.names or ("",))

    def describe(self) -> str:
        return f"{self.vllm_object}: {self.detail} (in {self.site}:{self.line})"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "vllm_object": self.vllm_object, "plugin_object": self.plugin_object,
                "site": f"{self.site}:{self.line}", "detail": self.detail, "names": list(self.names),
                "via": self.via, "entrypoints": list(self.entrypoints), "stops": dict(self.stops_in),
                "signature": self.signature}


@dataclass(frozen=True)
class BehaviourDrift:
    """The scan of one pair: ``findings`` new on the target against ``baseline`` (the vLLM version compared
    against; None when no baseline could be read: every finding is reported), ``checked`` (call sites, classes and
    overrides read), ``undecidable`` (what the files cannot tell) and ``baseline_note`` (why there is none)."""

    findings: tuple[Finding, ...]
    checked: int
    undecidable: int
    baseline: str | None
    baseline_note: str = ""

    def to_dict(self) -> dict:
        return {"baseline": self.baseline, "baseline_note": self.baseline_note, "checked": self.checked,
                "undecidable": self.undecidable, "findings": [f.to_dict() for f in self.findings]}
