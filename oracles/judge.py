"""Judge one program's observations: every oracle, with the expectations applied.

Roles and comparisons come from the pipeline registry (conformance.pipelines): the value
reference, each framework's same-dtype baseline, the residual/error reference, and the
references each rival is compared with.

Checks do not mask each other: each check runs whenever its inputs exist
(oracles.missing). A pipeline that failed to raise an expected error still has values,
residuals and custom-rule logs, and they are compared; a pipeline that raised, as expected
or not, leaves every other pipeline's checks alone; when the value reference fails, the
same-dtype baseline still checks values. A check whose input does not exist (the pipeline,
its baseline or its reference raised, crashed or does not support the program) is a
`skipped` verdict whose detail.reason names the pipeline and what it lacks. A run that
failed at its second_order stage still has its first-order values and residuals.

Error verdicts, and the rule that keeps one root behaviour to one failing error verdict
of a pipeline:
- vs "expectations" (every pipeline): a matching `raises` entry must be met; any other
  error is a finding unless a `diverges` entry (check error) excuses it, or the value
  reference raised the same error first (then `pass` vs the value reference, whose own
  verdict carries the finding). A crash or a timeout is a `crash`/`timeout` verdict.
- status equivalence (rivals and the residual reference), vs each reference that claims
  the same semantics: the framework's baseline and the `same`/`eager` comparisons, never a
  cross-framework one. When exactly one of the two raised, a verdict with reference = that
  pipeline and error_type the rival's error (or "none") is
    expected  when an entry matching the rival declares the difference: a `raises` entry
              its error meets, or a `diverges` entry (check error; reference unset or that
              pipeline) whose error_regex, if any, matches the error that was raised. The
              reference's own entries never count: an expectation that excuses the
              reference's error does not excuse the rival's silence;
    pass      when the rival did not raise and the reference's error is itself unexpected
              (its error verdict fails, or defers to the value reference's, which fails):
              that verdict carries the finding and the rival did what the expectations say;
    fail      otherwise, but a pipeline's error status fails once. When its verdict vs
              expectations fails (an unexpected error, a missing or a different expected
              error) no status verdict fails: the references whose status differs are listed
              in that verdict's detail.status_differs_from. Of several failing status
              verdicts only the first (comparisons before the baseline) is kept, the other
              references listed in its detail.also_differs_from.
  Crashes, timeouts and unsupported programs have no error status to compare.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from conformance.ir.nodes import DERIVATIVE_CTX, CustomJVP, CustomVJP, walk
from conformance.ir.observation import ErrorInfo, Observation
from conformance.ir.program import Program
from conformance.ir.verdict import Verdict, symptom_check
from conformance.pipelines import registry
from oracles import cross_framework, effects, gradients, memory_budget, residual_report, residuals, trace_counts
from oracles.expectations import Entry, Expectations
from oracles.missing import missing, skip_unless
from oracles.residual_causes import rule_causes

# Comparison modes whose two pipelines claim the same semantics (their error status must agree).
SAME_SEMANTICS = ("same", "eager")


@dataclass
class Judgement:
    verdicts: list[Verdict] = field(default_factory=list)
    # expectation id -> "fired" (its failure/raise happened) or "idle" (matched, nothing to excuse)
    expectation_hits: dict[str, str] = field(default_factory=dict)

    def failures(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status == "fail"]


def _hit(j: Judgement, e: Entry, fired: bool):
    prev = j.expectation_hits.get(e.id)
    j.expectation_hits[e.id] = "fired" if fired or prev == "fired" else "idle"


def dead_blocks(program: Program) -> frozenset[str]:
    """Paths of custom_vjp blocks none of whose results the program's outputs depend on (through
    statements, scan carries and ys, cond branch results, enclosing blocks' residuals): dead code,
    which a rival may drop."""
    live = program.analysis().live
    return frozenset(p for st, _, p, ctx in walk(program.body)
                     if ctx not in DERIVATIVE_CTX and isinstance(st, CustomVJP) and not live & set(st.results))


def compare_custom_rules(obs: Observation, ref: Observation, jvp_blocks: frozenset[str] = frozenset(),
                         observed_only: bool = False, program: Program | None = None) -> Verdict:
    """What custom rules saw, per block: whether the rule ran (fwd_ran), the perturbed flags, the
    symbolic-zero cotangents. `jvp_blocks`: paths of custom_jvp blocks, whose rule only computes
    tangents: a rival that never ran one the reference ran did not need those tangents (remat3's
    partial evaluation drops them; a tangent it needed would change values, which the gradient
    check judges), so only a rule that ran where the reference's never did is judged there; the
    same for custom_vjp blocks that are dead code (`dead_blocks`). `observed_only`: a compiled
    pipeline observes only the rule calls it ran eagerly (the others ran traced), so what it saw
    must be among what the eager pipeline's calls saw."""
    v = Verdict(check="custom_rule", pipeline=obs.pipeline, reference=ref.pipeline, status="pass")
    if skip_unless(v, "custom_rules", obs, ref):
        return v
    diffs = {}
    for path in sorted(set(obs.custom_rules) | set(ref.custom_rules)):
        a, b = obs.custom_rules.get(path), ref.custom_rules.get(path)
        if a is None or b is None:
            continue   # a block that one pipeline never traced (dead code) is not judged
        if path in jvp_blocks and not a.fwd_traces:
            continue
        if observed_only:
            flds = (("perturbed",) if a.fwd_traces and b.fwd_traces else ()) + (
                ("symbolic_zero_cts", "ct_kinds") if a.bwd_calls and b.bwd_calls else ())
            for fld in flds:
                if any(x not in getattr(b, fld) for x in getattr(a, fld)):
                    diffs.setdefault(path, {})[fld] = {
                        "got": sorted(getattr(a, fld)),
                        "reference": sorted(getattr(b, fld)),
                    }
            continue
        if bool(a.fwd_traces) != bool(b.fwd_traces):
            # One pipeline ran the fwd rule, the other only the primal function.
            diffs.setdefault(path, {})["fwd_ran"] = {"got": a.fwd_traces, "reference": b.fwd_traces}
            continue
        for fld in ("perturbed", "symbolic_zero_cts", "ct_kinds"):
            sa, sb = sorted(getattr(a, fld)), sorted(getattr(b, fld))
            if sa != sb:
                diffs.setdefault(path, {})[fld] = {"got": sa, "reference": sb}
    if diffs:
        v.status = "fail"
        flds = sorted({f for d in diffs.values() for f in d})
        v.error_type = "+".join(flds)
        v.detail = {"blocks": diffs}
        if program is not None:   # each rule's field that differs, the rule and where it is (residual_causes)
            v.detail["causes"] = rule_causes(program, v.detail)
    return v


def judge(program: Program, observations: dict[str, Observation], expectations: Expectations,
          device: str = "cpu") -> Judgement:
    j = Judgement()
    feats = set(program.features())
    dtypes = {t[1] for t in program.types().values()}
    value_ref = registry.value_reference()
    ref = observations.get(value_ref)
    values = ref.values if ref is not None else None
    # why the value reference's node values (kink and alias checks) do not exist, if it failed
    values_missing = missing(ref, "node_values") if ref is not None and not ref.ok() else None
    names = set(observations)
    # custom_jvp blocks (their rules only compute tangents) and custom_vjp blocks whose results
    # nothing reads (dead code needs no rule): a rival that ran only their primal is not judged
    jvp_blocks = frozenset(p for s, _, p, _ in walk(program.body) if isinstance(s, CustomJVP)) | dead_blocks(program)
    entries = {n: expectations.matching(n, o.versions, device, dtypes, feats, o.flags) for n, o in observations.items()}
    # Every pipeline's error verdict first: status equivalence reads the references' verdicts.
    errors = {n: _error_verdict(j, o, entries[n], ref, value_ref) for n, o in observations.items()}

    # Each no-remat baseline against the value reference: where they disagree, no checkpoint is involved, and a
    # rival agreeing with its baseline is not blamed for it (_as_the_baselines); a documented difference of the
    # baseline's framework excuses its verdict too.
    baselines: dict[str, Verdict] = {}
    for b in sorted({registry.baseline_of(n) for n in observations} - {None, value_ref}):
        if b in observations and ref is not None and registry.is_reference(b):
            v = baselines[b] = _by_value_reference(program, feats, observations[b], ref, values, values_missing)
            _apply_diverges(j, v, [e for e in entries[b] if e.diverges])
            j.verdicts.append(v)

    for name, obs in observations.items():
        ev = errors[name]
        if ev is not None:
            j.verdicts.append(ev)
            if ev.status == "unsupported":
                continue
        if registry.is_reference(name):
            continue
        diverges = [e for e in entries[name] if e.diverges]

        def add(v: Verdict):
            _apply_diverges(j, v, diverges)
            j.verdicts.append(v)

        j.verdicts += _status_equivalence(j, dtypes, obs, observations, entries[name], errors, value_ref)

        # -- values ---------------------------------------------------------------------
        base = observations.get(_baseline(dtypes, name, observations) or "")
        by_base = gradients.compare(program, obs, base, "tight", values, values_missing) if base is not None else None
        by_ref = None
        if ref is not None and ref is not base:   # (ref:f64 standing in for the baseline: tight only)
            by_ref = _by_value_reference(program, feats, obs, ref, values, values_missing)
        for v in _as_the_baselines(by_base, by_ref, baselines):
            add(v)

        none = observations.get(registry.baseline_of(name) or "")
        if "effects" in feats and none is not None and registry.same_mode(name, none.pipeline):
            # a checkpoint may add runs of an effect, never drop one
            add(effects.compare_baseline(obs, none, True, program))

        # -- residuals and custom rules ---------------------------------------------------
        add(residuals.check_policy(program, obs, ref,
                                   none if none is not None and residuals.judged_against_no_checkpoint(name, names)
                                   else None))
        if registry.records_report(name):
            add(residual_report.check(obs))
        pair = _Pair(program, feats, values, values_missing, jvp_blocks)
        for rname, mode in registry.comparisons(name, names):
            for v in COMPARISONS[mode](pair, obs, observations[rname]):
                add(v)
    return j


@dataclass
class _Pair:
    """What every comparison of a rival with a reference pipeline reads besides the two observations."""
    program: Program
    feats: set
    values: dict | None
    values_missing: str | None
    jvp_blocks: set


def _same(c: _Pair, obs: Observation, ref: Observation) -> list[Verdict]:
    return [residuals.compare(obs, ref, program=c.program),
            compare_custom_rules(obs, ref, c.jvp_blocks, program=c.program),
            trace_counts.compare(obs, ref, registry.same_mode(obs.pipeline, ref.pipeline)),
            *([effects.compare(obs, ref, registry.same_mode(obs.pipeline, ref.pipeline), c.program)]
              if "effects" in c.feats
              else [])]


def _values(c: _Pair, obs: Observation, ref: Observation) -> list[Verdict]:
    return [cross_framework.compare_grads(c.program, obs, ref, values=c.values, values_missing=c.values_missing)]


def _budget(c: _Pair, obs: Observation, ref: Observation) -> list[Verdict]:
    return [memory_budget.compare(obs, ref)]


def _across(c: _Pair, obs: Observation, ref: Observation, across: bool) -> list[Verdict]:
    return [_draws_differ(c.feats, obs, ref)
            or cross_framework.compare_grads(c.program, obs, ref, values=c.values, values_missing=c.values_missing),
            cross_framework.compare_residuals(obs, ref, c.program, across=across)]


def _eager(c: _Pair, obs: Observation, ref: Observation) -> list[Verdict]:
    # what rules received too, where the compiled pipeline ran them eagerly
    rules = compare_custom_rules(obs, ref, c.jvp_blocks, observed_only=True, program=c.program)
    return _across(c, obs, ref, False) + [rules]


def _cross(c: _Pair, obs: Observation, ref: Observation) -> list[Verdict]:
    return _across(c, obs, ref, True)


# Each comparison mode's checks (tests/test_oracles.py: every registry.CompareMode has an entry).
COMPARISONS: dict[registry.CompareMode, Callable[[_Pair, Observation, Observation], list[Verdict]]] = {
    registry.CompareMode.SAME: _same, registry.CompareMode.VALUES: _values, registry.CompareMode.BUDGET: _budget,
    registry.CompareMode.EAGER: _eager, registry.CompareMode.CROSS: _cross,
}


def _as_the_baselines(by_base: Verdict | None, by_ref: Verdict | None, baselines: dict[str, Verdict]) -> list[Verdict]:
    """A rival's value verdicts against its baseline and the value reference. Where the baseline differs from the
    reference (its own verdict) and the rival agrees with one of the two, its difference from the other is that
    verdict's, not the rival's: skipped, with the reason (jax 0.6.2's jitted conv of a scaled input: the jitted
    reference and every jitted rival computed one value, the eager baseline and every eager rival another, and
    each rival was blamed). A rival that agrees with neither is blamed against both."""
    got = [v for v in (by_base, by_ref) if v is not None]
    shown = baselines.get(by_base.reference) if by_base is not None else None
    if len(got) < 2 or shown is None or shown.status != "fail" or sorted(v.status for v in got) != ["fail", "pass"]:
        return got
    agreed = next(v.reference for v in got if v.status == "pass")
    return [v if v.status == "pass" else v.model_copy(update={"status": "skipped", "detail": {
        "reason": f"agrees with {agreed}, and the no-remat baseline {shown.pipeline} differs from {shown.reference} "
                  "(its own verdict): the difference is not this pipeline's", **v.detail}}) for v in got]


def _by_value_reference(program: Program, feats: set, obs: Observation, ref: Observation, values,
                        values_missing) -> Verdict:
    """A pipeline's values against the float64 value reference (loose), unless their random draws differ."""
    return _draws_differ(feats, obs, ref) or gradients.compare(program, obs, ref, "loose", values, values_missing)


def _draws_differ(feats: set, obs: Observation, ref: Observation) -> Verdict | None:
    """A skipped value verdict when the program draws random numbers and the two pipelines run
    different frameworks (JAX draws from the statement's seed, PyTorch from its generator: the
    masks differ); None when their values are comparable."""
    if "random" not in feats or registry.framework_of(obs.pipeline) == registry.framework_of(ref.pipeline):
        return None
    return Verdict(check="gradient", pipeline=obs.pipeline, reference=ref.pipeline, status="skipped",
                   detail={"reason": f"random draws differ between {registry.framework_of(obs.pipeline)} and "
                                     f"{registry.framework_of(ref.pipeline)}: values are compared within a framework"})


def _error_verdict(j: Judgement, obs: Observation, entries: list[Entry], ref: Observation | None,
                   value_ref: str) -> Verdict | None:
    """The pipeline's error behaviour against the expectations (None: it did not raise and
    was not expected to)."""
    name = obs.pipeline
    unsup = [e for e in entries if e.unsupported]
    raises = [e for e in entries if e.raises]
    diverges = [e for e in entries if e.diverges]
    if obs.unsupported or unsup:
        for e in unsup:
            _hit(j, e, True)
        return Verdict(check="error", pipeline=name, reference="expectations", status="unsupported",
                       detail={"reason": obs.unsupported or unsup[0].unsupported.reason},
                       expectation=unsup[0].id if unsup else None)
    err = obs.error
    # -- crashes and hangs (isolated runs) ------------------------------------------------
    if err is not None and symptom_check(err.type):
        return Verdict(check=symptom_check(err.type), pipeline=name, reference="expectations", status="fail",
                       error_type=err.type, detail={"got": err.model_dump()})
    # the value reference fails the same way first: its own verdict carries the finding
    same_as_ref = (err is not None and name != value_ref and ref is not None and ref.error is not None
                   and (ref.error.type, ref.error.stage) == (err.type, err.stage))
    if raises:
        # several documented errors may apply (two blocks, each raising its own): whichever the
        # pipeline meets first is met
        e = next((x for x in raises if _meets(err, x)), raises[0])
        ok = _meets(err, e)
        if not ok and same_as_ref:
            return Verdict(check="error", pipeline=name, reference=value_ref, status="pass",
                           error_type=err.type, detail={"got": err.model_dump()})
        if not ok and err is not None and _excused_error(err, diverges):
            # another documented error of this program came first
            return Verdict(check="error", pipeline=name, reference="expectations", status="expected",
                           error_type=err.type, expectation=_excused_error(err, diverges))
        _hit(j, e, ok)
        if ok:
            return Verdict(check="error", pipeline=name, reference="expectations", status="expected",
                           error_type=err.type, expectation=e.id)
        return Verdict(check="error", pipeline=name, reference="expectations", status="fail",
                       error_type=err.type if err else "none", expectation=e.id,
                       detail={"expected": {"type": e.raises.type, "regex": e.raises.regex},
                               "got": err.model_dump() if err else None})
    if err is not None:
        v = Verdict(check="error", pipeline=name, reference=value_ref if same_as_ref else "expectations",
                    status="pass" if same_as_ref else "fail", error_type=err.type,
                    detail={"got": err.model_dump()})
        _apply_diverges(j, v, diverges)
        return v
    return None


def _meets(err: ErrorInfo | None, e: Entry) -> bool:
    return bool(err is not None and re.search(e.raises.type, err.type) and re.search(e.raises.regex, err.message))


def _baseline(dtypes: set[str], name: str, observations: dict) -> str | None:
    """The pipeline's same-dtype baseline; where it did not run on this program for its share
    (registry.Share with dtypes: jax:none on a float64-only program), the sibling it stands for,
    which computes the same values in the same dtype."""
    b = registry.baseline_of(name)
    sh = registry.spec(b).share if b else None
    if b in observations or sh is None or sh.sibling not in observations:
        return b
    return sh.sibling if sh.holds_on(dtypes) else b


def _has_status(o: Observation) -> bool:
    """Whether the run ended with a result or an ordinary error (not unsupported, crashed, hung)."""
    return o.unsupported is None and (o.error is None or symptom_check(o.error.type) is None)


def _status_equivalence(j: Judgement, dtypes: set[str], obs: Observation, observations: dict[str, Observation],
                        entries: list[Entry], errors: dict[str, Verdict | None], value_ref: str) -> list[Verdict]:
    """Error status against the references that claim the same semantics (module docstring)."""
    name = obs.pipeline
    refs = [r for r, mode in registry.comparisons(name, set(observations)) if mode in SAME_SEMANTICS]
    b = _baseline(dtypes, name, observations)
    if b in observations and b != name:
        refs.append(b)
    own = errors.get(name)
    out: list[Verdict] = []
    first: Verdict | None = None
    if not _has_status(obs):
        return out
    for q in dict.fromkeys(refs):
        qo = observations[q]
        if not _has_status(qo) or (obs.error is None) == (qo.error is None):
            continue
        raised = obs.error or qo.error
        v = Verdict(check="error", pipeline=name, reference=q, status="fail",
                    error_type=obs.error.type if obs.error else "none",
                    detail={"got": obs.error.model_dump() if obs.error else None,
                            "reference_error": qo.error.model_dump() if qo.error else None})
        e = _declares(entries, obs.error, raised, q)
        if e is not None:
            _hit(j, e, True)
            v.status, v.expectation = "expected", e.id
        elif obs.error is None and _unexpected(errors, q, value_ref):
            v.status = "pass"
            v.detail["reason"] = f"{q}'s error is not expected: its own error verdict carries the finding"
        elif own is not None and own.status == "fail":
            own.detail.setdefault("status_differs_from", []).append(q)
            continue
        elif first is not None:
            first.detail.setdefault("also_differs_from", []).append(q)
            continue
        else:
            first = v
        out.append(v)
    return out


def _declares(entries: list[Entry], err: ErrorInfo | None, raised: ErrorInfo, reference: str) -> Entry | None:
    """The rival's entry that declares its status differs from `reference`'s, if any."""
    for e in entries:
        if e.raises and _meets(err, e):
            return e
        d = e.diverges
        if d and d.check == "error" and d.concerns(reference) and (
                not d.error_regex or re.search(d.error_regex, f"{raised.type}: {raised.message}")):
            return e
    return None


def _unexpected(errors: dict[str, Verdict | None], q: str, value_ref: str) -> bool:
    """Whether q's error is a finding of its own (directly, or through the value reference's)."""
    v = errors.get(q)
    if v is None:
        return False
    if v.status == "pass" and v.reference == value_ref:
        v = errors.get(value_ref)
    return v is not None and v.status == "fail"


def _excused_error(err, entries: list[Entry]) -> str | None:
    for e in entries:
        d = e.diverges
        if d.check == "error" and d.error_regex and re.search(d.error_regex, f"{err.type}: {err.message}"):
            return e.id
    return None


def _apply_diverges(j: Judgement, v: Verdict, entries: list[Entry]):
    for e in entries:
        d = e.diverges
        if d.check != v.check or not d.concerns(v.reference):
            continue
        if d.error_regex:
            got = (v.detail or {}).get("got") or {}
            if not re.search(d.error_regex, f"{got.get('type', '')}: {got.get('message', '')}"):
                continue
        _hit(j, e, v.status == "fail")
        if v.status == "fail":
            v.status = "expected"
            v.expectation = e.id
        return
