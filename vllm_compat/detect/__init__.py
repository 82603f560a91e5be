"""Detection: what the installed vLLM, vllm-omni and torch are and can do.

``static`` reads source files and distribution metadata without importing anything; ``runtime`` asks the
imported modules. Both produce the same ``VllmCapabilities`` and ``LoaderShape`` records (``model``), so a
test can hold them equal.
"""

from .model import LoaderKind, LoaderShape, VllmCapabilities, classify_loader_source

__all__ = ["LoaderKind", "LoaderShape", "VllmCapabilities", "classify_loader_source"]
