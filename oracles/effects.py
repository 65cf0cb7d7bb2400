"""The effect-count oracle: how often the program's effects ran (jax.debug.callback and
io_callback, ordered or not; counted per kind over the forward and backward runs of one
differentiation), against a pipeline that claims the same semantics and against the same
program without checkpoint.

What JAX promises: a callback under jax.checkpoint runs once in the forward pass and again
when the backward pass rematerialises the region (jax PR #8907); effects other than debug
callbacks are refused inside a region under differentiation (jax PR #11579: entry
jax-checkpoint-refuses-io-effects). So:
- against a pipeline of the same remat semantics in the same execution mode (remat3 against
  remat2, eager or jit alike): the same count of every kind. The label names each kind that
  differs and how (`ordered:more`);
- against the no-checkpoint baseline (eager against eager): never fewer runs. A checkpoint may
  add runs (the recompute), never drop one (label `<kind>:dropped`).
Counts are not compared across execution modes (a jitted forward and backward is one program
whose callbacks XLA orders and may merge; eager runs each op where it is).
"""
from __future__ import annotations

from conformance.ir.observation import Observation
from conformance.ir.program import Program
from conformance.ir.verdict import Verdict
from oracles.missing import skip_unless_same_mode
from oracles.residual_causes import effect_causes


def _differs(obs: Observation, ref: Observation, fewer_only: bool) -> dict:
    kinds = sorted(set(obs.effects) | set(ref.effects))
    counts = {k: (obs.effects.get(k, 0), ref.effects.get(k, 0)) for k in kinds}
    return {k: {"got": g, "reference": r} for k, (g, r) in counts.items() if (g < r if fewer_only else g != r)}


def _verdict(obs: Observation, ref: Observation, same_mode: bool, fewer_only: bool,
             program: Program | None) -> Verdict:
    v = Verdict(check="effect_count", pipeline=obs.pipeline, reference=ref.pipeline, status="pass")
    if skip_unless_same_mode(v, "effects", obs, ref, same_mode):
        return v
    diffs = _differs(obs, ref, fewer_only)
    if diffs:
        v.status = "fail"
        v.error_type = "+".join(f"{k}:{'dropped' if fewer_only else 'more' if d['got'] > d['reference'] else 'fewer'}"
                                for k, d in sorted(diffs.items()))
        v.detail = {"effects": diffs}
        if obs.effect_sites is not None and ref.effect_sites is not None:   # which statements' effects ran so
            sites = {i: {"got": g, "reference": r} for i in sorted(set(obs.effect_sites) | set(ref.effect_sites))
                     for g, r in [(obs.effect_sites.get(i, 0), ref.effect_sites.get(i, 0))]
                     if (g < r if fewer_only else g != r)}
            if sites:
                v.detail["sites"] = sites
        if program is not None:   # where each effect that ran another count of times is, and what decided on it
            v.detail["causes"] = effect_causes(program, v.detail)
    return v


def compare(obs: Observation, ref: Observation, same_mode: bool, program: Program | None = None) -> Verdict:
    """Against a pipeline of the same remat semantics: every kind runs as often."""
    return _verdict(obs, ref, same_mode, False, program)


def compare_baseline(obs: Observation, base: Observation, same_mode: bool, program: Program | None = None) -> Verdict:
    """Against the same program without checkpoint: no kind runs fewer times."""
    return _verdict(obs, base, same_mode, True, program)
