"""The trace-count oracle: how often each custom rule ran (its primal function, fwd and bwd
rules, traced or called), against a pipeline that claims the same semantics.

A rule that runs more often under the rival than under its reference is a cost regression
(tracing time, compile time, and with Python side effects, behaviour): a `trace_count`
finding of its own, never a gradient or residual one. Running fewer times is not judged
here, and neither is a fwd or bwd rule that runs where the reference ran none (that is the
custom_rule check's `fwd_ran`, one finding for one behaviour). Counts are compared
only between runs of one execution mode (both eager or both jit): jit traces what eager
calls, so counts across modes differ by design. The error type names the counters that grew.
A block inside another block's rule (a custom_jvp in a custom_vjp fwd) runs each time that rule
runs: where the outer block's primal, fwd or rem runs grew, the inner block's growth is theirs,
one behaviour, and is listed under `explained` instead.
"""
from __future__ import annotations

from conformance.observation import Observation
from conformance.verdict import Verdict
from oracles.missing import skip_unless

COUNTERS = ("primal_traces", "fwd_traces", "bwd_calls", "rem_traces")
RERUNS = ("primal_traces", "fwd_traces", "rem_traces")   # counters of runs of a block's primal code


def compare(obs: Observation, ref: Observation, same_mode: bool) -> Verdict:
    v = Verdict(check="trace_count", pipeline=obs.pipeline, reference=ref.pipeline, status="pass")
    if skip_unless(v, "custom_rules", obs, ref):
        return v
    if not same_mode:
        v.status, v.detail = "skipped", {"reason": f"{obs.pipeline} and {ref.pipeline} run in different "
                                                   "execution modes (eager, jit)"}
        return v
    grew: dict = {}
    for path in sorted(set(obs.custom_rules) & set(ref.custom_rules)):
        a, b = obs.custom_rules[path], ref.custom_rules[path]
        for c in COUNTERS:
            if c in ("fwd_traces", "bwd_calls") and getattr(b, c) == 0:
                continue   # custom_rule's fwd_ran
            if getattr(a, c) > getattr(b, c):
                grew.setdefault(path, {})[c] = {"got": getattr(a, c), "reference": getattr(b, c)}
    reruns = [p for p, d in grew.items() if set(d) & set(RERUNS)]
    explained = {p: grew.pop(p) for p in list(grew) if any(p.startswith(o + ".") for o in reruns)}
    if grew:
        v.status = "fail"
        v.error_type = "+".join(sorted({c for d in grew.values() for c in d}))
        v.detail = {"blocks": grew, **({"explained": explained} if explained else {})}
    return v
