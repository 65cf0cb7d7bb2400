"""The one aggregation of result records: what the campaign counts as it runs and what the report
counts from results.jsonl (grid of verdicts, programs per pipeline, checks that ran, feature
coverage, expectation hits, harness errors). summary.md and report.md render it alike."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


def _get(rec: Any, name: str, default):
    """A field of a result record: a dict as the campaign handles it, or a validated ResultRecord."""
    v = rec.get(name, default) if isinstance(rec, dict) else getattr(rec, name, default)
    return default if v is None else v


@dataclass
class Tally:
    programs: int = 0
    features: Counter = field(default_factory=Counter)                        # feature -> programs
    grid: dict[tuple[str, str], Counter] = field(default_factory=dict)   # (pipeline, check) -> statuses
    ran: Counter = field(default_factory=Counter)                             # pipeline -> programs it ran on
    check_ran: Counter = field(default_factory=Counter)   # (pipeline, check) -> programs where it had its inputs
    coverage: dict[tuple[str, str], list[int]] = field(default_factory=dict)   # (feature, pipeline) -> [n, failed]
    expectation_hits: dict[str, Counter] = field(default_factory=dict)        # entry id -> how it fired
    harness_errors: int = 0
    pipelines: list[str] = field(default_factory=list)                        # rows in the order first seen
    seconds: Counter = field(default_factory=Counter)           # pipeline -> seconds it ran (records that say)
    feature_seconds: Counter = field(default_factory=Counter)   # feature -> seconds of the programs that have it

    def add(self, rec: Any, row=lambda p: p) -> None:
        """Count one result record; `row` names a pipeline's row (a report's matrix cell)."""
        self.programs += 1
        feats = list(_get(rec, "features", []))
        self.features.update(feats)
        failed, had = Counter(), set()
        verdicts = list(_get(rec, "verdicts", []))
        for check, pipeline, _ref, status, _et in verdicts:
            r = self._row(row(pipeline))
            self.grid.setdefault((r, check), Counter())[status] += 1
            failed[r] += status == "fail"
            if status not in ("skipped", "unsupported"):
                had.add((r, check))
        self.check_ran.update(had)
        ran = _get(rec, "ran", None)
        if ran is None:    # (a record older than the `ran` field: the pipelines with a verdict)
            ran = sorted({v[1] for v in verdicts})
        for p in ran:
            r = self._row(row(p))
            self.ran[r] += 1
            for ft in feats:
                cell = self.coverage.setdefault((ft, r), [0, 0])
                cell[0] += 1
                cell[1] += failed[r] > 0
        secs = dict(_get(rec, "seconds", {}))
        for p, sec in secs.items():
            self.seconds[self._row(row(p))] += float(sec)
        total = sum(map(float, secs.values()))
        for ft in feats:
            self.feature_seconds[ft] += total
        for eid, how in dict(_get(rec, "expectations", {})).items():
            self.expectation_hits.setdefault(eid, Counter())[how] += 1
        if any(str(e).startswith("HarnessError") for e in dict(_get(rec, "errors", {})).values()):
            self.harness_errors += 1

    def _row(self, r: str) -> str:
        if r not in self.pipelines:
            self.pipelines.append(r)
        return r

    def merge(self, other: Tally) -> None:
        """Add another tally's counts (report inputs whose rows are already named by cell)."""
        self.programs += other.programs
        self.features.update(other.features)
        for k, c in other.grid.items():
            self.grid.setdefault(k, Counter()).update(c)
        self.ran.update(other.ran)
        self.check_ran.update(other.check_ran)
        for k, (n, f) in other.coverage.items():
            cell = self.coverage.setdefault(k, [0, 0])
            cell[0] += n
            cell[1] += f
        for eid, c in other.expectation_hits.items():
            self.expectation_hits.setdefault(eid, Counter()).update(c)
        self.harness_errors += other.harness_errors
        self.seconds.update(other.seconds)
        self.feature_seconds.update(other.feature_seconds)
        for r in other.pipelines:
            self._row(r)
