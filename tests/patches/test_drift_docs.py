"""The drift-point docs are generated from the docstrings (the one home of Why / When / Serves / Retire when) and
are not stale; ``python matrix/drift_docs.py`` regenerates them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from vllm_compat.catalogue import CATALOGUE

ROOT = Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("drift_docs", ROOT / "matrix" / "drift_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("entry", CATALOGUE, ids=[e.id for e in CATALOGUE])
def test_every_drift_point_docstring_has_its_sections(entry):
    found = _generator().sections(entry)
    assert all(found[label] for label in ("Why", "When", "Serves", "Retire when")), found


def test_generated_docs_are_not_stale():
    assert _generator().stale(CATALOGUE) == [], "run python matrix/drift_docs.py"


def test_a_changed_docstring_makes_the_docs_stale(monkeypatch):
    """The staleness check can fail: a drift point's retire condition edited in its docstring shows."""
    generator = _generator()
    entry = CATALOGUE[0]
    real = generator.sections

    def edited(e):
        found = dict(real(e))
        if e is entry:
            found["Retire when"] += " (edited)"
        return found

    monkeypatch.setattr(generator, "sections", edited)
    assert "docs/drift-points.md" in generator.stale(CATALOGUE)
    assert f"docs/drift-points/{entry.id}.md" in generator.stale(CATALOGUE)
