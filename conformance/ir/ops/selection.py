"""Ops a selective-checkpoint policy sees as one call with several outputs (`var_mean`, `topk`,
`max_dim`, `sort`: PyTorch's aten.var_mean, aten.topk, aten.max.dim and aten.sort return a tuple,
values and indices) and ops whose work depends on the data (`masked_sum`: boolean-mask indexing,
an output whose size only the values decide; `scale_by_max`: a Python number read from a tensor,
`.item()`). Each IR op has one output: the multi-output ops use every float output (var + mean)
or the values (the indices ride along, as they do in training code), and the JAX lowering
computes the same value with jax.numpy. Declared with conformance.ir.ops.define; generated only
where a campaign opts in (the swarm dimensions `multi_output` and `data_dependent`, which
conformance.ir.ops.table's families leave out otherwise, so that other campaigns' programs stay as
they were). No IR derivative: they are not generated inside custom rules.

Ties: where two values along the axis are equal, sort, topk and max_dim may route a cotangent to
either of them (PyTorch's max.dim to the index it returns, JAX's reduce_max splits it), so their
`kink` is the smallest gap between values along the axis, and value checks skip programs that
come near one (oracles.gradients.near_kink)."""
from __future__ import annotations

import math

import numpy as np

from conformance.ir.ops.core import MAX_MAG, ParamError, define, feature, infer_same, is_int

MULTI_OUTPUT, DATA_DEPENDENT = "multi_output", "data_dependent"   # the swarm dimensions (opt-in)

_MULTI = feature("multi_output_op", "var_mean, topk, max_dim or sort: one call with several outputs "
                                    "(PyTorch: values and indices), as a policy sees it", MULTI_OUTPUT)
DATA_DEPENDENT_OP = feature(
    "data_dependent_op", "masked_sum (x[x > 0]: an output sized by the data) or scale_by_max (x * x.max().item()): a "
    "value or a size only the data decides", DATA_DEPENDENT)


def _axis_of(shapes, p, allow_none):
    rank, ax = len(shapes[0]), p["axis"]
    if ax is None and allow_none:
        return None
    if not is_int(ax) or not 0 <= ax < rank:
        raise ParamError("params.axis", f"axis {ax!r} out of range for rank {rank}")
    return ax


def _drop(shape, ax):
    return () if ax is None else tuple(d for i, d in enumerate(shape) if i != ax)


def _infer_var_mean(shapes, p, nd):
    return _drop(shapes[0], _axis_of(shapes, p, True))


def _infer_axis_kept(shapes, p, nd):
    _axis_of(shapes, p, False)
    return shapes[0]


def _infer_topk(shapes, p, nd):
    ax = _axis_of(shapes, p, False)
    n = shapes[0][ax]
    if not is_int(p["k"]) or not 1 <= p["k"] <= n:
        raise ParamError("params.k", f"k {p['k']!r} out of range for size {n}")
    return tuple(p["k"] if i == ax else d for i, d in enumerate(shapes[0]))


def _infer_max_dim(shapes, p, nd):
    return _drop(shapes[0], _axis_of(shapes, p, False))


def _infer_scalar(shapes, p, nd):
    return ()


def tie_gap(a: np.ndarray, params: dict) -> np.ndarray:
    """The gaps between neighbouring values along the op's axis (empty where it has one value)."""
    a = np.asarray(a, np.float64)
    if a.ndim == 0:
        return np.zeros((0,))
    return np.diff(np.sort(a, axis=params["axis"]), axis=params["axis"]).ravel()


def _gen_axis(c, x):
    return c.int(0, len(x.shape) - 1, "axis") if x.shape else None


def _gen_var_mean(c, x):
    if not x.shape:
        return None
    ax = c.choice([None] + list(range(len(x.shape))), "axis")
    mag = x.mag * x.mag + x.mag
    return (None, [x], {"axis": ax}, mag) if mag <= MAX_MAG else None


def _gen_topk(c, x):
    ax = _gen_axis(c, x)
    if ax is None:
        return None
    return None, [x], {"axis": ax, "k": c.int(1, x.shape[ax], "k")}, x.mag


def _gen_kept(c, x):
    ax = _gen_axis(c, x)
    return None if ax is None else (None, [x], {"axis": ax}, x.mag)


def _gen_masked_sum(c, x):
    mag = x.mag * max(1, math.prod(x.shape))
    return (None, [x], {}, mag) if mag <= MAX_MAG else None


def _gen_scale_by_max(c, x):
    mag = x.mag * x.mag
    return (None, [x], {}, mag) if mag <= MAX_MAG else None


define("var_mean", 1, MULTI_OUTPUT, _infer_var_mean, params=("axis",), gen=_gen_var_mean, features=(_MULTI,),
       pseudo="sum(var_mean({x}, axis={axis}))")
define("topk", 1, MULTI_OUTPUT, _infer_topk, params=("axis", "k"), gen=_gen_topk, features=(_MULTI,),
       pseudo="topk({x}, k={k}, axis={axis}).values", nonsmooth=True, kink=tie_gap)
define("max_dim", 1, MULTI_OUTPUT, _infer_max_dim, params=("axis",), gen=_gen_kept, features=(_MULTI,),
       pseudo="max({x}, axis={axis}).values", nonsmooth=True, kink=tie_gap)
define("sort", 1, MULTI_OUTPUT, _infer_axis_kept, params=("axis",), gen=_gen_kept, features=(_MULTI,),
       pseudo="sort({x}, axis={axis}).values", nonsmooth=True, kink=tie_gap)
define("masked_sum", 1, DATA_DEPENDENT, _infer_scalar, gen=_gen_masked_sum, features=(DATA_DEPENDENT_OP,),
       pseudo="sum({x}[{x} > 0])", nonsmooth=True, baseline_keeps="extra")
define("scale_by_max", 1, DATA_DEPENDENT, infer_same, gen=_gen_scale_by_max, features=(DATA_DEPENDENT_OP,),
       pseudo="{x} * {x}.max().item()", outside_factors=lambda a, y: [np.asarray(np.max(a))])
# (its backward multiplies by the max, a constant: saved, it can equal a scalar region value, jax 0.4.37's campaign)


# ---- the framework's own grad transform inside the program ----------------------------------------------------
# grad_of_sin: the gradient of sum(sin(x)), cos(x), computed by jax.grad / torch.func.grad where the program runs it
# (inside a region: a functional transform inside checkpointed code). Its own derivative is -sin(x) (second order
# differentiates through the transform). Opt-in dimension `func_transforms`.
FUNC_TRANSFORMS = "func_transforms"
_FT = feature("func_transform_op", "grad_of_sin (jax.grad / torch.func.grad of sum(sin(x))) or functional_scale "
                                   "(torch.func.functional_call of a module whose parameter is swapped in) inside the "
                                   "program", FUNC_TRANSFORMS)


def _gen_grad_of_sin(c, x):
    return None, [x], {}, 1.0


define("grad_of_sin", 1, FUNC_TRANSFORMS, infer_same, gen=_gen_grad_of_sin, features=(_FT,),
       pseudo="grad(lambda y: sum(sin(y)))({x})", baseline_keeps="extra")


# functional_scale: x * c, PyTorch: torch.func.functional_call of a module holding a parameter, c swapped in for it
# (JAX: the product itself). Inside a region: a functional call inside checkpointed code.
def _infer_functional_scale(shapes, p, nd):
    if not isinstance(p["c"], (int, float)) or isinstance(p["c"], bool):
        raise ParamError("params.c", f"must be a number, got {p['c']!r}")
    return shapes[0]


def _gen_functional_scale(c, x):
    k = c.choice([0.5, -1.5, 2.0], "c")
    return None, [x], {"c": k}, x.mag * abs(k)


define("functional_scale", 1, FUNC_TRANSFORMS, _infer_functional_scale, params=("c",), gen=_gen_functional_scale,
       features=(_FT,), pseudo="functional_call(Scale(), {{'c': {c}}}, {x})", baseline_keeps="extra")
