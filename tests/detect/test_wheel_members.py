"""A release's source members read by HTTP range requests (``vllm_compat.detect.wheel_members``), against a real
HTTP server on localhost (``http.server``: one answering ``Range:`` with 206, one answering every request with the
whole file) serving a PEP 691 index page and real wheels: vllm-omni 0.24.0's release wheel (from the wheel cache,
or fetched; skipped, saying why, when neither can be had) and small zips written here whose layout is known.

Expected values come from the wheels themselves (``zipfile`` on the whole file), from how each wheel is built and
from the server's own record of what it was asked and sent; never from the code under test.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shutil
import socket
import threading
import zipfile
from pathlib import Path

import pytest

from tests.support import range_server
from tests.support.wheels import wheel_or_skip
from vllm_compat.detect import fact_cache, wheel_members, wheels
from vllm_compat.detect.source_tree import SourceTree
from vllm_compat.detect.wheel_listing import TAIL_BYTES, ListingError, RemoteWheel
from vllm_compat.detect.wheel_members import (
    GAP_BYTES,
    LISTING,
    WheelMembers,
    find_release,
    members_dir,
    open_release,
    plan_ranges,
    read_members,
)
from vllm_compat.detect.wheels import CACHE_VAR, WheelError


class _Index:
    """A real HTTP server on localhost: ``/simple/<project>/`` answers the PEP 691 JSON page of ``pages[project]``
    (``html``: the PEP 503 page instead), ``/files/<name>`` the file under ``root``, a ``Range: bytes=a-b`` or
    ``bytes=-n`` with 206 (``ranges`` False: every request with the whole file, 200). Records every request
    (path, Range) and the body bytes sent per path."""

    def __init__(self, root: Path, ranges: bool = True, html: bool = False):
        self.root, self.ranges, self.html = root, ranges, html
        self.short = 0  # a faulty server: a range ``bytes=a-b`` answered this many bytes short
        self.pages: dict[str, list[dict]] = {}
        self.requests: list[tuple[str, str | None]] = []
        self.sent: dict[str, int] = {}
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 - http.server's name
                server.requests.append((self.path, self.headers.get("Range")))
                if self.path.startswith("/simple/"):
                    return self._page(self.path.split("/")[2])
                path = server.root / self.path[len("/files/"):]
                if not self.path.startswith("/files/") or not path.is_file():
                    self.send_error(404)
                    return
                status, headers, body = range_server.answer(path.read_bytes(), self.headers.get("Range"), server.ranges)
                if server.short and status == 206 and not self.headers.get("Range", "").startswith("bytes=-"):
                    body = body[:-server.short]
                server.sent[self.path] = server.sent.get(self.path, 0) + len(body)
                range_server.send(self, status, headers, body)

            def _page(self, project):
                files = server.pages.get(project)
                if files is None:
                    self.send_error(404)
                    return
                if server.html:
                    anchors = "".join(
                        f'<a href="{f["url"]}#sha256={f["hashes"]["sha256"]}"'
                        + (f' data-requires-python="{f["requires-python"].replace(">", "&gt;")}"'
                           if f.get("requires-python") else "") + f'>{f["filename"]}</a>\n' for f in files)
                    body, kind = f"<html><body>{anchors}</body></html>".encode(), "text/html"
                else:
                    body = json.dumps({"meta": {"api-version": "1.1"}, "name": project, "files": files}).encode()
                    kind = "application/vnd.pypi.simple.v1+json"
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def publish(self, project: str, path: Path, **extra) -> dict:
        """List ``path`` (under ``root``) on ``project``'s page with its real sha256 and size."""
        entry = {"filename": path.name, "url": f"{self.base}/files/{path.name}", "size": path.stat().st_size,
                 "hashes": {"sha256": hashlib.sha256(path.read_bytes()).hexdigest()}, **extra}
        self.pages.setdefault(project, []).append(entry)
        return entry

    def remote(self, name: str, version: str, path: Path) -> RemoteWheel:
        return RemoteWheel(name, version, f"{self.base}/files/{path.name}",
                           hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_size)

    def file_requests(self, name: str) -> list[str | None]:
        return [ask for path, ask in self.requests if path == f"/files/{name}"]

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def index(tmp_path, monkeypatch):
    """``index(ranges=True, html=False)`` starts a server over ``index.root``; the check's wheel cache and pip's
    index-url point at it (no config file read), and the pages read earlier in the process are forgotten."""
    root = tmp_path / "served"
    root.mkdir()
    servers = []
    monkeypatch.setattr(wheel_members, "_PAGES", {})
    monkeypatch.setenv(CACHE_VAR, str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)

    def start(ranges: bool = True, html: bool = False) -> _Index:
        servers.append(_Index(root, ranges, html))
        monkeypatch.setenv("PIP_INDEX_URL", f"{servers[-1].base}/simple/")
        return servers[-1]

    start.root = root
    yield start
    for server in servers:
        server.close()


def _zip(path: Path, members: list[tuple[str, bytes]], method=zipfile.ZIP_DEFLATED) -> Path:
    """A zip of ``members`` in this order (the order of their bytes in the file)."""
    with zipfile.ZipFile(path, "w", method) as archive:
        for name, data in members:
            archive.writestr(name, data)
    return path


BLOB = os.urandom(1 << 20)  # incompressible: a compiled library's bytes, never to be fetched


def _layout_wheel(root: Path) -> tuple[Path, list[tuple[str, bytes]]]:
    """alpha 1.0: two modules, a 1 MiB library, two more modules and the dist-info; sources larger than the 8 KiB
    tail, so reading them takes requests of their own."""
    def text(seed):
        return "".join(f"VALUE_{seed}_{i} = {i * 7919 % 10007}\n" for i in range(3000)).encode()

    members = [("alpha/__init__.py", text(0)), ("alpha/one.py", text(1)), ("alpha/_native.abi3.so", BLOB),
               ("alpha/two.py", text(2)), ("alpha/three.pyi", text(3)),
               ("alpha-1.0.dist-info/METADATA", b"Metadata-Version: 2.1\nName: alpha\nVersion: 1.0\n"),
               ("alpha-1.0.dist-info/RECORD", b"alpha/__init__.py,,\n")]
    return _zip(root / "alpha-1.0-py3-none-any.whl", members), members


def _blob_span(path: Path) -> tuple[int, int]:
    with zipfile.ZipFile(path) as archive:
        infos = sorted(archive.infolist(), key=lambda i: i.header_offset)
        at = [i.filename for i in infos].index("alpha/_native.abi3.so")
        return infos[at].header_offset, infos[at + 1].header_offset


def _asked(ask: str, size: int) -> tuple[int, int]:
    first, last = re.fullmatch(r"bytes=(\d*)-(\d*)", ask).groups()
    return (size - int(last), size - 1) if first == "" else (int(first), int(last))


# ------------------------------------------------------------------------------------------ range reads


def test_only_the_source_members_are_fetched_and_read_back_as_the_wheel_holds_them(index, tmp_path):
    server = index()
    path, members = _layout_wheel(index.root)
    kept = read_members(server.remote("alpha", "1.0", path), tmp_path / "cache")
    tree = WheelMembers(kept)
    whole = zipfile.ZipFile(path)
    assert tree.namelist() == whole.namelist()  # the whole wheel's names: the library exists for the import drift
    for name, data in members:
        if name.endswith(".so"):
            assert tree.read(name) is None
        else:
            assert tree.read(name) == data.decode()
    assert sorted(zipfile.ZipFile(kept).namelist()) == sorted([n for n, _ in members if not n.endswith(".so")]
                                                             + [LISTING])
    assert zipfile.ZipFile(kept).testzip() is None  # every kept member's CRC-32 checks out
    # no request touched the library's bytes; the tail, then one request before the library and one after it
    blob_first, blob_end = _blob_span(path)
    asks = server.file_requests(path.name)
    size = path.stat().st_size
    for ask in asks:
        first, last = _asked(ask, size)
        assert last < blob_first or first >= blob_end, (ask, blob_first, blob_end)
    assert len(asks) == 3 and asks[0] == f"bytes=-{TAIL_BYTES}", asks
    assert server.sent[f"/files/{path.name}"] < size - len(BLOB) + GAP_BYTES


def test_a_wheel_inside_the_tail_takes_one_request(index, tmp_path):
    """A wheel smaller than the first read (8 KiB): the tail holds every member, none is asked again."""
    server = index()
    path = _zip(index.root / "kappa-1.0-py3-none-any.whl",
                [("kappa/__init__.py", b"K = 1\n"), ("kappa-1.0.dist-info/METADATA", b"Name: kappa\n")])
    assert path.stat().st_size < TAIL_BYTES
    tree = WheelMembers(read_members(server.remote("kappa", "1.0", path), tmp_path / "cache"))
    assert tree.read("kappa/__init__.py") == "K = 1\n"
    assert server.file_requests(path.name) == [f"bytes=-{TAIL_BYTES}"]
    assert server.sent[f"/files/{path.name}"] == path.stat().st_size


def test_neighbouring_members_share_a_request_and_a_gap_above_the_limit_splits_them(index, tmp_path):
    server = index()
    text = "".join(f"X{i} = {i}\n" for i in range(4000)).encode()
    small_gap = os.urandom(GAP_BYTES // 2)  # a data file between two modules: fetched with them, one request
    large_gap = os.urandom(GAP_BYTES * 2)  # too large to fetch for nothing: a request on each side
    path = _zip(index.root / "beta-1.0-py3-none-any.whl",
                [("beta/a.py", text), ("beta/data.bin", small_gap), ("beta/b.py", text),
                 ("beta/big.bin", large_gap), ("beta/c.py", text),
                 ("beta-1.0.dist-info/METADATA", b"Name: beta\n")],
                method=zipfile.ZIP_STORED)
    read_members(server.remote("beta", "1.0", path), tmp_path / "cache")
    ranged = [ask for ask in server.file_requests(path.name) if not ask.startswith("bytes=-")]
    assert len(ranged) == 2, ranged  # [a.py, data.bin, b.py] and [c.py, METADATA] (the tail holds none of them)


@pytest.fixture(scope="session")
def omni_wheel() -> Path:
    """vllm-omni 0.24.0's release wheel from the wheel cache the session was started with (fetched when absent;
    a skip, saying why, when it cannot be had): set up before ``index`` points the cache elsewhere."""
    return wheel_or_skip("vllm-omni", "0.24.0")


def test_a_member_whose_bytes_do_not_check_out_is_none(tmp_path):
    path = _zip(tmp_path / "mu-1.0-py3-none-any.whl", [("mu/__init__.py", b"M = 1\n" * 50)])
    info = zipfile.ZipFile(path).infolist()[0]
    raw = path.read_bytes()[info.header_offset:zipfile.ZipFile(path).start_dir]
    assert wheel_members._decode(raw, info.compress_type, info.compress_size, info.CRC) == b"M = 1\n" * 50
    assert wheel_members._decode(raw, info.compress_type, info.compress_size, info.CRC ^ 1) is None  # CRC-32
    assert wheel_members._decode(b"XX" + raw[2:], info.compress_type, info.compress_size, info.CRC) is None


def test_a_short_answer_keeps_nothing(index, tmp_path):
    server = index()
    path, _ = _layout_wheel(index.root)
    server.short = 10
    with pytest.raises(ListingError, match="answered"):
        read_members(server.remote("alpha", "1.0", path), tmp_path / "cache")
    assert not list(members_dir(tmp_path / "cache").glob("*.zip"))


def test_ranges_join_neighbours_and_close_at_the_piece_size():
    spans = [(0, 10), (10, 20), (25, 30), (30, 40), (200, 210)]
    assert plan_ranges(spans, gap=5, piece=1000) == [(0, 40), (200, 210)]  # 5 bytes between: joined; 160: not
    assert plan_ranges(spans, gap=5, piece=15) == [(0, 20), (25, 40), (200, 210)]  # closed once 15 bytes are held
    assert plan_ranges(spans, gap=4, piece=1000) == [(0, 20), (25, 40), (200, 210)]


def test_a_real_release_wheel_read_by_ranges_equals_the_wheel(omni_wheel, index, tmp_path):
    """vllm-omni 0.24.0's release wheel: every source member and the metadata as ``zipfile`` reads the whole
    file."""
    path = Path(shutil.copy(omni_wheel, index.root / omni_wheel.name))
    server = index()
    kept = read_members(server.remote("vllm-omni", "0.24.0", path), tmp_path / "cache")
    tree, whole = WheelMembers(kept), zipfile.ZipFile(path)
    assert tree.namelist() == whole.namelist()
    sources = [n for n in whole.namelist() if n.endswith((".py", ".pyi")) or ".dist-info/" in n]
    assert sources and all(tree.read(n) == whole.read(n).decode() for n in sources)
    assert tree.walk_py("vllm_omni") == SourceTree(path).walk_py("vllm_omni")
    assert tree.distribution_version("vllm-omni") == "0.24.0" and tree.has_package("vllm_omni")
    assert server.sent[f"/files/{path.name}"] < path.stat().st_size  # never the whole wheel


def test_a_member_not_kept_is_fetched_when_read_online_and_is_none_offline(index, tmp_path, monkeypatch):
    server = index()
    path = _zip(index.root / "gamma-1.0-py3-none-any.whl",
                [("gamma/__init__.py", b"G = 1\n"), ("gamma/config.json", b'{"answer": 42}\n'),
                 ("gamma-1.0.dist-info/METADATA", b"Name: gamma\n")])
    tree = WheelMembers(read_members(server.remote("gamma", "1.0", path), tmp_path / "cache"))
    assert "gamma/config.json" not in zipfile.ZipFile(tree.root).namelist()
    before = len(server.requests)
    assert tree.read("gamma/config.json") == '{"answer": 42}\n' and len(server.requests) == before + 1
    _offline(monkeypatch)
    assert tree.read("gamma/config.json") is None and tree.read("gamma/__init__.py") == "G = 1\n"


# ------------------------------------------------------------------------------------------ the index


def test_the_index_gives_the_wheel_an_installer_picks_here(index):
    server = index()
    for name in ("delta-1.0-py3-none-any.whl", "delta-1.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                 "delta-1.0-cp38-abi3-manylinux_2_28_aarch64.whl", "delta-2.0-py3-none-any.whl",
                 "delta-1.0-py3-none-any.tar.gz"):
        (index.root / name).write_bytes(name.encode())
        server.publish("delta", index.root / name)
    from packaging.tags import sys_tags

    best = next(f"delta-1.0-{t}.whl" for t in sys_tags()
                if f"delta-1.0-{t}.whl" in os.listdir(index.root))  # the first of this interpreter's tags
    found = find_release("delta", "1.0")
    assert found.filename == best and found.sha256 == hashlib.sha256(best.encode()).hexdigest()
    assert find_release("delta", "1.0.0").filename == best  # "==" matches as pip's does
    assert find_release("delta", "3.0") is None and find_release("nobody", "1.0") is None


def test_requires_python_and_yanked_files_are_passed_over(index):
    server = index()
    names = ("eps-1.0-py3-none-any.whl", "eps-1.0-py2.py3-none-any.whl", "eta-1.0-py3-none-any.whl",
             "eta-1.0-py2.py3-none-any.whl")
    for name in names:
        (index.root / name).write_bytes(name.encode())
    server.publish("eps", index.root / names[0], **{"requires-python": "<3"})
    server.publish("eps", index.root / names[1], yanked=True)
    assert find_release("eps", "1.0").filename == names[1]  # yanked, but the only one left for this Python
    server.publish("eta", index.root / names[2], yanked=True)  # the better tag, yanked
    server.publish("eta", index.root / names[3])
    assert find_release("eta", "1.0").filename == names[3]


def test_a_pep_503_html_page_is_read_too(index):
    server = index(html=True)
    (index.root / "zeta-1.0-py3-none-any.whl").write_bytes(b"zeta")
    server.publish("zeta", index.root / "zeta-1.0-py3-none-any.whl", **{"requires-python": ">=3.8"})
    found = find_release("zeta", "1.0")
    assert found.filename == "zeta-1.0-py3-none-any.whl" and found.sha256 == hashlib.sha256(b"zeta").hexdigest()


def test_the_index_lists_the_final_releases_with_a_wheel_for_here_newest_first(index):
    server = index()
    for name in ("theta-1.0-py3-none-any.whl", "theta-1.1-py3-none-any.whl", "theta-1.2rc1-py3-none-any.whl",
                 "theta-1.2.dev0-py3-none-any.whl", "theta-1.3-py3-none-win_arm64.whl", "theta-1.4.tar.gz",
                 "theta-0.9.post1-py3-none-any.whl", "theta-1.5-py3-none-any.whl"):
        (index.root / name).write_bytes(name.encode())
        server.publish("theta", index.root / name, **({"yanked": True} if "1.5" in name else {}))
    # not 1.2rc1 / 1.2.dev0 (pre and dev), 1.3 (no wheel for here), 1.4 (no wheel), 1.5 (yanked)
    assert wheel_members.index_versions("theta") == ["1.1", "1.0", "0.9.post1"]
    assert wheels.release_versions("theta") == ["0.9.post1", "1.0", "1.1"]  # no pip: the page is read
    assert wheels.newest_version("theta") == "1.1"
    assert wheel_members.index_versions("nobody") is None


def test_a_pinned_release_s_metadata_is_read_by_ranges_and_left_to_pip_without_them(index, tmp_path):
    server = index()
    metadata = b"Metadata-Version: 2.1\nName: Iota_Pkg\nVersion: 2.0\nRequires-Dist: alpha>=1\n"
    path = _zip(index.root / "iota_pkg-2.0-py3-none-any.whl",
                [("iota_pkg/__init__.py", b"I = 1\n"), ("iota_pkg/_lib.so", BLOB),
                 ("iota_pkg-2.0.dist-info/WHEEL", b"Wheel-Version: 1.0\nTag: py3-none-any\n"),
                 ("iota_pkg-2.0.dist-info/METADATA", metadata)])
    server.publish("iota-pkg", path)
    assert wheel_members.pinned_metadata({"iota-pkg": "2.0", "nobody": "1.0"}) == {"iota-pkg": metadata.decode()}
    assert server.sent[f"/files/{path.name}"] < 64 << 10  # the tail only: never the library's bytes
    from vllm_compat.detect.requirements import fetch_pinned

    sent = server.sent[f"/files/{path.name}"]
    found, failed = fetch_pinned({"iota-pkg": "2.0"}, tmp_path / "cache")
    assert not failed and [str(r) for r in found["iota-pkg"].requires] == ["alpha>=1"]
    assert found["iota-pkg"].version == "2.0"
    assert server.sent[f"/files/{path.name}"] - sent < 64 << 10  # by ranges again, not pip's whole download
    server.ranges = False  # an index sending whole files: nothing read here (pip is asked instead)
    assert wheel_members.pinned_metadata({"iota-pkg": "2.0"}) == {}


def test_a_file_index_is_left_to_pip(tmp_path):
    (tmp_path / "simple" / "lambda").mkdir(parents=True)
    (tmp_path / "simple" / "lambda" / "index.html").write_text('<a href="lambda-1.0-py3-none-any.whl">x</a>')
    index = (tmp_path / "simple").as_uri()
    assert find_release("lambda", "1.0", index) is None and wheel_members.index_versions("lambda", index) is None


def test_an_unreachable_index_is_a_no_network_error(index, monkeypatch):
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{port}/simple/")
    with pytest.raises(WheelError) as caught:
        open_release("vllm-omni", "0.24.0")
    assert caught.value.kind == "no_network" and "pass wheel files" in str(caught.value)


# ------------------------------------------------------------------------------- open_release and the cache


def _publish_omni(index, server, version="9.0", body=b"X = 1\n") -> Path:
    path = _zip(index.root / f"vllm_omni-{version}-py3-none-any.whl",
                [("vllm_omni/__init__.py", body), ("vllm_omni/_lib.so", BLOB),
                 (f"vllm_omni-{version}.dist-info/METADATA", f"Name: vllm-omni\nVersion: {version}\n".encode())])
    server.publish("vllm-omni", path)
    return path


def test_a_release_is_read_once_then_answered_from_the_cache_offline(index, tmp_path, capsys, monkeypatch):
    server = index()
    path = _publish_omni(index, server)
    first = open_release("vllm-omni", "9.0")
    assert first.source == "downloaded" and isinstance(first.tree, WheelMembers)
    assert first.tree.read("vllm_omni/__init__.py") == "X = 1\n" and first.tree.has_package("vllm_omni")
    assert Path(first.location).parent == members_dir()
    assert server.sent[f"/files/{path.name}"] < len(BLOB)
    assert capsys.readouterr().err == ""  # nothing said: the index answered ranges
    _offline(monkeypatch)
    again = open_release("vllm-omni", "9.0")  # offline now
    assert again.source == "cache" and again.location == first.location
    assert again.tree.distribution_version("vllm-omni") == "9.0"


def test_members_are_kept_per_sha256_and_a_changed_sha256_reads_again(index, tmp_path):
    server = index()
    path = _publish_omni(index, server)
    wheel = server.remote("vllm-omni", "9.0", path)
    directory = tmp_path / "cache"
    kept = wheel_members.members_for(wheel, directory)
    assert wheel.sha256 in kept.name
    asked = len(server.requests)
    assert wheel_members.members_for(wheel, directory) == kept and len(server.requests) == asked  # kept: no request
    _publish_omni(index, server, body=b"X = 2\n")  # the same file name, other bytes: another sha256
    changed = server.remote("vllm-omni", "9.0", path)
    assert changed.sha256 != wheel.sha256
    again = wheel_members.members_for(changed, directory)
    assert again != kept and changed.sha256 in again.name and len(server.requests) > asked
    assert WheelMembers(again).read("vllm_omni/__init__.py") == "X = 2\n"
    with zipfile.ZipFile(again, "a") as archive:  # as if written by another format of the kept file
        archive.comment = b"vllm-compat members 0"
    asked = len(server.requests)
    assert wheel_members.members_for(changed, directory) == again and len(server.requests) > asked  # read again
    assert WheelMembers(again).is_current
    assert WheelMembers(kept).read("vllm_omni/__init__.py") == "X = 1\n"
    # the fact cache keys each on its wheel's sha256
    assert fact_cache.content_id(str(kept)) == f"sha256:{wheel.sha256}"
    assert fact_cache.content_id(str(again)) == f"sha256:{changed.sha256}"


def test_an_index_that_answers_no_range_request_gives_the_whole_wheel_and_says_so(index, capsys, monkeypatch):
    server = index(ranges=False)
    path = _publish_omni(index, server)
    release = open_release("vllm-omni", "9.0")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "answers no range request" in err[0] and path.name in err[0]
    assert len(server.file_requests(path.name)) == 2  # the first range asked, answered whole; then the download
    assert release.source == "downloaded" and not isinstance(release.tree, WheelMembers)
    assert Path(release.location) == wheels.cache_dir() / path.name
    assert Path(release.location).read_bytes() == path.read_bytes()
    assert release.tree.read("vllm_omni/__init__.py") == "X = 1\n"
    assert not list(members_dir().glob("*.zip"))  # nothing half-kept
    _offline(monkeypatch)
    assert open_release("vllm-omni", "9.0").source == "cache"  # the whole wheel, offline


def test_a_whole_wheel_whose_bytes_do_not_match_the_index_is_not_kept(index, capsys):
    server = index(ranges=False)
    path = _publish_omni(index, server)
    server.pages["vllm-omni"][0]["hashes"]["sha256"] = "0" * 64
    with pytest.raises(WheelError, match="sha256"):
        open_release("vllm-omni", "9.0")
    assert not (wheels.cache_dir() / path.name).exists()
    assert not [p for p in wheels.cache_dir().iterdir() if p.name.startswith(".partial-")]


# ------------------------------------------------------------------------------------------ offline


def _offline(monkeypatch):
    """No connection can be made (as with the network down), and this thread's kept-alive ones are gone."""
    from vllm_compat.detect import wheel_listing

    for connection in wheel_listing._local.__dict__.pop("pool", {}).values():
        connection.close()

    def refuse(*args, **kwargs):
        raise ConnectionRefusedError("offline (test)")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def _no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("no network may be used")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(wheels, "pip_command", refuse)


def test_wheel_paths_given_on_the_command_line_are_checked_offline(tmp_path, monkeypatch, capsys):
    """``check VLLM_WHEEL OMNI_WHEEL`` with no network at all (no socket connects, no pip): the answer, and a warm
    answer from the fact cache keyed on the wheels' contents, also for the same bytes at another path."""
    from vllm_compat.cli import main

    monkeypatch.setenv("VLLM_COMPAT_CACHE_DIR", str(tmp_path / "facts"))
    monkeypatch.setenv(CACHE_VAR, str(tmp_path / "cache"))
    vllm = _zip(tmp_path / "vllm-9.9.0-cp38-abi3-manylinux_2_28_x86_64.whl",
                [("vllm/__init__.py", b"__version__ = '9.9.0'\n"),
                 ("vllm-9.9.0.dist-info/METADATA", b"Name: vllm\nVersion: 9.9.0\n")])
    omni = _zip(tmp_path / "vllm_omni-9.9.0-py3-none-any.whl",
                [("vllm_omni/__init__.py", b"import vllm\n"),
                 ("vllm_omni-9.9.0.dist-info/METADATA", b"Name: vllm-omni\nVersion: 9.9.0\n")])
    _no_network(monkeypatch)
    code = main(["check", "--json", "--no-resolve", str(vllm), str(omni)])
    data = json.loads(capsys.readouterr().out)
    assert code in (0, 1) and data["inputs"]["vllm"]["source"] == "path"
    assert data["vllm"]["version"] == "9.9.0" and data["vllm_omni"]["version"] == "9.9.0"
    key = fact_cache.files_key("wheel-pair", str(vllm), str(omni))
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    copy = Path(shutil.copy(vllm, moved / vllm.name))
    assert fact_cache.files_key("wheel-pair", str(copy), str(omni)) == key  # the same bytes: the same key
    with zipfile.ZipFile(copy, "a") as archive:
        archive.writestr("vllm/extra.py", "Y = 1\n")
    assert fact_cache.files_key("wheel-pair", str(copy), str(omni)) != key  # other bytes: another key
