"""Wheel listings read by HTTP range requests (``vllm_compat.detect.wheel_listing``) and the clash finder on them
(``detect.file_owners.find_listing_clashes``), against real zip files written here and served by a real HTTP
server (``http.server`` with Range support, on localhost).

Expected values come from how each wheel is built: the archive paths written, ``zlib.crc32`` of the bytes, the
server's own count of requests and bytes sent; never from the code under test.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
import zipfile
import zlib
from pathlib import Path

import pytest

from tests.support import range_server
from vllm_compat.detect.file_owners import Distribution, find_listing_clashes
from vllm_compat.detect.wheel_listing import (
    TAIL_BYTES,
    WHOLE_MAX_BYTES,
    ListingError,
    RemoteWheel,
    list_wheels,
    listing_dir,
    read_listing,
)

# Two wheels sharing files: a module with other bytes, a module with the same bytes, a script (.data/scripts ->
# bin/), a file alpha installs through .data/purelib and beta at the top level; and what the rules leave out.
ALPHA = {
    "alpha/__init__.py": b"A = 1\n",
    "shared/mod.py": b"print('alpha')\n",
    "shared/same.py": b"SAME = True\n",
    "shared/__pycache__/mod.cpython-311.pyc": b"\x00alpha-pyc",
    "shared/old.pyc": b"\x00old",
    "alpha-1.0.data/scripts/tool": b"#!/bin/sh\necho alpha\n",
    "alpha-1.0.data/purelib/shared/data.txt": b"alpha data\n",
    "alpha-1.0.data/data/share/alpha/readme": b"alpha's own\n",
    "alpha-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: alpha\nVersion: 1.0\n",
    "alpha-1.0.dist-info/RECORD": b"",
}
BETA = {
    "beta/__init__.py": b"B = 2\n",
    "shared/mod.py": b"print('beta')\n",
    "shared/same.py": b"SAME = True\n",
    "shared/__pycache__/mod.cpython-311.pyc": b"\x00beta-pyc",
    "shared/data.txt": b"beta data\n",
    "shared/old.pyc": b"\x00old",
    "beta_pkg-2.0.data/scripts/tool": b"#!/bin/sh\necho beta\n",
    "bin/tool": b"a top-level bin/ in the site directory: not the script\n",
    "beta_pkg-2.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: beta-pkg\nVersion: 2.0\n",
    "beta_pkg-2.0.dist-info/RECORD": b"",
}


def _wheel(path: Path, files: dict, directories=()) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in directories:
            archive.writestr(zipfile.ZipInfo(name), b"")  # a directory entry (name ends in "/")
        for name, data in files.items():
            archive.writestr(name, data)
    return path


class _Server:
    """A real HTTP server for ``root`` on localhost: answers ``Range: bytes=a-b`` and ``bytes=-n`` with 206
    (``ranges``: False answers every request with the whole file, 200); counts requests and body bytes sent."""

    def __init__(self, root: Path, ranges: bool = True):
        self.root, self.ranges, self.requests, self.sent = root, ranges, [], 0
        self.clients = set()  # the client (host, port) of every request: one per connection
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as files.pythonhosted.org

            def do_GET(self):  # noqa: N802 - http.server's name
                path = server.root / self.path.lstrip("/")
                server.requests.append((self.path, self.headers.get("Range")))
                server.clients.add(self.client_address)
                if self.path.startswith("/moved/"):  # a redirect to the file's own path
                    self.send_response(302)
                    self.send_header("Location", "/" + self.path[len("/moved/"):])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if not path.is_file():
                    self.send_error(404)
                    return
                status, headers, body = range_server.answer(path.read_bytes(), self.headers.get("Range"), server.ranges)
                server.sent += len(body)  # counted before the client can have read it
                range_server.send(self, status, headers, body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{name}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "index"
    root.mkdir()
    servers = []

    def serve(ranges: bool = True) -> _Server:
        servers.append(_Server(root, ranges))
        return servers[-1]

    serve.root = root
    yield serve
    for server in servers:
        server.close()


def _remote(server: _Server, name: str, version: str, path: Path) -> RemoteWheel:
    return RemoteWheel(name, version, server.url(path.name), hashlib.sha256(path.read_bytes()).hexdigest(),
                       path.stat().st_size)


def test_a_listing_is_every_archive_path_with_its_crc_in_one_request(served):
    path = _wheel(served.root / "alpha-1.0-py3-none-any.whl", ALPHA, directories=["alpha/"])
    server = served()
    files, fetched, requests = read_listing(server.url(path.name))
    assert files == {name: zlib.crc32(data) for name, data in ALPHA.items()}  # no directory entry
    assert requests == 1 == len(server.requests) and server.requests[0][1] == f"bytes=-{TAIL_BYTES}"
    assert fetched == server.sent == path.stat().st_size  # smaller than the tail: the whole file, once


def test_a_large_central_directory_takes_a_second_range_and_never_the_whole_file(served):
    names = {f"pkg/module_{i:05d}_{'x' * 40}.py": f"V = {i}\n".encode() for i in range(3000)}
    body = {"pkg/blob.bin": bytes(range(256)) * 8192}  # 2 MiB stored before the central directory
    path = served.root / "big-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in {**body, **names}.items():
            archive.writestr(name, data)
    server = served()
    files, fetched, requests = read_listing(server.url(path.name))
    assert files == {name: zlib.crc32(data) for name, data in {**body, **names}.items()}
    size = path.stat().st_size
    assert requests == 2 == len(server.requests)
    assert server.requests[1][1].startswith("bytes=") and not server.requests[1][1].startswith("bytes=-")
    # the tail, then the central directory up to it: well under the file (the 2 MiB body is never fetched)
    assert fetched == server.sent < size - len(body["pkg/blob.bin"]) + TAIL_BYTES


def test_a_zip64_archive_is_listed(served):
    names = {f"m/{i}.py": b"" for i in range(70_000)}  # more entries than a zip's 16-bit count: zip64 records
    path = served.root / "many-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name in names:
            archive.writestr(name, b"")
    with open(path, "rb") as handle:
        assert b"PK\x06\x06" in handle.read()[-200:]  # the zip64 end record is there
    files, _, _ = read_listing(served().url(path.name))
    assert len(files) == 70_000 and files["m/69999.py"] == zlib.crc32(b"")


def test_listings_are_cached_per_sha256_and_failures_are_each_wheels_own(served, tmp_path):
    alpha = _wheel(served.root / "alpha-1.0-py3-none-any.whl", ALPHA)
    beta = _wheel(served.root / "beta_pkg-2.0-py3-none-any.whl", BETA)
    server = served()
    gone = RemoteWheel("gone", "1.0", server.url("gone-1.0-py3-none-any.whl"), "0" * 64)
    wheels = [_remote(server, "alpha", "1.0", alpha), gone, _remote(server, "beta-pkg", "2.0", beta)]
    cache = tmp_path / "cache"
    read = list_wheels(wheels, cache)
    assert [item.wheel.name for item in read.listings] == ["alpha", "beta-pkg"]
    assert list(read.errors) == ["gone-1.0-py3-none-any.whl"] and "404" in read.errors["gone-1.0-py3-none-any.whl"]
    assert read.requests == 2 and read.fetched_bytes == alpha.stat().st_size + beta.stat().st_size
    kept = listing_dir(cache) / f"{wheels[0].sha256}.json"
    assert dict(json.loads(kept.read_text())["files"]) == {n: zlib.crc32(d) for n, d in ALPHA.items()}
    asked = len(server.requests)
    again = list_wheels(wheels[::2], cache)
    assert len(server.requests) == asked and again.requests == 0 and again.cached == 2  # nothing asked again
    assert [item.files for item in again.listings] == [item.files for item in read.listings]


def test_a_server_ignoring_range_is_read_only_when_the_file_is_small(served):
    small = _wheel(served.root / "alpha-1.0-py3-none-any.whl", ALPHA)
    big = served.root / "huge-1.0-py3-none-any.whl"
    with zipfile.ZipFile(big, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("huge/blob.bin", b"\x00" * (WHOLE_MAX_BYTES + 1))
    server = served(ranges=False)
    files, _, _ = read_listing(server.url(small.name))
    assert files == {name: zlib.crc32(data) for name, data in ALPHA.items()}
    with pytest.raises(ListingError, match=f"ignores Range.* {big.stat().st_size} bytes; not downloaded"):
        read_listing(server.url(big.name))


def test_the_clash_finder_on_served_wheels(served, tmp_path):
    alpha = _wheel(served.root / "alpha-1.0-py3-none-any.whl", ALPHA)
    beta = _wheel(served.root / "beta_pkg-2.0-py3-none-any.whl", BETA)
    other = _wheel(served.root / "gamma-3.0-py3-none-any.whl", {"gamma/__init__.py": b"",
                                                                 "gamma-3.0.dist-info/METADATA": b""})
    server = served()
    read = list_wheels([_remote(server, "alpha", "1.0", alpha), _remote(server, "beta-pkg", "2.0", beta),
                        _remote(server, "gamma", "3.0", other)], tmp_path / "cache")
    clashes = find_listing_clashes([(Distribution(i.wheel.name, i.wheel.version, i.wheel.filename), i.files)
                                    for i in read.listings])
    (clash,) = clashes  # gamma shares nothing
    assert (clash.first.label, clash.second.label) == ("alpha 1.0", "beta-pkg 2.0")
    # shared, by where each lands: shared/mod.py (differs), shared/same.py (same bytes), shared/data.txt (alpha's
    # through .data/purelib, differs), bin/tool (both .data/scripts, differs); not: the .pyc files, __pycache__,
    # the dist-info files, beta's top-level bin/tool (inside the site directory, not the prefix's bin/)
    assert clash.count == 4 and clash.differing == 3
    assert clash.paths == ("bin/tool", "shared/data.txt", "shared/mod.py", "shared/same.py")
    assert clash.on_disk is None and "install order decides" in clash.on_disk_text()


def test_one_kept_alive_connection_per_thread_and_redirects_followed(served, tmp_path):
    paths = [_wheel(served.root / f"w{i}-1.0-py3-none-any.whl", {f"w{i}/__init__.py": b"%d" % i}) for i in range(5)]
    server = served()
    wheels = [_remote(server, f"w{i}", "1.0", path) for i, path in enumerate(paths)]
    read = list_wheels(wheels, tmp_path / "cache", workers=1)
    assert read.errors == {} and read.requests == 5 == len(server.requests)
    assert len(server.clients) == 1  # five requests, one TCP connection (one lookup, one handshake)
    moved = RemoteWheel("w0", "1.0", server.url("moved/" + paths[0].name))
    files, _, requests = read_listing(moved.url)
    assert files == {"w0/__init__.py": zlib.crc32(b"0")} and requests == 1
    assert [asked for asked, _ in server.requests[-2:]] == ["/moved/" + paths[0].name, "/" + paths[0].name]
