"""Judge one program's observations: every oracle, with the expectations applied.

Roles and comparisons come from the pipeline registry (conformance.pipelines): the value
reference, each framework's same-dtype baseline, the residual/error reference, and the
references each rival is compared with.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from conformance import pipelines as registry
from conformance.ir import Program
from conformance.observation import Observation
from conformance.verdict import Verdict, symptom_check
from oracles import cross_framework, gradients, residuals
from oracles.expectations import Entry, Expectations


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


def compare_custom_rules(obs: Observation, ref: Observation) -> Verdict:
    v = Verdict(check="custom_rule", pipeline=obs.pipeline, reference=ref.pipeline, status="pass")
    if not obs.ok() or not ref.ok():
        v.status = "skipped"
        return v
    diffs = {}
    for path in sorted(set(obs.custom_rules) | set(ref.custom_rules)):
        a, b = obs.custom_rules.get(path), ref.custom_rules.get(path)
        if a is None or b is None:
            continue   # a block that one pipeline never traced (dead code) is not judged
        if bool(a.fwd_traces) != bool(b.fwd_traces):
            # One pipeline ran the fwd rule, the other only the primal function.
            diffs.setdefault(path, {})["fwd_ran"] = {"got": a.fwd_traces, "reference": b.fwd_traces}
            continue
        for fld in ("perturbed", "symbolic_zero_cts"):
            sa, sb = sorted(getattr(a, fld)), sorted(getattr(b, fld))
            if sa != sb:
                diffs.setdefault(path, {})[fld] = {"got": sa, "reference": sb}
    if diffs:
        v.status = "fail"
        flds = sorted({f for d in diffs.values() for f in d})
        v.error_type = "+".join(flds)
        v.detail = {"blocks": diffs}
    return v


def judge(program: Program, observations: dict[str, Observation], expectations: Expectations,
          device: str = "cpu") -> Judgement:
    j = Judgement()
    feats = set(program.features())
    dtypes = {t[1] for t in program.types().values()}
    value_ref = registry.value_reference()
    ref = observations.get(value_ref)
    values = ref.values if ref is not None else None
    names = set(observations)

    for name, obs in observations.items():
        entries = expectations.matching(name, obs.versions, device, dtypes, feats)
        unsup = [e for e in entries if e.unsupported]
        raises = [e for e in entries if e.raises]
        diverges = [e for e in entries if e.diverges]
        if obs.unsupported or unsup:
            for e in unsup:
                _hit(j, e, True)
            j.verdicts.append(Verdict(check="error", pipeline=name, reference="expectations", status="unsupported",
                                      detail={"reason": obs.unsupported or unsup[0].unsupported.reason},
                                      expectation=unsup[0].id if unsup else None))
            continue

        # -- crashes and hangs (isolated runs) --------------------------------------------
        err = obs.error
        if err is not None and symptom_check(err.type):
            check = symptom_check(err.type)
            j.verdicts.append(Verdict(check=check, pipeline=name, reference="expectations", status="fail",
                                      error_type=err.type, detail={"got": err.model_dump()}))
            continue

        # -- error behaviour ------------------------------------------------------------
        if raises:
            e = raises[0]
            ok = bool(err is not None and re.search(e.raises.type, err.type) and re.search(e.raises.regex, err.message))
            if not ok and err is not None and name != value_ref and ref is not None and ref.error is not None \
                    and (ref.error.type, ref.error.stage) == (err.type, err.stage):
                # the reference fails the same way first: its own verdict carries the finding
                j.verdicts.append(Verdict(check="error", pipeline=name, reference=value_ref, status="pass",
                                          error_type=err.type, detail={"got": err.model_dump()}))
                continue
            if not ok and err is not None and _excused_error(err, diverges):
                # another documented error of this program came first
                j.verdicts.append(Verdict(check="error", pipeline=name, reference="expectations", status="expected",
                                          error_type=err.type, expectation=_excused_error(err, diverges)))
                continue
            _hit(j, e, ok)
            if ok:
                j.verdicts.append(Verdict(check="error", pipeline=name, reference="expectations", status="expected",
                                          error_type=err.type, expectation=e.id))
            else:
                j.verdicts.append(Verdict(
                    check="error", pipeline=name, reference="expectations", status="fail",
                    error_type=err.type if err else "none", expectation=e.id,
                    detail={"expected": {"type": e.raises.type, "regex": e.raises.regex},
                            "got": err.model_dump() if err else None}))
            continue
        if err is not None:
            same_as_ref = (name != value_ref and ref is not None and ref.error is not None
                           and ref.error.type == err.type and ref.error.stage == err.stage)
            v = Verdict(check="error", pipeline=name, reference=value_ref if same_as_ref else "expectations",
                        status="pass" if same_as_ref else "fail", error_type=err.type,
                        detail={"got": err.model_dump()})
            _apply_diverges(j, v, diverges)
            j.verdicts.append(v)
            continue
        if (ref is not None and ref.error is not None and name != value_ref and not registry.is_reference(name)
                and registry.framework_of(name) == registry.framework_of(value_ref)):
            # The value reference failed where this pipeline did not: the reference's own error
            # verdict carries the finding (an expected error is enforced by that entry for every
            # pipeline it names); there is nothing to compare values with.
            j.verdicts.append(Verdict(check="error", pipeline=name, reference=value_ref, status="skipped",
                                      detail={"reference_error": ref.error.model_dump()}))
            continue
        if registry.is_reference(name):
            continue

        # -- values ---------------------------------------------------------------------
        base = observations.get(registry.baseline_of(name) or "")
        if base is not None:
            v = gradients.compare(program, obs, base, "tight", values)
            _apply_diverges(j, v, diverges)
            j.verdicts.append(v)
        if ref is not None:
            v = gradients.compare(program, obs, ref, "loose", values)
            _apply_diverges(j, v, diverges)
            j.verdicts.append(v)

        # -- residuals and custom rules ---------------------------------------------------
        if obs.residuals is not None:
            v = residuals.check_policy(program, obs, ref)
            _apply_diverges(j, v, diverges)
            j.verdicts.append(v)
        for rname, mode in registry.comparisons(name, names):
            rref = observations.get(rname)
            if rref is None:
                continue
            if mode == "same":
                checks = [residuals.compare(obs, rref), compare_custom_rules(obs, rref)]
            else:
                checks = [cross_framework.compare_grads(program, obs, rref, values=values),
                          cross_framework.compare_residuals(obs, rref, program)]
            for v in checks:
                _apply_diverges(j, v, diverges)
                j.verdicts.append(v)
    return j


def _excused_error(err, entries: list[Entry]) -> str | None:
    for e in entries:
        d = e.diverges
        if d.check == "error" and d.error_regex and re.search(d.error_regex, f"{err.type}: {err.message}"):
            return e.id
    return None


def _apply_diverges(j: Judgement, v: Verdict, entries: list[Entry]):
    for e in entries:
        d = e.diverges
        if d.check != v.check or (d.reference and d.reference != v.reference):
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
