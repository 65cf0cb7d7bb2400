"""Merge runs and baselines into the report object (report.json): grid, findings, trend."""
from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conformance import __version__, repro
from conformance.engine.describe import (
    CLASS_ORDER,
    behaviour_title,
    class_rank,
    no_issue_reason,
    triage_json,
    triage_of,
    variants_json,
    variants_of,
    variants_text,
    wants_issue,
)
from conformance.engine.findings import decode_inputs
from conformance.engine.loading import corpus_entry_stem
from conformance.engine.roots import merge_variants
from conformance.engine.tally import Tally
from conformance.ir.program import Program
from conformance.ir.verdict import CHECK_RANK, CHECKS
from conformance.pipelines import registry
from conformance.reporting.inputs import READS_SCHEMA, REPORT_SCHEMA_VERSION, ReportInputError, RunData
from conformance.reporting.issue_text import short_repro_or_reason
from oracles.expectations import Expectations, stale

# Version keys that do not make two runs different matrix cells.
_NOT_CELL = {"python", "numpy", "remat-conformance"}


def _cells(runs: list[RunData]) -> None:
    """Label runs that differ in framework versions or device (matrix cells); shards share a label."""
    def sig(r):
        v = {k: x for k, x in (r.info.versions if r.info else {}).items() if k not in _NOT_CELL}
        return (r.info.options.device if r.info else "cpu", tuple(sorted(v.items())))
    sigs = {sig(r) for r in runs}
    if len(sigs) <= 1:
        return
    keys = sorted({k for s in sigs for k, _ in s[1]})
    varying = [k for k in keys if len({dict(s[1]).get(k) for s in sigs}) > 1]
    for r in runs:
        dev, v = sig(r)
        v = dict(v)
        r.cell = " ".join([f"{k} {v.get(k, '-')}" for k in varying] + ([dev] if len({s[0] for s in sigs}) > 1 else []))


def _row(pipeline: str, cell: str) -> str:
    return f"{pipeline} @ {cell}" if cell else pipeline


def _shares(inputs, rows: list[str], ran_on, programs: int) -> list[dict]:
    """The pipelines that ran on a declared share of the programs (registry.Share), each once."""
    out: dict[str, dict] = {}
    for r in inputs:
        if not r.info:
            continue
        names = [p for p in r.info.options.pipelines if p in registry.known_names()]
        for p, sh in registry.shared_pipelines(names).items():
            row = _row(p, r.cell)
            if row in rows and row not in out:
                out[row] = {"pipeline": row, "share": r.info.options.shares.get(p, sh.fraction), "sibling": sh.sibling,
                            "why": sh.why, "dtypes": sorted(sh.dtypes) if sh.dtypes else None,
                            "ran": ran_on[row], "programs": programs}
    return list(out.values())


def _status(counts: Counter, has_finding: bool) -> str:
    if has_finding or counts.get("fail"):
        return "fail"
    if counts.get("expected"):
        return "expected"
    if counts.get("pass"):
        return "pass"
    if counts.get("unsupported"):
        return "unsupported"
    return "skipped" if counts else "none"


def tally_of(results, row=lambda p: p) -> Tally:
    """The results of one run counted (`row` names a pipeline's row: its matrix cell)."""
    t = Tally()
    for rec in results:
        if rec.type == "result":
            t.add(rec, row)
    return t


def _packaged():
    return Expectations.load()


def _repros(f) -> dict[str, str]:
    out = {}
    try:
        prog = Program.model_validate(f.program)
        inputs = decode_inputs(f.inputs) if f.inputs else None
    except Exception as e:  # noqa: BLE001 - a report still renders without a repro
        return {"error": f"repro unavailable: {type(e).__name__}: {e}"}
    for fw in repro.frameworks_for(f):
        try:
            out[fw] = repro.generate(prog, inputs, f, fw, filename=f"repro_{f.program_hash}_{fw}.py")
        except Exception as e:  # noqa: BLE001
            out[fw] = f"# repro unavailable for {fw}: {type(e).__name__}: {e}\n"
    return out


def _short(f) -> dict:
    """The short repro (conformance.repro.short) of the finding's own framework, or why there is
    none (the full scripts in `repro` then stand in for it)."""
    try:
        src, why = short_repro_or_reason(Program.model_validate(f.program),
                                         decode_inputs(f.inputs) if f.inputs else None, f)
    except Exception as e:  # noqa: BLE001 - a report still renders without a repro
        src, why = None, f"{type(e).__name__}: {e}"
    return {"short_repro": src, "short_repro_why": why or None,
            "short_repro_framework": registry.framework_of(f.pipeline)}


def _finding_obj(f, status: str, cells: list[str], with_repro: bool) -> dict:
    try:
        code = repro.pseudo_code(f.program)
    except Exception as e:  # noqa: BLE001
        code = f"# program cannot be rendered: {e}"
    obs = f.detail.get("observations") if isinstance(f.detail.get("observations"), dict) else {}
    sides = {p: {"error": d.get("error"), "saved": d.get("saved"), "grads": d.get("grads"),
                 "saved_bytes": d.get("saved_bytes")}
             for p, d in obs.items() if isinstance(d, dict)}
    detail = {k: v for k, v in f.detail.items() if k != "observations"}
    t = triage_of(f)
    stem = corpus_entry_stem(f.check, f.pipeline, f.program_hash)
    return {
        "title": behaviour_title(f),
        "class": t.class_,
        "triage": triage_json(t),
        "class_rank": class_rank(f),
        "variants": variants_json(variants_of(f)),
        "variants_text": variants_text(variants_of(f)),
        "first_seen": f.first_seen,
        "root": f.root,
        "status": status,
        "key": list(f.key()),
        "check": f.check,
        "pipeline": f.pipeline,
        "reference": f.reference,
        "error_type": f.error_type,
        "signature": f.signature,
        "features": f.features,
        "count": f.count,
        "program_hash": f.program_hash,
        "size": f.size,
        "original_size": f.original_size,
        "expectation": f.expectation,
        "tracked": f.tracked,
        "releases": f.releases.model_dump() if f.releases else None,
        "releases_text": f.releases.sentence() if f.releases else None,
        "versions": f.versions,
        "flags": f.flags,
        "device": f.device,
        "cells": cells,
        "pseudo_code": code,
        "detail": detail,
        "sides": sides,
        "repro_command": f"remat-conformance repro corpus/{stem}.json --framework {repro.frameworks_for(f)[0]}",
        "repro": _repros(f) if with_repro else {},
        **(
            _short(f)
            if with_repro
            else {"short_repro": None, "short_repro_why": "not embedded (--no-repro)", "short_repro_framework": None}
        ),
        # an issue text is written for a bug or a question; a documented behaviour or a harness limit says why not
        "issue": f"corpus/{stem}.issue.md" if wants_issue(f) else None,
        "no_issue": None if wants_issue(f) else no_issue_reason(f).strip(),
        "finding": f.model_dump(mode="json"),
    }


@dataclass
class Merged:
    """One finding as every output shows it: its findings of one matrix cell (one per signature; a
    tracked root's variants as one) merged, the smallest program kept, their programs counted
    (`count`), their variants added and the earliest first-seen time kept."""
    finding: Any          # conformance.engine.findings.Finding (a copy where several were merged)
    cells: list[str]      # the matrix cells it was seen in
    dir: Path             # the run directory of the kept finding (its corpus/ holds its issue text)


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def merge_findings(inputs: list[RunData]) -> list[Merged]:
    """The findings of runs `inputs` (their cells labelled) as summary.md, the report and each
    issue.md (conformance.reporting.refresh) count them: the one place a finding's programs,
    variants and first-seen time are added up. A known behaviour (`run --known`) a run never saw
    is left out."""
    merged: dict[tuple, Merged] = {}
    for r in inputs:
        for f in r.findings:
            if f.tracked is not None and not f.count:
                continue   # a known behaviour (`run --known`) this run never saw
            # a tracked root and a new finding stay apart; a tracked root is one entry whichever variants were seen
            k = (f.tracked, r.cell) if f.tracked is not None else (f.signature, r.cell, None)
            m = merged.get(k)
            if m is None:
                merged[k] = Merged(f, [r.cell], r.dir)
                continue
            g = m.finding
            keep = f if (f.size or 1 << 30) < (g.size or 1 << 30) else g
            if keep is f:
                m.dir = r.dir
            other = g if keep is f else f
            keep = keep.model_copy(deep=True)   # the variants of both are counted in the copy
            keep.variants = variants_of(keep)
            merge_variants(keep, other.model_copy(update={"variants": variants_of(other)}))
            keep.count = g.count + f.count
            keep.first_seen = _earliest(g.first_seen, f.first_seen)
            m.finding = keep
            if r.cell not in m.cells:
                m.cells.append(r.cell)
    return list(merged.values())


def build(inputs: list[RunData], baselines: list[RunData] | None = None, with_repro: bool = True,
          expectations=None) -> dict:
    """The whole report as one JSON-serialisable object (report.json). `expectations`: what stale
    entries are judged against (default: the packaged file)."""
    baselines = baselines or []
    if not inputs:
        raise ReportInputError("<args>", "RESULTS_DIR", "at least one results directory is needed")
    seen_dirs = [r.dir.resolve() for r in inputs]
    dup = sorted({str(x) for x in seen_dirs if seen_dirs.count(x) > 1})
    if dup:
        raise ReportInputError(dup[0], "<dir>", "given more than once (its programs would be counted twice)")
    _cells(inputs)
    warnings = [w for r in inputs for w in r.warnings]
    harnesses = sorted({r.info.harness for r in inputs if r.info})
    if len(harnesses) > 1:
        warnings.append(f"merged runs of different harness versions {harnesses} (same schema "
                        f"version {READS_SCHEMA}: counts are comparable, generators may differ)")
    # the one aggregation of the results (conformance.engine.tally), rows named by matrix cell
    tally = Tally()
    rows: list[str] = []
    counted = [r.tally if r.tally is not None else tally_of(r.results, lambda p, c=r.cell: _row(p, c))
               for r in inputs]
    for r, t in zip(inputs, counted):
        for p in (r.info.options.pipelines if r.info else []):
            if _row(p, r.cell) not in rows:
                rows.append(_row(p, r.cell))
        tally.merge(t)
    rows += [row for row in tally.pipelines if row not in rows]
    grid, ran_on, check_ran, coverage = tally.grid, tally.ran, tally.check_ran, tally.coverage
    programs = tally.programs
    # findings: one per signature and cell, smallest program kept; grouped by behaviour key
    merged = merge_findings(inputs)
    base_keys: set[tuple] = set()
    base_findings: dict[tuple, Any] = {}
    for b in baselines:
        for f in b.findings:
            if f.tracked is not None and not f.count:
                continue
            base_keys.add(f.key())
            base_findings.setdefault(f.key(), f)
    cur_keys = {m.finding.key() for m in merged}
    ran = {p for r in inputs if r.info for p in r.info.options.pipelines} | {row for row in rows}
    findings = []
    for m in merged:
        f = m.finding
        status = "persisting" if (f.key() in base_keys or f.tracked is not None) else "new"
        findings.append({**_finding_obj(f, status, m.cells, with_repro), "run_dir": str(m.dir)})
    # new roots before tracked ones (`run --known`); bugs first (then questions, documented
    # behaviours, harness limits); within a class by check
    # (a tracked root bisected to a regression before a long-standing one)
    findings.sort(key=lambda x: (x["tracked"] is not None, not (x["releases"] or {}).get("last_good"), x["class_rank"],
                                 CHECK_RANK.get(x["check"], 9),
                                 x["status"] != "new", -x["count"], x["signature"]))
    for i, x in enumerate(findings, 1):
        x["id"] = f"F{i}"
        x["rank"] = i
    fixed, not_run = [], []
    for k, f in sorted(base_findings.items(), key=lambda kv: (class_rank(kv[1]), CHECK_RANK.get(kv[0][0], 9), kv[0])):
        if k in cur_keys:
            continue
        (fixed if f.pipeline in ran else not_run).append(_finding_obj(f, "fixed" if f.pipeline in ran else "not_run",
                                                                       [], False))
    for i, x in enumerate(fixed + not_run, 1):
        x["id"] = f"X{i}"
    grid_rows = []
    finding_cells: dict[tuple[str, str], list[str]] = defaultdict(list)
    for x in findings:
        for c in x["cells"] or [""]:
            finding_cells[(_row(x["pipeline"], c), x["check"])].append(x["id"])
    for row in rows:
        for check in CHECKS:
            cnt = grid.get((row, check), Counter())
            ids = finding_cells.get((row, check), [])
            grid_rows.append({"pipeline": row, "check": check, "counts": dict(sorted(cnt.items())),
                              "status": _status(cnt, bool(ids)), "findings": ids})
    checks_ran = [{"pipeline": row, "check": check, "programs": ran_on[row], "ran": check_ran[(row, check)]}
                  for row in rows for check in CHECKS if (row, check) in grid]
    coverage_rows = [{"feature": ft, "programs": n, "seconds": round(tally.feature_seconds[ft], 1),
                      "cells": {row: coverage.get((ft, row), [0, 0]) for row in rows if ran_on[row]}}
                     for ft, n in sorted(tally.features.items())]
    shares = _shares(inputs, rows, ran_on, programs)
    # behaviours: each finding is one root behaviour; where its shrunk program fails the same way
    behaviours = [
        {
            "id": x["id"],
            "title": x["title"],
            "class": x["class"],
            "check": x["check"],
            "error_type": x["error_type"],
            "reference": x["reference"],
            "pipelines": list(dict.fromkeys([x["pipeline"]] + [k[1] for k in x["finding"].get("reproduces", [])])),
        }
        for x in findings
    ]
    # saved-residual bytes per policy and pipeline (from the findings' observations)
    rb: dict[tuple[str, str], list[int]] = defaultdict(list)
    for x in findings + fixed:
        pol = "+".join(sorted(ft.split(":", 1)[1] for ft in x["features"] if ft.startswith("policy:"))) or "no policy"
        for p, s in x["sides"].items():
            if s.get("saved_bytes") is not None:
                rb[(pol, p)].append(s["saved_bytes"])
    residual_bytes = [{"policy": pol, "pipeline": p, "bytes": max(v), "findings": len(v)}
                      for (pol, p), v in sorted(rb.items())]
    # trend over baselines then this run
    trend = []
    for b in baselines + [None]:
        fs = b.findings if b is not None else [type("F", (), {"check": x["check"]}) for x in findings]
        trend.append({"label": b.label if b is not None else "this run",
                      "counts": {c: sum(1 for f in fs if f.check == c) for c in CHECKS}})
    return {
        "schema_version": REPORT_SCHEMA_VERSION,
        "generated": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "harness": __version__,
        "inputs": [{"dir": str(r.dir), "harness": r.info.harness if r.info else None, "schema_version": READS_SCHEMA,
                    "started": r.info.started if r.info else None, "versions": r.info.versions if r.info else {},
                    "device": r.info.options.device if r.info else None,
                    "pipelines": r.info.options.pipelines if r.info else [], "cell": r.cell,
                    # the pipelines these releases cannot run, and why (run.json; an older run has none)
                    "skipped_pipelines": dict(getattr(r.info, "skipped_pipelines", None) or {}) if r.info else {},
                    "programs": t.programs, "findings": len(r.findings)}
                   for r, t in zip(inputs, counted)],
        "baselines": [{"dir": str(b.dir), "label": b.label, "findings": len(b.findings)} for b in baselines],
        "warnings": warnings,
        "checks": list(CHECKS),
        "pipelines": rows,
        "grid": grid_rows,
        "totals": {"programs": programs, "findings": len(findings),
                   "by_class": {c: sum(1 for x in findings if x["class"] == c) for c in CLASS_ORDER},
                   "new": sum(1 for x in findings if x["status"] == "new"),
                   "persisting": sum(1 for x in findings if x["status"] == "persisting"),
                   "fixed": len(fixed), "not_run": len(not_run)},
        "findings": findings,
        "fixed": fixed,
        "not_run": not_run,
        "stale_expectations": stale(expectations or _packaged(),
                                    {p for r in inputs if r.info for p in r.info.options.pipelines},
                                    tally.expectation_hits),
        "residual_bytes": residual_bytes,
        "checks_ran": checks_ran,
        "ran_on": {row: ran_on[row] for row in rows},
        "seconds": {row: round(tally.seconds[row], 1) for row in rows if tally.seconds[row]},
        "coverage": coverage_rows,
        "shares": shares,
        "behaviours": behaviours,
        "trend": trend,
        "versions": None,   # the report command adds the matrix's version history (--recheck)
    }
