"""A campaign that keeps finding.

Hypothesis generates programs; each is run through every pipeline and judged. The first
unexpected verdict whose behaviour is not yet known becomes the shrink target: Hypothesis
shrinks while (check, pipeline, reference, error type) still holds, running only the
pipelines that verdict needs. The shrunk program is signed, recorded and from then on
treated as known, and the search goes on with a fresh round until the budget is spent.
"""
from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hseed

from conformance import __version__
from conformance.files import read_text
from conformance.findings import CorpusEntry, Finding, make_finding
from conformance.ir import Program
from conformance.store import Store
from generators.programs import Config, cases, input_values
from oracles.expectations import Expectations
from conformance import pipelines as registry
from conformance.observation import residual_digest
from oracles.expectations import stale
from oracles.judge import judge
from conformance.verdict import CHECK_RANK, CHECKS, Verdict

RESULTS_SCHEMA = 1


class _Found(Exception):
    """Raised inside the Hypothesis test to make it shrink the current target."""


def _found():
    # One raise site: Hypothesis tells failures apart by where they were raised.
    raise _Found()


class BudgetExhausted(Exception):
    pass


@dataclass
class Options:
    pipelines: list[str]
    budget: float = 240.0
    max_examples: int = 1000
    seed: int = 0
    device: str = "cpu"
    shrink_seconds: float = 60.0
    shrink_steps: int = 250
    round_size: int = 40
    max_shrinks_per_key: int = 3
    generator: Config = field(default_factory=Config)
    # Stop early once this returns True for the findings so far (tests use it).
    stop_when: Callable[[list], bool] | None = None


@dataclass
class Target:
    key: tuple
    program: Program
    seed: int
    verdict: Verdict
    observations: dict
    original_size: int
    started: float
    steps: int = 0


def needed_pipelines(key: tuple, all_names: list[str]) -> list[str]:
    """The pipelines one verdict needs: its own, the value references, the residual reference."""
    _, pipeline, reference, _ = key
    names = [registry.value_reference()]
    b = registry.baseline_of(pipeline)
    if b and b in all_names:
        names.append(b)
    names += [r for r, _ in registry.comparisons(pipeline, set(all_names))]
    if reference in all_names:
        names.append(reference)
    names.append(pipeline)
    return list(dict.fromkeys(n for n in names if n in all_names))


def replay_pipelines(key: tuple) -> list[str]:
    """The pipelines a corpus entry's replay runs: the references and what its verdict needs."""
    return list(dict.fromkeys(list(registry.REFERENCES) + needed_pipelines(key, registry.run_set([key[1]]))))


class Campaign:
    def __init__(self, opts: Options, store: Store, executor, expectations: Expectations, progress=None,
                 versions: dict | None = None):
        self.opts, self.store, self.executor, self.expectations = opts, store, executor, expectations
        self.progress = progress or (lambda c: None)
        self.versions = versions or {}
        self.findings: list[Finding] = []
        self.checked = 0
        self.shrink_runs = 0
        self.seen: set[tuple[str, int]] = set()
        self.features: Counter = Counter()
        self.grid: dict[tuple[str, str], Counter] = {}
        self.expectation_hits: dict[str, Counter] = {}
        self.target: Target | None = None
        self.start = time.monotonic()
        self.elapsed_before = 0.0
        self.interrupted = False
        self.rounds = 0
        self.harness_errors = 0
        self.shrinks_per_key: Counter = Counter()

    # -- time --------------------------------------------------------------------------
    def elapsed(self) -> float:
        return self.elapsed_before + time.monotonic() - self.start

    def over_budget(self) -> bool:
        if self.opts.stop_when is not None and self.opts.stop_when(self.findings):
            return True
        return self.elapsed() >= self.opts.budget or self.checked >= self.opts.max_examples

    # -- resume ------------------------------------------------------------------------
    def restore(self, results: list[dict], findings: list[dict]) -> None:
        """Rebuild state from what an interrupted campaign wrote.

        Rounds are seeded, so the last round is run again unless it ended with a finding: the
        programs it already checked are skipped (`seen`), the rest are checked now. A new failure
        whose shrink never finished (the process was killed while shrinking) is left out of
        `seen`, so that the replayed round finds and shrinks it again; the store keeps its
        result record from being written twice. A finding that reached results.jsonl and the
        corpus but not findings.json is taken from its corpus entry."""
        pending, done_rounds, last_round = None, set(), None
        for r in results:
            if r.get("type") == "result":
                last_round = r.get("round", 0)
                pending = r if r.get("new") else None
            elif r.get("type") == "finding" and last_round is not None:
                done_rounds.add(last_round)
                pending = None
        for r in results:
            if r.get("type") == "result" and r is not pending:
                self._account(r)
        self.findings = [Finding.model_validate(f) for f in findings]
        # findings.json is rewritten right after each finding record, so only the last one can
        # be missing from it (a kill in between); it is taken back from its corpus entry unless
        # a finding of the same behaviour is there already.
        last = next((r.get("signature") for r in reversed(results) if r.get("type") == "finding"), None)
        if last is not None and last not in {f.signature for f in self.findings}:
            from conformance.findings import CorpusEntry
            for p in self.store.corpus_files():
                try:
                    e = CorpusEntry.model_validate_json(read_text(p))
                except ValueError:   # InputRefused, or an entry that does not validate
                    continue
                f = e.finding
                if f is not None and f.signature == last and not any(
                        g.key() == f.key() and (g.core_features() <= f.core_features()
                                                or f.core_features() <= g.core_features()) for g in self.findings):
                    self.findings.append(f)
                    break
        self.rounds = 0 if last_round is None else last_round + (1 if last_round in done_rounds else 0)
        self.elapsed_before = max([r.get("t", 0.0) for r in results] or [0.0])

    def _account(self, r: dict) -> None:
        self.checked += 1
        self.seen.add((r["hash"], r["seed"]))
        self.features.update(r.get("features", []))
        for check, pipeline, _ref, status, _et in r.get("verdicts", []):
            self.grid.setdefault((pipeline, check), Counter())[status] += 1
        for k in r.get("new", []):
            self.shrinks_per_key[tuple(k)] += 1
        for eid, how in r.get("expectations", {}).items():
            self.expectation_hits.setdefault(eid, Counter())[how] += 1

    # -- the search --------------------------------------------------------------------
    def known(self, v: Verdict, prog: Program) -> Finding | None:
        """The finding this failure is an instance of: same key, and the program has every
        feature the shrunk program's behaviour needed. Once a key has been shrunk
        `max_shrinks_per_key` times, further programs with that key are counted under the
        finding whose features they share most instead of being shrunk again."""
        feats = prog.features()
        same = [f for f in self.findings if f.key() == v.key()]
        for f in same:
            if f.core_features() <= feats:
                return f
        if same and self.shrinks_per_key.get(v.key(), 0) >= self.opts.max_shrinks_per_key:
            return max(same, key=lambda f: (len(f.core_features() & feats), -len(f.core_features())))
        return None

    def evaluate(self, prog: Program, seed: int, names: list[str]):
        inputs = input_values(prog, seed)
        obs = self.executor.run(prog, inputs, names)
        return inputs, obs, judge(prog, obs, self.expectations, self.opts.device)

    def _search_step(self, prog: Program, seed: int, round_no: int):
        h = (prog.content_hash(), seed)
        if h in self.seen:
            return
        inputs, obs, j = self.evaluate(prog, seed, self.opts.pipelines)
        failures = j.failures()
        sigs, new = [], []
        for v in sorted(failures, key=lambda v: (CHECK_RANK[v.check], v.pipeline)):
            f = self.known(v, prog)
            if f is not None:
                f.count += 1
                sigs.append(f.signature)
            else:
                new.append(v)
        rec = {
            "type": "result", "schema_version": RESULTS_SCHEMA, "seq": self.checked, "round": round_no,
            "hash": h[0], "seed": seed, "size": prog.size(), "features": sorted(prog.features()),
            "status": "fail" if failures else ("expected" if any(v.status == "expected" for v in j.verdicts) else "pass"),
            "verdicts": [[v.check, v.pipeline, v.reference, v.status, v.error_type or ""] for v in j.verdicts],
            "known_signatures": sigs, "new": [list(v.key()) for v in new[:1]],
            "expectations": j.expectation_hits, "t": round(self.elapsed(), 3),
            "errors": {n: o.error.type for n, o in obs.items() if o.error is not None},
        }
        self.store.append_result(rec)
        self._account(rec)
        if any(o.error and o.error.type.startswith("HarnessError") for o in obs.values()):
            self.harness_errors += 1
        if sigs:
            self.store.write_findings([f.model_dump(mode="json") for f in self.findings])
        self.progress(self)
        if new:
            v = new[0]
            self.shrinks_per_key[v.key()] += 1
            self.target = Target(key=v.key(), program=prog, seed=seed, verdict=v, observations=obs,
                                 original_size=prog.size(), started=time.monotonic())
            _found()

    def _shrink_step(self, prog: Program, seed: int):
        t = self.target
        if (t.steps >= self.opts.shrink_steps or time.monotonic() - t.started >= self.opts.shrink_seconds
                or self.elapsed() >= self.opts.budget + self.opts.shrink_seconds):
            return
        t.steps += 1
        self.shrink_runs += 1
        _, obs, j = self.evaluate(prog, seed, needed_pipelines(t.key, self.opts.pipelines))
        for v in j.failures():
            if v.key() == t.key:
                if prog.size() <= t.program.size():
                    t.program, t.seed, t.verdict, t.observations = prog, seed, v, obs
                _found()

    def _test(self, round_no: int):
        def body(case):
            prog, seed = case
            if self.target is not None:
                return self._shrink_step(prog, seed)
            if self.over_budget() or self.interrupted:
                return
            return self._search_step(prog, seed, round_no)
        return body

    def run_round(self, round_no: int) -> None:
        s = settings(max_examples=self.opts.round_size, deadline=None, database=None,
                     phases=(Phase.generate, Phase.shrink), report_multiple_bugs=False,
                     suppress_health_check=list(HealthCheck), print_blob=False, verbosity=Verbosity.quiet)
        test = hseed(self.opts.seed * 100003 + round_no)(s(given(cases(self.opts.generator))(self._test(round_no))))
        try:
            test()
        except KeyboardInterrupt:
            self.interrupted = True
            raise
        except BaseException:
            # With a target, this is _Found after shrinking (or Hypothesis's flaky-replay error
            # once the shrink budget made later steps pass): the finding is recorded below.
            # Without one, it is a harness bug: let it out.
            if self.target is None:
                raise
        finally:
            if self.target is not None:
                self._record_target()
                self.target = None

    def _record_target(self) -> None:
        t = self.target
        inputs = input_values(t.program, t.seed)
        obs0 = t.observations.get(t.key[1])
        f = make_finding(t.verdict, t.program, inputs, obs0.versions if obs0 else self.versions,
                         obs0.flags if obs0 else {}, self.opts.device)
        f.shrunk = True
        f.shrink_steps = t.steps
        f.original_size = t.original_size
        f.first_seen = round(self.elapsed(), 3)
        f.detail = {**f.detail, "observations": _obs_digest(t.observations, t.key[1])}
        for g in self.findings:
            # Same behaviour shrunk to the same or a nested feature set: one finding, the
            # smaller program kept.
            if g.key() == f.key() and (g.core_features() <= f.core_features() or f.core_features() <= g.core_features()):
                g.count += 1
                if f.core_features() < g.core_features():
                    f.count = g.count
                    self.findings[self.findings.index(g)] = f
                    self._write_corpus(f)
                break
        else:
            self.findings.append(f)
            self._write_corpus(f)
        self.store.append_result({"type": "finding", "signature": f.signature, "t": round(self.elapsed(), 3),
                                  "shrink_steps": t.steps, "size": f.size, "original_size": t.original_size})
        self.store.write_findings([x.model_dump(mode="json") for x in self.findings])
        self.progress(self)

    def _write_corpus(self, f: Finding) -> None:
        entry = CorpusEntry(program=f.program, inputs=f.inputs, finding=f, versions=f.versions)
        self.store.write_corpus(f.program_hash, entry.model_dump(mode="json"))

    def run(self) -> None:
        try:
            while not self.over_budget() and not self.interrupted:
                self.run_round(self.rounds)
                self.rounds += 1
        except KeyboardInterrupt:
            self.interrupted = True
        finally:
            self.store.write_findings([f.model_dump(mode="json") for f in self.findings])

    # -- reporting -----------------------------------------------------------------------
    def stale_expectations(self) -> list[dict]:
        return stale(self.expectations, self.opts.pipelines, self.expectation_hits)


def _obs_digest(obs: dict, pipeline: str) -> dict:
    """Short, readable per-pipeline facts for the finding's detail."""
    out = {}
    for n, o in obs.items():
        d = {}
        if o.error:
            d["error"] = f"{o.error.type} ({o.error.stage}): {o.error.message[:300]}"
        if o.residuals is not None:
            d.update(residual_digest(o.residuals))
        if o.custom_rules:
            d["custom_rules"] = {k: v.model_dump() for k, v in o.custom_rules.items()}
        if o.grads is not None and n in (pipeline, registry.value_reference()):
            d["grads"] = o.grads
        out[n] = d
    return out


def summary_markdown(c: Campaign, run_info: dict) -> str:
    lines = ["# remat-conformance campaign summary", ""]
    lines.append(f"- harness {__version__}; seed {c.opts.seed}; device {c.opts.device}; "
                 f"budget {c.opts.budget:.0f}s; elapsed {c.elapsed():.0f}s"
                 + ("; **interrupted** (resumable with --resume)" if c.interrupted else ""))
    lines.append(f"- versions: " + ", ".join(f"{k} {v}" for k, v in sorted(run_info.get("versions", {}).items())))
    lines.append(f"- pipelines: {', '.join(c.opts.pipelines)}")
    lines.append(f"- programs checked: **{c.checked}**; shrink runs: {c.shrink_runs}; "
                 f"distinct findings: **{len(c.findings)}**")
    if c.harness_errors:
        lines.append(f"- harness errors: {c.harness_errors} (bugs of this tool: see results.jsonl)")
    lines += ["", "## Findings", ""]
    if not c.findings:
        lines.append("None.")
    else:
        lines.append("| # | check | pipeline | reference | error type | programs | shrunk size | features |")
        lines.append("|---|---|---|---|---|---|---|---|")
        ranked = sorted(c.findings, key=lambda f: (CHECK_RANK.get(f.check, 9), -f.count))
        for i, f in enumerate(ranked, 1):
            lines.append(f"| {i} | {f.check} | `{f.pipeline}` | `{f.reference}` | {f.error_type or '-'} | {f.count} | "
                         f"{f.size} (from {f.original_size}) | {', '.join(f.features)} |")
    lines += ["", "## Status by pipeline and check", ""]
    checks = [c for c in CHECKS if c not in ("crash", "timeout")]
    lines.append("| pipeline | " + " | ".join(checks) + " |")
    lines.append("|---|" + "---|" * len(checks))
    for p in c.opts.pipelines:
        cells = []
        for ch in checks:
            cnt = c.grid.get((p, ch), Counter())
            cells.append(" ".join(f"{k}:{v}" for k, v in sorted(cnt.items())) or "-")
        lines.append(f"| `{p}` | " + " | ".join(cells) + " |")
    lines += ["", "## Feature coverage (programs checked)", ""]
    lines.append(", ".join(f"{k}: {v}" for k, v in sorted(c.features.items())) or "none")
    stale = c.stale_expectations()
    lines += ["", "## Stale expectations", ""]
    lines += [f"- `{s['id']}`: {s['why']}" for s in stale] or ["None."]
    return "\n".join(lines) + "\n"


def make_progress(stream=None):
    """A progress callback: a live line on a terminal, a line every few programs elsewhere."""
    stream = stream or sys.stderr
    tty = stream.isatty()
    last = {"n": -1}

    def cb(c: Campaign):
        msg = (f"[{c.elapsed():6.1f}s/{c.opts.budget:.0f}s] programs {c.checked}  findings {len(c.findings)}"
               f"  features {len(c.features)}" + (f"  shrinking {c.target.key[0]}:{c.target.key[1]}" if c.target else ""))
        if tty:
            stream.write("\r" + msg.ljust(110))
            stream.flush()
        elif c.checked // 10 != last["n"] // 10 or c.target is None and len(c.findings) != last.get("f"):
            stream.write(msg + "\n")
            stream.flush()
        last["n"] = c.checked
        last["f"] = len(c.findings)
    return cb


