"""No lost results: a campaign killed with SIGKILL (at seeded, logged moments, one of them in the
middle of writing a record) or stopped with Ctrl-C resumes with `run --resume` and ends with
exactly the records of an uninterrupted run: nothing lost, nothing twice (by (hash, seed) and by
seq), every record written before a kill still there, byte for byte.

Rounds are seeded, so an uninterrupted reference run with as many jobs and the interrupted ones
check the same programs: with one job in the same order, with two jobs (two searcher processes,
records in arrival order) the same set with the same verdicts. (A round whose searcher shrank a
finding draws its remaining slots again after the shrink, and Hypothesis does not always draw
them alike in a process with another history: one and two jobs may check different programs
after an in-round shrink.)
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.engine.store import KILL_IN_WRITE_ENV, PAUSE_AFTER_ENV, PAUSED_MARK, Store, read_jsonl

REPO = Path(__file__).resolve().parents[1]
# A test-only pipeline whose gradients are always wrong: a finding on the first program, whatever the
# generator draws (tests/mutants.py, loaded as a plugin by the CLI and every worker process).
ARGS = [
    "--pipelines",
    "jax:mutant-perturb-gradient",
    "--max-stmts",
    "3",
    "--shrink-steps",
    "3",
    "--shrink-seconds",
    "600",
    "--budget",
    "600",
    "--max-examples",
    "9",
    "--round-size",
    "3",
    "--seed",
    "4",   # a seed whose first failing program comes after kill 1 (a resumed run has one to shrink)
    "--quiet",
]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "REMAT_CONFORMANCE_PLUGINS": "tests.mutants"}


def _cli(out, *extra, jobs=1):
    return [sys.executable, "-m", "conformance.cli", "run", "--out", str(out), *ARGS, "--jobs", str(jobs), *extra]


def _lines(out) -> list[bytes]:
    """Complete lines of results.jsonl (a torn last line is left out)."""
    p = Path(out) / "results.jsonl"
    if not p.exists():
        return []
    data = p.read_bytes()
    return data.split(b"\n")[:-1]


def _key(rec):
    return (rec["type"], rec.get("seq"), rec.get("hash"), rec.get("seed"), rec.get("signature"))


def _check_invariants(out):
    recs, warn = read_jsonl(Path(out) / "results.jsonl")
    assert warn is None, warn
    res = [r for r in recs if r["type"] == "result"]
    assert [r["seq"] for r in res] == list(range(len(res))), "seq must be 0..n-1, each once"
    assert len({(r["hash"], r["seed"]) for r in res}) == len(res), "a (hash, seed) was recorded twice"
    return recs


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _reference(tmp_path_factory, 1)


@pytest.fixture(scope="module")
def reference2(tmp_path_factory):
    return _reference(tmp_path_factory, 2)


def _reference(tmp_path_factory, jobs):
    out = tmp_path_factory.mktemp("ref") / "out"
    r = subprocess.run(_cli(out, *(["--no-isolate"] if jobs == 1 else []), jobs=jobs), capture_output=True,
                       text=True, timeout=300, env=ENV, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    recs = _check_invariants(out)
    assert sum(r["type"] == "result" for r in recs) >= 7   # 9 slots, a repeated program is checked once
    assert any(r["type"] == "finding" for r in recs), "the reference run should shrink a finding"
    assert sum(r["type"] == "round" for r in recs) == 3
    findings = json.loads((out / "findings.json").read_text())
    return recs, {f["signature"] for f in findings}, {_finding_key(f) for f in findings}


def _finding_key(f: dict) -> tuple:
    return (f["check"], f["pipeline"], f["reference"], f["error_type"] or "")


def _same_as_reference(recs, reference, jobs):
    ref_recs = reference[0]
    if jobs == 1:
        return [_key(x) for x in recs] == [_key(x) for x in ref_recs]
    # two searchers: records in arrival order; the same programs with the same verdicts
    def results(rs):
        return {(r["hash"], r["seed"]): sorted(map(tuple, r["verdicts"])) for r in rs if r["type"] == "result"}
    return results(recs) == results(ref_recs) and {r["round"] for r in recs if r["type"] == "round"} == {0, 1, 2}


def _resumed(out) -> int:
    try:
        return json.loads((Path(out) / "run.json").read_text()).get("resumed", 0)
    except (OSError, ValueError):
        return -1


def _shrink_pending(out) -> bool:
    """A new failure's result is written and its finding not yet: it is being shrunk."""
    recs = [json.loads(x) for x in _lines(out)]
    origins = {tuple(r["origin"]) for r in recs if r["type"] == "finding" and r.get("origin")}
    return any(r["type"] == "result" and r.get("new") and (r["hash"], r["seed"]) not in origins for r in recs)


def _wait_for(pred, timeout, proc=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.05)
    return False


def _alive(pid: int) -> bool:
    """Running (a zombie or a vanished process is not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _spawn_workers_of(pid) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes()
                ppid = int((d / "stat").read_text().split(")")[-1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if b"multiprocessing.spawn" in cmd and ppid == pid:
                out.append(int(d.name))
    return out


@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=pytest.mark.slow)])   # (two jobs: the slow tier)
def test_killed_campaign_resumes_with_nothing_lost_and_nothing_twice(tmp_path, reference, reference2, jobs):
    reference = reference if jobs == 1 else reference2
    ref_findings = reference[1]
    out = tmp_path / "out"
    rng = random.Random(20261129 + jobs)
    log = []
    # kill 1: SIGKILL in the middle of writing a record (the store's test hook writes half a line)
    at = rng.randint(2, 4)
    env = {**ENV, KILL_IN_WRITE_ENV: str(at)}
    r = subprocess.run(_cli(out, jobs=jobs), capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    log.append(f"kill 1: mid-write of append #{at}: rc={r.returncode}")
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    assert not (out / "results.jsonl").read_bytes().endswith(b"\n")   # really torn
    kept = _lines(out)
    assert len(kept) == at - 1
    # kill 2: SIGKILL while a new failure is being shrunk (its result is written, its finding not yet);
    # kill 3: SIGKILL after a seeded number of new records plus a seeded delay.
    for k in (2, 3):
        more, delay = rng.randint(1, 2), rng.uniform(0.0, 1.5)
        p = subprocess.Popen(_cli(out, "--resume", jobs=jobs), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=ENV, cwd=REPO)
        n0 = len(_lines(out))
        if k == 2:   # (after this resume has started: run.json says so)
            reached = _wait_for(lambda: _resumed(out) == k - 1 and _shrink_pending(out), 240, p)
            delay = rng.uniform(0.0, 0.5)
        else:
            reached = _wait_for(lambda: len(_lines(out)) >= n0 + more, 240, p)
        time.sleep(delay)
        workers = _spawn_workers_of(p.pid)
        p.kill()
        p.wait(10)
        log.append(f"kill {k}: after {len(_lines(out)) - n0} new records (+{delay:.2f}s; "
                   f"{'while shrinking' if k == 2 else 'records'} reached={reached}); {len(workers)} worker(s)")
        # the moment each kill is for was reached (not a kill after the run ended)
        assert reached, "\n".join(log)
        now = _lines(out)
        assert now[:len(kept)] == kept, "a record written before the kill changed or vanished"
        kept = now
        # orphaned workers notice that their supervisor died and exit
        assert _wait_for(lambda: not any(_alive(w) for w in workers), 5), workers
    # final resume to the end
    r = subprocess.run(_cli(out, "--resume", jobs=jobs), capture_output=True, text=True, timeout=300, env=ENV,
                       cwd=REPO)
    log.append(f"final resume: rc={r.returncode}")
    print("\n".join(log))
    assert r.returncode == 0, r.stderr[-3000:]
    assert _lines(out)[:len(kept)] == kept
    recs = _check_invariants(out)
    assert _same_as_reference(recs, reference, jobs), "\n".join(log)
    findings = json.loads((out / "findings.json").read_text())
    if jobs == 1:
        assert {f["signature"] for f in findings} == ref_findings
    else:
        # two searchers shrink in whichever order their programs arrive: the behaviours found
        # (finding keys) are the reference's, and every new failure of a result is covered by one
        assert {_finding_key(f) for f in findings} == reference[2], (findings, reference[2])
        covered = {_finding_key(f) for f in findings} | {tuple(k) for f in findings for k in f["reproduces"]}
        assert {tuple(k) for r in recs if r["type"] == "result" for k in r.get("new", [])} <= covered
    assert json.loads((out / "run.json").read_text())["resumed"] == 3


@pytest.mark.parametrize("jobs", [1, pytest.param(2, marks=pytest.mark.slow)])   # (two jobs: the slow tier)
def test_ctrl_c_stops_cleanly_and_resumes(tmp_path, reference, reference2, jobs):
    reference = reference if jobs == 1 else reference2
    out = tmp_path / "out"
    # the store pauses after its second record (a test hook), so the Ctrl-C lands mid-campaign
    # however loaded the machine: without it a short campaign may end before the signal
    # Ctrl-C reaches the campaign even where this test runs with SIGINT ignored (a background
    # job of a non-interactive shell: its children inherit the ignoring, and Python keeps it)
    p = subprocess.Popen(_cli(out, jobs=jobs), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**ENV, PAUSE_AFTER_ENV: "2"}, cwd=REPO,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert _wait_for(lambda: (out / PAUSED_MARK).exists(), 240, p)
    assert len(_lines(out)) == 2
    workers = _spawn_workers_of(p.pid)
    p.send_signal(signal.SIGINT)
    stdout, stderr = p.communicate(timeout=60)
    assert p.returncode == 130, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "interrupted" in stdout
    summary = (out / "summary.md").read_text()
    assert "interrupted" in summary and "--resume" in summary
    assert (out / "results.jsonl").read_bytes().endswith(b"\n")   # no half record after Ctrl-C
    _check_invariants(out)
    assert _wait_for(lambda: not any(_alive(w) for w in workers), 5), workers   # the executor closed them
    r = subprocess.run(_cli(out, "--resume", jobs=jobs), capture_output=True, text=True, timeout=300, env=ENV,
                       cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _same_as_reference(_check_invariants(out), reference, jobs)


@pytest.mark.slow
def test_shards_are_disjoint_and_together_the_unsharded_campaign(tmp_path):
    def run(out, *extra):
        r = subprocess.run(_cli(out, "--no-isolate", "--max-examples", "12", "--round-size", "4", *extra),
                           capture_output=True, text=True, timeout=300, env=ENV, cwd=REPO)
        assert r.returncode == 0, r.stderr[-3000:]
        return {(x["hash"], x["seed"]) for x in _check_invariants(out) if x["type"] == "result"}
    whole = run(tmp_path / "whole")
    a, b = run(tmp_path / "s0", "--shard", "0/2"), run(tmp_path / "s1", "--shard", "1/2")
    assert len(whole) >= 9 and a and b
    assert not a & b, "two shards checked the same program"
    assert a | b == whole


def test_store_drops_a_second_record_of_the_same_program_and_numbers_records(tmp_path):
    s = Store(tmp_path)
    rec = {"type": "result", "hash": "a" * 16, "seed": 1, "seq": 99}
    assert s.append_result(dict(rec)) is True
    assert s.append_result(dict(rec)) is False
    assert s.append_result({"type": "finding", "signature": "x"}) is True
    assert s.append_result({**rec, "seed": 2}) is True
    s.close()
    recs, _ = read_jsonl(tmp_path / "results.jsonl")
    assert [(r["type"], r.get("seq")) for r in recs] == [("result", 0), ("finding", None), ("result", 1)]


def test_torn_and_newline_less_last_lines(tmp_path):
    p = tmp_path / "results.jsonl"
    good = json.dumps({"type": "result", "hash": "h", "seed": 0, "seq": 0})
    # a complete record that lost only its newline is kept
    p.write_text(good)
    (tmp_path / "run.json").write_text("{}")
    s = Store(tmp_path, resume=True)
    s.append_result({"type": "result", "hash": "h", "seed": 1, "seq": 0})
    s.close()
    recs, warn = read_jsonl(p)
    assert warn is None and [r["seq"] for r in recs] == [0, 1]
    # a torn record is reported, then cut off before the next append
    with open(p, "ab") as f:
        f.write(b'{"type":"result","hash":"h","se')
    recs, warn = read_jsonl(p)
    assert len(recs) == 2 and "torn last line" in warn
    s = Store(tmp_path, resume=True)
    s.append_result({"type": "result", "hash": "h", "seed": 2, "seq": 0})
    s.close()
    recs, warn = read_jsonl(p)
    assert warn is None and [r["seed"] for r in recs] == [0, 1, 2]


def _camp(tmp_path):
    from conformance.engine.campaign import Campaign
    from conformance.engine.options import Options
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "run.json").write_text("{}")
    return Campaign(Options(pipelines=["ref:f64"]), Store(tmp_path, resume=True), executor=None, expectations=None)


def _res(seq, rnd, new=False):
    return {"type": "result", "seq": seq, "round": rnd, "hash": f"{seq:016x}", "seed": seq, "t": float(seq),
            "new": [["error", "p", "r", "E"]] if new else []}


def _fnd(seq):
    return {"type": "finding", "signature": "s", "origin": [f"{seq:016x}", seq]}


def test_restore_replays_unfinished_rounds_and_an_unfinished_shrink(tmp_path):
    c = _camp(tmp_path)
    c.restore([_res(0, 0), _res(1, 0, new=True), _fnd(1), _res(2, 0), {"type": "round", "round": 0},
               _res(3, 1), _res(4, 2)], [])
    assert c.rounds == 1 and c.checked == 5                 # round 1 unfinished: run it again
    assert list(c.pending_rounds())[:3] == [1, 2, 3]
    assert ("0000000000000001", 1) in c.seen                # its shrink finished
    c = _camp(tmp_path / "c")
    c.restore([_res(0, 0), _res(1, 0, new=True), _res(2, 1, new=True), _fnd(2)], [])   # killed while shrinking seq 1
    assert c.rounds == 0 and c.checked == 3
    assert ("0000000000000001", 1) not in c.seen and ("0000000000000000", 0) in c.seen
    assert ("0000000000000002", 2) in c.seen


def test_restore_keeps_the_shrinks_that_ended_of_a_program_killed_between_two(tmp_path):
    """A program with two new failures, killed after the first one's finding record: it is checked again (the
    second failure's shrink is pending) and the shrink that ended is handed to the searchers as done, by the
    failure it started from ("target": a residual difference's label may change while it shrinks; a record
    written before that field, by its key)."""
    k1, k2 = ["residuals", "p", "r", "saves less"], ["error", "q", "r", "E"]
    res = {**_res(1, 0), "new": [k1, k2]}
    done = {**_fnd(1), "key": ["residuals", "p", "r", "saves more"], "target": k1}
    c = _camp(tmp_path / "a")
    c.restore([_res(0, 0), res, done], [])
    h = ("0000000000000001", 1)
    assert h not in c.seen and c.done_shrinks == {(h, tuple(k1))}
    c = _camp(tmp_path / "b")   # both ended: nothing to replay
    c.restore([_res(0, 0), res, done, {**_fnd(1), "key": k2}], [])
    assert h in c.seen and c.done_shrinks == {(h, tuple(k1)), (h, tuple(k2))}


def test_restore_takes_a_finding_missing_from_findings_json_from_the_corpus(tmp_path):
    from conformance.engine.findings import CorpusEntry
    src = REPO / "tests" / "fixtures" / "base" / "corpus"
    entry = CorpusEntry.model_validate_json(next(iter(sorted(src.glob("*.json")))).read_text())
    sig = entry.finding.signature
    c = _camp(tmp_path)
    (tmp_path / "corpus" / "e.json").write_text(entry.model_dump_json())
    recs = [_res(0, 0, new=True), {"type": "finding", "signature": sig}]
    c.restore(recs, [])
    assert [f.signature for f in c.findings] == [sig]
    # the same behaviour already in findings.json (say, replaced by a smaller program): not added twice
    c = _camp(tmp_path)
    other = entry.finding.model_copy(update={"signature": sig + "+smaller"})
    c.restore(recs, [other.model_dump(mode="json")])
    assert [f.signature for f in c.findings] == [sig + "+smaller"]


def test_a_resume_counts_the_programs_of_known_behaviours_that_findings_json_had_not_saved(tmp_path, monkeypatch):
    """findings.json is rewritten for counts only every FINDINGS_EVERY seconds: a kill loses the counts
    of the programs since (a soak found a tracked behaviour at count 0 with a result naming it). Each
    finding says which result it counted last (`counted_seq`); a resume counts those after it, once."""
    from conformance.engine import campaign as cm
    from conformance.engine.campaign import Campaign
    from conformance.engine.options import Options
    from tests.test_dedup import KEY, _finding
    monkeypatch.setattr(cm, "FINDINGS_EVERY", 1e9)   # no rewrite for counts while the test runs
    known = [_finding().model_copy(update={"tracked": "a.json", "count": 7})]
    sig, out = known[0].signature, tmp_path / "o"

    def campaign(resume):
        c = Campaign(Options(pipelines=["jax:remat3"]), Store(out, resume=resume), executor=None, expectations=None)
        if resume:
            recs, _ = c.store.results()
            c.restore(recs, c.store.read_findings())
        c.track(known)
        return c

    def hit(c, i, label=KEY[3], twice=False):   # twice: against two references (counted twice)
        keys = [[*KEY[:3], label], [KEY[0], KEY[1], "ref:f64", label]][:1 + twice]
        c.handle({"ev": "result", "rec": {"type": "result", "hash": f"{i:016x}", "seed": i, "seq": -1,
                                         "known_signatures": [sig] * len(keys), "known_keys": keys,
                                         "features": ["checkpoint", "policy:nothing"]}})

    def counts(c):
        f = next(f for f in c.findings if f.signature == sig)
        return f.count, dict((k, s.count) for k, s in f.variants["labels"].items())

    c = campaign(False)
    c.store.write_run({})
    hit(c, 0)
    c._write_findings()                       # saved: count 1, counted through seq 0
    hit(c, 1, twice=True)
    hit(c, 2, "extra")                        # counted in memory, not saved
    assert counts(c) == (4, {KEY[3]: 4, "extra": 1})   # (the entry's own label counts once, as stamped)
    c.store.close()                           # killed: no final write
    assert json.loads((out / "findings.json").read_text())[0]["count"] == 1
    c = campaign(True)
    assert counts(c) == (4, {KEY[3]: 4, "extra": 1})
    c._write_findings()
    assert counts(campaign(True)) == (4, {KEY[3]: 4, "extra": 1})   # resumed again: nothing counted twice
    # killed before findings.json was ever written: every program that showed it is counted on resume
    (out / "findings.json").unlink()
    assert counts(campaign(True)) == (4, {KEY[3]: 4, "extra": 1})
    # a corpus entry does not carry the mark (a --known entry's count is the run's own)
    c._write_corpus(c.findings[0])
    entry = json.loads(next(c.store.corpus_files()).read_text())
    assert c.findings[0].counted_seq == 2 and "counted_seq" not in entry["finding"]
