"""What a file server answers a GET with, ``Range`` honoured or not: shared by the tests' localhost servers
(``tests/detect/test_wheel_listing.py``, ``tests/detect/test_wheel_members.py``)."""

from __future__ import annotations

import re


def answer(data: bytes, range_header: str | None, ranges: bool = True) -> tuple[int, dict[str, str], bytes]:
    """``(status, headers, body)`` for ``data``: a ``bytes=a-b`` or ``bytes=-n`` range with 206 and its
    Content-Range when ``ranges``, else the whole file with 200."""
    asked = re.fullmatch(r"bytes=(\d*)-(\d*)", range_header or "")
    if not (ranges and asked):
        return 200, {}, data
    first, last = asked.groups()
    if first == "":
        first, last = max(0, len(data) - int(last)), len(data) - 1
    else:
        first, last = int(first), min(int(last or len(data) - 1), len(data) - 1)
    return 206, {"Content-Range": f"bytes {first}-{last}/{len(data)}"}, data[first:last + 1]


def send(handler, status: int, headers: dict[str, str], body: bytes) -> None:
    """Send one answer on an ``http.server`` handler, with its Content-Length."""
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
