"""Floating dtypes, each declared once: its size, its machine epsilon and largest finite value
(tolerances, overflow), and how closely a saved residual must equal a program value in it.
bfloat16 arrays are numpy arrays of ml_dtypes.bfloat16 (ml_dtypes, a dependency of jax,
registers the name with numpy).

Program layer: imports numpy and ml_dtypes only.
"""
from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np


@dataclass(frozen=True)
class DType:
    name: str
    bytes: int
    eps: float        # machine epsilon
    max: float        # largest finite value
    match_tol: float  # a saved array is a program value within this (relative and absolute): a few ulps


DTYPES: dict[str, DType] = {d.name: d for d in (
    DType("float64", 8, 2.0 ** -52, float(np.finfo(np.float64).max), 1e-10),
    DType("float32", 4, 2.0 ** -23, float(np.finfo(np.float32).max), 1e-5),
    DType("bfloat16", 2, 2.0 ** -7, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max), 2e-2),
    DType("float16", 2, 2.0 ** -10, float(np.finfo(np.float16).max), 4e-3),
)}
LOW_PRECISION = ("bfloat16", "float16")


def np_dtype(name: str) -> np.dtype:
    """The numpy dtype of a declared dtype name (KeyError for any other name)."""
    return np.dtype(DTYPES[name].name)


def coarsest(names) -> str:
    """The least precise of these dtypes (the one with the largest epsilon)."""
    return max(names, key=lambda n: DTYPES[n].eps)


def match_tol(*dtypes) -> float:
    """How closely a saved array must equal a value when either is of these numpy dtypes."""
    tols = [DTYPES[str(d)].match_tol for d in dtypes if str(d) in DTYPES]
    return max(tols) if tols else DTYPES["float64"].match_tol
