"""Findings across framework versions: from each matrix cell's `recheck.json` (every corpus entry
replayed on that cell's versions), per finding the first and last version where it reproduces,
the version it is new in (an older cell passes) and the version it is fixed in (a newer one passes)."""
from __future__ import annotations

import json
from pathlib import Path

from packaging.version import InvalidVersion, Version

from conformance.files import InputRefused, MiB, read_text
from conformance.reporting.inputs import ReportInputError

REPRODUCES = ("still failing", "regressed")


def load_recheck(path: str) -> dict:
    try:
        obj = json.loads(read_text(path, 64 * MiB))
    except (InputRefused, OSError, ValueError) as e:
        raise ReportInputError(path, "<file>", f"not a readable recheck.json: {e}") from None
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("versions"), dict)
        or not isinstance(obj.get("entries"), list)
    ):
        raise ReportInputError(path, "versions/entries", "a recheck.json holds `versions` and `entries`")
    for k, e in enumerate(obj["entries"]):
        if not (isinstance(e, dict) and isinstance(e.get("entry"), str) and isinstance(e.get("key"), list)
                and isinstance(e.get("status"), str)):
            raise ReportInputError(path, f"entries[{k}]", "needs entry, key and status")
    return obj


def _version(v: str | None) -> Version | None:
    try:
        return Version(v.split("+")[0]) if v else None
    except InvalidVersion:
        return None


def cell_label(versions: dict) -> str:
    return ", ".join(f"{k} {versions[k]}" for k in ("jax", "torch") if k in versions)


def history(rechecks: list[dict]) -> dict:
    """{"cells": [labels], "rows": [...]}: one row per corpus entry seen by any cell."""
    cells = [(cell_label(r["versions"]), r["versions"]) for r in rechecks]
    by_entry: dict[str, dict] = {}
    for (label, _), r in zip(cells, rechecks):
        for e in r["entries"]:
            row = by_entry.setdefault(e["entry"], {"entry": e["entry"], "key": e["key"], "statuses": {}})
            row["statuses"][label] = e["status"]
    rows = []
    for name in sorted(by_entry):
        row = by_entry[name]
        fw = "torch" if str(row["key"][1]).startswith("torch:") else "jax"
        order = sorted(((_version(v.get(fw)), v.get(fw), label) for label, v in cells if _version(v.get(fw))),
                       key=lambda t: t[0])
        st = [(ver, raw, row["statuses"].get(label)) for ver, raw, label in order]
        rep = [(ver, raw) for ver, raw, s in st if s in REPRODUCES]
        first = rep[0] if rep else None
        last = rep[-1] if rep else None
        new_in = first[1] if first and any(s == "fixed" and ver < first[0] for ver, _, s in st) else None
        fixed_in = next((raw for ver, raw, s in st if last and ver > last[0] and s == "fixed"), None)
        rows.append({**row, "framework": fw, "first": first[1] if first else None, "last": last[1] if last else None,
                     "new_in": new_in, "fixed_in": fixed_in})
    return {"cells": [label for label, _ in cells], "rows": rows}


def markdown(h: dict) -> list[str]:
    if not h or not h.get("rows"):
        return []
    cells = h["cells"]
    L = ["", "## Across versions (every finding replayed on every cell)", "",
         "| finding | " + " | ".join(cells) + " | reproduces | new in | fixed in |",
         "|---|" + "---|" * len(cells) + "---|---|---|"]
    for r in h["rows"]:
        span = f"{r['framework']} {r['first']}" + (f" to {r['last']}" if r["last"] != r["first"] else "") \
            if r["first"] else "nowhere"
        L.append(f"| `{Path(r['entry']).stem}` | " + " | ".join(r["statuses"].get(c, "-") for c in cells)
                 + f" | {span} | {r['new_in'] or '-'} | {r['fixed_in'] or '-'} |")
    return L
