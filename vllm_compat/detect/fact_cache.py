"""The installed pair's static facts, cached on disk so a warm ``vllm-compat doctor`` parses nothing.

Static detection reads and parses vLLM's and vllm-omni's files (``ast`` on a dozen modules, import scans of
vllm-omni): ~0.8 s, repeated on every doctor run although the answer only changes when a package does. This
cache holds what ``StaticSite.installed()`` computes: every catalogue entry's ``detect_static`` facts (pickled
apart, ``pickled``: read back only where a fact is read), the import and behavioural drift, the decisions per
``VLLM_COMPAT_*`` controls (each drift point decides from its facts and the controls alone), and the dependency
drift under the stamps of the METADATA it read (the pinned packages' are not in the key). A warm doctor's short
screen reads the decisions and the drifts: it imports no drift point, ``packaging`` or ``importlib.metadata``.

It is the one on-disk cache of static detection. The key is the ``RECORD`` (path, size, mtime) of the
distribution that installed each of vllm, vllm_omni and torch where the package is found, plus the contents of
every ``.py`` file of vllm_compat itself (``own_files``: each one's path inside the package, size and CRC-32; an
editable install's RECORD never changes, and ``pip install .`` of the same version rewrites every file with new
mtimes but the same bytes, which keeps the key), plus the interpreter's version. Installing, upgrading or removing
one of them, or editing vllm_compat, makes a new key. ``check``'s wheel pairs are keyed on content too
(``files_key``, ``content_id``): each wheel's sha256, wherever it lies and however it was read.
A package that is absent, or found where no ``RECORD`` sits beside it (a source tree on ``PYTHONPATH``), makes
no key: nothing is cached. Facts are pickled (they are vllm_compat's own frozen records, and a new vllm_compat
file is a new key, so a pickle is only read by the code that wrote it); a cache that cannot be read, written
or unpickled is ignored, never an error.
"""

from __future__ import annotations

import os
import sys

PACKAGES = ("vllm", "vllm_omni", "torch")  # what static detection reads (torch: its version only)
_OWN_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def cache_dir() -> str:
    """``$VLLM_COMPAT_CACHE_DIR``, else ``$XDG_CACHE_HOME/vllm-compat``, else ``~/.cache/vllm-compat``; ``facts/``."""
    base = os.environ.get("VLLM_COMPAT_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "vllm-compat")
    return os.path.join(base, "facts")


def record_stat(root: str, package: str) -> str | None:
    """``path:size:mtime_ns`` of the RECORD of the distribution that installed ``package`` into ``root``; None
    when there is none."""
    prefix = package + "-"
    try:
        entries = sorted(os.listdir(root))
    except OSError:
        return None
    for name in entries:
        if name.startswith(prefix) and name.endswith(".dist-info"):
            record = os.path.join(root, name, "RECORD")
            try:
                stat = os.stat(record)
            except OSError:
                return None
            return f"{record}:{stat.st_size}:{stat.st_mtime_ns}"
    return None


def own_files() -> list[str]:
    """``relative path:size:CRC-32`` of every ``.py`` file of vllm_compat: its contents, not where or when it was
    installed (reading and checksumming the ~100 files takes about 2 ms, less than importing ``hashlib``)."""
    import zlib

    parts = []
    for dirpath, dirnames, filenames in os.walk(_OWN_ROOT):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                try:
                    with open(path, "rb") as handle:
                        data = handle.read()
                except OSError:
                    continue
                parts.append(f"{os.path.relpath(path, _OWN_ROOT)}:{len(data)}:{zlib.crc32(data):08x}")
    return parts


def installed_key(roots: dict[str, str | None]) -> str | None:
    """The key for the installed packages found at ``roots`` ({package: directory holding it, or None}); None
    when one is absent or has no RECORD there. The key is the whole text (stored in the file and compared on
    reading); its file name is a checksum of it, so no hashlib (~4 ms to import) on the warm path."""
    parts = [sys.version]
    for package in PACKAGES:
        root = roots.get(package)
        stat = record_stat(root, package) if root is not None else None
        if stat is None:
            return None
        parts.append(stat)
    parts += own_files()
    return "\n".join(parts)


def files_key(kind: str, *parts: str) -> str | None:
    """A key for what was read from the files named in ``parts`` (wheels, paths) and ``kind`` (what is kept): each
    file's contents (``content_id``; a directory's path, size and mtime), vllm_compat's own files and the
    interpreter's version; None when one is missing."""
    stamps = [kind, sys.version]
    for part in parts:
        if os.sep in part or os.path.exists(part):
            found = content_id(part)
            if found is None:
                return None
            stamps.append(found)
        else:
            stamps.append(part)
    return "\n".join(stamps + own_files())


DIGESTS = "digests.json"  # {path: [size, mtime_ns, inode, sha256]}: a file is hashed once while it is unchanged


def content_id(path: str) -> str | None:
    """What a file holds, as ``sha256:<hex>``: for the kept members of a wheel (``wheel_members``), the wheel's
    sha256 from the kept file's name; for any other file its own sha256, hashed once and remembered in
    ``DIGESTS`` under its path, size, mtime and inode (a 300 MB wheel takes about 0.3 s). A directory is its path,
    size and mtime. None when ``path`` cannot be read."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    if not os.path.isfile(path):
        return f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
    if path.endswith(".zip"):
        from .wheel_members import origin_sha256

        origin = origin_sha256(path)
        if origin is not None:
            return f"sha256:{origin}"
    import json

    memo_path = os.path.join(cache_dir(), DIGESTS)
    stamp = [stat.st_size, stat.st_mtime_ns, stat.st_ino]
    try:
        with open(memo_path) as handle:
            memo = json.load(handle)
    except (OSError, ValueError):
        memo = {}
    if not isinstance(memo, dict):
        memo = {}
    known = memo.get(os.path.abspath(path))
    if isinstance(known, list) and known[:3] == stamp:
        return f"sha256:{known[3]}"
    import hashlib

    digest = hashlib.sha256()
    try:
        with open(path, "rb") as handle:
            while chunk := handle.read(1 << 20):
                digest.update(chunk)
    except OSError:
        return None
    memo[os.path.abspath(path)] = [*stamp, digest.hexdigest()]
    _write_atomic(memo_path, json.dumps(memo).encode())
    return f"sha256:{digest.hexdigest()}"


def _write_atomic(path: str, payload: bytes) -> None:
    """``payload`` to ``path`` through a private file and a rename; failures are ignored (a cache)."""
    import tempfile

    handle = None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with tempfile.NamedTemporaryFile("wb", dir=os.path.dirname(path), delete=False, suffix=".tmp") as handle:
            handle.write(payload)
        os.replace(handle.name, path)
    except Exception:  # noqa: BLE001 - an unwritable directory: nothing is remembered
        if handle is not None:
            try:
                os.unlink(handle.name)
            except OSError:
                pass


def _path(key: str) -> str:
    import zlib

    return os.path.join(cache_dir(), f"{zlib.crc32(key.encode()):08x}-{len(key)}.pickle")


def load(key: str | None) -> dict:
    """What ``store`` wrote under ``key`` (``{"environment": ..., "facts": {entry id: facts}, ...}``); empty
    when there is none, it cannot be read, or it was written under another key with the same file name."""
    if key is None:
        return {}
    import pickle

    try:
        with open(_path(key), "rb") as handle:
            stored_key, data = pickle.load(handle)
    except Exception:  # noqa: BLE001 - any unreadable cache (missing, truncated, stale classes) is a miss
        return {}
    return data if stored_key == key and isinstance(data, dict) else {}


def pickled(value) -> bytes | None:
    """``value`` pickled on its own, for a part of the data that ``load`` should not unpickle (its reader does, when
    it needs it: ``StaticSite`` keeps its facts so); None when it cannot be pickled."""
    import pickle

    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - unpicklable facts: nothing is cached, as store() does
        return None


def store(key: str | None, data: dict) -> None:
    """Write ``data`` under ``key`` atomically (concurrent doctors never read half a file); failures are ignored:
    the next run computes again."""
    if key is None:
        return
    import pickle

    try:
        payload = pickle.dumps((key, data), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - unpicklable facts: nothing is cached
        return
    _write_atomic(_path(key), payload)
