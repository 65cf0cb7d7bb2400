"""Differentiation of an IR op list into IR statements, by the op table's rules.

Used by the generator to build custom_vjp bwd rules that are the true derivative of
their fwd (optionally made deliberately non-standard by scaling; reverse mode, `vjp_ops`,
which also returns the fwd values the bwd reads: the residuals), and custom_jvp tangent
rules (forward mode, `jvp_ops`).
"""
from __future__ import annotations

from typing import Callable

from conformance.ir.nodes import Op
from conformance.ir.ops import ACC_OP, OPS, SCALE_OP


class Vjp:
    """What a derivative rule (conformance.ir.ops OpDecl.vjp) works with."""

    def __init__(self, types: dict, results: list[str], cts: list[str], fwd_ids: set[str], fresh: Callable[[], str]):
        self.types, self.fresh = types, fresh
        self.cts: dict[str, str] = dict(zip(results, cts))
        self.fwd_ids, self.used = fwd_ids, set()
        self.stmts: list[Op] = []

    def emit(self, op: str, args: list[str], **params) -> str:
        o = self.fresh()
        self.used.update(a for a in args if a in self.fwd_ids)
        self.stmts.append(Op(op=op, args=list(args), params=params, out=o))
        return o

    def ct(self, s: Op) -> str:
        return self.cts[s.out]

    def acc(self, x: str, g: str) -> None:
        self.cts[x] = self.emit(ACC_OP, [self.cts[x], g]) if x in self.cts else g


def vjp_ops(fwd: list[Op], types: dict, results: list[str], cts: list[str], args: list[str],
            fresh: Callable[[], str]) -> tuple[list[Op], dict[str, str], set[str]]:
    """Return (bwd ops, arg id -> cotangent id, residual ids read from fwd/args)."""
    d = Vjp(types, results, cts, {s.out for s in fwd} | set(args), fresh)
    for s in reversed(fwd):
        if s.out not in d.cts:
            continue
        rule = OPS[s.op].vjp
        if rule is None:
            raise ValueError(f"no derivative rule for {s.op}")
        rule(d, s)
    return d.stmts, {x: d.cts[x] for x in args if x in d.cts}, d.used


def scale_result(rule: list[Op], results: list, k: int, c: float, fresh: Callable[[], str]) -> tuple[list[Op], list]:
    """A deliberately non-standard but well-defined rule: its result k scaled by c (a None
    result, a zero, stays as it is)."""
    if results[k] is None:
        return rule, results
    o = fresh()
    return rule + [Op(op=SCALE_OP, args=[results[k]], params={"c": c}, out=o)], results[:k] + [o] + results[k + 1:]


def residuals_of(used: set[str], args: list[str], fwd: list[Op]) -> list[str]:
    """The residuals of a custom_vjp: the values its bwd reads (`vjp_ops`), args first, then fwd
    values in program order."""
    order = {a: i for i, a in enumerate(list(args) + [s.out for s in fwd])}
    return sorted(used, key=order.__getitem__)


def jvp_ops(body: list[Op], types: dict, args: list[str], tangents: list[str],
            fresh: Callable[[], str]) -> tuple[list[Op], dict[str, str]]:
    """Forward-mode differentiation of an op list (a custom_jvp rule's tangent statements), by
    each op's declared tangent kind. Every value gets a tangent (arguments' tangents are always
    given, zeros where not perturbed). Return (tangent ops, value id -> tangent id)."""
    tan: dict[str, str] = dict(zip(args, tangents))
    stmts: list[Op] = []

    def emit(op: str, a: list[str], **params) -> str:
        o = fresh()
        stmts.append(Op(op=op, args=list(a), params=params, out=o))
        return o

    for s in body:
        kind = OPS[s.op].tangent
        ts = [tan[a] for a in s.args]
        if kind == "linear":
            tan[s.out] = emit(s.op, ts, **s.params)
        elif kind == "identity":
            tan[s.out] = ts[0]
        elif kind == "zero":
            tan[s.out] = emit("scale", [ts[0]], c=0.0)
        elif kind == "bilinear":
            x, y = s.args
            tan[s.out] = emit(ACC_OP, [emit(s.op, [ts[0], y], **s.params), emit(s.op, [x, ts[1]], **s.params)])
        elif kind == "diagonal":   # elementwise: the transpose of a diagonal Jacobian is itself
            d = Vjp(types, [s.out], [ts[0]], set(), fresh)
            OPS[s.op].vjp(d, s)
            stmts.extend(d.stmts)
            tan[s.out] = d.cts[s.args[0]]
        else:
            raise ValueError(f"no tangent rule for {s.op}")
    return stmts, tan
