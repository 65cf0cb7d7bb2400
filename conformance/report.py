"""`remat-conformance report`: merge campaign output directories into a regression report.

Inputs: one or many run directories (shards of one campaign, cells of a CI matrix), each
with run.json, results.jsonl, findings.json and corpus/; optionally baselines (earlier run
directories, or earlier report directories holding report.json) to say what is new, fixed
and persisting. Outputs, in --out: report.html (self-contained), report.md (short, for CI
job summaries and PR comments), junit.xml (one testcase per pipeline and check) and
report.json (machine-readable; schema in templates/REPORT_SCHEMA.md).

Any problem with an input is a ReportInputError naming the file, the field and the reason.
"""
from __future__ import annotations

import base64
import html
import io
import json
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

COMMAND = "report"
REPORT_SCHEMA_VERSION = 1
# Input schema versions this harness reads (run.json, results.jsonl records, findings.json entries).
READS_SCHEMA = 1
CHECKS = ("gradient", "residuals", "custom_rule", "error", "crash", "timeout")
TEMPLATES = Path(__file__).with_name("templates")
# Version keys that do not make two runs different matrix cells.
_NOT_CELL = {"python", "numpy", "remat-conformance"}


class ReportInputError(ValueError):
    """An input the report cannot use. `file` is the path, `field` the JSON path in it."""

    def __init__(self, file: str, field: str, reason: str):
        super().__init__(f"{file}: {field}: {reason}")
        self.file, self.field, self.reason = file, field, reason


# ---- input schemas ------------------------------------------------------------------------------
class _Opts(BaseModel):
    model_config = ConfigDict(extra="allow")
    pipelines: list[str] = Field(default_factory=list)
    device: str = "cpu"
    expectations: str | None = None
    seed: int | None = None
    budget: float | None = None


class _Run(BaseModel):
    model_config = ConfigDict(extra="allow")
    schema_version: int
    harness: str = "?"
    options: _Opts = Field(default_factory=_Opts)
    versions: dict[str, str] = Field(default_factory=dict)
    started: str | None = None


class _Result(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    schema_version: int = READS_SCHEMA
    verdicts: list[tuple[str, str, str, str, str]] = Field(default_factory=list)
    expectations: dict[str, str] = Field(default_factory=dict)
    t: float = 0.0


def _loc(err) -> str:
    return "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in err["loc"]).lstrip(".") or "<root>"


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except OSError as e:
        raise ReportInputError(str(path), "<file>", e.strerror or str(e)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = f"line {e.lineno} column {e.colno}" if isinstance(e, json.JSONDecodeError) else "<file>"
        raise ReportInputError(str(path), where, f"not valid JSON ({e.msg if hasattr(e, 'msg') else e})") from None
    except RecursionError:
        raise ReportInputError(str(path), "<root>", "nesting too deep") from None


def _check_version(path: Path, where: str, sv) -> None:
    if sv != READS_SCHEMA:
        raise ReportInputError(str(path), where, f"schema_version {sv!r} is not readable by this harness "
                                                 f"(it reads schema_version {READS_SCHEMA}); rebuild the report "
                                                 f"with the harness version that wrote this directory")


@dataclass
class RunData:
    dir: Path
    info: _Run | None
    results: list[_Result] = field(default_factory=list)
    findings: list = field(default_factory=list)          # conformance.findings.Finding
    warnings: list[str] = field(default_factory=list)
    report: dict | None = None   # a previous report.json (baselines only)
    cell: str = ""

    @property
    def label(self) -> str:
        if self.info and self.info.started:
            return f"{self.dir.name} ({self.info.started[:16]})"
        if self.report:
            return f"{self.dir.name} ({str(self.report.get('generated', ''))[:16]})"
        return self.dir.name


def load_run(d: str | Path, allow_report: bool = False) -> RunData:
    """Read and validate one run directory (or, for baselines, a report directory)."""
    from conformance.findings import Finding
    from conformance.ir import ProgramError, load_program
    from conformance.store import StoreError, read_jsonl
    d = Path(d)
    if not d.is_dir():
        raise ReportInputError(str(d), "<dir>", "not a directory")
    runp, resp, findp, repp = d / "run.json", d / "results.jsonl", d / "findings.json", d / "report.json"
    if allow_report and not runp.exists() and repp.exists():
        obj = _read_json(repp)
        if not isinstance(obj, dict):
            raise ReportInputError(str(repp), "<root>", "must be a JSON object")
        if obj.get("schema_version") != REPORT_SCHEMA_VERSION:
            raise ReportInputError(str(repp), "schema_version", f"{obj.get('schema_version')!r} is not readable "
                                                                f"(this harness reads report schema {REPORT_SCHEMA_VERSION})")
        rd = RunData(d, None, report=obj)
        for k, f in enumerate(obj.get("findings") or []):
            try:
                rd.findings.append(Finding.model_validate(f.get("finding") if isinstance(f, dict) else f))
            except (ValidationError, AttributeError) as e:
                raise ReportInputError(str(repp), f"findings[{k}].finding", _why(e)) from None
        return rd
    if not runp.exists():
        raise ReportInputError(str(d), "run.json", "missing: not a campaign output directory "
                                                   "(expected run.json, results.jsonl, findings.json)")
    obj = _read_json(runp)
    if not isinstance(obj, dict):
        raise ReportInputError(str(runp), "<root>", "must be a JSON object")
    _check_version(runp, "schema_version", obj.get("schema_version"))
    try:
        info = _Run.model_validate(obj)
    except ValidationError as e:
        raise ReportInputError(str(runp), _loc(e.errors()[0]), e.errors()[0]["msg"]) from None
    rd = RunData(d, info)
    try:
        records, warn = read_jsonl(resp)
    except StoreError as e:
        msg = str(e)
        where = msg.split(": ")[1] if msg.count(": ") >= 2 else "<file>"
        raise ReportInputError(str(resp), where, "not valid JSON") from None
    except RecursionError:
        raise ReportInputError(str(resp), "<file>", "nesting too deep") from None
    if warn:
        rd.warnings.append(warn)
    for k, r in enumerate(records):
        if not isinstance(r, dict):
            raise ReportInputError(str(resp), f"record {k + 1}", "must be a JSON object")
        if r.get("type") == "result":
            _check_version(resp, f"record {k + 1}.schema_version", r.get("schema_version"))
        try:
            rd.results.append(_Result.model_validate(r))
        except ValidationError as e:
            raise ReportInputError(str(resp), f"record {k + 1}.{_loc(e.errors()[0])}", e.errors()[0]["msg"]) from None
    if findp.exists():
        fl = _read_json(findp)
        if not isinstance(fl, list):
            raise ReportInputError(str(findp), "<root>", "must be a list of findings")
        for k, f in enumerate(fl):
            if isinstance(f, dict):
                _check_version(findp, f"[{k}].schema_version", f.get("schema_version", READS_SCHEMA))
            try:
                fd = Finding.model_validate(f)
            except ValidationError as e:
                raise ReportInputError(str(findp), f"[{k}].{_loc(e.errors()[0])}", e.errors()[0]["msg"]) from None
            try:
                load_program(fd.program)
            except ProgramError as e:
                raise ReportInputError(str(findp), f"[{k}].program.{e.field}", e.reason) from None
            except RecursionError:
                raise ReportInputError(str(findp), f"[{k}].program", "nesting too deep") from None
            rd.findings.append(fd)
    else:
        rd.warnings.append(f"{findp}: missing (no findings recorded)")
    return rd


def _why(e) -> str:
    if isinstance(e, ValidationError):
        err = e.errors()[0]
        return f"{_loc(err)}: {err['msg']}"
    return str(e)


# ---- merging -------------------------------------------------------------------------------------
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


def _saved_bytes(saved: list) -> int:
    """Bytes of a digest's saved list ("v1['a']:float32[3, 4]" items)."""
    total = 0
    for s in saved or []:
        try:
            dt, shp = str(s).rsplit(":", 1)[1].split("[", 1)
            dims = [int(x) for x in shp.rstrip("]").split(",") if x.strip()]
            n = 1
            for x in dims:
                n *= x
            total += n * {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}.get(dt, 4)
        except (ValueError, IndexError):
            continue
    return total


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


def _stale(runs: list[RunData]) -> list[dict]:
    import fnmatch
    from oracles.expectations import Expectations, ExpectationsError
    src = next((r.info.options.expectations for r in runs if r.info and r.info.options.expectations
                and Path(r.info.options.expectations).exists()), None)
    try:
        exp = Expectations.load(src)
    except ExpectationsError as e:
        return [{"id": "<expectations>", "why": f"cannot read: {e}"}]
    pipelines = {p for r in runs if r.info for p in r.info.options.pipelines}
    hits: dict[str, Counter] = defaultdict(Counter)
    for r in runs:
        for rec in r.results:
            if rec.type == "result":
                for eid, how in rec.expectations.items():
                    hits[eid][how] += 1
    out = []
    for e in exp.entries:
        if not any(fnmatch.fnmatchcase(p, g) for p in pipelines for g in e.pipelines):
            continue
        h = hits.get(e.id, Counter())
        if not h:
            out.append({"id": e.id, "kind": e.kind, "why": "never matched a program in these runs"})
        elif not h.get("fired"):
            what = "never raised" if e.raises else "the divergence no longer happens"
            out.append({"id": e.id, "kind": e.kind, "why": f"matched {h['idle']} programs but {what}"})
    return out


def _repros(f) -> dict[str, str]:
    from conformance.findings import decode_inputs
    from conformance.ir import Program
    from conformance import repro
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


def _finding_obj(f, status: str, cells: list[str], with_repro: bool) -> dict:
    from conformance.repro import pseudo_code
    try:
        code = pseudo_code(f.program)
    except Exception as e:  # noqa: BLE001
        code = f"# program cannot be rendered: {e}"
    obs = f.detail.get("observations") if isinstance(f.detail.get("observations"), dict) else {}
    sides = {p: {"error": d.get("error"), "saved": d.get("saved"), "grads": d.get("grads"),
                 "saved_bytes": _saved_bytes(d.get("saved")) if d.get("saved") is not None else None}
             for p, d in obs.items() if isinstance(d, dict)}
    detail = {k: v for k, v in f.detail.items() if k != "observations"}
    return {
        "status": status, "key": list(f.key()), "check": f.check, "pipeline": f.pipeline, "reference": f.reference,
        "error_type": f.error_type, "signature": f.signature, "features": f.features, "count": f.count,
        "program_hash": f.program_hash, "size": f.size, "original_size": f.original_size,
        "expectation": f.expectation, "versions": f.versions, "flags": f.flags, "device": f.device, "cells": cells,
        "pseudo_code": code, "detail": detail, "sides": sides,
        "repro_command": f"remat-conformance repro corpus/{f.program_hash}.json --framework "
                         f"{'torch' if f.pipeline.startswith('torch') else 'jax'}",
        "repro": _repros(f) if with_repro else {},
        "finding": f.model_dump(mode="json"),
    }


def build(inputs: list[RunData], baselines: list[RunData] | None = None, with_repro: bool = True) -> dict:
    """The whole report as one JSON-serialisable object (report.json)."""
    from conformance import __version__
    from oracles.verdict import CHECK_RANK
    baselines = baselines or []
    if not inputs:
        raise ReportInputError("<args>", "RESULTS_DIR", "at least one results directory is needed")
    _cells(inputs)
    warnings = [w for r in inputs for w in r.warnings]
    harnesses = sorted({r.info.harness for r in inputs if r.info})
    if len(harnesses) > 1:
        warnings.append(f"merged runs of different harness versions {harnesses} (same schema "
                        f"version {READS_SCHEMA}: counts are comparable, generators may differ)")
    # grid
    grid: dict[tuple[str, str], Counter] = defaultdict(Counter)
    rows: list[str] = []
    programs = 0
    for r in inputs:
        for p in (r.info.options.pipelines if r.info else []):
            if _row(p, r.cell) not in rows:
                rows.append(_row(p, r.cell))
        for rec in r.results:
            if rec.type != "result":
                continue
            programs += 1
            for check, pipeline, _ref, status, _et in rec.verdicts:
                row = _row(pipeline, r.cell)
                if row not in rows:
                    rows.append(row)
                grid[(row, check)][status] += 1
    # findings: one per signature and cell, smallest program kept; grouped by behaviour key
    merged: dict[tuple, Any] = {}
    cells_of: dict[tuple, list[str]] = defaultdict(list)
    for r in inputs:
        for f in r.findings:
            k = (f.signature, r.cell)
            if k in merged:
                g = merged[k]
                keep = f if (f.size or 1 << 30) < (g.size or 1 << 30) else g
                keep = keep.model_copy(update={"count": g.count + f.count})
                merged[k] = keep
            else:
                merged[k] = f
            if r.cell not in cells_of[k]:
                cells_of[k].append(r.cell)
    base_keys: set[tuple] = set()
    base_findings: dict[tuple, Any] = {}
    for b in baselines:
        for f in b.findings:
            base_keys.add(f.key())
            base_findings.setdefault(f.key(), f)
    cur_keys = {f.key() for f in merged.values()}
    ran = {p for r in inputs if r.info for p in r.info.options.pipelines} | {row for row in rows}
    findings = []
    for (sig, cell), f in merged.items():
        status = "persisting" if f.key() in base_keys else "new"
        findings.append(_finding_obj(f, status, cells_of[(sig, cell)], with_repro))
    findings.sort(key=lambda x: (CHECK_RANK.get(x["check"], 9), x["status"] != "new", -x["count"], x["signature"]))
    for i, x in enumerate(findings, 1):
        x["id"] = f"F{i}"
        x["rank"] = i
    fixed, not_run = [], []
    for k, f in sorted(base_findings.items(), key=lambda kv: (CHECK_RANK.get(kv[0][0], 9), kv[0])):
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
                    "programs": sum(1 for x in r.results if x.type == "result"), "findings": len(r.findings)}
                   for r in inputs],
        "baselines": [{"dir": str(b.dir), "label": b.label, "findings": len(b.findings)} for b in baselines],
        "warnings": warnings,
        "checks": list(CHECKS),
        "pipelines": rows,
        "grid": grid_rows,
        "totals": {"programs": programs, "findings": len(findings),
                   "new": sum(1 for x in findings if x["status"] == "new"),
                   "persisting": sum(1 for x in findings if x["status"] == "persisting"),
                   "fixed": len(fixed), "not_run": len(not_run)},
        "findings": findings,
        "fixed": fixed,
        "not_run": not_run,
        "stale_expectations": _stale(inputs),
        "residual_bytes": residual_bytes,
        "trend": trend,
    }


# ---- plots ----------------------------------------------------------------------------------------
_COLORS = {"fail": "#d73a49", "expected": "#e3b341", "pass": "#2da44e", "unsupported": "#8c959f",
           "skipped": "#d0d7de", "none": "#f6f8fa"}


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def plots(rep: dict) -> dict[str, str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_rgb
    out = {}
    rows, checks = rep["pipelines"], rep["checks"]
    if rows:
        cell = {(g["pipeline"], g["check"]): g for g in rep["grid"]}
        img = [[to_rgb(_COLORS[cell[(r, c)]["status"]]) for c in checks] for r in rows]
        fig, ax = plt.subplots(figsize=(1.3 * len(checks) + 2, 0.38 * len(rows) + 1))
        ax.imshow(img, aspect="auto")
        ax.set_xticks(range(len(checks)), checks, rotation=30, ha="right")
        ax.set_yticks(range(len(rows)), rows)
        for i, r in enumerate(rows):
            for j, c in enumerate(checks):
                n = sum(cell[(r, c)]["counts"].values())
                f = cell[(r, c)]["counts"].get("fail", 0)
                if n:
                    ax.text(j, i, f"{f}/{n}" if f else str(n), ha="center", va="center", fontsize=7)
        ax.set_title("status by pipeline and check (failures/verdicts)")
        out["grid"] = _png(fig)
    if any(x["bytes"] for x in rep["residual_bytes"]):
        pols = sorted({x["policy"] for x in rep["residual_bytes"]})
        pipes = sorted({x["pipeline"] for x in rep["residual_bytes"]})
        fig, ax = plt.subplots(figsize=(max(4, 1.6 * len(pols) + 2), 3))
        w = 0.8 / max(1, len(pipes))
        for k, p in enumerate(pipes):
            vals = [next((x["bytes"] for x in rep["residual_bytes"] if x["policy"] == pol and x["pipeline"] == p), 0)
                    for pol in pols]
            ax.bar([i + k * w for i in range(len(pols))], vals, w, label=p)
        ax.set_xticks([i + w * (len(pipes) - 1) / 2 for i in range(len(pols))], pols, rotation=15)
        ax.set_ylabel("saved residual bytes")
        ax.set_title("saved-residual bytes per policy and pipeline (findings' programs)")
        ax.legend(fontsize=7)
        out["residual_bytes"] = _png(fig)
    if len(rep["trend"]) > 1:
        fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(rep["trend"]) + 2), 3))
        labels = [t["label"] for t in rep["trend"]]
        bottom = [0] * len(labels)
        for c in checks:
            vals = [t["counts"].get(c, 0) for t in rep["trend"]]
            if any(vals):
                ax.bar(range(len(labels)), vals, bottom=bottom, label=c)
                bottom = [a + b for a, b in zip(bottom, vals)]
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=7)
        ax.set_ylabel("findings")
        ax.set_title("findings over time")
        ax.legend(fontsize=7)
        out["trend"] = _png(fig)
    return out


# ---- outputs ---------------------------------------------------------------------------------------
def _env():
    import jinja2
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=jinja2.select_autoescape(["html"]),
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson_pretty"] = lambda o: json.dumps(o, indent=1, sort_keys=True, default=str)
    return env


def render_html(rep: dict, figs: dict[str, str]) -> str:
    grid = {(g["pipeline"], g["check"]): g for g in rep["grid"]}
    return _env().get_template("report.html.j2").render(rep=rep, figs=figs, grid=grid, colors=_COLORS)


_MARK = {"fail": "❌", "expected": "⚠️", "pass": "✅", "unsupported": "➖", "skipped": "·", "none": " "}


def render_md(rep: dict) -> str:
    t = rep["totals"]
    L = ["# remat-conformance report", "",
         f"{t['programs']} programs checked in {len(rep['inputs'])} run(s); **{t['findings']} findings** "
         f"({t['new']} new, {t['persisting']} persisting, {t['fixed']} fixed).", ""]
    vs = sorted({f"{k} {v}" for i in rep["inputs"] for k, v in i["versions"].items() if k != "numpy"})
    L.append("Versions: " + ", ".join(vs))
    for w in rep["warnings"]:
        L.append(f"> warning: {w}")
    L += ["", "| pipeline | " + " | ".join(rep["checks"]) + " |", "|---|" + "---|" * len(rep["checks"])]
    cell = {(g["pipeline"], g["check"]): g for g in rep["grid"]}
    for r in rep["pipelines"]:
        L.append(f"| `{r}` | " + " | ".join(
            _MARK[cell[(r, c)]["status"]] + (" " + ",".join(cell[(r, c)]["findings"]) if cell[(r, c)]["findings"] else "")
            for c in rep["checks"]) + " |")
    for title, items in (("New findings", [x for x in rep["findings"] if x["status"] == "new"]),
                         ("Persisting findings", [x for x in rep["findings"] if x["status"] == "persisting"]),
                         ("Fixed (not seen in this run)", rep["fixed"])):
        L += ["", f"## {title}", ""]
        if not items:
            L.append("None.")
        for x in items:
            L.append(f"- **{x['id']}** [{x['check']}] `{x['pipeline']}` vs `{x['reference']}`"
                     f"{' (' + x['error_type'] + ')' if x['error_type'] else ''}, {x['count']} program(s); "
                     f"features: {', '.join(x['features'])}; flags: `{json.dumps(x['flags'], sort_keys=True)}`; "
                     f"repro: `{x['repro_command']}`")
    L += ["", "## Stale expectations", ""]
    L += [f"- `{s['id']}`: {s['why']}" for s in rep["stale_expectations"]] or ["None."]
    return "\n".join(L) + "\n"


def render_junit(rep: dict) -> str:
    by_id = {x["id"]: x for x in rep["findings"]}
    suite = ET.Element("testsuite", name="remat-conformance")
    n = fails = skips = 0
    for g in rep["grid"]:
        n += 1
        tc = ET.SubElement(suite, "testcase", classname=g["pipeline"], name=g["check"])
        if g["findings"]:
            fails += 1
            xs = [by_id[i] for i in g["findings"]]
            msg = "; ".join(f"{x['id']} vs {x['reference']} {x['error_type']}".strip() for x in xs)
            fl = ET.SubElement(tc, "failure", message=msg, type=g["check"])
            fl.text = "\n\n".join(
                f"{x['id']} [{x['check']}] {x['pipeline']} vs {x['reference']} {x['error_type']} ({x['status']})\n"
                f"features: {', '.join(x['features'])}\nversions: {json.dumps(x['versions'], sort_keys=True)}\n"
                f"flags: {json.dumps(x['flags'], sort_keys=True)}\nrepro: {x['repro_command']}\n\n{x['pseudo_code']}"
                for x in xs)
        elif g["status"] in ("none", "skipped", "unsupported"):
            skips += 1
            ET.SubElement(tc, "skipped", message=f"no verdicts ({g['status']})")
        out = ET.SubElement(tc, "system-out")
        out.text = json.dumps(g["counts"], sort_keys=True)
    suite.set("tests", str(n))
    suite.set("failures", str(fails))
    suite.set("skipped", str(skips))
    suite.set("errors", "0")
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def write(rep: dict, out: str | Path, with_plots: bool = True) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    figs = plots(rep) if with_plots else {}
    files = {"report.json": json.dumps(rep, indent=1, sort_keys=True, default=str),
             "report.md": render_md(rep), "junit.xml": render_junit(rep), "report.html": render_html(rep, figs)}
    from conformance.store import atomic_write
    paths = []
    for name, text in files.items():
        atomic_write(out / name, text)
        paths.append(out / name)
    return paths


# ---- CLI -------------------------------------------------------------------------------------------
def configure_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="merge run directories into HTML/Markdown/JUnit/JSON reports",
                              description="Merge one or many campaign output directories (shards, matrix cells) "
                                          "and compare with baselines.")
    p.add_argument("dirs", nargs="+", metavar="RESULTS_DIR")
    p.add_argument("--baseline", action="append", default=[], metavar="PREVIOUS_DIR",
                   help="an earlier run or report directory (repeat, oldest first, for a trend)")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--no-repro", action="store_true", help="do not embed repro scripts")
    p.add_argument("--strict", action="store_true", help="exit 1 when there are new findings")


def main(args) -> int:
    from conformance.cli import UsageError
    try:
        runs = [load_run(d) for d in args.dirs]
        bases = [load_run(d, allow_report=True) for d in args.baseline]
        rep = build(runs, bases, with_repro=not args.no_repro)
    except ReportInputError as e:
        raise UsageError(str(e)) from None
    try:
        paths = write(rep, args.out)
    except OSError as e:
        raise UsageError(f"--out {args.out}: {e.strerror or e}") from None
    t = rep["totals"]
    print(f"{t['programs']} programs, {t['findings']} findings ({t['new']} new, {t['persisting']} persisting, "
          f"{t['fixed']} fixed); wrote " + ", ".join(str(p) for p in paths))
    for w in rep["warnings"]:
        print(f"warning: {w}")
    return 1 if (args.strict and t["new"]) else 0


__all__ = ["ReportInputError", "load_run", "build", "write", "render_md", "render_junit", "render_html", "plots",
           "html"]
