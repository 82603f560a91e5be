"""What the runner-default stand-ins share (``runner_xdrope_removed``, ``runner_routed_experts_removed``): a value
vLLM's ``GPUModelRunner.__init__`` used to assign and no longer does, which vllm-omni's runners still read.

vllm-omni's ``OmniGPUModelRunner`` (``vllm_omni/worker/gpu_model_runner.py``; its AR and generation runners derive
it) reads ``self.<name>`` as vLLM's ``__init__`` left it. Where the installed vLLM's runner no longer assigns or
defines the name anywhere on the class walk (read from the files with ``CodeModel``: ``GPUModelRunner`` and its
mixins) and a vllm-omni runner reads it, ``OmniGPUModelRunner`` gets a class-level default: the value vLLM's last
``__init__`` that had it gave a model without the feature. A non-data descriptor, so a value set on the instance
wins, as over a plain class attribute. A subclass names the attribute (``name``), the default (``default``), the
vLLM release that dropped it (``removed_in``) and the words of its decision (``patched_reason``, ``leaves_out``).
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import asdict, dataclass

from ..decide import Action
from ..errors import PatchRefusedError
from ._class_stand_in import ClassAttributeStandIn

OMNI_MODULE, CLASS_NAME = "vllm_omni.worker.gpu_model_runner", "OmniGPUModelRunner"
OMNI_RUNNERS = "vllm_omni/worker"  # the files of vllm-omni's GPU runners, read for readers
VLLM_RUNNER = "vllm/v1/worker/gpu_model_runner.py"  # vLLM's V1 runner (0.34 removed it)
TRIVIAL_BASES = ("object", "ABC", "abc.ABC", "Generic", "typing.Generic")


class Kind:
    ABSENT = "absent"  # vLLM or vllm-omni's OmniGPUModelRunner not installed
    NO_V1_RUNNER = "no-v1-runner"  # vLLM has no V1 gpu_model_runner.py (0.34)
    UNREAD = "unread"  # a base on the runner's walk the files cannot follow
    VLLM_ASSIGNS = "vllm-assigns"  # a vLLM class on the walk assigns or defines it: vLLM's own value is used
    OMNI_DEFINES = "omni-defines"  # OmniGPUModelRunner (or a vllm-omni base of it) defines it
    NOT_READ = "not-read"  # no vllm-omni runner reads self.<name>
    LACKS = "lacks"  # none assigns it and vllm-omni's runners read it: the default goes in


@dataclass(frozen=True)
class RunnerDefaultFacts:
    shape: str
    readers: tuple[str, ...] = ()  # vllm-omni's "Class.method"s reading self.<name>
    unread: tuple[str, ...] = ()  # the bases the files cannot follow (UNREAD)

    def to_dict(self) -> dict:
        return asdict(self)


def reads_self(function, name: str) -> bool:
    """Whether ``function`` reads ``self.<name>`` (``getattr(self, name, default)`` is not a read: it has a default)."""
    return any(isinstance(n, ast.Attribute) and n.attr == name and isinstance(n.ctx, ast.Load)
               and isinstance(n.value, ast.Name) and n.value.id == "self" for n in ast.walk(function))


def runner_classes(model, runner):
    """The vllm-omni classes under ``vllm_omni/worker`` whose walk holds ``runner`` (itself included)."""
    from ..detect.code_model import Definition
    from ..detect.definitions import module_of

    found = {}
    tree = model.trees["plugin"]
    for relpath in tree.walk_py(OMNI_RUNNERS):
        module = module_of(relpath)
        syntax = model.module_ast(module)
        for node in syntax.body if syntax is not None else ():
            if isinstance(node, ast.ClassDef):
                cls = Definition("plugin", module, node.name, node)
                if any(isinstance(c, Definition) and c.path == runner.path for c in model.mro(cls)):
                    found[cls.path] = cls
    return list(found.values())


def facts_of(vllm_tree, omni_tree, name: str) -> RunnerDefaultFacts:
    from ..detect.code_model import CodeModel, Definition

    if not (vllm_tree.has_package("vllm") and omni_tree.has_package("vllm_omni")):
        return RunnerDefaultFacts(Kind.ABSENT)
    model = CodeModel(omni_tree, vllm_tree)
    runner = model.resolve(OMNI_MODULE, CLASS_NAME)
    if not isinstance(runner, Definition) or not runner.is_class:
        return RunnerDefaultFacts(Kind.ABSENT)
    if vllm_tree.read(VLLM_RUNNER) is None:
        return RunnerDefaultFacts(Kind.NO_V1_RUNNER)
    walk = model.mro(runner)
    unread = tuple(c for c in walk if not isinstance(c, Definition) and c not in TRIVIAL_BASES)
    if unread:
        return RunnerDefaultFacts(Kind.UNREAD, unread=unread)
    if any(c.side == "host" and name in model.own_attributes(c) for c in walk):
        return RunnerDefaultFacts(Kind.VLLM_ASSIGNS)
    if any(c.side == "plugin" and name in model.own_attributes(c) for c in walk):
        return RunnerDefaultFacts(Kind.OMNI_DEFINES)
    readers = sorted({f"{c.name}.{method}" for cls in runner_classes(model, runner) for c in model.mro(cls)
                      if isinstance(c, Definition) and c.side == "plugin"
                      for method, node in model.methods(c).items() if reads_self(node, name)})
    return RunnerDefaultFacts(Kind.LACKS if readers else Kind.NOT_READ, tuple(readers))


class RunnerDefault:
    """A value vLLM's ``GPUModelRunner.__init__`` no longer assigns, as the last one that did gave it to a model
    without the feature (vllm_compat's stand-in, ``vllm_compat.bridges.runner_*_removed``). A non-data descriptor:
    a value set on the instance wins."""

    def __init__(self, value) -> None:
        self.value = value

    def __get__(self, runner, owner=None):
        return self if runner is None else self.value

    def __repr__(self) -> str:
        return f"RunnerDefault({self.value!r})"


class RunnerDefaultStandIn(ClassAttributeStandIn):
    class_name = CLASS_NAME
    removed_in: str  # the vLLM release whose GPUModelRunner stopped assigning it
    patched_reason: str  # what the default means, after "...; vllm-omni's runners read it (...): "
    leaves_out: str = ""  # the feature still missing where it acts, in users' words ("" where nothing is)

    def detect_static(self, site) -> RunnerDefaultFacts:
        return facts_of(site.vllm_tree, site.omni_tree, self.name)

    def detect_runtime(self, module) -> RunnerDefaultFacts:
        from ..detect.source_tree import tree_of

        return facts_of(tree_of("vllm"), tree_of("vllm_omni"), self.name)

    def decide(self, facts: RunnerDefaultFacts, controls=None):
        what = "vLLM's GPUModelRunner"
        if facts.shape == Kind.ABSENT:
            return self.decision(Action.PENDING, f"vLLM or vllm-omni's {CLASS_NAME} is not installed; decided when "
                                 "vllm-omni's runner is imported")
        if facts.shape == Kind.NO_V1_RUNNER:
            return self.decision(Action.SKIPPED, f"vLLM has no V1 GPUModelRunner ({VLLM_RUNNER} is absent, removed "
                                 "in 0.34): vllm-omni's runners do not run on this vLLM")
        if facts.shape == Kind.UNREAD:
            return self.refused(f"{CLASS_NAME}'s bases {', '.join(facts.unread)} cannot be read from the files, so "
                                f"whether they assign {self.name} is not known")
        if facts.shape == Kind.VLLM_ASSIGNS:
            return self.decision(Action.SKIPPED, f"{what} assigns {self.name} (as vLLM before {self.removed_in} does); "
                                 "its own value is used")
        if facts.shape == Kind.OMNI_DEFINES:
            return self.decision(Action.SKIPPED, f"vllm-omni's {CLASS_NAME} defines {self.name} itself")
        if facts.shape == Kind.NOT_READ:
            return self.decision(Action.SKIPPED, f"{what} no longer assigns {self.name}, but no installed vllm-omni "
                                 "runner reads it")
        from dataclasses import replace as with_fields

        decision = self.decision(Action.PATCHED, f"{what} no longer assigns {self.name} (dropped in vLLM "
                                 f"{self.removed_in}) and vllm-omni's runners read it ({', '.join(facts.readers)}): "
                                 f"{CLASS_NAME} gets {self.name} = {self.default!r}, {self.patched_reason}")
        return with_fields(decision, leaves_out=self.leaves_out, leaves_out_of="llm_stage" if self.leaves_out else "")

    @property
    def default(self):
        return inspect.getattr_static(self, "stand_in").value

    def prepare(self, owner, facts):
        """The contract on the imported class: nothing on its walk (vLLM's classes included) gives the name at
        class level; the files showed none assigning it."""
        inherited = next((base for base in owner.__mro__ if self.name in vars(base)
                          and not (base is owner and self.is_installed(owner))), None)
        if inherited is not None:
            raise PatchRefusedError(f"{inherited.__qualname__}.{self.name} exists ({vars(inherited)[self.name]!r}), "
                                    f"which the files did not show; {owner.__qualname__} is left as it is. Set "
                                    f"VLLM_COMPAT_DISABLE_PATCHES={self.id} to silence this, or upgrade vllm_compat.")
        return None
