"""The env this test runs in (every matrix cell runs it on its own): no two installed distributions own one file,
except the clashes ``vllm_compat.known_clashes`` lists as harmless, with its reason (and, for an overlay, while
the overlaying distribution's bytes are on disk; for a build that links a system library, where that library is
found).

Why: a resolver checks names and ranges, not files. ``uv pip compile vllm==0.33.0`` resolved cuda-bindings 13.5.0
beside cuda-python 12.6.2.post1, both installing cuda/bindings/runtime*.so and 26 more files; in one of two
installs the 12.x bytes won and ``import vllm_omni.entrypoints.cli.main`` failed (issue 33). A cell env with such
a pair tests whatever the installer's order left on disk.

Measured in the five cell envs (2026-12-04): flashinfer-python / torch-c-dlpack-ext (build_backend.py) in all
five, nvidia-cutlass-dsl-libs-base / -cu13 in v0.24-omni0.24, opencv-python / opencv-python-headless in
v0.30-omni0.30 and v0.33-omni0.30 (with different builds of cv2 on disk in the two): all harmless rows.
"""

from __future__ import annotations

import csv
import os
import sys
from collections import defaultdict

from vllm_compat.dependency_drift import file_clash_lines
from vllm_compat.detect.file_owners import find_file_clashes, site_dirs
from vllm_compat.known_clashes import known_clash


def test_the_finder_reads_this_envs_site_packages():
    """The check below reads something: this interpreter's site-packages, with pytest's own RECORD in it."""
    sites = site_dirs()
    assert sites, f"no directory on sys.path holds a *.dist-info: {sys.path}"
    owners = find_file_clashes()
    assert owners.distributions >= 2 and owners.unread == {}, owners.unread


def test_no_two_distributions_own_one_file():
    owners = find_file_clashes()
    bad = [c for c in owners.clashes if not ((row := known_clash(c)) and row.is_harmless_for(c))]
    assert not bad, ("distributions in this env install the same files; which bytes are on disk depends on "
                     "install order. Pin the override the row names, or reinstall, or add a row with the reason "
                     "it is harmless to vllm_compat/known_clashes.py:\n" + "\n".join(file_clash_lines(owners)))


def _reference_pairs(sites) -> dict:
    """{(name-version, name-version): shared file count}, re-derived the plain way (csv, os.path.normpath on every
    path, the same rules: no .pyc, no __pycache__, no dist-info file): the oracle for the finder's fast path."""
    owners = defaultdict(set)
    for site in sites:
        for name in os.listdir(site):
            record = os.path.join(site, name, "RECORD")
            if not name.endswith(".dist-info") or not os.path.isfile(record):
                continue
            with open(record, newline="", encoding="utf-8", errors="replace") as handle:
                for row in csv.reader(handle):
                    path = row[0] if row else ""
                    if not path or path.endswith(".pyc") or "__pycache__" in path.split("/") or any(
                            part.endswith(".dist-info") for part in path.split("/")[:-1]):
                        continue
                    owners[os.path.normpath(os.path.join(site, path))].add(name[: -len(".dist-info")])
    pairs = defaultdict(int)
    for names in owners.values():
        ordered = sorted(names)
        for i, a in enumerate(ordered):
            for b in ordered[i + 1:]:
                pairs[a, b] += 1
    return dict(pairs)


def test_the_finder_agrees_with_a_plain_reading_of_the_records():
    """A clash-free env passes the test above whatever the finder returns: here its pairs and counts are checked
    against the plain csv reading of the same RECORDs."""
    import re

    def stem(dist):  # the dist-info's name as the reference keys it
        return os.path.basename(dist.dist_info)[: -len(".dist-info")]

    owners = find_file_clashes()
    found = {tuple(sorted((stem(c.first), stem(c.second)))): c.count for c in owners.clashes}
    assert found == _reference_pairs(site_dirs())
    assert all(re.fullmatch(r"[a-z0-9-]+", c.first.name) and c.first.version != "?" for c in owners.clashes)
