"""`recheck DIR` (every corpus entry replayed on the installed versions) and the upstream-ready
issue text written beside each corpus entry."""
import json
import subprocess
import sys
from pathlib import Path

from conformance.engine.findings import CorpusEntry
from conformance.reporting.issue_text import issue_text_or_reason
from tests.corpus_files import variant_path

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "tests" / "regressions"
# two quick JAX programs of the corpus's roots (as plain corpus entries): a residual difference and a
# custom-rule observation
OPEN = ["residuals-jax_remat3-a9721056.json", "custom_rule-jax_remat3-7e255af8.json"]


def recheck(d: Path, *extra):
    return subprocess.run([sys.executable, "-m", "conformance.cli", "recheck", str(d), *extra], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)


def test_recheck_says_still_failing_changed_and_regressed(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    for n in OPEN:
        (d / n).write_text(variant_path(n).read_text())
    # an entry whose recorded key is not what its program does now: "changed"
    e = json.loads(variant_path(OPEN[0]).read_text())
    e["finding"]["error_type"] = "extra"
    (d / "residuals-jax_remat3-changed0.json").write_text(json.dumps(e))
    # an entry listed as fixed that fails again: "regressed"
    key = json.loads(variant_path(OPEN[1]).read_text())["finding"]
    (d / "status.json").write_text(json.dumps({"fixed": {"|".join(
        [key["check"], key["pipeline"], key["reference"], key["error_type"]]): "test"}}))
    r = recheck(d, "--out", str(tmp_path / "recheck.json"))
    assert r.returncode == 0, r.stderr
    got = {x["entry"]: x["status"] for x in json.loads((tmp_path / "recheck.json").read_text())["entries"]}
    assert got == {OPEN[0]: "still failing", OPEN[1]: "regressed", "residuals-jax_remat3-changed0.json": "changed"}
    out = json.loads((tmp_path / "recheck.json").read_text())
    import jax
    assert out["versions"]["jax"] == jax.__version__
    assert "1 still failing, 1 changed, 1 regressed of 3 entries" in r.stdout
    assert recheck(d, "--strict").returncode == 1


def test_recheck_refuses_bad_input_and_keeps_results(tmp_path):
    r = recheck(tmp_path / "missing")
    assert r.returncode == 2 and "is not a directory" in r.stderr
    (tmp_path / "empty").mkdir()
    assert "holds no corpus entries" in recheck(tmp_path / "empty").stderr
    d = tmp_path / "bad"
    d.mkdir()
    (d / "a.json").write_text(variant_path(OPEN[0]).read_text())
    (d / "b.json").write_text("{not json")
    (tmp_path / "keep.json").write_text("earlier result")
    r = recheck(d, "--out", str(tmp_path / "keep.json"))
    assert r.returncode == 2 and "b.json" in r.stderr and "invalid JSON" in r.stderr
    assert (tmp_path / "keep.json").read_text() == "earlier result"   # nothing ran, nothing overwritten


def test_recheck_groups_entries_by_class_bugs_first(tmp_path, capsys):
    """Entries print under their class, bugs first, each with its title, class and variants; the
    JSON rows carry them. (Every corpus entry's issue text: tests/test_issue_text.py.)"""
    import argparse

    from conformance.cli.recheck import main
    from tests.test_issue_text import _root
    d = tmp_path / "corpus"
    d.mkdir()
    (d / OPEN[1]).write_text(variant_path(OPEN[1]).read_text())   # a suggested question
    _root(tmp_path, "documented", entries=[variant_path(OPEN[0])])   # confirmed classes, in corpus/
    _root(tmp_path, "bug", entries=[variant_path(OPEN[0]), variant_path("residuals-jax_remat3-f055f5d8.json")])
    assert main(argparse.Namespace(dir=str(d), out=str(tmp_path / "r.json"), device=None, strict=False)) == 0
    out = capsys.readouterr().out
    heads = [out.index(h) for h in ("== Bugs", "== Questions for upstream", "== Documented behaviours")]
    assert heads == sorted(heads), out
    assert "    remat3 saves other residuals than remat2 (bug) [bug: why bug]; 2 programs; variants: pipelines: " in out
    assert "[question (suggested): a custom_rule difference under an opt-in implementation" in out, out
    assert "by class: 1 bug, 1 question, 1 documented" in out
    rows = json.loads((tmp_path / "r.json").read_text())["entries"]
    assert [(r["entry"], r["class"]) for r in rows] == [("remat3-bug.json", "bug"), (OPEN[1], "question"),
                                                        ("remat3-documented.json", "documented")]
    bug = rows[0]
    assert bug["root"] == "remat3-bug" and bug["programs"] == 2 and bug["triage"]["confirmed"] is True
    assert {v["value"] for v in bug["variants"]["labels"]} == {"missing", "extra"}
    assert bug["status"] == "still failing"


def test_a_check_that_did_not_run_is_not_called_fixed(monkeypatch):
    """Where a release does not let the capture see a residual set (torch 2.13's SAC cache), the
    residual check is skipped: the entry is 'not run' there, never 'fixed'."""
    from conformance.cli.recheck import recheck_entry
    from conformance.engine.loading import load_program_file
    from conformance.engine.runner import InProcessExecutor
    from oracles.expectations import Expectations
    prog, inputs, f = load_program_file(str(variant_path(OPEN[0])))
    real = InProcessExecutor.run

    def unobserved(self, program, inp, names):
        obs = real(self, program, inp, names)
        obs[f.pipeline].residuals = None
        return obs
    assert recheck_entry(prog, inputs, f, False, "cpu", Expectations.load())["status"] == "still failing"
    monkeypatch.setattr(InProcessExecutor, "run", unobserved)
    r = recheck_entry(prog, inputs, f, False, "cpu", Expectations.load())
    assert r["status"] == "not run" and "did not run here" in r["why"], r


def test_a_device_finding_is_rechecked_by_the_device_oracle(tmp_path):
    """A CPU-vs-device finding replays through `devices`' oracle: where that device is absent it is
    unsupported (never 'fixed' by a CPU-only replay)."""
    import torch

    from conformance.cli.recheck import recheck_entry
    from conformance.engine.findings import Finding
    from conformance.engine.loading import load_program_file
    from conformance.ir.verdict import DEVICE_REFERENCE
    from oracles.expectations import Expectations
    prog, inputs, f = load_program_file(str(variant_path(OPEN[0])))
    g = Finding.model_validate({**f.model_dump(), "reference": DEVICE_REFERENCE, "device": "cuda",
                                "check": "gradient", "error_type": ""})
    r = recheck_entry(prog, inputs, g, False, "cuda", Expectations.load())
    if torch.cuda.is_available():
        assert r["status"] in ("fixed", "still failing", "changed")
    else:
        assert r == {"status": "unsupported", "why": "no cuda device here", "failures": []}
    # on the cpu against the cpu: the plumbing agrees with itself, so the finding reads fixed
    h = Finding.model_validate({**g.model_dump(), "device": "cpu"})
    assert recheck_entry(prog, inputs, h, False, "cpu", Expectations.load())["status"] == "fixed"


def test_the_report_links_each_findings_issue_text(tmp_path):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(ROOT / "tests" / "fixtures" / "run_a", run)
    entry = sorted((run / "corpus").glob("*.json"))[0]
    f = CorpusEntry.model_validate(json.loads(entry.read_text())).finding
    (run / "corpus" / f"{entry.stem}.issue.md").write_text(issue_text_or_reason(f))
    r = subprocess.run([sys.executable, "-m", "conformance.cli", "report", str(run), "--out", str(tmp_path / "rep"),
                        "--no-repro"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    href = f"../run/corpus/{entry.stem}.issue.md"
    assert f"]({href})" in (tmp_path / "rep" / "report.md").read_text()
    assert f'<a href="{href}">' in (tmp_path / "rep" / "report.html").read_text()
    rep = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert [x["issue_href"] for x in rep["findings"]].count(href) == 1   # the other finding has no text here
    assert (tmp_path / "rep" / href).resolve().read_text().startswith(f"# {f.pipeline}: ")
