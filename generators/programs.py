"""Hypothesis strategies for programs, policies and inputs.

Only valid programs are produced (every draw is type-directed), and generation shrinks
toward few, shallow ops: the first choice of every `sampled_from` is the simplest one,
counts shrink toward their minimum, and regions/blocks shrink into plain ops.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

from conformance.ir import Checkpoint, CustomVJP, Diff, Input, Op, Program, validate
from conformance.policy import (Both, Dots, DotsNoBatch, Everything, Nothing, OffloadDotsNoBatch, Ops,
                                SaveAndOffloadNames, SaveAnyNamesButThese, SaveAnythingExceptNames,
                                SaveOnlyNames)
from generators.irgrad import vjp_ops

NAME_POOL = ("a", "b", "c")
UNARY_OPS = ("sin", "cos", "tanh", "exp", "sigmoid", "square", "neg", "scale")
POLICY_OPS = ("sin", "cos", "tanh", "exp", "mul", "add", "matmul", "name")
MAX_MAG = 50.0


@dataclass
class Config:
    """What the generator may produce. Profiles and pipelines narrow it."""
    max_stmts: int = 6
    max_depth: int = 3
    dtypes: tuple[str, ...] = ("float32", "float64")
    custom_vjp: bool = True
    checkpoint: bool = True
    second_order: bool = True
    offload_policies: bool = True
    max_inputs: int = 6


@dataclass
class Val:
    id: str
    shape: tuple
    dtype: str
    mag: float


@dataclass
class Builder:
    draw: object
    cfg: Config
    dtype: str
    inputs: list = field(default_factory=list)
    types: dict = field(default_factory=dict)
    n: int = 0

    def fresh(self, prefix="v") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    def new_input(self, shape) -> Val:
        i = f"x{len(self.inputs)}"
        diff = True if not self.inputs else self.draw(st.booleans().map(lambda b: not b), label="input_diff")
        self.inputs.append(Input(id=i, shape=list(shape), dtype=self.dtype, diff=diff))
        self.types[i] = (tuple(shape), self.dtype)
        return Val(i, tuple(shape), self.dtype, 1.0)


def _shape(draw, rank=None):
    r = draw(st.integers(0, 3), label="rank") if rank is None else rank
    return tuple(draw(st.integers(1, 4), label="dim") for _ in range(r))


def policies(names=NAME_POOL, allow_offload=True, depth=0):
    """Strategy for framework-neutral policies."""
    nm = st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True)
    simple = [
        st.just(Nothing()),
        nm.map(lambda n: SaveOnlyNames(names=n)),
        st.just(Everything()),
        st.just(Dots()),
        st.just(DotsNoBatch()),
        nm.map(lambda n: SaveAnyNamesButThese(names=n)),
        nm.map(lambda n: SaveAnythingExceptNames(names=n)),
        st.lists(st.sampled_from(POLICY_OPS), min_size=1, max_size=3, unique=True).map(lambda o: Ops(ops=o)),
    ]
    if allow_offload:
        simple.append(st.just(OffloadDotsNoBatch()))
        simple.append(st.tuples(nm, nm).map(lambda t: SaveAndOffloadNames(
            saved=t[0], offloaded=[n for n in t[1] if n not in t[0]])))
    base = st.one_of(*simple)
    if depth >= 1:
        return base
    return st.one_of(base, st.tuples(policies(names, allow_offload, 1), policies(names, allow_offload, 1))
                     .map(lambda t: Both(a=t[0], b=t[1])))


class _Gen:
    def __init__(self, draw, cfg: Config):
        self.draw = draw
        self.cfg = cfg
        dtype = draw(st.sampled_from(cfg.dtypes), label="dtype")
        self.b = Builder(draw, cfg, dtype)

    # -- values --------------------------------------------------------------
    def pick(self, scope: list[Val], pred=lambda v: True) -> Val | None:
        c = [v for v in scope if pred(v)]
        if not c:
            return None
        # Half the time continue the chain from the newest value (x -> sin -> name -> cos),
        # so that named values inside regions are read by later ops, as in real models.
        if len(c) > 1 and self.draw(st.booleans(), label="chain"):
            return c[-1]
        return self.draw(st.sampled_from(c), label="operand")

    def op(self, kind, args: list[Val], out_shape, mag, **params) -> tuple[Op, Val]:
        o = self.b.fresh()
        self.b.types[o] = (tuple(out_shape), args[0].dtype)
        return Op(op=kind, args=[a.id for a in args], params=params, out=o), Val(o, tuple(out_shape), args[0].dtype, mag)

    def gen_op(self, scope: list[Val], in_fwd: bool, nondiff: list[float]) -> tuple[Op, Val]:
        d = self.draw
        choices = ["unary", "name", "binary", "matmul", "reduce", "layout"]
        if in_fwd and nondiff:
            choices.append("nondiff_scale")
        kind = d(st.sampled_from(choices), label="op_kind")
        x = self.pick(scope)
        if kind == "unary":
            u = d(st.sampled_from(UNARY_OPS), label="unary")
            if u == "exp" and x.mag > 3:
                u = "tanh"
            if u in ("sin", "cos", "tanh", "sigmoid"):
                return self.op(u, [x], x.shape, 1.0)
            if u == "exp":
                return self.op(u, [x], x.shape, math.exp(x.mag))
            if u == "square":
                if x.mag ** 2 > MAX_MAG:
                    return self.op("tanh", [x], x.shape, 1.0)
                return self.op(u, [x], x.shape, x.mag ** 2)
            if u == "neg":
                return self.op(u, [x], x.shape, x.mag)
            c = d(st.sampled_from([2.0, 0.5, -1.5]), label="scale")
            return self.op("scale", [x], x.shape, x.mag * abs(c), c=c)
        if kind == "name":
            n = d(st.sampled_from(NAME_POOL), label="name")
            return self.op("name", [x], x.shape, x.mag, name=n)
        if kind == "nondiff_scale":
            ix = d(st.integers(0, len(nondiff) - 1), label="nondiff_index")
            return self.op("nondiff_scale", [x], x.shape, x.mag * abs(nondiff[ix]), index=ix)
        if kind == "binary":
            y = self.pick(scope, lambda v: v.shape == x.shape and v.dtype == x.dtype)
            b = d(st.sampled_from(["mul", "add", "sub"]), label="binary")
            mag = x.mag * y.mag if b == "mul" else x.mag + y.mag
            if mag > MAX_MAG:
                return self.op("tanh", [x], x.shape, 1.0)
            return self.op(b, [x, y], x.shape, mag)
        if kind == "matmul":
            if len(x.shape) not in (2, 3):
                # make a matrix out of it: broadcast up to rank 2
                shape = (d(st.integers(1, 4), label="dim"),) + (x.shape if len(x.shape) == 1 else (d(st.integers(1, 4), label="dim"),))
                return self.op("broadcast", [x], shape, x.mag, shape=list(shape))
            k = x.shape[-1]
            nn = d(st.integers(1, 4), label="dim")
            want = (k, nn) if len(x.shape) == 2 else (x.shape[0], k, nn)
            y = self.pick(scope, lambda v: v.shape == want and v.dtype == x.dtype)
            if y is None:
                y = self.b.new_input(want)
                scope.append(y)
            mag = x.mag * y.mag * k
            if mag > MAX_MAG:
                return self.op("sin", [x], x.shape, 1.0)
            out = x.shape[:-1] + (nn,)
            return self.op("matmul", [x, y], out, mag)
        if kind == "reduce":
            r = d(st.sampled_from(["sum", "mean"]), label="reduce")
            if not x.shape:
                return self.op("neg", [x], x.shape, x.mag)
            ax = d(st.one_of(st.none(), st.integers(0, len(x.shape) - 1)), label="axis")
            shape = () if ax is None else tuple(s for i, s in enumerate(x.shape) if i != ax)
            n = math.prod(x.shape) if ax is None else x.shape[ax]
            mag = x.mag * (n if r == "sum" else 1)
            if mag > MAX_MAG:
                r = "mean"
                mag = x.mag
            return self.op(r, [x], shape, mag, axis=ax)
        # layout
        lk = d(st.sampled_from(["transpose", "reshape", "broadcast"]), label="layout")
        if lk == "transpose" and len(x.shape) >= 2:
            perm = list(d(st.permutations(list(range(len(x.shape)))), label="perm"))
            return self.op("transpose", [x], tuple(x.shape[i] for i in perm), x.mag, perm=perm)
        if lk == "reshape" and x.shape:
            n = math.prod(x.shape)
            shape = [n] if len(x.shape) > 1 else [1, n]
            return self.op("reshape", [x], tuple(shape), x.mag, shape=shape)
        if len(x.shape) < 3:
            shape = (d(st.integers(1, 3), label="dim"),) + x.shape
            return self.op("broadcast", [x], shape, x.mag, shape=list(shape))
        return self.op("sin", [x], x.shape, 1.0)

    # -- statements ------------------------------------------------------------
    def gen_body(self, scope: list[Val], depth: int, n: int, in_cvjp: bool) -> list:
        d = self.draw
        body = []
        for _ in range(n):
            kinds = ["op"]
            if self.cfg.checkpoint and depth < self.cfg.max_depth:
                kinds.append("checkpoint")
            if self.cfg.custom_vjp and not in_cvjp:
                kinds.append("custom_vjp")
            k = d(st.sampled_from(kinds), label="stmt_kind")
            if k == "op":
                s, v = self.gen_op(scope, False, [])
                body.append(s)
                scope.append(v)
            elif k == "checkpoint":
                body.append(self.gen_region(scope, depth, in_cvjp))
            else:
                body.append(self.gen_cvjp(scope, depth))
        return body

    def _exports(self, inner: list[Val]) -> list[Val]:
        last = inner[-1]
        extra = self.draw(st.lists(st.sampled_from(inner), max_size=1), label="extra_export")
        return [last] + [v for v in extra if v.id != last.id]

    def gen_region(self, scope: list[Val], depth: int, in_cvjp: bool) -> Checkpoint:
        d = self.draw
        n = d(st.integers(1, max(1, self.cfg.max_stmts - 1)), label="region_len")
        inner_scope = list(scope)
        body = self.gen_body(inner_scope, depth + 1, n, in_cvjp)
        defined = inner_scope[len(scope):]
        new_inputs = [v for v in defined if v.id in self.b.types and v.id.startswith("x")]
        defined = [v for v in defined if v not in new_inputs]
        scope.extend(new_inputs)
        if not defined:  # only new inputs appeared: add a trivial op
            s, v = self.op("sin", [inner_scope[-1]], inner_scope[-1].shape, 1.0)
            body.append(s)
            defined = [v]
        exports = self._exports(defined)
        args = _free_vars(body)
        pol = d(policies(allow_offload=self.cfg.offload_policies), label="policy")
        pcse = d(st.booleans().map(lambda b: not b), label="prevent_cse")
        scope.extend(exports)
        return Checkpoint(args=args, body=body, results=[v.id for v in exports], policy=pol, prevent_cse=pcse)

    def gen_cvjp(self, scope: list[Val], depth: int) -> CustomVJP:
        d = self.draw
        nondiff = d(st.lists(st.sampled_from([0.5, 2.0]), max_size=1), label="nondiff")
        n = d(st.integers(1, 4), label="fwd_len")
        inner = list(scope)
        fwd = []
        for _ in range(n):
            s, v = self.gen_op(inner, True, nondiff)
            fwd.append(s)
            inner.append(v)
        defined = [v for v in inner[len(scope):] if not v.id.startswith("x")]
        scope.extend(v for v in inner[len(scope):] if v.id.startswith("x"))
        exports = self._exports(defined)
        args = _free_vars(fwd)
        cts = [self.b.fresh("g") for _ in exports]
        for c, e in zip(cts, exports):
            self.b.types[c] = self.b.types[e.id]
        bwd, argct, used = vjp_ops(fwd, self.b.types, [e.id for e in exports], cts, args,
                                   lambda: self.b.fresh("b"))
        # A deliberately non-standard but well-defined rule: scale one arg's cotangent.
        bwd_results = [argct.get(a) for a in args]
        if d(st.booleans(), label="nonstandard_rule"):
            k = d(st.integers(0, len(args) - 1), label="nonstandard_arg")
            if bwd_results[k] is not None:
                o = self.b.fresh("b")
                bwd.append(Op(op="scale", args=[bwd_results[k]], params={"c": 3.0}, out=o))
                bwd_results[k] = o
        order = {a: i for i, a in enumerate(args + [s.out for s in fwd])}
        residuals = sorted(used, key=order.__getitem__)
        sz = d(st.booleans(), label="symbolic_zeros")
        # optimize_remat with symbolic_zeros is documented as unsupported (NotImplementedError):
        # generated rarely, to check that every pipeline rejects it the same way.
        orm = d(st.sampled_from([False] * 7 + [True] if sz else [False, True]), label="optimize_remat")
        scope.extend(exports)
        return CustomVJP(args=args, fwd=fwd, results=[e.id for e in exports], residuals=residuals, cts=cts,
                         bwd=bwd, bwd_results=bwd_results, nondiff=nondiff, symbolic_zeros=sz,
                         optimize_remat=orm)


def _free_vars(body) -> list[str]:
    """Ids read by `body` that it does not define, in first-use order."""
    defined, free = set(), []

    def visit(b):
        for s in b:
            for a in s.args:
                if a not in defined and a not in free:
                    free.append(a)
            if isinstance(s, Op):
                defined.add(s.out)
            elif isinstance(s, Checkpoint):
                # its args were counted; its body only reads its args
                defined.update(s.results)
                _mark_defined(s.body, defined)
            elif isinstance(s, CustomVJP):
                defined.update(s.results)
                _mark_defined(s.fwd, defined)
    visit(body)
    return free


def _mark_defined(body, defined):
    for s in body:
        if isinstance(s, Op):
            defined.add(s.out)
        elif isinstance(s, Checkpoint):
            defined.update(s.results)
            _mark_defined(s.body, defined)
        elif isinstance(s, CustomVJP):
            defined.update(s.results)
            _mark_defined(s.fwd, defined)


@st.composite
def programs(draw, cfg: Config | None = None) -> Program:
    cfg = cfg or Config()
    g = _Gen(draw, cfg)
    scope = [g.b.new_input(_shape(draw))]
    n_extra = draw(st.integers(0, 1), label="extra_inputs")
    for _ in range(n_extra):
        scope.append(g.b.new_input(_shape(draw)))
    n = draw(st.integers(1, cfg.max_stmts), label="n_stmts")
    body = g.gen_body(scope, 0, n, False)
    produced = [v for v in scope if not v.id.startswith("x")]
    last = produced[-1] if produced else scope[0]
    outs = [last.id]
    extra = draw(st.lists(st.sampled_from(produced or scope), max_size=1), label="extra_output")
    outs += [v.id for v in extra if v.id not in outs]
    order = 2 if (cfg.second_order and draw(st.integers(0, 7), label="second_order") == 7) else 1
    prog = Program(inputs=g.b.inputs, body=body, outputs=outs, diff=Diff(order=order))
    return validate(prog)


def input_values(prog: Program, seed: int) -> dict[str, np.ndarray]:
    """Deterministic input values in [-1, 1] for a program, from a seed."""
    rng = np.random.default_rng(seed)
    return {i.id: rng.uniform(-1.0, 1.0, size=i.shape).astype(i.dtype) for i in prog.inputs}


@st.composite
def cases(draw, cfg: Config | None = None):
    """(program, input seed)."""
    prog = draw(programs(cfg))
    seed = draw(st.integers(0, 2 ** 16), label="input_seed")
    return prog, seed
