"""The memory-budget property: a min-cut partitioner run under a lower
activation_memory_budget (functorch config) than its reference must not save more bytes for
backward (the forward graphs' saved outputs, as the partitioner chose them). Values are checked
by the pipelines' other comparisons (against eager PyTorch); this check reads only the
partitioner's choice. Two runs that compiled different numbers of graphs (graph breaks,
recompiles) are not comparable: skipped.
"""
from __future__ import annotations

from conformance.ir.observation import Observation
from conformance.ir.verdict import Verdict
from oracles.missing import skip_unless

SYMPTOM = "saved_bytes_grew"


def saved_bytes(obs: Observation) -> list[int] | None:
    """Bytes each compiled graph saves for backward (None when the run recorded no partition)."""
    graphs = obs.flags.get("partitioner_saved")
    if not graphs or any(len(o) < 3 for g in graphs for o in g):
        return None
    return [sum(o[2] or 0 for o in g) for g in graphs]


def compare(obs: Observation, ref: Observation) -> Verdict:
    v = Verdict(check="residuals", pipeline=obs.pipeline, reference=ref.pipeline, status="pass")
    if skip_unless(v, "residuals", obs, ref):
        return v
    got, want = saved_bytes(obs), saved_bytes(ref)
    budgets = {"budget": obs.flags.get("activation_memory_budget", 1.0),
               "reference_budget": ref.flags.get("activation_memory_budget", 1.0)}
    if got is None or want is None or len(got) != len(want):
        v.status = "skipped"
        v.detail = {"reason": "the two runs' partitions are not comparable (a run recorded none, or they compiled "
                              f"{len(got or [])} and {len(want or [])} graphs)", **budgets}
        return v
    v.detail = {"saved_bytes": got, "reference_saved_bytes": want, **budgets}
    if sum(got) > sum(want):
        v.status, v.error_type = "fail", SYMPTOM
    return v
