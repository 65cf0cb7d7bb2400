"""Soak test of kill and resume (`make soak`, not part of `make test`).

    python tools/soak.py [--minutes M] [--kill-every A..B] [--seed S] [--out DIR] [--run-args "..."]

One campaign of M minutes of campaign time (`run --budget`), killed with SIGKILL (its whole process
group; its searchers and framework workers, in groups of their own, exit when their parent dies)
after a uniformly random A..B minutes each time and resumed with `run --resume` until it ends by
itself; then `remat-conformance report`. The campaign's budget is continued by a resume, not
restarted: a resumed run's clock starts at the `t` of the last record written (Campaign.restore),
and every piece is given the same `--budget`, the total; so M is the campaign's time, whatever the
number of kills. The wall time is longer by each piece's start-up and by what each kill cut short
after its last record (a shrink cut short is run again: a kill interval shorter than a shrink
never lets the campaign end, which the soak stops with an error).

Layout: DIR/campaign (the run directory), DIR/report (its report), DIR/soak.log (every piece's
output), DIR/soak.json (the figures below).

The audit (`audit`) reads the campaign's files against snapshots of results.jsonl taken after every
kill:
  programs checked  distinct (hash, seed) among the result records (a program and its input seed
                    identify a result: the store writes one per pair, numbered by `seq`);
  torn              lines of results.jsonl that are not a complete record (not a JSON object, or
                    missing or mistyped fields: the store's own record models), in the final file, or
                    anywhere but last in a snapshot (a kill may cut only the line being written, and
                    the store cuts that one off before its next append);
  duplicated        records written twice: a second result with the same (hash, seed), a second
                    result with the same seq, a second finding record with the same (origin, target),
                    a round recorded done twice;
  lost              records complete in a snapshot (after some kill) that the final file lacks or
                    holds changed (compared byte for byte), seq numbers missing from 0..n-1, and
                    files the results refer to that are missing (a finding's corpus entry);
  counts lost       program hits of a finding (results naming it in known_signatures, plus the finding
                    records that name it) that its count in findings.json, and so the report, does not
                    include.
And the report: the report of the soak (DIR/report/report.json) must equal the report built from a
fresh copy of the campaign directory, in another process with another string hash seed
(`report_differences` says which fields may differ and why), and its program total must be the
programs checked.

Exit status: 0 when lost, duplicated, torn and counts lost are 0 and the reports agree; 1 when not;
2 on a usage error, or when the campaign or the report failed (their output is in DIR/soak.log).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from conformance.engine.loading import corpus_entry_stem
from conformance.engine.options import positive, seed
from conformance.engine.store import CORPUS, FINDINGS, RESULTS, RUN, StoreError, check_record

ROOT = Path(__file__).resolve().parents[1]

# `run`'s exit statuses (conformance/cli/main.py): 0 the campaign ended (whatever it found), 1 it
# ended with new findings under --strict (without --strict, 1 is Python's own: a traceback); anything
# else (2 usage, 70 a harness bug, 130 interrupted) is a failure of the soak.
def finished(rc: int, run_args: list[str]) -> bool:
    return rc == 0 or (rc == 1 and "--strict" in run_args)


# Options the soak sets itself on every piece: --run-args may not give them.
OWN_OPTIONS = ("--budget", "--seed", "--out", "--resume", "--overwrite")
DEFAULT_RUN_ARGS = f"--known {ROOT / 'tests' / 'regressions'}"
# Pieces in a row that wrote no record before their kill: the kill interval is shorter than a
# piece's start-up, and the campaign would never end.
STALL_LIMIT = 5
# Seconds the processes of a killed piece outside its process group (searchers and framework
# workers sit in their own groups and exit when their parent dies) are given to exit by themselves.
ORPHAN_GRACE = 15.0
LISTED = 20   # problems listed by name in soak.json (each kind)


class SoakError(Exception):
    """The campaign or the report failed: the soak cannot judge the result."""


# -- options ---------------------------------------------------------------------------------
def kill_every(s: str) -> tuple[float, float]:
    """--kill-every A..B (minutes, 0 < A <= B), or A alone for A..A."""
    a, sep, b = s.partition("..")
    try:
        lo, hi = float(a), float(b if sep else a)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--kill-every must be A..B in minutes (e.g. 5..15), got {s!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo <= 0 or hi < lo:
        raise argparse.ArgumentTypeError(f"--kill-every must be A..B with 0 < A <= B (minutes), got {s!r}")
    return lo, hi


def run_args(s: str) -> list[str]:
    try:
        args = shlex.split(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--run-args: cannot split {s!r}: {e}") from None
    for a in args:
        name = a.split("=", 1)[0]
        if name in OWN_OPTIONS:
            raise argparse.ArgumentTypeError(f"--run-args may not give {name}: the soak sets "
                                             f"{', '.join(OWN_OPTIONS)} itself (--minutes, --seed, --out)")
    return args


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tools/soak.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=positive(float, "--minutes"), default=120.0,
                   help="the campaign's length: its --budget, summed over its resumed pieces (default 120)")
    p.add_argument("--kill-every", type=kill_every, default=(5.0, 15.0), metavar="A..B",
                   help="minutes between kills, drawn uniformly from [A, B] (default 5..15)")
    p.add_argument("--seed", type=seed, default=None,
                   help="the campaign's seed and the kill times' (default: drawn, and printed)")
    p.add_argument("--out", default=str(ROOT / "reports" / "soak"),
                   help="the soak's directory (default reports/soak): campaign/, report/, soak.json, soak.log")
    p.add_argument("--run-args", type=run_args, default=run_args(DEFAULT_RUN_ARGS), metavar='"..."',
                   help=f"more options of `remat-conformance run`, one string (--run-args=\"--jobs 1\" where it is "
                        f"one option; default: {DEFAULT_RUN_ARGS!r}, the default campaign of `make run`)")
    return p.parse_args(argv)


# -- reading results.jsonl -------------------------------------------------------------------
def identity(rec: dict) -> tuple:
    """What a record is the record of: a result its program and input seed; a finding the result it
    was shrunk from and its key; a round its number."""
    t = rec.get("type")
    if t == "result":
        return ("result", rec.get("hash"), rec.get("seed"))
    if t == "finding":
        return ("finding", json.dumps(rec.get("origin")), json.dumps(rec.get("key")), rec.get("signature"))
    if t == "round":
        return ("round", rec.get("round"))
    return ("other", json.dumps(rec, sort_keys=True))


@dataclass
class Lines:
    """results.jsonl read line by line: the complete records and the lines that are not."""
    records: list[tuple[int, bytes, dict]] = field(default_factory=list)   # (line number, raw, record)
    torn: list[tuple[int, str]] = field(default_factory=list)              # (line number, why)
    torn_last: bool = False   # the last line is torn and unterminated (a kill in the middle of a write)


def read_lines(path: Path) -> Lines:
    out = Lines()
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return out
    lines = data.split(b"\n")
    for k, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        last_unterminated = k == len(lines)   # (the store keeps a complete last record without its newline)
        try:
            rec = json.loads(raw)
            check_record(rec, f"line {k}")
        except (ValueError, RecursionError, StoreError) as e:   # (StoreError is a ValueError)
            why = str(e) if isinstance(e, StoreError) else "not valid JSON"
            out.torn.append((k, why))
            out.torn_last = last_unterminated
            continue
        out.records.append((k, raw, rec))
    return out


@dataclass
class Snapshot:
    """results.jsonl after a kill: the complete records (identity, digest of the line) and its torn lines."""
    records: set[tuple[tuple, str]]
    torn_inside: list[tuple[int, str]]   # torn lines other than an unterminated last one
    torn_last: bool
    lines: int


def _digest(raw: bytes) -> str:
    return hashlib.sha1(raw.rstrip(b"\r")).hexdigest()


def snapshot(run_dir: Path) -> Snapshot:
    ls = read_lines(Path(run_dir) / RESULTS)
    inside = [t for t in ls.torn if not (ls.torn_last and t is ls.torn[-1])]
    return Snapshot({(identity(r), _digest(raw)) for _, raw, r in ls.records}, inside, ls.torn_last,
                    len(ls.records))


# -- the audit -------------------------------------------------------------------------------
@dataclass
class Audit:
    programs: int = 0
    records: int = 0
    torn: int = 0
    duplicated: int = 0
    lost: int = 0
    counts_lost: int = 0
    torn_at_kills: int = 0   # kills that cut a line in the middle (expected; the store cuts it off)
    problems: dict[str, list[str]] = field(default_factory=dict)   # kind -> the first LISTED, described

    def note(self, kind: str, what: str) -> None:
        lst = self.problems.setdefault(kind, [])
        if len(lst) < LISTED:
            lst.append(what)


def audit(run_dir: str | Path, snapshots: list[Snapshot] = ()) -> Audit:
    """Count what the campaign in `run_dir` checked, and what it tore, wrote twice or lost since the
    `snapshots` of its results.jsonl (taken after each kill)."""
    run_dir = Path(run_dir)
    a = Audit()
    final = read_lines(run_dir / RESULTS)
    # torn: in the final file anywhere; in a snapshot anywhere but an unterminated last line
    a.torn = len(final.torn)
    for k, why in final.torn:
        a.note("torn", f"{RESULTS} line {k}: {why}")
    for i, s in enumerate(snapshots):
        a.torn += len(s.torn_inside)
        a.torn_at_kills += s.torn_last
        for k, why in s.torn_inside:
            a.note("torn", f"snapshot {i + 1}: line {k}: {why}")
    recs = [r for _, _, r in final.records]
    a.records = len(recs)
    # duplicated
    results = [r for r in recs if r["type"] == "result"]
    keys = Counter((r["hash"], r["seed"]) for r in results)
    seqs = Counter(r["seq"] for r in results)
    findings = Counter((json.dumps(r.get("origin")), json.dumps(r.get("target") or r.get("key"))) for r in recs
                       if r["type"] == "finding" and r.get("origin") is not None)
    rounds = Counter(r["round"] for r in recs if r["type"] == "round")
    for what, c in (("result (hash, seed)", keys), ("result seq", seqs), ("finding (origin, target)", findings),
                    ("round", rounds)):
        for k, n in c.items():
            if n > 1:
                a.duplicated += n - 1
                a.note("duplicated", f"{what} {k}: {n} records")
    a.programs = len(keys)
    # lost: complete in a snapshot, not in the final file as it was
    have = {(identity(r), _digest(raw)) for _, raw, r in final.records}
    gone: set = set()
    ids = {x[0] for x in have}
    for i, s in enumerate(snapshots):
        for item in s.records - have:
            if item not in gone:
                gone.add(item)
                a.note("lost", f"snapshot {i + 1}: {item[0]} ({'changed' if item[0] in ids else 'gone'})")
    a.lost += len(gone)
    n = len(results)
    missing_seq = sorted(set(range(max(seqs, default=-1) + 1)) - set(seqs))
    a.lost += len(missing_seq)
    for q in missing_seq[:LISTED]:
        a.note("lost", f"seq {q}: no result record has it (0..{max(seqs)} written, {n} records)")
    # files the results refer to: each finding of this campaign has its corpus entry
    found = _findings(run_dir, a)
    for f in found:
        if f.get("tracked") is None and isinstance(f.get("program_hash"), str):
            stem = corpus_entry_stem(f.get("check", ""), f.get("pipeline", ""), f["program_hash"])
            if not (run_dir / CORPUS / f"{stem}.json").is_file():
                a.lost += 1
                a.note("lost", f"{CORPUS}/{stem}.json: the corpus entry of finding {f.get('signature')} is missing")
    # counts: the findings of a signature count every program that showed it (a corpus root's variants
    # may share one), and every finding record naming it (a shrunk program folded into it)
    hits = Counter(s for r in results for s in r.get("known_signatures", []))
    hits.update(r.get("signature") for r in recs if r["type"] == "finding")
    counted: Counter = Counter()
    names: dict[str, str] = {}
    for f in found:
        counted[f.get("signature")] += f.get("count") if isinstance(f.get("count"), int) else 0
        names.setdefault(f.get("signature"), f.get("tracked") or f.get("signature"))
    for sig in counted:
        short = hits[sig] - counted[sig]
        if short > 0:
            a.counts_lost += short
            a.note("counts lost", f"{names[sig]}: {sig}: count {counted[sig]}, {hits[sig]} records name it")
    return a


def _findings(run_dir: Path, a: Audit) -> list[dict]:
    p = run_dir / FINDINGS
    if not p.exists():
        return []
    try:
        obj = json.loads(p.read_text())
    except (OSError, ValueError) as e:
        a.torn += 1
        a.note("torn", f"{FINDINGS}: {e}")
        return []
    if not isinstance(obj, list):
        a.torn += 1
        a.note("torn", f"{FINDINGS}: not a list")
        return []
    return [f for f in obj if isinstance(f, dict)]


# -- the report ------------------------------------------------------------------------------
# Fields of report.json that may differ between two reports of the same results:
#   generated         when the report was built (time.strftime at build time);
#   the run directory the report was given, wherever a string holds it: inputs[].dir and findings[].run_dir
#                     (the path of the directory read), warnings that name a file in it. Each such string
#                     has the directory replaced by <RUN_DIR> before comparing; everything else must be equal.
TIME_FIELDS = ("generated",)
RUN_DIR = "<RUN_DIR>"


def _normalised(obj, run_dir: str):
    if isinstance(obj, dict):
        return {k: _normalised(v, run_dir) for k, v in obj.items() if k not in TIME_FIELDS}
    if isinstance(obj, list):
        return [_normalised(v, run_dir) for v in obj]
    if isinstance(obj, str):
        return obj.replace(run_dir, RUN_DIR)
    return obj


def report_differences(a: dict, a_dir: str, b: dict, b_dir: str) -> list[str]:
    """JSON paths where two report.json objects of the same results differ, beyond TIME_FIELDS and the
    run directory's path."""
    out: list[str] = []

    def walk(x, y, path):
        if len(out) >= LISTED:
            return
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                if k not in x or k not in y:
                    out.append(f"{path}.{k}: only in {'the soak' if k in x else 'the copy'}'s report")
                else:
                    walk(x[k], y[k], f"{path}.{k}")
        elif isinstance(x, list) and isinstance(y, list):
            if len(x) != len(y):
                out.append(f"{path}: {len(x)} items in the soak's report, {len(y)} in the copy's")
            for i, (u, v) in enumerate(zip(x, y)):
                walk(u, v, f"{path}[{i}]")
        elif x != y:
            out.append(f"{path}: {json.dumps(x)[:80]} != {json.dumps(y)[:80]}")
    walk(_normalised(a, a_dir), _normalised(b, b_dir), "report")
    return out


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "conformance.cli", *args]


def build_report(run_dir: Path, out: Path, log, hash_seed: str) -> dict:
    """`remat-conformance report RUN_DIR --out OUT` with the string hash seed given: the two reports compared are
    built with different ones, so that an order that follows it (a set's) shows as a difference."""
    r = subprocess.run(_cli("report", str(run_dir), "--out", str(out)), stdout=log, stderr=subprocess.STDOUT,
                       cwd=ROOT, env={**os.environ, "PYTHONHASHSEED": hash_seed})
    if r.returncode != 0:
        raise SoakError(f"`remat-conformance report {run_dir}` exited {r.returncode} (output in {log.name})")
    return json.loads((out / "report.json").read_text())


# -- processes -------------------------------------------------------------------------------
def _proc_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, start time) of every process."""
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                f = (d / "stat").read_text().rsplit(")", 1)[1].split()
                out[int(d.name)] = (int(f[1]), f[19])
            except (OSError, ValueError, IndexError):
                continue
    return out


def descendants(pid: int) -> dict[int, str]:
    """The processes below `pid` (pid -> start time, which tells a reused pid apart)."""
    table = _proc_table()
    kids: dict[int, list[int]] = {}
    for p, (pp, _) in table.items():
        kids.setdefault(pp, []).append(p)
    out, todo = {}, [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in out:
                out[c] = table[c][1]
                todo.append(c)
    return out


def _running(pid: int, start: str) -> bool:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return False
    return f[19] == start and f[0] != "Z"


def kill_piece(p: subprocess.Popen) -> int:
    """SIGKILL the piece's process group; wait for its processes elsewhere (searchers, framework workers:
    their own groups) to exit by themselves. Returns how many had not after ORPHAN_GRACE (then killed)."""
    below = descendants(p.pid)
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()
    deadline = time.monotonic() + ORPHAN_GRACE
    while time.monotonic() < deadline and any(_running(q, s) for q, s in below.items()):
        time.sleep(0.2)
    left = [q for q, s in below.items() if _running(q, s)]
    for q in left:
        try:
            os.kill(q, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left)


# -- the soak --------------------------------------------------------------------------------
@dataclass
class Piece:
    how: str            # fresh | resume
    seconds: float      # wall time
    ended: str          # killed | exit N
    records: int        # complete records of results.jsonl after it
    resumed: int | None = None   # run.json's count of resumes


def soak(args) -> dict:
    out = Path(args.out)
    camp, rep = out / "campaign", out / "report"
    out.mkdir(parents=True, exist_ok=True)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2 ** 32)
    rng = random.Random(seed)
    budget = args.minutes * 60.0
    lo, hi = args.kill_every
    base = _cli("run", "--budget", f"{budget:g}", "--seed", str(seed), "--out", str(camp), "--quiet", *args.run_args)
    print(f"soak: {args.minutes:g} min campaign (--budget {budget:g}), kills every {lo:g}..{hi:g} min, seed {seed}; "
          f"{out}/", flush=True)
    t0 = time.monotonic()
    pieces: list[Piece] = []
    snaps: list[Snapshot] = []
    orphans = stalls = 0
    with open(out / "soak.log", "w") as log:
        while True:
            how = "resume" if pieces and (camp / RUN).is_file() else "fresh"
            cmd = base + (["--resume"] if how == "resume" else ["--overwrite"])
            log.write(f"\n== piece {len(pieces) + 1} ({how}): {shlex.join(cmd)}\n")
            log.flush()
            before = snaps[-1].lines if snaps else 0
            start = time.monotonic()
            delay = rng.uniform(lo, hi) * 60.0
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = p.wait(timeout=delay)
                ended = f"exit {rc}"
            except subprocess.TimeoutExpired:
                orphans += kill_piece(p)
                rc, ended = None, "killed"
            finally:
                if p.returncode is None:   # the soak itself was stopped: leave nothing running
                    kill_piece(p)
            snaps.append(snapshot(camp))
            piece = Piece(how, round(time.monotonic() - start, 1), ended, snaps[-1].lines, _resumed(camp))
            pieces.append(piece)
            print(f"  piece {len(pieces)}: {how}, {ended} after {piece.seconds:.0f}s; {piece.records} records "
                  f"(+{piece.records - before})", flush=True)
            if rc is None:
                stalls = stalls + 1 if piece.records <= before else 0
                if stalls >= STALL_LIMIT:
                    raise SoakError(f"{stalls} pieces in a row were killed before writing a record: --kill-every "
                                    f"{lo:g}..{hi:g} minutes is shorter than a piece's start-up or than a shrink "
                                    f"(which writes no record until it ends: --shrink-seconds in --run-args)")
                continue
            if finished(rc, args.run_args):
                break
            raise SoakError(f"piece {len(pieces)} ({how}) exited {rc}, not 0 (output in {log.name})")
        kills = sum(x.ended == "killed" for x in pieces)
        a = audit(camp, snaps[:-1])   # (the last snapshot is the final file)
        report = build_report(camp, rep, log, "1")
        with tempfile.TemporaryDirectory(prefix="soak-copy-") as tmp:
            copy = Path(tmp) / camp.name
            shutil.copytree(camp, copy)
            fresh = build_report(copy, Path(tmp) / rep.name, log, "2")
            diffs = report_differences(report, str(camp), fresh, str(copy))
    if report.get("totals", {}).get("programs") != a.programs:
        diffs.append(f"report.totals.programs: {report.get('totals', {}).get('programs')} in the report, "
                     f"{a.programs} programs checked in {RESULTS}")
    wall = time.monotonic() - t0
    return {"minutes": args.minutes, "kill_every": [lo, hi], "seed": seed, "run_args": args.run_args,
            "programs": a.programs, "records": a.records, "kills": kills, "kills_survived": kills,
            "kills_mid_write": a.torn_at_kills, "orphans_killed": orphans, "lost": a.lost,
            "duplicated": a.duplicated, "torn": a.torn, "counts_lost": a.counts_lost,
            "report_equal": not diffs, "report_differences": diffs, "problems": a.problems,
            "campaign_seconds": _campaign_seconds(camp), "wall_seconds": round(wall, 1),
            "pieces": [asdict(x) for x in pieces]}


def _resumed(camp: Path) -> int | None:
    try:
        return json.loads((camp / RUN).read_text()).get("resumed", 0)
    except (OSError, ValueError, AttributeError):
        return None


def _campaign_seconds(camp: Path) -> float:
    """The campaign's time as it counts it: the last record's `t`."""
    return max((r.get("t", 0.0) for _, _, r in read_lines(camp / RESULTS).records), default=0.0)


def passed(fig: dict) -> bool:
    return (fig["lost"] == 0 and fig["duplicated"] == 0 and fig["torn"] == 0 and fig["counts_lost"] == 0
            and fig["report_equal"])


def table(fig: dict) -> str:
    rows = [("programs checked", fig["programs"]),
            ("kills survived", f"{fig['kills_survived']} ({fig['kills_mid_write']} mid-write, "
                               f"{fig['orphans_killed']} orphans killed)"),
            ("results lost", fig["lost"]), ("results duplicated", fig["duplicated"]), ("results torn", fig["torn"]),
            ("counts lost", fig["counts_lost"]), ("report equal", "yes" if fig["report_equal"] else "NO"),
            ("campaign time", f"{fig['campaign_seconds']:.0f}s of --budget {fig['minutes'] * 60:g}s"),
            ("wall time", f"{fig['wall_seconds']:.0f}s")]
    w = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{w}}  {v}" for k, v in rows)


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        fig = soak(args)
    except SoakError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    (Path(args.out) / "soak.json").write_text(json.dumps(fig, indent=1) + "\n")
    print(table(fig))
    for kind, items in fig["problems"].items():
        print(f"{kind}:")
        for x in items:
            print(f"  {x}")
    for d in fig["report_differences"]:
        print(f"report differs: {d}")
    ok = passed(fig)
    print(f"soak {'passed' if ok else 'FAILED'}; wrote {Path(args.out) / 'soak.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
