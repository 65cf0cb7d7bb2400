"""The trace-count oracle: how often each custom rule ran (its primal function, fwd and bwd
rules, traced or called), against a pipeline that claims the same semantics.

A rule that runs more often under the rival than under its reference is a cost regression
(tracing time, compile time, and with Python side effects, behaviour): a `trace_count`
finding of its own, never a gradient or residual one. What is compared, per custom-rule block
(its path), is the TOTAL number of runs of the block's code, not each counter alone:
- primal_traces, fwd_traces and rem_traces all run the block's primal statements (a custom_vjp's
  primal function and its fwd rule run the same `fwd` body; a custom_jvp's rule runs its body;
  a rem rule recomputes the residuals). Their sum is the block's `total`; traces that only MOVED
  between them (remat2: primal 2, fwd 1; remat3+cvjp3: primal 1, fwd 2) are no growth. The
  block fails where its total grew.
- bwd_calls run other code (the bwd statements) and are judged alone: the block fails where
  they grew.
Running fewer times is not judged here, and neither is a fwd or bwd rule that runs where the
reference ran none (that is the custom_rule check's `fwd_ran`, one finding for one behaviour):
such a counter is left out of the total of both sides. Counts are compared only between runs
of one execution mode (both eager or both jit): jit traces what eager calls, so counts across
modes differ by design.

The error type names the counters that grew in the failing blocks, joined by "+" and sorted
(`fwd_traces`, `bwd_calls+fwd_traces`): of a block whose total grew, the rerun counters whose
own counts grew (at least one did); `bwd_calls` where those grew. The detail gives, per failing
block, got/reference of each counter that differs from the reference (moves included) and the
block's `total` (primal_traces + fwd_traces + rem_traces).
A block inside another block's rule (a custom_jvp in a custom_vjp fwd) runs each time that rule
runs: where the outer block's total grew, the inner block's growth is the outer's, one
behaviour, and is listed under `explained` instead.
"""
from __future__ import annotations

from conformance.ir.observation import Observation
from conformance.ir.verdict import Verdict
from oracles.missing import skip_unless_same_mode

COUNTERS = ("primal_traces", "fwd_traces", "bwd_calls", "rem_traces")
RERUNS = ("primal_traces", "fwd_traces", "rem_traces")   # counters of runs of a block's primal code


def _block(a, b) -> tuple[dict, set, bool]:
    """(detail, counters that grew, whether the rerun total grew) of one block's logs: `a` the
    rival's, `b` the reference's."""
    counts = {c: (getattr(a, c) or 0, getattr(b, c) or 0) for c in COUNTERS}
    counts = {c: v for c, v in counts.items()
              if not (c in ("fwd_traces", "bwd_calls") and v[1] == 0)}   # custom_rule's fwd_ran
    got, ref = (sum(counts[c][i] for c in RERUNS if c in counts) for i in (0, 1))
    rerun_grew = got > ref
    grew = {c for c in RERUNS if c in counts and counts[c][0] > counts[c][1]} if rerun_grew else set()
    if "bwd_calls" in counts and counts["bwd_calls"][0] > counts["bwd_calls"][1]:
        grew.add("bwd_calls")
    detail = {c: {"got": g, "reference": r} for c, (g, r) in counts.items() if g != r}
    detail["total"] = {"got": got, "reference": ref}
    return detail, grew, rerun_grew


def compare(obs: Observation, ref: Observation, same_mode: bool) -> Verdict:
    v = Verdict(check="trace_count", pipeline=obs.pipeline, reference=ref.pipeline, status="pass")
    if skip_unless_same_mode(v, "custom_rules", obs, ref, same_mode):
        return v
    failing: dict = {}
    labels: dict = {}
    reruns = []
    for path in sorted(set(obs.custom_rules) & set(ref.custom_rules)):
        detail, grew, rerun_grew = _block(obs.custom_rules[path], ref.custom_rules[path])
        if grew:
            failing[path], labels[path] = detail, grew
        if rerun_grew:
            reruns.append(path)
    explained = {p: failing.pop(p) for p in list(failing) if any(p.startswith(o + ".") for o in reruns)}
    if failing:
        v.status = "fail"
        v.error_type = "+".join(sorted(set().union(*(labels[p] for p in failing))))
        v.detail = {"blocks": failing, **({"explained": explained} if explained else {})}
    return v
