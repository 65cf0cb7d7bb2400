"""A campaign: the coordinator of one or more searchers (conformance.engine.search).

The coordinator owns the output directory (the only writer of results.jsonl, findings.json and
the corpus), the findings and the accounting. It hands seeded rounds to searchers: in this
process (jobs = 1) or in worker processes (jobs > 1, conformance.engine.parallel), whose events it
stores in arrival order. A round that is done is recorded as such; one that is not (stopped,
killed) is run again on resume, its checked programs skipped.
"""
from __future__ import annotations

import statistics
import time
from collections import Counter
from typing import Callable

from conformance import __version__
from conformance.engine.describe import (
    wants_issue,
)
from conformance.engine.findings import CorpusEntry, Finding
from conformance.engine.loading import corpus_entry_stem
from conformance.engine.options import Options
from conformance.engine.parallel import run_parallel
from conformance.engine.roots import record_variant, stamp, variant_values
from conformance.engine.search import Searcher, merge_finding, same_behaviour
from conformance.engine.store import Store
from conformance.engine.tally import Tally
from conformance.files import read_text
from oracles.expectations import Expectations, stale

FINDINGS_EVERY = 10.0   # seconds between rewrites of findings.json for counts alone (a resume recounts them)


class Campaign:
    def __init__(self, opts: Options, store: Store, executor, expectations: Expectations, progress=None,
                 versions: dict | None = None, issue_text=None):
        self.opts, self.store, self.executor, self.expectations = opts, store, executor, expectations
        # finding -> its issue.md (conformance.reporting.issue_text; the CLI passes it): none without
        self.issue_text = issue_text
        self.progress = progress or (lambda c: None)
        self.versions = versions or {}
        self.findings: list[Finding] = []
        self.tally = Tally()                                     # what the results counted (summary.md)
        self.shrink_runs = 0
        self.seen: set[tuple[str, int]] = set()
        # ((hash, seed), key) of every shrink a finding record holds: a replayed program does not shrink them again
        self.done_shrinks: set[tuple[tuple, tuple]] = set()
        self.shrinking: dict[int, dict] = {}                     # searcher -> its current shrink
        self.shrink_sizes: list[tuple[int, int]] = []            # (shrunk, original) per finding record
        self.done_rounds: set[int] = set()
        self._restored: list[dict] = []                          # resume: result records that showed a finding
        self.start = time.monotonic()
        self.elapsed_before = 0.0
        self.interrupted = False
        self.shrinks_per_key: Counter = Counter()
        self.on_finding: Callable[[Finding], None] | None = None   # jobs > 1: tell the other searchers
        self._findings_written = 0.0

    # -- known behaviours (`run --known`) ----------------------------------------------
    def track(self, known: list[Finding]) -> None:
        """Behaviours a regression corpus already tracks: a program failing one of their ways is
        counted under it instead of being shrunk, and a shrunk finding of one of their behaviours
        folds into it; neither is a new finding. Entries already tracked (a resume) are kept."""
        have = {f.tracked for f in self.findings if f.tracked}
        for f in known:
            if f.tracked not in have:
                self.findings.append(stamp(f.model_copy(update={"count": 0, "variants": {}, "counted_seq": None})))
        self._count_unsaved_hits()   # a resume: the programs that showed one before findings.json had it

    def new_findings(self) -> list[Finding]:
        return [f for f in self.findings if f.tracked is None]

    def tracked_seen(self) -> list[Finding]:
        return [f for f in self.findings if f.tracked is not None and f.count]

    def tracked_roots(self) -> dict[str, list[Finding]]:
        """The corpus roots seen, each with its variants seen (a root's variants are tracked one by one)."""
        out: dict[str, list[Finding]] = {}
        for f in self.tracked_seen():
            out.setdefault(f.tracked, []).append(f)
        return out

    @property
    def checked(self) -> int:
        return self.tally.programs

    # -- time --------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.start

    def over_budget(self, grace: float = 0.0) -> bool:
        if self.opts.stop_when is not None and self.opts.stop_when(self.new_findings()):
            return True
        return self.interrupted or self.elapsed() >= self.opts.budget + grace

    @property
    def rounds(self) -> int:
        """The first round not done yet."""
        r = 0
        while r in self.done_rounds:
            r += 1
        return r

    def pending_rounds(self):
        """Rounds still to run, in order: those not done, up to the campaign's last slot."""
        r = 0
        while r < self.opts.rounds():
            if r not in self.done_rounds:
                yield r
            r += 1

    # -- resume ------------------------------------------------------------------------
    def restore(self, results: list[dict], findings: list[dict]) -> None:
        """Rebuild state from what an interrupted campaign wrote.

        Done rounds are skipped; the others are run again, their checked programs skipped
        (`seen`). A program with a new failure whose shrink never finished (killed while
        shrinking: its result is written, no finding record names it and its key as origin) is
        left out of `seen`, so that the replayed round checks it again and shrinks what no finding
        covers yet; the store keeps its result record from being
        written twice. A finding that reached results.jsonl and the corpus but not findings.json
        is taken from its corpus entry."""
        # the failure each shrink started from (a record before "target" has the finding's key; "*": neither)
        shrunk = {(tuple(r["origin"]), tuple(t) if (t := r.get("target") or r.get("key")) else "*") for r in results
                  if r.get("type") == "finding" and r.get("origin")}
        self.done_shrinks |= {x for x in shrunk if x[1] != "*"}
        for r in results:
            t = r.get("type")
            if t == "result":
                h = (r["hash"], r["seed"])
                pending = (h, "*") not in shrunk and any((h, tuple(k)) not in shrunk for k in r.get("new", []))
                self._account(r, seen=not pending)
            elif t == "round" and isinstance(r.get("round"), int):
                self.done_rounds.add(r["round"])
            elif t == "finding":
                self._account_finding(r)
        self.findings = [Finding.model_validate(f) for f in findings]
        # findings.json is rewritten right after each finding record, so only the last one can
        # be missing from it (a kill in between); it is taken back from its corpus entry unless
        # a finding of the same behaviour is there already.
        last = next((r.get("signature") for r in reversed(results) if r.get("type") == "finding"), None)
        if last is not None and last not in {f.signature for f in self.findings}:
            for p in self.store.corpus_files():
                try:
                    e = CorpusEntry.model_validate_json(read_text(p))
                except ValueError:   # InputRefused, or an entry that does not validate
                    continue
                f = e.finding
                if f is not None and f.signature == last:
                    if not any(same_behaviour(g, f) for g in self.findings):
                        self.findings.append(f)
                    break
        self.elapsed_before = max([r.get("t", 0.0) for r in results] or [0.0])
        self._restored = [r for r in results if r.get("type") == "result" and r.get("known_signatures")]
        self._count_unsaved_hits()

    def _count_unsaved_hits(self) -> None:
        """Count under each finding the restored results that showed it and that its count in
        findings.json does not include (those after its `counted_seq`: findings.json is rewritten for
        counts only every FINDINGS_EVERY seconds, so a kill loses the counts of the last few programs).
        Again after `track` (a known behaviour findings.json did not have yet has none counted)."""
        by_sig = {f.signature: f for f in self.findings}
        for rec in self._restored:
            self._count_hits(rec, by_sig, unsaved=True)

    def _count_hits(self, rec: dict, by_sig: dict[str, Finding], unsaved: bool = False) -> None:
        """Count result `rec` under each finding it showed (its known_signatures), with the variant it
        showed; `unsaved`: only under those whose count does not include it yet."""
        keys = rec.get("known_keys") or [None] * len(rec.get("known_signatures", []))
        # (a program may show one behaviour twice, against two references: counted twice, and whether
        # it is counted already decided once)
        done = {s for s in rec.get("known_signatures", []) if unsaved and s in by_sig
                and by_sig[s].counted_seq is not None and rec["seq"] <= by_sig[s].counted_seq}
        for sig, key in zip(rec.get("known_signatures", []), keys):
            f = by_sig.get(sig)
            if f is None or sig in done:
                continue
            f.count += 1
            f.counted_seq = rec["seq"]
            if key:   # the variant this program showed of the known behaviour
                record_variant(f, variant_values([key[1]], key[3], rec.get("features", [])), rec["t"])

    def _account(self, r: dict, seen: bool = True) -> None:
        if seen:
            self.seen.add((r["hash"], r["seed"]))
        self.tally.add(r)
        for k in r.get("new", []):
            self.shrinks_per_key[tuple(k)] += 1

    def _account_finding(self, r: dict) -> None:
        if isinstance(r.get("size"), int) and isinstance(r.get("original_size"), int):
            self.shrink_sizes.append((r["size"], r["original_size"]))
        self.shrink_runs += r.get("shrink_steps", 0) if isinstance(r.get("shrink_steps"), int) else 0

    # -- events from searchers ---------------------------------------------------------
    def handle(self, ev: dict, searcher: int = 0) -> None:
        kind = ev["ev"]
        if kind == "result":
            rec = ev["rec"]
            rec["t"] = round(self.elapsed(), 3)
            if self.store.append_result(rec):    # False: already recorded (a replayed shrink)
                self._account(rec)
                self._count_hits(rec, {f.signature: f for f in self.findings})
                if rec.get("known_signatures") and time.monotonic() - self._findings_written >= FINDINGS_EVERY:
                    self._write_findings()   # counts only: at most every few seconds
            else:
                self.seen.add((rec["hash"], rec["seed"]))
        elif kind == "shrink":
            self.shrinking[searcher] = {**ev, "since": time.monotonic() - ev.get("seconds", 0.0)}
        elif kind == "finding":
            self.shrinking.pop(searcher, None)
            f = Finding.model_validate(ev["finding"])
            f.first_seen = round(self.elapsed(), 3)
            stamp(f)
            before = len(self.findings)
            kept, changed = merge_finding(self.findings, f)
            if len(self.findings) == before:   # a behaviour already found: its key is shrunk no more
                self.shrinks_per_key[f.key()] = max(self.shrinks_per_key[f.key()], self.opts.max_shrinks_per_key)
            if changed:
                self._write_corpus(kept)
            rec = {"type": "finding", "signature": kept.signature, "t": round(self.elapsed(), 3),
                   "origin": ev["origin"], "shrink_steps": ev["shrink_steps"], "size": ev["size"],
                   "original_size": ev["original_size"], "key": list(f.key()),
                   "target": ev["target"]}
            self.done_shrinks.add((tuple(ev["origin"]), tuple(rec["target"])))
            self.store.append_result(rec)
            self._account_finding(rec)
            self._write_findings()
            if self.on_finding is not None:
                self.on_finding(kept)
        elif kind == "round":
            self.done_rounds.add(ev["round"])
            self.store.append_result({"type": "round", "round": ev["round"], "t": round(self.elapsed(), 3)})
        self.progress(self)

    def _write_findings(self) -> None:
        self.store.write_findings([f.model_dump(mode="json") for f in self.findings])
        self._findings_written = time.monotonic()

    def _write_corpus(self, f: Finding) -> None:
        entry = CorpusEntry(program=f.program, inputs=f.inputs, finding=f, versions=f.versions)
        # named by check, pipeline and program: two findings of one program keep two entries
        stem = corpus_entry_stem(f.check, f.pipeline, f.program_hash)
        self.store.write_corpus(stem, entry.model_dump(mode="json", exclude={"finding": {"counted_seq"}}))
        if self.issue_text and wants_issue(f):   # bugs and questions: a documented or harness root has none
            self.store.write_issue(stem, self.issue_text(f))

    # -- the search --------------------------------------------------------------------
    def run(self) -> None:
        try:
            if self.opts.jobs > 1:
                run_parallel(self)
            else:
                self._run_here()
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            self.shrinking.clear()
            self._write_findings()

    def _run_here(self) -> None:
        searcher = Searcher(self.opts, self.executor, self.expectations, self.handle, self.findings, self.seen,
                            self.shrinks_per_key, lambda grace=0.0: self.over_budget(grace), self.versions,
                            done_shrinks=self.done_shrinks)
        for r in self.pending_rounds():
            if self.over_budget():
                break
            try:
                done = searcher.run_round(r)
            except KeyboardInterrupt:
                self.interrupted = True
                raise
            if not done:
                break

    # -- reporting -----------------------------------------------------------------------
    def stale_expectations(self) -> list[dict]:
        return stale(self.expectations, self.opts.pipelines, self.tally.expectation_hits)

    def facts(self) -> dict:
        """What only the campaign knows of itself (summary.md's head; the rest is the report's)."""
        el = self.elapsed()
        return {"harness": __version__, "seed": self.opts.seed, "device": self.opts.device,
                "budget": self.opts.budget, "elapsed": el, "jobs": self.opts.jobs,
                "shard": list(self.opts.shard), "interrupted": self.interrupted, "programs": self.checked,
                "rate": self.checked / el if el > 0 else 0.0, "shrink_runs": self.shrink_runs,
                "new_findings": len(self.new_findings()), "tracked_seen": len(self.tracked_roots()),
                "shrunk_sizes": shrink_distribution(self), "harness_errors": self.tally.harness_errors}


def shrink_distribution(c: Campaign) -> dict:
    sizes = sorted(s for s, _ in c.shrink_sizes)
    if not sizes:
        return {}
    q = statistics.quantiles(sizes, n=10, method="inclusive") if len(sizes) > 1 else [sizes[0]] * 9
    return {"shrinks": len(sizes), "median": statistics.median(sizes), "p90": q[8], "max": sizes[-1],
            "median_original": statistics.median(o for _, o in c.shrink_sizes)}
