"""Canonicalise saved residual arrays to program values (framework-neutral, numpy only).

A saved array belongs to the class of every program value it equals, modulo layout
(any axis permutation, or a reshape of the same elements); the values it equals in its own
layout are kept apart (`exact`: the policy oracle checks a saved view exactly). Values that are equal (a
name tag and its producer) therefore share one class, which makes JAX and PyTorch
residual sets comparable. Saved arrays of other dtypes than floats (a relu's bool mask, a
cond's int32 branch index) are no program value, whatever their elements.

Inside a scan, each iteration's value is a value of its own (`v@k`, as the recording
evaluation names it). A saved array each of whose slices along its
leading axis equals an iteration's value is a stack of per-iteration residuals (what lax.scan
saves; also when the whole equals a value, such as the scan's stacked ys): it counts as one
residual per slice, so that a stacked JAX residual and PyTorch's per-iteration saves canonicalise alike.
"""
from __future__ import annotations

import itertools

import numpy as np

from conformance.ir.dtypes import DTYPES, match_tol
from conformance.ir.nodes import ITER_SEP, NodeInfo
from conformance.ir.observation import Residual


def _close(a: np.ndarray, b: np.ndarray) -> bool:
    if a.shape != b.shape:
        return False
    tol = match_tol(a.dtype, b.dtype)   # a few ulps of the coarser dtype (conformance.ir.dtypes)
    return bool(np.allclose(a.astype(np.float64), b.astype(np.float64), rtol=tol, atol=tol))


def matches(saved: np.ndarray, value: np.ndarray) -> bool:
    if saved.size != value.size:
        return False
    if _close(saved, value):
        return True
    if value.ndim >= 2 and value.ndim <= 3:
        for perm in itertools.permutations(range(value.ndim)):
            t = np.transpose(value, perm)
            if t.shape == saved.shape and _close(saved, t):
                return True
    if saved.shape != value.shape:
        return _close(saved.reshape(-1), value.reshape(-1))
    return False


def canonicalise(saved: list[np.ndarray], values: dict[str, np.ndarray],
                 index: dict[str, NodeInfo], memory: list[str | None] | None = None) -> list[Residual]:
    out: list[Residual] = []
    by_cls: dict[tuple, Residual] = {}
    iterated = any(ITER_SEP in i for i in values)
    for k, whole in enumerate(saved):
        whole = np.asarray(whole)
        cls = _cls(whole, values)
        parts = [(whole, cls)]
        # (a stack of iteration values first: a scan's ys equals one), unless the whole is itself an
        # iteration's value in its own layout (a [1, ...] value of a loop: not a stack of its rows), or a program
        # input or an op's output outside every loop in its own shape (an input whose rows a loop happens to
        # read one by one is that input, named where the program names it)
        if iterated and whole.ndim >= 1 and not any(
                (ITER_SEP in i or (i in index and np.asarray(values[i]).shape == whole.shape))
                and _close(whole, np.asarray(values[i])) for i in cls):
            slices = [(x, _cls(x, values)) for x in whole]
            if all(c for _, c in slices) and any(ITER_SEP in i for _, c in slices for i in c):
                parts = slices
        for arr, cls in parts:
            _add(out, by_cls, arr, cls, index, memory[k] if memory else None, values)
    out.sort(key=lambda r: (r.cls, r.shape, r.dtype))
    return out


def _cls(arr: np.ndarray, values: dict) -> list[str]:
    if str(arr.dtype) not in DTYPES:   # a bool mask, a cond's int32 branch index: no program
        return []                                   # value (programs compute floats)
    return sorted(i for i, v in values.items() if matches(arr, np.asarray(v)))


def _add(out: list, by_cls: dict, arr: np.ndarray, cls: list[str], index: dict, memory: str | None,
         values: dict) -> None:
    names = sorted({index[i].name for i in cls if i in index and index[i].name})
    key = (tuple(cls), str(arr.dtype))
    if cls and key in by_cls:
        # The same program value saved twice (e.g. separate output buffers under jit) is one
        # residual: the set of saved values is what the policy governs.
        by_cls[key].copies += 1
        return
    exact = [i for i in cls if _close(arr, np.asarray(values[i]))]   # (same shape, same element order)
    r = Residual(cls=cls, names=names, shape=list(arr.shape), dtype=str(arr.dtype),
                 bytes=int(arr.nbytes), memory=memory, exact=exact)
    if cls:
        by_cls[key] = r
    out.append(r)
