"""JAX's own residual report as an oracle: what `saved_residuals` (the text behind
`jax.ad_checkpoint.print_saved_residuals`) says a function saves, against what its vjp
closure really holds (the pipeline's canonical residual set).

Users read that report to see what a policy saves; where it disagrees with the closure, the
diagnostic is wrong, whatever the policy. The verdict's reference is "vjp" (the closure).
- count: the report lists another multiset of (element count, dtype) than the closure's saved
  arrays (element counts, not shapes: copies of one value class may be saved in two layouts,
  a value and its squeeze, and the canonical set keeps one shape per class);
- names: it prints a checkpoint name more often than saved values of a class with that name
  exist (a saved value may carry a name the report does not print: it was saved as its
  producer's output, and the report names the producing equation);
- <exception type>: the report raised where the differentiation itself succeeded.
"""
from __future__ import annotations

import math
from collections import Counter

from conformance.ir.observation import Observation
from conformance.ir.verdict import Verdict
from oracles.missing import skip_unless

REFERENCE = "vjp"


def _numel(shape) -> int:
    return math.prod(shape)


def check(obs: Observation) -> Verdict:
    v = Verdict(check="residual_report", pipeline=obs.pipeline, reference=REFERENCE, status="pass")
    if skip_unless(v, "residuals", obs):
        return v
    if obs.residual_report_error is not None:
        v.status, v.error_type = "fail", obs.residual_report_error.split(":", 1)[0]
        v.detail = {"got": {"type": v.error_type, "message": obs.residual_report_error},
                    "saved": [r.describe() for r in obs.residuals]}
        return v
    if obs.residual_report is None:
        v.status, v.detail = "skipped", {"reason": f"{obs.pipeline} records no residual report"}
        return v
    report = obs.residual_report
    saved = Counter()
    if obs.saved_arrays is not None:   # the arrays as saved (a scan's stack is one array)
        saved.update((n, d) for n, d in obs.saved_arrays)
    else:
        for r in obs.residuals:
            saved[(_numel(r.shape), r.dtype)] += r.copies
    listed = Counter((_numel(r.shape), r.dtype) for r in report)
    printed = Counter(r.name for r in report if r.name is not None)
    named = {n: sum(r.copies for r in obs.residuals if n in r.names) for n in printed}
    detail: dict = {}
    if listed != saved:
        detail.update(missing_from_report=[f"{d}[{n} elements]" for n, d in sorted((saved - listed).elements())],
                      extra_in_report=[f"{d}[{n} elements]" for n, d in sorted((listed - saved).elements())])
    wrong = {n: {"printed": k, "saved": named[n]} for n, k in sorted(printed.items()) if k > named[n]}
    if wrong:
        detail["names"] = wrong
    if detail:
        v.status = "fail"
        v.error_type = "count" if listed != saved else "names"
        v.detail = {**detail, "report": [f"{r.dtype}{r.shape} {r.source}" for r in report],
                    "saved": [r.describe() for r in obs.residuals]}
    return v
