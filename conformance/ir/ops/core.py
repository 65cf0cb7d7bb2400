"""The op table: every IR op declared once.

A declaration says everything the harness needs to know about an op that is not
framework-specific: arity and parameters, shape inference (validation), its derivative
as IR statements (custom-rule bwd bodies), program features, the generator's hints
(family, how to draw operands and params, the magnitude of its output), the values an op
saves for its own backward (residual oracle), the policy classes it belongs to (dots),
and how pseudo-code prints it. Each framework adds one table `op -> source template`
(conformance/pipelines/*_table.py); the pipelines compile those templates and the repro
emitters paste them, so a lowering and its repro cannot drift apart.

This module is part of the program layer: it imports numpy and the dtype declarations
(conformance.ir.dtypes) only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from conformance.ir.dtypes import DTYPES

NAME_OP = "name"   # checkpoint_name(x, name): the op whose params carry a checkpoint name
NAME_FWD_OP = "name_fwd"   # checkpoint_name_fwd(x, name): a name for custom_vjp fwd rules
NAME_OPS = (NAME_OP, NAME_FWD_OP)   # every op that carries a checkpoint name
ND_INDEX = "index"  # the param of in-rule ops that selects a custom_vjp nondiff argument
MAX_MAG = 50.0      # generator: outputs stay below this magnitude
GEN_MAX_DIM = 64    # generator: dimensions stay within ir.Limits' default
FALLBACK_OP = "tanh"  # generator: bounded, any shape; used where an op's hint does not apply
ACC_OP = "add"        # derivative rules: accumulates cotangents
SCALE_OP = "scale"    # x * c (params: c); the generator's deliberately non-standard bwd rules
SIMPLEST_OP = "neg"   # unary, same type, linear: no residual, one-statement derivative rules
# Op kinds a framework's policy cannot tell apart: they lower to the same primitive (JAX `mul` for
# x * y, x * c and x * nondiff; `reduce_sum` inside a mean), so an `ops` policy naming one saves
# the others' outputs too (tests/test_tables.py derives the groups from the lowering tables).
POLICY_ALIKE = (("mul", "scale", "nondiff_scale", "dropout", "mul_", "scale_by_max", "functional_scale"),
                ("sum", "mean"), ("step", "cast"), ("add", "add_"), ("relu", "relu_"), ("transpose", "matrix_t"),
                ("slice", "select"), ("cos", "grad_of_sin"))


class ParamError(ValueError):
    """An op whose args or params do not type-check. `field` is relative to the op (args, params.c)."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


@dataclass(frozen=True)
class OpDecl:
    name: str
    arity: int
    family: str                      # generator's first-level choice; families appear in declaration order
    infer: Callable                  # (shapes, params, nondiff) -> output shape; raises ParamError
    params: tuple[str, ...] = ()
    vjp: Callable | None = None      # (d: Vjp, s: Op) -> None; None: not allowed inside custom rules
    gen: Callable | None = None      # (c: Chooser, x) -> (op, args, params, mag) | None; None: not generated
    features: tuple[str, ...] = ()   # program features an occurrence gives
    batched_feature: str | None = None   # feature instead of features[0] when the op is batched
    outside_factors: Callable | None = None  # (a, y) -> arrays the op saves for its own backward
    pseudo: str | None = None        # pseudo-code template; default: name(x, k=v, ...)
    dot: bool = False                # saved by the dots policies (JAX: dot_general, conv_general_dilated)
    dot_no_batch: bool = False       # saved by the dots-without-batch-dims policies when not batched
    in_rules_only: bool = False      # only inside custom_vjp fwd/bwd rules
    in_fwd_only: bool = False        # generated only inside custom_vjp fwd rules
    nonsmooth: bool = False          # derivative jumps where its input crosses 0 (or where `kink` is 0)
    kink: Callable | None = None     # (input, params) -> distances to where the derivative jumps; None: |input|
    # Forward mode (custom_jvp rules), from the declarations: "linear" (the op applied to the
    # tangents), "identity" (the tangent itself: a name tags primal values only), "diagonal"
    # (elementwise: the vjp rule with the tangent as cotangent),
    # "bilinear" (op(tx, y) + op(x, ty)), "zero" (piecewise constant); None: no jvp rule.
    tangent: str | None = None
    out_dtype: Callable | None = None   # params -> the output's dtype; None: its first input's
    view: bool = False               # PyTorch returns a view of its first input (shares its memory)
    inplace: bool = False            # mutates its first input in PyTorch, which nothing reads afterwards
    keeps_output: bool = False       # its derivative reads its output (PyTorch saves it for backward)
    # What JAX keeps without a checkpoint that a region drops whatever its policy (oracles.residuals judges a region
    # whose policy saves everything against the program without checkpoint): "extra" where the program without
    # checkpoint keeps a residual of its own (a literal seed of an inner grad, a jitted function's output, dropout's
    # mask, a callback's), "constant" where the lowering takes a constant operand (jnp.asarray(c), pad's value)
    # that it may keep as an unmatched scalar.
    baseline_keeps: str = ""

    def batched(self, shapes) -> bool:
        return self.batched_feature is not None and len(shapes[0]) == 3


OPS: dict[str, OpDecl] = {}


class Feature(NamedTuple):
    """A program feature: what it means, and the generator's swarm dimensions a program needs on to
    have it (a campaign round that aims at it turns them on; none: it is not aimed at)."""
    doc: str
    focus: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()   # the release APIs it is written with (conformance.ir.releases)


FEATURES: dict[str, Feature] = {}      # the op table's features (conformance.ir.features adds the others)
FEATURE_DOC: dict[str, str] = {}


def define(name: str, arity: int, family: str, infer, **kw) -> OpDecl:
    d = OpDecl(name, arity, family, infer, **kw)
    OPS[name] = d
    return d


def feature(name: str, doc: str, *focus: str, needs: tuple[str, ...] = ()) -> str:
    FEATURES[name] = Feature(doc, focus, needs)
    FEATURE_DOC[name] = doc
    return name


# ---- validation helpers ------------------------------------------------------------------------
def is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _number(p, k):
    if not (isinstance(p[k], (int, float)) and not isinstance(p[k], bool) and math.isfinite(p[k])):
        raise ParamError(f"params.{k}", "must be a finite number")


def _axis(p, k, rank, allow_none=False):
    ax = p[k]
    if ax is None and allow_none:
        return
    if not is_int(ax) or not (0 <= ax < rank):
        raise ParamError(f"params.{k}", f"axis {ax!r} out of range for rank {rank}")


def _shape_param(p, k):
    shp = p[k]
    if not isinstance(shp, list) or not all(is_int(d) and d >= 1 for d in shp):
        raise ParamError(f"params.{k}", f"not a shape: {shp!r}")
    return tuple(shp)


def infer_same(shapes, p, nd):
    return shapes[0]


def infer_equal(shapes, p, nd):
    if shapes[0] != shapes[1]:
        raise ParamError("args", f"needs equal shapes, got {list(shapes[0])} and {list(shapes[1])}")
    return shapes[0]


def bcast_ok(src, dst) -> bool:
    return len(src) <= len(dst) and all(a == b or a == 1 for a, b in zip(reversed(src), reversed(dst)))


# ---- generator helpers -------------------------------------------------------------------------
# A Chooser (generators/programs.py) draws: int(lo, hi, label), choice(seq, label), perm(n, label),
# operand(pred) -> value or None, new_input(shape, dtype) -> value, checkpoint_name(), nondiff (list),
# dtypes (the dtypes values may have).
def _bounded(c, x):
    return None, [x], {}, 1.0


def _keep(c, x):
    return None, [x], {}, x.mag


def _gen_exp(c, x):
    return None if x.mag > 3 else (None, [x], {}, math.exp(x.mag))


def _gen_square(c, x):
    return None, [x], {}, x.mag ** 2


def _gen_scale(c, x):
    k = c.choice([2.0, 0.5, -1.5], "scale")
    return None, [x], {"c": k}, x.mag * abs(k)


def _gen_binary(kind):
    def gen(c, x):
        y = c.operand(lambda v: v.shape == x.shape and v.dtype == x.dtype)
        return None, [x, y], {}, (x.mag * y.mag if kind == "mul" else x.mag + y.mag)
    return gen


def _gen_name(c, x):
    return None, [x], {"name": c.checkpoint_name()}, x.mag


def _gen_nondiff_scale(c, x):
    if not c.nondiff:
        return None
    ix = c.int(0, len(c.nondiff) - 1, "nondiff_index")
    return None, [x], {ND_INDEX: ix}, x.mag * abs(c.nondiff[ix])


def _gen_matmul(c, x):
    if len(x.shape) not in (2, 3):   # make a matrix out of it first
        shape = [c.int(1, 4, "dim")] + (list(x.shape) if len(x.shape) == 1 else [c.int(1, 4, "dim")])
        return "broadcast", [x], {"shape": shape}, x.mag
    k, n = x.shape[-1], c.int(1, 4, "dim")
    want = (k, n) if len(x.shape) == 2 else (x.shape[0], k, n)
    y = c.operand(lambda v: v.shape == want and v.dtype == x.dtype) or c.new_input(want, x.dtype)
    return None, [x, y], {}, x.mag * y.mag * k


def _gen_reduce(kind):
    def gen(c, x):
        if not x.shape:
            return None
        ax = c.choice([None] + list(range(len(x.shape))), "axis")
        mag = x.mag * (math.prod(x.shape) if ax is None else x.shape[ax]) if kind == "sum" else x.mag
        if mag > MAX_MAG:
            return "mean", [x], {"axis": ax}, x.mag
        return None, [x], {"axis": ax}, mag
    return gen


def _gen_transpose(c, x):
    if len(x.shape) < 2:
        return None
    return None, [x], {"perm": c.perm(len(x.shape), "perm")}, x.mag


def _gen_reshape(c, x):
    if not x.shape:
        return None
    n = math.prod(x.shape)
    if n > GEN_MAX_DIM:
        return None
    return None, [x], {"shape": [n] if len(x.shape) > 1 else [1, n]}, x.mag


def _gen_broadcast(c, x):
    if len(x.shape) >= 3:
        return None
    return None, [x], {"shape": [c.int(1, 3, "dim")] + list(x.shape)}, x.mag


# ---- derivatives (reverse mode, as IR statements) ------------------------------------------------
# A Vjp (generators/irgrad.py) offers emit(op, args, **params) -> id, acc(x, g), ct(s), types.
def vjp_unary(rule):
    def vjp(d, s):
        g = d.ct(s)
        d.acc(s.args[0], rule(d, s, g, s.args[0]))
    return vjp


def _vjp_tanh(d, s, g, a):
    return d.emit("sub", [g, d.emit("mul", [d.emit("mul", [g, s.out]), s.out])])


def _vjp_sigmoid(d, s, g, a):
    gy = d.emit("mul", [g, s.out])
    return d.emit("sub", [gy, d.emit("mul", [gy, s.out])])


def _vjp_binary(kind):
    def vjp(d, s):
        g, (a, b) = d.ct(s), s.args
        if kind == "mul":
            d.acc(a, d.emit("mul", [g, b]))
            d.acc(b, d.emit("mul", [g, a]))
        else:
            d.acc(a, g)
            d.acc(b, g if kind == "add" else d.emit("neg", [g]))
    return vjp


def _vjp_matmul(d, s):
    g, (a, b) = d.ct(s), s.args
    perm = [1, 0] if len(d.types[a][0]) == 2 else [0, 2, 1]
    d.acc(a, d.emit("matmul", [g, d.emit("transpose", [b], perm=perm)]))
    d.acc(b, d.emit("matmul", [d.emit("transpose", [a], perm=perm), g]))


def _vjp_reduce(d, s):
    g, a = d.ct(s), s.args[0]
    shp, ax = list(d.types[a][0]), s.params["axis"]
    kd = [1] * len(shp) if ax is None else [1 if i == ax else n for i, n in enumerate(shp)]
    n = math.prod(shp) if ax is None else shp[ax]
    b = d.emit("broadcast", [d.emit("reshape", [g], shape=kd)], shape=shp) if shp else g
    d.acc(a, d.emit("scale", [b], c=1.0 / n) if s.op == "mean" else b)


def _inv(perm):
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return inv


def _vjp_broadcast(d, s):
    g, a = d.ct(s), s.args[0]
    src, dst = list(d.types[a][0]), list(s.params["shape"])
    cur = g
    for _ in range(len(dst) - len(src)):
        cur = d.emit("sum", [cur], axis=0)
    cur_shape = dst[len(dst) - len(src):]
    for ax in range(len(src) - 1, -1, -1):
        if src[ax] == 1 and cur_shape[ax] != 1:
            cur = d.emit("sum", [cur], axis=ax)
            cur_shape = cur_shape[:ax] + cur_shape[ax + 1:]
    if cur_shape != src:
        cur = d.emit("reshape", [cur], shape=src)
    d.acc(a, cur)


# ---- shape inference -------------------------------------------------------------------------------
def _infer_scale(shapes, p, nd):
    _number(p, "c")
    return shapes[0]


def _infer_nondiff_scale(shapes, p, nd):
    ix = p[ND_INDEX]
    if not is_int(ix) or not (0 <= ix < len(nd)):
        raise ParamError(f"params.{ND_INDEX}", f"no nondiff argument {ix!r} (block has {len(nd)})")
    return shapes[0]


def _infer_name(shapes, p, nd):
    n = p["name"]
    if not isinstance(n, str) or not n or not n.isidentifier():
        raise ParamError("params.name", f"name must be a non-empty identifier, got {n!r}")
    return shapes[0]


def _infer_matmul(shapes, p, nd):
    a, b = shapes
    if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
        return (a[0], b[1])
    if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
        return (a[0], a[1], b[2])
    raise ParamError("args", f"matmul needs (m,k)@(k,n) or (b,m,k)@(b,k,n), got {list(a)}@{list(b)}")


def _infer_reduce(shapes, p, nd):
    _axis(p, "axis", len(shapes[0]), allow_none=True)
    return () if p["axis"] is None else tuple(d for i, d in enumerate(shapes[0]) if i != p["axis"])


def _infer_transpose(shapes, p, nd):
    perm, s0 = p["perm"], shapes[0]
    if not isinstance(perm, list) or not all(is_int(i) for i in perm) or sorted(perm) != list(range(len(s0))):
        raise ParamError("params.perm", f"not a permutation of rank {len(s0)}: {perm!r}")
    return tuple(s0[i] for i in perm)


def _infer_reshape(shapes, p, nd):
    shp = _shape_param(p, "shape")
    if math.prod(shp) != math.prod(shapes[0]):
        raise ParamError("params.shape", f"cannot reshape {list(shapes[0])} to {list(shp)}")
    return shp


def _infer_broadcast(shapes, p, nd):
    shp = _shape_param(p, "shape")
    if not bcast_ok(shapes[0], shp):
        raise ParamError("params.shape", f"cannot broadcast {list(shapes[0])} to {list(shp)}")
    return shp


# ---- the declarations --------------------------------------------------------------------------------
define("sin", 1, "unary", infer_same, vjp=vjp_unary(lambda d, s, g, a: d.emit("mul", [g, d.emit("cos", [a])])),
       gen=_bounded, outside_factors=lambda a, y: [np.cos(a)], tangent="diagonal")
define("cos", 1, "unary", infer_same,
       vjp=vjp_unary(lambda d, s, g, a: d.emit("mul", [g, d.emit("neg", [d.emit("sin", [a])])])),
       gen=_bounded, outside_factors=lambda a, y: [np.sin(a), -np.sin(a)], tangent="diagonal")
define("tanh", 1, "unary", infer_same, vjp=vjp_unary(_vjp_tanh), gen=_bounded, outside_factors=lambda a, y: [1 - y * y],
       tangent="diagonal", keeps_output=True)
define("exp", 1, "unary", infer_same, vjp=vjp_unary(lambda d, s, g, a: d.emit("mul", [g, s.out])), gen=_gen_exp,
       tangent="diagonal", keeps_output=True)
define("sigmoid", 1, "unary", infer_same, vjp=vjp_unary(_vjp_sigmoid), gen=_bounded,
       outside_factors=lambda a, y: [y * (1 - y)], tangent="diagonal", keeps_output=True)
define(
    "square",
    1,
    "unary",
    infer_same,
    vjp=vjp_unary(lambda d, s, g, a: d.emit("scale", [d.emit("mul", [g, a])], c=2.0)),
    gen=_gen_square,
    tangent="diagonal",
    outside_factors=lambda a, y: [2 * a],
)   # JAX keeps 2x for x**2
define(
    "neg",
    1,
    "unary",
    infer_same,
    vjp=vjp_unary(lambda d, s, g, a: d.emit("neg", [g])),
    gen=_keep,
    pseudo="-{x}",
    tangent="linear",
)
define(
    "scale",
    1,
    "unary",
    _infer_scale,
    params=("c",),
    vjp=vjp_unary(lambda d, s, g, a: d.emit("scale", [g], c=s.params["c"])),
    gen=_gen_scale,
    pseudo="{x} * {c}",
    tangent="linear",
    baseline_keeps="constant",
)
define(NAME_OP, 1, "name", _infer_name, params=("name",), vjp=vjp_unary(lambda d, s, g, a: g), gen=_gen_name,
       pseudo="checkpoint_name({x}, {name})", tangent="identity")
# jax.ad_checkpoint.checkpoint_name_fwd: under remat3 a name whose saved value the backward
# pass uses as is (checkpoint_name: primal from the saved value, tangent from the recompute);
# the same name_p under remat2. Its promise: a name like checkpoint_name for every policy,
# values unchanged. Generated in custom_vjp fwd rules, where it is meant to be used.
define(NAME_FWD_OP, 1, "name", _infer_name, params=("name",), vjp=vjp_unary(lambda d, s, g, a: g), gen=_gen_name,
       pseudo="checkpoint_name_fwd({x}, {name})", in_fwd_only=True, baseline_keeps="extra",
       features=(feature("names_fwd", "checkpoint_name_fwd in a custom rule's primal code (custom_vjp fwd, "
                                      "custom_jvp body)", needs=("jax.ad_checkpoint.checkpoint_name_fwd",)),),
       tangent="identity")
define(
    "add",
    2,
    "binary",
    infer_equal,
    vjp=_vjp_binary("add"),
    gen=_gen_binary("add"),
    pseudo="{x} + {y}",
    tangent="linear",
)
define(
    "sub",
    2,
    "binary",
    infer_equal,
    vjp=_vjp_binary("sub"),
    gen=_gen_binary("sub"),
    pseudo="{x} - {y}",
    tangent="linear",
)
define(
    "mul",
    2,
    "binary",
    infer_equal,
    vjp=_vjp_binary("mul"),
    gen=_gen_binary("mul"),
    pseudo="{x} * {y}",
    tangent="bilinear",
)
define("matmul", 2, "matmul", _infer_matmul, vjp=_vjp_matmul, gen=_gen_matmul, pseudo="{x} @ {y}", dot=True,
       dot_no_batch=True, features=(feature("matmul", "a matrix product"),),
       batched_feature=feature("batch_matmul", "a batched matrix product"), tangent="bilinear")
_RED = feature("reduction", "sum or mean")
define(
    "sum",
    1,
    "reduce",
    _infer_reduce,
    params=("axis",),
    vjp=_vjp_reduce,
    gen=_gen_reduce("sum"),
    features=(_RED,),
    tangent="linear",
)
define("mean", 1, "reduce", _infer_reduce, params=("axis",), vjp=_vjp_reduce, gen=_gen_reduce("mean"),
       features=(_RED,), tangent="linear")
_LAYOUT = feature("layout", "transpose, reshape or broadcast")
define("transpose", 1, "layout", _infer_transpose, params=("perm",),
       vjp=vjp_unary(lambda d, s, g, a: d.emit("transpose", [g], perm=_inv(s.params["perm"]))),
       gen=_gen_transpose, features=(_LAYOUT,), tangent="linear", view=True)
define("reshape", 1, "layout", _infer_reshape, params=("shape",),
       vjp=vjp_unary(lambda d, s, g, a: d.emit("reshape", [g], shape=list(d.types[a][0]))),
       gen=_gen_reshape, features=(_LAYOUT,), tangent="linear", view=True)
define("broadcast", 1, "layout", _infer_broadcast, params=("shape",), vjp=_vjp_broadcast, gen=_gen_broadcast,
       features=(_LAYOUT,), tangent="linear", view=True)
define("nondiff_scale", 1, "nondiff", _infer_nondiff_scale, params=(ND_INDEX,),
       vjp=vjp_unary(lambda d, s, g, a: d.emit("nondiff_scale", [g], **{ND_INDEX: s.params[ND_INDEX]})),
       gen=_gen_nondiff_scale, pseudo="{x} * nondiff[{index}]", in_rules_only=True, tangent="linear",
       baseline_keeps="constant")


_NONSMOOTH = feature("nonsmooth", "relu or step: a derivative that jumps at 0 (value checks skip programs whose "
                                  "inputs sit at the kink)")
define("relu", 1, "nonsmooth", infer_same, gen=_keep, nonsmooth=True, features=(_NONSMOOTH,), keeps_output=True,
       vjp=vjp_unary(lambda d, s, g, a: d.emit("mul", [g, d.emit("step", [a])])), tangent="diagonal")
define("step", 1, "nonsmooth", infer_same, gen=_bounded, nonsmooth=True, features=(_NONSMOOTH,),
       vjp=lambda d, s: None, tangent="zero")   # piecewise constant: no cotangent for its argument


def _gen_slice(c, x):
    if not x.shape:
        return None
    ax = c.int(0, len(x.shape) - 1, "axis")
    start = c.int(0, x.shape[ax] - 1, "start")
    stop = c.int(start + 1, x.shape[ax], "stop")
    return None, [x], {"axis": ax, "start": start, "stop": stop}, x.mag


def _gen_pad(c, x):
    if not x.shape:
        return None
    ax = c.int(0, len(x.shape) - 1, "axis")
    before, after = c.int(0, 2, "before"), c.int(1, 2, "after")
    if x.shape[ax] + before + after > GEN_MAX_DIM:   # (a flattened value of 64 elements, padded)
        return None
    return None, [x], {"axis": ax, "before": before, "after": after}, x.mag


def _vjp_slice(d, s):
    p, n = s.params, d.types[s.args[0]][0][s.params["axis"]]
    d.acc(s.args[0], d.emit("pad", [d.ct(s)], axis=p["axis"], before=p["start"], after=n - p["stop"]))


def _vjp_pad(d, s):
    p, n = s.params, d.types[s.args[0]][0][s.params["axis"]]
    d.acc(s.args[0], d.emit("slice", [d.ct(s)], axis=p["axis"], start=p["before"], stop=p["before"] + n))


def _infer_slice(shapes, p, nd):
    s0 = shapes[0]
    _axis(p, "axis", len(s0))
    n = s0[p["axis"]]
    st, sp = p["start"], p["stop"]
    if not (is_int(st) and is_int(sp) and 0 <= st < sp <= n):
        raise ParamError("params", f"need 0 <= start < stop <= {n}, got start={st!r} stop={sp!r}")
    return tuple(sp - st if i == p["axis"] else d for i, d in enumerate(s0))


def _infer_pad(shapes, p, nd):
    s0 = shapes[0]
    _axis(p, "axis", len(s0))
    for k in ("before", "after"):
        if not is_int(p[k]) or not 0 <= p[k] <= 64:
            raise ParamError(f"params.{k}", f"must be an integer in [0, 64], got {p[k]!r}")
    return tuple(d + p["before"] + p["after"] if i == p["axis"] else d for i, d in enumerate(s0))


_SLICING = feature("slicing", "slice or pad (a view, and its inverse, in PyTorch)")
define("slice", 1, "slicing", _infer_slice, params=("axis", "start", "stop"), vjp=_vjp_slice, gen=_gen_slice,
       features=(_SLICING,), tangent="linear", view=True)
define("pad", 1, "slicing", _infer_pad, params=("axis", "before", "after"), vjp=_vjp_pad, gen=_gen_pad,
       features=(_SLICING,), tangent="linear", baseline_keeps="constant")


def _gen_conv1d(c, x):
    if len(x.shape) != 3:
        return None
    want = (c.int(1, 4, "dim"), x.shape[1], c.int(1, x.shape[2], "kernel"))
    w = c.operand(lambda v: v.shape == want and v.dtype == x.dtype) or c.new_input(want, x.dtype)
    return None, [x, w], {}, x.mag * w.mag * want[1] * want[2]


def _infer_conv1d(shapes, p, nd):
    x, w = shapes
    if len(x) != 3 or len(w) != 3 or x[1] != w[1] or w[2] > x[2]:
        raise ParamError("args", f"conv1d needs (n,c,w) and (o,c,k) with k <= w, got {list(x)} and {list(w)}")
    return (x[0], w[0], x[2] - w[2] + 1)


# A 1-D convolution (n, c, w) * (o, c, k) -> (n, o, w - k + 1). JAX's dots_saveable saves
# convolutions, dots_with_no_batch_dims_saveable does not; no IR derivative (not in custom rules).
define("conv1d", 2, "conv", _infer_conv1d, gen=_gen_conv1d, dot=True,
       features=(feature("conv", "a 1-D convolution"),))


# A cast to another floating dtype (mixed precision: bfloat16 compute from float32 values and
# back). Its cotangent is cast back to the input's dtype. The float64 value reference keeps every
# value in float64 (a cast there is the identity).
CAST_OP = "cast"
FLOAT_DTYPES = tuple(DTYPES)   # (conformance.ir.dtypes declares them)


def _infer_cast(shapes, p, nd):
    if p["dtype"] not in FLOAT_DTYPES:
        raise ParamError("params.dtype", f"not a floating dtype: {p['dtype']!r}; known: {list(FLOAT_DTYPES)}")
    return shapes[0]


def _gen_cast(c, x):
    to = [d for d in c.dtypes if d != x.dtype]
    return None if not to else (None, [x], {"dtype": c.choice(to, "dtype")}, x.mag)


define(CAST_OP, 1, "cast", _infer_cast, params=("dtype",), gen=_gen_cast, tangent="linear",
       vjp=vjp_unary(lambda d, s, g, a: d.emit(CAST_OP, [g], dtype=d.types[a][1])),
       out_dtype=lambda p: p["dtype"], pseudo="{x}.astype({dtype})",
       features=(feature("cast", "a cast to another floating dtype (mixed precision)"),))


# Dropout (training mode): p of the elements zeroed, the rest scaled by 1/(1-p). PyTorch draws
# from its generator (seeded per run: a recompute must restore the RNG state); JAX from the
# statement's `seed` (dropout_mask, pasted into jax_table's prelude). The masks differ: values
# are compared within a framework only. No IR derivative (not in custom rules).
DROPOUT_PS = (0.5, 0.25)
DROPOUT_SEEDS = 4   # the generator's JAX mask seeds (a wide range cost shrinks hundreds of steps)


def _infer_dropout(shapes, p, nd):
    _number(p, "p")
    if not 0 < p["p"] < 1:
        raise ParamError("params.p", f"drop probability {p['p']!r} not in (0, 1)")
    if not is_int(p["seed"]) or not 0 <= p["seed"] < 2 ** 31:
        raise ParamError("params.seed", f"not a seed in [0, 2**31): {p['seed']!r}")
    return shapes[0]


def dropout_mask(shape, p, seed):
    """Dropout's keep-mask scaled by 1/(1-p), drawn (numpy) from the statement's seed: JAX draws
    functionally, so every JAX pipeline multiplies by the same constant."""
    import numpy
    keep = numpy.random.default_rng(seed).random(tuple(shape)) >= p
    return keep.astype(numpy.float64) / (1 - p)


def _gen_dropout(c, x):
    p = c.choice(list(DROPOUT_PS), "p")
    return None, [x], {"p": p, "seed": c.choice(list(range(DROPOUT_SEEDS)), "seed")}, x.mag / (1 - p)


define("dropout", 1, "random", _infer_dropout, params=("p", "seed"), gen=_gen_dropout, baseline_keeps="extra",
       pseudo="dropout({x}, p={p})", features=(feature("random", "dropout: a random op inside or outside regions "
                                                                 "(values compared within a framework only)",
                                                         "family:random"),))


# An effect: a callback that runs each time the op is executed, its value the input's. JAX:
# jax.debug.callback (ordered or not) on the value, io_callback (ordered or not) on its
# stop_gradient (an io_callback has no derivative). Not drawn by op family (`gen` None): the
# generator's opt-in `effects` dimension places one after an op (generators.programs).
EFFECT_OP = "effect"
EFFECT_KINDS = ("callback", "ordered", "io", "io_ordered")
IO_EFFECTS = ("io", "io_ordered")


def _infer_effect(shapes, p, nd):
    if p["kind"] not in EFFECT_KINDS:
        raise ParamError("params.kind", f"must be one of {list(EFFECT_KINDS)}, got {p['kind']!r}")
    return shapes[0]


define(EFFECT_OP, 1, "effect", _infer_effect, params=("kind",), vjp=vjp_unary(lambda d, s, g, a: g),
       pseudo="effect({x}, {kind})", tangent="identity", baseline_keeps="extra",
       features=(feature("effects", "a callback effect on a value (jax.debug.callback, io_callback; ordered or "
                                    "not): how often it runs is recorded", "effects"),))
