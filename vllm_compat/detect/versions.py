"""Installed distribution versions, read from metadata only (never by importing the package)."""

from __future__ import annotations

import os
import re
import sys

# The vLLM releases the matrix (matrix/vllm.toml) proves, and the cells testing each (vLLM, vllm-omni) pair:
# generated into .tested by matrix/tested_pairs.py (nox -s refresh runs it), so a new release's passed cells move
# them. Used for reporting only, never as a gate: decisions come from detected capabilities.
from .tested import TESTED_CELLS, TESTED_VLLM_RANGE

_SEPARATORS = re.compile(r"[-_.]+")


def installed_version(distribution: str) -> str | None:
    """Return the installed version string of ``distribution``, or None when it is not installed.

    The answer is ``importlib.metadata.version``'s: the first ``*.dist-info`` / ``*.egg-info`` of that name along
    ``sys.path``. Where every ``sys.path`` entry is a plain directory, that search is done here (a directory
    listing and one METADATA read: importing ``importlib.metadata`` costs ~50 ms, doctor's whole warm run);
    a zip on the path, another distribution finder, or an unreadable METADATA go to ``importlib.metadata``."""
    found = _dist_info_version(distribution)
    if found is not _UNSURE:
        return found
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


_UNSURE = object()


def _normalized(name: str) -> str:
    # importlib.metadata's Prepared.normalize: PEP 503, with "_" as the separator dist-info names use
    return _SEPARATORS.sub("-", name).lower().replace("-", "_")


# directory -> (its mtime_ns, {normalized name: first dist-info / egg-info child, (child,): its version}): apply()
# and the hooks ask for versions on every call, so a directory is listed again only when it changed
# (importlib.metadata also keys its listings by mtime).
_LISTINGS: dict[str, tuple[int, dict[str, str]]] = {}


def _dist_infos(directory: str, mtime_ns: int) -> dict[str, str]:
    cached = _LISTINGS.get(directory)
    if cached is not None and cached[0] == mtime_ns:
        return cached[1]
    found: dict[str, str] = {}
    try:
        children = os.listdir(directory)
    except OSError:
        children = []
    for child in children:
        low = child.lower()
        if low.endswith((".dist-info", ".egg-info")):
            found.setdefault(_normalized(low.rpartition(".")[0].partition("-")[0]), child)
    _LISTINGS[directory] = (mtime_ns, found)
    return found


def _dist_info_version(distribution: str):
    """The version, None when no entry has it, or ``_UNSURE`` when only ``importlib.metadata`` can tell."""
    found = _dist_info(distribution)
    if found is None or found is _UNSURE:
        return found
    infos, directory, child = found
    # Read once per listing: a reinstall or upgrade makes a new dist-info, so a new directory mtime.
    if (child,) not in infos:
        infos[(child,)] = _metadata_version(os.path.join(directory, child))
    version = infos[(child,)]
    return _UNSURE if version is None else version


def _dist_info(distribution: str):
    """``(listing, directory, child)`` of the first ``*.dist-info`` / ``*.egg-info`` of ``distribution`` along
    ``sys.path`` (``importlib.metadata``'s), None when no entry has one, or ``_UNSURE`` when only
    ``importlib.metadata`` can tell."""
    import stat

    for finder in sys.meta_path:
        # Only the path finder answers distribution lookups in a plain interpreter; another finder that also
        # does could answer first.
        if (getattr(finder, "find_distributions", None) is not None
                and getattr(finder, "__name__", None) != "PathFinder"):
            return _UNSURE
    wanted = _normalized(distribution)
    for entry in sys.path:
        directory = entry or "."
        try:
            status = os.stat(directory)
        except OSError:
            continue  # absent or unreadable: importlib.metadata finds nothing there either
        if not stat.S_ISDIR(status.st_mode):
            return _UNSURE  # a zip (or egg) on the path: importlib.metadata reads inside it
        infos = _dist_infos(directory, status.st_mtime_ns)
        child = infos.get(wanted)
        if child is not None:
            return infos, directory, child
    return None


def installed_metadata(distribution: str) -> str | None:
    """The METADATA text of the installed ``distribution``, or None: ``importlib.metadata``'s
    ``distribution(name).read_text("METADATA")``, read here where ``installed_version`` finds the dist-info itself
    (an egg-info has no METADATA: None, as there)."""
    found = _dist_info(distribution)
    if found is None:
        return None
    if found is not _UNSURE:
        _, directory, child = found
        try:
            with open(os.path.join(directory, child, "METADATA"), encoding="utf-8") as handle:
                return handle.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
            return None  # what importlib.metadata's read_text answers for these
    from importlib import metadata

    try:
        return metadata.distribution(distribution).read_text("METADATA")
    except metadata.PackageNotFoundError:
        return None


def metadata_stamp(distribution: str) -> str | None:
    """What ``installed_metadata`` and ``installed_version`` of ``distribution`` read, as ``path:size:mtime_ns``
    (its METADATA, else PKG-INFO, else the egg-info file itself); "-" when it is not installed; None when only
    ``importlib.metadata`` can tell (nothing can be kept on such a path). The doctor keeps what it derived from
    installed metadata under these stamps (``detect.static.StaticSite.installed_dependency_drift``)."""
    found = _dist_info(distribution)
    if found is None:
        return "-"
    if found is _UNSURE:
        return None
    _, directory, child = found
    info = os.path.join(directory, child)
    for candidate in (os.path.join(info, "METADATA"), os.path.join(info, "PKG-INFO"), info):
        try:
            status = os.stat(candidate)
        except OSError:
            continue
        return f"{candidate}:{status.st_size}:{status.st_mtime_ns}"
    return None


def _metadata_version(info: str) -> str | None:
    """The first ``Version:`` header of a dist-info's METADATA (an egg-info's PKG-INFO, or the egg-info file)."""
    for candidate in (os.path.join(info, "METADATA"), os.path.join(info, "PKG-INFO"), info):
        try:
            with open(candidate, encoding="utf-8") as handle:
                for line in handle:
                    if not line.strip():
                        return None  # end of the headers
                    name, sep, value = line.partition(":")
                    if sep and name.strip().lower() == "version":
                        return value.strip()
        except (IsADirectoryError, NotADirectoryError, FileNotFoundError):
            continue
        except (OSError, UnicodeDecodeError):
            return None
        return None
    return None


def is_tested_vllm(version: str | None) -> bool | None:
    """Whether ``version`` lies in ``TESTED_VLLM_RANGE``, the lowest to the highest vLLM of a matrix cell that has
    passed (release part only, so dev builds and local versions of a tested release count as tested; a release
    between two cells' counts too). None when the version is missing or unparseable."""
    if version is None:
        return None
    low, high = (_release(v) for v in TESTED_VLLM_RANGE)
    release = _release(version)
    if release is None:
        return None
    return low <= release[: len(high)] <= high


def cells_testing(vllm_version: str | None, omni_version: str | None) -> tuple[str, ...]:
    """The ids of the passed matrix cells that test vLLM ``vllm_version`` with vllm-omni ``omni_version``
    (``TESTED_CELLS``: pairs by release, each pair's cells in matrix/vllm.toml's order, so its CPU cell before its
    serve cell on vLLM's pinned torch); () when none does.

    Versions match on their release part, as ``is_tested_vllm``: "0.34.0+cu129" and "0.34.0.dev3" are tested by
    the cells of 0.34.0; "0.34.1" by none until a cell installs it. ``omni_version`` None (vllm-omni absent or
    its version unknown) gives every passed cell on that vLLM, vLLM-only ones first: each runs the whole suite
    against it. () as well when either version is unparseable or ``vllm_version`` is None."""
    vllm = _release(vllm_version) if vllm_version is not None else None
    omni = _release(omni_version) if omni_version is not None else None
    if vllm is None or (omni_version is not None and omni is None):
        return ()
    def same(release: tuple[int, ...], cell_version: str) -> bool:
        cell = _release(cell_version)
        return release[: len(cell)] == cell

    found: list[str] = []
    for (cell_vllm, cell_omni), ids in TESTED_CELLS.items():
        if same(vllm, cell_vllm) and (omni is None or (cell_omni is not None and same(omni, cell_omni))):
            found.extend(ids)
    return tuple(found)


def _release(version: str) -> tuple[int, ...] | None:
    """The release part of ``version`` ("0.30.0.dev1" -> (0, 30, 0)), None when it does not parse."""
    release = _plain_release(version)
    if release is None:
        # Anything but a plain release ("0.30.0.dev1", "0.30.0+cpu", "v0.30") is for packaging to parse: its
        # import and regex cost ~10 ms, most of a warm doctor run, for a string doctor nearly always has plain.
        from packaging.version import InvalidVersion, Version

        try:
            release = Version(version).release
        except InvalidVersion:
            return None
    return release


def _plain_release(version: str) -> tuple[int, ...] | None:
    """``(0, 30, 0)`` for "0.30.0" (digits and dots only: exactly ``Version(version).release``), else None."""
    parts = version.split(".")
    if not all(part.isascii() and part.isdigit() for part in parts):
        return None
    return tuple(int(part) for part in parts)
