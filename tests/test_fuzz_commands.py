"""Every command and option, fed hostile values; every input file kind, mutated.

Properties: the exit status is 0 (accepted) or 2 (refused); a refusal is one line
`error: ...` naming the option or the file and field, never a traceback; a refused command
creates and changes nothing (output directories, run.json, results.jsonl, findings.json are
byte-for-byte as before). Runs in-process, without running any pipeline."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conformance.cli import main as cli
from oracles.expectations import DEFAULT_FILE, Expectations, ExpectationsError
from tests.corpus_files import variant_path

FIX = Path(__file__).parent / "fixtures"
REG = Path(__file__).parent / "regressions"
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), database=None)
BAD_NUMBERS = st.sampled_from(["nan", "inf", "-inf", "1e309", "-1", "0", "-0.0", "abc", "", "1e3", "3",
                               "9" * 50, "0x10", "2.5", " 4", "\u0663"])   # \u0663: an Arabic-Indic digit


def _one_line_error(err: str, *names: str):
    lines = [x for x in err.strip().splitlines() if x and not x.startswith("warning: ")]
    assert lines and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert len(lines) <= 2 and (len(lines) == 1 or lines[1].startswith("(see")), err
    assert any(n in lines[0] for n in names), (names, err)


def _snapshot(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()} if d.exists() else None


RUN_NUMERIC = ["--budget", "--max-examples", "--seed", "--shrink-seconds", "--shrink-steps", "--max-stmts",
               "--timeout"]
REPLAY_NUMERIC = ["--seed", "--max-rank", "--max-dim", "--max-elements", "--max-depth", "--max-statements",
                  "--max-name-length"]


@FUZZ
@given(option=st.sampled_from(RUN_NUMERIC), value=BAD_NUMBERS)
def test_run_options_are_refused_or_accepted_before_anything_is_created(tmp_path_factory, capsys, option, value):
    out = tmp_path_factory.mktemp("run") / "out"
    # an unknown pipeline stops every accepted value after parsing: nothing may run or be created
    rc = cli.main(["run", option, value, "--pipelines", "no:such", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2
    _one_line_error(err, option, "--pipelines")
    assert not out.exists()


@FUZZ
@given(option=st.sampled_from(REPLAY_NUMERIC), value=BAD_NUMBERS)
def test_replay_options(tmp_path_factory, capsys, option, value):
    bad = tmp_path_factory.mktemp("replay") / "p.json"
    bad.write_text("{}")
    rc = cli.main(["replay", str(bad), option, value])
    assert rc == 2
    _one_line_error(capsys.readouterr().err, option, str(bad))


@FUZZ
@given(value=BAD_NUMBERS, framework=st.sampled_from(["jax", "torch", "cuda", ""]),
       pipeline=st.sampled_from([None, "jax:remat3", "torch:eager-sac", "nope", ""]))
def test_repro_options(tmp_path_factory, capsys, value, framework, pipeline):
    out = tmp_path_factory.mktemp("repro") / "r.py"
    args = ["repro", str(variant_path("fixed-optimize-remat-sz.json")), "--seed", value, "--framework", framework,
            "--out", str(out)] + (["--pipeline", pipeline] if pipeline is not None else [])
    rc = cli.main(args)
    captured = capsys.readouterr()
    assert rc in (0, 2)
    if rc == 2:
        _one_line_error(captured.err, "--seed", "--framework", "--pipeline")
        assert not out.exists()
    else:
        compile(out.read_text(), str(out), "exec")


def test_contradicting_options_are_refused(tmp_path, capsys):
    out = tmp_path / "out"
    shutil.copytree(FIX / "run_a", out)
    before = _snapshot(out)
    assert cli.main(["run", "--overwrite", "--resume", "--pipelines", "jax:remat3", "--out", str(out)]) == 2
    _one_line_error(capsys.readouterr().err, "--overwrite")
    assert _snapshot(out) == before
    fresh = tmp_path / "nothing"
    assert cli.main(["run", "--resume", "--pipelines", "jax:remat3", "--out", str(fresh)]) == 2
    _one_line_error(capsys.readouterr().err, str(fresh))
    assert not fresh.exists()   # a refused --resume creates nothing


# -- the files of a run directory, on --resume -----------------------------------------------
DAMAGE = st.sampled_from(["truncate", "not_object", "wrong_schema", "nan", "huge_int", "fifo", "dir",
                          "loop", "bad_field", "none"])


def _damage(p: Path, how: str, good: dict | list):
    if p.exists() or p.is_symlink():
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
    if how == "fifo":
        os.mkfifo(p)
    elif how == "dir":
        p.mkdir()
    elif how == "loop":
        p.symlink_to(p.name)
    elif how == "truncate":
        p.write_text(json.dumps(good)[:20])
    elif how == "not_object":
        p.write_text("[1, 2]" if isinstance(good, dict) else "{}")
    elif how == "wrong_schema":
        p.write_text(json.dumps({**good, "schema_version": 99} if isinstance(good, dict)
                                else [{**good[0], "schema_version": 99}] if good else [{"schema_version": 99}]))
    elif how == "nan":
        p.write_text(json.dumps(good).replace("1", "NaN", 1))
    elif how == "huge_int":
        p.write_text(json.dumps(good).replace("1", "1" * 5000, 1))
    elif how == "bad_field":
        p.write_text(json.dumps({**good, "options": "x"} if isinstance(good, dict)
                                else [{**good[0], "count": "many"}] if good else [{"x": 1}]))
    else:
        p.write_text(json.dumps(good))


@FUZZ
@given(target=st.sampled_from(["run.json", "findings.json", "results.jsonl"]), how=DAMAGE)
def test_resume_validates_every_file_before_writing_anything(tmp_path_factory, capsys, target, how):
    out = tmp_path_factory.mktemp("resume") / "out"
    shutil.copytree(FIX / "run_a", out)
    good = {"run.json": json.loads((out / "run.json").read_text()),
            "findings.json": json.loads((out / "findings.json").read_text()),
            "results.jsonl": {"type": "result", "hash": "0" * 16, "seed": 1, "seq": 0}}[target]
    _damage(out / target, how, good)
    before = {p.name: (p.read_bytes() if p.is_file() else None) for p in out.iterdir()}
    # the seed differs from the run's: an intact directory is refused by the option check
    rc = cli.main(["run", "--resume", "--out", str(out), "--seed", "424242", "--no-isolate", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2, err
    _one_line_error(err, str(out), "--resume")
    assert {p.name: (p.read_bytes() if p.is_file() else None) for p in out.iterdir()} == before


# -- expectations files ----------------------------------------------------------------------
@FUZZ
@given(edit=st.sampled_from(["drop_id", "dup_id", "two_kinds", "bad_regex", "bad_spec", "unknown_field",
                             "check", "not_list", "none"]))
def test_expectations_files_load_or_name_the_entry(tmp_path_factory, edit):
    obj = json.loads(DEFAULT_FILE.read_text())
    e0 = obj["entries"][0]
    if edit == "drop_id":
        del e0["id"]
    elif edit == "dup_id":
        obj["entries"].append(dict(e0))
    elif edit == "two_kinds":
        e0["unsupported"] = {"reason": "x"}
    elif edit == "bad_regex":
        e0["raises"] = {"type": "(", "regex": "x"}
    elif edit == "bad_spec":
        e0["versions"] = {"jax": ">=>1"}
    elif edit == "unknown_field":
        e0["frobnicate"] = 1
    elif edit == "check":
        next(e for e in obj["entries"] if "diverges" in e)["diverges"]["check"] = "vibes"
    elif edit == "not_list":
        obj["entries"] = {}
    p = tmp_path_factory.mktemp("exp") / "e.json"
    p.write_text(json.dumps(obj))
    try:
        Expectations.load(p)
    except ExpectationsError as e:
        assert str(e).startswith(f"{p}: ") and "\n" not in str(e)
        assert edit != "none"
    else:
        assert edit == "none"


# -- the report command ----------------------------------------------------------------------
def test_report_refusals_are_one_line(tmp_path, capsys):
    out = tmp_path / "rep"
    cases = [
        (["report", str(FIX / "run_a"), str(FIX / "run_a"), "--out", str(out)], "given more than once"),
        (["report", str(FIX / "run_a"), "--out", "/proc/nope/rep"], "--out"),
        (["report", str(tmp_path / "missing"), "--out", str(out)], "not a directory"),
        (["report", str(FIX / "run_a"), "--out", str(out), "--expectations", str(tmp_path)], "directory"),
    ]
    base = tmp_path / "base"
    base.mkdir()
    (base / "report.json").write_text(json.dumps({"schema_version": 1, "findings": {"a": 1}}))
    cases.append((["report", str(FIX / "run_a"), "--baseline", str(base), "--out", str(out)], "findings"))
    loop = tmp_path / "loop"
    shutil.copytree(FIX / "run_a", loop)
    (loop / "results.jsonl").unlink()
    (loop / "results.jsonl").symlink_to("results.jsonl")
    cases.append((["report", str(loop), "--out", str(out)], "symbolic links"))
    for args, fragment in cases:
        assert cli.main(args) == 2, args
        err = capsys.readouterr().err
        _one_line_error(err, fragment)
    assert not out.exists()


def test_an_internal_error_is_one_line_with_its_own_code(monkeypatch, capsys):
    def boom(args):
        raise KeyError("a harness bug")
    monkeypatch.setitem(cli.COMMANDS, "pipelines", boom)
    assert cli.main(["pipelines"]) == cli.EXIT_INTERNAL
    err = capsys.readouterr().err
    assert err.startswith("internal error") and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert cli.main(["--debug", "pipelines"]) == cli.EXIT_INTERNAL
    assert "Traceback" in capsys.readouterr().err
