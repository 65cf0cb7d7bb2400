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

from conformance import ops as O
from conformance.ir import Checkpoint, CustomVJP, Diff, Input, Op, Program, free_vars, validate
from conformance.policy import KINDS
from generators.irgrad import vjp_ops

NAME_POOL = ("a", "b", "c")


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


def policy_ops() -> list[str]:
    """Op kinds an `ops` policy may name: every op the generator emits outside custom rules."""
    return [o for f in O.generated_families(False) for o in O.family_ops(f, False)]


def policies(names=NAME_POOL, allow_offload=True, depth=0):
    """Strategy for framework-neutral policies, one branch per declared policy kind."""
    nm = st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True)
    fill = {"names": nm, "saved": nm, "offloaded": nm,
            "ops": st.lists(st.sampled_from(policy_ops()), min_size=1, max_size=3, unique=True)}
    branches = []
    for k in KINDS.values():
        if (k.offloads and not allow_offload) or (("a" in k.fields) and depth >= 1):
            continue
        if "a" in k.fields:
            sub = policies(names, allow_offload, depth + 1)
            branches.append(st.tuples(sub, sub).map(lambda t, m=k.model: m(a=t[0], b=t[1])))
        elif k.fields == ("saved", "offloaded"):
            branches.append(st.tuples(nm, nm).map(lambda t, m=k.model: m(
                saved=t[0], offloaded=[n for n in t[1] if n not in t[0]])))
        else:
            branches.append(st.fixed_dictionaries({f: fill[f] for f in k.fields}).map(lambda kw, m=k.model: m(**kw)))
    return st.one_of(*branches)


class _Gen:
    def __init__(self, draw, cfg: Config):
        self.draw = draw
        self.cfg = cfg
        dtype = draw(st.sampled_from(cfg.dtypes), label="dtype")
        self.b = Builder(draw, cfg, dtype)
        self.scope: list[Val] = []
        self.nondiff: list[float] = []

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

    def op(self, kind, args: list[Val], mag, **params) -> tuple[Op, Val]:
        o = self.b.fresh()
        shape = O.infer(kind, [a.shape for a in args], params, self.nondiff)
        self.b.types[o] = (tuple(shape), args[0].dtype)
        return Op(op=kind, args=[a.id for a in args], params=params, out=o), Val(o, tuple(shape), args[0].dtype, mag)

    # -- the Chooser the op table's generator hints draw with ----------------------------
    def int(self, lo, hi, label):
        return self.draw(st.integers(lo, hi), label=label)

    def choice(self, seq, label):
        return self.draw(st.sampled_from(list(seq)), label=label)

    def perm(self, n, label):
        return list(self.draw(st.permutations(list(range(n))), label=label))

    def operand(self, pred):
        return self.pick(self.scope, pred)

    def new_input(self, shape):
        v = self.b.new_input(shape)
        self.scope.append(v)
        return v

    def checkpoint_name(self):
        return self.draw(st.sampled_from(NAME_POOL), label="name")

    def gen_op(self, scope: list[Val], in_fwd: bool, nondiff: list[float]) -> tuple[Op, Val]:
        """One op, by the op table: a family, an op of it, then its own hint draws the rest."""
        self.scope, self.nondiff = scope, nondiff
        family = self.choice(O.generated_families(in_fwd, bool(nondiff)), "op_kind")
        kind = self.choice(O.family_ops(family, in_fwd, bool(nondiff)), family)
        x = self.pick(scope)
        plan = O.OPS[kind].gen(self, x)
        if plan is None:
            return self.op(O.FALLBACK_OP, [x], 1.0)
        other, args, params, mag = plan
        if mag > O.MAX_MAG:
            return self.op(O.FALLBACK_OP, [x], 1.0)
        return self.op(other or kind, args, mag, **params)

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
            s, v = self.op(O.FALLBACK_OP, [inner_scope[-1]], 1.0)
            body.append(s)
            defined = [v]
        exports = self._exports(defined)
        args = free_vars(body)
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
        args = free_vars(fwd)
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
                bwd.append(Op(op=O.SCALE_OP, args=[bwd_results[k]], params={"c": 3.0}, out=o))
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
