"""A release's source files read from its wheel on the index by HTTP range requests, never the whole wheel.

``vllm-compat check vllm==X`` reads vLLM's ``.py`` files and its ``*.dist-info`` (METADATA), never its compiled
extensions: 9-14 MB of a 240-340 MB vLLM wheel. ``open_release`` gives a ``SourceTree`` of the release in this
order, and says where it came from:

1. a whole wheel of it already in the wheel cache (``wheels.cached_wheel``; what earlier versions downloaded);
2. its members kept in ``members/`` of the wheel cache (``stored_release``): read offline;
3. the index: the wheel an installer picks for this interpreter (``find_release``: the PEP 691 JSON or PEP 503
   HTML project page of pip's index-url, the best ``packaging.tags.sys_tags`` match, ``Requires-Python``
   honoured), its central directory read as ``wheel_listing`` reads it (the last 8 KiB, then the rest of the
   directory), then every member ``is_source_member`` names in as few ranged requests as the layout allows
   (``plan_ranges``: neighbouring members in one request when the gap between them is at most ``GAP_BYTES``,
   split at ``PIECE_BYTES``, ``WORKERS`` requests at a time over kept-alive connections); kept as
   ``members/<wheel file stem>.<sha256>.zip``;
4. where the index answers a range request with the whole file (200), the whole wheel, downloaded into the
   wheel cache and checked against the index's sha256, with one line on stderr saying so; where the index lists
   no wheel of the release for this interpreter (or is no http(s) index), pip's download as before
   (``wheels.fetch_wheel``), whose errors name the nearest versions or the unreachable index.

The kept file is a zip: the members' bytes as the wheel holds them (local header and compressed data, copied, not
recompressed) behind a central directory of their own, plus ``LISTING``: the whole wheel's archive paths with
where each lies in the wheel, its compression, size and CRC-32, and the wheel's URL, size and sha256.
``WheelMembers`` reads it: ``namelist`` is the whole wheel's (a compiled ``vllm/_C.abi3.so`` exists for the
import drift), ``read`` a kept member, or one not kept (none of today's readers asks for one) of at most
``ON_DEMAND_MAX_BYTES`` by one ranged request of its bytes, online; offline, or larger, such a read answers None.
A release's bytes never change under their sha256, so kept members are good for ever (a file written under another
``MEMBERS_FORMAT``, its zip comment says which, is read again); the file's name carries the sha256, which is what
the fact cache keys a pair on (``fact_cache.content_id``), whichever way the wheel was read.

Stdlib and ``packaging`` only (both load in ``check`` alone, never in a worker). conda-package-streaming's
``lazy_wheel`` (pip's ``LazyZipOverHTTP``) was measured against this (``bench/member_reads.py``): it fetches on
each read, so a member at a time costs a request at a time.
"""

from __future__ import annotations

import bisect
import contextlib
import json
import os
import re
import struct
import sys
import tempfile
import threading
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from .source_tree import SourceTree
from .wheel_listing import TIMEOUT_S, ListingError, RemoteWheel, _Fetcher, _RemoteTail
from .wheels import WheelError, cache_dir, cached_wheel, file_prefix

MEMBERS_FORMAT = 1  # bump when the kept file's shape or ``is_source_member`` changes: kept files are read again
_COMMENT = f"vllm-compat members {MEMBERS_FORMAT}".encode()  # the kept file's zip comment
LISTING = ".vllm-compat-listing.json"  # the kept file's own member: the whole wheel's listing
GAP_BYTES = 64 << 10  # neighbouring members this close are fetched in one request, the gap with them
PIECE_BYTES = 2 << 20  # a request asks for at most this much (more when one member is larger), so they overlap
WORKERS = 8  # requests at a time, each thread over its own kept-alive connection (``wheel_listing._connection``)
DEFAULT_INDEX = "https://pypi.org/simple/"
ON_DEMAND_MAX_BYTES = 1 << 20  # a member not kept is fetched when read only up to this size (no compiled library)
READ_MEMBERS = True  # False: download whole wheels through pip, as before (bench/member_reads.py's baseline)
_STORE_NAME = re.compile(r"^(?P<stem>.+)\.(?P<sha256>[0-9a-f]{64})\.zip$")

# What this process fetched: bytes and requests of range reads, whole downloads, seconds (the bench prints them)
STATS = {"range_bytes": 0, "range_requests": 0, "whole_bytes": 0, "wheels": [], "seconds": 0.0}


def is_source_member(name: str) -> bool:
    """What the scans read: Python sources (``.py``, ``.pyi``) and every file of a top-level ``*.dist-info``."""
    return name.endswith((".py", ".pyi")) or name.split("/", 1)[0].endswith(".dist-info") and not name.endswith("/")


def members_dir(directory: Path | None = None) -> Path:
    """Where kept members are: ``members/`` in ``directory`` (default: the check's wheel cache)."""
    return (cache_dir() if directory is None else Path(directory)) / "members"


def origin_sha256(path) -> str | None:
    """The sha256 of the wheel a kept members file was read from (its name says it); None for any other file."""
    path = Path(path)
    match = _STORE_NAME.match(path.name)
    return match.group("sha256") if match and path.parent.name == "members" else None


# ------------------------------------------------------------------------------------------------ the index


def index_url(environ=None) -> str:
    """pip's index-url: ``PIP_INDEX_URL``, else the ``[download]`` or ``[global]`` ``index-url`` of pip's config
    files (``PIP_CONFIG_FILE`` set to ``os.devnull`` reads none), else PyPI."""
    import configparser

    environ = os.environ if environ is None else environ
    if environ.get("PIP_INDEX_URL"):
        return environ["PIP_INDEX_URL"]
    chosen = environ.get("PIP_CONFIG_FILE")
    if chosen == os.devnull:
        return DEFAULT_INDEX
    home = os.path.expanduser("~")
    config_home = environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    files = ["/etc/xdg/pip/pip.conf", "/etc/pip.conf", os.path.join(home, ".pip", "pip.conf"),
             os.path.join(config_home, "pip", "pip.conf"), os.path.join(sys.prefix, "pip.conf")]
    parser = configparser.RawConfigParser()
    try:
        parser.read([*files, *([chosen] if chosen else [])])
    except (configparser.Error, UnicodeDecodeError):
        return DEFAULT_INDEX
    for section in ("download", "global"):
        if parser.has_option(section, "index-url"):
            return parser.get(section, "index-url").strip() or DEFAULT_INDEX
    return DEFAULT_INDEX


_PAGES: dict = {}  # (index, project) -> the files the project page lists, once per process (plan asks eleven times)


def _timeout() -> float:
    try:
        return min(float(os.environ.get("PIP_DEFAULT_TIMEOUT") or TIMEOUT_S), TIMEOUT_S)
    except ValueError:
        return TIMEOUT_S


def _project_files(index: str, project: str) -> list[dict] | None:
    """``[{filename, url, sha256, size, requires_python, yanked}]`` of ``project`` on ``index``; None when the
    index answers no such page (an HTTP error: no such project, or credentials only pip has) or neither JSON nor
    HTML. Raises ``WheelError`` ("no_network") when the index cannot be reached at all."""
    import urllib.error
    import urllib.parse
    import urllib.request

    key = (index, project)
    if key in _PAGES:
        return _PAGES[key]
    url = index.rstrip("/") + f"/{project}/"
    request = urllib.request.Request(url, headers={
        "Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1", "User-Agent": "vllm-compat"})
    try:
        with urllib.request.urlopen(request, timeout=_timeout()) as response:
            kind, body, final = response.headers.get("Content-Type", ""), response.read(), response.geturl()
    except urllib.error.HTTPError:  # 404: no such project; 401 / 403 / 5xx: pip, with its credentials, asks
        _PAGES[key] = None
        return None
    except (urllib.error.URLError, OSError) as exc:
        raise WheelError("no_network", f"Could not reach the package index ({index}) to read {project}'s files: "
                                       f"{getattr(exc, 'reason', exc)}. For offline use pass wheel files or "
                                       "unpacked trees instead of NAME==VERSION.") from exc
    if "json" in kind:
        files = [{"filename": f.get("filename", ""), "url": urllib.parse.urljoin(final, f.get("url", "")),
                  "sha256": (f.get("hashes") or {}).get("sha256"), "size": f.get("size"),
                  "requires_python": f.get("requires-python"), "yanked": bool(f.get("yanked"))}
                 for f in json.loads(body).get("files", [])]
    elif "html" in kind:
        files = _html_files(body.decode("utf-8", "replace"), final)
    else:
        files = None
    _PAGES[key] = files
    return files


def _html_files(text: str, base: str) -> list[dict]:
    """The anchors of a PEP 503 project page: file name, URL, ``#sha256=`` and ``data-requires-python``."""
    import html
    import urllib.parse

    files = []
    for attrs, name in re.findall(r"<a\s([^>]*)>([^<]*)</a>", text, re.I):
        href = re.search(r'href\s*=\s*"([^"]*)"', attrs, re.I)
        if not href:
            continue
        url, _, fragment = html.unescape(href.group(1)).partition("#")
        python = re.search(r'data-requires-python\s*=\s*"([^"]*)"', attrs, re.I)
        files.append({"filename": html.unescape(name).strip(), "url": urllib.parse.urljoin(base, url),
                      "sha256": fragment[len("sha256="):] if fragment.startswith("sha256=") else None,
                      "size": None, "requires_python": html.unescape(python.group(1)) if python else None,
                      "yanked": "data-yanked" in attrs})
    return files


def _tag_rank():
    from packaging.tags import sys_tags

    return {tag: i for i, tag in enumerate(sys_tags())}


def _wheel_rank(filename: str, version: str, rank: dict) -> int | None:
    """The rank of the wheel ``filename`` for this interpreter at ``version`` (lower is better), None when it is
    not a wheel of that version for this interpreter."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    from .wheels import _same_version

    try:
        _, found, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    if not _same_version(str(found), version):
        return None
    best = min((rank.get(tag, len(rank)) for tag in tags), default=len(rank))
    return best if best < len(rank) else None


def _python_ok(requires: str | None) -> bool:
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    if not requires:
        return True
    try:
        return SpecifierSet(requires).contains(".".join(map(str, sys.version_info[:3])), prereleases=True)
    except InvalidSpecifier:
        return True  # pip ignores a Requires-Python it cannot parse


def find_release(distribution: str, version: str, index: str | None = None) -> RemoteWheel | None:
    """The wheel of ``distribution==version`` an installer picks here from ``index`` (pip's index-url): the best
    tag, ``Requires-Python`` honoured, a yanked file only when nothing else is; None when the index lists none
    (or is no http(s) index, or answers neither PEP 691 JSON nor PEP 503 HTML). Raises ``WheelError``
    ("no_network") when the index cannot be reached."""
    from packaging.utils import canonicalize_name

    index = index_url() if index is None else index
    if not index.startswith(("http://", "https://")):
        return None
    files = _project_files(index, canonicalize_name(distribution))
    rank = _tag_rank()
    best, best_key = None, None
    for item in files or ():
        name = item["filename"]
        score = _wheel_rank(name, version, rank) if name.endswith(".whl") else None
        if score is None or not _python_ok(item["requires_python"]) or not item["url"]:
            continue
        key = (item["yanked"], score)
        if best_key is None or key < best_key:
            best, best_key = item, key
    if best is None:
        return None
    return RemoteWheel(canonicalize_name(distribution), version, best["url"], best["sha256"], best["size"])


def index_versions(distribution: str, index: str | None = None) -> list[str] | None:
    """The final releases of ``distribution`` (no pre- or dev release, as ``pip index versions`` lists them; post
    releases kept) with a wheel for this interpreter on ``index`` (a file not yanked, ``Requires-Python``
    honoured), newest first; None when the index is no http(s) index or has no page for it (pip is asked then).
    Raises ``WheelError`` ("no_network") when the index cannot be reached."""
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
    from packaging.version import Version

    index = index_url() if index is None else index
    if not index.startswith(("http://", "https://")):
        return None
    files = _project_files(index, canonicalize_name(distribution))
    if files is None:
        return None
    rank, found = _tag_rank(), {}
    for item in files:
        name = item["filename"]
        if not name.endswith(".whl") or item["yanked"] or not _python_ok(item["requires_python"]):
            continue
        try:
            _, version, _, tags = parse_wheel_filename(name)
        except InvalidWheelFilename:
            continue
        if not (version.is_prerelease or version.is_devrelease) and any(tag in rank for tag in tags):
            found.setdefault(Version(str(version)), str(version))
    return [found[v] for v in sorted(found, reverse=True)]


# ------------------------------------------------------------------------------------------------ the store


def stored_release(distribution: str, version: str, directory: Path | None = None) -> Path | None:
    """The kept members of ``distribution==version`` for this interpreter (the best tag, as ``find_release``
    picks), or None. Reads file names only."""
    folder = members_dir(directory)
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    prefix, rank = file_prefix(distribution) + "-", None
    best, best_score = None, None
    for name in names:
        match = _STORE_NAME.match(name)
        if not (match and name.startswith(prefix)):
            continue
        rank = _tag_rank() if rank is None else rank
        score = _wheel_rank(match.group("stem") + ".whl", version, rank)
        if score is not None and (best_score is None or score < best_score):
            best, best_score = folder / name, score
    return best


class WheelMembers(SourceTree):
    """A wheel of which the source members are kept (the module docstring): ``read`` answers from them, and
    ``namelist`` / ``list_dir`` / ``walk_py`` from the whole wheel's listing, loaded on first use."""

    def __init__(self, root: Path):
        super().__init__(root)
        self._listing: dict | None = None
        self._rows: dict | None = None
        self._stored = set(self._zip.namelist())

    @property
    def listing(self) -> dict:
        """``LISTING``: ``{"format", "wheel", "url", "sha256", "size", "members": [[name, start, end, method,
        compressed size, CRC-32], ...]}`` (start and end: where its local header and data lie in the wheel)."""
        if self._listing is None:
            self._listing = json.loads(self._zip.read(LISTING))
        return self._listing

    @property
    def sha256(self) -> str | None:
        return origin_sha256(self.root)

    @property
    def is_current(self) -> bool:
        """Whether this file was written under this ``MEMBERS_FORMAT`` (its zip comment)."""
        return self._zip.comment == _COMMENT

    def namelist(self) -> list[str]:
        return [row[0] for row in self.listing["members"]]

    def list_dir(self, reldir: str) -> list[str]:
        return sorted(n for n in self.namelist() if n.startswith(reldir) and "/" not in n[len(reldir):])

    def walk_py(self, package: str) -> list[str]:
        return sorted(n for n in self.namelist() if n.startswith(f"{package}/") and n.endswith(".py"))

    def read(self, relpath: str) -> str | None:
        if relpath in self._stored and relpath != LISTING:
            return super().read(relpath)
        if self._rows is None:
            self._rows = {row[0]: row for row in self.listing["members"]}
        row = self._rows.get(relpath)
        if row is None or relpath.endswith("/") or row[4] > ON_DEMAND_MAX_BYTES:
            return None
        data = _fetch_member(self.listing["url"], row)
        try:
            return data.decode("utf-8") if data is not None else None
        except UnicodeDecodeError:
            return None


def _fetch_member(url: str, row: list) -> bytes | None:
    """A member not kept, by one ranged request of its bytes in the wheel; None offline, or when its bytes do not
    check out (local header, compression, CRC-32)."""
    _, start, end, method, size, crc = row
    raw = _member_bytes(url, start, end)
    return _decode(raw, method, size, crc) if raw is not None else None


def _member_bytes(url: str, start: int, end: int) -> bytes | None:
    """Bytes ``start`` to ``end`` (exclusive) of the file at ``url`` by one range request; None when it fails."""
    fetcher = _Fetcher(url, _timeout())
    try:
        raw, _ = fetcher(start, end - 1)
    except ListingError:
        return None
    finally:
        _count(fetcher)
    return None if fetcher.ignored_range else raw


def _decode(raw: bytes, method: int, size: int, crc: int) -> bytes | None:
    """A member's data from its local header and compressed bytes; None when they do not check out."""
    if raw[:4] != zipfile.stringFileHeader or len(raw) < 30:
        return None
    name_len, extra_len = struct.unpack("<2H", raw[26:30])
    body = raw[30 + name_len + extra_len:][:size]
    try:
        if method == zipfile.ZIP_STORED:
            data = body
        else:
            data = zlib.decompress(body, -15) if method == zipfile.ZIP_DEFLATED else None
    except zlib.error:
        return None
    return data if data is not None and zlib.crc32(data) == crc else None


# ------------------------------------------------------------------------------------------------ METADATA alone


def wheel_metadata(wheel: RemoteWheel) -> str | None:
    """The ``*.dist-info/METADATA`` text of ``wheel`` by range requests: its central directory (the tail, which
    usually holds METADATA too), then that member's bytes; None when the wheel cannot be read so (the server sends
    whole files, no METADATA, bytes that do not check out)."""
    fetcher = _Fetcher(wheel.url, _timeout())
    try:
        tail = _RemoteTail(fetcher)
        if fetcher.ignored_range:
            return None
        with zipfile.ZipFile(tail) as archive:
            infos = sorted(archive.infolist(), key=lambda i: i.header_offset)
            directory_start = archive.start_dir
    except (ListingError, zipfile.BadZipFile):
        return None
    finally:
        _count(fetcher)
    ends = [i.header_offset for i in infos[1:]] + [directory_start]
    for info, end in zip(infos, ends, strict=True):
        top, _, rest = info.filename.partition("/")
        if top.endswith(".dist-info") and rest == "METADATA":
            if info.header_offset >= tail._start:
                raw = tail._data[info.header_offset - tail._start:end - tail._start]
            else:
                raw = _member_bytes(wheel.url, info.header_offset, end)
            data = _decode(raw, info.compress_type, info.compress_size, info.CRC) if raw else None
            try:
                return data.decode("utf-8") if data is not None else None
            except UnicodeDecodeError:
                return None
    return None


def pinned_metadata(pins: dict[str, str]) -> dict[str, str]:
    """``{package: METADATA text}`` of each exact release in ``pins`` ({package: version}) whose wheel for this
    interpreter the index lists and serves by ranges (``find_release``, ``wheel_metadata``), ``WORKERS`` at a
    time: a few KiB each, where pip's dry run downloads the whole wheel from an index that serves no PEP 658
    metadata. The rest are left out (the caller asks pip); an unreachable index leaves all out."""

    def one(item):
        package, version = item
        try:
            wheel = find_release(package, version)
        except WheelError:
            return package, None
        return package, wheel_metadata(wheel) if wheel is not None else None

    if not pins:
        return {}
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(WORKERS, len(pins)))) as pool:
        return {package: text for package, text in pool.map(one, pins.items()) if text is not None}


# ------------------------------------------------------------------------------------------------ reading


class RangesUnsupported(Exception):
    """The server answered a range request with the whole file: read the wheel whole instead."""


_STATS_LOCK = threading.Lock()


def _count(fetcher: _Fetcher) -> None:
    with _STATS_LOCK:  # worker threads count too
        STATS["range_bytes"] += fetcher.bytes
        STATS["range_requests"] += fetcher.requests


def plan_ranges(spans: list[tuple[int, int]], gap: int = GAP_BYTES,
                piece: int = PIECE_BYTES) -> list[tuple[int, int]]:
    """``[(first, end)]`` byte ranges (end exclusive) covering ``spans`` (sorted, not overlapping): neighbours
    joined when at most ``gap`` bytes lie between them, a range closed once it holds ``piece`` bytes."""
    ranges: list[list[int]] = []
    for first, end in spans:
        if ranges and first - ranges[-1][1] <= gap and ranges[-1][1] - ranges[-1][0] < piece:
            ranges[-1][1] = end
        else:
            ranges.append([first, end])
    return [(a, b) for a, b in ranges]


@contextlib.contextmanager
def _ranged(fetcher):
    """Reads with ``fetcher``: ``RangesUnsupported`` where the server ignored a range (it sends whole files), the
    bytes and requests counted either way."""
    try:
        yield fetcher
    except ListingError:
        if fetcher.ignored_range:
            raise RangesUnsupported() from None
        raise
    finally:
        _count(fetcher)
    if fetcher.ignored_range:
        raise RangesUnsupported()


def _fetch_ranges(url: str, ranges: list[tuple[int, int]], total: int, held: tuple[int, bytes]) -> dict:
    """``{first: bytes}`` of each range, ``WORKERS`` at a time; what ``held`` (``(start, bytes)``: the tail
    already read) covers is not asked again. Raises ``RangesUnsupported`` or ``ListingError``."""
    held_start, held_data = held

    def one(item):
        first, end = item
        if first >= held_start:
            return first, held_data[first - held_start:end - held_start]
        with _ranged(_Fetcher(url, _timeout())) as fetcher:
            data, size = fetcher(first, end - 1)
        if size != total or len(data) != end - first:
            raise ListingError(f"the server answered {len(data)} bytes of {size} for bytes {first}-{end - 1} of a "
                               f"{total}-byte file")
        return first, data

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(WORKERS, len(ranges)))) as pool:
        return dict(pool.map(one, ranges))


def read_members(wheel: RemoteWheel, directory: Path | None = None) -> Path:
    """Read ``wheel``'s source members (``is_source_member``) by range requests and keep them (the module
    docstring); returns the kept file. Raises ``RangesUnsupported`` (the server sends whole files) or
    ``ListingError`` (the wheel could not be read: its message says why)."""
    started, before = time.perf_counter(), (STATS["range_bytes"], STATS["range_requests"])
    try:
        with _ranged(_Fetcher(wheel.url, _timeout())) as fetcher:
            tail = _RemoteTail(fetcher)
            if fetcher.ignored_range:
                raise RangesUnsupported()
            if wheel.size is not None and tail.size != wheel.size:
                raise ListingError(f"{wheel.filename} is {tail.size} bytes on the server, {wheel.size} on the index")
            with zipfile.ZipFile(tail) as archive:
                infos = sorted(archive.infolist(), key=lambda i: i.header_offset)
                directory_start = archive.start_dir
    except zipfile.BadZipFile as exc:
        raise ListingError(f"{wheel.filename} is not a zip file ({exc})") from exc
    ends = [i.header_offset for i in infos[1:]] + [directory_start]
    rows = [[i.filename, i.header_offset, end, i.compress_type, i.compress_size, i.CRC]
            for i, end in zip(infos, ends, strict=True)]
    wanted = [(info, end) for info, end in zip(infos, ends, strict=True) if is_source_member(info.filename)]
    ranges = plan_ranges([(info.header_offset, end) for info, end in wanted])
    got = _fetch_ranges(wheel.url, ranges, tail.size, (tail._start, tail._data))
    firsts = sorted(got)
    members = []
    for info, end in wanted:
        first = firsts[bisect.bisect_right(firsts, info.header_offset) - 1]
        members.append((info, got[first][info.header_offset - first:end - first]))
    listing = {"format": MEMBERS_FORMAT, "wheel": wheel.filename, "url": wheel.url, "sha256": wheel.sha256,
               "size": tail.size, "members": rows}
    target = store_path(wheel, tail.size, directory)
    _write_store(target, members, json.dumps(listing, separators=(",", ":")).encode())
    STATS["wheels"].append({"wheel": wheel.filename, "members": len(members), "size": tail.size,
                            "bytes": STATS["range_bytes"] - before[0],
                            "requests": STATS["range_requests"] - before[1],
                            "seconds": round(time.perf_counter() - started, 3)})
    STATS["seconds"] += time.perf_counter() - started
    return target


def store_path(wheel: RemoteWheel, size: int | None = None, directory: Path | None = None) -> Path:
    """Where ``wheel``'s members are kept: ``members/<file stem>.<sha256>.zip`` (an index that gives no sha256, a
    PEP 503 page without ``#sha256=``: one of its URL and ``size`` stands in)."""
    import hashlib

    stand_in = f"{wheel.url}\n{size if size is not None else wheel.size}"
    sha256 = wheel.sha256 or hashlib.sha256(stand_in.encode()).hexdigest()
    stem = wheel.filename[:-len(".whl")] if wheel.filename.endswith(".whl") else wheel.filename
    return members_dir(directory) / f"{stem}.{sha256.lower()}.zip"


def members_for(wheel: RemoteWheel, directory: Path | None = None) -> Path:
    """``wheel``'s kept members: the file kept under its sha256, else ``read_members`` (a wheel whose sha256
    changed on the index is read again, under its new sha256)."""
    kept = store_path(wheel, directory=directory)
    if wheel.sha256 and kept.is_file():
        try:
            if WheelMembers(kept).is_current:
                return kept
        except (OSError, zipfile.BadZipFile):
            pass  # damaged: read again
    return read_members(wheel, directory)


def _dos_time(date_time) -> tuple[int, int]:
    y, mo, d, h, mi, s = date_time
    return (h << 11) | (mi << 5) | (s // 2), ((max(y, 1980) - 1980) << 9) | (mo << 5) | d


def _without_zip64(extra: bytes) -> bytes:
    """``extra`` less its zip64 field (0x0001): the kept file's offsets and sizes fit 32 bits."""
    kept, at = b"", 0
    while at + 4 <= len(extra):
        kind, size = struct.unpack("<2H", extra[at:at + 4])
        if kind != 0x0001:
            kept += extra[at:at + 4 + size]
        at += 4 + size
    return kept


def _central_record(info: zipfile.ZipInfo, offset: int, name: bytes) -> bytes:
    time_, date = _dos_time(info.date_time)
    extra = _without_zip64(info.extra)
    return struct.pack(zipfile.structCentralDir, zipfile.stringCentralDir, info.create_version, info.create_system,
                       info.extract_version, info.reserved, info.flag_bits, info.compress_type, time_, date,
                       info.CRC, info.compress_size, info.file_size, len(name), len(extra), len(info.comment), 0,
                       info.internal_attr, info.external_attr, offset) + name + extra + info.comment


def _write_store(target: Path, members: list, listing: bytes) -> None:
    """Write the kept file: each member's bytes as the wheel holds them, ``LISTING`` (deflated), a central
    directory; atomically (a concurrent check never reads half a file)."""
    own = zipfile.ZipInfo(LISTING, (2026, 1, 1, 0, 0, 0))
    own.compress_type, own.CRC, own.file_size = zipfile.ZIP_DEFLATED, zlib.crc32(listing), len(listing)
    packer = zlib.compressobj(6, zlib.DEFLATED, -15)
    body = packer.compress(listing) + packer.flush()
    own.compress_size = len(body)
    time_, date = _dos_time(own.date_time)
    own_header = struct.pack(zipfile.structFileHeader, zipfile.stringFileHeader, 20, 0, 0, own.compress_type, time_,
                             date, own.CRC, own.compress_size, own.file_size, len(LISTING), 0) + LISTING.encode()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".partial-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            central = []
            for info, raw in members:
                if raw[:4] != zipfile.stringFileHeader:
                    raise ListingError(f"no local header at {info.filename}'s offset: the wheel changed under "
                                       "its URL, or the server sent other bytes")
                name = raw[30:30 + struct.unpack("<H", raw[26:28])[0]]
                central.append(_central_record(info, out.tell(), name))
                out.write(raw)
            central.append(_central_record(own, out.tell(), LISTING.encode()))
            out.write(own_header + body)
            start, records = out.tell(), b"".join(central)
            out.write(records)
            count, end = len(central), out.tell()
            if count >= 0xFFFF or end >= 0xFFFFFFFF:  # zip64 end records, as zipfile writes them
                out.write(struct.pack(zipfile.structEndArchive64, zipfile.stringEndArchive64, 44, 45, 45, 0, 0,
                                      count, count, len(records), start))
                out.write(struct.pack(zipfile.structEndArchive64Locator, zipfile.stringEndArchive64Locator, 0, end,
                                      1))
            out.write(struct.pack(zipfile.structEndArchive, zipfile.stringEndArchive, 0, 0, min(count, 0xFFFF),
                                  min(count, 0xFFFF), min(len(records), 0xFFFFFFFF), min(start, 0xFFFFFFFF),
                                  len(_COMMENT)) + _COMMENT)
        os.chmod(partial, 0o644)  # as a downloaded wheel (mkstemp makes it 0600)
        os.replace(partial, target)
    except BaseException:
        try:
            os.unlink(partial)
        except OSError:
            pass
        raise


def download_whole(wheel: RemoteWheel, directory: Path | None = None) -> Path:
    """``wheel`` downloaded whole into the wheel cache (streamed to a private file, checked against its sha256,
    renamed into place). Raises ``WheelError``."""
    import hashlib
    import urllib.error
    import urllib.request

    folder = cache_dir() if directory is None else Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".partial-", suffix=".whl", dir=folder)
    digest, size = hashlib.sha256(), 0
    try:
        request = urllib.request.Request(wheel.url, headers={"User-Agent": "vllm-compat"})
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(request, timeout=_timeout()) as response:
            while chunk := response.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
        if wheel.sha256 and digest.hexdigest() != wheel.sha256:
            raise WheelError("pip_failed", f"{wheel.filename} downloaded from {wheel.url} has sha256 "
                                           f"{digest.hexdigest()}, the index says {wheel.sha256}; not kept.")
        target = folder / wheel.filename
        os.replace(partial, target)
        return target
    except (urllib.error.URLError, OSError) as exc:
        raise WheelError("no_network", f"Could not download {wheel.url}: {getattr(exc, 'reason', exc)}. For "
                                       "offline use pass wheel files or unpacked trees instead.") from exc
    finally:
        STATS["whole_bytes"] += size
        if os.path.exists(partial):
            os.unlink(partial)


@dataclass(frozen=True)
class Release:
    """A release's files for ``check``: the tree, ``source`` ("cache" | "downloaded") and ``location`` (the file
    read: a kept members file or a whole wheel)."""

    tree: SourceTree
    source: str
    location: str


def open_release(distribution: str, version: str, fetch: bool = True,
                 directory: Path | None = None) -> Release | None:
    """``distribution==version`` as the module docstring says, from the cache first; with ``fetch`` False only
    from the cache (None when it is not there). Raises ``WheelError`` (the index unreachable, no such version,
    a wheel that cannot be read)."""
    from .wheels import fetch_wheel

    folder = cache_dir() if directory is None else Path(directory)
    whole = cached_wheel(distribution, version, folder)
    if whole is not None:
        return Release(SourceTree(whole), "cache", str(whole))
    kept = stored_release(distribution, version, folder)
    if kept is not None:
        try:
            tree = WheelMembers(kept)
            if tree.is_current:
                return Release(tree, "cache", str(kept))
        except (OSError, zipfile.BadZipFile):
            pass  # a damaged file, or one of another format: read again below
    if not fetch:
        return None
    remote = find_release(distribution, version) if READ_MEMBERS else None
    if remote is None:  # not on an http(s) index as a wheel for here: pip finds it elsewhere, or says why not
        path, _ = fetch_wheel(distribution, version, folder)
        return Release(SourceTree(path), "downloaded", str(path))
    try:
        path = members_for(remote, folder)
    except RangesUnsupported:
        host = remote.url.split("/")[2] if "//" in remote.url else remote.url
        size = f"{remote.size / 1e6:.0f} MB" if remote.size else "size unknown"
        print(f"vllm-compat: {host} answers no range request; downloading the whole {remote.filename} ({size}).",
              file=sys.stderr)
        path = download_whole(remote, folder)
        return Release(SourceTree(path), "downloaded", str(path))
    except ListingError as exc:
        raise WheelError("no_network", f"Could not read {remote.filename} from {remote.url}: {exc}. For offline "
                                       "use pass wheel files or unpacked trees instead.") from exc
    return Release(WheelMembers(path), "downloaded", str(path))
