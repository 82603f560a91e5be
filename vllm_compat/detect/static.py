"""Static detection: read vLLM's and vllm-omni's files (installed, unpacked, or inside a wheel) and never
import them. Fast enough for ``vllm-compat doctor`` to run before a worker starts.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, field

from .model import Param, ParamKind
from .source_tree import SourceTree, installed_package_root, tree_at
from .versions import installed_version

DISTRIBUTIONS = ("vllm", "vllm-omni", "torch")  # the versions every report shows


def function_params(func: ast.FunctionDef) -> tuple[Param, ...]:
    """Every parameter of a parsed function, in order, with its kind and whether it has a default."""
    args = func.args
    positional = [*args.posonlyargs, *args.args]
    first_defaulted = len(positional) - len(args.defaults)
    params = [Param(a.arg, ParamKind.POSITIONAL, i >= first_defaulted) for i, a in enumerate(positional)]
    if args.vararg is not None:
        params.append(Param(args.vararg.arg, ParamKind.VAR_POSITIONAL))
    params += [Param(a.arg, ParamKind.KEYWORD_ONLY, d is not None) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    if args.kwarg is not None:
        params.append(Param(args.kwarg.arg, ParamKind.VAR_KEYWORD))
    return tuple(params)


@dataclass(frozen=True)
class SiteFacts:
    """What one detection pass found: ``source`` ("static": files; "runtime": the imported modules), the versions
    of ``DISTRIBUTIONS`` and every catalogue entry's facts by id (each drift point's own record; an entry whose
    target is not imported is missing from a runtime pass)."""

    source: str
    versions: dict
    facts: dict = field(default_factory=dict)


class StaticSite:
    """A vLLM tree and a vllm-omni tree (installed, unpacked or wheels), with the detections that several drift
    points read computed once, on first use. Drift points read files through it, never by their own paths.

    The installed site (``installed()``) also keeps what it detects on disk (``detect.fact_cache``): each entry's
    ``facts``; a warm run reads them back instead of parsing anything."""

    def __init__(self, vllm_tree: SourceTree, omni_tree: SourceTree, versions: dict[str, str | None] | None = None):
        self.vllm_tree = vllm_tree
        self.omni_tree = omni_tree
        self._versions = versions
        self._import_drift = ...
        self._behaviour_drift = ...
        self.fetch_own_vllm = False  # whether the behavioural scan may download vllm-omni's own vLLM (check)
        self._cache_key = None  # set by installed(): files of other trees are not cached
        self._cached: dict = {}
        self._unsaved = False

    @classmethod
    def installed(cls) -> StaticSite:
        """The installed environment: versions from distribution metadata (read when first needed), files from
        where the packages are."""
        from . import fact_cache

        roots = {package: installed_package_root(package) for package in fact_cache.PACKAGES}
        site = cls(tree_at(roots["vllm"]), tree_at(roots["vllm_omni"]))
        site._versions = _installed_versions
        site._cache_key = fact_cache.installed_key({p: str(r) if r is not None else None for p, r in roots.items()})
        site._cached = fact_cache.load(site._cache_key)
        return site

    @classmethod
    def of_wheels(cls, vllm_tree: SourceTree, omni_tree: SourceTree, versions: dict[str, str | None]) -> StaticSite:
        """Two trees read by ``check``; where both are wheel files, what is detected is kept in the on-disk fact
        cache under the wheels' paths, sizes and mtimes (a warm ``check`` parses nothing)."""
        from . import fact_cache

        site = cls(vllm_tree, omni_tree, versions)
        if vllm_tree.is_zip and omni_tree.is_zip:
            site._cache_key = fact_cache.files_key("wheel-pair", str(vllm_tree.root), str(omni_tree.root),
                                                   repr(sorted(versions.items())))
            site._cached = fact_cache.load(site._cache_key)
        return site

    @property
    def versions(self) -> dict[str, str | None]:
        """The versions of ``DISTRIBUTIONS``: as given, from the installed metadata, or from the vLLM tree's
        dist-info (a wheel, an unpacked tree)."""
        if callable(self._versions):
            self._versions = self._versions()
        if self._versions is None:
            self._versions = {d: self.vllm_tree.distribution_version(d) for d in DISTRIBUTIONS}
        return self._versions

    @property
    def environment(self) -> SiteFacts:
        """The versions and every catalogue entry's static facts of this site (``site_facts``)."""
        return site_facts(self)

    def facts(self, entry_id: str, detect):
        """``detect(self)`` for catalogue entry ``entry_id`` (its ``detect_static``), or what an earlier run of the
        same installed files found (``save()`` keeps it)."""
        cached = self._kept_facts()
        if entry_id not in cached:
            cached[entry_id] = detect(self)
            self._unsaved = self._cache_key is not None
        return cached[entry_id]

    def _kept_facts(self) -> dict:
        """The facts found so far, by entry id. The cache holds them pickled apart from the rest (``save``), and
        they are unpickled here, on first use: unpickling imports the drift-point modules defining their classes
        (some 30 modules), which the warm doctor's short screen, reading decisions only (``decisions``), never
        needs. A blob that cannot be unpickled is no facts: they are detected again."""
        kept = self._cached.get("facts")
        if isinstance(kept, bytes):
            import pickle

            try:
                kept = pickle.loads(kept)
            except Exception:  # noqa: BLE001 - stale classes or a damaged blob: a miss, as in fact_cache.load
                kept = None
        if not isinstance(kept, dict):
            kept = {}
        self._cached["facts"] = kept
        return kept

    def decisions(self, controls, decide):
        """``decide()``: what every catalogue entry decides under ``controls`` (``decide.decided``'s decisions and
        patterns), or what an earlier run of the same files decided under the same controls (``Controls`` field by
        field). A drift point decides from its facts and the controls alone (``DriftPoint.decide``), and the cache
        key covers every file the facts come from, so what is kept is what deciding again would give. Kept where the
        site has a cache key."""
        key = _controls_key(controls)
        kept = self._cached.get("decisions", {})
        if key in kept:
            return kept[key]
        decided = decide()
        if self._cache_key is not None:
            self._cached["decisions"] = {**kept, key: decided}
            self._unsaved = True
            self.save()
        return decided

    def save(self) -> None:
        """Write what this run detected beyond the cache to the cache (installed sites only); the facts go pickled
        on their own (``_kept_facts``), so reading the cache back does not unpickle them."""
        if not self._unsaved:
            return
        from . import fact_cache

        data = dict(self._cached)
        self._unsaved = False
        if isinstance(data.get("facts"), dict):
            data["facts"] = fact_cache.pickled(data["facts"])
            if data["facts"] is None:  # facts that cannot be pickled: nothing is cached, as store() does
                return
        fact_cache.store(self._cache_key, data)

    def installed_import_drift(self):
        """``detect_import_drift()`` (the installed pair, this site's trees when it is ``installed()``), kept with
        the facts: a warm run reads it back with them."""
        from .import_drift import detect_import_drift

        return self._kept("import_drift", detect_import_drift)

    def installed_dependency_drift(self):
        """``dependency_drift.installed_dependency_drift()`` (the installed pair's install conflicts), kept with the
        facts under the stamps of every installed METADATA it read (``detect.versions.metadata_stamp``): the
        cache key covers vLLM's and vllm-omni's RECORDs but not the packages vllm-omni pins or the conflicting
        ones installed beside them. A warm run stamps those again (the ``sys.path`` listings, a stat each) and
        reads the drift back when none changed, so it imports neither ``packaging`` nor ``importlib.metadata``;
        otherwise, or where a stamp cannot be taken (only ``importlib.metadata`` can find a distribution), it is
        computed. The file clashes stay computed on first use, never kept."""
        from dataclasses import replace

        from .versions import metadata_stamp

        kept = self._cached.get("dependency_drift")
        if kept is not None:
            stamps, drift = kept
            if all(metadata_stamp(name) == stamp for name, stamp in stamps.items()):
                return drift if drift is None else replace(drift)  # a copy: its file clashes fill in on it alone
        from ..dependency_drift import installed_dependency_drift

        stamps: dict = {}
        drift = installed_dependency_drift(stamps=stamps)
        if self._cache_key is not None and None not in stamps.values():
            self._cached["dependency_drift"] = (stamps, drift if drift is None else replace(drift))
            self._unsaved = True
            self.save()
        return drift

    @property
    def behaviour_drift(self):
        """vllm-omni's calls, subclasses and stand-ins checked against the vLLM tree (``detect.behaviour_drift``);
        None without both. Kept with the facts where the site has a cache key (``of_wheels``)."""
        if self._behaviour_drift is ...:
            self._behaviour_drift = self._kept("behaviour_drift", self._scan_behaviour)
        return self._behaviour_drift

    def _kept(self, name: str, compute):
        """``compute()``, or what an earlier run of the same files kept under ``name``; kept when the site has a
        cache key (and a behavioural scan only when it had its baseline: one without is not final)."""
        if name not in self._cached:
            value = compute()
            if name != "behaviour_drift" or value is None or value.baseline is not None:
                self._cached[name] = value
                self._unsaved = self._cache_key is not None
                self.save()
            return value
        return self._cached[name]

    def _scan_behaviour(self):
        from .behaviour_drift import check_behaviour_drift

        return check_behaviour_drift(self.omni_tree, self.vllm_tree, self.versions.get("vllm-omni"), self._own_vllm)

    def _own_vllm(self, version):
        from .behaviour_drift import own_vllm_wheel

        return own_vllm_wheel(version, fetch=self.fetch_own_vllm)

    @property
    def import_drift(self):
        """vllm-omni's imports checked against the vLLM tree (``detect.import_drift``); None without both."""
        if self._import_drift is ...:
            from .import_drift import check_import_drift

            self._import_drift = self._kept("import_drift", lambda: check_import_drift(self.omni_tree, self.vllm_tree))
        return self._import_drift


class FactsOnFirstUse(Mapping):
    """A ``SiteFacts.facts`` mapping computed by ``compute()`` when first read: the static doctor's, whose short
    screen reads no fact (``--verbose`` and ``--json`` do; reading them unpickles or detects them)."""

    def __init__(self, compute):
        self._compute = compute
        self._facts: dict | None = None

    def _all(self) -> dict:
        if self._facts is None:
            self._facts = self._compute()
        return self._facts

    def __getitem__(self, entry_id):
        return self._all()[entry_id]

    def __iter__(self):
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


def _controls_key(controls) -> str:
    """``controls`` (a ``config.Controls``) as text that compares equal across processes: every field, sets
    sorted (a frozenset's order depends on the process's string hashing)."""
    import dataclasses

    return repr([(f.name, sorted(value) if isinstance(value, (set, frozenset)) else value)
                 for f in dataclasses.fields(controls) for value in [getattr(controls, f.name)]])


def _installed_versions() -> dict[str, str | None]:
    return {d: installed_version(d) for d in DISTRIBUTIONS}


def site_facts(site: StaticSite) -> SiteFacts:
    """Every catalogue entry's static facts of ``site`` (cached on an installed site) and its versions."""
    from ..catalogue import CATALOGUE

    facts = {entry.id: site.facts(entry.id, entry.point.detect_static) for entry in CATALOGUE}
    site.save()
    return SiteFacts("static", site.versions, facts)


def detect_static() -> SiteFacts:
    """Static detection of the installed environment: versions from distribution metadata, every entry's facts
    from the installed source files. Imports none of vllm, vllm_omni or torch."""
    return site_facts(StaticSite.installed())
