"""How ``vllm-compat check`` finds the drift of every drift point it decides "patched": the recall of the generic scan.

    python matrix/scan_recall.py [VLLM+OMNI ...] [--verify-off] [--json FILE]

For each pair (default: the retro pairs of issue 38, ``PAIRS``) it runs ``check --json`` in-process
(``vllm_compat.cli.main``; wheels from the wheel cache, fetched where missing) and, for every catalogue entry decided
"patched", prints how the check found the drift that entry bridges:

* ``import``: the import drift maps a missing name to it (``import_drift.bridged``);
* ``scan``: the behavioural scan has a finding it handles (``handled_by``), with the entrypoints and the effect;
* ``own facts``: not static call / attribute drift: the entry decides from a shape of its own target that only it
  reads (``SEMANTIC``, each with why a generic scan cannot see it);
* ``native``: its drift is already there on the vllm-omni release's own vLLM (a baseline key matches what it
  handles): the subtraction of the baseline hides it by design, and the peer suite is what catches it;
* ``MISSED``: neither.

Recall is over the entries whose drift is not an import, per pair and overall: ``scan / (scan + missed)``, and the
same with the ``own facts`` entries counted as misses (the strict figure). ``--verify-off`` also runs each ``scan``
entry's pair with that entry disabled (``VLLM_COMPAT_DISABLE_PATCHES=<id>``) and prints under which entrypoint and
with which status the now unhandled drift is named (the retro of tests/detect/test_behaviour_drift.py, for every
pair). The undecidable sites of each pair (``import_drift.behaviour_drift.undecidable``) are printed too.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # after PYTHONPATH: another checkout's vllm_compat can be measured the same way

PAIRS = (("0.30.0", "0.24.0"), ("0.33.0", "0.24.0"), ("0.34.0", "0.24.0"), ("0.33.0", "0.26.0"),
         ("0.34.0", "0.26.0"), ("0.33.0", "0.30.0"))

# Entries whose drift no generic scan of calls, overrides, attributes or returns can see, and why.
SEMANTIC = {
    "ar_scheduler_v1_runner": "config semantics: every call binds; vLLM's Scheduler reads use_v2_model_runner from the "
                              "config while vllm-omni's worker forces the V1 runner: two processes disagree on a "
                              "flag's value, which only data flow across processes would show",
    "generation_scheduler_v1_runner": "config semantics, as ar_scheduler_v1_runner (the generation scheduler)",
    "diffusers_loader_meta_device": "loader semantics: module.to() on params left on the meta device by online "
                                    "quantization; a value's device at run time, decided by the loader's own facts",
    "hsdp_load_order": "loader semantics: the order of processing and sharding; decided by the loader's own facts",
    "streaming_input_sessions": "behaviour of an unchanged signature (_update_request_as_session's result)",
    "cli_logging_setup": "a side effect gone: vLLM 0.31's logger no longer configures itself at import, and only "
                         "vLLM's own CLI calls the setup; vllm-omni's CLI calls nothing that stopped binding",
}


def run_check(vllm: str, omni: str, disabled: str = "") -> tuple[int, dict, float]:
    """``(exit code, check --json, seconds)`` of one pair, in-process."""
    from vllm_compat.cli import main

    saved = os.environ.get("VLLM_COMPAT_DISABLE_PATCHES")
    if disabled:
        os.environ["VLLM_COMPAT_DISABLE_PATCHES"] = disabled
    else:
        os.environ.pop("VLLM_COMPAT_DISABLE_PATCHES", None)
    out = io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out):
            code = main(["check", "--json", f"vllm=={vllm}", f"vllm-omni=={omni}"])
    finally:
        if saved is None:
            os.environ.pop("VLLM_COMPAT_DISABLE_PATCHES", None)
        else:
            os.environ["VLLM_COMPAT_DISABLE_PATCHES"] = saved
    return code, json.loads(out.getvalue()), time.perf_counter() - start


def how_found(data: dict) -> dict[str, tuple[str, str]]:
    """``{entry id: (how, detail)}`` for each entry decided "patched": how in ("import", "scan", "own facts",
    "MISSED")."""
    drift = data["import_drift"]
    bridged: dict[str, list[str]] = {}
    for name, entry in (drift.get("bridged") or {}).items():
        bridged.setdefault(entry, []).append(name)
    handled: dict[str, list[dict]] = {}
    for finding in (drift.get("behaviour_drift") or {}).get("findings", []):
        if finding.get("handled_by"):
            handled.setdefault(finding["handled_by"], []).append(finding)
    unresolved = {u["target"] for u in drift.get("unresolved") or ()}
    rows = {e["id"]: e for e in data.get("catalogue") or ()}
    found = {}
    for decision in data["patches"]:
        entry = decision["name"]
        if decision["action"] != "patched":
            continue
        target_module = rows.get(entry, {}).get("target_module", "")
        if entry in bridged:
            found[entry] = ("import", ", ".join(sorted(bridged[entry]))[:90])
        elif target_module in unresolved and entry not in handled:
            found[entry] = ("import", f"{target_module} missing (bridged by {bridged_by(drift, target_module)}); "
                                      "the name this entry adds to it is one level deeper")
        elif entry in handled:
            first = handled[entry][0]
            reach = ",".join(sorted({e for f in handled[entry] for e in f["entrypoints"]}))
            found[entry] = ("scan", f"{first['kind']} {first['vllm_object'].rsplit('.', 2)[-2:][-1]} "
                                    f"({','.join(first['names'])}) in {first['plugin_object'].rsplit('.', 2)[-2]}, "
                                    f"reaching {reach}")
        elif entry in SEMANTIC:
            found[entry] = ("own facts", SEMANTIC[entry])
        elif native_to(entry, data):
            found[entry] = ("native", f"also on vllm-omni {data['vllm_omni']['version']}'s own vLLM: the baseline "
                                      f"subtraction hides it by design ({native_to(entry, data)})")
        else:
            found[entry] = ("MISSED", "")
    return found


def bridged_by(drift: dict, name: str) -> str:
    return (drift.get("bridged") or {}).get(name, "?")


def native_to(entry: str, data: dict) -> str:
    """The baseline key of the pair's vllm-omni (its own vLLM's findings) that ``entry``'s ``handles_drift``
    matches: drift native to the release, which the subtraction hides by design; "" for none."""
    from vllm_compat.catalogue import entry as catalogue_entry
    from vllm_compat.detect.behaviour_baselines import BASELINES
    from vllm_compat.detect.behaviour_findings import Finding

    omni = (data.get("vllm_omni") or {}).get("version")
    patterns = catalogue_entry(entry).point.handles_drift
    for key in sorted(BASELINES.get(omni, (None, ()))[1]):
        kind, plugin_object, vllm_object, names, _ = key.split("|")
        finding = Finding(kind, vllm_object, plugin_object, "", 0, "", tuple(names.split(",")) if names else ())
        if any(finding.matches(*pattern) for pattern in patterns):
            return key
    return ""


def named_when_off(vllm: str, omni: str, entry: str, on: dict) -> str:
    """Where the check names ``entry``'s drift (the findings it handles in ``on``, the check with it acting) once it
    is disabled: "entrypoint: status (effect)" for each entrypoint (or LLM / AR part) that lists one unhandled."""
    ours = {(f["kind"], f["vllm_object"], f["plugin_object"], tuple(f["names"]))
            for f in on["import_drift"]["behaviour_drift"]["findings"] if f.get("handled_by") == entry}
    code, data, _ = run_check(vllm, omni, disabled=entry)
    places = []
    for entrypoint, status in data["import_drift"]["entrypoints"].items():
        effects = sorted({f["effect"] for field in ("behaviour_drift", "fails_when_used") for f in status.get(field, [])
                          if (f["kind"], f["vllm_object"], f["plugin_object"], tuple(f["names"])) in ours})
        if effects:
            places.append(f"{entrypoint} {status['status']} ({'/'.join(effects)})")
    return "; ".join(places) or f"NOT NAMED (exit {code})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pairs", nargs="*", metavar="VLLM+OMNI", help="e.g. 0.30.0+0.24.0 (default: PAIRS)")
    parser.add_argument("--verify-off", action="store_true", help="check each scan-found entry disabled")
    parser.add_argument("--json", metavar="FILE", help="also write the table as JSON")
    args = parser.parse_args(argv)
    pairs = [tuple(p.split("+")) for p in args.pairs] or list(PAIRS)
    table, totals = {}, {"scan": 0, "MISSED": 0, "own facts": 0, "import": 0, "native": 0}
    for vllm, omni in pairs:
        code, data, seconds = run_check(vllm, omni)
        found = how_found(data)
        undecidable = (data["import_drift"].get("behaviour_drift") or {}).get("undecidable")
        print(f"\n== vLLM {vllm} + vllm-omni {omni}: exit {code}, {seconds:.1f} s, undecidable sites {undecidable}")
        counts = {"scan": 0, "MISSED": 0, "own facts": 0, "import": 0, "native": 0}
        rows = {}
        for entry, (how, detail) in sorted(found.items(), key=lambda i: (i[1][0], i[0])):
            counts[how] += 1
            off = named_when_off(vllm, omni, entry, data) if args.verify_off and how == "scan" else ""
            rows[entry] = {"how": how, "detail": detail, "off": off}
            print(f"  {how:9} {entry:32} {detail}" + (f"\n  {'':9} {'':32} off -> {off}" if off else ""))
        for how, count in counts.items():
            totals[how] += count
        static = counts["scan"] + counts["MISSED"]
        print(f"  recall {counts['scan']}/{static} (strict, own facts and native as misses: {counts['scan']}/"
              f"{static + counts['own facts'] + counts['native']}); by import {counts['import']}")
        table[f"{vllm}+{omni}"] = {"rows": rows, "undecidable": undecidable, "seconds": round(seconds, 2)}
    static = totals["scan"] + totals["MISSED"]
    print(f"\noverall recall {totals['scan']}/{static} = {totals['scan'] / max(static, 1):.0%} (strict "
          f"{totals['scan']}/{static + totals['own facts'] + totals['native']}); found by import {totals['import']}")
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
