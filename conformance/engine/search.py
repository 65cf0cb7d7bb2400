"""The searching side of a campaign: seeded Hypothesis rounds of generated programs.

A round is the first `round_size` examples of Hypothesis seeded with (seed, round): the same
programs whoever runs it, whatever was found before. Each program slot is run through the
pipelines its time shares allow and judged. The first unexpected verdict whose behaviour is not
yet known becomes the shrink target: Hypothesis shrinks while (check, pipeline, reference, error
type) still holds, running only the pipelines that verdict needs (a program evaluated once in a
shrink is not evaluated again), then tries IR reductions of what it left (conformance.engine.reduce:
dead statements, outputs, the simplest policy kind). The program's other new behaviours are
shrunk after it, each from the same program, unless the first finding already covers them. The
shrunk program is replayed on every pipeline (the pipelines it also fails on are its siblings: one
root behaviour), emitted as a finding, and the round is run again from its start, the programs
already checked skipped, until every slot of it is checked. A round is therefore done (all its
slots checked) or not (stopped); nothing in between is lost: the slots checked are recorded, the others are checked on
resume.

Shards: a slot belongs to shard i of N when its program's identity (hash, seed) says so; every
shard generates every round and checks only its own programs, so shards are disjoint and their
union is the unsharded campaign.

A Searcher talks to its coordinator (conformance.engine.campaign.Campaign) only through `emit(event)`:
  {"ev": "result", "rec": {...}}        a checked program (the coordinator numbers and stores it)
  {"ev": "shrink", "key", "size", "steps", "seconds"}   shrinking, now and then
  {"ev": "finding", "finding": {...}, "origin": [hash, seed]}
  {"ev": "round", "round": r}           round r is done
"""
from __future__ import annotations

import dataclasses
import hashlib
import statistics
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hseed

from conformance.engine.findings import Finding, detail_digest, error_root, make_finding, residuals_digest
from conformance.engine.reduce import candidates
from conformance.engine.roots import (
    CAUSE_SEP,
    CAUSED_CHECKS,
    DIRECTIONS,
    RAISING_CHECKS,
    RULE_CHECKS,
    covering_finding,
    departs_from_policy,
    departure_keys,
    evidence_root,
    expectation_root,
    family_key,
    labels_seen,
    merge_variants,
    nested_roots,
    new_causes,
    option_free,
    pipelines_seen,
    raise_family,
    read_as_root,
    residual_causes,
    root_features,
    root_key,
    root_label,
    rule_variant,
)
from conformance.engine.store import ResultRecord
from conformance.ir.observation import residual_digest
from conformance.ir.program import Program
from conformance.ir.verdict import CHECK_RANK, PAIRWISE_CHECKS, Verdict
from conformance.pipelines import registry
from generators.programs import Config, cases, input_values
from generators.swarm import focus_features
from oracles.judge import judge
from oracles.residual_causes import core, narrows

# Shrink time of a target relative to --shrink-seconds, by the family of its pipeline.
SHRINK_TIME_FACTOR = {"torch:compile": 3.0}
# Evaluations of IR reductions after Hypothesis's shrink (conformance.engine.reduce), per target. The
# reductions, not Hypothesis, make findings small: measured on default campaigns (seed 0, 240 s),
# 1 Hypothesis step then these gave sizes median 4 / max 11 from programs of up to 26 statements,
# the same as 40 Hypothesis steps first, in half the shrink time.
REDUCE_STEPS = 64


class _Found(Exception):
    """Raised inside the Hypothesis test to make it shrink the current target."""


def _found():
    # One raise site: Hypothesis tells failures apart by where they were raised.
    raise _Found()


class _ShrinkDone(BaseException):
    """Raised inside the Hypothesis test when the target's shrink budget is spent: not an
    Exception, so Hypothesis stops shrinking at once (instead of generating candidates that
    are no longer evaluated) and the target keeps the smallest failing program found."""


def round_seed(seed: int, r: int) -> int:
    return seed * 100003 + r


def shard_of(prog_hash: str, seed: int, n: int) -> int:
    """The shard a program slot belongs to: a stable function of the program's identity."""
    if n <= 1:
        return 0
    d = hashlib.sha256(f"{prog_hash}:{seed}".encode()).digest()
    return int.from_bytes(d[:8], "big") % n


def needed_pipelines(key: tuple, all_names: list[str]) -> list[str]:
    """The pipelines one verdict needs: its own and its reference; for an error against the
    expectations also the value reference; for value, status-equivalence and policy verdicts the
    value reference, the baseline and the same-semantics references."""
    check, pipeline, reference, _ = key
    if check in PAIRWISE_CHECKS and reference in all_names and pipeline in all_names:
        return [reference, pipeline]
    if check == "error" and reference == "expectations":
        # a pipeline's own error verdict reads its run, the expectations and the value reference
        # (which, failing the same way, carries the finding); status differences with the other
        # references fold into it (oracles.judge) and do not change its key
        return list(dict.fromkeys(n for n in (registry.value_reference(), pipeline) if n in all_names))
    names = [registry.value_reference()]
    b = registry.baseline_of(pipeline)
    if b and b in all_names:
        names.append(b)
    names += [r for r, _ in registry.comparisons(pipeline, set(all_names))]
    if reference in all_names:
        names.append(reference)
    names.append(pipeline)
    return list(dict.fromkeys(n for n in names if n in all_names))


def sibling_pipelines(key: tuple, all_names: list[str]) -> list[str]:
    """The pipelines a shrunk program is replayed on for its siblings (sibling_keys: the same check failing in
    one pipeline family, or raising one error type): those of the finding's framework, with the references
    their verdicts read. Another framework's pipelines are its own code: an error type they share with the
    finding is a coincidence of names, not the same behaviour (and their compiles were most of a replay)."""
    fw, known = registry.framework_of(key[1]), set(registry.known_names())
    keep = set(registry.run_set([n for n in all_names if n in known and registry.framework_of(n) == fw]))
    return [n for n in all_names if n in keep or n == key[1]]


def replay_pipelines(key: tuple) -> list[str]:
    """The pipelines a corpus entry's replay runs: the references and what its verdict needs,
    its own reference included (jax:remat2:jit, say, which a :jit rival's run set lacks)."""
    rivals = [key[1]] + ([key[2]] if key[2] in registry.known_names() and not registry.is_reference(key[2]) else [])
    return list(dict.fromkeys(list(registry.REFERENCES) + needed_pipelines(key, registry.run_set(rivals))))


def sibling_keys(j, key: tuple) -> list[list[str]]:
    """The keys other than `key` that judgement `j` fails of the same check and error type (the
    pipelines a finding's program also fails the same way), or of the same root family under
    another label (a wrong gradient against another reference), or of the policy check of a pairwise residual
    difference's pipeline that departs from its policy on the difference's values (roots.departure_keys): the
    finding's `reproduces`."""
    fam = family_key(*key[:3])
    mine = next((v for v in j.failures() if v.key() == tuple(key)), None)
    departing = departure_keys(key[0], tuple(key), residual_causes(key[0], mine.detail) if mine else [], j.failures())
    same = [list(v.key()) for v in j.failures() if v.check == key[0] and v.key() != tuple(key)
            and ((v.error_type or "") == key[3] or family_key(*v.key()[:3]) == fam)]
    return sorted(same + [k for k in departing if k not in same])


def closest(findings: list[Finding], feats: set) -> Finding:
    """The finding whose shrunk program's core features a program with `feats` shares most."""
    return max(findings, key=lambda f: (len(f.core_features() & feats), -len(f.core_features())))


def known_finding(findings: list[Finding], key: tuple, feats: set, failing: set,
                  root: str | None = None) -> Finding | None:
    """The finding a failing verdict `key` of a program (with features `feats`, failing the keys
    `failing`) is an instance of: one of the same key whose shrunk program's core features the
    program has all of, or one that lists `key` among its siblings when the program also fails
    that finding's own key and has its core features; for an error verdict raising `root`
    (findings.error_root), one of the same key that raised the same, or an error finding of the
    same check, reference and error type that raised the same and whose key the program also fails
    (one raise, reached through another policy or pipeline spelling); for a residual difference in
    direction `root` (roots.residual_direction), one of its family that departs the same way; a trace count of several
    counters is known when each counter's is. A residual, effect-count or custom-rule difference whose evidence names
    its causes (roots.evidence_root) is known only when each cause is (roots.covering_finding), whatever its key.
    None: a behaviour not known yet."""
    if key[0] in CAUSED_CHECKS and root is not None and root not in DIRECTIONS:
        return covering_finding(findings, key, root.split(CAUSE_SEP))
    def raised_alike(f: Finding) -> bool:   # an error raising something else is another cause (jax 0.11.2's
        # "Accumulator aval mismatch" beside a tracked "Cannot lower jaxpr with effects", one construct)
        return key[0] != "error" or root is None or error_root(f.detail) in (None, root)
    for f in findings:
        if f.key() == tuple(key) and f.core_features() <= feats and raised_alike(f):
            return f
    for f in findings:
        if list(key) in f.reproduces and f.key() in failing and f.core_features() <= feats and raised_alike(f):
            return f
    if root is not None:
        raising = [f for f in findings if (f.check, f.reference, f.error_type) == (key[0], key[2], key[3])
                   and error_root(f.detail) == root]
        for f in raising:
            if f.pipeline == key[1]:
                return f
        # the same raise where the finding was seen, or in its pipeline's raise family (an explorer alone on a
        # program: its twin did not run)
        for f in raising:
            if key[1] in pipelines_seen(f) or raise_family(key[1]) == raise_family(f.pipeline):
                return f
        for f in raising:
            if f.key() in failing:
                return f
    # The root level: a finding of the same check and pipeline and reference families (twins:
    # eager and :jit, remat3 and remat3+cvjp3...) whose root features the program has, and that
    # has seen this label (a label seen for the first time is shrunk once, then folds in by its
    # root); an error, one that raised the same in the family; a residual difference, one that
    # departs the same way (roots.evidence_root); a rule check, one seen under the same rule
    # implementation (roots.rule_variant: remat3's own custom_vjp is not custom_vjp3's).
    fam = family_key(*key[:3])
    for f in findings:
        if family_key(f.check, f.pipeline, f.reference) != fam:
            continue
        if root is not None:   # the same raise, or a residual difference in the same direction
            if evidence_root(f.check, f.pipeline, f.reference, f.detail) == root:
                return f
        elif (key[0] != "error" and root_label(key[0], key[3]) in {root_label(key[0], x) for x in labels_seen(f)}
              and set(root_features(f.features)) <= read_as_root(feats)
              and any(k[0] == key[0] and k[1] in pipelines_seen(f) for k in failing | {tuple(key)})
              and (key[0] not in RULE_CHECKS or rule_variant(key[1]) in set(map(rule_variant, pipelines_seen(f))))):
            return f
    if key[0] == "trace_count" and "+" in key[3]:
        # several counters grew (bwd_calls+fwd_traces+primal_traces): known when known findings
        # of some of those counters each (bwd_calls+fwd_traces, primal_traces) cover them all
        counters = set(key[3].split("+"))
        covering = [f for f in findings if f.key()[:3] == tuple(key[:3]) and set(f.key()[3].split("+")) <= counters
                    and set(f.key()[3].split("+")) != counters and f.core_features() <= feats]
        if covering and set().union(*(f.key()[3].split("+") for f in covering)) == counters:
            first = key[3].split("+")[0]   # the finding of the first counter stands for it
            return next(f for f in covering if first in f.key()[3].split("+"))
    # an option (:sharded, :shard-map, :reentrant ...) is not the cause where the pipeline without it fails the
    # same verdict on the same program: known when that verdict is (remat3's wrong gradient, seen through :sharded)
    plain = (key[0], option_free(key[1]), *key[2:])
    if plain != tuple(key) and plain in failing:
        return known_finding(findings, plain, feats, failing, root)
    return None


def same_behaviour(f: Finding, g: Finding) -> bool:
    """One root behaviour: the same root (conformance.engine.roots.root_key: check, pipeline and reference
    families, and what the shrunk program cannot lose, or the same raise), or the same key shrunk
    to the same or nested feature sets, or raising the same error (findings.error_root), or each
    one's shrunk program fails the other's verdict (siblings: pipeline variants). A residual difference
    with causes is one behaviour with `f` (the finding already held) when `f` holds each of `g`'s causes."""
    cf, cg = residual_causes(f.check, f.detail), residual_causes(g.check, g.detail)
    if cf and cg:   # (by their cores: a cause shown at second order is the cause a first-order program shows)
        if family_key(f.check, f.pipeline, f.reference) != family_key(g.check, g.pipeline, g.reference):
            return departs_from_policy(f, g) or departs_from_policy(g, f)
        return set(map(core, cg)) <= set(map(core, cf))
    if f.root and f.root == g.root or nested_roots(f, g):
        return True
    nested = f.core_features() <= g.core_features() or g.core_features() <= f.core_features()
    if f.key() == g.key():
        ef, eg = error_root(f.detail), error_root(g.detail)
        if ef is not None and eg is not None:   # two raises are two causes, however alike the programs
            return ef == eg
        return nested
    return list(g.key()) in f.reproduces and list(f.key()) in g.reproduces


def merge_finding(findings: list[Finding], f: Finding) -> tuple[Finding, bool]:
    """Add a shrunk finding, or fold it into the finding of its behaviour (the smaller program of
    one key is kept). Returns (the finding that stands for it, whether the list changed)."""
    for k, g in enumerate(findings):
        if not same_behaviour(g, f):
            continue
        g.count += 1
        merge_variants(g, f)
        for key in f.reproduces + ([list(f.key())] if f.key() != g.key() else []):
            if key not in g.reproduces:
                g.reproduces.append(key)
        if (g.key() == f.key() and f.core_features() < g.core_features()
                and set(map(core, residual_causes(f.check, f.detail)))
                == set(map(core, residual_causes(g.check, g.detail)))):
            # g's list already holds f's keys; a tracked behaviour stays tracked, and so do its
            # title and class
            f.count, f.reproduces, f.tracked, f.variants = g.count, g.reproduces, g.tracked, g.variants
            f.title, f.triage = g.title or f.title, g.triage if g.tracked else f.triage
            if g.first_seen is not None and (f.first_seen is None or g.first_seen < f.first_seen):
                f.first_seen = g.first_seen   # the behaviour was first seen then, whichever program now shows it
            findings[k] = f
            return f, True
        return g, False
    findings.append(f)
    return f, True


class Coverage:
    """Coverage-directed rounds: round r focuses on the features (generators.swarm.FOCUS, and the
    dtypes) that rounds 0..r-1 did not generate, so that rare constructs occur in every campaign
    of a few rounds. What a round generates is found by generating it alone (no pipelines: ~5 ms a
    program), which is what its checked run generates: the same seed, the same examples. So round
    r's programs depend only on (seed, r, config), whoever runs it, whatever was found before, in
    any shard and on resume."""

    def __init__(self, opts):
        self.opts = opts
        self._generated: dict[int, set[str]] = {}

    @property
    def features(self) -> list[str]:
        return focus_features(self.opts.config)

    def config(self, r: int) -> Config:
        """The generator's config of round r."""
        return replace(self.opts.config, focus=self.focus(r))

    def focus(self, r: int) -> tuple[str, ...]:
        if r == 0 or not self.features:
            return ()
        seen = set().union(*(self.generated(q) for q in range(r)))
        return tuple(f for f in self.features if f not in seen)

    def generated(self, r: int) -> set[str]:
        """The features of the programs round r generates."""
        if r not in self._generated:
            feats: set[str] = set()
            s = round_settings(self.opts, r, phases=(Phase.generate,))
            hseed(round_seed(self.opts.seed, r))(
                s(given(cases(self.config(r)))(lambda c: feats.update(c[0].features())))
            )()
            self._generated[r] = feats
        return self._generated[r]


def round_settings(opts, r: int, phases=(Phase.generate, Phase.shrink)) -> settings:
    """Hypothesis settings of round r: its slots (the campaign's last round may be cut short by its
    slot limit)."""
    n = min(opts.round_size, opts.max_examples - r * opts.round_size)
    return settings(max_examples=max(1, n), deadline=None, database=None, phases=phases,
                    report_multiple_bugs=False, suppress_health_check=list(HealthCheck), print_blob=False,
                    verbosity=Verbosity.quiet)


# The explorers (registry.EXPLORERS: every rival outside the core set, in a default campaign) together spend
# about EXPLORE_SHARE of the searcher's time (or programs), split by weight: (1 + EXPLORE_FIND_WEIGHT x the new
# findings a pipeline showed) / (1 + what it spent, in EXPLORE_UNIT), so that a pipeline finding new causes gets
# more and one that found nothing for long gets less; each share stays within [EXPLORE_FLOOR x the even split,
# EXPLORE_CEILING] (none starved, none eating the run). At most EXPLORERS_PER_PROGRAM run on one program, those
# furthest under their share first: the first programs spread them evenly. An explorer runs again only when its
# share holds what it has spent plus its mean cost per program (inductor's seconds per compile would overshoot it),
# and none runs while the explorers together are over EXPLORE_SHARE (first runs included: a backend's warm-up
# is seconds). With several searchers, each explores its own part of the explorers (Shares `part`).
EXPLORE_SHARE = 0.1
EXPLORE_CEILING = 0.05
EXPLORE_FLOOR = 0.25
EXPLORE_FIND_WEIGHT = 4.0
EXPLORE_UNIT = {"time": 60.0, "programs": 20.0}
EXPLORERS_PER_PROGRAM = 1


def explorer_part(explorers: list[str], i: int, n: int) -> list[str]:
    """The explorers searcher i of n explores: the pipelines of one warm-up (registry.warm_up_of: inductor's, export's)
    all in one searcher's part, so that a backend's first compile is paid once per campaign; the warm-ups dealt out
    largest first, each to the part holding the fewest explorers so far. Fewer explorers than searchers: every
    searcher explores them all."""
    if len(explorers) < n:
        return list(explorers)
    groups: dict[str, list[str]] = {}
    for name in explorers:
        groups.setdefault(registry.warm_up_of(name), []).append(name)
    parts: list[list[str]] = [[] for _ in range(n)]
    for group in sorted(groups.values(), key=len, reverse=True):   # (stable: ties keep declaration order)
        min(parts, key=len).extend(group)
    return [name for name in explorers if name in parts[i]]


class Shares:
    """Shares per pipeline family (registry.FAMILY_SHARES by default): a family may spend at most
    `share` of the searcher's checking time (every pipeline's seconds on the programs checked, not the wall
    clock: a shrink's minutes buy no family more programs) on its pipelines (by="time"), or run on at most `share`
    of the programs checked (by="programs": the same programs for one seed on any machine). Within
    its share it runs on a program when it is under half its share, or when the program has a
    feature the family has covered least (at most the median count): expensive pipelines cover
    features evenly. A pipeline with a declared share (registry.Share: a twin whose verdicts
    follow from a cheaper sibling) runs on that fraction of the programs, chosen by content hash;
    `shares` may name such a pipeline to change its fraction. With `explore`, the explorers among
    `names` run on adaptive shares of their own (EXPLORE_SHARE; `found` credits a pipeline's new findings)."""

    def __init__(self, names: list[str], shares: dict[str, float] | None = None, by: str = "time",
                 explore: bool = False, part: tuple[int, int] = (0, 1)):
        self.shares = {**registry.FAMILY_SHARES, **(shares or {})}
        self.family = {n: registry.family_of(n) for n in names}
        self.by = by
        self.spent: Counter = Counter()
        self.covered: dict[str, Counter] = {}
        self.skipped: Counter = Counter()
        self.checking = 0.0   # seconds every pipeline spent on the programs checked (the clock of time shares)
        self.programs = 0
        # searcher i of n explores its part (explorer_part): each explorer's first runs (its imports, its backend's
        # warm-up) are paid once per campaign, not once per searcher
        explorers = [n for n in names if n in registry.EXPLORERS] if explore else []
        self.explorers = explorer_part(explorers, *part)
        self.others_explore = set(explorers) - set(self.explorers)   # another searcher's part
        self.explorer_spent: Counter = Counter()
        self.explorer_runs: Counter = Counter()
        self.found: Counter = Counter()
        self.family_cost: Counter = Counter()   # the core pipelines' cost per family, and their runs
        self.family_runs: Counter = Counter()

    def explorer_shares(self) -> dict[str, float]:
        """Each explorer's share now (EXPLORE_SHARE split by weight, within its floor and ceiling)."""
        if not self.explorers:
            return {}
        unit = EXPLORE_UNIT[self.by]
        w = {n: (1 + EXPLORE_FIND_WEIGHT * self.found[n]) / (1 + self.explorer_spent[n] / unit)
             for n in self.explorers}
        total, even = sum(w.values()), EXPLORE_SHARE / len(self.explorers)
        return {n: min(EXPLORE_CEILING, max(EXPLORE_FLOOR * even, EXPLORE_SHARE * w[n] / total)) for n in w}

    def _explore(self, elapsed: float) -> list[str]:
        if sum(self.explorer_spent.values()) > EXPLORE_SHARE * elapsed:   # first runs too stay within the whole share
            return []
        shares = self.explorer_shares()
        def next_cost(n):   # what it has spent, and what one more program is likely to cost it
            runs = self.explorer_runs[n]
            return self.explorer_spent[n] * (1 + 1 / runs) if runs else 0.0

        def first_cost(n):   # before its first run: what its family's core pipelines cost a program so far
            fam = self.family[n]
            return self.family_cost[fam] / self.family_runs[fam] if self.family_runs[fam] else 0.0
        # furthest under its share first; among those never run, the cheapest family first (an eager explorer's
        # first run is milliseconds, a compiled one's seconds: the whole share is not spent before the cheap run)
        under = [(self.explorer_spent[n] / (shares[n] * elapsed), 0.0 if self.explorer_runs[n] else first_cost(n), k, n)
                 for k, n in enumerate(self.explorers) if next_cost(n) <= shares[n] * elapsed]
        return [n for *_, n in sorted(under)[:EXPLORERS_PER_PROGRAM]]

    def select(self, prog: Program, names: list[str]) -> list[str]:
        elapsed = max(self.checking, 1.0) if self.by == "time" else self.programs + 1
        feats = prog.features()
        rivals = []
        for n in names:
            if (registry.is_reference(n) or registry.role_of(n) == registry.REFERENCE or n in self.explorers
                    or n in self.others_explore):
                continue
            fam = self.family[n]
            share = self.shares.get(fam, 1.0)
            if share >= 1.0:
                rivals.append(n)
                continue
            cap = share * elapsed
            cov = self.covered.get(fam, Counter())
            median = statistics.median(cov.values()) if cov else 0
            if self.spent[fam] <= 0.5 * cap or (self.spent[fam] <= cap and any(cov[f] <= median for f in feats)):
                rivals.append(n)
            else:
                self.skipped[n] += 1
        rivals += self._explore(elapsed)
        keep = set(registry.run_set(rivals))
        run = [n for n in names if n in keep]
        dtypes = {dt for _, dt in prog.types().values()}
        out = [n for n in run if registry.on_share(n, prog.content_hash(), dtypes, run, self.shares.get(n))]
        self.skipped.update(n for n in run if n not in out)
        return out

    def account(self, prog: Program, obs: dict) -> None:
        fams = {self.family[n] for n in obs if n in self.family}
        self.programs += 1
        for n, o in obs.items():
            self.checking += sum(o.timings.values())
            cost = sum(o.timings.values()) if self.by == "time" else 1
            if n in self.explorers:
                self.explorer_spent[n] += cost
                self.explorer_runs[n] += 1
            elif n in self.family and self.by == "time":
                self.spent[self.family[n]] += cost
            if n in self.family and n not in self.explorers:
                self.family_cost[self.family[n]] += cost
                self.family_runs[self.family[n]] += 1
        for fam in fams:
            if self.by == "programs":
                self.spent[fam] += 1
            self.covered.setdefault(fam, Counter()).update(prog.features())


# A shrink keeps the constructs behind its failure: a candidate with a construct (roots.root_features) the original
# program lacked shows another cause, not a smaller program of this one (a wrong gradient of a ref written in a
# region, shrunk by Hypothesis into checkpoint_name_fwd's, was folded under that root). Exempt: what deleting
# statements leaves behind (an input no longer differentiated, a random value no longer read, regions now adjacent),
# and the plain spelling of a loop the original spelled otherwise.
SHRINK_MAY_ADD = frozenset({"nondiff_input", "dead_random", "sequential_regions"})
SHRINK_READS_AS = {"fori_loop": "scan", "while_loop": "scan", "vmap": "scan"}


def shrink_constructs(features) -> frozenset[str]:
    """The constructs of a program's features as a shrink compares them (spellings read as their construct)."""
    fs = read_as_root(features)
    return frozenset(root_features(fs)) | {SHRINK_READS_AS[f] for f in fs if f in SHRINK_READS_AS}


@dataclass
class Target:
    key: tuple
    program: Program
    seed: int
    verdict: Verdict
    observations: dict
    original_size: int
    origin: tuple
    started: float
    steps: int = 0
    last_emit: float = 0.0
    tried: dict = dataclasses.field(default_factory=dict)   # (hash, seed) -> failed the target's way
    # a residual difference: the cause the shrink keeps (the first no finding holds, its core: qualifiers such as
    # second order may go); a reduction that loses it shows another cause, not a smaller program of this one
    cause: str | None = None
    # an error (or a residual report) that raised: what it raised (findings.error_root), which the shrink keeps
    # the same way (a reduction raising something else of the same type reached another raise, another cause)
    raised: str | None = None
    constructs: frozenset = frozenset()   # the original program's (shrink_constructs)

    def admits(self, prog: Program) -> bool:
        """Whether a candidate keeps to the original's constructs (SHRINK_MAY_ADD apart); one that does not is not
        run."""
        return set(root_features(prog.features())) - SHRINK_MAY_ADD <= self.constructs

    def failure(self, j) -> Verdict | None:
        """The verdict of judgement `j` that fails the target's way: its key; for a difference with a cause, its
        check, pipeline and reference with that cause among its own (the label may change), or with the cause in
        fewer constructs (an effect's, `narrows`: the target keeps that one from then on)."""
        if self.cause is None:
            v = next((v for v in j.failures() if v.key() == self.key), None)
            if v is not None and self.raised is not None and error_root(v.detail) != self.raised:
                return None
            return v
        for v in j.failures():
            if v.key()[:3] != self.key[:3]:
                continue
            mine = residual_causes(v.check, v.detail)
            if core(self.cause) in map(core, mine):
                return v
            narrower = next((c for c in mine if narrows(c, self.cause)), None)
            if narrower is not None:
                self.cause = narrower
                return v
        return None


class Searcher:
    def __init__(self, opts, executor, expectations, emit: Callable[[dict], None], findings: list[Finding],
                 seen: set, shrinks_per_key: Counter, should_stop: Callable[[], bool], versions: dict | None = None,
                 part: tuple[int, int] = (0, 1), done_shrinks: set | None = None):
        self.opts, self.executor, self.expectations, self.emit = opts, executor, expectations, emit
        self.findings, self.seen, self.shrinks_per_key = findings, seen, shrinks_per_key
        # ((hash, seed), key): a shrink some finding record already holds (a resumed campaign replays a program
        # whose shrinks a kill cut short; those that ended are not run again, whether or not `known` matches)
        self.done_shrinks = done_shrinks if done_shrinks is not None else set()
        self.should_stop = should_stop
        self.versions = versions or {}
        self.shares = Shares(opts.pipelines, getattr(opts, "shares", None), getattr(opts, "share_by", "time"),
                             bool(getattr(opts, "explore", False)), part)
        self.coverage = Coverage(opts)
        self.target: Target | None = None
        self.halted = False
        self.slot = 0
        self.round = 0
        # a checked program's new behaviours after the first, shrunk next from that program:
        # (hash, seed) -> (verdicts, observations, the program's failing keys, the program and its judgement: what
        # a behaviour the search stopped before shrinking is filed with, `file_deferred`)
        self.deferred: dict[tuple, tuple[list[Verdict], dict, set, Program, object]] = {}
        self.raises_shrunk: set[tuple[tuple, str]] = set()   # (key, raise) of the raises this searcher shrank

    # -- known behaviours --------------------------------------------------------------
    def known(self, v: Verdict, feats: set, failing: set) -> Finding | None:
        """The finding this failure is an instance of (`known_finding`). Once a key has been
        shrunk `max_shrinks_per_key` times, further programs with that key are counted under the
        finding whose features they share most instead of being shrunk again; a shrink that ends in
        a behaviour already found closes its key at once (`_finish`: a key is shrunk again only
        while its shrinks find new behaviours). Not so a residual difference's new cause, nor a raise
        no finding holds (an error type's first raise closes the key to its later ones): those are shrunk."""
        root = evidence_root(v.check, v.pipeline, v.reference, v.detail)
        f = known_finding(self.findings, v.key(), feats, failing, root)
        if f is not None or residual_causes(v.check, v.detail):   # a new cause is shrunk, however often its key was
            return f
        raised = root if v.check in RAISING_CHECKS else None   # (evidence_root: what it raised)
        if raised is not None and (v.key(), raised) not in self.raises_shrunk:
            return None   # so is a raise no finding holds (once here: its shrink keeps it, ending in its finding)
        asked = expectation_root(v.check, v.pipeline, v.reference, v.error_type, v.expectation, v.detail)
        if asked is not None:   # an expected error that did not come: the expectation's root, whatever the program
            f = next((f for f in self.findings if f.root == asked), None)
            if f is not None:
                return f
        same = [f for f in self.findings if f.key() == v.key()] or [   # or the findings it folded into
            f for f in self.findings if list(v.key()) in f.reproduces]
        if same and self.shrinks_per_key.get(v.key(), 0) >= self.opts.max_shrinks_per_key:
            return closest(same, feats)
        return None

    def evaluate(self, prog: Program, seed: int, names: list[str]):
        inputs = input_values(prog, seed)
        obs = self.executor.run(prog, inputs, names)
        return inputs, obs, judge(prog, obs, self.expectations, self.opts.device)

    # -- one round -----------------------------------------------------------------------
    def run_round(self, r: int) -> bool:
        """Check every slot of round r that is this shard's and not seen; True when done."""
        self.round = r
        while True:
            self.target, self.halted, self.slot = None, False, 0
            test = hseed(round_seed(self.opts.seed, r))(round_settings(self.opts, r)(
                given(cases(self.coverage.config(r)))(self._body)))
            try:
                test()
            except KeyboardInterrupt:
                raise
            except BaseException:
                # With a target, this is _Found after shrinking, _ShrinkDone when its budget is
                # spent (or Hypothesis's flaky-replay error). Without one, a harness bug.
                if self.target is None:
                    raise
            if self.target is not None:
                t, self.target = self.target, None
                self._finish(t)
                if self.should_stop():
                    self.file_deferred()
                    return False
                continue   # the rest of the round: checked slots are skipped
            if not self.halted:
                self.emit({"ev": "round", "round": r})
            else:
                self.file_deferred()
            return not self.halted

    def _body(self, case):
        prog, seed = case
        if self.target is not None:
            return self._shrink_step(prog, seed)
        if self.halted:
            return
        k, self.slot = self.slot, self.slot + 1
        if self.round * self.opts.round_size + k >= self.opts.max_examples:
            return   # beyond the campaign's last slot: the round is done as far as it goes
        if self.should_stop():
            self.halted = True
            return
        h = (prog.content_hash(), seed)
        if self.deferred.get(h):
            return self._shrink_deferred(prog, seed, h)
        if h in self.seen or shard_of(h[0], seed, self.opts.shard[1]) != self.opts.shard[0]:
            return
        self._search_step(prog, seed, h)

    def _search_step(self, prog: Program, seed: int, h: tuple):
        names = self.shares.select(prog, self.opts.pipelines)
        inputs, obs, j = self.evaluate(prog, seed, names)
        self.shares.account(prog, obs)
        self.seen.add(h)
        failures = j.failures()
        feats = prog.features()
        failing = {v.key() for v in failures}
        sigs, known_keys, new = [], [], []
        for v in sorted(failures, key=lambda v: (CHECK_RANK[v.check], v.pipeline)):
            f = self.known(v, feats, failing)
            if f is not None:
                sigs.append(f.signature)
                known_keys.append(list(v.key()))
            elif (h, v.key()) not in self.done_shrinks:
                new.append(v)
        rec = ResultRecord(
            seq=-1, round=self.round, slot=self.slot - 1, hash=h[0], seed=seed, size=prog.size(),
            features=sorted(feats), ran=names,
            status="fail" if failures else ("expected" if any(v.status == "expected" for v in j.verdicts) else "pass"),
            verdicts=[[v.check, v.pipeline, v.reference, v.status, v.error_type or ""] for v in j.verdicts],
            differed={"|".join(v.key()): detail_digest(v.detail) for v in j.verdicts
                      if v.status in ("fail", "expected")},
            saved={n: residuals_digest(o.residuals) for n, o in sorted(obs.items()) if o.residuals is not None},
            seconds={n: round(sum(o.timings.values()), 4) for n, o in sorted(obs.items())},
            known_signatures=sigs, known_keys=known_keys, new=[list(v.key()) for v in new],
            expectations=dict(j.expectation_hits),
            errors={n: o.error.type for n, o in obs.items() if o.error is not None}).line()
        self.emit({"ev": "result", "rec": rec})
        if new:
            self.deferred[h] = (new[1:], obs, failing, prog, j)
            self._start_shrink(new[0], prog, seed, obs, h)

    def _shrink_deferred(self, prog: Program, seed: int, h: tuple):
        """Shrink the next new behaviour of an already checked program that no finding covers yet."""
        pending, obs, failing, _, _ = self.deferred[h]
        feats = prog.features()
        while pending:
            v = pending.pop(0)
            if self.known(v, feats, failing) is None:
                self._start_shrink(v, prog, seed, obs, h)
        del self.deferred[h]

    def file_deferred(self) -> None:
        """The search stops (its budget is spent) with new behaviours of checked programs not yet shrunk: each is
        filed as it was seen, unshrunk, so that nothing the campaign saw is missing from its findings (a resumed
        campaign's pending shrinks are those of a kill, not of a spent budget)."""
        for h, (pending, obs, failing, prog, j) in list(self.deferred.items()):
            for v in pending:
                if self.known(v, prog.features(), failing) is None:
                    self._file(self._finding(v, prog, h[1], obs, obs, j, shrunk=False, steps=0,
                                             original_size=prog.size()), h)
        self.deferred.clear()

    def _finding(self, v: Verdict, prog: Program, seed: int, seen: dict, obs: dict, j, shrunk: bool, steps: int,
                 original_size: int) -> Finding:
        """Verdict `v` of `prog` as a finding: `seen` the observations it was found with (their versions and
        flags), `obs` and `j` the runs and judgement that give its detail and its siblings."""
        obs0 = seen.get(v.pipeline)
        f = make_finding(v, prog, input_values(prog, seed), obs0.versions if obs0 else self.versions,
                         obs0.flags if obs0 else {}, self.opts.device)
        f.shrunk, f.shrink_steps, f.original_size = shrunk, steps, original_size
        f.detail = {**f.detail, "observations": obs_digest(obs, v.pipeline)}
        f.reproduces = sibling_keys(j, v.key())
        f.root = root_key(f)
        return f

    def _file(self, f: Finding, origin: tuple, target: tuple | None = None) -> None:
        """Emit finding `f` of the program `origin`, shrunk from the failure `target` (its key before shrinking: a
        residual difference's label may change on the way)."""
        target = tuple(target or f.key())
        self.done_shrinks.add((tuple(origin), target))
        self.emit({"ev": "finding", "finding": f.model_dump(mode="json"), "origin": list(origin),
                   "target": list(target), "shrink_steps": f.shrink_steps, "size": f.size,
                   "original_size": f.original_size})

    def _start_shrink(self, v: Verdict, prog: Program, seed: int, obs: dict, h: tuple):
        self.shrinks_per_key[v.key()] += 1
        causes = residual_causes(v.check, v.detail)
        raised = evidence_root(v.check, v.pipeline, v.reference, v.detail) if v.check in RAISING_CHECKS else None
        if raised is not None:
            self.raises_shrunk.add((v.key(), raised))
        self.target = Target(key=v.key(), program=prog, seed=seed, verdict=v, observations=obs,
                             original_size=prog.size(), origin=h, started=time.monotonic(),
                             cause=(new_causes(self.findings, v.key(), causes) or causes or [None])[0], raised=raised,
                             constructs=shrink_constructs(prog.features()))
        self._emit_shrink(force=True)
        _found()

    # -- shrinking -----------------------------------------------------------------------
    def _emit_shrink(self, force=False, t: Target | None = None):
        t = t or self.target
        now = time.monotonic()
        if force or now - t.last_emit >= 0.5:
            t.last_emit = now
            self.emit({"ev": "shrink", "key": list(t.key), "size": t.program.size(), "steps": t.steps,
                       "seconds": round(now - t.started, 1), "original_size": t.original_size})

    def shrink_seconds(self, key: tuple) -> float:
        """The shrink budget of one target: compiled torch pipelines take seconds per step."""
        return self.opts.shrink_seconds * SHRINK_TIME_FACTOR.get(registry.family_of(key[1]), 1.0) \
            if key[1] in registry.known_names() else self.opts.shrink_seconds

    def _shrink_step(self, prog: Program, seed: int):
        t = self.target
        budget = self.shrink_seconds(t.key)
        if (t.steps >= self.opts.shrink_steps or time.monotonic() - t.started >= budget
                or self.should_stop(grace=budget)):
            raise _ShrinkDone()
        h = (prog.content_hash(), seed)
        if h in t.tried:   # the same program from another choice sequence: its answer is known
            if t.tried[h]:
                _found()
            return
        if not t.admits(prog):   # another construct: another cause (not run)
            t.tried[h] = False
            return
        t.steps += 1
        _, obs, j = self.evaluate(prog, seed, needed_pipelines(t.key, self.opts.pipelines))
        self._emit_shrink()
        v = t.failure(j)
        t.tried[h] = v is not None
        if v is not None:
            if prog.size() <= t.program.size():
                t.program, t.seed, t.verdict, t.observations = prog, seed, v, obs
            _found()

    def _reduce(self, t: Target) -> None:
        """After Hypothesis: IR rewrites of the shrunk program (`conformance.engine.reduce`), each kept
        when the target's verdict still fails, until none applies, REDUCE_STEPS evaluations or
        the target's shrink time (once more, for these)."""
        names, limit = needed_pipelines(t.key, self.opts.pipelines), t.steps + REDUCE_STEPS
        budget = self.shrink_seconds(t.key)
        deadline = time.monotonic() + budget
        while True:   # each pass ends in a kept rewrite (a step) or returns
            for cand in candidates(t.program):
                if t.steps >= limit or time.monotonic() >= deadline or self.should_stop(grace=budget):
                    return
                h = (cand.content_hash(), t.seed)
                if (h in t.tried and not t.tried[h]) or not t.admits(cand):
                    continue
                t.steps += 1
                _, obs, j = self.evaluate(cand, t.seed, names)
                self._emit_shrink(t=t)
                v = t.failure(j)
                t.tried[h] = v is not None
                if v is not None:
                    t.program, t.verdict, t.observations = cand, v, obs
                    break
            else:
                return

    def _finish(self, t: Target) -> None:
        """The shrunk program as a finding: reduced, then replayed on its framework's pipelines for its
        siblings."""
        self._reduce(t)
        _, obs, j = self.evaluate(t.program, t.seed, sibling_pipelines(t.key, self.opts.pipelines))
        f = self._finding(t.verdict, t.program, t.seed, t.observations, {**t.observations, **obs}, j, shrunk=True,
                          steps=t.steps, original_size=t.original_size)
        if any(same_behaviour(g, f) for g in self.findings):   # nothing new: shrink this key no more
            self.shrinks_per_key[t.key] = max(self.shrinks_per_key[t.key], self.opts.max_shrinks_per_key)
        else:   # a new behaviour: the explorers that show it earn a larger share
            self.shares.found.update(n for n in f.behaviour_pipelines() if n in self.shares.explorers)
        if t.origin in self.deferred:   # the program's other behaviours this one reproduces are its own
            pending = self.deferred[t.origin][0]
            pending[:] = [v for v in pending if list(v.key()) not in f.reproduces]
        self._file(f, t.origin, t.key)


def obs_digest(obs: dict, pipeline: str) -> dict:
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
