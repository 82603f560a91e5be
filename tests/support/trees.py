"""Small package trees written into a test's tmp_path: a plugin and a host of a few modules, for the shapes no real
release pair has (the detections read them as they read wheels)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from vllm_compat.detect.source_tree import SourceTree


def write_tree(root: Path, files: dict[str, str]) -> SourceTree:
    """Write ``files`` ({relative path: source, dedented}) under ``root``; the tree that reads them."""
    for relpath, text in files.items():
        path = root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return SourceTree(root)
