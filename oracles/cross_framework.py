"""Cross-framework oracles: PyTorch against JAX (and eager against compiled PyTorch).

Pure functions over observations. Values are compared with the gradient oracle's
tolerances; residuals by their named value classes only (the frameworks differentiate
ops differently, so unnamed residuals legitimately differ: torch's sin saves x where
JAX saves cos(x)), exactly, as multisets of classes.
"""
from __future__ import annotations

from conformance.ir import Program
from conformance.observation import Observation
from oracles import gradients, residuals
from oracles.verdict import Verdict


def _same_dtype(program: Program, a: Observation, b: Observation) -> bool:
    return True


def compare_grads(program: Program, torch_obs: Observation, jax_obs: Observation,
                  mode: str = "tight") -> Verdict:
    """Outputs, gradients and second-order gradients of one pipeline against another's, in
    the same dtype. `tight` (default) uses the same-dtype tolerance: two frameworks'
    kernels differ by rounding only, which the depth-aware tight bound absorbs on the
    generator's bounded programs; `loose` is the float64-reference tolerance."""
    v = gradients.compare(program, torch_obs, jax_obs, mode)
    if v.status == "fail":
        v.error_type = "cross_value"
    return v


def compare_residuals(torch_obs: Observation, jax_obs: Observation) -> Verdict:
    """Named residual classes (classes holding a checkpoint-named value) must agree exactly."""
    v = residuals.compare(torch_obs, jax_obs, named_only=True)
    return v
