"""Gradient oracle: remat must never change values.

Two comparisons per pipeline: `tight` against the same program without checkpoint in the
same dtype (differences of a few ulps), and `loose` against the float64 reference with a
dtype- and depth-aware tolerance.
"""
from __future__ import annotations

import math

import numpy as np

from conformance.ir.batching import value_lengths
from conformance.ir.dtypes import DTYPES, LOW_PRECISION, coarsest
from conformance.ir.nodes import DERIVATIVE_CTX, Op, iteration_values, unrolled_size, walk
from conformance.ir.observation import Observation
from conformance.ir.ops import OPS
from conformance.ir.program import Program
from conformance.ir.verdict import Verdict
from oracles.missing import skip_unless

# (rtol, atol) per dtype and comparison; atol is scaled by the reference's magnitude.
# bfloat16 and float16 scale float32's by their epsilon's ratio (a few ulps per statement), the
# tight check stays a few ulps of the program's coarsest dtype.
TOLERANCES = {
    ("float32", "tight"): (5e-5, 5e-6),
    ("float64", "tight"): (1e-10, 1e-12),
    ("float32", "loose"): (2e-3, 2e-4),
    ("float64", "loose"): (1e-8, 1e-10),
    ("bfloat16", "tight"): (3e-2, 3e-3),
    ("bfloat16", "loose"): (6e-2, 6e-3),
    ("float16", "tight"): (4e-3, 4e-4),
    ("float16", "loose"): (1e-2, 1e-3),
}


def tolerance(program: Program, mode: str) -> tuple[float, float]:
    rtol, atol = TOLERANCES[(_dtype(program), mode)]
    # Depth-aware: longer chains and second order accumulate more rounding.
    grow = 1.0 + 0.1 * unrolled_size(program.body) + (4.0 if program.diff.order == 2 else 0.0)
    return rtol * grow, atol * grow


def _flat(obs: Observation) -> dict[str, np.ndarray]:
    out = {}
    for k, v in (obs.grads or {}).items():
        out[f"grad[{k}]"] = np.asarray(v, dtype=np.float64)
    for k, v in (obs.grads2 or {}).items():
        out[f"grad2[{k}]"] = np.asarray(v, dtype=np.float64)
    for i, v in enumerate(obs.outputs or []):
        out[f"output[{i}]"] = np.asarray(v, dtype=np.float64)
    return out


# How close (relative to the dtype's epsilon, per statement) an input of an op declared
# nonsmooth may come to its kink at 0 before the value checks no longer hold: float32 and
# float64, or remat and no remat, may then take different sides (numerical instability, not
# a remat bug).
KINK_BAND_EPS = 1000.0
# The 16-bit dtypes' epsilons are so coarse that 1000 of them cover every input: a few of them per
# statement bound their rounding (bfloat16: 2 eps, 0.016, per statement).
KINK_BAND_EPS_LOW = {"bfloat16": 2.0, "float16": 8.0}


def near_kink(program: Program, values: dict | None) -> list[str]:
    """Ids of values that flow into a nonsmooth op and lie within its instability band of its kink
    (0, or the op's own `kink` distance: ties along an axis), judged on the value reference's
    recorded values."""
    if not values:
        return []
    dt = _dtype(program)
    band = KINK_BAND_EPS_LOW.get(dt, KINK_BAND_EPS) * DTYPES[dt].eps * (1 + unrolled_size(program.body))
    lengths = value_lengths(program)   # (per-example programs: every value has one per example)
    out = []
    for s, _, _, ctx in walk(program.body):
        if isinstance(s, Op) and ctx not in DERIVATIVE_CTX and OPS[s.op].nonsmooth:
            kink = OPS[s.op].kink or (lambda a, p: np.abs(a))
            if any(np.any(kink(np.asarray(x, np.float64), s.params) < band)
                   for x in iteration_values(values, s.args[0], lengths)):
                out.append(s.args[0])
    return sorted(set(out))


def has_nonsmooth(program: Program) -> bool:
    """Whether an op declared nonsmooth runs outside a custom_vjp bwd (near_kink's scope)."""
    return any(
        isinstance(s, Op) and ctx not in DERIVATIVE_CTX and OPS[s.op].nonsmooth for s, _, _, ctx in walk(program.body)
    )


def _dtype(program: Program) -> str:
    """The program's coarsest dtype (its inputs' and every cast's): what bounds its rounding."""
    return coarsest({t[1] for t in program.types().values()})


def compare(program: Program, obs: Observation, ref: Observation, mode: str, values: dict | None = None,
            values_missing: str | None = None) -> Verdict:
    """Compare values (outputs, gradients, second-order gradients) of obs with ref. `values`
    (the value reference's node values) let programs whose nonsmooth ops sit at their kink be
    skipped rather than judged; `values_missing` says why they do not exist (the value
    reference failed), and then a program with a nonsmooth op is skipped. Either side may
    have failed at its second_order stage: its first-order values are compared, and
    second-order gradients only where both have them."""
    v = Verdict(check="gradient", pipeline=obs.pipeline, reference=ref.pipeline, status="pass")
    if skip_unless(v, "values", obs, ref):
        return v
    if values_missing and not values and has_nonsmooth(program):
        v.status = "skipped"
        v.detail = {"reason": f"{values_missing}: no node values to rule out a nonsmooth op at its kink"}
        return v
    kinks = near_kink(program, values)
    if kinks:
        v.status = "skipped"
        v.detail = {"reason": "a nonsmooth op's input is at its kink (values may take either side)", "values": kinks}
        return v
    a, b = _flat(obs), _flat(ref)
    coarse = DTYPES[_dtype(program)]
    near_max = sorted({k for d in (a, b) for k, y in d.items()
                       if not np.all(np.isfinite(y)) or np.any(np.abs(y) > coarse.max / 16)})
    if coarse.name in LOW_PRECISION and near_max:
        v.status = "skipped"   # overflow is the dtype's range, not remat (float16 ends at 65504)
        v.detail = {"reason": f"values near the end of {coarse.name}'s range", "values": near_max}
        return v
    rtol, atol = tolerance(program, mode)
    worst = None
    for k in sorted(set(a) | set(b)):
        if k not in a or k not in b:
            if k.startswith("grad2") and (k not in a or ref.error is not None):
                continue   # not asked of obs, or ref failed at its second_order stage
            worst = {"value": k, "reason": "missing"}
            break
        x, y = a[k], b[k]
        if x.shape != y.shape:
            worst = {"value": k, "reason": f"shape {list(x.shape)} vs {list(y.shape)}"}
            break
        fin_y = np.isfinite(y)
        if not np.all(np.isfinite(x) == fin_y):
            worst = {"value": k, "reason": "non-finite values differ"}
            break
        if not fin_y.any():
            continue
        x, y = x[fin_y], y[fin_y]
        scale = max(1.0, float(np.max(np.abs(y))) if y.size else 1.0)
        err = np.abs(x - y)
        bound = atol * scale + rtol * np.abs(y)
        ratio = float(np.max(err / bound)) if err.size else 0.0
        if ratio > 1.0 and (worst is None or ratio > worst.get("ratio", 0)):
            i = int(np.argmax(err / bound))
            rel = float(err[i] / max(abs(y[i]), 1e-30))
            worst = {"value": k, "ratio": ratio, "max_abs_err": float(np.max(err)),
                     "max_rel_err": rel if math.isfinite(rel) else None,
                     "got": float(x[i]), "want": float(y[i]), "rtol": rtol, "atol": atol * scale}
    if worst is not None:
        v.status = "fail"
        v.detail = {"mode": mode, **worst}
    return v
