"""Files two installed distributions both claim: the resolver-made breakage where install order picks the bytes.

A resolver checks names and version ranges, not files. When two distributions both ship the same file (an old
monolithic wheel beside the split-out one that replaced it), both install, the later one overwrites the earlier
one's file, and which code runs depends on the order the installer happened to unpack them in. Nothing fails at
install time; an import fails later, far from the cause.

Read, from files only (nothing imported): every ``*.dist-info/RECORD`` in the site directories on ``sys.path``
(``site_dirs``: the ``sys.path`` entries that hold a ``*.dist-info``; a source tree with only its own
``*.egg-info``, a setuptools develop build, is not one). Each RECORD path is taken
relative to its site directory; ``../`` paths (console scripts in ``bin/``, data in ``share/``) are normalized
to where they land, so two distributions writing one command clash too. Left out:
- ``*.pyc`` and anything under ``__pycache__/``: compiled by the installer from a ``.py`` that is itself listed,
  so a clash there is the ``.py``'s clash counted twice;
- paths inside a ``*.dist-info/`` directory: a distribution's own metadata (RECORD, METADATA, INSTALLER, ...),
  unique to it by its directory name.
A distribution without a RECORD (an ``*.egg-info`` from ``setup.py install``, a hand-copied tree) cannot be
checked; it is listed in ``unread`` with the top-level names of its ``top_level.txt`` where present.

A clash is reported once per pair of distributions: how many files both own, the first few paths (sorted), how
many of them differ by the RECORD's sha256 (0: the same bytes, nothing depends on the order), and whose bytes are
on disk now (``on_disk``) where that is cheap to decide: the smallest shared file (at most ``PROBE_MAX_BYTES``)
whose two RECORD hashes differ is hashed and compared with both.

Cost (docs/dependency-drift.md): a matrix cell env holds ~200-250 distributions, 60-75k RECORD lines (7-11 MB);
reading them is the cost (~50 ms on an idle core, 90-250 ms on this 2-core machine under a test run's load), so
each line is cut at its first comma without the csv module, only ``../`` paths are normalized, and only the few
RECORDs of clashing distributions are read a second time (with csv) for their hashes. The doctor asks for it
only where it prints it (``dependency_drift.DependencyDrift.file_clashes``: --verbose and --json).

Before anything is installed (``vllm-compat check``'s resolution, ``resolution.py``), the same rules apply to the
file listings of the wheels a resolver picked (``find_listing_clashes``; ``detect.wheel_listing`` reads them
from the zip's central directory): ``is_left_out`` is the one rule for what is no file to compare, and a wheel's
``<name>.data/<scheme>/`` paths are keyed where an install writes them (``wheel_path_key``).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field

FIRST_PATHS = 5  # paths shown per clash
PROBE_MAX_BYTES = 1 << 20  # the largest shared file hashed to decide whose bytes are on disk
# Where a wheel's ``<name>-<version>.data/<scheme>/`` files land, written as an installed RECORD in a venv writes
# them relative to its site directory (lib/pythonX.Y/site-packages, three levels below the prefix): purelib and
# platlib into the site directory itself, the rest under the prefix ({name}: the distribution's, for headers).
DATA_SCHEMES = {"purelib": "", "platlib": "", "scripts": "../../../bin/", "data": "../../../",
                "headers": "../../../include/site/{name}/"}


def is_left_out(path: str) -> bool:
    """The module's rule for a RECORD or wheel path that is no file to compare: a ``*.pyc``, anything under
    ``__pycache__/`` and anything inside a ``*.dist-info/`` (``detect.wheel_listing`` applies it too)."""
    return path[-4:] == ".pyc" or "__pycache__/" in path or ".dist-info/" in path


def wheel_path_key(path: str) -> str | None:
    """Where a wheel's archive path lands, as the RECORD path an install writes for it (``name-1.0.data/purelib/x``
    -> ``x``, ``name-1.0.data/scripts/x`` -> ``../../../bin/x``, ``DATA_SCHEMES``); None for a path
    ``is_left_out`` leaves out, a directory entry, and a ``.data`` path of no known scheme."""
    if not path or path[-1:] == "/" or is_left_out(path):
        return None
    top, _, rest = path.partition("/")
    if not top.endswith(".data") or not rest:
        return path
    scheme, _, inside = rest.partition("/")
    if scheme not in DATA_SCHEMES or not inside:
        return None
    name = top[: -len(".data")].rpartition("-")[0] or top[: -len(".data")]
    return os.path.normpath(DATA_SCHEMES[scheme].format(name=_canonical(name)) + inside)


def shown_path(key: str) -> str:
    """A wheel key as the report shows it: ``../../../bin/x`` -> ``bin/x``."""
    while key.startswith("../"):
        key = key[3:]
    return key


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Distribution:
    """One installed ``*.dist-info``: its name (canonical) and version from the directory's name."""

    name: str
    version: str
    dist_info: str  # the directory's full path (of a wheel not installed: its file name)

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"


@dataclass(frozen=True)
class FileClash:
    """Two distributions owning the same files."""

    first: Distribution  # sorted by (name, version): the report is stable
    second: Distribution
    count: int  # files both own
    paths: tuple[str, ...]  # the first FIRST_PATHS, relative to their site directory
    differing: int  # of ``count``, the files whose RECORD sha256 differ between the two
    on_disk: str | None = None  # first.name / second.name / "neither" / None: not decided (see ``probe``)
    probe: str | None = None  # the file hashed, or why none was

    def describe(self) -> str:
        """``cuda-python 12.6.2.post1 and cuda-bindings 13.5.0 both install 28 file(s) (28 differ): cuda/...``."""
        same = "all identical" if self.differing == 0 else f"{self.differing} differ"
        more = f", +{self.count - len(self.paths)} more" if self.count > len(self.paths) else ""
        return (f"{self.first.label} and {self.second.label} both install {self.count} file(s) ({same}): "
                f"{', '.join(self.paths)}{more}")

    def on_disk_text(self) -> str:
        if self.differing == 0:
            return "same bytes either way"
        if self.on_disk in (self.first.name, self.second.name):
            loser = self.second if self.on_disk == self.first.name else self.first
            return f"{self.on_disk}'s bytes are on disk ({self.probe}); {loser.label}'s are overwritten"
        if self.probe == NOT_INSTALLED:
            return "not installed yet: the install order decides whose bytes stay"
        if self.on_disk == "neither":
            return f"neither's bytes are on disk ({self.probe}: modified after install)"
        return f"whose bytes are on disk not decided ({self.probe})"

    def to_dict(self) -> dict:
        return {"first": {"name": self.first.name, "version": self.first.version},
                "second": {"name": self.second.name, "version": self.second.version},
                "count": self.count, "paths": list(self.paths), "differing": self.differing,
                "on_disk": self.on_disk, "probe": self.probe, "text": self.describe()}


@dataclass
class FileOwners:
    """What ``find_file_clashes`` read: the site directories, how many distributions, the clashes (sorted by the
    pair), and the distributions it could not read (``{dist-info or egg-info path: why}``)."""

    sites: tuple[str, ...]
    distributions: int
    clashes: list[FileClash] = field(default_factory=list)
    unread: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"sites": list(self.sites), "distributions": self.distributions,
                "clashes": [c.to_dict() for c in self.clashes], "unread": dict(self.unread)}


def site_dirs(path: list[str] | None = None) -> list[str]:
    """The entries of ``path`` (default ``sys.path``) that are directories holding a ``*.dist-info``, in order,
    each once (by real path), none inside another (a package's vendored copies). A source tree (with or without its
    ``*.egg-info``) or a zip is not one."""
    found, seen = [], set()
    for entry in sys.path if path is None else path:
        real = os.path.realpath(entry or os.curdir)
        if real in seen:
            continue
        seen.add(real)
        try:
            names = os.listdir(real)
        except OSError:  # not a directory (a zip), or gone
            continue
        if any(n.endswith(".dist-info") for n in names):
            found.append(real)
    # a directory inside another one is a package's vendored copies (setuptools puts setuptools/_vendor on
    # sys.path when it is imported): their files are its own, listed in its RECORD, not a second install
    return [d for d in found if not any(d != other and d.startswith(other + os.sep) for other in found)]


def _distribution(dist_info: str) -> Distribution:
    stem = os.path.basename(dist_info)[: -len(".dist-info")]
    name, _, version = stem.rpartition("-")
    return Distribution(_canonical(name or stem), version or "?", dist_info)


def _record_paths(text: str) -> list[str]:
    """The paths of a RECORD's text: up to the first comma of each line (csv quotes a path holding a comma or a
    quote: then the csv module reads it)."""
    if '"' not in text:
        return [line.partition(",")[0] for line in text.splitlines()]
    import csv

    return [row[0] for row in csv.reader(text.splitlines()) if row]


def _is_outside(path: str) -> bool:
    """A path to normalize: ``../`` (out of the site directory), absolute, or ``./``."""
    return path[:1] in (".", "/")


def _key(site: str, path: str) -> str:
    """Where a RECORD path lands, as one string (the key of a shared file)."""
    if _is_outside(path):
        return os.path.normpath(os.path.join(site, path))
    return f"{site}/{path}"


def _read_text(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def _hashes(dist: Distribution, site: str, keys: set[str]) -> dict[str, tuple[str | None, int | None]]:
    """``{key: (sha256 text or None, size or None)}`` for ``keys`` from ``dist``'s RECORD (a second read)."""
    import csv

    found = {}
    for row in csv.reader((_read_text(os.path.join(dist.dist_info, "RECORD")) or "").splitlines()):
        if not row:
            continue
        key = _key(site, row[0])
        if key in keys:
            digest = row[1] if len(row) > 1 and row[1].startswith("sha256=") else None
            size = int(row[2]) if len(row) > 2 and row[2].isdigit() else None
            found[key] = (digest, size)
    return found


def _file_sha256(path: str) -> str:
    import base64
    import hashlib

    with open(path, "rb") as handle:
        digest = hashlib.sha256(handle.read()).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _compare(first: Distribution, second: Distribution, site_of: dict, shared: list[str]) -> FileClash:
    a = _hashes(first, site_of[first.dist_info], set(shared))
    b = _hashes(second, site_of[second.dist_info], set(shared))
    differ = [k for k in shared if a.get(k, (None,))[0] is None or a.get(k, (None,))[0] != b.get(k, (None,))[0]]
    sites = {site_of[first.dist_info], site_of[second.dist_info]}
    shown = tuple(_shown(k, sites) for k in sorted(shared)[:FIRST_PATHS])
    on_disk, probe = None, None
    candidates = sorted((a[k][1], k) for k in differ if a.get(k, (None,))[0] and b.get(k, (None,))[0]
                        and a[k][1] is not None and a[k][1] <= PROBE_MAX_BYTES)
    if differ and not candidates:
        probe = f"no shared file under {PROBE_MAX_BYTES} bytes with a sha256 in both RECORDs"
    elif candidates:
        key = candidates[0][1]
        probe = _shown(key, sites)
        try:
            digest = _file_sha256(key)
        except OSError as exc:
            probe = f"{probe}: {exc.strerror or exc}"
        else:
            on_disk = first.name if digest == a[key][0] else second.name if digest == b[key][0] else "neither"
    return FileClash(first, second, len(shared), shown, len(differ), on_disk, probe)


def _shown(key: str, sites: set[str]) -> str:
    for site in sites:
        if key.startswith(site + "/"):
            return key[len(site) + 1:]
    return key


def find_file_clashes(sites: list[str] | None = None) -> FileOwners:
    """The files owned by two or more distributions in ``sites`` (default: ``site_dirs()``), by the module's
    rules; one ``FileClash`` per pair of distributions (a file three own counts in each of the three pairs)."""
    sites = site_dirs() if sites is None else [os.path.realpath(s) for s in sites]
    outside: dict[str, int] = {}  # normalized path -> the first distribution's index, for ../ and absolute paths
    shared: dict[str, set[int]] = {}  # key -> the indexes of every distribution owning it
    dists: list[Distribution] = []
    site_of: dict[str, str] = {}
    unread: dict[str, str] = {}
    for site in sites:
        try:
            names = sorted(os.listdir(site))
        except OSError:
            continue
        inside: dict[str, int] = {}  # path relative to this site -> the first owner's index
        for name in names:
            meta = os.path.join(site, name)
            if name.endswith(".egg-info"):
                unread[meta] = _unread_why(meta, "an egg-info has no RECORD")
                continue
            if not name.endswith(".dist-info"):
                continue
            text = _read_text(os.path.join(meta, "RECORD"))
            if text is None:
                unread[meta] = _unread_why(meta, "no RECORD")
                continue
            index = len(dists)
            dists.append(_distribution(meta))
            site_of[meta] = site
            for path in _record_paths(text):  # the hot loop: ~60k paths in a cell env
                if not path or is_left_out(path):
                    continue
                if path[:1] in (".", "/"):
                    key = os.path.normpath(os.path.join(site, path))
                    first = outside.setdefault(key, index)
                else:
                    key = path
                    first = inside.setdefault(key, index)
                    if first != index:
                        key = f"{site}/{path}"
                if first != index:
                    shared.setdefault(key, {first}).add(index)
    clashes = [_compare(dists[a], dists[b], site_of, keys) for (a, b), keys in _pairs(dists, shared).items()]
    clashes.sort(key=lambda c: (c.first.name, c.first.version, c.second.name, c.second.version))
    return FileOwners(tuple(sites), len(dists), clashes, unread)


def _pairs(dists: list[Distribution], shared: dict[str, set[int]]) -> dict[tuple[int, int], list[str]]:
    """``{(a, b): [key, ...]}``: each pair of distributions (indexes into ``dists``, ordered by name and version)
    with the keys both own, from ``shared`` (``{key: indexes of every owner}``)."""
    pairs: dict[tuple[int, int], list[str]] = {}
    for key, owners in shared.items():
        ordered = sorted(owners, key=lambda i: (dists[i].name, dists[i].version, i))
        for i, a in enumerate(ordered):
            for b in ordered[i + 1:]:
                pairs.setdefault((a, b), []).append(key)
    return pairs


NOT_INSTALLED = "not installed: the install order decides"


def find_listing_clashes(listings) -> list[FileClash]:
    """The clashes among wheels not installed yet: ``listings`` is ``[(Distribution, {archive path: CRC-32})]``
    (``detect.wheel_listing``); each path is keyed by where it lands (``wheel_path_key``, the module's rules), one
    ``FileClash`` per pair as ``find_file_clashes`` reports them, ``differing`` by the zip's CRC-32 instead of the
    RECORD's sha256, and ``on_disk`` None (nothing is on disk yet)."""
    dists = [dist for dist, _ in listings]
    first: dict[str, int] = {}
    shared: dict[str, set[int]] = {}
    crcs: list[dict[str, int | None]] = []
    for index, (_, files) in enumerate(listings):
        keyed = {}
        for path, crc in files.items():
            key = wheel_path_key(path)
            if key is None or key in keyed:
                continue
            keyed[key] = crc
            owner = first.setdefault(key, index)
            if owner != index:
                shared.setdefault(key, {owner}).add(index)
        crcs.append(keyed)
    clashes = []
    for (a, b), keys in _pairs(dists, shared).items():
        differ = sum(1 for k in keys if crcs[a][k] is None or crcs[a][k] != crcs[b][k])
        shown = tuple(shown_path(k) for k in sorted(keys)[:FIRST_PATHS])
        clashes.append(FileClash(dists[a], dists[b], len(keys), shown, differ, None, NOT_INSTALLED))
    clashes.sort(key=lambda c: (c.first.name, c.first.version, c.second.name, c.second.version))
    return clashes


def _unread_why(meta: str, why: str) -> str:
    top = _read_text(os.path.join(meta, "top_level.txt"))
    names = [n for n in (top or "").split() if n]
    return why + (f"; top-level names: {', '.join(names)}" if names else "")
