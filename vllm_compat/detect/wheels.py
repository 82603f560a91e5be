"""Release wheels for ``vllm-compat check``: found in a per-user cache, or fetched there by pip's own
``pip download --no-deps`` (a subprocess; nothing is installed and nothing of vLLM is imported).

The cache is ``$VLLM_COMPAT_WHEEL_CACHE`` when set (the test suite shares one across matrix cells), else
``$XDG_CACHE_HOME/vllm-compat/wheels``, else ``~/.cache/vllm-compat/wheels``. pip downloads into a private
temporary directory inside the cache and the wheel is then renamed into place (``os.replace``, atomic on one
file system), so concurrent checks never see half a wheel; the last of two racing downloads wins, and both
wheels are the same file. A cached wheel is found by name and version without calling pip: a second check of
the same pair never touches the network.

``check`` and ``plan`` read a release's source members by HTTP range requests instead (``wheel_members``); they
come here for a whole wheel already in the cache, and for pip's download where the index lists no wheel of the
release for this interpreter (or is no http(s) index).

Every failure is a ``WheelError`` whose message says what was asked, what pip or the cache said, and what to
do instead (another version, passing wheel paths when offline, installing pip).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import VllmCompatError

CACHE_VAR = "VLLM_COMPAT_WHEEL_CACHE"
# distribution -> the top-level package its wheel must hold (how a wheel is told apart from any other); any other
# distribution (a vLLM plugin: tpu-inference, vllm-ascend, ...) is read too, its packages from its own metadata
PACKAGES = {"vllm": "vllm", "vllm-omni": "vllm_omni"}

# pip's words for "the index could not be reached" (urllib3 / socket errors it logs while retrying)
_NETWORK_HINTS = re.compile(
    r"NewConnectionError|Failed to establish a new connection|Name or service not known|"
    r"Temporary failure in name resolution|nodename nor servname|Network is unreachable|Connection refused|"
    r"ConnectTimeout|ReadTimeout|timed out|ProxyError|Max retries exceeded|connection broken by|"
    r"SSLError|CERTIFICATE_VERIFY_FAILED"
)
_FROM_VERSIONS = re.compile(r"\(from versions: ([^)]*)\)")
_NEWEST = re.compile(r"^\S+ \(([^)]+)\)\s*$", re.M)
_AVAILABLE = re.compile(r"^Available versions: (.*)$", re.M)


class WheelError(VllmCompatError):
    """A wheel could not be found, fetched or recognized; ``kind`` says which case (for tests and --json):
    "no_version", "no_network", "no_wheel", "no_pip", "pip_failed", "not_a_wheel", "not_vllm"."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.I)  # a valid distribution name (PEP 508)


def normalize_distribution(name: str) -> str | None:
    """"vllm" / "vllm-omni" for any spelling pip accepts (``vllm_omni``, ``VLLM-Omni``); None otherwise."""
    normalized = canonical_distribution(name)
    return normalized if normalized in PACKAGES else None


def canonical_distribution(name: str) -> str | None:
    """Any distribution's name as the index compares them (PEP 503: ``Tpu_Inference`` -> ``tpu-inference``); None
    for a string that is no distribution name (``vllm>=0.9``, ``a b``)."""
    return re.sub(r"[-_.]+", "-", name).lower() if _NAME.match(name) else None


def file_prefix(distribution: str) -> str:
    """How a wheel or sdist file of ``distribution`` starts, before ``-VERSION``: ``vllm_omni``, ``tpu_inference``
    (the normalized name, ``-`` as ``_``)."""
    return PACKAGES.get(distribution, re.sub(r"[-_.]+", "_", distribution).lower())


def cache_dir(environ=None) -> Path:
    """Where wheels are kept (see the module docstring); not created here."""
    environ = os.environ if environ is None else environ
    if environ.get(CACHE_VAR):
        return Path(environ[CACHE_VAR]).expanduser()
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "vllm-compat" / "wheels"


def _same_version(a: str, b: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(a) == Version(b)  # "0.25" == "0.25.0", as pip's "==" matches
    except InvalidVersion:
        return a == b


def cached_wheel(distribution: str, version: str, directory: Path) -> Path | None:
    """A wheel of ``distribution`` at ``version`` in ``directory``, or None. Reads file names only."""
    from packaging.utils import InvalidWheelFilename, parse_wheel_filename

    prefix = file_prefix(distribution) + "-"
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    for name in names:
        if not (name.lower().startswith(prefix) and name.endswith(".whl")):
            continue
        try:
            _, found, _, _ = parse_wheel_filename(name)
        except InvalidWheelFilename:
            continue
        if _same_version(str(found), version):
            return directory / name
    return None


def cached_sdist(distribution: str, version: str, directory: Path) -> Path | None:
    """An sdist (``.tar.gz``) of ``distribution`` at ``version`` in ``directory``, or None: what a plugin that
    publishes no wheel (kvcached) is read from, unbuilt. Reads file names only."""
    from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename

    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".tar.gz"))
    except OSError:
        return None
    for name in names:
        try:
            found_name, found = parse_sdist_filename(name)
        except InvalidSdistFilename:
            continue
        if found_name == canonicalize_name(distribution) and _same_version(str(found), version):
            return directory / name
    return None


def pip_command() -> list[str]:
    """``python -m pip`` of this interpreter; else a ``pip`` on PATH (a uv-made venv has no pip of its own,
    and only the wheel's name and tags matter to a download with ``--no-deps``). Raises ``WheelError``
    ("no_pip") when there is neither."""
    probe = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    if probe.returncode == 0:
        return [sys.executable, "-m", "pip"]
    for name in ("pip", "pip3"):
        found = shutil.which(name)
        if found:
            return [found]
    raise WheelError(
        "no_pip",
        f"vllm-compat check downloads wheels with pip, and neither `{sys.executable} -m pip` nor a `pip` on PATH "
        "exists. Install pip (`python -m ensurepip`), or pass wheel files or unpacked trees instead of "
        "NAME==VERSION.",
    )


def _nearest(requested: str, available: list[str], count: int = 5) -> tuple[list[str], list[str]]:
    """``(releases, pre-releases)`` to name for a ``requested`` version the index lacks. ``releases``: the
    ``count`` final releases nearest it by position among them (above every one: the newest), newest first;
    ``pre-releases``: where the newest final release is among them, up to two pre- or dev releases newer than it
    (what else there is to try), newest first. Where no final release is listed, the nearest of the others are
    the ``releases``."""
    from packaging.version import InvalidVersion, Version

    parsed = {}
    for text in available:
        try:
            parsed.setdefault(Version(text), text)
        except InvalidVersion:
            continue
    finals = sorted(v for v in parsed if not (v.is_prerelease or v.is_devrelease))
    others = sorted(v for v in parsed if v.is_prerelease or v.is_devrelease)
    pool = finals or others
    try:
        target = Version(requested)
        below = sum(v < target for v in pool)  # where it would sit among them
    except InvalidVersion:
        below = len(pool)
    # distance in releases from where it would sit; a tie goes to the newer
    ranked = sorted(range(len(pool)), key=lambda i: (below - i if i < below else i - below + 1, -i))
    chosen = sorted((pool[i] for i in ranked[:count]), reverse=True)
    newer = [v for v in others if finals and v > finals[-1]][-2:] if chosen and chosen[0] == pool[-1] else []
    return [parsed[v] for v in chosen], [parsed[v] for v in reversed(newer)]


def _failure(distribution: str, version: str | None, output: str) -> WheelError:
    """Turn pip's failed output into the error the user needs."""
    spec = f"{distribution}=={version}" if version else distribution
    from ..tool_output import said

    last = said(output)  # one line, its version list counted (pip's own output: --verbose)
    pip_said = f" pip said: {last}" if last else ""
    offline = (f" For offline use pass wheel files or unpacked trees instead, e.g. `vllm-compat check "
               f"/path/to/{file_prefix(distribution)}-X-*.whl`.")
    match = _FROM_VERSIONS.search(output)
    versions = [v.strip() for v in match.group(1).split(",")] if match else []
    versions = [v for v in versions if v and v != "none"]
    if _NETWORK_HINTS.search(output) and not versions:
        return WheelError("no_network", f"Could not reach the package index to fetch {spec}: no network, or the "
                                        f"index (pip's index-url / PIP_INDEX_URL) is unreachable.{offline}{pip_said}")
    if match and versions and version is not None:
        releases, pre = _nearest(version, versions)
        return WheelError("no_version", f"{distribution} {version} does not exist on the index (no wheel of it for "
                                        f"this machine); nearest versions: {', '.join(releases)}"
                                        + (f" (newer pre-releases: {', '.join(pre)})" if pre else "") + ".")
    if match:
        return WheelError("no_wheel", f"The index lists no wheel of {distribution} at all: it is unreachable "
                                      f"(no network, a proxy) or has no wheel for this platform.{offline}{pip_said}")
    return WheelError("pip_failed", f"pip could not fetch {spec}.{pip_said}{offline}")


def _run_pip_teeing_stderr(command: list[str]) -> tuple[int, str]:
    """Run pip; returns (status, its output). Under ``--verbose`` (``tool_output.shown``) its stdout goes to our
    stderr (its progress bar shows on a terminal while our stdout stays the report, JSON included) and its stderr
    is copied through line by line; otherwise both are kept, not shown: ``_failure`` says the error in one line."""
    from ..tool_output import shown

    if not shown():
        result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return result.returncode, result.stdout
    try:
        stdout = sys.stderr.fileno()
        sys.stderr.flush()
    except (AttributeError, OSError, ValueError):  # a captured stderr (pytest): keep pip's output ourselves
        stdout = subprocess.PIPE
    process = subprocess.Popen(command, stdout=stdout, stderr=subprocess.PIPE if stdout != subprocess.PIPE
                               else subprocess.STDOUT, text=True)
    stream = process.stderr if process.stderr is not None else process.stdout
    kept = []
    for line in stream:
        kept.append(line)
        sys.stderr.write(line)
    return process.wait(), "".join(kept)


def fetch_wheel(distribution: str, version: str, directory: Path | None = None) -> tuple[Path, bool]:
    """The wheel of ``distribution==version``: ``(path, True)`` from the cache, else ``(path, False)`` after
    ``pip download --no-deps --only-binary :all:`` into the cache. Raises ``WheelError`` on every failure."""
    directory = cache_dir() if directory is None else directory
    found = cached_wheel(distribution, version, directory)
    if found is not None:
        return found, True
    pip = pip_command()
    directory.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=".partial-", dir=directory))
    from ..tool_output import shown

    if not shown() and sys.stderr.isatty():  # one line for what can take a minute; pip's progress: --verbose
        print(f"vllm-compat: downloading {distribution}=={version} with pip (--verbose shows pip's progress)",
              file=sys.stderr, flush=True)
    try:
        # --no-cache-dir: this cache is the cache; pip's would keep a second copy of a ~300 MB vLLM wheel.
        status, output = _run_pip_teeing_stderr(
            [*pip, "download", "--no-deps", "--only-binary", ":all:", "--no-cache-dir",
             f"{distribution}=={version}", "-d", str(partial)])
        if status != 0:
            raise _failure(distribution, version, output)
        wheels = sorted(partial.glob(f"{file_prefix(distribution)}-*.whl"))
        if not wheels:
            raise WheelError("pip_failed", f"pip reported success for {distribution}=={version} but left no "
                                           f"{file_prefix(distribution)}-*.whl in {partial}.")
        target = directory / wheels[0].name
        os.replace(wheels[0], target)
        return target, False
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def _index_versions(distribution: str) -> tuple[str, list[str]]:
    """``(newest, every version listed)`` as ``pip index versions --only-binary :all:`` prints them (pre-releases
    excluded, as pip excludes them). Raises ``WheelError`` when the index cannot tell. An http(s) index is read
    directly (``wheel_members.index_versions``: its project page, one request, where pip takes seconds): the versions
    with a wheel for this interpreter."""
    from .wheel_members import index_versions

    listed = index_versions(distribution)
    if listed:
        return listed[0], listed
    pip = pip_command()
    result = subprocess.run([*pip, "index", "versions", "--only-binary", ":all:", distribution],
                            capture_output=True, text=True)
    from ..tool_output import echo

    echo(result.stderr)  # pip's warnings (retries, ignored locations): --verbose only
    match = _NEWEST.search(result.stdout)
    if result.returncode == 0 and match:
        listed = _AVAILABLE.search(result.stdout)
        return match.group(1), [v.strip() for v in listed.group(1).split(",") if v.strip()] if listed else []
    output = result.stdout + result.stderr
    if "unknown command" in output:
        raise WheelError("pip_failed", f"`{' '.join(pip)} index versions` does not exist in this pip (it needs "
                                       f"pip >= 21.2); name the version instead: {distribution}==X.")
    raise _failure(distribution, None, output)


def newest_version(distribution: str) -> str:
    """The newest version of ``distribution`` on the index (``pip index versions``; pre-releases excluded,
    as pip excludes them). Raises ``WheelError`` when the index cannot tell."""
    return _index_versions(distribution)[0]


def release_versions(distribution: str) -> list[str]:
    """Every final release of ``distribution`` on the index, oldest first (``pip index versions``: pre-releases
    excluded by pip; dev releases and names that do not parse dropped here; post releases kept, they are
    releases). One pip call. Raises ``WheelError`` when the index cannot tell."""
    from packaging.version import InvalidVersion, Version

    newest, listed = _index_versions(distribution)
    found = {}
    for text in listed or [newest]:
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if not (version.is_prerelease or version.is_devrelease):
            found[version] = text
    return [found[v] for v in sorted(found)]
