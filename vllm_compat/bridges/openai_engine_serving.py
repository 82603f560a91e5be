"""Alias for the module ``vllm.entrypoints.openai.engine.serving`` (``OpenAIServing``, ``clamp_prompt_logprobs``), gone in vLLM 0.25.

Why: vLLM 0.25 moved the generation servings' base class out of ``vllm/entrypoints/openai/engine/serving.py`` into
``vllm/entrypoints/generate/base/serving.py`` and renamed it ``GenerateBaseServing``, leaving the body unchanged
(its normalized source, read as if it were still called ``OpenAIServing``, has 0.24's key), and moved
``clamp_prompt_logprobs`` beside it unchanged. vllm-omni 0.24.0's server subclasses ``OpenAIServing``
(``serving_speech``, ``serving_audio_generate``) and imports ``clamp_prompt_logprobs`` (``serving_chat``), so
``import vllm_omni.entrypoints.openai.api_server`` (``vllm serve --omni``) dies with ModuleNotFoundError on 0.25.
The alias table cannot say it: the class changed its name while its module went away.
When: ``vllm.entrypoints.openai.engine`` is imported without a ``serving`` submodule, an installed vllm-omni imports
it (read from its files), and vLLM's ``generate.base.serving`` holds both definitions with 0.24's source (the keys
below): then a module object holding vLLM's own two objects is registered under the old path. Anywhere else
(a vLLM that has the module, one whose definitions changed: 0.30+, or one without ``openai.engine``) it stays out,
saying why.
Serves: vllm-omni 0.24.0 on vLLM 0.25.1 (measured; 0.26-0.29 where the definitions still match; 0.30+ changed them).
Retire when: the oldest supported vllm-omni no longer imports ``vllm.entrypoints.openai.engine.serving``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..decide import Action
from . import HostKind
from ._module_stand_in import ModuleStandIn, Moved

OLD_MODULE = "vllm.entrypoints.openai.engine.serving"
NEW_MODULE = "vllm.entrypoints.generate.base.serving"
# old name -> (new name, the definition key of vLLM 0.24's old definition, read under the old name)
MOVED = {
    "OpenAIServing": ("GenerateBaseServing", "d642c3b9606e16c4"),
    "clamp_prompt_logprobs": ("clamp_prompt_logprobs", "7cc1571c314ddd19"),
}
IMPORTERS = ("vllm_omni/entrypoints/openai/serving_speech.py", "vllm_omni/entrypoints/openai/serving_audio_generate.py",
             "vllm_omni/entrypoints/openai/serving_chat.py")


@dataclass(frozen=True)
class AliasedModuleFacts:
    """``host`` / ``importers`` as every stand-in's, plus ``definitions``: for each old name, ``"same"`` where
    vLLM's new definition has the old source, else what was found (``"changed"``, ``"absent"``)."""

    host: str
    importers: tuple[str, ...] = ()
    definitions: tuple[tuple[str, str], ...] = ()

    @property
    def stand_in(self):
        from . import StandInFacts

        return StandInFacts(self.host, self.importers)

    def to_dict(self) -> dict:
        return asdict(self)


def definition_states(vllm_tree) -> tuple[tuple[str, str], ...]:
    """For each old name: whether vLLM's new definition (read from its files) is the old one renamed."""
    import hashlib

    from ..detect.definitions import Definitions, normalized_source

    defs = Definitions(vllm_tree)
    states = []
    for old, (new, key) in MOVED.items():
        hit = defs.find(NEW_MODULE, new)
        if hit is None:
            states.append((old, "absent"))
            continue
        found = hashlib.sha256(normalized_source(hit[2], rename=old).encode()).hexdigest()[:16]
        states.append((old, "same" if found == key else f"changed ({found})"))
    return tuple(states)


class OpenAIEngineServingAlias(ModuleStandIn):
    importers = IMPORTERS
    removed_in = "0.25"
    old_module = OLD_MODULE

    def members(self) -> dict:
        return {old: Moved(NEW_MODULE, name) for old, (name, _) in MOVED.items()}

    def _facts(self, base, vllm_tree) -> AliasedModuleFacts:
        states = definition_states(vllm_tree) if base.host == HostKind.LACKS else ()
        return AliasedModuleFacts(base.host, base.importers, states)

    def detect_static(self, site) -> AliasedModuleFacts:
        return self._facts(self.facts_from_files(site), site.vllm_tree)

    def detect_runtime(self, module) -> AliasedModuleFacts:
        from ..detect.source_tree import tree_of

        return self._facts(self.facts_from_module(module), tree_of("vllm"))

    def decide(self, facts: AliasedModuleFacts, controls=None):
        decision = super().decide(facts.stand_in)
        if decision.action != Action.PATCHED:
            return decision
        changed = [f"{name}: {state}" for name, state in facts.definitions if state != "same"]
        if changed:
            return self.refused(f"vLLM lacks {OLD_MODULE} and vllm-omni imports it, but {NEW_MODULE} no longer "
                                f"holds vLLM 0.24's definitions ({'; '.join(changed)})")
        return self.decision(Action.PATCHED, f"vLLM lacks {OLD_MODULE} (moved in 0.25), and vllm-omni imports it "
                             f"({', '.join(facts.importers)}); aliased to {NEW_MODULE}'s same definitions "
                             f"({', '.join(f'{o} = {n}' for o, (n, _) in MOVED.items())})", provides=(OLD_MODULE,))

    def prepare(self, owner, facts):
        return super().prepare(owner, facts.stand_in)

    def compare(self, static, runtime) -> list[str]:
        differences = super().compare(static.stand_in, runtime.stand_in)
        if static.definitions != runtime.definitions and HostKind.ABSENT not in (static.host, runtime.host):
            differences.append(f"{NEW_MODULE} definitions: {static.definitions} (files) != {runtime.definitions} "
                               "(imported)")
        return differences


DRIFT_POINT = OpenAIEngineServingAlias()


def facts_for_table(host: str, importers: tuple[str, ...], changed: bool = False) -> AliasedModuleFacts:
    """Facts for a decision-table row (tests): every definition the old one, or ``changed``."""
    state = "changed (0000000000000000)" if changed else "same"
    return AliasedModuleFacts(host, importers, tuple((name, state) for name in MOVED) if host == HostKind.LACKS else ())
