"""Recall and precision of ``vllm-compat check vllm==X PLUGIN==Y`` on the plugins' own breakage reports (issue 40).

    python plugins/recall.py [--json OUT]

For each ``[[report]]`` of breakage_reports.toml whose two releases are on the index, runs ``check --json`` on the
pair (the plugin release's files and vLLM's, as a user would; vLLM's members are read by range requests and kept in
the wheel cache) and asks whether the report's ``failing_name`` (or one of its ``also`` names) is among the missing
names of an entrypoint that will not start, or the gone vLLM attributes one reads where it fails when run. For each
``[[known_good]]`` pair it asks that no entrypoint is either. Prints one row per pair and the totals: recall over the reports a static reading can see (``static = true``),
precision over the known-good pairs. The expected values are the table's; nothing here reads the code under test
beyond its JSON answer.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from pathlib import Path

import tomllib

HERE = Path(__file__).resolve().parent


def reports() -> dict:
    return tomllib.loads((HERE / "breakage_reports.toml").read_text())


def _check(vllm: str, plugin: str, version: str) -> dict:
    from vllm_compat.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["check", "--json", f"vllm=={vllm}", f"{plugin}=={version}"])
    try:
        data = json.loads(out.getvalue())
    except ValueError:
        return {"error": f"exit {code}, no JSON: {out.getvalue()[-300:]}"}
    return data


def _stopping(data: dict) -> dict[str, set[str]]:
    """{entrypoint: the names that stop it}: missing imports of one that will not start, and the gone vLLM attributes
    it reads where it fails when run."""
    entrypoints = (data.get("import_drift") or {}).get("entrypoints") or {}
    found = {i: set(e.get("missing") or ()) for i, e in entrypoints.items() if e.get("status") == "will_not_start"}
    for entry, reads in (data.get("fails_when_run") or {}).items():
        found.setdefault(entry if entry in found else f"{entry} (fails when run)", set()).update(
            r["target"] for r in reads)
    return found


def _same(found: str, named: str) -> bool:
    """Whether the check's name is the report's: equal, a member of it (a module that is missing whole), or the same
    ``Class.attribute`` where the check names the module defining the class and the report the one importing it
    (``vllm.config.scheduler.SchedulerConfig.is_multi_step`` / ``vllm.config.SchedulerConfig.is_multi_step``)."""
    return found == named or found.startswith(named + ".") or (
        found.split(".")[-2:] == named.split(".")[-2:] and found.split(".")[-2][:1].isupper())


def _release(version: str) -> str:
    """The PyPI version of a table field ("0.3.10 (fixed there; ...)" -> "0.3.10")."""
    return version.split()[0]


def measure_report(report: dict) -> dict:
    names = {report["failing_name"], *report.get("also", ())}
    row = {"id": report["id"], "kind": report["kind"], "static": report["static"], "pair":
           f"vllm=={report['vllm']} {report['plugin']}=={_release(report['plugin_version'])}"}
    if str(report.get("pypi_plugin", "")).startswith("no") or str(report.get("pypi_vllm", "")).startswith("no"):
        return {**row, "result": "not on the index"}
    data = _check(report["vllm"], report["plugin"], _release(report["plugin_version"]))
    if "error" in data:
        return {**row, "result": "error", "why": data["error"]}
    hits = {entry: sorted(m for m in missing if any(_same(m, n) for n in names))
            for entry, missing in _stopping(data).items()}
    hits = {entry: found for entry, found in hits.items() if found}
    return {**row, "result": "named" if hits else "missed", "under": hits,
            "verdict": (data.get("verdict") or {}).get("kind")}


def measure_known_good(pair: dict) -> dict:
    row = {"pair": f"vllm=={pair['vllm']} {pair['plugin']}=={pair['plugin_version']}"}
    data = _check(pair["vllm"], pair["plugin"], pair["plugin_version"])
    if "error" in data:
        return {**row, "result": "error", "why": data["error"]}
    stopping = _stopping(data)
    return {**row, "result": "false alarm" if stopping else "starts", "under": {k: sorted(v) for k, v in stopping.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write every row here too")
    args = parser.parse_args(argv)
    table = reports()
    rows = [measure_report(r) for r in table["report"]]
    good = [measure_known_good(p) for p in table["known_good"]]
    for row in rows:
        where = "; ".join(f"{k}: {', '.join(v)}" for k, v in row.get("under", {}).items()) or row.get("why", "")
        print(f"{row['id']:<36} {row['kind']:<9} static={str(row['static']).lower():<5} {row['result']:<17} {where}")
    for row in good:
        where = "; ".join(f"{k}: {', '.join(v)}" for k, v in row.get("under", {}).items()) or row.get("why", "")
        print(f"known good  {row['pair']:<48} {row['result']:<11} {where}")
    static = [r for r in rows if r["static"] and r["result"] != "not on the index"]
    named = [r for r in static if r["result"] == "named"]
    checked = [g for g in good if g["result"] != "error"]
    fine = [g for g in checked if g["result"] == "starts"]
    print(f"recall: {len(named)} of {len(static)} static reports named under an entrypoint that will not start "
          f"({100 * len(named) / max(len(static), 1):.0f} %); precision on known-good pairs: {len(fine)} of "
          f"{len(checked)} start ({len(good) - len(checked)} could not be checked)")
    if args.json:
        args.json.write_text(json.dumps({"reports": rows, "known_good": good}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
