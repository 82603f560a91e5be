"""pip's and uv's own output (progress bars, retry warnings, their 100-version ERROR lines): on stderr with
``--verbose`` only; otherwise kept, and what the tool said when it failed is given in one line (``said``), inside
the ``WheelError`` or reason that names what to do.

``cli.main`` sets ``SHOWN`` for every command (``--verbose``); code that runs pip or uv calls ``echo`` with what it
captured, or ``shown()`` to let the tool write to stderr itself (pip's progress bar on a terminal).
"""

from __future__ import annotations

import re
import sys

SHOWN = False  # --verbose: the tools' own output goes to stderr as they print it
SAID_LIMIT = 160  # columns of the tool's one line in an error message

_VERSIONS_LIST = re.compile(r"\((?:from )?versions: ([^)]*)\)")


def show(on: bool) -> None:
    """Show the tools' own output from now on (``--verbose``), or keep it."""
    global SHOWN
    SHOWN = bool(on)


def shown() -> bool:
    return SHOWN


def echo(text: str) -> None:
    """Write ``text`` (a tool's captured output) to stderr under ``--verbose``; nothing otherwise."""
    if SHOWN and text:
        sys.stderr.write(text if text.endswith("\n") else text + "\n")
        sys.stderr.flush()


def said(output: str, limit: int = SAID_LIMIT) -> str:
    """What a tool said when it failed, in one line: its last ``ERROR`` / ``error:`` line (else its last line), a
    "(from versions: ...)" list replaced by its count, cut at ``limit`` columns; "" for no output."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR") or line.lower().startswith("error:")]
    if not (errors or lines):
        return ""
    line = (errors or lines)[-1]

    def count(match) -> str:
        items = [v for v in match.group(1).split(",") if v.strip() and v.strip() != "none"]
        return f"({len(items)} versions listed)"

    line = _VERSIONS_LIST.sub(count, line)
    return line if len(line) <= limit else line[:limit - 3].rstrip() + "..."
