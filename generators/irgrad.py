"""Reverse-mode differentiation of an IR op list into IR statements.

Used by the generator to build custom_vjp bwd rules that are the true derivative of
their fwd (optionally made deliberately non-standard by scaling). Returns the bwd
statements and the fwd values (residuals) they read.
"""
from __future__ import annotations

from typing import Callable

from conformance.ir import Op


def _inv(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def vjp_ops(fwd: list[Op], types: dict, results: list[str], cts: list[str], args: list[str],
            fresh: Callable[[], str]) -> tuple[list[Op], dict[str, str], set[str]]:
    """Return (bwd ops, arg id -> cotangent id, residual ids read from fwd/args)."""
    bwd: list[Op] = []
    ct: dict[str, str] = dict(zip(results, cts))
    fwd_ids = {s.out for s in fwd} | set(args)
    used: set[str] = set()

    def emit(op, a, **params) -> str:
        o = fresh()
        for x in a:
            if x in fwd_ids:
                used.add(x)
        bwd.append(Op(op=op, args=list(a), params=params, out=o))
        return o

    def acc(x, g):
        if x in ct:
            ct[x] = emit("add", [ct[x], g])
        else:
            ct[x] = g

    for s in reversed(fwd):
        if s.out not in ct:
            continue
        g = ct[s.out]
        a = s.args
        o = s.op
        if o == "sin":
            acc(a[0], emit("mul", [g, emit("cos", [a[0]])]))
        elif o == "cos":
            acc(a[0], emit("mul", [g, emit("neg", [emit("sin", [a[0]])])]))
        elif o == "tanh":
            gy = emit("mul", [g, s.out])
            acc(a[0], emit("sub", [g, emit("mul", [gy, s.out])]))
        elif o == "exp":
            acc(a[0], emit("mul", [g, s.out]))
        elif o == "sigmoid":
            gy = emit("mul", [g, s.out])
            acc(a[0], emit("sub", [gy, emit("mul", [gy, s.out])]))
        elif o == "square":
            acc(a[0], emit("scale", [emit("mul", [g, a[0]])], c=2.0))
        elif o == "neg":
            acc(a[0], emit("neg", [g]))
        elif o == "scale":
            acc(a[0], emit("scale", [g], c=s.params["c"]))
        elif o == "nondiff_scale":
            acc(a[0], emit("nondiff_scale", [g], index=s.params["index"]))
        elif o == "name":
            acc(a[0], g)
        elif o == "add":
            acc(a[0], g)
            acc(a[1], g)
        elif o == "sub":
            acc(a[0], g)
            acc(a[1], emit("neg", [g]))
        elif o == "mul":
            acc(a[0], emit("mul", [g, a[1]]))
            acc(a[1], emit("mul", [g, a[0]]))
        elif o == "matmul":
            r = len(types[a[0]][0])
            perm = [1, 0] if r == 2 else [0, 2, 1]
            acc(a[0], emit("matmul", [g, emit("transpose", [a[1]], perm=perm)]))
            acc(a[1], emit("matmul", [emit("transpose", [a[0]], perm=perm), g]))
        elif o in ("sum", "mean"):
            shp = list(types[a[0]][0])
            ax = s.params["axis"]
            if ax is None:
                kd = [1] * len(shp)
                n = 1
                for d in shp:
                    n *= d
            else:
                kd = list(shp)
                kd[ax] = 1
                n = shp[ax]
            b = emit("broadcast", [emit("reshape", [g], shape=kd)], shape=shp) if shp else g
            if o == "mean":
                b = emit("scale", [b], c=1.0 / n)
            acc(a[0], b)
        elif o == "transpose":
            acc(a[0], emit("transpose", [g], perm=_inv(s.params["perm"])))
        elif o == "reshape":
            acc(a[0], emit("reshape", [g], shape=list(types[a[0]][0])))
        elif o == "broadcast":
            src = list(types[a[0]][0])
            dst = list(s.params["shape"])
            cur = g
            for _ in range(len(dst) - len(src)):
                cur = emit("sum", [cur], axis=0)
            cur_shape = dst[len(dst) - len(src):]
            for ax in range(len(src) - 1, -1, -1):
                if src[ax] == 1 and cur_shape[ax] != 1:
                    cur = emit("sum", [cur], axis=ax)
                    cur_shape = cur_shape[:ax] + cur_shape[ax + 1:]
            if cur_shape != src:
                cur = emit("reshape", [cur], shape=src)
            elif cur == g and not src:
                pass
            acc(a[0], cur)
        else:
            raise ValueError(f"no derivative rule for {o}")
    return bwd, {x: ct[x] for x in args if x in ct}, used
