"""tools/soak.py (`make soak`): the audit of a killed and resumed campaign's files, on hand-made ones (a
torn line, a result written twice, one lost between two snapshots, a count short of its results),
the report comparison, the options, and one short soak of a real campaign end to end."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import soak  # noqa: E402

SIG = "error|jax:remat3|jax:remat2|ValueError|checkpoint"


def _res(seq, h=None, seed=None, **kw):
    return {"type": "result", "schema_version": 1, "hash": h or f"{seq:016x}", "seed": seq if seed is None else seed,
            "seq": seq, "t": float(seq), **kw}


def _line(rec) -> bytes:
    return (json.dumps(rec, sort_keys=True, separators=(",", ":")) + "\n").encode()


def _write(d: Path, *lines: bytes) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "results.jsonl").write_bytes(b"".join(lines))
    return d


def _finding(**kw):
    return {"signature": SIG, "check": "error", "pipeline": "jax:remat3", "program_hash": "ab" * 8, "count": 1,
            "tracked": None, **kw}


def test_a_clean_campaign_has_nothing_lost_twice_or_torn(tmp_path):
    recs = [_res(0), _res(1), {"type": "finding", "signature": SIG, "origin": ["0" * 16, 0], "key": ["error"]},
            {"type": "round", "round": 0}, _res(2)]
    d = _write(tmp_path / "run", *map(_line, recs[:3]))
    snaps = [soak.snapshot(d)]
    _write(d, *map(_line, recs))
    (d / "findings.json").write_text(json.dumps([_finding()]))
    (d / "corpus").mkdir()
    (d / "corpus" / "error-jax_remat3-abababab.json").write_text("{}")
    a = soak.audit(d, snaps)
    assert (a.programs, a.records, a.torn, a.duplicated, a.lost, a.counts_lost) == (3, 5, 0, 0, 0, 0), a.problems


def test_torn_lines_are_counted_and_a_kill_mid_write_is_not(tmp_path):
    d = _write(tmp_path / "run", _line(_res(0)), _line(_res(1))[:25])   # killed in the middle of a write
    snaps = [soak.snapshot(d)]
    assert snaps[0].torn_last and not snaps[0].torn_inside
    # the next piece cut it off and went on; but a line in the middle does not parse, one lacks its seq
    no_seq = {k: v for k, v in _res(2).items() if k != "seq"}
    _write(d, _line(_res(0)), b'{"type":"result","hash":"00\n', _line(_res(1)), _line(no_seq), _line(_res(3)))
    a = soak.audit(d, snaps)
    assert a.torn == 2 and a.torn_at_kills == 1, a.problems
    assert any("seq" in x for x in a.problems["torn"])
    # a torn line anywhere but last in a snapshot is torn too
    snaps.append(soak.snapshot(d))
    assert soak.audit(d, snaps).torn == 4


def test_a_result_written_twice_is_counted(tmp_path):
    d = _write(tmp_path / "run", _line(_res(0)), _line(_res(1)), _line(_res(2, h=f"{1:016x}", seed=1)),
               _line(_res(2)), _line({"type": "round", "round": 0}), _line({"type": "round", "round": 0}))
    a = soak.audit(d)
    # (hash, seed) of seq 1 twice, seq 2 twice, round 0 twice
    assert (a.programs, a.duplicated) == (3, 3), a.problems


def test_a_result_complete_in_an_earlier_snapshot_and_missing_later_is_lost(tmp_path):
    d = _write(tmp_path / "run", _line(_res(0)), _line(_res(1)), _line(_res(2)))
    snaps = [soak.snapshot(d)]
    _write(d, _line(_res(0)), _line(_res(1)), _line(_res(3)))   # seq 2 gone (and a seq reused would hide it)
    snaps.append(soak.snapshot(d))
    a = soak.audit(d, snaps)
    assert a.lost == 2 and a.duplicated == 0, a.problems     # the record, and the gap in seq it leaves
    assert any("gone" in x for x in a.problems["lost"]) and any("seq 2" in x for x in a.problems["lost"])
    # a record rewritten (the same program, other verdicts) is lost as it was written
    _write(d, _line(_res(0)), _line(_res(1, status="fail")), _line(_res(2)), _line(_res(3)))
    a = soak.audit(d, snaps)
    assert a.lost == 1 and any("changed" in x for x in a.problems["lost"]), a.problems


def test_a_missing_corpus_entry_and_a_count_short_of_its_results_are_counted(tmp_path):
    d = _write(tmp_path / "run", _line(_res(0, known_signatures=[SIG])), _line(_res(1, known_signatures=[SIG])),
               _line(_res(2, known_signatures=["other"])),
               _line({"type": "finding", "signature": SIG, "origin": ["0" * 16, 0], "key": ["error"]}))
    (d / "findings.json").write_text(json.dumps([_finding(count=2)]))
    a = soak.audit(d)
    assert a.lost == 1 and "corpus/error-jax_remat3-abababab.json" in a.problems["lost"][0]
    assert a.counts_lost == 1, a.problems   # two results and a finding record name it: 3, counted 2
    # tracked (no corpus file); two variants of one root with one signature: their counts add up
    tracked = [_finding(count=1, tracked="x.json"), _finding(count=2, tracked="x.json")]
    (d / "findings.json").write_text(json.dumps(tracked))
    assert (soak.audit(d).lost, soak.audit(d).counts_lost) == (0, 0)


def test_reports_compare_without_the_build_time_and_the_run_directory():
    a = {"generated": "2026-01-01T00:00:00", "inputs": [{"dir": "/a/campaign", "programs": 3}],
         "findings": [{"run_dir": "/a/campaign", "count": 2}], "warnings": ["/a/campaign/findings.json: missing"]}
    b = json.loads(json.dumps(a).replace("/a/", "/tmp/x/").replace("2026-01-01", "2027-02-02"))
    assert soak.report_differences(a, "/a/campaign", b, "/tmp/x/campaign") == []
    b["findings"][0]["count"] = 3
    b["extra"] = 1
    assert soak.report_differences(a, "/a/campaign", b, "/tmp/x/campaign") == [
        "report.extra: only in the copy's report", "report.findings[0].count: 2 != 3"]


@pytest.mark.parametrize("argv, says", [
    (["--minutes", "0"], "--minutes must be > 0"),
    (["--minutes", "x"], "--minutes must be a float"),
    (["--kill-every", "5-15"], "--kill-every must be A..B"),
    (["--kill-every", "15..5"], "0 < A <= B"),
    (["--kill-every", "0..1"], "0 < A <= B"),
    (["--seed", "-1"], "argument --seed: must be >= 0"),
    (["--run-args", "--budget 10"], "--run-args may not give --budget"),
    (["--run-args=--out=x"], "--run-args may not give --out"),
    (["--run-args", "'unclosed"], "--run-args: cannot split"),
])
def test_bad_options_are_refused_naming_the_option(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        soak.parse_args(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_options():
    a = soak.parse_args(["--kill-every", "0.5..2", "--run-args", "--pipelines jax:remat3 --jobs 1"])
    assert a.kill_every == (0.5, 2.0) and a.minutes == 120
    assert a.run_args == ["--pipelines", "jax:remat3", "--jobs", "1"]
    assert soak.parse_args(["--kill-every", "3"]).kill_every == (3.0, 3.0)
    assert soak.parse_args([]).run_args == ["--known", str(ROOT / "tests" / "regressions")]
    assert soak.finished(0, []) and not soak.finished(1, []) and soak.finished(1, ["--strict"])


@pytest.mark.slow
def test_a_short_soak_of_a_real_campaign(tmp_path):
    """About 21 s of campaign time killed every 6..11 s: every kill survived, nothing lost, twice or torn,
    the counts and the report those of the results."""
    out = tmp_path / "soak"
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "soak.py"), "--minutes", "0.35", "--kill-every",
                        "0.1..0.18", "--seed", "3", "--out", str(out), "--run-args",
                        "--pipelines jax:remat3 --jobs 1 --no-isolate --max-stmts 3 --shrink-seconds 2 "
                        f"--shrink-steps 1 --known {ROOT / 'tests' / 'regressions'}"],
                       capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    fig = json.loads((out / "soak.json").read_text())
    assert fig["kills_survived"] >= 1 and fig["pieces"][-1]["ended"] == "exit 0", fig
    assert (fig["lost"], fig["duplicated"], fig["torn"], fig["counts_lost"]) == (0, 0, 0, 0), fig["problems"]
    assert fig["report_equal"], fig["report_differences"]
    assert fig["programs"] == json.loads((out / "report" / "report.json").read_text())["totals"]["programs"] > 0
    assert fig["pieces"][-1]["resumed"] == fig["kills"]
    # the budget is the campaign's, not each piece's: a little over 21 s of campaign time in all
    assert 21 <= fig["campaign_seconds"] < 36
    assert "programs checked" in r.stdout and "soak passed" in r.stdout
