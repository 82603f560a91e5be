"""Generate ``vllm_compat/bridges/_alias_table.py``: where the vLLM names vllm-omni imports went, matched by source.

For each vllm-omni release (built against the vLLM of the same version, ``BASES``) and each newer vLLM of
``matrix/vllm.toml``: vllm_compat's own import-drift check lists the vLLM imports that no longer resolve; each
one's definition is looked up in the base vLLM and searched for in the newer vLLM's whole tree by its normalized
source (``vllm_compat.detect.definitions.source_key``), never by its name alone:

* identical: the same definition (docstrings aside) is defined elsewhere; under the same name, or under another
  when that definition is substantial and unique in the tree;
* changed: no identical definition, but one of the same name whose source is still close (similarity >=
  ``NEAR``): a hand review decides (``matrix/alias_reviews.toml``: verdict and a one-line reason); an
  unreviewed or rejected changed pair is written to the table but never installed;
* unresolved: neither (or a same-named definition too far from the old one: an unrelated thing).

A module that is gone moved when every name vllm-omni imports from it (anywhere in its source) is found in one
newer module; that module is then the old path's alias. Rows are merged over the vLLM releases where the same
old name resolves to the same new definition (same path, same source key).

    python matrix/aliases.py [--check] [--wheels DIR] [--cache DIR]

Wheels come from ``--wheels`` (default: vllm_compat's wheel cache, ``vllm_compat.detect.wheels``), fetched with
``pip download --no-deps`` when missing. ``--check`` writes nothing: it prints the diff and exits 1 when the
checked-in table differs from what the wheels give (``nox -s refresh`` runs it). The per-wheel index of
definitions (12 s of parsing a vLLM tree) is cached in ``--cache``.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import re
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vllm_compat.detect.definitions import Definitions, module_of, normalized_source, source_key  # noqa: E402
from vllm_compat.detect.import_drift import check_import_drift  # noqa: E402
from vllm_compat.detect.import_graph import reached as _reached  # noqa: E402
from vllm_compat.detect.source_scan import plugin_imports  # noqa: E402
from vllm_compat.detect.static import SourceTree  # noqa: E402

TABLE = ROOT / "vllm_compat" / "bridges" / "_alias_table.py"
REVIEWS = ROOT / "matrix" / "alias_reviews.toml"
MATRIX = ROOT / "matrix" / "vllm.toml"
BASES = {"0.24.0": "0.24.0", "0.26.0": "0.26.0", "0.28.0": "0.28.0", "0.30.0": "0.30.0"}
# vllm-omni release -> the vLLM it was built and tested against: no vllm-omni wheel pins vllm (Requires-Dist), each
# release is "aligned with the vLLM 0.N release line" (its README, in the wheel METADATA), matrix/vllm.toml's native pair.
NEAR = 0.6  # below this a same-named definition is another thing, not an edited one
RENAME_MIN = 400  # a renamed definition counts only when its normalized source is at least this long (unique)
# The diffusion path: what a diffusion deployment of vllm-omni imports (package import, loader, configs, DiT
# models, quantization, worker / executor / stage clients, the Omni / AsyncOmni entrypoints).
DIFFUSION_ROOTS = ("vllm_omni.diffusion", "vllm_omni.quantization", "vllm_omni.engine.stage_client",
                   "vllm_omni.engine.stage_engine_core_client", "vllm_omni.entrypoints.omni",
                   "vllm_omni.entrypoints.async_omni")
# The serving layer: reached from the diffusion path too (a DiT pipeline, cosmos3, imports the OpenAI server's
# protocol), but a name imported only there is a serving-layer name.
SERVING = ("vllm_omni.entrypoints.openai", "vllm_omni.entrypoints.cli", "vllm_omni.entrypoints.serve",
           "vllm_omni.entrypoints.chat_utils", "vllm_omni.entrypoints.utils")
DEFAULT_CACHE = Path.home() / ".cache" / "vllm-compat" / "alias-index"
INDEX_VERSION = "2"  # bump when the index format or source_key changes


def _version_key(version: str) -> tuple:
    return tuple(int(p) for p in re.findall(r"\d+", version))


def vllm_versions() -> list[str]:
    cells = tomllib.loads(MATRIX.read_text())["cell"]
    oldest = min(_version_key(b) for b in BASES.values())
    return sorted({c["vllm"] for c in cells if _version_key(c["vllm"]) >= oldest}, key=_version_key)


def wheel(distribution: str, version: str, directory: Path | None) -> Path:
    from vllm_compat.detect.wheels import fetch_wheel

    return fetch_wheel(distribution, version, directory)[0]


# ------------------------------------------------------------------------------------------ the index


def tree_index(whl: Path, cache: Path) -> dict:
    """``{"exact": {key: [[module, name]]}, "renamed": {key: [[module, name]]}, "names": {name: [[module,
    key]]}}`` over every module-level def, class and assignment of the vLLM in ``whl``; cached per wheel."""
    cached = cache / f"{whl.name}.{INDEX_VERSION}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    tree = SourceTree(whl)
    defs = Definitions(tree)
    exact: dict = {}
    renamed: dict = {}
    names: dict = {}
    shapes: dict = {}
    for relpath in tree.walk_py("vllm"):
        module = module_of(relpath)
        for name, node in defs.top_level(relpath):
            key = source_key(node)
            exact.setdefault(key, []).append([module, name])
            names.setdefault(name, []).append([module, key])
            if not hasattr(node, "targets") and not hasattr(node, "target"):  # def / class: may be renamed
                anon = normalized_source(node, rename="_")
                if len(anon) >= RENAME_MIN:
                    renamed.setdefault(hashlib.sha256(anon.encode()).hexdigest()[:16], []).append([module, name])
            shape = _shape(node)
            if shape is not None:
                shapes.setdefault(shape, []).append([module, name])
    index = {"exact": exact, "renamed": renamed, "names": names, "shapes": shapes}
    cache.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(index))
    return index


def _shape(node) -> str | None:
    """What a renamed, edited definition still shares with its old self: a class's bases and method names, a
    function's parameter names."""
    import ast

    if isinstance(node, ast.ClassDef):
        methods = sorted(n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        return "class " + ",".join(ast.unparse(b) for b in node.bases) + ":" + ",".join(methods)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        args = node.args
        return "def " + ",".join(a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs])
    return None


def _lines(node) -> list[str]:
    import ast
    import copy

    node = copy.deepcopy(node)
    for sub in ast.walk(node):
        body = getattr(sub, "body", None)
        if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body and isinstance(
                body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
            sub.body = body[1:] or [ast.Pass()]
    return [line.strip() for line in ast.unparse(node).splitlines() if line.strip()]


def similarity(old, new, rename: str | None = None) -> float:
    """Line-level similarity of two definitions' code (docstrings left out; ``new`` read as named ``rename``)."""
    a, b = _lines(old), _lines(new)
    if rename is not None and b:
        b[0] = b[0].replace(getattr(new, "name", ""), rename, 1)
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return matcher.ratio() if matcher.real_quick_ratio() >= NEAR and matcher.quick_ratio() >= NEAR else 0.0


def _path_closeness(old: str, new: str) -> tuple:
    a, b = old.split("."), new.split(".")
    common = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return (a[-1] == b[-1], common, -abs(len(a) - len(b)), new)


class Matcher:
    """Finds where one base-vLLM definition went in one newer vLLM."""

    def __init__(self, base: Definitions, new: Definitions, index: dict):
        self.base, self.new, self.index = base, new, index

    def match_name(self, module: str, name: str, prefer: str | None = None) -> dict:
        """``{"status": identical|changed|unresolved, "new": "module.name", "key", "base_key", "similarity",
        "why"}`` for ``from module import name`` of the base vLLM."""
        hit = self.base.find(module, name)
        if hit is None:
            return {"status": "unresolved", "why": "not defined in the base vLLM either (a submodule, or lazy)"}
        _, defined_name, node = hit
        base_key = source_key(node)
        candidates = [tuple(c) for c in self.index["exact"].get(base_key, []) if c[1] == defined_name]
        if not candidates and len(normalized_source(node, rename="_")) >= RENAME_MIN:
            anon = hashlib.sha256(normalized_source(node, rename="_").encode()).hexdigest()[:16]
            renamed = [tuple(c) for c in self.index["renamed"].get(anon, [])]
            candidates = renamed if len(renamed) == 1 else []
        if candidates:
            best = max(candidates, key=lambda c: (c[0] == prefer, _path_closeness(module, c[0])))
            return {"status": "identical", "new": f"{best[0]}.{best[1]}", "key": base_key, "base_key": base_key,
                    "similarity": 1.0}
        same_name = self.index["names"].get(defined_name, [])
        scored = []
        for new_module, _ in same_name:
            found = self.new.find(new_module, defined_name)
            if found is not None:
                scored.append((similarity(node, found[2]), new_module == prefer, _path_closeness(module, new_module),
                               new_module, defined_name, source_key(found[2])))
        if not any(s[0] >= NEAR for s in scored):  # renamed and edited: same shape, close code
            shaped = self.index["shapes"].get(_shape(node) or "", [])
            for new_module, new_name in shaped[:200] if len(shaped) <= 200 else []:
                found = self.new.find(new_module, new_name)
                if found is not None and new_name != defined_name:
                    scored.append((similarity(node, found[2], rename=defined_name), False,
                                   _path_closeness(module, new_module), new_module, new_name, source_key(found[2])))
        scored.sort(reverse=True)
        if scored and scored[0][0] >= NEAR:
            score, _, _, new_module, new_name, key = scored[0]
            return {"status": "changed", "new": f"{new_module}.{new_name}", "key": key, "base_key": base_key,
                    "similarity": round(score, 3)}
        same = [s for s in scored if s[4] == defined_name]
        if same:
            where = ", ".join(f"{s[3]}.{s[4]} (similarity {s[0]:.2f})" for s in same[:3])
            return {"status": "unresolved", "why": f"same name, unrelated definition: {where}"}
        return {"status": "unresolved", "why": f"no definition of that source, no {defined_name} and no close "
                                               "definition of the same shape"}

    def match_module(self, module: str, names: list[str]) -> dict:
        """A gone module moved when every name imported from it is found, by source, in one newer module."""
        matches = {n: self.match_name(module, n) for n in names}
        if any(m["status"] == "unresolved" for m in matches.values()):
            lost = sorted(n for n, m in matches.items() if m["status"] == "unresolved")
            return {"status": "unresolved", "why": f"no match for {', '.join(lost)}", "names": matches}
        hosts = {m["new"].rpartition(".")[0] for m in matches.values()}
        # A package above the defining modules may re-export them all (vLLM 0.33's renderers.chat_utils).
        common = _common_package(hosts)
        while common.count(".") >= 2 and common not in hosts:
            hosts.add(common)
            common = common.rpartition(".")[0]
        # A module that holds each match (defines or re-exports that very definition), nearest the old path first.
        for host in sorted(hosts, key=lambda h: _path_closeness(module, h), reverse=True):
            per_name = {}
            for name, found in matches.items():
                hit = self.new.find(host, name)
                if hit is None or source_key(hit[2]) != found["key"]:
                    break
                per_name[name] = found
            else:
                changed = {n: m for n, m in per_name.items() if m["status"] != "identical"}
                return {"status": "changed" if changed else "identical", "new": host, "names": per_name,
                        "key": _combined({n: m["key"] for n, m in per_name.items()}),
                        "base_key": _combined({n: m["base_key"] for n, m in per_name.items()}),
                        "similarity": min(m["similarity"] for m in per_name.values())}
        # Split: every name found, in several modules: the old path becomes a module of vLLM's own objects, each
        # from its new home (``moved``). Names renamed into one module are no split (a rename: an adapter's job,
        # as openai_engine_serving's OpenAIServing = GenerateBaseServing).
        if len({m["new"].rpartition(".")[0] for m in matches.values()}) == 1:
            where = ", ".join(f"{n} -> {m['new']}" for n, m in sorted(matches.items()))
            return {"status": "unresolved", "why": f"its names went to one module under other names ({where})",
                    "names": matches}
        changed = {n: m for n, m in matches.items() if m["status"] != "identical"}
        return {"status": "changed" if changed else "identical", "new": None, "names": matches,
                "moved": {n: m["new"] for n, m in sorted(matches.items())},
                "key": _combined({n: m["key"] for n, m in matches.items()}),
                "base_key": _combined({n: m["base_key"] for n, m in matches.items()}),
                "similarity": min(m["similarity"] for m in matches.values())}


def _common_package(modules: set[str]) -> str:
    parts = [m.split(".") for m in modules]
    common = []
    for group in zip(*parts, strict=False):
        if len(set(group)) != 1:
            break
        common.append(group[0])
    return ".".join(common)


def _combined(keys: dict) -> str:
    """A module row's key: its names' keys together (``moved_names.combined_key`` re-computes it)."""
    return hashlib.sha256(json.dumps(sorted(keys.items())).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------ vllm-omni side


def omni_graph(tree: SourceTree) -> tuple[dict, dict]:
    """vllm-omni's modules and their module-level imports of each other (as ``import_drift`` follows them)."""
    files = tree.walk_py("vllm_omni")
    modules = {module_of(f): f for f in files}
    edges: dict = {}
    for importer, relpath in modules.items():
        package = importer if relpath.endswith("__init__.py") else importer.rpartition(".")[0]
        targets = edges.setdefault(importer, set())
        for _, level, module, names, context in plugin_imports(tree, relpath, "vllm_omni"):
            if context != "module":
                continue
            if level == -1:
                targets.update(n for n in names if n.startswith("vllm_omni"))
                continue
            if level:
                base = package.split(".")[: len(package.split(".")) - (level - 1)]
                module = ".".join(base + ([module] if module else []))
            if module and module.startswith("vllm_omni"):
                targets.add(module)
                targets.update(f"{module}.{n}" for n in names if f"{module}.{n}" in modules)
    return modules, edges


def diffusion_path(tree: SourceTree) -> set[str]:
    modules, edges = omni_graph(tree)
    reached = _reached("vllm_omni", modules, edges)
    for module in modules:
        if module.startswith(DIFFUSION_ROOTS):
            reached |= _reached(module, modules, edges)
    return reached


_IMPORTS: dict = {}


def _vllm_imports(tree: SourceTree) -> list[tuple[str, str, list[str]]]:
    """``(file, module, names)`` of every ``from vllm... import`` in vllm-omni outside TYPE_CHECKING (read once)."""
    if id(tree) not in _IMPORTS:
        _IMPORTS[id(tree)] = [(relpath, imported, names) for relpath in tree.walk_py("vllm_omni")
                              for _, level, imported, names, context in plugin_imports(tree, relpath, "vllm_omni")
                              if context != "type_checking" and level == 0 and imported]
    return _IMPORTS[id(tree)]


def imported_names(tree: SourceTree, module: str) -> tuple[list[str], list[str]]:
    """(names vllm-omni imports from vLLM's ``module`` anywhere outside TYPE_CHECKING, the files doing so)."""
    names, files = set(), set()
    for relpath, imported, found in _vllm_imports(tree):
        if imported == module:
            names.update(n for n in found if n != "*")
            files.add(relpath)
    return sorted(names), sorted(files)


def importer_files(tree: SourceTree, module: str, name: str | None) -> list[str]:
    return sorted({relpath for relpath, imported, names in _vllm_imports(tree)
                   if imported == module and (name is None or name in names)})


# ------------------------------------------------------------------------------------------ the run


def measure(wheel_dir: Path | None, cache: Path) -> tuple[list[dict], dict]:
    """(rows before merging: one per omni release, vLLM release and old target; per cell what stays
    unresolved, split into the diffusion path and the rest)."""
    results, unresolved = [], {}
    versions = vllm_versions()
    for omni, base_version in BASES.items():
        omni_tree = SourceTree(wheel("vllm-omni", omni, wheel_dir))
        base = Definitions(SourceTree(wheel("vllm", base_version, wheel_dir)))
        on_path = diffusion_path(omni_tree)
        for version in versions:
            if _version_key(version) <= _version_key(base_version):
                continue
            whl = wheel("vllm", version, wheel_dir)
            cell_name = f"vllm {version} + vllm-omni {omni}"
            cached = cache / f"cell-{_code_key()}-{whl.name}-{omni}.json"
            if cached.exists():
                data = json.loads(cached.read_text())
                results += data["results"]
                unresolved[cell_name] = data["unresolved"]
                continue
            first = len(results)
            new_tree = SourceTree(whl)
            drift = check_import_drift(omni_tree, new_tree)
            matcher = Matcher(base, Definitions(new_tree), tree_index(whl, cache))
            cell = unresolved.setdefault(cell_name, {"diffusion": {}, "serving": {}})
            targets: dict = {}
            for u in drift.unresolved:
                targets.setdefault((u.module, u.name), set()).add(u.importer)
            for (module, name), importers in sorted(targets.items(), key=lambda t: (t[0][0], t[0][1] or "")):
                where = "diffusion" if {i for i in importers if not i.startswith(SERVING)} & on_path else "serving"
                if name is None:
                    names, files = imported_names(omni_tree, module)
                    found = matcher.match_module(module, names) if names else {
                        "status": "unresolved", "why": "imported as a module only (no names to match)"}
                    kind, old = "module", module
                else:
                    found = matcher.match_name(module, name)
                    files = importer_files(omni_tree, module, name)
                    kind, old = "name", f"{module}.{name}"
                if found["status"] == "unresolved":
                    cell[where][old] = found["why"]
                    continue
                results.append({"old": old, "new": found["new"], "kind": kind, "status": found["status"],
                                "key": found["key"], "base_key": found["base_key"],
                                "similarity": found["similarity"], "omni": omni, "vllm": version,
                                "importers": files, "path": where,
                                "names": sorted(found.get("names", {})) if kind == "module" else [],
                                "moved": found.get("moved") or {}})
            cache.mkdir(parents=True, exist_ok=True)
            cached.write_text(json.dumps({"results": results[first:], "unresolved": cell}))
    return results, unresolved


def _code_key() -> str:
    """What a cached cell depends on besides the wheels: this script, the definitions and drift detectors."""
    from vllm_compat.detect import definitions, host_index, import_drift, import_graph, source_scan

    parts = [Path(__file__).read_bytes()] + [Path(m.__file__).read_bytes()
                                             for m in (definitions, import_drift, import_graph, source_scan, host_index)]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()[:12]


def merge(results: list[dict], reviews: dict) -> list[dict]:
    """One row per (old, new, new definition's key): the vLLM and vllm-omni releases it serves, the review."""
    rows: dict = {}
    for r in results:
        key = (r["old"], r["new"] or "", r["key"])
        row = rows.setdefault(key, {"old": r["old"], "new": r["new"], "kind": r["kind"], "match": r["status"],
                                    "key": r["key"], "base_keys": set(), "similarity": r["similarity"],
                                    "vllm": set(), "omni": set(), "importers": set(), "path": r["path"],
                                    "names": r["names"], "moved": r.get("moved") or {}})
        if r["status"] == "changed":
            row["match"] = "changed"  # changed against any base is changed
        row["similarity"] = min(row["similarity"], r["similarity"])
        row["base_keys"].add(r["base_key"])
        row["vllm"].add(r["vllm"])
        row["omni"].add(r["omni"])
        row["importers"].update(r["importers"])
        if r["path"] == "diffusion":
            row["path"] = "diffusion"
    out = []
    for (old, _, key), row in sorted(rows.items()):
        new = row["new"]
        review = reviews.get(f"{old} -> {_review_target(row)} @ {key}")
        versions = sorted(row["vllm"], key=_version_key)
        out.append({
            "old": old, "new": new, "kind": row["kind"], "match": row["match"], "key": key,
            "similarity": row["similarity"], "vllm": (versions[0], versions[-1]),
            "omni": tuple(sorted(row["omni"], key=_version_key)), "importers": tuple(sorted(row["importers"])),
            "path": row["path"], "names": tuple(row["names"]), "moved": tuple(sorted(row["moved"].items())),
            "verdict": None if row["match"] == "identical" or review is None else review["verdict"],
            "reason": None if row["match"] == "identical" or review is None else review["reason"],
        })
    return out


def _review_target(row: dict) -> str:
    """What a review names as ``new``: the new module, or for a split module ``"split"`` (its key covers every
    name's new definition)."""
    return row["new"] if row["new"] is not None else "split"


HEADER = '''"""The alias table: vLLM names vllm-omni imports that moved, old path -> new definition, matched by source.

GENERATED by ``python matrix/aliases.py`` from the release wheels (vllm-omni {omni}, each against the vLLM it was
built with and every newer vLLM of matrix/vllm.toml: {vllm}); do not edit. Review verdicts for changed
definitions live in matrix/alias_reviews.toml and are copied here; ``nox -s refresh`` fails when this file is stale.
One ``moved_names.Alias`` a line, as six's ``MovedAttribute`` rows.
"""

from .moved_names import Alias  # the row type: its fields say what each holds

# fmt: off
ALIASES = (
'''


def render(rows: list[dict]) -> str:
    lines = [HEADER.format(omni=", ".join(BASES), vllm=", ".join(vllm_versions()))]
    for row in rows:
        lines.append("    Alias(" + ", ".join(f"{k}={v!r}" for k, v in row.items()) + "),\n")
    lines.append(")\n")
    return "".join(lines)


def read_reviews() -> dict:
    if not REVIEWS.exists():
        return {}
    data = tomllib.loads(REVIEWS.read_text())
    reviews = {}
    for review in data.get("review", []):
        if review.get("verdict") not in ("accept", "reject") or not review.get("reason"):
            raise SystemExit(f"{REVIEWS}: every review needs verdict = accept|reject and a reason: {review}")
        reviews[f"{review['old']} -> {review['new']} @ {review['key']}"] = review
    return reviews


def report(rows: list[dict], unresolved: dict) -> None:
    print(f"{'old':<72} {'new':<72} match     vLLM         omni")
    for row in rows:
        review = "" if row["match"] == "identical" else f" [{row['verdict'] or 'UNREVIEWED'}]"
        print(f"{row['old']:<72} {_review_target(row):<72} {row['match']:<9} {row['vllm'][0]}-{row['vllm'][1]:<7} "
              f"{','.join(row['omni'])}{review}")
    print("\nunresolved (no definition of the same source, nor a close one):")
    for cell, parts in unresolved.items():
        print(f"  {cell}:")
        for where in ("diffusion", "serving"):
            for old, why in sorted(parts[where].items()):
                print(f"    {where:<9} {old}: {why}")
            if not parts[where]:
                print(f"    {where:<9} none")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the checked-in table; write nothing")
    parser.add_argument("--wheels", type=Path, default=None, help="wheel directory (default: vllm_compat's cache)")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    args = parser.parse_args(argv)
    results, unresolved = measure(args.wheels, args.cache)
    rows = merge(results, read_reviews())
    report(rows, unresolved)
    text = render(rows)
    unreviewed = [r for r in rows if r["match"] == "changed" and r["verdict"] is None]
    if unreviewed:
        print(f"\n{len(unreviewed)} changed pair(s) not reviewed (not installed until matrix/alias_reviews.toml "
              "has a verdict):")
        for r in unreviewed:
            print(f'  [[review]]\n  old = "{r["old"]}"\n  new = "{_review_target(r)}"\n  key = "{r["key"]}"  '
                  f"# similarity {r['similarity']}")
    current = TABLE.read_text() if TABLE.exists() else ""
    if args.check:
        if current != text:
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                                       str(TABLE), "regenerated"))
            print(f"\n{TABLE.relative_to(ROOT)} is stale: run python matrix/aliases.py", file=sys.stderr)
            return 1
        print(f"\n{TABLE.relative_to(ROOT)} is up to date")
        return 0
    TABLE.write_text(text)
    print(f"\nwrote {TABLE.relative_to(ROOT)} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
