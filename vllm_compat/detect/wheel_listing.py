"""The file listing of a wheel on an index, read without downloading it: HTTP range requests on the zip's end.

A wheel is a zip whose central directory, at the end of the file, lists every archive path with its CRC-32 and
size. ``zipfile`` reads exactly that when it opens an archive: the end-of-central-directory record (the last 22
bytes, or up to 64 KiB further back when the zip has a comment; a zip64 locator just before it), then the central
directory in one read. ``_RemoteTail`` is the file object it reads through: the first read fetches the last
``TAIL_BYTES`` with a suffix range (``Range: bytes=-N``, whose ``Content-Range`` also says the file's size), a read
before what is held fetches the bytes up to it, so a listing costs one request (177 of the 227 wheels of vLLM
0.33.0 + vllm-omni 0.24.0: their central directory fits in 8 KiB) or two (torch's is 1.2 MB). A 64 KiB tail
saved 36 of 277 requests and fetched 17.5 MB instead of 8.2 (2026-12-05). files.pythonhosted.org answers ``Range:`` with 206
(measured 2026-12-05); a server answering 200 (the whole file) is read to the end only up to ``WHOLE_MAX_BYTES``,
otherwise the listing fails with that reason.

Listings are kept on disk per wheel sha256 (``listing_dir``: ``listings/`` in the check's wheel cache,
``detect.wheels.cache_dir``): a release's bytes never change under its hash, so a cached listing is good forever.
What is kept is the raw archive paths with their CRC-32; the rules of what counts as a file and where it lands
(``detect.file_owners.wheel_path_key``) are applied by the clash finder, so changing them needs no new fetch.

``list_wheels`` reads many at once on a thread pool (``WORKERS``), each thread over its own kept-alive connection
(a urllib request per range, a DNS lookup and TLS handshake each, took 9-25 s for the same 227 wheels, and at 32
threads this machine's resolver failed some lookups); each failure is the wheel's own (``errors``), never the
call's.
"""

from __future__ import annotations

import functools
import io
import json
import os
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

TAIL_BYTES = 8 << 10  # the first fetch: the end record, and the whole central directory of most wheels
MAX_DIRECTORY_BYTES = 64 << 20  # a central directory larger than this is no wheel we read
WHOLE_MAX_BYTES = 8 << 20  # a server ignoring Range: read the whole file only up to this size
WORKERS = 8  # 8, 16, 32 threads: 0.8, 1.0, 1.3 s for vLLM 0.33.0's 227 wheels here (2 cores)
TIMEOUT_S = 60
LISTING_FORMAT = 1  # bump when the cached file's shape changes


class ListingError(Exception):
    """A wheel's listing could not be read; the message says why (HTTP status, no range support, not a zip)."""


@dataclass(frozen=True)
class RemoteWheel:
    """One wheel on an index: its distribution name (canonical), version, URL, and where known its sha256 and
    size (a pylock.toml gives both)."""

    name: str
    version: str
    url: str
    sha256: str | None = None
    size: int | None = None

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1].split("#", 1)[0]

    def to_dict(self) -> dict:
        return {"name": self.name, "version": self.version, "url": self.url, "sha256": self.sha256,
                "size": self.size}


@dataclass(frozen=True)
class WheelListing:
    """A wheel's archive paths with their CRC-32 (``files``), and what reading it cost now: bytes and requests
    (0 and 0 from the cache)."""

    wheel: RemoteWheel
    files: dict  # {archive path: CRC-32}
    fetched_bytes: int = 0
    requests: int = 0

    @property
    def cached(self) -> bool:
        return self.requests == 0


class _RemoteTail(io.RawIOBase):
    """A read-only, seekable view of a remote file of which only the end is fetched (see the module docstring).
    ``fetch(first, last)`` returns ``(bytes, total size)``: ``first`` None asks for the last ``last`` bytes."""

    def __init__(self, fetch):
        super().__init__()
        self._fetch = fetch
        self._data, total = fetch(None, TAIL_BYTES)
        self.size = total
        self._start = total - len(self._data)  # the file offset of self._data[0]
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self.size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def read(self, size: int = -1) -> bytes:
        end = self.size if size is None or size < 0 else min(self.size, self._pos + size)
        if self._pos >= end:
            return b""
        if self._pos < self._start:  # before what is held: fetch up to it, so what is held stays one run
            if self.size - self._pos > MAX_DIRECTORY_BYTES:
                raise ListingError(f"the zip's central directory would start {self.size - self._pos} bytes before "
                                   f"its end (more than {MAX_DIRECTORY_BYTES}); not read")
            more, _ = self._fetch(self._pos, self._start - 1)
            self._data, self._start = more + self._data, self._pos
        data = self._data[self._pos - self._start:end - self._start]
        self._pos += len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


_local = threading.local()  # each worker thread's open connections, {(scheme, host, port): connection}


@functools.cache
def _tls_context():
    """One TLS context for every thread: each loads the system's CA store, ~70 ms of CPU (a first check opened
    one per worker thread: 2.4 s of CPU beside its scan)."""
    import ssl

    return ssl.create_default_context()


def _connection(scheme: str, host: str, port: int | None, timeout: float):
    """This thread's kept-alive connection to ``host`` (one DNS lookup and TLS handshake per thread and host, not
    per request: at 32 threads a lookup per request made this machine's resolver fail, 2026-12-05)."""
    import http.client

    pool = _local.__dict__.setdefault("pool", {})
    key = (scheme, host, port)
    if key not in pool:
        if scheme == "https":
            pool[key] = http.client.HTTPSConnection(host, port, timeout=timeout, context=_tls_context())
        else:
            pool[key] = http.client.HTTPConnection(host, port, timeout=timeout)
    return pool[key]


def _drop(scheme: str, host: str, port: int | None) -> None:
    connection = _local.__dict__.get("pool", {}).pop((scheme, host, port), None)
    if connection is not None:
        connection.close()


class _Fetcher:
    """HTTP range reads of one URL, counting requests and bytes: over this thread's kept-alive connection
    (``http.client``, the system's CA store), or through urllib where a proxy is configured (it honours the
    proxy variables). A request that fails to connect (a dropped keep-alive connection, a DNS lookup that failed
    for now) is tried again, ``ATTEMPTS`` times in all; redirects are followed."""

    ATTEMPTS = 3

    def __init__(self, url: str, timeout: float = TIMEOUT_S):
        self.url, self.timeout = url, timeout
        self.requests = self.bytes = 0
        self.ignored_range = False  # the server answered a range request with the whole file (200)

    def __call__(self, first: int | None, last: int) -> tuple[bytes, int]:
        ask = f"bytes=-{last}" if first is None else f"bytes={first}-{last}"
        self.requests += 1
        status, headers, body = self._get(self.url, ask)
        if status == 206:
            data = body(None)
            total = _total(headers.get("Content-Range"))
            if total is None:
                raise ListingError(f"206 without a Content-Range total ({headers.get('Content-Range')!r})")
        elif status == 200:  # the server ignores Range: the whole file, if it is small
            self.ignored_range = True
            length = int(headers.get("Content-Length") or 0)
            if not length or length > WHOLE_MAX_BYTES:
                body(0)
                raise ListingError(f"the server ignores Range requests (200 for {ask!r}) and the file is "
                                   f"{length or 'of unknown size'} bytes; not downloaded")
            data = body(None)
            total = len(data)
            data = data[-last:] if first is None else data[first:last + 1]
        else:
            body(0)
            raise ListingError(f"HTTP {status} for {ask!r}")
        self.bytes += len(data)
        return data, total

    def _get(self, url: str, ask: str, redirects: int = 5):
        """``(status, headers, body)``: ``body(None)`` reads the response, ``body(0)`` abandons it."""
        import urllib.parse
        import urllib.request  # here, not at import: a warm check reads kept files and fetches nothing (~40 ms)

        headers = {"Range": ask, "User-Agent": "vllm-compat"}
        parts = urllib.parse.urlsplit(url)
        if urllib.request.getproxies().get(parts.scheme) or parts.scheme not in ("http", "https"):
            return self._get_urllib(url, headers)
        target = parts.path + (f"?{parts.query}" if parts.query else "")
        where = (parts.scheme, parts.hostname, parts.port)
        for attempt in range(self.ATTEMPTS):
            connection = _connection(*where, self.timeout)
            try:
                connection.request("GET", target, headers=headers)
                response = connection.getresponse()
                break
            except OSError as exc:  # and http.client's errors: a closed keep-alive connection, DNS, a reset
                _drop(*where)
                if attempt + 1 == self.ATTEMPTS:
                    raise ListingError(f"could not reach {parts.hostname}: {exc}") from exc
                time.sleep(0.5 * (attempt + 1))
            except Exception as exc:  # noqa: BLE001 - http.client.HTTPException (RemoteDisconnected is an OSError)
                _drop(*where)
                if attempt + 1 == self.ATTEMPTS:
                    raise ListingError(f"could not read from {parts.hostname}: {exc!r}") from exc
        if response.status in (301, 302, 303, 307, 308) and response.getheader("Location") and redirects:
            response.read()
            return self._get(urllib.parse.urljoin(url, response.getheader("Location")), ask, redirects - 1)

        def body(size):
            if size == 0:  # not read: the connection cannot be reused
                _drop(*where)
                return b""
            try:
                return response.read()
            except OSError as exc:
                _drop(*where)
                raise ListingError(f"reading from {parts.hostname} failed: {exc}") from exc

        return response.status, response.headers, body

    def _get_urllib(self, url: str, headers: dict):
        import urllib.error
        import urllib.request

        request = urllib.request.Request(url, headers=headers)
        try:
            response = urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            return exc.code, exc.headers, lambda size: b""
        except (urllib.error.URLError, OSError) as exc:
            raise ListingError(f"could not reach {url.split('/')[2] if '//' in url else url}: "
                               f"{getattr(exc, 'reason', exc)}") from exc

        def body(size):
            with response:
                return b"" if size == 0 else response.read()

        return response.status, response.headers, body


def _total(content_range: str | None) -> int | None:
    """The total of ``bytes a-b/total``; None when absent or ``*``."""
    total = (content_range or "").rpartition("/")[2].strip()
    return int(total) if total.isdigit() else None


def read_listing(url: str, timeout: float = TIMEOUT_S) -> tuple[dict, int, int]:
    """``({archive path: CRC-32}, bytes fetched, requests)`` of the zip at ``url`` (directory entries left out).
    Raises ``ListingError``."""
    fetcher = _Fetcher(url, timeout)
    try:
        with zipfile.ZipFile(_RemoteTail(fetcher)) as archive:
            files = {info.filename: info.CRC for info in archive.infolist() if not info.is_dir()}
    except zipfile.BadZipFile as exc:
        raise ListingError(f"not a zip file ({exc})") from exc
    return files, fetcher.bytes, fetcher.requests


def listing_dir(directory: Path | None = None) -> Path:
    """Where listings are kept: ``listings/`` in ``directory`` (default: the check's wheel cache)."""
    from .wheels import cache_dir

    return (cache_dir() if directory is None else Path(directory)) / "listings"


def _cache_path(wheel: RemoteWheel, directory: Path | None) -> Path:
    import hashlib

    key = wheel.sha256 or "url-" + hashlib.sha256(wheel.url.encode()).hexdigest()
    return listing_dir(directory) / f"{key}.json"


def list_wheel(wheel: RemoteWheel, directory: Path | None = None, timeout: float = TIMEOUT_S) -> WheelListing:
    """``wheel``'s listing from the cache, else read from the index (and kept). Raises ``ListingError``."""
    path = _cache_path(wheel, directory)
    try:
        cached = json.loads(path.read_text())
        if cached.get("format") == LISTING_FORMAT:
            return WheelListing(wheel, dict(cached["files"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    files, fetched, requests = read_listing(wheel.url, timeout)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".partial-", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump({"format": LISTING_FORMAT, "url": wheel.url, "files": sorted(files.items())}, handle,
                  separators=(",", ":"))
    os.replace(partial, path)  # atomic: a concurrent check never reads half a listing
    return WheelListing(wheel, files, fetched, requests)


@dataclass
class Listings:
    """What ``list_wheels`` read: each wheel's listing, the wheels it could not read (``{file name: why}``), and
    the cost (bytes and requests now, listings from the cache, seconds)."""

    listings: list[WheelListing]
    errors: dict[str, str]
    seconds: float

    @property
    def fetched_bytes(self) -> int:
        return sum(item.fetched_bytes for item in self.listings)

    @property
    def requests(self) -> int:
        return sum(item.requests for item in self.listings)

    @property
    def cached(self) -> int:
        return sum(item.cached for item in self.listings)


def list_wheels(wheels: list[RemoteWheel], directory: Path | None = None, workers: int = WORKERS,
                timeout: float = TIMEOUT_S) -> Listings:
    """Every wheel's listing, ``workers`` at a time, in ``wheels``' order."""
    start = time.perf_counter()

    def one(wheel):
        try:
            return list_wheel(wheel, directory, timeout), None
        except ListingError as exc:
            return None, str(exc)

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(wheels) or 1))) as pool:
        results = list(pool.map(one, wheels))
    listings = [listing for listing, _ in results if listing is not None]
    errors = {wheel.filename: why for wheel, (_, why) in zip(wheels, results, strict=True) if why is not None}
    return Listings(listings, errors, time.perf_counter() - start)
