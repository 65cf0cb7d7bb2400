"""Report outputs: plots, report.html (self-contained), report.md, junit.xml, report.json."""
from __future__ import annotations

import base64
import io
import json
import math
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import conformance
from conformance.engine.describe import CLASS_HEADINGS, CLASS_ORDER
from conformance.engine.store import atomic_write
from conformance.ir.verdict import CHECK
from conformance.pipelines import registry
from conformance.reporting.versions import markdown as versions_markdown

TEMPLATES = Path(conformance.__file__).with_name("templates")


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
    matplotlib.rcParams["text.parse_math"] = False   # pipeline names are text, never mathtext
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
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson_pretty"] = lambda o: json.dumps(o, indent=1, sort_keys=True, default=str)
    return env


def render_html(rep: dict, figs: dict[str, str]) -> str:
    grid = {(g["pipeline"], g["check"]): g for g in rep["grid"]}
    # every class a finding has, in CLASS_ORDER (a report of a newer harness may name another)
    have = {x.get("class") for x in rep["findings"]}
    classes = [(c, CLASS_HEADINGS.get(c, str(c)))
               for c in list(CLASS_ORDER) + sorted(str(c) for c in have - set(CLASS_ORDER))]
    return _env().get_template("report.html.j2").render(rep=rep, figs=figs, grid=grid, colors=_COLORS, classes=classes)


_MARK = {"fail": "❌", "expected": "⚠️", "pass": "✅", "unsupported": "➖", "skipped": "·", "none": " "}


def _md(s) -> str:
    """A string shown inside one Markdown line: no line breaks."""
    return " ".join(str(s).split())


def _by_class(items: list[dict]) -> list[tuple[str, list[dict]]]:
    """[(class, finding objects)] bugs first; an object of an older report without a class reads "bug"."""
    groups: dict[str, list[dict]] = {}
    for x in items:
        groups.setdefault(x.get("class") or "bug", []).append(x)
    return [(c, groups[c]) for c in list(CLASS_ORDER) + sorted(set(groups) - set(CLASS_ORDER)) if c in groups]


def _triage_md(x: dict) -> str:
    t = x.get("triage") or {}
    reason = str(t.get("reason", "")).removeprefix("suggested: ")
    label = f"{t.get('class', '?')}" + ("" if t.get("confirmed") else " (suggested)")
    links = f" (see {', '.join(t['links'])})" if t.get("links") else ""
    return _md(f"{label}: {reason}{links}")


def _md_finding(x: dict) -> str:
    first = f"; first seen {float(x['first_seen']):.0f} s into the campaign" if x.get("first_seen") is not None else ""
    shrunk = (f"; shrunk to {x['size']} statement(s) from {x['original_size']}"
              if x.get("size") is not None and x.get("original_size") is not None else "")
    issue = (f"; issue text: [{x['issue']}]({x['issue_href']})" if x.get("issue_href")
             else f"; {_md(x['no_issue'])}" if x.get("no_issue") else "")
    return (f"- **{x['id']}** {x['status']}: **{_md(x.get('title', ''))}**"
            + (f" (tracked as `{x['tracked']}`)" if x.get("tracked") else "") + "\n"
            f"  - class: {_triage_md(x)}\n"
            + (f"  - releases: {_md(x['releases_text'])}\n" if x.get("releases_text") else "")
            + f"  - variants: {_md(x.get('variants_text', ''))}\n"
            f"  - [{x['check']}] `{x['pipeline']}` vs `{x['reference']}`"
            f"{' (' + x['error_type'] + ')' if x['error_type'] else ''}, {x['count']} program(s){first}{shrunk}; "
            f"features: {', '.join(x['features'])}; flags: `{json.dumps(x['flags'], sort_keys=True)}`; "
            f"repro: `{x['repro_command']}`{issue}")


def _cell(x) -> str:
    """A string shown in a Markdown table cell: one line, no cell separators."""
    return _md(x).replace("|", "\\|")


def _table(head: list[str], rows: list[list]) -> list[str]:
    return (["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
            + ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows])


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}%" if b else "-"


def _campaign_md(c: dict) -> list[str]:
    """summary.md's head: what only the campaign knows of itself (Campaign.facts)."""
    shard = c.get("shard") or [0, 1]
    L = [f"- harness {c['harness']}; seed {c['seed']}; device {c['device']}; budget {c['budget']:.0f}s; "
         f"elapsed {c['elapsed']:.0f}s; jobs {c['jobs']}" + (f"; shard {shard[0]}/{shard[1]}" if shard[1] > 1 else "")
         + ("; **interrupted** (resumable with --resume)" if c["interrupted"] else ""),
         f"- programs checked: **{c['programs']}** ({c['rate']:.2f}/s); shrink runs: {c['shrink_runs']}; "
         f"distinct findings: **{c['new_findings']}**"
         + (f"; tracked behaviours seen: {c['tracked_seen']}" if c["tracked_seen"] else "")]
    d = c.get("shrunk_sizes") or {}
    if d:
        L.append(f"- shrunk sizes (statements) over {d['shrinks']} shrinks: median {d['median']:g}, "
                 f"90th percentile {d['p90']:g}, max {d['max']} (originals: median {d['median_original']:g})")
    if c.get("harness_errors"):
        L.append(f"- harness errors: {c['harness_errors']} (bugs of this tool: see results.jsonl)")
    return L


def render_md(rep: dict) -> str:
    """report.md, and a campaign's summary.md (the report of its one run with `rep["campaign"]`)."""
    t, camp = rep["totals"], rep.get("campaign")
    L = ["# remat-conformance " + ("campaign summary" if camp else "report"), ""]
    if camp:
        L += _campaign_md(camp)
    L.append(f"- {t['programs']} programs checked in {len(rep['inputs'])} run(s); **{t['findings']} findings** "
             f"({t['new']} new, {t['persisting']} persisting, {t['fixed']} fixed)")
    vs = sorted({f"{k} {v}" for i in rep["inputs"] for k, v in i["versions"].items() if k != "numpy"})
    L.append("- versions: " + (", ".join(vs) or "-"))
    L.append("- pipelines: " + ", ".join(rep["pipelines"]))
    skipped = {k: v for i in rep["inputs"] for k, v in (i.get("skipped_pipelines") or {}).items()}
    if skipped:
        L.append(f"- skipped ({len(skipped)}: these releases cannot run them): "
                 + "; ".join(f"`{k}`: {v}" for k, v in skipped.items()))
    L += [f"> warning: {w}" for w in rep["warnings"]]
    new = [x for x in rep["findings"] if not x.get("tracked")]
    tracked = [x for x in rep["findings"] if x.get("tracked")]
    L += ["", "## Findings by class (bugs first)", ""]
    if not new:
        L.append("None.")
    for cls, items in _by_class(new):
        n_new = sum(1 for x in items if x["status"] == "new")
        split = f": {n_new} new, {len(items) - n_new} persisting" if n_new < len(items) else ""
        L += [f"### {CLASS_HEADINGS.get(cls, cls)} ({len(items)}{split})", ""]
        L += [_md_finding(x) for x in items]
        L.append("")
    if L[-1] == "":
        L.pop()
    if new:
        L += ["", "## Findings", ""]
        L += _table(["id", "class", "check", "pipeline", "reference", "error type", "programs", "shrunk size",
                     "features"],
                    [[x["id"], x["class"] + ("" if (x.get("triage") or {}).get("confirmed") else " (suggested)"),
                      x["check"], f"`{x['pipeline']}`", f"`{x['reference']}`", x["error_type"] or "-", x["count"],
                      f"{x['size']} (from {x['original_size']})", ", ".join(x["features"])] for x in new])
        ids = {x["id"] for x in new}
        shown = [p for p in rep["pipelines"] if not registry.is_reference(p.split(" @ ")[0])]
        L += ["", "## Behaviours by pipeline (x: the finding's shrunk program fails there the same way)", ""]
        L += _table(["id", "behaviour"] + [f"`{p}`" for p in shown],
                    [[b["id"], f"{b['check']} {b['error_type'] or ''} vs `{b['reference']}`"]
                     + ["x" if p in b["pipelines"] else "" for p in shown]
                     for b in rep.get("behaviours", []) if b["id"] in ids])
    if tracked:
        L += ["", "## Tracked behaviours seen (`--known`: not new)", ""]
        for cls, items in _by_class(tracked):
            L += [f"### {CLASS_HEADINGS.get(cls, cls)} ({len(items)})", ""]
            L += [_md_finding(x) for x in items]
            L.append("")
        L.pop()
    L += ["", "## Fixed (not seen in this run)", ""]
    if not rep["fixed"]:
        L.append("None.")
    L += [_md_finding(x) for x in rep["fixed"]]
    with_findings = {g["check"] for g in rep["grid"] if g["findings"]}
    checks = [c for c in rep["checks"] if CHECK[c].grid or c in with_findings]
    cell = {(g["pipeline"], g["check"]): g for g in rep["grid"]}
    ran_on = rep.get("ran_on", {})
    L += ["", "## Status by pipeline and check (verdict counts; finding ids)", ""]
    secs = rep.get("seconds", {})
    L += _table(["pipeline", "programs run", "seconds"] + checks,
                [[f"`{r}`", ran_on.get(r, "-"), secs.get(r, "-")]
                 + [" ".join([_MARK[cell[(r, c)]["status"]]] + [",".join(cell[(r, c)]["findings"])]
                             + [f"{k}:{v}" for k, v in cell[(r, c)]["counts"].items()]).strip()
                    for c in checks] for r in rep["pipelines"]])
    ran = {(x["pipeline"], x["check"]): x for x in rep.get("checks_ran", [])}
    L += ["", "## Checks that ran (share of the programs a pipeline ran on where the check had its inputs)", ""]
    L += _table(["pipeline"] + checks,
                [[f"`{r}`"] + [_pct(ran[(r, c)]["ran"], ran[(r, c)]["programs"]) if (r, c) in ran else "-"
                               for c in checks] for r in rep["pipelines"]])
    shown = [r for r in rep["pipelines"] if ran_on.get(r)]
    L += ["", "## Feature coverage: programs checked / programs with a failed verdict, per pipeline", ""]
    if rep.get("shares"):
        L += ["Pipelines on a share of the programs (their verdicts follow from a cheaper sibling's; "
              "`--share NAME=1` runs one on every program):", ""]
        L += [f"- `{x['pipeline']}`: {x['share']:.0%} of the programs"
              + (f" whose values are all {'/'.join(x['dtypes'])}" if x["dtypes"] else "")
              + f", ran on {x['ran']} of {x['programs']}; sibling `{x['sibling']}`: {x['why']}" for x in rep["shares"]]
        L += [""]
    L += _table(["feature", "programs", "seconds"] + [f"`{p}`" for p in shown],
                [[c["feature"], c["programs"], c.get("seconds", "-")]
                 + [f"{c['cells'][p][0]}/{c['cells'][p][1]}" if c["cells"].get(p, [0])[0] else "**0**" for p in shown]
                 for c in rep.get("coverage", [])])
    L += versions_markdown(rep.get("versions"))
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
            xs.sort(key=lambda x: (x.get("class_rank", 0), x["id"]))   # bugs first
            msg = "; ".join(f"{x['id']} ({x.get('class', 'bug')}) vs {x['reference']} {x['error_type']}".strip()
                            for x in xs)
            fl = ET.SubElement(tc, "failure", message=msg, type=g["check"])
            fl.text = "\n\n".join(
                f"{x['id']} {_md(x.get('title', ''))}\nclass: {_triage_md(x)}\n"
                f"variants: {_md(x.get('variants_text', ''))}\n"
                f"[{x['check']}] {x['pipeline']} vs {x['reference']} {x['error_type']} ({x['status']})\n"
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


def _finite(o):
    """JSON has no NaN or infinity: such numbers are written as strings ("nan", "inf")."""
    if isinstance(o, float) and not math.isfinite(o):
        return str(o)
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    return o


def link_issues(rep: dict, out: Path) -> None:
    """Each finding's issue text (beside its corpus entry), linked from directory `out`, where the
    Markdown that names it is written; None where there is none."""
    for x in rep["findings"]:
        p = Path(x["run_dir"]) / x["issue"] if x.get("run_dir") and x.get("issue") else None
        x["issue_href"] = os.path.relpath(p, out) if p is not None and p.exists() else None


def write(rep: dict, out: str | Path, with_plots: bool = True) -> list[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    link_issues(rep, out)
    figs = plots(rep) if with_plots else {}
    files = {"report.json": json.dumps(_finite(rep), indent=1, sort_keys=True, default=str, allow_nan=False),
             "report.md": render_md(rep), "junit.xml": render_junit(rep), "report.html": render_html(rep, figs)}
    paths = []
    for name, text in files.items():
        atomic_write(out / name, text)
        paths.append(out / name)
    return paths
