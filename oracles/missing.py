"""What a check reads from an observation, and why it is absent.

A check runs whenever its inputs exist; where one does not, its verdict is `skipped`
with `detail.reason` saying which pipeline lacks what (a coverage table counts these).

- values: outputs and first-order gradients. A run that failed at its second_order stage
  still has them (second-order gradients are then left out of the comparison).
- residuals: the saved-residual set (first order; same rule).
- custom_rules: the custom-rule logs, complete only when the whole run completed.
- node_values: every node's value (the value reference records them when it completes).
- effects: how often each effect kind ran (JAX pipelines, on programs with effects, when the
  differentiation completed).
"""
from __future__ import annotations

from conformance.ir.observation import Observation
from conformance.ir.verdict import Verdict, symptom_check


def missing(obs: Observation, what: str) -> str | None:
    """Why `obs` lacks what a check reads ('values', 'residuals', 'custom_rules',
    'node_values', 'effects'); None when it has it."""
    if obs.unsupported is not None:
        return f"{obs.pipeline} does not support the program"
    have = {"values": obs.grads is not None and obs.outputs is not None,
            "residuals": obs.residuals is not None,
            "custom_rules": obs.error is None,
            "node_values": obs.values is not None,
            "effects": obs.effects is not None}[what]
    if have:
        return None
    if obs.error is not None:
        kind = symptom_check(obs.error.type)
        how = {"crash": "crashed", "timeout": "timed out"}.get(kind or "", "raised")
        return f"{obs.pipeline} {how} {obs.error.type} ({obs.error.stage})"
    return f"{obs.pipeline} records no {what.replace('_', '-')}"


def skip_unless_same_mode(v: Verdict, what: str, obs: Observation, ref: Observation, same_mode: bool) -> bool:
    """`skip_unless`, and skipped too where the two ran in different execution modes (counts of runs
    and traces differ between eager and jit by design); True if skipped."""
    if skip_unless(v, what, obs, ref):
        return True
    if not same_mode:
        v.status, v.detail = "skipped", {"reason": f"{obs.pipeline} and {ref.pipeline} run in different "
                                                   "execution modes (eager, jit)"}
    return not same_mode


def skip_unless(v: Verdict, what: str, *observations: Observation) -> bool:
    """Mark `v` skipped (with the reason) when one of the observations lacks `what`; True if so."""
    for o in observations:
        why = missing(o, what)
        if why:
            v.status = "skipped"
            v.detail = {"reason": why}
            return True
    return False
