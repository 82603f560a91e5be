"""The user's controls, read from the environment each time a decision is made.

``VLLM_COMPAT_DISABLE=1``        nothing is patched; the report says "disabled".
``VLLM_COMPAT_STRICT=1``         a refused patch raises ``PatchRefusedError`` instead of logging a warning.
``VLLM_COMPAT_DISABLE_PATCHES``  comma-separated catalogue ids (``vllm-compat doctor`` lists them) left alone;
                                 an id the catalogue does not have is an error.

Every other ``VLLM_COMPAT_*`` variable is kept as it is (``Controls.switches``) for the drift point it belongs to,
which reads and validates it (``DriftPoint.check_controls``; the drift-point docs list them).

An invalid value raises ``ConfigError`` naming the variable, the value and the allowed values: a typo in a
production switch must never be silently ignored.
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
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Controls:
    disabled: bool = False
    strict: bool = False
    disabled_patches: frozenset = frozenset()
    # (name, raw value) of every other VLLM_COMPAT_* variable, sorted: a drift point's own switches
    switches: tuple = ()

    def switch(self, name: str, default: str = "") -> str:
        """The raw value of the drift-point switch ``name``, or ``default`` when it is not set."""
        return dict(self.switches).get(name, default)


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
    own = (DISABLE_VAR, STRICT_VAR, DISABLE_PATCHES_VAR)
    return Controls(
        disabled=_read_flag(environ, DISABLE_VAR),
        strict=_read_flag(environ, STRICT_VAR),
        disabled_patches=_read_patch_ids(environ),
        switches=tuple(sorted((k, v) for k, v in environ.items() if k.startswith(PREFIX) and k not in own)),
    )


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
