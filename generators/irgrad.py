"""Reverse-mode differentiation of an IR op list into IR statements, by the op table's rules.

Used by the generator to build custom_vjp bwd rules that are the true derivative of
their fwd (optionally made deliberately non-standard by scaling). Returns the bwd
statements and the fwd values (residuals) they read.
"""
from __future__ import annotations

from typing import Callable

from conformance.ir import Op
from conformance.ops import ACC_OP, OPS


class Vjp:
    """What a derivative rule (conformance.ops OpDecl.vjp) works with."""

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
