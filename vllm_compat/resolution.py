"""Resolver-made breakage, found before install: resolve the pair as a user would, list every wheel the resolver
picked without downloading it, and name each pair of distributions that install the same file.

A resolver checks names and ranges, not files: ``uv pip compile vllm==0.33.0 vllm-omni==0.24.0`` picks
cuda-python 12.6.2.post1 (an old monolithic wheel) beside cuda-bindings 13.5.0, and both write the same 28 files
(docs/dependency-drift.md). ``vllm-compat check`` finds this class here:

1. ``compile``: ``uv pip compile`` of the pair with the override lines check already suggests (the dependency
   conflicts'), for this interpreter (``--python sys.executable``: its version and platform tags), against uv's
   own index configuration (PyPI unless the user configured uv otherwise; uv does not read pip's), as
   ``pylock.toml``: every package with its wheels' URLs, hashes and sizes. No uv on PATH: skipped, and said so. A
   resolution that fails is itself a finding: uv's reason in one line, and the pins the index lacks
   (``missing``: vLLM 0.34.0's ``flashinfer-python==0.7.3`` on 2026-12-05). Kept per (requirements, override
   lines, this interpreter's best tag, uv's index variables) and UTC date in ``resolutions/`` of the check's wheel
   cache: the set moves daily, so a resolution is good for the day it was made. When uv cannot answer today (the
   index unreachable, uv gone), the newest earlier answer of the same key is given instead, marked with its date
   and why today's was not made (``Compiled.stale``): a pair checked before keeps its answer offline.
2. ``detect.wheel_listing``: each package's wheel for this interpreter (the one an installer picks: the best
   ``packaging.tags.sys_tags`` match) is listed by HTTP range requests on its zip's end, concurrently, cached per
   sha256. A package with no wheel (an sdist, built at install) is named, not listed.
3. ``detect.file_owners.find_listing_clashes``: the pairs owning one file, by the same rules as the installed
   side, with how many shared files differ by CRC-32; each judged by its ``known_clashes`` row: an override line
   (written by ``check --overrides`` beside the conflict overrides, each with its reason), harmless, harmless once
   one side is reinstalled (``wins``), or unknown. The clashes of a set of wheels (each one's file name and
   sha256) are kept in ``resolutions/clashes/``: a resolution picking the same set reads them instead of every
   listing. When overrides are named, the pair is resolved again with them and listed (``fix``): the
   suggestion is checked, not assumed. The lines a matrix cell of the pair installs with are compiled from the
   start, in every combination (``compile_ahead``): such a round reads uv's answer instead of waiting for it.

What this does not change: the verdict and exit code, as for dependency conflicts (they say whether the pair
starts once installed as check says; the dependency lines say what installing takes). An unknown clash, or a
pair that does not resolve, is said on the short screen's dependencies line.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

RESOLUTION_FORMAT = 3  # bump when the cached file's shape changes (3: the key leaves the date out)
UV_TIMEOUT_S = 600
# uv's index settings a user may have set: part of the cache key (another index, another resolution)
UV_INDEX_VARS = ("UV_INDEX", "UV_DEFAULT_INDEX", "UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_FIND_LINKS",
                 "UV_INDEX_STRATEGY", "UV_PRERELEASE", "UV_EXCLUDE_NEWER", "UV_CONFIG_FILE", "UV_NO_CONFIG")
# uv's words for "the index could not be reached"
_UV_NETWORK = re.compile(r"error sending request|dns error|Could not connect|Connection refused|failed to lookup "
                         r"address|Network is unreachable|operation timed out|tcp connect error|Failed to fetch",
                         re.I)
_NAME = r"([A-Za-z0-9][A-Za-z0-9._-]*?)"
_SPEC = r"((?:===|==|!=|~=|<=|>=|<|>)[^\s,]+)?"
_MISSING = (re.compile(rf"there is no version of {_NAME}{_SPEC}(?=[\s,])"),
            re.compile(rf"\b{_NAME}{_SPEC} was not found in the (?:package registry|provided package locations)"),
            re.compile(rf"only {_NAME}(?:[<>=!~]=?)[^\s,]+ (?:is|are) available"))


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ------------------------------------------------------------------------------------------------ step 1: uv


@dataclass
class Compiled:
    """One ``uv pip compile``: ``status`` "resolved" (``packages``: [(name, version, RemoteWheel or None)]),
    "unresolvable" (``reason``, ``missing``), "failed" (uv could not run or reach the index: ``reason``) or
    "skipped" (``reason``: no uv, no TOML reader)."""

    status: str
    command: list[str]
    requirements: list[str]
    overrides: list[str]
    packages: list = field(default_factory=list)
    reason: str | None = None
    missing: list[str] = field(default_factory=list)
    uv: str | None = None  # `uv --version`
    date: str | None = None  # the UTC day it was made
    seconds: float = 0.0
    cached: bool = False
    # why today's resolution could not be made (uv's reason: the index unreachable, uv missing) when this is an
    # earlier day's answer from the cache (``date``); None for today's
    stale: str | None = None

    @property
    def wheels(self) -> list:
        return [wheel for _, _, wheel in self.packages if wheel is not None]

    @property
    def no_wheel(self) -> list[str]:
        """The packages resolved to an sdist only (built at install: their files are not known before)."""
        return [f"{name} {version}" for name, version, wheel in self.packages if wheel is None]

    def version_of(self, name: str) -> str | None:
        return next((v for n, v, _ in self.packages if n == _canonical(name)), None)

    def to_dict(self) -> dict:
        return {"status": self.status, "command": " ".join(self.command), "requirements": self.requirements,
                "overrides": self.overrides, "reason": self.reason, "missing": self.missing, "uv": self.uv,
                "date": self.date, "resolved": len(self.packages),
                "packages": {name: version for name, version, _ in self.packages}, "no_wheel": self.no_wheel,
                "resolve_seconds": round(self.seconds, 3), "cached": self.cached, "stale": self.stale}


def _toml_loads():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        try:
            import tomli as tomllib
        except ModuleNotFoundError:
            return None
    return tomllib.loads


def _best_wheel(name: str, version: str, wheels: list[dict]):
    """The wheel an installer picks for this interpreter: the one with the best-ranked tag of
    ``packaging.tags.sys_tags`` (None when none of them is for it)."""
    from packaging.tags import sys_tags
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    from .detect.wheel_listing import RemoteWheel

    rank = {tag: i for i, tag in enumerate(sys_tags())}
    best, best_rank = None, len(rank)
    for wheel in wheels:
        url = wheel.get("url")
        if not url:
            continue
        try:
            tags = parse_wheel_filename(url.rsplit("/", 1)[-1].split("#", 1)[0])[3]
        except InvalidWheelFilename:
            continue
        score = min((rank.get(tag, len(rank)) for tag in tags), default=len(rank))
        if score < best_rank:
            best, best_rank = wheel, score
    if best is None:
        return None
    return RemoteWheel(name, version, best["url"], (best.get("hashes") or {}).get("sha256"), best.get("size"))


def parse_pylock(text: str, loads=None) -> list:
    """``[(name, version, RemoteWheel or None)]`` of a pylock.toml's packages (canonical names, sorted)."""
    loads = loads or _toml_loads()
    data = loads(text)
    found = []
    for package in data.get("packages", []):
        name, version = _canonical(package["name"]), str(package.get("version", "?"))
        found.append((name, version, _best_wheel(name, version, package.get("wheels") or [])))
    return sorted(found, key=lambda item: item[0])


def _missing(text: str) -> list[str]:
    """The requirements the index has no release for, from uv's explanation: ``flashinfer-python==0.7.3``."""
    found = []
    for pattern in _MISSING:
        for match in pattern.finditer(text):
            name = match.group(1)
            spec = match.group(2) if pattern.groups > 1 else None
            if not spec:  # "only NAME<=X is available and ... depends on NAME==Y": the pin asked for
                asked = re.search(rf"depends on {re.escape(name)}{_SPEC}", text)
                spec = asked.group(1) if asked else ""
            item = f"{_canonical(name)}{spec or ''}"
            if item not in found:
                found.append(item)
    return found


def _reason(stderr: str) -> str:
    """uv's error in one line: its first ``Because ...`` sentence, else its last ``error:`` line, else the last
    line."""
    text = " ".join(line.strip().lstrip("╰─▶×").strip() for line in stderr.splitlines() if line.strip())
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    because = re.search(r"Because .*?(?:\.(?=\s|$)|$)", text)
    if because:
        return because.group(0)
    errors = [line.strip() for line in stderr.splitlines() if line.strip().startswith("error:")]
    return errors[-1] if errors else (stderr.strip().splitlines() or ["no output"])[-1].strip()


def _network_reason(stderr: str) -> str:
    """uv's failure to reach the index in one line: ``the index could not be reached (<what uv fetched>: <the
    last cause>)``."""
    causes = [line.split("cause:", 1)[1].strip() for line in stderr.splitlines() if "cause:" in line]
    fetched = next((c for c in causes if c.startswith("Failed to fetch")), None)
    detail = "; ".join(part for part in (fetched, causes[-1] if causes else None) if part) or _reason(stderr)
    return f"the index could not be reached ({detail})"


def uv_path() -> str | None:
    return shutil.which("uv")


def _cache_key(requirements: list[str], overrides: list[str]) -> str:
    """The key of a resolution's answers, one file per UTC day (``_answer_path``): what it depends on but the day."""
    from packaging.tags import sys_tags

    env = {var: os.environ[var] for var in UV_INDEX_VARS if os.environ.get(var)}
    material = json.dumps([RESOLUTION_FORMAT, requirements, sorted(overrides), str(next(iter(sys_tags()))), env],
                          sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:24]


def _today() -> str:
    from datetime import datetime, timezone

    return datetime.now(timezone.utc).strftime("%Y-%m-%d")


def _resolutions_folder(directory: Path | None) -> Path:
    """``resolutions/`` of the check's wheel cache (or of ``directory``): uv's answers, and the kept clashes."""
    from .detect.wheels import cache_dir

    return (cache_dir() if directory is None else Path(directory)) / "resolutions"


def _answer_path(folder: Path, key: str, date: str) -> Path:
    return folder / f"{key}-{date}.json"


def _earlier_answer(folder: Path, key: str, date: str) -> dict | None:
    """The newest cached answer of ``key`` made before ``date`` (a readable one of this format); None if none."""
    found = []
    for path in folder.glob(f"{key}-*.json"):
        day = path.name[len(key) + 1:-len(".json")]
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", day) and day < date:
            found.append((day, path))
    for _, path in sorted(found, reverse=True):
        data = _read_answer(path)
        if data is not None:
            return data
    return None


def _read_answer(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == RESOLUTION_FORMAT else None


def compile_pair(requirements: list[str], overrides: list[str], directory: Path | None = None,
                 timeout: float = UV_TIMEOUT_S, cache_only: str | None = None) -> Compiled:
    """``uv pip compile`` of ``requirements`` with ``overrides`` (see the module docstring): the day's cached
    answer when there is one; else uv's; where uv cannot answer ("failed": the index unreachable; "skipped": no uv
    or no TOML reader), the newest earlier answer of the same key, with ``stale`` saying why, else uv's failure.
    ``cache_only`` (why uv is not run: an earlier resolution of the same check could not reach the index, and
    uv's retries take 5-11 s each): the cached answers only."""
    date = _today()
    shown = ["uv", "pip", "compile", "requirements.in", *(["--override", "overrides.txt"] if overrides else []),
             "--format", "pylock.toml", "--python", sys.executable]
    folder = _resolutions_folder(directory)
    key = _cache_key(requirements, overrides)
    path = _answer_path(folder, key, date)
    cached = _read_answer(path)
    if cached is not None:
        try:
            return _from_cache(cached, shown, requirements, overrides)
        except (KeyError, TypeError):
            pass
    if cache_only is not None:
        compiled = Compiled("failed", shown, requirements, overrides, date=date, reason=cache_only)
    else:
        compiled = _run_uv(requirements, overrides, shown, date, timeout)
    if compiled.status in ("failed", "skipped"):  # uv could not answer today: an earlier day's answer, if any
        earlier = _earlier_answer(folder, key, date)
        if earlier is not None:
            try:
                return _from_cache(earlier, shown, requirements, overrides, stale=compiled.reason)
            except (KeyError, TypeError):
                pass
        return compiled
    _write_json(path, {"format": RESOLUTION_FORMAT, **compiled.to_dict(),
                       "wheels": {w.name: w.to_dict() for w in compiled.wheels}})
    return compiled


def _run_uv(requirements: list[str], overrides: list[str], shown: list[str], date: str, timeout: float) -> Compiled:
    """One ``uv pip compile`` now (see ``compile_pair``)."""
    uv = uv_path()
    if uv is None:
        return Compiled("skipped", shown, requirements, overrides, date=date,
                        reason="uv is not on PATH (install it: `pip install uv`); the pair was not resolved")
    loads = _toml_loads()
    if loads is None:
        return Compiled("skipped", shown, requirements, overrides, date=date,
                        reason="reading uv's pylock.toml needs Python 3.11 (tomllib) or the tomli package")
    start = time.perf_counter()
    version = subprocess.run([uv, "--version"], capture_output=True, text=True).stdout.strip() or None
    with tempfile.TemporaryDirectory(prefix="vllm-compat-resolve-") as tmp:
        work = Path(tmp)
        (work / "requirements.in").write_text("\n".join(requirements) + "\n")
        command = [uv, "pip", "compile", "requirements.in", "--format", "pylock.toml", "-o", "pylock.toml",
                   "--python", sys.executable, "--no-header", "--no-progress", "--color", "never"]
        if overrides:
            (work / "overrides.txt").write_text("\n".join(overrides) + "\n")
            command[4:4] = ["--override", "overrides.txt"]
        try:  # in a directory of its own: no project's pyproject.toml / uv.toml around it is read
            result = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return Compiled("failed", shown, requirements, overrides, uv=version, date=date,
                            seconds=time.perf_counter() - start, reason=f"uv did not finish in {timeout:.0f} s")
        except OSError as exc:
            return Compiled("failed", shown, requirements, overrides, uv=version, date=date,
                            reason=f"uv could not run: {exc}")
        seconds = time.perf_counter() - start
        from .tool_output import echo

        echo(result.stderr)  # uv's own output: --verbose only; a failure is said in one line below
        if result.returncode != 0 or not (work / "pylock.toml").is_file():
            missing = _missing(result.stderr)
            network = bool(_UV_NETWORK.search(result.stderr)) and not missing
            reason = _network_reason(result.stderr) if network else _reason(result.stderr)
            return Compiled("failed" if network or "No solution found" not in result.stderr else "unresolvable",
                            shown, requirements, overrides, reason=reason, missing=missing,
                            uv=version, date=date, seconds=seconds)
        packages = parse_pylock((work / "pylock.toml").read_text(), loads)
        return Compiled("resolved", shown, requirements, overrides, packages=packages, uv=version, date=date,
                        seconds=seconds)


def _from_cache(data: dict, shown, requirements, overrides, stale: str | None = None) -> Compiled:
    from .detect.wheel_listing import RemoteWheel

    wheels = {name: RemoteWheel(**w) for name, w in data.get("wheels", {}).items()}
    packages = [(name, version, wheels.get(name)) for name, version in sorted(data.get("packages", {}).items())]
    return Compiled(data["status"], shown, requirements, overrides, packages=packages, reason=data.get("reason"),
                    missing=list(data.get("missing", [])), uv=data.get("uv"), date=data.get("date"),
                    seconds=data.get("resolve_seconds", 0.0), cached=True, stale=stale)


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=".partial-", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle)
    os.replace(partial, path)


# ------------------------------------------------------------------------------------------------ steps 2-3


@dataclass(frozen=True)
class ClashFinding:
    """One pair of resolved wheels installing the same files, with its ``known_clashes`` row and what it takes:
    ``action`` "override" (``row.override``), "harmless", "reinstall" (harmless once ``fix`` is reinstalled after
    the install: an overlay, ``KnownClash.wins``), "not_harmless" (a harmless row whose condition fails here: a
    missing library) or "unknown" (no row)."""

    clash: object  # detect.file_owners.FileClash
    row: object = None  # known_clashes.KnownClash
    action: str = "unknown"
    fix: str | None = None  # the override line, or the requirement to reinstall

    @property
    def handled(self) -> bool:
        return self.action in ("override", "harmless", "reinstall")

    def pair(self) -> str:
        return f"{self.clash.first.label} / {self.clash.second.label}"

    def resolution(self) -> str:
        reason = f" ({self.row.reason})" if self.row is not None else ""
        return {
            "override": f"override: {self.fix}{reason}",
            "harmless": f"known, harmless{reason}",
            "reinstall": f"known, harmless once {self.fix} is reinstalled after the install (`uv pip install "
                         f"--reinstall --no-deps {self.fix}`){reason}",
            "not_harmless": f"known, NOT harmless here{reason}",
            "unknown": "UNKNOWN clash: which bytes run depends on install order; check the import that fails, or "
                       "add a row to vllm_compat/known_clashes.py",
        }[self.action]

    def to_dict(self) -> dict:
        return {**self.clash.to_dict(), "known": self.row.to_dict() if self.row is not None else None,
                "action": self.action, "fix": self.fix, "handled": self.handled, "resolution": self.resolution()}


def judge(clash) -> ClashFinding:
    """``clash``'s row and what it takes (see ``ClashFinding``)."""
    from .known_clashes import known_clash

    row = known_clash(clash)
    if row is None:
        return ClashFinding(clash)
    if row.override:
        return ClashFinding(clash, row, "override", row.override)
    if row.harmless and row.wins is not None:
        winner = clash.first if clash.first.name == row.wins else clash.second
        return ClashFinding(clash, row, "reinstall", f"{winner.name}=={winner.version}")
    if row.is_harmless_for(clash):
        return ClashFinding(clash, row, "harmless")
    return ClashFinding(clash, row, "not_harmless")


@dataclass
class Resolved:
    """One resolution and what its wheels' listings show: the ``Compiled`` answer, the listings' cost, the
    wheels not listed (``{file name: why}``) and each clash judged."""

    compiled: Compiled
    listed: int = 0
    unlisted: dict = field(default_factory=dict)
    fetched_bytes: int = 0
    requests: int = 0
    listings_cached: int = 0
    list_seconds: float = 0.0
    findings: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return {**self.compiled.to_dict(), "listed": self.listed, "unlisted": dict(self.unlisted),
                "fetched_bytes": self.fetched_bytes, "requests": self.requests,
                "listings_cached": self.listings_cached, "list_seconds": round(self.list_seconds, 3),
                "clashes": [f.to_dict() for f in self.findings]}


def resolve_and_list(requirements: list[str], overrides: list[str], directory: Path | None = None,
                     cache_only: str | None = None) -> Resolved:
    """Steps 1-3 of the module docstring for one set of override lines (``cache_only``: see ``compile_pair``)."""
    from .detect.file_owners import Distribution, find_listing_clashes
    from .detect.wheel_listing import list_wheels

    compiled = compile_pair(requirements, overrides, directory, cache_only=cache_only)
    if compiled.status != "resolved":
        return Resolved(compiled)
    wheels = compiled.wheels
    kept_path = _clashes_path(directory, wheels)
    kept = _read_clashes(kept_path)
    if kept is not None:  # the same wheels listed before: their clashes, not ~230 listings read and keyed again
        listed, clashes = kept
        return Resolved(compiled, listed, {}, 0, 0, listed, 0.0, [judge(c) for c in clashes])
    read = list_wheels(wheels, directory)
    clashes = find_listing_clashes([(Distribution(item.wheel.name, item.wheel.version, item.wheel.filename),
                                     item.files) for item in read.listings])
    if not read.errors:  # a wheel not listed (the index unreachable) may list next time: nothing kept
        _write_json(kept_path, {"format": RESOLUTION_FORMAT, "listed": len(read.listings),
                                "clashes": [asdict(c) for c in clashes]})
    return Resolved(compiled, len(read.listings), read.errors, read.fetched_bytes, read.requests, read.cached,
                    read.seconds, [judge(c) for c in clashes])


def _clashes_path(directory: Path | None, wheels) -> Path:
    """Where the clashes of one set of wheels are kept: named by the set (each wheel's file name and sha256), so
    any resolution, of any day, that picks the same wheels reads them."""
    folder = _resolutions_folder(directory) / "clashes"
    material = json.dumps(sorted((w.filename, w.sha256 or w.url) for w in wheels))
    return folder / f"{hashlib.sha256(material.encode()).hexdigest()[:32]}.json"


def _read_clashes(path: Path) -> tuple[int, list] | None:
    """(wheels listed, their ``FileClash``es) as ``resolve_and_list`` kept them; None if not kept or unreadable."""
    from .detect.file_owners import Distribution, FileClash

    data = _read_answer(path)
    if data is None:
        return None
    try:
        return data["listed"], [FileClash(**{**c, "first": Distribution(**c["first"]),
                                             "second": Distribution(**c["second"]), "paths": tuple(c["paths"])})
                                for c in data["clashes"]]
    except (KeyError, TypeError):
        return None


@dataclass
class Resolution:
    """``check``'s resolution of a pair: ``first`` with the conflict overrides alone, then, while a resolution
    names override lines not tried yet, one more round with them added (``rounds``, oldest first; ``fix`` is the
    last: what the user installs with ``--overrides``)."""

    first: Resolved
    fix: Resolved | None = None
    seconds: float = 0.0
    # {override line: the matrix cells of the pair that install with it} (tested_overrides: the cells'
    # breakage_overrides), set by check: an override line a cell proves is "tested"
    tested: dict[str, tuple[str, ...]] = field(default_factory=dict)
    rounds: list = field(default_factory=list)  # every re-resolution, ``fix`` last

    @property
    def status(self) -> str:
        return self.first.compiled.status

    @property
    def findings(self) -> list:
        return self.first.findings

    @property
    def resolutions(self) -> list:
        """``first``, then every round (``fix`` alone where ``rounds`` was not kept)."""
        rounds = self.rounds or ([self.fix] if self.fix is not None else [])
        return [self.first, *rounds]

    @property
    def override_lines(self) -> list[str]:
        """The override lines this resolution names (each once), for ``check --overrides``: the clashes' and, for a
        pin the index lacks, the line a matrix cell of the pair installs instead (``tested``), of the first
        resolution and of every round after it: every line the last round was resolved with, beside the
        conflict overrides it started from (vLLM 0.34.0 + vllm-omni 0.24.0: flashinfer-python==0.7.4 from the
        first, cuda-python==13.4.4 from the round with it)."""
        lines: list[str] = []
        for resolved in self.resolutions:
            lines += [line for line in named_lines(resolved, self.tested) if line not in lines]
        return lines

    def why(self, line: str) -> tuple[str, list[str]]:
        """(kind, reasons) of one of ``override_lines``: "file clash" (each clash a resolution showed that the
        line removes, with its ``known_clashes`` row's reason) or "missing pin" (the pin the index lacks that the
        line replaces, and the matrix cells installing it); ("", []) for a line this resolution did not name."""
        reasons: list[str] = []
        for resolved in self.resolutions:
            for finding in resolved.findings:
                if finding.action == "override" and finding.fix == line:
                    text = f"file clash: {finding.clash.describe()}"
                    if text not in reasons:
                        reasons += [text, f"known_clashes: {finding.row.reason}"]
        if reasons:
            return "file clash", reasons
        name = _canonical(re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0])
        for resolved in self.resolutions:
            for pin in resolved.compiled.missing:
                if _canonical(re.split(r"[<>=!~;\[ ]", pin, maxsplit=1)[0]) == name:
                    cells = self.tested.get(line, ())
                    return "missing pin", [f"not on the index: {pin} (uv: {resolved.compiled.reason}); "
                                           + (f"matrix cell{'s' * (len(cells) > 1)} {', '.join(cells)} "
                                              f"install{'s' * (len(cells) == 1)} {line} instead" if cells
                                              else f"{line} instead, untested")]
        return "", []

    @property
    def unknown(self) -> list:
        """The clashes nothing handles: unknown, or a harmless row whose condition fails here."""
        return [f for f in self.findings if not f.handled]

    @property
    def last(self) -> Resolved:
        """The resolution whose lines a user installs with: ``fix`` where there was a round, else ``first``."""
        return self.fix if self.fix is not None else self.first

    @property
    def stale(self) -> str | None:
        """Why today's resolution was not made (the index unreachable, uv missing), where an earlier day's answer
        from the cache stands in for any of the resolutions; None when all are today's."""
        return next((r.compiled.stale for r in self.resolutions if r.compiled.stale), None)

    @property
    def date(self) -> str | None:
        """The UTC day of the oldest resolution used (today's, or a cached earlier one's offline)."""
        dates = [r.compiled.date for r in self.resolutions if r.compiled.date]
        return min(dates) if dates else None

    def verified(self) -> tuple[bool, str]:
        """(whether the install with ``override_lines`` was resolved and nothing is left that it does not handle,
        why not / what was checked). Verified: the last resolution resolved, and no clash of it needs an override
        not among the lines, is unknown or not harmless here."""
        last = self.last.compiled
        if last.status in ("skipped", "failed"):
            return False, f"the pair was not resolved ({_tail(last.reason)})"
        if last.status == "unresolvable":
            what = f"{_first(last.missing)} not on the index" if last.missing else _tail(last.reason)
            return False, f"uv finds no solution: {what}"
        left = [f for f in self.last.findings if not f.handled or f.action == "override"]
        if left:
            return False, "a file clash is left: " + "; ".join(f"{f.pair()} ({f.action})" for f in left)
        when = f"{last.date}, from the cache: {_tail(self.stale)}" if self.stale else f"{last.date}"
        return True, f"uv resolved the pair with these lines ({when}); no file clash left that is not harmless"

    def fix_text(self) -> str | None:
        """What the resolution with the override lines showed: the versions picked for the overridden
        packages, and the clashes left (None when there was none to try)."""
        if self.fix is None:
            return None
        compiled = self.fix.compiled
        if compiled.status != "resolved":
            return f"with {', '.join(self.override_lines)}: {compiled.status}: {compiled.reason}"
        left = [f for f in self.fix.findings if f.action in ("override", "unknown", "not_harmless")]
        names = {_canonical(re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0]) for line in self.override_lines}
        names |= {_canonical(n) for r in self.resolutions for f in r.findings if f.action == "override"
                  for n in (f.clash.first.name, f.clash.second.name)}
        picked = ", ".join(f"{name} {compiled.version_of(name) or '?'}" for name in sorted(names))
        return (f"with {', '.join(self.override_lines)}: uv picks {picked}; "
                + ("no clash left that is not harmless" if not left else
                   "still: " + "; ".join(f"{f.pair()} ({f.action})" for f in left)))

    def fix_ok(self) -> bool | None:
        if self.fix is None:
            return None
        return self.fix.compiled.status == "resolved" and not any(
            f.action in ("override", "unknown", "not_harmless") for f in self.fix.findings)

    def to_dict(self) -> dict:
        verified, why = self.verified()
        return {**self.first.to_dict(), "overrides_named": self.override_lines,
                "fix": {**self.fix.to_dict(), "ok": self.fix_ok(), "text": self.fix_text()} if self.fix else None,
                "rounds": len(self.resolutions) - 1, "verified": verified, "verified_text": why,
                "answer_date": self.date, "stale": self.stale, "seconds": round(self.seconds, 3)}

    # ---------------------------------------------------------------------------------------- the lines

    def short_text(self) -> str:
        """The short screen's words on it, appended to its dependencies line: what uv resolved, and only what
        installing takes (an override, a reinstall) or what nothing handles; harmless clashes are counted only
        where there is nothing else to say (``render_lines`` has each). An earlier day's answer from the cache
        (offline) says its date."""
        compiled = self.first.compiled
        if compiled.status == "skipped":
            return f"resolution not checked ({compiled.reason})"
        if compiled.status == "failed":
            return f"resolution not checked (uv: {compiled.reason})"
        when = f"; as resolved on {self.date} (from the cache: uv could not answer today)" if self.stale else ""
        lines = self.override_lines
        proven = "tested" if all(line in self.tested for line in lines) else "untested"
        clashes = len({f.pair() for r in self.resolutions for f in r.findings if f.action == "override"})
        clash_words = f"{clashes} file clash{'es' if clashes > 1 else ''}"
        if compiled.status == "unresolvable":
            what = f"{_first(compiled.missing)} not on the index" if compiled.missing else compiled.reason
            if self.fix_ok():  # a cell's line replaces the missing pin, and what it resolves to installs
                return (f"uv: {what}{', ' + clash_words if clashes else ''} -> override{'s' if len(lines) > 1 else ''}"
                        f" {', '.join(lines)} ({proven}){when}")
            return f"uv: NO SOLUTION, {what} (--verbose){when}"
        head = f"uv resolves {len(compiled.packages)} packages, "
        parts = []
        unknown = self.unknown
        if unknown:
            kind = "UNKNOWN" if any(f.action == "unknown" for f in unknown) else "NOT HARMLESS"
            parts.append(f"{kind} file clash {unknown[0].pair()} ({unknown[0].clash.count} files)"
                         + (f", +{len(unknown) - 1} more" if len(unknown) > 1 else ""))
        if lines:
            parts.append(f"{clash_words} -> override {', '.join(lines)}"
                         + (f" ({proven})" if self.fix_ok() in (True, None) else " (NOT enough, --verbose)"))
        reinstall = [f.fix for f in self.findings if f.action == "reinstall"]
        if reinstall:
            parts.append(f"then reinstall {', '.join(reinstall)} (overlay)")
        if parts:
            return head + "; ".join(parts) + when
        harmless = sum(f.action == "harmless" for f in self.findings)
        return head + ("no file clash" + (f" but {harmless} harmless" if harmless else "")) + when

    def render_lines(self, indent: str = "  ") -> list[str]:
        """``--verbose``: the command, what it resolved and cost, each clash with its row, the fix checked."""
        compiled, first = self.first.compiled, self.first
        when = f"{compiled.uv or 'uv'}, {compiled.date} UTC" + ("; cached" if compiled.cached else "")
        lines = [f"{indent}resolution: `{' '.join(compiled.command)}` ({when})"]
        if self.stale:
            lines.append(f"{indent}  an earlier answer, from the cache ({self.date}): uv could not resolve today "
                         f"({self.stale})")
        if compiled.status in ("skipped", "failed"):
            return lines + [f"{indent}  not checked: {compiled.reason}"]
        if compiled.status == "unresolvable":
            lines.append(f"{indent}  NO SOLUTION: {compiled.reason}")
            if compiled.missing:
                lines.append(f"{indent}  not on the index: {', '.join(compiled.missing)} (a pin the index lacks: "
                             f"the pair does not install from it as is)")
            return lines + self._fix_lines(indent)
        lines.append(f"{indent}  {len(compiled.packages)} packages, {first.listed} wheels listed by range requests "
                     f"({first.listings_cached} from the cache, {first.fetched_bytes / 1e6:.1f} MB in "
                     f"{first.requests} requests, {first.list_seconds:.1f} s)"
                     + (f"; not listed: {', '.join(compiled.no_wheel)} (sdist only)" if compiled.no_wheel else ""))
        for name, why in sorted(first.unlisted.items()):
            lines.append(f"{indent}  not listed: {name} ({why})")
        if not self.findings:
            lines.append(f"{indent}  files: no two wheels install the same file")
        for finding in self.findings:
            lines += [f"{indent}  {finding.clash.describe()}", f"{indent}    {finding.clash.on_disk_text()}",
                      f"{indent}    -> {finding.resolution()}"]
        return lines + self._fix_lines(indent)

    def _fix_lines(self, indent: str) -> list[str]:
        """The re-resolution with the named lines, and which matrix cell installs with each line."""
        lines = [f"{indent}  checked: {self.fix_text()}"] if self.fix is not None else []
        if self.override_lines or self.fix is not None:
            verified, why = self.verified()
            lines.append(f"{indent}  install with these lines: {'verified' if verified else 'UNVERIFIED'}: {why}")
        for line in self.override_lines:
            cells = self.tested.get(line)
            lines.append(f"{indent}  {line}: " + (f"tested by matrix cell {', '.join(cells)}" if cells else
                                                 "untested: no matrix cell of this pair installs with it"))
        return lines


def _tail(reason: str | None, limit: int = 120) -> str:
    """A reason cut to ``limit`` characters (uv's run long)."""
    reason = " ".join((reason or "no reason given").split())
    return reason if len(reason) <= limit else reason[:limit - 3] + "..."


def _first(items) -> str:
    items = list(items)
    return items[0] + (f", +{len(items) - 1} more" if len(items) > 1 else "")


def named_lines(resolved: Resolved, tested: dict[str, tuple[str, ...]]) -> list[str]:
    """The override lines one resolution names: each clash's row's, and for each pin the index lacks
    (``Compiled.missing``: flashinfer-python==0.7.3 for vLLM 0.34.0 today) the line of the same package a matrix
    cell of the pair installs with (``tested``: its ``index_overrides``); none for a pin no cell replaces."""
    lines = [f.fix for f in resolved.findings if f.action == "override"]
    for pin in resolved.compiled.missing:
        name = _canonical(re.split(r"[<>=!~;\[ ]", pin, maxsplit=1)[0])
        lines += [line for line in tested if _canonical(re.split(r"[<>=!~;\[ ]", line, maxsplit=1)[0]) == name]
    return list(dict.fromkeys(lines))


FIX_ROUNDS = 3  # a missing pin's line, then the clash its resolution shows (0.34: flashinfer, then cuda-python)
AHEAD_LINES = 3  # tested lines whose every combination is compiled ahead (2**3 - 1 uv runs at most)


def compile_ahead(requirements: list[str], overrides: list[str], tested, directory: Path | None = None) -> dict:
    """Start ``compile_pair`` of the pair with each combination of its tested lines (the lines a later round can
    add: the pair's cells install with them), each in a thread of its own: ``{frozenset(lines added): Future}``.
    uv answers one round in 2-4 s even with its cache warm; the rounds of vLLM 0.34.0 + vllm-omni 0.24.0 (the
    missing flashinfer pin, then the cuda-python clash its resolution shows) then find their answers in the day's
    cache instead of running uv one after the other. More than ``AHEAD_LINES`` lines: all of them only."""
    from concurrent.futures import ThreadPoolExecutor
    from itertools import combinations

    extra = sorted(line for line in tested if line not in overrides)
    if not extra or uv_path() is None:
        return {}
    sizes = range(len(extra), 0, -1) if len(extra) <= AHEAD_LINES else [len(extra)]
    added = [frozenset(combo) for size in sizes for combo in combinations(extra, size)]
    pool = ThreadPoolExecutor(max_workers=len(added), thread_name_prefix="vllm-compat-ahead")
    ahead = {lines: pool.submit(compile_pair, requirements, [*overrides, *sorted(lines)], directory)
             for lines in added}
    pool.shutdown(wait=False)  # an answer no round asks for is not waited on
    return ahead


def resolve_pair(requirements: list[str], overrides: list[str], directory: Path | None = None,
                 tested: dict[str, tuple[str, ...]] | None = None) -> Resolution:
    """The module's three steps for ``requirements`` (``["vllm==0.33.0", "vllm-omni==0.24.0"]``) with the
    conflict ``overrides``; then, while a resolution names override lines not yet tried (``named_lines``), once
    more with them added (at most ``FIX_ROUNDS``); ``fix`` is the last of those. ``tested``: {override line:
    the matrix cells of the pair installing with it}; their combinations are compiled meanwhile
    (``compile_ahead``), so a round's uv answer is, where it can be, ready when the round asks for it."""
    start = time.perf_counter()
    ahead = compile_ahead(requirements, overrides, tested or {}, directory)
    resolution = Resolution(resolve_and_list(requirements, overrides, directory), tested=dict(tested or {}))
    lines = list(overrides)
    for _ in range(FIX_ROUNDS):
        named = [line for line in resolution.override_lines if line not in lines]
        if not named:
            break
        lines += named
        # uv could not answer the last round: the next ones are read from the cache, not tried again
        last = resolution.last.compiled
        offline = last.stale or (last.reason if last.status in ("failed", "skipped") else None)
        compiling = ahead.get(frozenset(lines) - frozenset(overrides))
        if compiling is not None and offline is None:
            compiling.exception()  # waits: its answer is the day's cached one the round reads
        resolution.fix = resolve_and_list(requirements, lines, directory, cache_only=offline)
        resolution.rounds.append(resolution.fix)
    resolution.seconds = time.perf_counter() - start
    return resolution
