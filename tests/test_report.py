"""`remat-conformance report`: merging, baselines, outputs, and the documented input error."""
from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.cli.main import main as cli_main
from conformance.reporting import render
from conformance.reporting.build import build
from conformance.reporting.inputs import REPORT_SCHEMA_VERSION, ReportInputError, load_run
from tests import mutants  # noqa: F401  (registers the mutant pipelines a campaign here names, whatever ran first)

FIX = Path(__file__).parent / "fixtures"


def test_report_against_baseline(tmp_path):
    rep = build([load_run(FIX / "run_a")], [load_run(FIX / "base")], with_repro=False)
    assert rep["schema_version"] == REPORT_SCHEMA_VERSION
    st_ = {(x["check"], x["pipeline"]): x["status"] for x in rep["findings"]}
    assert st_ == {("error", "ref:f64"): "new", ("error", "jax:remat3"): "persisting"}
    assert [(x["check"], x["pipeline"]) for x in rep["fixed"]] == [("residuals", "jax:remat3")]
    # ranked by class (both are suggested questions here), CHECK_RANK, then new before persisting
    assert [x["id"] for x in rep["findings"]] == ["F1", "F2"] and rep["findings"][0]["status"] == "new"
    cell = {(g["pipeline"], g["check"]): g for g in rep["grid"]}
    assert cell[("jax:remat3", "error")]["status"] == "fail" and cell[("jax:remat3", "gradient")]["status"] == "pass"
    assert set(rep["checks"]) == {"gradient", "residuals", "custom_rule", "residual_report", "trace_count",
                                  "effect_count", "error", "crash", "timeout"}
    assert len(rep["trend"]) == 2 and rep["trend"][-1]["label"] == "this run"
    paths = render.write(rep, tmp_path / "out")
    assert sorted(p.name for p in paths) == ["junit.xml", "report.html", "report.json", "report.md"]
    json.loads((tmp_path / "out" / "report.json").read_text())
    suite = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    assert int(suite.get("failures")) == 2 and len(suite.findall("testcase")) == len(rep["grid"])
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Findings by class (bugs first)" in md and "### Questions for upstream (2: 1 new, 1 persisting)" in md
    assert "## Fixed (not seen in this run)" in md and "| `jax:remat3` |" in md
    html = (tmp_path / "out" / "report.html").read_text()
    assert 'id="grid"' in html and "data:image/png;base64," in html
    for bad in ('src="http', "href=\"http", "<link", "@import", "src=\"//"):
        assert bad not in html, bad


def test_report_embeds_repro_scripts_for_both_frameworks():
    rep = build([load_run(FIX / "run_a")], with_repro=True)
    f = next(x for x in rep["findings"] if x["pipeline"] == "jax:remat3")
    assert set(f["repro"]) == {"jax", "torch"}
    assert (
        "jax.checkpoint(fn, **kw)" in f["repro"]["jax"]
        and "create_selective_checkpoint_contexts" in f["repro"]["torch"]
    )
    assert "with checkpoint(policy=nothing_saveable)" in f["pseudo_code"]
    html = render.render_html(rep, {})
    assert "Standalone repro script (torch)" in html


def test_matrix_cells_are_labelled():
    rep = build([load_run(FIX / "run_a"), load_run(FIX / "run_b")], with_repro=False)
    assert {i["cell"] for i in rep["inputs"]} == {"jax 0.12.0.1 jaxlib 0.12.0.1", "jax 0.11.0 jaxlib 0.11.0"}
    assert any(r.endswith("@ jax 0.11.0 jaxlib 0.11.0") for r in rep["pipelines"])
    assert rep["totals"]["findings"] == 3   # the same bug in two cells is kept per cell


def test_shards_merge_and_torn_line(tmp_path):
    a, b = tmp_path / "s0", tmp_path / "s1"
    shutil.copytree(FIX / "run_a", a)
    shutil.copytree(FIX / "run_a", b)
    with open(b / "results.jsonl", "a") as f:
        f.write('{"type": "res')          # a torn last line (killed mid-write)
    rep = build([load_run(a), load_run(b)], with_repro=False)
    assert rep["totals"]["findings"] == 2                       # same signatures: merged
    assert all(x["count"] >= 2 for x in rep["findings"])
    assert any("torn last line" in w for w in rep["warnings"])
    assert all("@" not in r for r in rep["pipelines"])          # shards are one cell


def test_schema_mismatch_is_a_documented_error(tmp_path, capsys):
    d = tmp_path / "v2"
    shutil.copytree(FIX / "run_a", d)
    run = json.loads((d / "run.json").read_text())
    run["schema_version"] = 2
    (d / "run.json").write_text(json.dumps(run))
    with pytest.raises(ReportInputError) as e:
        load_run(d)
    assert e.value.file.endswith("run.json") and e.value.field == "schema_version"
    assert cli_main(["report", str(FIX / "run_a"), str(d), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "run.json: schema_version:" in err and "Traceback" not in err
    assert cli_main(["report", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2


def test_baseline_can_be_a_previous_report(tmp_path):
    rep = build([load_run(FIX / "run_a")], with_repro=False)
    render.write(rep, tmp_path / "prev", with_plots=False)
    rep2 = build([load_run(FIX / "run_a")], [load_run(tmp_path / "prev", allow_report=True)], with_repro=False)
    assert {x["status"] for x in rep2["findings"]} == {"persisting"} and rep2["fixed"] == []


def test_cli_report(tmp_path, capsys):
    rc = cli_main(["report", str(FIX / "run_a"), "--baseline", str(FIX / "base"), "--out", str(tmp_path / "r"),
                   "--no-repro"])
    assert rc == 0 and (tmp_path / "r" / "report.html").exists()
    assert "1 new, 1 persisting, 1 fixed" in capsys.readouterr().out


# ---- fuzz: mutated inputs are accepted or raise ReportInputError, nothing else -----------------------
_json = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=False) | st.text(max_size=4),
                     lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3),
                     max_leaves=8)
_FILES = ("run.json", "findings.json", "results.jsonl")


def _paths(obj, prefix=()):
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            yield from _paths(v, prefix + (i,))


def _set(obj, path, value):
    if not path:
        return value
    cur = obj
    for p in path[:-1]:
        cur = cur[p]
    cur[path[-1]] = value
    return obj


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_fuzz_merger_accepts_or_raises_documented_error(tmp_path_factory, data):
    d = tmp_path_factory.mktemp("fz")
    shutil.copytree(FIX / "run_a", d / "r")
    name = data.draw(st.sampled_from(_FILES), label="file")
    p = d / "r" / name
    if name == "results.jsonl":
        lines = p.read_text().splitlines()
        k = data.draw(st.integers(0, len(lines) - 1), label="line")
        obj = json.loads(lines[k])
    else:
        obj = json.loads(p.read_text())
    how = data.draw(st.sampled_from(["replace", "delete", "garbage"]), label="how")
    if how == "garbage":
        text = data.draw(st.binary(max_size=30), label="bytes")
        p.write_bytes(text)
    else:
        paths = list(_paths(obj))
        path = data.draw(st.sampled_from(paths), label="path")
        if how == "delete" and path and isinstance(obj, (dict, list)):
            parent = obj
            for q in path[:-1]:
                parent = parent[q]
            del parent[path[-1]]
        else:
            obj = _set(obj, path, data.draw(_json, label="value"))
        text = json.dumps(obj)
        if name == "results.jsonl":
            lines[k] = text
            text = "\n".join(lines) + "\n"
        p.write_text(text)
    try:
        runs = [load_run(d / "r")]
        rep = build(runs, with_repro=False)
        render.render_md(rep)
        render.render_junit(rep)
        render.render_html(rep, {})
    except ReportInputError as e:
        assert e.file and e.field and e.reason


def test_stale_expectations_reach_the_summary_the_report_and_its_page(tmp_path):
    """A campaign judged with two test entries that cannot fire (one names a jax version that
    does not exist, one a divergence that never happens): both are stale, with their reason,
    in the campaign, its summary.md, report.json and report.html; the packaged entries that
    fired on these programs are not."""
    import json as _json

    from conformance.engine.campaign import Campaign
    from conformance.engine.options import Options
    from conformance.engine.runner import InProcessExecutor
    from conformance.engine.store import Store
    from conformance.reporting.summary import summary_markdown
    from generators.programs import Config
    from oracles.expectations import Entry, Expectations
    never = {"id": "test-never-matches", "pipelines": ["jax:remat3"], "versions": {"jax": "<0.0.1"},
             "diverges": {"check": "gradient", "reason": "test"}, "verified_by": "tests/test_report.py"}
    idle = {"id": "test-never-fires", "pipelines": ["jax:remat3"],
            "diverges": {"check": "gradient", "reference": "jax:none", "reason": "test"},
            "verified_by": "tests/test_report.py"}
    exp = Expectations.load()
    exp = Expectations(exp.entries + [Entry.model_validate(e) for e in (never, idle)], exp.source)
    exp_file = tmp_path / "exp.json"
    exp_file.write_text(_json.dumps({"schema_version": 1, "entries": [
        _json.loads(e.model_dump_json(exclude_none=True)) for e in exp.entries]}))
    out = tmp_path / "run"
    opts = Options(pipelines=["ref:f64", "jax:none", "jax:remat2", "jax:remat3"], budget=600, max_examples=4,
                   seed=1, shrink_steps=3, generator=Config(max_stmts=3))
    store = Store(out)
    store.write_run({"schema_version": 1, "harness": "test", "options": {"pipelines": opts.pipelines, "seed": 1,
                                                                          "device": "cpu"}, "versions": {}})
    camp = Campaign(opts, store, InProcessExecutor(), exp)
    camp.run()
    store.write_summary(summary_markdown(camp, {"versions": {}}))
    store.close()
    why = {s["id"]: s["why"] for s in camp.stale_expectations()}
    assert why.get("test-never-matches") == "never matched a program in this run", why
    assert why.get("test-never-fires", "").endswith("but the divergence no longer happens"), why
    summary = (out / "summary.md").read_text().split("## Stale expectations")[1]
    assert "`test-never-matches`: never matched" in summary and "`test-never-fires`: matched" in summary
    rc = cli_main(["report", str(out), "--out", str(tmp_path / "rep"), "--no-repro", "--expectations", str(exp_file)])
    assert rc == 0
    rep = _json.loads((tmp_path / "rep" / "report.json").read_text())
    assert {s["id"]: s["why"] for s in rep["stale_expectations"]} == why
    page = (tmp_path / "rep" / "report.html").read_text()
    stale_section = page.split('id="stale"')[1].split("<h2")[0]
    assert "test-never-matches" in stale_section and "test-never-fires" in stale_section


def test_report_strict_exits_1_only_on_new_findings(tmp_path, capsys):
    common = ["--no-repro", "--strict"]
    assert cli_main(["report", str(FIX / "run_a"), "--baseline", str(FIX / "base"), "--out", str(tmp_path / "a")]
                    + common) == 1   # the fixture has one new finding
    same = tmp_path / "same"
    shutil.copytree(FIX / "run_a", same)
    assert cli_main(["report", str(FIX / "run_a"), "--baseline", str(same), "--out", str(tmp_path / "b")]
                    + common) == 0   # every finding persists
    assert "0 new" in capsys.readouterr().out


# ---- findings grouped by class, bugs first ---------------------------------------------------------------
CLASSES = ("harness", "documented", "question", "bug")   # written in the wrong order on purpose


def classed_run(tmp_path) -> Path:
    """run_a with four findings, one of each class (a harness limit first in findings.json, a bug
    last); the bug's class only suggested, the others confirmed; the bug counted in variants."""
    d = tmp_path / "classed"
    shutil.copytree(FIX / "run_a", d)
    base = json.loads((d / "findings.json").read_text())[0]
    fs = []
    for k, cls in enumerate(CLASSES):
        f = json.loads(json.dumps(base))
        f["signature"] = f"{f['signature']}#{k}"
        f["title"] = f"the {cls} behaviour"
        f["triage"] = {"class": cls, "reason": f"why it is {cls}", "links": [], "confirmed": cls != "bug"}
        fs.append(f)
    fs[-1]["variants"] = {"pipelines": {"jax:remat3": {"count": 4, "first_seen": 3.0},
                                        "jax:remat3:jit": {"count": 2, "first_seen": 9.0}},
                          "labels": {"other": {"count": 5}, "extra": {"count": 1}},
                          "policies": {"nothing": {"count": 3}, "dots": {"count": 3, "first_seen": 1.0}}}
    (d / "findings.json").write_text(json.dumps(fs))
    return d


def test_findings_are_grouped_by_class_bugs_first(tmp_path):
    rep = build([load_run(classed_run(tmp_path))], with_repro=False)
    mine = [x for x in rep["findings"] if x["title"].startswith("the ")]
    assert [x["class"] for x in mine] == ["bug", "question", "documented", "harness"]
    assert rep["findings"][0]["class"] == "bug" and rep["findings"][0]["id"] == "F1"
    assert rep["totals"]["by_class"] == {"bug": 1, "question": 1, "documented": 1, "harness": 1}
    bug = mine[0]
    assert bug["triage"] == {"class": "bug", "reason": "why it is bug", "links": [], "confirmed": False}
    assert bug["variants_text"] == ("pipelines: jax:remat3 x4, jax:remat3:jit x2; labels: other x5, extra x1; "
                                    "policies: dots x3, nothing x3")
    assert bug["variants"]["pipelines"][0] == {"value": "jax:remat3", "count": 4, "first_seen": 3.0}
    # an issue text for a bug or a question, none for a documented behaviour or a harness limit
    assert [x["issue"] is not None for x in mine] == [True, True, False, False]
    assert mine[2]["no_issue"].startswith("No issue text: ") and "documented" in mine[2]["no_issue"]
    render.write(rep, tmp_path / "out", with_plots=False)
    md = (tmp_path / "out" / "report.md").read_text()
    heads = [md.index(h) for h in ("### Bugs (", "### Questions for upstream (", "### Documented behaviours (",
                                    "### Harness limits (")]
    assert heads == sorted(heads), heads
    titles = [md.index(f"**the {c} behaviour**") for c in ("bug", "question", "documented", "harness")]
    assert titles == sorted(titles) and heads[0] < titles[0] < heads[1] < titles[1] < heads[2] < titles[2] < heads[3]
    assert "class: bug (suggested): why it is bug" in md and "class: harness: why it is harness" in md
    assert "variants: pipelines: jax:remat3 x4, jax:remat3:jit x2; labels: other x5, extra x1" in md
    html = (tmp_path / "out" / "report.html").read_text()
    at = [html.index(f'id="class-{c}"') for c in ("bug", "question", "documented", "harness")]
    assert at == sorted(at) and "the bug behaviour" in html and "(suggested)" in html
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert "the bug behaviour" in junit and "class: bug (suggested)" in junit
    assert json.loads((tmp_path / "out" / "report.json").read_text())["findings"][0]["class"] == "bug"


def test_summary_groups_findings_by_class_bugs_first(tmp_path):
    """summary.md: bugs, then questions, documented behaviours, harness limits, each by its title,
    its class (suggested until confirmed) and its variants with counts; tracked behaviours too."""
    from conformance.engine.campaign import Campaign
    from conformance.engine.findings import Finding
    from conformance.engine.options import Options
    from conformance.engine.store import Store
    from conformance.reporting.summary import summary_markdown
    from oracles.expectations import Expectations
    fs = [Finding.model_validate(f) for f in json.loads((classed_run(tmp_path) / "findings.json").read_text())]
    camp = Campaign(Options(pipelines=["jax:remat3"]), Store(tmp_path / "out"), None, Expectations.load())
    camp.findings = fs + [fs[1].model_copy(update={"tracked": "known-root.json", "count": 2,
                                                   "title": "a tracked behaviour"})]
    s = summary_markdown(camp, {"versions": {}})
    heads = [s.index(h) for h in ("### Bugs (1)", "### Questions for upstream (1)", "### Documented behaviours (1)",
                                   "### Harness limits (1)")]
    assert heads == sorted(heads), heads
    titles = [s.index(f"**the {c} behaviour**") for c in ("bug", "question", "documented", "harness")]
    assert heads[0] < titles[0] < heads[1] < titles[1] < heads[2] < titles[2] < heads[3] < titles[3]
    assert "- **F1** new: **the bug behaviour**" in s and "- **F4** new: **the harness behaviour**" in s
    assert "  - class: bug (suggested): why it is bug" in s and "  - class: question: why it is question" in s
    assert ("  - variants: pipelines: jax:remat3 x4, jax:remat3:jit x2; labels: other x5, extra x1; "
            "policies: dots x3, nothing x3") in s
    table = s.split("\n## Findings\n", 1)[1]
    assert table.index("| F1 | bug (suggested) |") < table.index("| F4 | harness |")
    assert "## Behaviours by pipeline" in s
    tracked = s.split("## Tracked behaviours seen", 1)[1]
    assert "**a tracked behaviour** (tracked as `known-root.json`)" in tracked
    assert "  - class: documented: why it is documented" in tracked
    assert "**a tracked behaviour**" not in s.split("## Tracked behaviours seen", 1)[0]   # not among the new


def test_summary_and_report_md_are_one_rendering_of_one_aggregation(tmp_path):
    """A campaign's summary.md is the report of its run directory with the campaign's own facts on top:
    from the totals on, the two texts are the same (findings, grid, checks that ran, coverage, stale entries)."""
    from conformance.engine.campaign import Campaign
    from conformance.engine.options import Options
    from conformance.engine.runner import InProcessExecutor
    from conformance.engine.store import Store
    from conformance.reporting.summary import summary_markdown
    from generators.programs import Config
    from oracles.expectations import Expectations
    out = tmp_path / "run"
    opts = Options(pipelines=["ref:f64", "jax:none", "jax:mutant-perturb-gradient"], budget=600, max_examples=3,
                   seed=2, shrink_steps=2, generator=Config(max_stmts=3, dtypes=("float32",)))
    store = Store(out)
    run_info = {"schema_version": 1, "harness": "test", "options": opts.recorded(), "versions": {"jax": "x"}}
    store.write_run(run_info)
    camp = Campaign(opts, store, InProcessExecutor(), Expectations.load())
    camp.run()
    summary = summary_markdown(camp, run_info)
    store.write_summary(summary)
    store.close()
    assert camp.checked >= 3 and camp.new_findings()
    rep = build([load_run(out)], with_repro=False)
    render.write(rep, tmp_path / "rep", with_plots=False)
    report = (tmp_path / "rep" / "report.md").read_text()

    def body(md):   # from the totals on; finding links are relative to where each file is
        return re.sub(r"\]\([^)]*\)", "]()", md[md.index("programs checked in 1 run(s)"):])
    assert body(summary) == body(report)
    assert f"- programs checked: **{camp.checked}**" in summary and "programs checked: **" not in report
    assert f"| `jax:mutant-perturb-gradient` | {camp.tally.ran['jax:mutant-perturb-gradient']} |" in summary
