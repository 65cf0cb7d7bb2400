"""Ops whose PyTorch output shares memory with an input: views a policy can name (`matrix_t`,
`select`, beside the layout and slicing ops of conformance.ir.ops) and in-place ops (`add_`,
`mul_`, `relu_`). Declared with conformance.ir.ops.define like every other op; conformance.ir.ops
imports this module at its end.

In-place semantics in the IR: `z = add_(x, y)` computes x + y and *consumes* x: nothing after
it reads x (conformance.ir.typecheck enforces it), so the functional meaning (JAX) and the
mutating one (PyTorch) agree. x must be an op's output in the same body, neither a view nor
a value a view was taken of (a mutation would show through the alias). PyTorch still raises
where autograd saved x for a backward (the generator avoids that: it mutates values nothing
has read, whose producer does not keep its output), and selective checkpointing raises where
its policy cached x.
"""
from __future__ import annotations

from conformance.ir.ops.core import ParamError, define, feature, infer_equal, infer_same, is_int, vjp_unary

# ---- views ----------------------------------------------------------------------------------
_VIEW = feature("view", "matrix_t (x.t()) or select: a view op a policy can name", "family:view")


def _infer_t(shapes, p, nd):
    if len(shapes[0]) != 2:
        raise ParamError("args", f"matrix_t needs a matrix, got shape {list(shapes[0])}")
    return shapes[0][::-1]


def _gen_t(c, x):
    return None if len(x.shape) != 2 else (None, [x], {}, x.mag)


def _infer_select(shapes, p, nd):
    s0 = shapes[0]
    if not is_int(p["axis"]) or not 0 <= p["axis"] < len(s0):
        raise ParamError("params.axis", f"axis {p['axis']!r} out of range for rank {len(s0)}")
    if not is_int(p["index"]) or not 0 <= p["index"] < s0[p["axis"]]:
        raise ParamError("params.index", f"index {p['index']!r} out of range for size {s0[p['axis']]}")
    return tuple(d for i, d in enumerate(s0) if i != p["axis"])


def _vjp_select(d, s):
    p, shp = s.params, list(d.types[s.args[0]][0])
    kd = [1 if i == p["axis"] else n for i, n in enumerate(shp)]
    g = d.emit("reshape", [d.ct(s)], shape=kd)
    d.acc(s.args[0], d.emit("pad", [g], axis=p["axis"], before=p["index"], after=shp[p["axis"]] - p["index"] - 1))


def _gen_select(c, x):
    if not x.shape:
        return None
    ax = c.int(0, len(x.shape) - 1, "axis")
    return None, [x], {"axis": ax, "index": c.int(0, x.shape[ax] - 1, "index")}, x.mag


define("matrix_t", 1, "view", _infer_t, gen=_gen_t, pseudo="{x}.T", features=(_VIEW,), view=True, tangent="linear",
       vjp=vjp_unary(lambda d, s, g, a: d.emit("matrix_t", [g])))
define("select", 1, "view", _infer_select, params=("axis", "index"), gen=_gen_select, features=(_VIEW,), view=True,
       pseudo="select({x}, axis={axis}, index={index})", tangent="linear", vjp=_vjp_select)

# ---- in-place ops ---------------------------------------------------------------------------
_INPLACE = feature("inplace", "add_, mul_ or relu_: an in-place op on a value nothing reads afterwards",
                   "family:inplace")


def _gen_inplace(kind):
    """Mutates a value the Chooser may consume (c.consumable: nothing has read it, its producer
    keeps no output for its backward), else a fresh one (c.fresh_value: -x); the other operand
    is any other value of its type."""
    def gen(c, x):
        x = c.operand(c.consumable) or c.fresh_value(x)
        if kind == "relu_":
            return None, [x], {}, x.mag
        y = c.operand(lambda v: v.shape == x.shape and v.dtype == x.dtype and v.id != x.id)
        if y is None:
            return None
        return None, [x, y], {}, (x.mag * y.mag if kind == "mul_" else x.mag + y.mag)
    return gen


define("add_", 2, "inplace", infer_equal, gen=_gen_inplace("add_"), pseudo="{x}.add_({y})", inplace=True,
       features=(_INPLACE,))
define("mul_", 2, "inplace", infer_equal, gen=_gen_inplace("mul_"), pseudo="{x}.mul_({y})", inplace=True,
       features=(_INPLACE,))
define("relu_", 1, "inplace", infer_same, gen=_gen_inplace("relu_"), pseudo="{x}.relu_()", inplace=True,
       nonsmooth=True, keeps_output=True, features=(_INPLACE,))
# (no IR derivative: in-place ops are not generated inside custom rules)
