"""``vllm-compat check vllm==X [vllm-omni==Y]``: will this vLLM run this vllm-omni, and what does vllm_compat
do about it, before either is installed.

Flow: resolve each input (``NAME==VERSION`` -> a wheel from the per-user cache or pip's download, see
``detect.wheels``; or a wheel file / unpacked tree / site-packages; vllm-omni defaults to the one installed
here, found without importing it) -> ``SourceTree``s -> the same static detection, decisions and import-drift
check the doctor uses, in one ``reporting.Report`` -> one screen (or ``--json``) ending in a verdict: works
natively, works with vllm_compat, or will not start (and why). Nothing is installed; vLLM, vllm-omni and torch
are never imported.

Like the doctor, the check follows each way vllm-omni is started (``entrypoints.ENTRYPOINTS``: the offline API,
``vllm serve --omni``, the diffusion stage) through its module-level imports: an entrypoint whose modules do not
import does not start, even when ``import vllm_omni`` works (vllm-omni 0.24.0 on vLLM 0.25.1: the server's CLI
reaches a module vLLM 0.25 removed; on 0.29+ a module its diffusion worker imports is gone). The verdict
names each; it says WORKS only when all of them start.

With both inputs from the index it also resolves the pair with uv as a user would install it, lists every wheel
the resolver picked by HTTP range requests and names the files two of them both install, with the override that
removes each (``resolution.py``; ``--no-resolve`` skips it, and local wheels or trees never resolve).

Another vLLM plugin (``vllm-compat check vllm==X PLUGIN==Y``, or its wheel, sdist or tree) is read with the
entrypoints and vLLM range its own release declares and judged by the import-drift scan alone (``plugin_check``):
vllm_compat's drift points and bridges are vllm-omni's.

Exit codes, as the doctor's: 0 it works (natively or with the shim), 1 it will not start (or a target is
refused), 2 usage: a version that does not exist, no network, a file that is not a vLLM / vllm-omni wheel.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from .detect.source_tree import SourceTree

# fetch_wheel: tests patch check.fetch_wheel to prove nothing is fetched (open_release calls it for pip's download)
from .detect.wheels import (  # noqa: F401
    PACKAGES,
    WheelError,
    canonical_distribution,
    fetch_wheel,
    newest_version,
    normalize_distribution,
)

# set to 1, check resolves nothing (as --no-resolve); the test suite sets it, the resolution's own tests unset it
NO_RESOLVE_VAR = "VLLM_COMPAT_NO_RESOLVE"


@dataclass(frozen=True)
class CheckInput:
    """One side of the check: which distribution, where its files are and how they were found."""

    distribution: str  # "vllm" | "vllm-omni" | another plugin's, normalized ("tpu-inference")
    tree: SourceTree  # an sdist's: ``plugin_entrypoints.ArchiveTree``, read as a SourceTree is
    version: str | None
    source: str  # "downloaded" | "cache" | "path" | "installed"
    location: str  # the wheel, sdist, tree or site-packages read
    # another plugin's entrypoints and declared vLLM range, read from its release (``read_plugin``); None for
    # vLLM and vllm-omni (whose entrypoints are the table's, ``entrypoints.ENTRYPOINTS``)
    release: object = None

    @property
    def is_plugin(self) -> bool:
        """A plugin other than vllm-omni: checked by ``plugin_check`` (import reading and declared range)."""
        return self.release is not None

    def to_dict(self) -> dict:
        return {"version": self.version, "source": self.source, "location": self.location}


def _usage(message: str) -> WheelError:
    return WheelError("usage", message)


def _looks_like_path(spec: str) -> bool:
    return os.sep in spec or "/" in spec or spec.endswith(".whl") or spec in (".", "..") or os.path.exists(spec)


def _tree_input(spec: str) -> list[CheckInput]:
    """The vLLM and/or vllm-omni held by a wheel file, an unpacked tree or a site-packages."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise _usage(f"{spec} does not exist; pass NAME==VERSION (vllm==0.33.0), a wheel file or an unpacked tree.")
    sdist = path.is_file() and path.name.endswith((".tar.gz", ".tgz")) and tarfile.is_tarfile(path)
    if path.is_file() and not sdist and not zipfile.is_zipfile(path):
        raise WheelError("not_a_wheel", f"{spec} is not a wheel (not a zip file); pass a vLLM, vllm-omni or vLLM "
                                        f"plugin wheel (or a plugin's sdist), an unpacked tree or NAME==VERSION.")
    found = [] if sdist else [CheckInput(dist, tree, tree.distribution_version(dist), "path", str(path))
                              for tree in [SourceTree(path)]
                              for dist, package in PACKAGES.items() if tree.has_package(package)]
    if not found:
        plugin = _plugin_input(path, "path", str(path))
        if plugin is None:
            raise WheelError("not_vllm", f"{spec} holds neither vLLM (vllm/__init__.py), vllm-omni "
                                         f"(vllm_omni/__init__.py) nor a vLLM plugin (an entry point in "
                                         f"{' or '.join(_plugin_groups())}, or a module importing vllm); pass a "
                                         f"vLLM, vllm-omni or plugin wheel or tree.")
        found = [plugin]
    return found


def _plugin_groups() -> tuple[str, ...]:
    from .detect.plugin_entrypoints import PLUGIN_GROUPS

    return PLUGIN_GROUPS


_IMPORTS_VLLM = re.compile(r"^[ \t]*(?:from[ \t]+vllm[ \t.]|import[ \t]+vllm\b)", re.M)


def _plugin_input(path: Path, source: str, location: str, distribution: str | None = None) -> CheckInput | None:
    """The vLLM plugin in ``path`` (a wheel, an sdist or an unpacked tree): one that registers an entry point in
    vLLM's plugin groups, ships a startup hook, or has a module importing vllm; None for anything else (and for
    vLLM itself). Its entrypoints and declared range are read here (``read_plugin``: files only)."""
    from .detect.plugin_entrypoints import HOST, ArchiveTree, read_plugin

    try:
        release = read_plugin(path, distribution)
    except (ValueError, OSError, tarfile.TarError, zipfile.BadZipFile):
        return None
    if HOST in release.packages:
        return None
    if release.source == "sdist":
        tree = ArchiveTree(path)
    else:
        tree = SourceTree(path)
        if not tree.has_package(release.packages[0]) and (path / "src").is_dir():  # an unpacked src/ layout
            tree = SourceTree(path / "src")
    if not (release.callables or release.startup or any(
            _IMPORTS_VLLM.search(tree.read(relpath) or "") for package in release.packages
            for relpath in tree.walk_py(package))):
        return None
    name = canonical_distribution(release.distribution) or release.distribution
    return CheckInput(name, tree, release.version, source, location, release)


def _index_input(distribution: str, version: str | None) -> CheckInput:
    from .detect.wheel_members import open_release

    if version is None:
        version = newest_version(distribution)
    release = open_release(distribution, version)  # the cache, else the source members by range requests
    tree = release.tree
    if not tree.has_package(PACKAGES[distribution]):
        raise WheelError("not_vllm", f"{release.location} (fetched for {distribution}=={version}) holds no "
                                     f"{PACKAGES[distribution]} package; delete it from the cache and retry.")
    return CheckInput(distribution, tree, tree.distribution_version(distribution) or version,
                      release.source, release.location)


def _plugin_index_input(distribution: str, version: str | None) -> CheckInput:
    """Another plugin's release from the index: the cache first (a whole wheel, its kept members, else an sdist:
    kvcached publishes no wheel), else its source members by range requests (``open_release``)."""
    from .detect.wheel_members import open_release
    from .detect.wheels import cache_dir, cached_sdist

    if version is None:
        version = newest_version(distribution)
    release = open_release(distribution, version, fetch=False)
    sdist = cached_sdist(distribution, version, cache_dir()) if release is None else None
    if sdist is not None:
        location, source = str(sdist), "cache"
    else:
        release = release or open_release(distribution, version)
        location, source = release.location, release.source
    found = _plugin_input(Path(location), source, location, distribution)
    if found is None:
        raise WheelError("not_plugin", f"{distribution}=={version} ({location}) is no vLLM plugin: it registers "
                                       f"nothing in {' or '.join(_plugin_groups())} and no module of it imports "
                                       f"vllm; name vllm-omni or a vLLM plugin (tpu-inference==X, vllm-ascend==X).")
    return found


def _installed_omni() -> CheckInput | None:
    from .detect.source_tree import installed_package_root
    from .detect.versions import installed_version

    root = installed_package_root("vllm_omni")
    if root is None:
        return None
    return CheckInput("vllm-omni", SourceTree(root), installed_version("vllm-omni"), "installed", str(root))


def _parse_spec(spec: str) -> tuple[str, str | None]:
    """``(distribution, version or None)`` of ``NAME==VERSION`` or ``NAME``; a usage error, before the index is
    asked, for another name, an operator other than ``==``, or a version that is not one (``vllm==abc``)."""
    from packaging.version import InvalidVersion, Version

    name, sep, version = spec.partition("==")
    distribution = canonical_distribution(name.strip())
    if distribution is None or any(op in name for op in "<>=!~ "):
        raise _usage(f"{spec!r} is not one of vllm==VERSION, vllm-omni==VERSION, PLUGIN==VERSION (a vLLM plugin: "
                     f"tpu-inference==0.22.0), a wheel file or a tree (an exact version: the check reads one "
                     f"release).")
    if sep and not version.strip():
        raise _usage(f"{spec!r} names no version; write {distribution}==X, or {distribution} alone for the newest.")
    if version.strip():
        try:
            Version(version.strip())
        except InvalidVersion:
            raise _usage(f"{version.strip()!r} in {spec!r} is not a version; name one release, as "
                         f"{distribution}==X.Y.Z, or {distribution} alone for the newest.") from None
    return distribution, version.strip() or None


def resolve_inputs(specs: list[str], newest: bool = False) -> tuple[CheckInput, CheckInput]:
    """(vLLM, the plugin) for the command line: the plugin is vllm-omni or any other vLLM plugin (``PLUGIN==Y``,
    its wheel, sdist or tree: ``CheckInput.is_plugin``). Every argument is parsed before anything is fetched; a
    tree holding both vLLM and vllm-omni (a site-packages) serves both sides unless the other side is given too;
    without a plugin argument, the vllm-omni installed here. Raises ``WheelError`` (kind "usage" and the fetch
    errors)."""
    # per side: (argument, distribution, version or the input read from a path); names are fetched below. The
    # plugin side is keyed "vllm-omni" whichever plugin it holds.
    wanted: dict[str, list] = {"vllm": [], "vllm-omni": []}
    shared: dict[str, CheckInput] = {}  # from a tree holding both packages
    if newest:
        wanted["vllm"].append(("--newest", "vllm", None))
    for spec in specs:
        if _looks_like_path(spec):
            found = _tree_input(spec)
            for item in found:
                if len(found) == 2:
                    shared.setdefault(item.distribution, item)
                else:
                    wanted[_side(item.distribution)].append((spec, item.distribution, item))
            continue
        distribution, version = _parse_spec(spec)
        wanted[_side(distribution)].append((spec, distribution, version))
    for side, items in wanted.items():
        if len(items) > 1:
            named = {i[1] for i in items}
            raise _usage(f"{len(items)} {side} inputs given ({', '.join(i[0] for i in items)}); pass one."
                         if len(named) == 1 else
                         f"{len(items)} plugins given ({', '.join(i[0] for i in items)}); check reads one plugin "
                         f"against one vLLM: pass one.")
    if not wanted["vllm"] and "vllm" not in shared:
        raise _usage("name the vLLM to check: vllm==X, a vLLM wheel or tree, or --newest.")

    def fetch(distribution: str) -> CheckInput | None:
        if not wanted[distribution]:
            return shared.get(distribution)
        _, name, version_or_input = wanted[distribution][0]
        if isinstance(version_or_input, CheckInput):
            return version_or_input
        if name not in PACKAGES:
            return _plugin_index_input(name, version_or_input)
        return _index_input(name, version_or_input)

    omni = fetch("vllm-omni") or _installed_omni()
    if omni is None:
        raise _usage("no vllm-omni is installed here; name the one to check against: vllm-omni==X or its wheel.")
    return fetch("vllm"), omni


def _side(distribution: str) -> str:
    """Which side of the check ``distribution`` is: "vllm", or the plugin's (keyed "vllm-omni")."""
    return "vllm" if distribution == "vllm" else "vllm-omni"


# ------------------------------------------------------------------------------------------------ check


def _first_use(imports) -> list[dict]:
    """Each missing name with the first importer that reaches it (what to look at)."""
    first = {}
    for u in imports:
        first.setdefault(u.target, {"target": u.target, "importer": u.importer, "line": u.line, "reason": u.reason})
    return [first[name] for name in sorted(first)]


@dataclass
class CheckResult:
    vllm: CheckInput
    omni: CheckInput
    report: object  # reporting.Report: decisions, import drift with the bridges applied, the verdict
    dependencies: object = None  # dependency_drift.DependencyDrift: install conflicts and their overrides

    @property
    def exit_code(self) -> int:
        return self.report.exit_code

    @property
    def tested_set(self):
        """The exact set a matrix cell of this pair passed with (``tested_sets.for_pair``); None where none is."""
        from .tested_sets import for_pair

        versions = self.report.static.versions
        return for_pair(versions.get("vllm"), versions.get("vllm-omni"))

    def tested_set_line(self) -> str | None:
        """The report's line on the tested install: the cell whose exact set ``--constraints`` writes; or the cells
        of the pair that have none recorded yet; None where no cell tests the pair."""
        from .detect.versions import cells_testing

        tested = self.tested_set
        if tested is not None:
            return (f"  tested install: cell {tested.cell}'s {len(tested.pins)} versions ({tested.passed}): "
                    f"--constraints FILE")
        versions = self.report.static.versions
        cells = cells_testing(versions.get("vllm"), versions.get("vllm-omni"))
        if versions.get("vllm-omni") and cells:
            return f"  tested install: cell {cells[0]} tests this pair; its exact versions are not recorded yet"
        return None

    def nearest_tested_text(self) -> str:
        """Where the pair has no recorded set: the nearest pair that has one (``tested_sets.nearest``) and the
        command that writes its set, as "; the nearest ..."; "" where no pair has one."""
        from .tested_sets import nearest

        versions = self.report.static.versions
        found = nearest(versions.get("vllm"), versions.get("vllm-omni"))
        if found is None:
            return ""
        return (f"; the nearest pair with a recorded set: {found.pair} (cell {found.cell}, {found.torch} torch, "
                f"passed {found.passed}): vllm-compat check {found.pair} --constraints FILE")

    def to_dict(self) -> dict:
        drift = self.report.import_drift
        data = self.report.to_dict()
        data["mode"] = "check"
        tested = self.tested_set
        data["tested_set"] = None if tested is None else {
            "cell": tested.cell, "pair": tested.pair, "torch": tested.torch, "passed": tested.passed,
            "pins": list(tested.pins)}
        data["inputs"] = {"vllm": self.vllm.to_dict(), "vllm_omni": self.omni.to_dict()}
        data["dependency_drift"] = self.dependencies.to_dict() if self.dependencies is not None else None
        data["still_blocking"] = {
            "import": _first_use(drift.still_blocking if drift else ()),
            "diffusion_worker": _first_use(drift.still_worker_blocking if drift else ()),
            **{e.id: _first_use(drift.still_stopping(e.id)) for e in (drift.entrypoints if drift else ())},  # beyond "import"
        }
        return data


def run(vllm: CheckInput, omni: CheckInput, resolve: bool = False) -> CheckResult:
    """Scan both inputs statically and judge them; see the module docstring. With ``resolve``, and both inputs
    from the index, the pair is also resolved with uv and its wheels' files compared (``resolution.resolve_pair``:
    ``dependencies.resolution``)."""
    from .config import read_controls
    from .decide import plan
    from .dependency_drift import check_dependency_drift
    from .detect.static import SiteFacts, StaticSite
    from .reporting import Report

    # Install conflicts from both wheels' Requires-Dist (the index is asked only when an input came from it).
    online = "downloaded" in (vllm.source, omni.source) or "cache" in (vllm.source, omni.source)
    dependencies = check_dependency_drift(vllm.tree, vllm.distribution, omni.tree, omni.distribution,
                                          offline=not online)
    result = CheckResult(vllm=vllm, omni=omni, report=None, dependencies=dependencies)
    if not resolve and dependencies is not None:
        dependencies.not_resolved = f"the resolution was turned off (--no-resolve or {NO_RESOLVE_VAR}=1)"
    # uv's resolution waits on the index and its own process; the decisions and scans read and parse Python: one
    # overlaps the other, so a cold check takes the longer of the two, not their sum.
    with _in_background(resolve_install, result) if resolve else contextlib.nullcontext():
        site = StaticSite.of_wheels(vllm.tree, omni.tree,
                                    {"vllm": vllm.version, "vllm-omni": omni.version, "torch": None})
        # the behavioural scan's baseline, vllm-omni's own vLLM, is fetched like the inputs where none is shipped
        site.fetch_own_vllm = vllm.source in ("downloaded", "cache")
        planned = plan(site, read_controls())
        static = SiteFacts("static", site.versions, {entry.id: facts for entry, facts, _ in planned})
        # A fresh install of vllm_compat puts the startup hook in place, so bridges act before `import vllm_omni`.
        result.report = Report(mode="static", static=static, patches=[d for _, _, d in planned],
                               _import_drift=site.import_drift, _behaviour_drift=lambda: site.behaviour_drift,
                               judge_packages=False, startup_hook=True)
        site.import_drift, site.behaviour_drift  # noqa: B018 (computed and kept for the report)
    return result


@contextlib.contextmanager
def _in_background(work, *args):
    """Run ``work(*args)`` in a thread while the ``with`` body runs; on leaving, wait for it and raise what it
    raised (a ``WheelError`` reaches the CLI as if the call had been made here)."""
    import threading

    raised = []

    def target():
        try:
            work(*args)
        except BaseException as exc:  # handed to the caller's thread below
            raised.append(exc)

    thread = threading.Thread(target=target, name=f"vllm-compat-{work.__name__}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()
    if raised:
        raise raised[0]


def resolve_install(result: CheckResult) -> None:
    """Resolve ``result``'s pair with uv as a user installs it (``resolution.resolve_pair`` with the conflict
    overrides and the matrix cells' lines of the pair as tested): ``result.dependencies.resolution``; or say why
    not (``not_resolved``: local wheels or trees, unknown versions). ``check`` and ``plan`` both call it, so a
    plan row's overrides are the lines ``check --overrides`` writes."""
    vllm, omni, dependencies = result.vllm, result.omni, result.dependencies
    if dependencies is None:
        return
    if not {vllm.source, omni.source} <= {"downloaded", "cache"}:
        dependencies.not_resolved = "local wheels and trees are not resolved (no index asked)"
        return
    if not (vllm.version and omni.version):
        dependencies.not_resolved = "a version is unknown, so there is nothing to resolve"
        return
    from .dependency_drift import tested_for
    from .resolution import resolve_pair

    tested = {line: tuple(cells) for line, cells in tested_for(
        (vllm.distribution, vllm.version), (omni.distribution, omni.version)).values()}
    dependencies.resolution = resolve_pair(
        [f"{vllm.distribution}=={vllm.version}", f"{omni.distribution}=={omni.version}"],
        dependencies.override_lines, tested=tested)


def resolve_enabled(args=None) -> bool:
    """Whether ``check`` / ``plan`` resolve the pair: not with ``--no-resolve`` nor ``VLLM_COMPAT_NO_RESOLVE=1``."""
    return not getattr(args, "no_resolve", False) and os.environ.get(NO_RESOLVE_VAR, "") != "1"


def _where(item: CheckInput) -> str:
    home = os.path.expanduser("~")
    location = item.location.replace(home, "~", 1) if item.location.startswith(home + os.sep) else item.location
    return f"{location} ({ {'cache': 'cached', 'downloaded': 'downloaded now'}.get(item.source, item.source) })"


def render(result: CheckResult, verbose: bool = False, width: int | None = None) -> str:
    """The screen ``vllm-compat check`` prints: by default the short one (``reporting.render_summary``: the
    versions, one line per entrypoint, what vllm_compat does, the overrides, the verdict; no line longer than
    ``width``, 100 by default); with ``verbose`` every drift point, reason, missing name and wheel read, wrapped
    at ``width`` (``reporting.wrap_lines``: nothing cut)."""
    from .detect.versions import TESTED_VLLM_RANGE, is_tested_vllm
    from .reporting import SHORT_WIDTH, render_summary

    if not verbose:
        versions = result.report.static.versions
        tested = {True: " (tested)", False: " (UNTESTED: outside {}-{})".format(*TESTED_VLLM_RANGE),
                  None: ""}[is_tested_vllm(versions.get("vllm"))]
        head = [f"vllm-compat check: vllm {versions.get('vllm') or '?'}{tested} + vllm-omni "
                f"{versions.get('vllm-omni') or '?'} (read from the wheels, nothing installed)"]
        head += [line] if (line := result.tested_set_line()) else []
        return render_summary(result.report, head, result.dependencies, width or SHORT_WIDTH)

    report, versions = result.report, result.report.static.versions
    tested = {True: "tested", False: "UNTESTED (outside {}-{})".format(*TESTED_VLLM_RANGE),
              None: ""}[is_tested_vllm(versions.get("vllm"))]
    lines = [
        f"vllm-compat check: vllm {versions.get('vllm') or '?'} + vllm-omni {versions.get('vllm-omni') or '?'} "
        "(static: read from the files, nothing installed or imported)",
        "",
        f"  vllm       {versions.get('vllm') or 'unknown version':<14} {tested}".rstrip(),
        f"             from {_where(result.vllm)}",
        f"  vllm-omni  {versions.get('vllm-omni') or 'unknown version'}",
        f"             from {_where(result.omni)}",
        *report.fact_lines(),
        "",
    ]
    names = max([len(d.name) for d in report.patches] + [len("drift point")])
    variants = max([len(d.variant or "-") for d in report.patches] + [len("variant")])
    lines.append(f"  {'drift point':<{names}}  {'action':<8}  {'variant':<{variants}}  why")
    for d in report.patches:
        lines.append(f"  {d.name:<{names}}  {d.action:<8}  {d.variant or '-':<{variants}}  {d.reason}")
    drift = report.import_drift
    if drift is not None and drift.ok:
        lines += ["", f"  import drift: none ({drift.checked} module-level vLLM imports of vllm-omni checked)"]
    elif drift is not None:
        lines += ["", f"  import drift: {len(drift.unresolved)} of vllm-omni's {drift.checked} module-level vLLM "
                      f"imports no longer resolve ({len(drift.names)} distinct name(s))"
                  + (f", {len(drift.bridged)} bridged by vllm_compat" if drift.bridged else "")]
        if drift.still_blocking:
            names = ", ".join(f"{b['target']} (in {b['importer']}:{b['line']})" for b in _first_use(drift.still_blocking))
            lines.append(f"    still stops import vllm_omni: {names}")
        if drift.import_ok and drift.starts:
            lines.append("    none of them stops `import vllm_omni` or an entrypoint (bridged or not reached)")
    if drift is not None and drift.import_ok:
        from .reporting import render_entrypoints

        lines += ["", *render_entrypoints(drift, "    ")]
    if result.dependencies is not None:
        lines += ["", *result.dependencies.render_lines()]
    if line := result.tested_set_line():
        lines += ["", line]
    lines += ["", f"  verdict: {report.verdict().text}"]
    from .reporting import wrap_lines

    return "\n".join(wrap_lines(lines, width or SHORT_WIDTH))


def run_check(args) -> int:
    """``vllm-compat check`` (cli.py's handler): print the screen or JSON; 0 / 1 / 2 as the module says. With
    ``--require IDS`` (``require.gate``) the exit code is 0 when those entrypoints start, 1 otherwise, and one
    stderr line says which do; ``--json`` then holds the gate under ``require``."""
    try:
        vllm, omni = resolve_inputs(list(args.specs), newest=args.newest)
        if omni.is_plugin:
            return _run_plugin_check(args, vllm, omni)
        result = run(vllm, omni, resolve=resolve_enabled(args))
    except WheelError as exc:
        print(f"vllm-compat check: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"error": {"kind": exc.kind, "message": str(exc)}, "exit_code": 2}, indent=2))
        return 2
    required = getattr(args, "require", None)
    answer = None
    if required is not None:  # the gate on the entrypoints asked for (require.py); the verdict is printed as ever
        from .require import gate

        answer = gate(result.report, required)
    data = {**result.to_dict(), "require": answer.to_dict()} if answer is not None else None
    print(json.dumps(data or result.to_dict(), indent=2) if args.json
          else render(result, verbose=getattr(args, "verbose", False), width=getattr(args, "width", None)))
    if answer is not None:
        print(answer.line("check"), file=sys.stderr)
    if _write_outputs(args, result) is not None:
        return 2
    return answer.exit_code if answer is not None else result.exit_code


def _run_plugin_check(args, vllm: CheckInput, plugin: CheckInput) -> int:
    """``check`` for a plugin other than vllm-omni (``plugin_check``): its screen or ``--json``, 0 / 1. What only
    vllm-omni has (``--require``'s entrypoint ids, ``--overrides``, ``--constraints``) is refused with exit 2."""
    from .plugin_check import run as run_plugin

    asked = [flag for flag, value in (("--require", getattr(args, "require", None)),
                                      ("--overrides", getattr(args, "overrides", None)),
                                      ("--constraints", getattr(args, "constraints", None))) if value]
    if asked:
        raise _usage(f"{', '.join(asked)} serve vllm-omni only (its named entrypoints, its resolution and its matrix "
                     f"cells); for {plugin.distribution} read the verdict or --json.")
    result = run_plugin(vllm, plugin)
    if getattr(args, "json", False):
        print(json.dumps(result.to_dict(), indent=2))
    else:
        from .reporting import SHORT_WIDTH, wrap_lines

        print("\n".join(wrap_lines(result.lines(verbose=getattr(args, "verbose", False)),
                                   getattr(args, "width", None) or SHORT_WIDTH)))
    return result.exit_code


def _write_outputs(args, result: CheckResult) -> int | None:
    """``--overrides FILE`` and ``--constraints FILE``: both written, or neither (2, each reason on stderr).
    cli.py has checked each path's folder before the check ran; each file is written beside itself and renamed
    into place, so a failed write leaves no half of one. None when everything asked for was written."""
    from .dependency_drift import overrides_text

    files, refusals = [], []
    if getattr(args, "overrides", None):
        if result.dependencies is None:
            refusals.append("no Requires-Dist to read (unpacked trees): there are no override lines to write")
        else:
            verified, _, why = result.dependencies.install_verified()
            files.append((args.overrides, overrides_text(result.dependencies, args.overrides),
                          f"{len(result.dependencies.install_lines)} override line(s) written to {args.overrides} "
                          f"(uv pip install ... --override {args.overrides}); "
                          f"{'verified' if verified else 'UNVERIFIED'}: {why}"))
    if getattr(args, "constraints", None):
        tested = result.tested_set
        if tested is None:
            refusals.append("no matrix cell of this pair has recorded the exact versions it passed with ("
                            f"{(result.tested_set_line() or 'no cell tests the pair').strip()})"
                            + result.nearest_tested_text())
        else:
            files.append((args.constraints, tested.constraints_text(),
                          f"cell {tested.cell}'s {len(tested.pins)} versions written to {args.constraints} "
                          f"(uv pip install {tested.pair} -c {args.constraints})"))
    asked = ", ".join(path for path in (getattr(args, "overrides", None), getattr(args, "constraints", None)) if path)
    if refusals:
        for reason in refusals:
            print(f"vllm-compat check: {reason}; {asked} not written.", file=sys.stderr)
        return 2
    partial = []
    umask = os.umask(0)
    os.umask(umask)
    try:
        for path, text, _ in files:
            folder = os.path.dirname(os.path.abspath(path))
            fd, temporary = tempfile.mkstemp(prefix=".vllm-compat-", dir=folder)
            partial.append((temporary, path))
            os.fchmod(fd, 0o666 & ~umask)  # as open() would create it, not mkstemp's 0600
            with os.fdopen(fd, "w") as handle:
                handle.write(text)
        for temporary, path in partial:
            os.replace(temporary, path)
    except OSError as exc:
        for temporary, _ in partial:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        print(f"vllm-compat check: could not write {exc.filename or asked} ({exc.strerror or exc}); "
              f"{asked} not written.", file=sys.stderr)
        return 2
    for _, _, said in files:
        print(f"vllm-compat check: {said}", file=sys.stderr)
    return None
