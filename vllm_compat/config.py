"""The user's controls, read from the environment each time a decision is made.

``VLLM_COMPAT_DISABLE=1``        nothing is patched; the report says "disabled".
``VLLM_COMPAT_LOADER_VARIANT``   auto (default) | legacy | meta_safe; a forced variant also patches a loader
                                 that is already fixed upstream or of an unknown shape.
``VLLM_COMPAT_STRICT=1``         a refused patch raises ``PatchRefusedError`` instead of logging a warning.
``VLLM_COMPAT_DISABLE_PATCHES``  comma-separated catalogue ids (``vllm-compat doctor`` lists them) left alone;
                                 an id the catalogue does not have is an error.

An invalid value raises ``ConfigError`` naming the variable, the value and the allowed values: a typo in a
production switch must never be silently ignored.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError

DISABLE_VAR = "VLLM_COMPAT_DISABLE"
VARIANT_VAR = "VLLM_COMPAT_LOADER_VARIANT"
STRICT_VAR = "VLLM_COMPAT_STRICT"
DISABLE_PATCHES_VAR = "VLLM_COMPAT_DISABLE_PATCHES"

LOADER_VARIANTS = ("auto", "legacy", "meta_safe")
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


@dataclass(frozen=True)
class Controls:
    disabled: bool = False
    loader_variant: str = "auto"
    strict: bool = False
    disabled_patches: frozenset = frozenset()

    @property
    def is_forced(self) -> bool:
        return self.loader_variant != "auto"


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
    raw_variant = environ.get(VARIANT_VAR, "auto")
    variant = raw_variant.strip().lower() or "auto"
    if variant not in LOADER_VARIANTS:
        raise ConfigError(
            f"{VARIANT_VAR}={raw_variant!r} is not a loader variant. Allowed values: "
            f"{', '.join(LOADER_VARIANTS)} (auto lets vllm_compat choose from what the installed vLLM can do)."
        )
    return Controls(
        disabled=_read_flag(environ, DISABLE_VAR),
        loader_variant=variant,
        strict=_read_flag(environ, STRICT_VAR),
        disabled_patches=_read_patch_ids(environ),
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
