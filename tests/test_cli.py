"""The command line: clear errors (exit 2, no traceback), run/replay/pipelines end to end."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.engine.loading import corpus_entry_stem
from tests.programs import seed_program

CLI = [sys.executable, "-m", "conformance.cli"]


def run(*args, cwd=None, timeout=300, env=None):
    return subprocess.run(CLI + list(args), capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)


def mutant_env():
    """The test-only mutant pipelines (tests/mutants.py) plugged into the CLI."""
    import os
    return {**os.environ, "REMAT_CONFORMANCE_PLUGINS": "tests.mutants",
            "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


def assert_usage_error(r, *fragments):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert r.stderr.startswith("error: "), r.stderr
    assert "Traceback" not in r.stderr
    for f in fragments:
        assert f in r.stderr, (f, r.stderr)


@pytest.mark.parametrize("args, fragments", [
    (["run", "--pipelines", "jax:remat9"], ["--pipelines", "unknown pipeline 'jax:remat9'", "jax:remat3"]),
    (["run", "--pipelines", "jax:remat3,,jax:remat2"], ["--pipelines", "empty name"]),
    (["run", "--budget", "-5"], ["--budget", "must be > 0"]),
    (["run", "--budget", "soon"], ["--budget", "must be a float"]),
    (["run", "--max-examples", "0"], ["--max-examples", "must be > 0"]),
    (["run", "--seed", "-1"], ["--seed", "must be >= 0"]),
    (["run", "--device", "tpu"], ["--device", "invalid choice"]),
    (["frobnicate"], ["invalid choice"]),
])
def test_bad_options_are_refused_clearly(args, fragments, tmp_path):
    assert_usage_error(run(*args, "--out", str(tmp_path / "o")) if args[0] == "run" else run(*args), *fragments)


def test_non_empty_out_needs_overwrite(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    assert_usage_error(run("run", "--out", str(out), "--budget", "1"), str(out), "--overwrite")
    assert (out / "keep.txt").read_text() == "precious"


def test_bad_expectations_file_is_named(tmp_path):
    bad = tmp_path / "exp.json"
    bad.write_text(
        json.dumps({"entries": [{"id": "x", "pipelines": ["jax:*"], "raises": {"type": "(", "regex": "a"}}]})
    )
    assert_usage_error(run("run", "--expectations", str(bad), "--out", str(tmp_path / "o")), str(bad), "entries[0]",
                       "bad regex")


@pytest.mark.parametrize("content, fragments", [
    ("{not json", ["line 1", "invalid JSON"]),
    ("[1, 2]", ["<root>", "JSON object"]),
    (json.dumps({"schema_version": 1, "inputs": [], "body": [], "outputs": []}), ["inputs", "at least one input"]),
    (json.dumps({**seed_program().to_json_obj(), "outputs": ["nope"]}), ["outputs[0]", "'nope'"]),
    (json.dumps({"program": {**seed_program().to_json_obj(), "schema_version": 9}, "inputs": {}}),
     ["program.schema_version", "unsupported"]),
])
def test_replay_rejects_malformed_programs(content, fragments, tmp_path):
    f = tmp_path / "bad.json"
    f.write_text(content)
    assert_usage_error(run("replay", str(f)), str(f), *fragments)


def test_replay_limits_are_checked_before_running(tmp_path):
    f = tmp_path / "p.json"
    f.write_text(seed_program().to_json())
    assert_usage_error(run("replay", str(f), "--max-elements", "2"), "inputs[0].shape", "exceed the limit 2")
    assert_usage_error(run("replay", str(f), "--max-name-length", "0"), "--max-name-length", "must be > 0")


def test_replay_reports_a_missing_error(tmp_path):
    """A declared error that is not raised is a failure of `replay` (exit 1 with --strict). The
    declaration is test-only (remat3 must raise on every tanh), so the test does not depend on an
    open upstream bug: the seed's own bug is tracked by its regression-corpus entry."""
    f = tmp_path / "seed.json"
    f.write_text(seed_program().to_json())
    exp = tmp_path / "exp.json"
    exp.write_text(json.dumps({"schema_version": 1, "entries": [
        {"id": "test-remat3-must-raise-on-tanh", "pipelines": ["jax:remat3"], "features": ["op:tanh"],
         "raises": {"type": "ValueError", "regex": "tanh"}, "verified_by": "tests/test_cli.py (test-only)"}]}))
    r = run("replay", str(f), "--pipelines", "jax:remat3", "--expectations", str(exp), "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["file"] == str(f)
    fails = [(v["check"], v["pipeline"], v["reference"], v["error_type"]) for v in res["failures"]]
    assert ("error", "jax:remat3", "expectations", "none") in fails
    assert run("replay", str(f), "--pipelines", "jax:remat3", "--expectations", str(exp), "--strict").returncode == 1
    assert run("replay", str(f), "--pipelines", "jax:none", "--expectations", str(exp), "--strict").returncode == 0


def test_pipelines_lists_versions_and_devices():
    r = run("pipelines")
    assert r.returncode == 0
    import jax
    line = next(l for l in r.stdout.splitlines() if l.startswith("jax:remat3:jit "))
    assert f"jax={jax.__version__}" in line and "devices=cpu" in line


def test_short_campaign_writes_every_output(tmp_path):
    # a mutant whose gradients are wrong on every program: the campaign must have findings
    out = tmp_path / "o"
    r = run("run", "--pipelines", "jax:mutant-perturb-gradient", "--budget", "60", "--max-examples", "3",
            "--shrink-steps", "5", "--out", str(out), "--seed", "3", "--quiet", "--no-isolate", env=mutant_env())
    assert r.returncode == 0, r.stderr
    for name in ("run.json", "results.jsonl", "findings.json", "summary.md"):
        assert (out / name).exists(), name
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["options"]["pipelines"][:3] == ["ref:f64", "jax:none", "jax:remat2"]
    assert run_info["versions"]["jax"]
    results = [json.loads(l) for l in (out / "results.jsonl").read_text().splitlines()]
    assert 1 <= sum(r["type"] == "result" for r in results) <= 3
    findings = json.loads((out / "findings.json").read_text())
    assert any(f["pipeline"] == "jax:mutant-perturb-gradient" for f in findings), findings
    for f in findings:
        assert set(f) >= {"signature", "check", "pipeline", "reference", "features", "program", "detail",
                          "versions", "count"}
        assert (out / "corpus" / f"{corpus_entry_stem(f['check'], f['pipeline'], f['program_hash'])}.json").exists()
    assert "programs checked" in (out / "summary.md").read_text()
    # a second run into the same directory is refused without --overwrite, accepted with it
    assert run("run", "--out", str(out), "--budget", "1").returncode == 2


def test_run_known_counts_tracked_behaviours_instead_of_reporting_them(tmp_path):
    """`run --known CORPUS`: a behaviour a corpus entry tracks is counted under that entry (not
    shrunk, not new, `--strict` passes); the same campaign without it reports it as new (and
    `--strict` fails the job: exit 1; without --strict, findings exit 0: the harness worked)."""
    import os
    env = {**os.environ, "REMAT_CONFORMANCE_PLUGINS": "tests.mutants",
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    args = ["run", "--pipelines", "jax:mutant-perturb-gradient", "--budget", "60", "--max-examples", "4",
            "--shrink-steps", "5", "--seed", "1", "--quiet", "--no-isolate", "--jobs", "1", "--strict"]
    first = tmp_path / "first"
    r = subprocess.run(CLI + args + ["--out", str(first)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 1, r.stderr[-2000:]
    found = json.loads((first / "findings.json").read_text())
    assert found and all(f["tracked"] is None for f in found)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for f in found:
        name = f"{corpus_entry_stem(f['check'], f['pipeline'], f['program_hash'])}.json"
        (corpus / name).write_text((first / "corpus" / name).read_text())
    second = tmp_path / "second"
    r = subprocess.run(CLI + args + ["--out", str(second), "--known", str(corpus)], capture_output=True, text=True,
                       timeout=300, env=env)
    assert r.returncode == 0, (r.stdout, r.stderr[-2000:])
    again = json.loads((second / "findings.json").read_text())
    assert [f for f in again if f["tracked"] is None] == []
    seen = [f for f in again if f["tracked"] is not None and f["count"]]
    assert {f["tracked"] for f in seen} <= {f"{corpus_entry_stem(f['check'], f['pipeline'], f['program_hash'])}.json"
                                            for f in found} and seen
    # the program whose shrink gave the entry is counted under it this time, not shrunk again
    origins = lambda d: [json.loads(l)["origin"] for l in (d / "results.jsonl").read_text().splitlines()
                         if json.loads(l).get("type") == "finding"]
    assert origins(first) and origins(first)[0] not in origins(second)
    assert "known behaviours seen" in r.stdout and "Tracked behaviours seen" in (second / "summary.md").read_text()
    # the report shows a tracked behaviour the run saw as persisting, not new (report --strict passes)
    rep_dir = tmp_path / "rep"
    r = subprocess.run(CLI + ["report", str(second), "--out", str(rep_dir), "--no-repro", "--strict"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    rep = json.loads((rep_dir / "report.json").read_text())
    assert rep["findings"] and {(x["status"], x["tracked"] is not None) for x in rep["findings"]} == {
        ("persisting", True)
    }
    assert rep["totals"]["new"] == 0
    # a fixed key is no known behaviour: its recurrence is new again
    key = "|".join([found[0]["check"], found[0]["pipeline"], found[0]["reference"], found[0]["error_type"]])
    (corpus / "status.json").write_text(json.dumps({"fixed": {key: "test: fixed"}}))
    third = tmp_path / "third"
    r = subprocess.run(CLI + [a for a in args if a != "--strict"] + ["--out", str(third), "--known", str(corpus)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    again = json.loads((third / "findings.json").read_text())
    assert any(f["tracked"] is None and "|".join(f[k] for k in ("check", "pipeline", "reference", "error_type"))
               == key for f in again), again


def test_run_known_refuses_what_is_not_a_corpus(tmp_path):
    bare = tmp_path / "bare.json"
    bare.write_text(seed_program().to_json())
    empty = tmp_path / "empty"
    empty.mkdir()
    bad_status = tmp_path / "bad"
    bad_status.mkdir()
    (bad_status / "status.json").write_text('{"fixed": []}')
    for path, says in ((tmp_path / "nope", "no such file or directory"), (empty, "no corpus entries"),
                       (bare, "needs a corpus entry with a finding"), (bad_status, "status.json: fixed")):
        r = run("run", "--pipelines", "jax:remat3", "--budget", "1", "--known", str(path), "--out", str(tmp_path / "o"))
        assert r.returncode == 2 and says in r.stderr and str(path.name) in r.stderr, (path, r.stderr)
        assert not (tmp_path / "o").exists()   # refused before anything is written


def test_the_default_set_explores_and_no_explore_keeps_to_the_core_set():
    from conformance.cli.main import parse_pipelines
    from conformance.pipelines import registry as reg
    explored, core = set(parse_pipelines(None)), set(parse_pipelines(None, explore=False))
    assert set(reg.EXPLORERS) <= explored
    assert not set(reg.EXPLORERS) & core   # (--no-explore: the explorers left out, not run on every program)
    assert set(reg.CORE_PIPELINES) <= core
