"""Requirements as the wheels state them: ``Requires-Dist`` read from a distribution's METADATA (in a wheel, an
unpacked tree or an installed ``*.dist-info``), the index's answer for a pinned package's own METADATA, and the
newest release satisfying a range. Generic: no distribution is named here; ``dependency_drift`` decides.

Reading: METADATA is parsed with ``email.parser`` and each ``Requires-Dist`` with ``packaging``; markers are
evaluated for this interpreter and platform with no extra requested (what ``pip install NAME`` installs).

The index is asked through pip, the same way ``detect.wheels`` fetches wheels (a subprocess; pip's index
configuration applies): ``pip install --dry-run --no-deps --ignore-installed --only-binary :all: --report FILE``
names the release pip would pick and its METADATA without installing anything, and where the index serves a
wheel's METADATA on its own (PEP 658, as PyPI does) without downloading the wheel. Answers for exact versions are
kept in the wheel cache's ``metadata/`` folder for good (a release's METADATA never changes); the newest release
satisfying a range is kept for a day (``NEWEST_TTL_S``). Every failure is a ``WheelError`` with pip's last error
line, or, for several packages asked at once, an entry in the returned ``failed`` map.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .wheels import WheelError, cache_dir, pip_command

NEWEST_TTL_S = 24 * 3600


@dataclass(frozen=True)
class DistributionRequirements:
    """A distribution at a version, with the requirements that apply to this environment (markers evaluated,
    no extra): ``requires`` holds ``packaging.requirements.Requirement`` objects."""

    name: str  # canonical (PEP 503)
    version: str
    requires: tuple

    def on(self, package: str):
        """The combined ``SpecifierSet`` this distribution asks of ``package`` (canonical), or None."""
        from packaging.specifiers import SpecifierSet

        found = [r.specifier for r in self.requires if canonical(r.name) == package]
        if not found:
            return None
        combined = SpecifierSet()
        for spec in found:
            combined &= spec
        return combined

    def pins(self) -> dict[str, str]:
        """``{package: version}`` for each requirement that names one exact release (``==V``, no wildcard)."""
        found = {}
        for r in self.requires:
            specs = list(r.specifier)
            if len(specs) == 1 and specs[0].operator in ("==", "===") and not specs[0].version.endswith(".*"):
                found[canonical(r.name)] = specs[0].version
        return found


def canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return str(canonicalize_name(name))


def parse_metadata(text: str, environment: dict | None = None) -> DistributionRequirements:
    """Name, version and the applicable ``Requires-Dist`` of a METADATA text. A requirement pip could not parse
    either is skipped (pip would fail on it; it is not a conflict between two packages)."""
    from email.parser import HeaderParser

    headers = HeaderParser().parsestr(text)
    return from_requires_dist(headers.get("Name") or "", headers.get("Version") or "",
                              headers.get_all("Requires-Dist") or [], environment)


def _metadata_record(text: str) -> dict:
    """A METADATA text as the record ``fetch_pinned`` keeps (the fields of pip's report it reads)."""
    from email.parser import HeaderParser

    headers = HeaderParser().parsestr(text)
    return {"name": headers.get("Name") or "", "version": headers.get("Version") or "",
            "requires_dist": headers.get_all("Requires-Dist") or []}


def from_requires_dist(name: str, version: str, requires_dist, environment: dict | None = None):
    """A ``DistributionRequirements`` from ``Requires-Dist`` strings, markers evaluated as ``parse_metadata``."""
    from packaging.requirements import InvalidRequirement, Requirement

    env = {"extra": ""}
    env.update(environment or {})
    kept = []
    for line in requires_dist:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(env):
            continue
        kept.append(requirement)
    return DistributionRequirements(canonical(name), version, tuple(kept))


def tree_metadata(tree, distribution: str) -> str | None:
    """The METADATA text of ``distribution`` inside a ``SourceTree`` (a wheel or a directory of ``*.dist-info``)."""
    prefix = canonical(distribution).replace("-", "_") + "-"
    if tree.is_zip:
        tops = {name.split("/", 1)[0] for name in tree.namelist()}
    else:
        try:
            tops = set(os.listdir(tree.root))
        except OSError:
            return None
    for top in sorted(tops):
        if top.lower().startswith(prefix) and top.endswith(".dist-info"):
            text = tree.read(f"{top}/METADATA")
            if text:
                return text
    return None


# ------------------------------------------------------------------------------------------------ the index


def _metadata_dir(directory: Path | None) -> Path:
    return (cache_dir() if directory is None else directory) / "metadata"


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".partial-", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
    os.replace(partial, path)  # atomic: concurrent checks never read half a file


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _pip_report(specs: list[str]) -> dict:
    """pip's installation report for ``specs`` (nothing installed); raises ``WheelError`` ("pip_failed")."""
    from .wheels import _NETWORK_HINTS

    pip = pip_command()
    with tempfile.TemporaryDirectory(prefix="vllm-compat-report-") as tmp:
        report = Path(tmp) / "report.json"
        result = subprocess.run(
            [*pip, "install", "--dry-run", "--no-deps", "--ignore-installed", "--only-binary", ":all:",
             "--quiet", "--report", str(report), *specs], capture_output=True, text=True)
        from ..tool_output import echo
        from ..tool_output import said as one_line

        echo(result.stderr)  # pip's warnings and errors as it printed them: --verbose only
        if result.returncode != 0 or not report.exists():
            output = result.stdout + result.stderr
            said = one_line(output) or "no output"
            raise WheelError("no_network" if _NETWORK_HINTS.search(output) else "pip_failed",
                             f"pip could not read {' '.join(specs)} from the index; pip said: {said}")
        return json.loads(report.read_text())


def _entries(report: dict) -> dict[str, dict]:
    return {canonical(item["metadata"]["name"]): item["metadata"] for item in report.get("install", [])}


def fetch_pinned(pins: dict[str, str], directory: Path | None = None, offline: bool = False):
    """METADATA of exact releases, ``{package: version}`` -> ``({package: DistributionRequirements},
    {package: why it could not be read})``. The cache answers first; the rest are asked of the index in one pip
    call (one per package when that call fails, so one missing release does not hide the others)."""
    folder = _metadata_dir(directory)
    found, failed, missing = {}, {}, {}
    for package, version in pins.items():
        cached = _read_json(folder / f"{package}-{version}.json")
        if cached is not None:
            found[package] = from_requires_dist(cached["name"], cached["version"], cached["requires_dist"])
        else:
            missing[package] = version
    if missing and offline:
        return found, {p: "not in the cache and the index was not asked (offline)" for p in missing}
    from .wheel_members import pinned_metadata  # each wheel's METADATA by range requests; pip for the rest

    for package, text in pinned_metadata(missing).items():
        record = _metadata_record(text)
        for version in {record["version"], missing[package]}:
            _write_json(folder / f"{package}-{version}.json", record)
        found[package] = from_requires_dist(record["name"], record["version"], record["requires_dist"])
    batches = [missing] if len(missing) <= 1 else [missing, *({p: v} for p, v in missing.items())]
    for batch in batches:
        batch = {p: v for p, v in batch.items() if p not in found}
        if not batch:
            continue
        try:
            entries = _entries(_pip_report([f"{p}=={v}" for p, v in batch.items()]))
        except WheelError as exc:
            if len(batch) == 1 or len(batches) == 1 or exc.kind == "no_network":
                failed.update({p: str(exc) for p in batch})
            if exc.kind == "no_network":  # asking again, one by one, would only wait longer
                break
            continue
        for package, meta in entries.items():
            requires = meta.get("requires_dist", [])
            record = {"name": meta["name"], "version": meta["version"], "requires_dist": requires}
            for version in {meta["version"], batch.get(package, meta["version"])}:  # as pinned, as released
                _write_json(folder / f"{package}-{version}.json", record)
            found[package] = from_requires_dist(meta["name"], meta["version"], requires)
    for package in missing:
        if package not in found and package not in failed:
            failed[package] = "the index did not return it"
    return found, failed


def newest_satisfying(package: str, specifier: str, directory: Path | None = None) -> str:
    """The release pip would pick for ``package`` + ``specifier`` on this machine's index (the newest satisfying
    it, pre-releases excluded as pip excludes them, a wheel for this platform). Kept for ``NEWEST_TTL_S``.
    Raises ``WheelError`` when the index cannot tell."""
    key = f"{package}{specifier}".replace("/", "_")
    path = _metadata_dir(directory) / "newest" / f"{key}.json"
    cached = _read_json(path)
    if cached is not None and time.time() - cached.get("at", 0) < NEWEST_TTL_S:
        return cached["version"]
    entries = _entries(_pip_report([f"{package}{specifier}"]))
    if package not in entries:
        raise WheelError("pip_failed", f"pip named no release of {package}{specifier}.")
    version = entries[package]["version"]
    _write_json(path, {"version": version, "at": time.time()})
    return version


# ------------------------------------------------------------------------------------------------ ranges


def _bounds(specifier) -> list:
    """Versions at, just above and just below every bound of ``specifier`` (a ``SpecifierSet``)."""
    from packaging.version import InvalidVersion, Version

    points = []
    for spec in specifier:
        text = spec.version[:-2] if spec.version.endswith(".*") else spec.version
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        release = version.release
        points.append(version)
        # just above: between V (and its post-releases) and the next release of any length
        points.append(Version(".".join(map(str, release)) + ".0.0.1"))
        nonzero = [i for i, part in enumerate(release) if part]
        if nonzero:  # just below: the last non-zero part minus one, then a large part
            i = nonzero[-1]
            points.append(Version(".".join(map(str, (*release[:i], release[i] - 1, 999999)))))
    return points


def ranges_overlap(*specifiers) -> bool:
    """Whether some version satisfies every ``SpecifierSet`` given. Decided on the versions at and beside each
    bound (an empty intersection of version ranges shows at one of them); pre-releases count, with PEP 440's
    rule that ``<V`` excludes V's own pre-releases. A range holding no actual release is not detected here."""
    from packaging.version import Version

    candidates = [Version("0"), Version("999999")]
    for specifier in specifiers:
        candidates += _bounds(specifier)
    return any(all(s.contains(v, prereleases=True) for s in specifiers) for v in candidates)


def narrows(base, specifier) -> bool:
    """Whether ``specifier`` excludes some version ``base`` admits (decided on the same points as
    ``ranges_overlap``): whether adding it to ``base`` changes anything."""
    from packaging.version import Version

    candidates = [Version("0"), Version("999999")] + _bounds(base) + _bounds(specifier)
    return any(base.contains(v, prereleases=True) and not specifier.contains(v, prereleases=True)
               for v in candidates)
