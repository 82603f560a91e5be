"""Moved: the catalogue is ``vllm_compat.catalogue`` (issue 23). Kept importable for modules written before."""

from ..catalogue import CATALOGUE, Entry, PatchEntry  # noqa: F401
