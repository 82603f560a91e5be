"""Dependency drift: the install conflicts between a vLLM release and a plugin release (vllm-omni) that a
resolver will hit, each with the override line that resolves it and whether a matrix cell proves that line.

Read: the host's (vLLM's) ``Requires-Dist``, the plugin's, and one level down the ``Requires-Dist`` of every
package the plugin pins to one release (``diffusers==0.38.0``): a pinned package is installed at that release,
so its own ranges bind exactly as the plugin's do. Markers are evaluated for this machine, no extras.

A conflict: a package on which the host's range and a plugin-side range (the plugin's own or a pinned
package's) have no version in common (``detect.requirements.ranges_overlap``). Ranges within the plugin side
that exclude each other are reported too, with no override (the plugin's own release is broken; report it
upstream).

The rule for the override (documented in docs/dependency-drift.md): the host's range wins. The plugin is the
one that adapts to a new vLLM, and the pairs were measured with vLLM's range (vllm-omni's diffusion path
native-equal). The line is ``package==V``, V chosen as:
1. the version a matrix cell of the same pair installs with (``tested_overrides.TESTED_OVERRIDES``, generated
   from matrix/vllm.toml) when it satisfies the override range: the suggestion is the tested one;
2. otherwise the newest release on this machine's index satisfying the override range (the host's range,
   narrowed by every plugin-side range that does not conflict with it; the host's range alone when those
   together exclude each other), marked untested. Without the index (offline) no version is named and the
   range is shown instead.
An exact release, not the range: ``uv pip install --override`` drops every other requirement on the package,
and a range would install whatever is newest on the day, which no cell measured.

What is not here: a release the index lacks (vLLM 0.34.0's ``flashinfer-python==0.7.3`` on this machine's
index) is not a conflict between the two packages and is not suggested: a matrix cell may carry such a line
as an ``index_overrides`` entry with its reason. Packages pinned by the host are not read one level down.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HOST_WINS = "{host}'s range wins"


@dataclass(frozen=True)
class Want:
    """One party's range on a package: ``party`` is how a user recognizes it (``vllm 0.34.0``, ``diffusers
    0.38.0 (pinned by vllm-omni 0.24.0)``)."""

    party: str
    specifier: str

    def to_dict(self) -> dict:
        return {"party": self.party, "specifier": self.specifier}


@dataclass(frozen=True)
class Conflict:
    """A package two sides want in ranges with nothing in common, and what resolves it."""

    package: str
    host: Want | None  # None: a conflict within the plugin side
    others: tuple[Want, ...]  # the plugin-side ranges that exclude the host's (or each other)
    override: str | None = None  # "huggingface-hub==2.4.0"; None when none is suggested
    override_range: str | None = None  # the range the override's release was chosen in
    source: str | None = None  # "tested" (a matrix cell's line), "newest" (the index's), None
    proven_by: tuple[str, ...] = ()  # the matrix cells of this pair installing with exactly ``override``
    installed: str | None = None  # doctor: the version installed here
    note: str | None = None  # why no override is named

    def describe(self) -> str:
        """``huggingface-hub: vllm 0.34.0 needs >=2.0.0; diffusers 0.38.0 (pinned by vllm-omni 0.24.0) needs
        <2.0,>=0.34.0``."""
        wants = ([self.host] if self.host else []) + list(self.others)
        return f"{self.package}: " + "; ".join(f"{w.party} needs {w.specifier or 'any version'}" for w in wants)

    def resolution(self) -> str:
        """What resolves it, and whether it is tested."""
        if self.host is None:
            return "no override suggested: the plugin's own requirements exclude each other (report it upstream)"
        wins = HOST_WINS.format(host=self.host.party.split()[0])
        if self.override is None:
            return f"override with a release in {self.override_range} ({wins})" + (f"; {self.note}" if self.note else "")
        if self.proven_by:
            return f"override: {self.override} ({wins}; tested by matrix cell {', '.join(self.proven_by)})"
        return f"override: {self.override} ({wins}: newest release in {self.override_range} on this index; untested)"

    def to_dict(self) -> dict:
        return {"package": self.package, "host": self.host.to_dict() if self.host else None,
                "others": [w.to_dict() for w in self.others], "override": self.override,
                "override_range": self.override_range, "source": self.source, "proven_by": list(self.proven_by),
                "installed": self.installed, "note": self.note, "text": self.describe(),
                "resolution": self.resolution()}


@dataclass(frozen=True)
class OverrideLine:
    """One line of the overrides file ``check --overrides`` writes, with why it is there: ``kind`` "conflict" (a
    dependency conflict's override), "file clash" (two resolved wheels install the same files; the line's
    ``known_clashes`` row removes it) or "missing pin" (the index lacks a pin; a matrix cell installs this
    instead); ``reasons``: the comment lines written above it; ``cells``: the matrix cells of the pair installing
    with exactly this line."""

    line: str
    kind: str
    reasons: tuple[str, ...]
    cells: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"line": self.line, "kind": self.kind, "reasons": list(self.reasons), "cells": list(self.cells),
                "tested": bool(self.cells)}


@dataclass
class DependencyDrift:
    """Every conflict of one host / plugin pair, and what could not be read (a pinned package the index did not
    answer for: its ranges are not in the verdict)."""

    host: tuple[str, str]  # (distribution, version)
    plugin: tuple[str, str]
    conflicts: list[Conflict] = field(default_factory=list)
    pinned_read: tuple[str, ...] = ()  # "diffusers 0.38.0", ...
    unread: dict[str, str] = field(default_factory=dict)  # package -> why
    # Files two installed distributions both own (detect.file_owners.FileOwners; the doctor's only): a callable is
    # called on first use, by render_lines / to_dict (--verbose, --json), never by the short screen's fields.
    _file_clashes: object = field(default=None, repr=False)
    # check's only: the pair resolved with uv, its wheels listed, the files two of them both install
    # (resolution.Resolution); None when not resolved (--no-resolve, offline inputs)
    resolution: object = None
    # check's only: the pair is to be installed (its screen has an install line, verified or said not to be), and
    # why it was not resolved where ``resolution`` is None
    for_install: bool = False
    not_resolved: str | None = None
    # {line: reason} of the matrix cells' breakage / index lines of this pair (tested_overrides.TESTED_REASONS)
    cell_reasons: dict = field(default_factory=dict)

    @property
    def file_clashes(self):
        if callable(self._file_clashes):
            self._file_clashes = self._file_clashes()
        return self._file_clashes

    @property
    def override_lines(self) -> list[str]:
        """The lines for ``uv pip install --override FILE``, one per conflict that has one."""
        return [c.override for c in self.conflicts if c.override]

    @property
    def breakage_lines(self) -> list[str]:
        """The override lines the resolution's file clashes name (``resolution.Resolution.override_lines``), each
        not already among ``override_lines``."""
        if self.resolution is None:
            return []
        return [line for line in self.resolution.override_lines if line not in self.override_lines]

    @property
    def install_overrides(self) -> list[OverrideLine]:
        """Every line the install takes, each once with its reasons: the conflicts' overrides, then every line the
        resolution named in any of its rounds (``resolution.Resolution.override_lines``): the lines its last,
        verifying round was resolved with. What ``check --overrides`` writes and ``plan``'s overrides column
        counts."""
        found = [OverrideLine(c.override, "conflict", (c.describe(), c.resolution()), tuple(c.proven_by))
                 for c in self.conflicts if c.override]
        for line in self.breakage_lines:
            kind, reasons = self.resolution.why(line)
            if line in self.cell_reasons:
                reasons = [*reasons, f"matrix: {self.cell_reasons[line]}"]
            found.append(OverrideLine(line, kind or "resolution", tuple(reasons),
                                      tuple(self.resolution.tested.get(line, ()))))
        return found

    @property
    def install_lines(self) -> list[str]:
        """``install_overrides``' lines, in order."""
        return [o.line for o in self.install_overrides]

    def install_verified(self) -> tuple[bool, str, str]:
        """(whether installing with ``install_lines`` was resolved and checked, a few words for the screen, the
        whole reason). Not verified: not resolved (--no-resolve, local wheels, uv missing or the index unreachable
        with nothing cached), no solution, a clash left; a conflict without an override is never verified."""
        if self.resolution is None:
            why = self.not_resolved or "the pair was not resolved"
            return False, "not resolved", why
        verified, why = self.resolution.verified()
        if verified and any(c.override is None for c in self.conflicts):
            return False, "a conflict has no override", "a dependency conflict has no override line named"
        if verified:
            return True, "verified", why
        status = self.resolution.last.compiled.status
        short = {"skipped": "not resolved", "failed": "not resolved", "unresolvable": "uv finds no solution"}
        return False, short.get(status, "a file clash is left"), why

    def install_texts(self, file: str = "overrides.txt") -> list[tuple[str, str]]:
        """The short screen's install lines as (text, indent of its wrapped rest): the command, with ``--override
        FILE`` only where there are lines to write, and how to write them; check's unverified install says so
        (UNVERIFIED and why) and is shown even without lines. [] where nothing is to be said (an installed pair:
        the doctor's; a verified pair that needs no line)."""
        if any(c.installed for c in self.conflicts):
            return []
        lines = self.install_lines
        (host, host_version), (plugin, plugin_version) = self.host, self.plugin
        pair = f"{host}=={host_version} {plugin}=={plugin_version}"
        command = f"uv pip install {pair}" + (f" --override {file}" if lines else "")
        written = [(f"      ({file}: vllm-compat check {pair} --overrides {file})", "       ")] if lines else []
        if not self.for_install:  # the doctor's drift of an installed pair without its conflicts installed
            return [(f"    install: {command}", "      "), *written] if lines else []
        verified, short, _ = self.install_verified()
        if verified:
            return [(f"    install: {command}", "      "), *written] if lines else []
        return [(f"    install, UNVERIFIED ({short}): {command}", "      "), *written]

    @property
    def ok(self) -> bool:
        return not self.conflicts

    def to_dict(self) -> dict:
        return {"host": {"name": self.host[0], "version": self.host[1]},
                "plugin": {"name": self.plugin[0], "version": self.plugin[1]},
                "conflicts": [c.to_dict() for c in self.conflicts], "overrides": self.override_lines,
                "pinned_read": list(self.pinned_read), "unread": dict(self.unread),
                "file_clashes": file_clashes_dict(self.file_clashes) if self.file_clashes is not None else None,
                "breakage_overrides": self.breakage_lines,
                "resolution": self.resolution.to_dict() if self.resolution is not None else None,
                "install": self._install_dict()}

    def _install_dict(self) -> dict:
        verified, short, why = self.install_verified()
        resolution = self.resolution
        return {"overrides": self.install_lines, "lines": [o.to_dict() for o in self.install_overrides],
                "verified": verified, "status": short, "text": why,
                "date": resolution.date if resolution is not None else None,
                "stale": resolution.stale if resolution is not None else None}

    def render_lines(self, indent: str = "  ") -> list[str]:
        """The check's and the doctor's lines."""
        host, plugin = " ".join(self.host), " ".join(self.plugin)
        read = f"{host}, {plugin}" + (f" and its pins {', '.join(self.pinned_read)}" if self.pinned_read else "")
        if self.ok:
            lines = [f"{indent}dependencies: no conflict (Requires-Dist of {read})"]
        else:
            lines = [f"{indent}dependencies: {len(self.conflicts)} conflict(s) a resolver will hit "
                     f"(Requires-Dist of {read})"]
            for c in self.conflicts:
                here = ""
                if c.installed:
                    same = c.override and c.override == f"{c.package}=={c.installed}"
                    here = f" [installed: {c.installed}" + (", the override below]" if same else "]")
                lines += [f"{indent}  {c.describe()}{here}", f"{indent}    -> {c.resolution()}"]
            if self.override_lines and not any(c.installed for c in self.conflicts) and not self.for_install:
                lines.append(f"{indent}  install: `vllm-compat check ... --overrides FILE` writes the line(s), then "
                             f"`uv pip install {self.host[0]}=={self.host[1]} {self.plugin[0]}=={self.plugin[1]} "
                             f"--override FILE` (pip: docs/dependency-drift.md)")
        for package, why in sorted(self.unread.items()):
            lines.append(f"{indent}  not read: {package} ({why})")
        if self.file_clashes is not None:
            lines += file_clash_lines(self.file_clashes, indent)
        if self.resolution is not None:
            lines += self.resolution.render_lines(indent)
        if self.for_install:
            verified, _, why = self.install_verified()
            pair = f"{self.host[0]}=={self.host[1]} {self.plugin[0]}=={self.plugin[1]}"
            count = len(self.install_lines)
            command = (f"`vllm-compat check ... --overrides FILE` writes the {count} line(s), then `uv pip install "
                       f"{pair} --override FILE`" if count else f"`uv pip install {pair}`")
            lines.append(f"{indent}  install: {command} (pip: docs/dependency-drift.md); "
                         f"{'verified' if verified else 'UNVERIFIED'}: {why}")
        return lines


def file_clash_lines(owners, indent: str = "  ") -> list[str]:
    """The doctor's lines for ``owners`` (``detect.file_owners.FileOwners``): each clash with whose bytes are on
    disk and its ``known_clashes`` row (the override that removes it, or why it is harmless)."""
    from .known_clashes import known_clash

    read = f"RECORDs of {owners.distributions} distributions"
    if not owners.clashes:
        lines = [f"{indent}files: no two distributions install the same file ({read})"]
    else:
        lines = [f"{indent}files: {len(owners.clashes)} pair(s) of distributions install the same files; which "
                 f"bytes are on disk depends on install order ({read})"]
    for clash in owners.clashes:
        row = known_clash(clash)
        lines += [f"{indent}  {clash.describe()}", f"{indent}    {clash.on_disk_text()}"]
        if row is None:
            lines.append(f"{indent}    -> unknown clash: check the import that fails, or add a row to "
                         f"vllm_compat/known_clashes.py")
        elif row.override:
            lines.append(f"{indent}    -> override: {row.override} ({row.reason})")
        elif row.is_harmless_for(clash):
            lines.append(f"{indent}    -> known, harmless: {row.reason}")
        else:
            lines.append(f"{indent}    -> known, NOT harmless here: {row.reason}")
            if fix := row.reinstall(clash):
                lines.append(f"{indent}    -> fix: uv pip install --reinstall --no-deps {fix}")
    for meta, why in sorted(owners.unread.items()):
        lines.append(f"{indent}  files not read: {meta} ({why})")
    return lines


def file_clashes_dict(owners) -> dict:
    """``owners.to_dict()`` with each clash's ``known`` row, ``harmless`` (here), ``override`` and ``reinstall``,
    and, of all, the override lines (``overrides``) and the requirements to reinstall (``reinstall``)."""
    from .known_clashes import known_clash

    data = owners.to_dict()
    for clash, entry in zip(owners.clashes, data["clashes"], strict=True):
        row = known_clash(clash)
        entry.update(known=row.to_dict() if row else None, override=row.override if row else None,
                     harmless=bool(row and row.is_harmless_for(clash)),
                     reinstall=row.reinstall(clash) if row else None)
    data["overrides"] = [c["override"] for c in data["clashes"] if c["override"]]
    data["reinstall"] = [c["reinstall"] for c in data["clashes"] if c["reinstall"]]
    return data


# ------------------------------------------------------------------------------------------------ compute


def find_conflicts(host, plugin, pinned: dict) -> list[Conflict]:
    """The conflicts among ``host`` and ``plugin`` (``DistributionRequirements``) and the plugin's ``pinned``
    packages' requirements (``{package: DistributionRequirements}``), without overrides; sorted by package."""
    from packaging.specifiers import SpecifierSet

    from .detect.requirements import ranges_overlap

    plugin_party = f"{plugin.name} {plugin.version}"
    parties = [(plugin_party, plugin)] + [(f"{d.name} {d.version} (pinned by {plugin_party})", d)
                                          for _, d in sorted(pinned.items())]
    packages = {str(r.name) for _, d in parties for r in d.requires}
    conflicts = []
    from .detect.requirements import canonical

    for package in sorted({canonical(p) for p in packages}):
        host_spec = host.on(package)
        if package == host.name:  # the host is itself a fixed release: a plugin range on it must admit it
            host_spec = SpecifierSet(f"=={host.version}")
        wants = [(party, d.on(package)) for party, d in parties if d.on(package) is not None]
        if host_spec is not None:
            against = [Want(party, str(spec)) for party, spec in wants if not ranges_overlap(host_spec, spec)]
            if against:
                conflicts.append(Conflict(package, Want(f"{host.name} {host.version}", str(host_spec)),
                                          tuple(against)))
                continue
        for i, (party, spec) in enumerate(wants):  # within the plugin side
            clash = [Want(p, str(s)) for p, s in wants[i + 1:] if not ranges_overlap(spec, s)]
            if clash:
                conflicts.append(Conflict(package, None, (Want(party, str(spec)), *clash)))
                break
    return conflicts


def override_range(conflict: Conflict, host, plugin, pinned: dict) -> str:
    """The host's range on the package, narrowed by every plugin-side range that does not conflict with it
    (the host's alone when those together leave nothing)."""
    from packaging.specifiers import SpecifierSet

    from .detect.requirements import narrows, ranges_overlap

    host_spec = SpecifierSet(conflict.host.specifier)
    narrowed = SpecifierSet(str(host_spec))
    for d in [plugin, *pinned.values()]:
        spec = d.on(conflict.package)
        if spec is not None and ranges_overlap(host_spec, spec):
            for one in spec:  # only the bounds that exclude something the host's range admits
                if narrows(narrowed, SpecifierSet(str(one))):
                    narrowed &= SpecifierSet(str(one))
    return str(narrowed if ranges_overlap(narrowed) else host_spec)


def resolve_overrides(conflicts: list[Conflict], host, plugin, pinned: dict, tested=None,
                      newest=None) -> list[Conflict]:
    """Each host-side conflict with its override, by the module's rule. ``tested``: ``{package: (line, cells)}``
    of the matrix cells of this pair; ``newest(package, range) -> version`` asks the index (None: offline)."""
    from dataclasses import replace

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    from .detect.wheels import WheelError

    tested = tested or {}
    resolved = []
    for conflict in conflicts:
        if conflict.host is None:
            resolved.append(conflict)
            continue
        allowed = override_range(conflict, host, plugin, pinned)
        line, cells = tested.get(conflict.package, (None, ()))
        if line is not None:
            pinned_to = [s.version for s in Requirement(line).specifier if s.operator == "=="]
            if pinned_to and SpecifierSet(allowed).contains(pinned_to[0], prereleases=True):
                resolved.append(replace(conflict, override=line, override_range=allowed, source="tested",
                                        proven_by=tuple(cells)))
                continue
        if newest is None:
            resolved.append(replace(conflict, override_range=allowed,
                                    note="the index was not asked for its newest release (offline)"))
            continue
        try:
            version = newest(conflict.package, allowed)
        except WheelError as exc:
            resolved.append(replace(conflict, override_range=allowed, note=f"the index did not say: {exc}"))
            continue
        override = f"{conflict.package}=={version}"
        resolved.append(replace(conflict, override=override, override_range=allowed, source="newest",
                                proven_by=tuple(cells) if override == line else ()))
    return resolved


def tested_for(host: tuple[str, str], plugin: tuple[str, str]) -> dict:
    """``{package: (line, (cell, ...))}``: the resolver overrides matrix cells of this pair install with."""
    from packaging.requirements import Requirement

    from .detect.requirements import canonical
    from .tested_overrides import TESTED_OVERRIDES

    found: dict[str, tuple[str, list]] = {}
    for (h, hv, p, pv), cells in TESTED_OVERRIDES.items():
        if (canonical(h), hv, canonical(p), pv) != (canonical(host[0]), host[1], canonical(plugin[0]), plugin[1]):
            continue
        for cell, lines in cells.items():
            for line in lines:
                package = canonical(Requirement(line).name)
                found.setdefault(package, (line, []))
                if found[package][0] == line:
                    found[package][1].append(cell)
    return {package: (line, tuple(cells)) for package, (line, cells) in found.items()}


def detect_dependency_drift(host, plugin, *, offline: bool = False, directory=None,
                            use_tested: bool = True) -> DependencyDrift:
    """The drift of a pair from its two ``DistributionRequirements`` (or METADATA texts): the plugin's pins are
    read from the index (or only the cache when ``offline``), conflicts found, overrides chosen
    (``use_tested=False``: the matrix's lines are not preferred, the newest release is named for every conflict,
    as the matrix intake chooses them; a cell installing with exactly that line still counts as proving it)."""
    from .detect.requirements import fetch_pinned, newest_satisfying, parse_metadata

    host = parse_metadata(host) if isinstance(host, str) else host
    plugin = parse_metadata(plugin) if isinstance(plugin, str) else plugin
    pinned, unread = fetch_pinned(plugin.pins(), directory=directory, offline=offline)
    conflicts = find_conflicts(host, plugin, pinned)
    pair = ((host.name, host.version), (plugin.name, plugin.version))
    newest = None if offline else (lambda package, spec: newest_satisfying(package, spec, directory=directory))
    tested = tested_for(*pair)
    conflicts = resolve_overrides(conflicts, host, plugin, pinned, tested if use_tested else None, newest)
    if not use_tested:
        conflicts = [_proven(c, tested) for c in conflicts]
    return DependencyDrift(*pair, conflicts=conflicts,
                           pinned_read=tuple(f"{d.name} {d.version}" for _, d in sorted(pinned.items())),
                           unread=unread)


def _proven(conflict: Conflict, tested: dict) -> Conflict:
    from dataclasses import replace

    line, cells = tested.get(conflict.package, (None, ()))
    return replace(conflict, proven_by=tuple(cells) if conflict.override and conflict.override == line else ())


def installed_dependency_drift(host: str | None = None, plugin: str | None = None, stamps: dict | None = None):
    """The doctor's drift for the installed pair (default: ``detect.wheels.PACKAGES``'s two, vLLM and vllm-omni),
    from installed METADATA only (no index): each conflict with the version installed here; the override named
    only where a matrix cell tests it. None when either is absent. It also carries, computed on first use, the
    files two installed distributions both own (``detect.file_owners``, ``known_clashes``: ``file_clashes``).
    ``stamps``: a dict filled with ``{distribution: detect.versions.metadata_stamp}`` of every installed metadata
    read, each taken before it is read (a file that changes meanwhile leaves an older stamp, never a newer one):
    what the result depends on besides vllm_compat's own files, the key ``StaticSite.installed_dependency_drift``
    keeps it under."""
    from .detect.versions import installed_metadata, installed_version, metadata_stamp
    from .detect.wheels import PACKAGES

    host, plugin = host or list(PACKAGES)[0], plugin or list(PACKAGES)[1]
    stamps = {} if stamps is None else stamps

    def metadata_of(distribution: str) -> str | None:
        stamps.setdefault(distribution, metadata_stamp(distribution))
        return installed_metadata(distribution)

    def version_of(distribution: str) -> str | None:
        stamps.setdefault(distribution, metadata_stamp(distribution))
        return installed_version(distribution)

    host_text, plugin_text = metadata_of(host), metadata_of(plugin)
    if host_text is None or plugin_text is None:
        return None
    from .detect.requirements import parse_metadata

    host_req, plugin_req = parse_metadata(host_text), parse_metadata(plugin_text)
    pinned, unread = {}, {}
    for package, version in plugin_req.pins().items():
        text = metadata_of(package)
        if text is None:
            unread[package] = f"pinned {version} by {plugin_req.name}, not installed"
            continue
        pinned[package] = parse_metadata(text)
    pair = ((host_req.name, host_req.version), (plugin_req.name, plugin_req.version))
    conflicts = resolve_overrides(find_conflicts(host_req, plugin_req, pinned), host_req, plugin_req, pinned,
                                  tested_for(*pair), newest=None)
    from dataclasses import replace

    conflicts = [replace(c, installed=version_of(c.package),
                         note=None if c.override else "no matrix cell tests this pair's override")
                 for c in conflicts]
    return DependencyDrift(*pair, conflicts=conflicts,
                           pinned_read=tuple(f"{d.name} {d.version}" for _, d in sorted(pinned.items())),
                           unread=unread, _file_clashes=installed_file_clashes)


def installed_file_clashes():
    """``detect.file_owners.find_file_clashes()``, imported when first called (``--verbose``, ``--json``): the
    short screen never reads the RECORDs."""
    from .detect.file_owners import find_file_clashes

    return find_file_clashes()


def overrides_text(drift: DependencyDrift, path) -> str:
    """The file ``check --overrides`` writes: a header (the pair, how to use it, whether the install with these
    lines was verified and when), then each of ``drift.install_overrides`` under a comment per reason."""
    verified, _, why = drift.install_verified()
    lines = [f"# vllm-compat check: {' '.join(drift.host)} + {' '.join(drift.plugin)}; "
             f"use with `uv pip install --override {path}`",
             f"# {'verified' if verified else 'UNVERIFIED'}: {why}"]
    for item in drift.install_overrides:
        lines += [f"# {reason}" for reason in item.reasons] + [item.line]
    return "\n".join(lines) + "\n"


def write_overrides(path, drift: DependencyDrift) -> int:
    """Write ``overrides_text`` to ``path``; returns how many lines it holds (``drift.install_lines``)."""
    from pathlib import Path

    Path(path).write_text(overrides_text(drift, path))
    return len(drift.install_lines)


def check_dependency_drift(host_tree, host: str, plugin_tree, plugin: str, offline: bool = False):
    """``vllm-compat check``'s drift: the two METADATA read from the wheels or trees it scans (``SourceTree``s),
    the plugin's pins from the index (the cache only when ``offline``). None when a tree has no ``*.dist-info``
    of its distribution (an unpacked source tree): there is nothing to read the requirements from."""
    from .detect.requirements import tree_metadata

    host_text, plugin_text = tree_metadata(host_tree, host), tree_metadata(plugin_tree, plugin)
    if host_text is None or plugin_text is None:
        return None
    drift = detect_dependency_drift(host_text, plugin_text, offline=offline)
    drift.for_install = True
    drift.cell_reasons = tested_reasons(drift.host, drift.plugin)
    return drift


def tested_reasons(host: tuple[str, str], plugin: tuple[str, str]) -> dict:
    """``{line: reason}``: the reasons the matrix cells of this pair give their breakage / index lines."""
    from .detect.requirements import canonical
    from .tested_overrides import TESTED_REASONS

    for (h, hv, p, pv), reasons in TESTED_REASONS.items():
        if (canonical(h), hv, canonical(p), pv) == (canonical(host[0]), host[1], canonical(plugin[0]), plugin[1]):
            return dict(reasons)
    return {}
