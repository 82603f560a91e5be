"""The user's controls, read from the environment each time a decision is made.

``VLLM_COMPAT_DISABLE=1``        nothing is patched; the report says "disabled".
``VLLM_COMPAT_STRICT=1``         a refused patch raises ``PatchRefusedError`` instead of logging a warning.
``VLLM_COMPAT_DISABLE_PATCHES``  comma-separated catalogue ids (``vllm-compat doctor`` lists them) left alone;
                                 an id the catalogue does not have is an error.

Every other ``VLLM_COMPAT_*`` variable is kept as it is (``Controls.switches``) for the drift point it belongs to,
which names it in ``DriftPoint.switches`` and validates it (``DriftPoint.check_controls``; the drift-point docs list
them). The variables of vllm_compat's own tooling (nox sessions, the test suite, the wheel and fact caches:
``TOOLING_VARS``, ``TOOLING_PREFIXES``) are no switches: legal anywhere, read by that tooling alone.

An invalid value raises ``ConfigError`` naming the variable, the value and the allowed values, and a
``VLLM_COMPAT_*`` variable nobody reads (a typo in its name) one naming the known variables: a typo in a
production switch must never be silently ignored. ``read_checked_controls`` answers both for every drift point
at once; activation (``vllm_compat.activate``) runs it when the first module of vLLM or vllm-omni is looked up,
and ``apply()`` before anything else, so a worker learns of a typo before any target is imported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError

DISABLE_VAR = "VLLM_COMPAT_DISABLE"
STRICT_VAR = "VLLM_COMPAT_STRICT"
DISABLE_PATCHES_VAR = "VLLM_COMPAT_DISABLE_PATCHES"

PREFIX = "VLLM_COMPAT_"
CORE_VARS = (DISABLE_VAR, STRICT_VAR, DISABLE_PATCHES_VAR)
# Read by vllm_compat's tooling, never by a drift point (grep the repository: tests/test_config.py does).
TOOLING_VARS = frozenset({
    "VLLM_COMPAT_CACHE_DIR",  # detect/fact_cache.py: where static facts are cached
    "VLLM_COMPAT_WHEEL_CACHE",  # detect/wheels.py: where `check` keeps wheels
    "VLLM_COMPAT_NO_RESOLVE",  # check.py: 1 = no resolution with uv (as --no-resolve); the test suite sets it
    "VLLM_COMPAT_CELL", "VLLM_COMPAT_CELLS",  # noxfile.py: the matrix cell running / the cells to run
    "VLLM_COMPAT_ROTATION", "VLLM_COMPAT_ROTATION_SEED",  # noxfile.py: CI's rotating share of the cells
    "VLLM_COMPAT_TORCH", "VLLM_COMPAT_FIND_LINKS",  # noxfile.py: the torch a cell gets, and where to find it
    "VLLM_COMPAT_MATRIX_KEEP", "VLLM_COMPAT_TEST_WORKERS",  # noxfile.py: keep cell venvs; pytest-xdist workers
    "VLLM_COMPAT_RECORD_SETS", "VLLM_COMPAT_FRESH_RESOLVE",  # noxfile.py: record a passing cell's set; install without
    "VLLM_COMPAT_TESTS_COLD",  # tests/support/warm_python.py: no warm interpreter
    "VLLM_COMPAT_SERVE_RECORD", "VLLM_COMPAT_SERVE_TIMEOUT",  # tests/serve: record native runs; server timeout
    "VLLM_COMPAT_DIFFUSION_PATH_OUT",  # noxfile.py -> tests/bridges/test_diffusion_path.py: its summary file
    "VLLM_COMPAT_REFERENCE_LOADER",  # tests/faults: the reference loader's source
    "VLLM_COMPAT_MUTANTS_LAUNCH",  # mutation/run.py: its launcher's one-shot flag
    "VLLM_COMPAT_FETCH_PLUGIN_RELEASES",  # noxfile.py -> tests/plugins: fetch the plugins' releases (one cell)
})
TOOLING_PREFIXES = ("VLLM_COMPAT_EXPECT_",)  # noxfile.py -> tests/test_matrix_consistency.py: a cell's expectations
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Controls:
    disabled: bool = False
    strict: bool = False
    disabled_patches: frozenset = frozenset()
    # (name, raw value) of every other VLLM_COMPAT_* variable but the tooling's, sorted: a drift point's own switches
    switches: tuple = ()

    def switch(self, name: str, default: str = "") -> str:
        """The raw value of the drift-point switch ``name``, or ``default`` when it is not set."""
        return dict(self.switches).get(name, default)


def is_tooling_var(name: str) -> bool:
    """Whether ``name`` is a variable of vllm_compat's tooling (``TOOLING_VARS``, ``TOOLING_PREFIXES``)."""
    return name in TOOLING_VARS or name.startswith(TOOLING_PREFIXES)


def _read_flag(environ: Mapping[str, str], name: str) -> bool:
    raw = environ.get(name, "")
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(
        f"{name}={raw!r} is not a valid switch. Allowed values: 1/true/yes/on to enable, "
        f"0/false/no/off or unset to leave it off."
    )


def read_controls(environ: Mapping[str, str] | None = None) -> Controls:
    """Parse the ``VLLM_COMPAT_*`` variables from ``environ`` (default ``os.environ``).

    Returns the defaults when nothing is set; raises ``ConfigError`` on any value outside the allowed sets.
    """
    environ = os.environ if environ is None else environ
    return Controls(
        disabled=_read_flag(environ, DISABLE_VAR),
        strict=_read_flag(environ, STRICT_VAR),
        disabled_patches=_read_patch_ids(environ),
        switches=tuple(sorted((k, v) for k, v in environ.items()
                              if k.startswith(PREFIX) and k not in CORE_VARS and not is_tooling_var(k))),
    )


def read_checked_controls(environ: Mapping[str, str] | None = None) -> Controls:
    """``read_controls(environ)``, then ``check_switches`` on the result: what ``apply()`` and activation read.

    Returns the Controls; raises ``ConfigError`` on the first bad value or unknown variable found.
    """
    controls = read_controls(environ)
    check_switches(controls)
    return controls


def check_switches(controls: Controls) -> None:
    """Answer every drift-point switch in ``controls`` now, not when its drift point's target is imported.

    Without switches (the usual case) it returns at once and imports nothing. Otherwise it asks every catalogue
    entry's drift point (importing them all: some 70 ms, paid once, and only where a switch is set) which
    variables it reads (``DriftPoint.switches``), raises ``ConfigError`` for a variable none of them reads (naming
    the variables that exist), then has each validate its own (``DriftPoint.check_controls``, whose
    ``ConfigError`` names the variable, the value and the allowed values).
    """
    if not controls.switches:
        return
    from .catalogue import CATALOGUE

    points = [entry.point for entry in CATALOGUE]
    read = {name for point in points for name in point.switches}
    for name, raw in controls.switches:
        if name not in read:
            raise ConfigError(
                f"{name}={raw!r} is set, but vllm_compat has no such variable (a typo in its name?). Known "
                f"variables: {', '.join([*CORE_VARS, *sorted(read)])} (README, \"Turning it off\"), "
                f"besides the nox sessions' and tests' own (vllm_compat.config.TOOLING_VARS). Correct the name, or "
                f"unset it."
            )
    for point in points:
        point.check_controls(controls)


def is_strict(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``VLLM_COMPAT_STRICT`` is on; False where its value is invalid (the hooks' question after a
    ``ConfigError``: whether to raise it rather than record a refusal)."""
    try:
        return _read_flag(os.environ if environ is None else environ, STRICT_VAR)
    except ConfigError:
        return False


def _read_patch_ids(environ: Mapping[str, str]) -> frozenset:
    from .catalogue import CATALOGUE

    raw = environ.get(DISABLE_PATCHES_VAR, "")
    ids = frozenset(part.strip() for part in raw.split(",") if part.strip())
    known = [entry.id for entry in CATALOGUE]
    unknown = sorted(ids - set(known))
    if unknown:
        raise ConfigError(
            f"{DISABLE_PATCHES_VAR}={raw!r} names {', '.join(unknown)}, which the catalogue does not have. "
            f"Known ids: {', '.join(known)} (`vllm-compat doctor` lists them with what each does)."
        )
    return ids
