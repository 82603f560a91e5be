"""plugins/breakage_reports.toml: the plugins' own breakage reports and tested pairs, kept typed and kept true to the
release files. Each row's facts (the module that uses the name, the range the release declares) are re-read from the
cached plugin release where it is cached; a row whose release is not cached is skipped with the file to fetch.

This is the data issue 40's recall / precision measurement will run `check` on; the measurement itself waits for
`check` to take any plugin (plugins/README.md)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.plugins.releases import release_or_skip
from vllm_compat.detect.plugin_entrypoints import read_plugin

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+; the table is read on 3.11+ only")

TABLE = Path(__file__).resolve().parents[2] / "plugins" / "breakage_reports.toml"
DATA = tomllib.loads(TABLE.read_text())
REPORTS = DATA["report"]
KNOWN_GOOD = DATA["known_good"]
KINDS = {"import", "signature", "attribute", "abstract", "other"}
REQUIRED = ("id", "url", "plugin", "plugin_version", "vllm", "error", "error_verbatim", "kind", "failing_name",
            "where", "static", "static_how", "check_today", "direction", "pypi_plugin", "pypi_vllm", "declared",
            "in_declared_range")
PLUGINS = {"vllm-ascend", "tpu-inference", "sendnn-inference", "vllm-spyre", "kvcached", "lmcache", "vllm-gaudi",
           "vllm-metal"}


def _released(version: str) -> str | None:
    """The PyPI version a row names ("0.3.10 (fixed there; ...)" -> None: the failing code is a commit)."""
    return version if re.fullmatch(r"[0-9][0-9A-Za-z.+-]*", version) else None


def test_the_table_is_typed_and_large_enough():
    ids = [r["id"] for r in REPORTS]
    assert len(ids) == len(set(ids)), "report ids repeat"
    for row in REPORTS:
        missing = [f for f in REQUIRED if f not in row]
        assert not missing, f"{row['id']} lacks {missing}"
        assert row["kind"] in KINDS, row["id"]
        assert row["plugin"] in PLUGINS, row["id"]
        assert isinstance(row["static"], bool) and isinstance(row["error_verbatim"], bool), row["id"]
        assert row["static_how"].strip() and row["check_today"].startswith(("yes", "no")), row["id"]
        assert row["direction"] in ("vllm_newer", "plugin_newer"), row["id"]
        assert row["url"].startswith("https://github.com/"), row["id"]
        assert row["failing_name"].startswith("vllm."), row["id"]
    # issue 40: at least 15 reports from at least four plugins
    assert len(REPORTS) >= 15
    assert len({r["plugin"] for r in REPORTS}) >= 4
    for row in KNOWN_GOOD:
        assert {"plugin", "plugin_version", "vllm", "evidence", "confidence"} <= set(row), row
        assert row["confidence"] in ("declared", "stated", "inferred"), row


def test_a_pair_is_both_broken_and_known_good_only_where_the_run_decides():
    """vllm-ascend 0.20.2rc1 on vLLM 0.20.2 is its own tested pair and a report (#9305): the import is gated on the
    running vLLM's version string, so only a source build or a VLLM_VERSION override fails. A static report on a
    known-good pair would be a contradiction in the data."""
    pair = lambda r: (r["plugin"], r["plugin_version"], r["vllm"])  # noqa: E731
    good = {pair(r) for r in KNOWN_GOOD}
    both = [r for r in REPORTS if pair(r) in good]
    assert [r["id"] for r in both] == ["vllm-ascend#9305"]
    assert all(r["static"] is False for r in both)


@pytest.mark.parametrize("row", [r for r in REPORTS if _released(r["plugin_version"])
                                 and not r["pypi_plugin"].startswith("no")], ids=lambda r: r["id"])
def test_where_and_declared_range_match_the_release(row):
    """`where` names a module the release ships, and `declared` / `in_declared_range` are what its metadata says."""
    path = release_or_skip(row["plugin"], _released(row["plugin_version"]))
    plugin = read_plugin(path)
    module = row["where"].split(":", 1)[0].split(" ", 1)[0]
    assert module in plugin.modules, f"{row['id']}: {module} is not in {path.name}"
    declared = plugin.declared_vllm
    if row["declared"] == "":
        assert declared is None, f"{row['id']}: the release declares {declared}"
        assert row["in_declared_range"] == "undeclared"
    else:
        assert declared is not None and _same_requirement(declared.requirement, row["declared"]), (
            f"{row['id']}: the release declares {declared}")
        assert plugin.allows_vllm(row["vllm"]) is row["in_declared_range"], row["id"]


@pytest.mark.parametrize("row", [r for r in KNOWN_GOOD if r["confidence"] == "declared"],
                         ids=lambda r: f"{r['plugin']}-{r['plugin_version']}+vllm-{r['vllm']}")
def test_declared_known_good_pairs_are_inside_the_declared_range(row):
    path = release_or_skip(row["plugin"], row["plugin_version"])
    assert read_plugin(path).allows_vllm(row["vllm"]) is True


def _same_requirement(a: str, b: str) -> bool:
    from packaging.requirements import Requirement

    ra, rb = Requirement(a), Requirement(b)
    return (ra.name, ra.specifier, str(ra.marker)) == (rb.name, rb.specifier, str(rb.marker))
