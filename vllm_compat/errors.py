"""Named exceptions. Every message is a full sentence: what was found, what was expected, what to do."""

from __future__ import annotations


class VllmCompatError(Exception):
    """Base class of every error raised by vllm_compat."""


class ConfigError(VllmCompatError, ValueError):
    """An environment control (``VLLM_COMPAT_*``) holds a value we do not accept."""


class PatchRefusedError(VllmCompatError):
    """A patch target was found but does not have a shape we know how to patch safely.

    Raised only under ``VLLM_COMPAT_STRICT=1``; otherwise the refusal is logged and recorded in the report.
    """


class UnsupportedLayoutError(VllmCompatError, RuntimeError):
    """A module's parameters are laid out in a way no loader variant can process without losing data."""
