"""``--require offline,diffusion``: a gate on the entrypoints an environment is for (doctor and check).

A diffusion worker image never runs the HTTP server, and an env built on CPU torch cannot start it (vllm-omni's
server imports torchvision / torchaudio): its health check asks only whether the entrypoints it serves start.
``required_entrypoints`` parses the flag's value (argparse ``type=``: an unknown id is a usage error, exit 2,
naming the known ids); ``gate`` judges a ``reporting.Report`` against it and returns the exit code with one line
for stderr. Without ``--require`` nothing here runs and the verdict's exit code stands.

"Starts" is what the verdict counts as starting: ``works`` or ``works_with_vllm_compat``. ``fails_on_request``
(it starts, and every request of an endpoint fails) does not pass; ``absent`` (this vllm-omni release ships none
of the entrypoint's modules) does not either, and the line says so. When vLLM or vllm-omni is not installed, or
``import vllm_omni`` itself fails, no required entrypoint starts. Beyond the entrypoints, what the verdict fails
for any entrypoint (a failed runtime check, static and runtime detection disagreeing, a refused target) still
gives 1: none of them says which entrypoint is safe.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from .entrypoints import entrypoints_of

PLUGIN = "vllm_omni"
# other names users reach for: `vllm serve` is "the server"; a diffusion worker image runs the diffusion stage
ALIASES = {"server": "serve", "diffusion": "diffusion_stage", "llm": "llm_stage", "ar": "llm_stage"}


def known_ids() -> tuple[str, ...]:
    """The entrypoint ids ``--require`` accepts: the entrypoints and their parts (the LLM / AR stages, which a
    multi-stage model's offline API and server run)."""
    return tuple(e.id for e in entrypoints_of(PLUGIN))


def required_entrypoints(value: str) -> tuple[str, ...]:
    """``"offline,diffusion"`` -> ``("offline", "diffusion_stage")``: ids in the order given, aliases resolved,
    repeats dropped. Raises ``argparse.ArgumentTypeError`` (argparse's exit 2) for an empty list or an unknown
    id, naming the known ids and aliases."""
    known = known_ids()
    spelled = ", ".join(known) + " (aliases: " + ", ".join(f"{a} = {t}" for a, t in ALIASES.items()) + ")"
    names = [n.strip() for n in value.split(",")]
    if not any(names):
        raise argparse.ArgumentTypeError(f"name at least one entrypoint, comma-separated, out of {spelled}.")
    found: list[str] = []
    for name in names:
        if not name:
            continue
        resolved = ALIASES.get(name.lower(), name.lower())
        if resolved not in known:
            raise argparse.ArgumentTypeError(f"{name!r} is not an entrypoint id; the known ones are {spelled}.")
        if resolved not in found:
            found.append(resolved)
    return tuple(found)


@dataclass(frozen=True)
class Gate:
    """The answer to ``--require``: per required id (in the order given) whether it starts and the words for it;
    ``blockers``: what fails every entrypoint beyond their statuses; ``exit_code`` 0 or 1."""

    required: tuple[str, ...]
    starts: dict[str, bool]
    said: dict[str, str]
    blockers: tuple[str, ...]

    @property
    def exit_code(self) -> int:
        return 0 if all(self.starts.values()) and not self.blockers else 1

    def line(self, command: str) -> str:
        """One line for stderr: ``vllm-compat doctor --require diffusion_stage: diffusion_stage starts with
        vllm_compat; exit 0``."""
        parts = [f"{i} {self.said[i]}" for i in self.required] + list(self.blockers)
        return f"vllm-compat {command} --require {','.join(self.required)}: {'; '.join(parts)}; exit {self.exit_code}"

    def to_dict(self) -> dict:
        return {"entrypoints": {i: {"starts": self.starts[i], "said": self.said[i]} for i in self.required},
                "blockers": list(self.blockers), "exit_code": self.exit_code}


def gate(report, required: tuple[str, ...]) -> Gate:
    """Judge ``report`` (``reporting.Report``: doctor's or check's) against the ``required`` entrypoint ids; see the
    module docstring for what passes."""
    from .reporting import _why_stopped

    drift = report.import_drift
    starts, said = {}, {}
    if drift is None:
        versions = report.environment.versions
        lacking = [name for name in ("vllm", "vllm-omni") if not versions.get(name)] or ["vllm or vllm-omni"]
        for i in required:
            starts[i], said[i] = False, f"does not start ({' and '.join(lacking)} not installed)"
    elif not drift.import_ok:
        for i in required:
            starts[i], said[i] = False, (f"does not start (`import vllm_omni` fails: "
                                         f"{', '.join(drift.still_blocking_names)} missing)")
    else:
        statuses = {st.id: st for st in drift.all_statuses}
        for i in required:
            st = statuses.get(i)
            if st is None or st.status == "absent":
                starts[i], said[i] = False, "does not start (not in this vllm-omni release)"
            elif st.status == "works":
                starts[i], said[i] = True, "starts"
            elif st.status == "works_with_vllm_compat":
                starts[i], said[i] = True, "starts with vllm_compat"
            elif st.status == "left_out":
                starts[i], said[i] = False, f"LEFT OUT ({_why_stopped(st)})"
            elif st.status == "fails_on_request":
                starts[i], said[i] = False, f"starts but FAILS ON REQUEST ({', '.join(st.endpoints_failing)})"
            else:
                starts[i], said[i] = False, f"WILL NOT START ({_why_stopped(st)})"
    blockers = []
    if report.runtime_error:
        blockers.append("the runtime check failed (see the report)")
    if report.mismatches:
        blockers.append("static and runtime detection disagree (see the report)")
    refused = [d.name for d in report.patches if d.action == "refused"]
    if refused:
        blockers.append(f"refused target(s) left unpatched: {', '.join(refused)}")
    return Gate(tuple(required), starts, said, tuple(blockers))
