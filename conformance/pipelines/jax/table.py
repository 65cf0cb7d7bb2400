"""The JAX lowering table: op -> jax.numpy source, policy kind -> jax.checkpoint_policies
source, and the primitives an `ops` policy saves. Plain data (no jax import): the JAX
pipelines compile it, the repro emitter pastes it.

Names the templates may use: jax, jnp, lax, cp (jax.checkpoint_policies), checkpoint_name,
and PRELUDE's helpers.
"""
from __future__ import annotations

import inspect

from conformance.ir.ops import dropout_mask
from conformance.ir.policy import KINDS
from conformance.pipelines.tables import Lowering, op_source

L = Lowering
OPS: dict[str, Lowering] = {
    "sin": L("jnp.sin({x})", ("sin",)),
    "cos": L("jnp.cos({x})", ("cos",)),
    "tanh": L("jnp.tanh({x})", ("tanh",)),
    "exp": L("jnp.exp({x})", ("exp",)),
    "sigmoid": L("jax.nn.sigmoid({x})", ("logistic",)),
    "square": L("jnp.square({x})", ("square", "integer_pow")),
    "neg": L("-{x}", ("neg",)),
    "scale": L("{x} * jnp.asarray({c}, {x}.dtype)", ("mul",)),
    "nondiff_scale": L("{x} * jnp.asarray({nondiff}, {x}.dtype)", ("mul",)),
    "add": L("{x} + {y}", ("add",)),
    "sub": L("{x} - {y}", ("sub",)),
    "mul": L("{x} * {y}", ("mul",)),
    "matmul": L("jnp.matmul({x}, {y})", ("dot_general",)),
    "sum": L("jnp.sum({x}, axis={axis})", ("reduce_sum",)),
    "mean": L("jnp.mean({x}, axis={axis})", ("reduce_sum", "div")),
    "transpose": L("jnp.transpose({x}, {perm})", ("transpose",)),
    "reshape": L("jnp.reshape({x}, {shape})", ("reshape",)),
    "broadcast": L("jnp.broadcast_to({x}, {shape})", ("broadcast_in_dim",)),
    "name": L("checkpoint_name({x}, {name})", ("name",)),
    "name_fwd": L("checkpoint_name_fwd({x}, {name})", ("name",)),
    "relu": L("jax.nn.relu({x})", ("custom_jvp_call", "max")),
    "step": L("({x} > 0).astype({x}.dtype)", ("gt", "convert_element_type")),
    "slice": L("lax.slice_in_dim({x}, {start}, {stop}, axis={axis})", ("slice",)),
    "pad": L("jnp.pad({x}, [(({before}, {after}) if i == {axis} else (0, 0)) for i in range({x}.ndim)])", ("pad",)),
    "conv1d": L("lax.conv_general_dilated({x}, {y}, (1,), 'VALID')", ("conv_general_dilated",)),
    "cast": L("{x}.astype(dt({dtype}))", ("convert_element_type",)),
    "dropout": L("{x} * jnp.asarray(dropout_mask({x}.shape, {p}, {seed}), {x}.dtype)", ("mul",)),
    "matrix_t": L("{x}.T", ("transpose",)),
    "select": L("lax.index_in_dim({x}, {index}, {axis}, keepdims=False)", ("slice", "squeeze")),
    # in-place ops are functional in JAX (the IR's consumed first arg makes the meanings agree)
    "add_": L("{x} + {y}", ("add",)),
    "mul_": L("{x} * {y}", ("mul",)),
    "relu_": L("jax.nn.relu({x})", ("custom_jvp_call", "max")),
}

# Policy kind -> source; {names}-like fields are the policy's lists, {a}/{b} sub-policies,
# {prims} the JAX primitives of an `ops` policy's op kinds.
POLICIES: dict[str, str] = {
    "everything": "cp.everything_saveable",
    "nothing": "cp.nothing_saveable",
    "dots": "cp.dots_saveable",
    "dots_no_batch": "cp.dots_with_no_batch_dims_saveable",
    "save_only_names": "cp.save_only_these_names(*{names})",
    "save_any_names_but_these": "cp.save_any_names_but_these(*{names})",
    "save_anything_except_names": "cp.save_anything_except_these_names(*{names})",
    "both": "cp.save_from_both_policies({a}, {b})",
    "offload_dots_no_batch": "cp.offload_dot_with_no_batch_dims('device', 'pinned_host')",
    "save_and_offload_names": ("cp.save_and_offload_only_these_names(names_which_can_be_saved={saved}, "
                               "names_which_can_be_offloaded={offloaded}, offload_src='device', "
                               "offload_dst='pinned_host')"),
    "ops": "save_prims({prims})",
    "min_elements": "save_min_elements({elements})",
    "dot_params": "save_unbatched_dots()",
    "no_policy": "None",
    "offload_ops": "offload_prims({prims})",
}

PRELUDE = (
    inspect.getsource(dropout_mask)
    + '''

def save_prims(prims):
    """A custom policy: save the outputs of these JAX primitives."""
    return lambda prim, *_, **__: prim.name in prims


def offload_prims(prims):
    """A custom policy: offload the outputs of these JAX primitives to host memory."""
    from jax.ad_checkpoint import Offloadable, Recompute
    off = Offloadable(src="device", dst="pinned_host")
    return lambda prim, *_, **__: off if prim.name in prims else Recompute


def pack_residuals(tree, res):
    """custom_vjp residuals as the pytree a rule passes them in: a tuple, a dict, or nested."""
    res = tuple(res)
    if tree == "dict":
        return {f"r{i}": r for i, r in enumerate(res)}
    if tree == "nested":
        return (res[:1], {"rest": res[1:]}) if res else ((), {"rest": ()})
    return res


def unpack_residuals(tree, res):
    if tree == "dict":
        return tuple(res[f"r{i}"] for i in range(len(res)))
    if tree == "nested":
        return tuple(res[0]) + tuple(res[1]["rest"])
    return tuple(res)


def as_tree(tree, keys, vals):
    """A custom rule's values as it takes or returns them: positionally ("flat": a tuple, spread by
    the caller), one tuple, or one dict keyed by value id."""
    return dict(zip(keys, vals)) if tree == "dict" else tuple(vals)


def from_tree(tree, keys, t):
    return tuple(t[k] for k in keys) if tree == "dict" else tuple(t)


def tree_rules(tree, args, results, nnd, primal, fwd, bwd):
    """A custom_vjp's positional rules as rules taking their args as one pytree (after nnd
    nondiff args) and returning results, and bwd's cotangents, as one pytree each."""
    def primal_t(*a):
        return as_tree(tree, results, primal(*a[:nnd], *from_tree(tree, args, a[nnd])))

    def fwd_t(*a):
        outs, res = fwd(*a[:nnd], *from_tree(tree, args, a[nnd]))
        return as_tree(tree, results, outs), res

    def bwd_t(*a):
        return (as_tree(tree, args, bwd(*a[:nnd], a[nnd], from_tree(tree, results, a[nnd + 1]))),)
    return primal_t, fwd_t, bwd_t


def tree_jvp(tree, args, results, primal, rule):
    """A custom_jvp's positional primal and rule as functions of one pytree (primals, tangents)."""
    def primal_t(vals):
        return as_tree(tree, results, primal(*from_tree(tree, args, vals)))

    def rule_t(primals, tangents):
        outs, tans = rule(from_tree(tree, args, primals[0]), from_tree(tree, args, tangents[0]))
        return as_tree(tree, results, outs), as_tree(tree, results, tans)
    return primal_t, rule_t


def mark_perturbed(res, flags):
    """A residual pytree whose structure says which args fwd saw perturbed (a static fact)."""
    return {"res": res, "perturbed": {f"a{i}": () for i, f in enumerate(flags) if f}}


def read_perturbed(res, n):
    """(the residuals, per arg whether fwd saw it perturbed) from mark_perturbed's pytree."""
    return res["res"], [f"a{i}" in res["perturbed"] for i in range(n)]


def save_min_elements(n):
    """A custom policy over the avals: save the outputs of primitives whose first input has at
    least n elements."""
    return lambda prim, *avals, **__: bool(avals) and getattr(avals[0], "size", 0) >= n


def branch_index(pred, n):
    """The branch a cond on n branches takes: how many thresholds lie below the sum of its
    predicate (conformance.ir.branch_thresholds)."""
    thresholds = jnp.asarray([-0.5 + (j + 1) / n for j in range(n - 1)], pred.dtype)
    return jnp.sum(jnp.sum(pred) > thresholds).astype(jnp.int32)


def hvp(mode, loss, *d):
    """H @ ones for a scalar loss of d (second-order programs), computed as `mode` says."""
    argn = tuple(range(len(d)))
    ones = tuple(jnp.ones_like(x) for x in d)
    grad = lambda *x: jax.grad(loss, argnums=argn)(*x)   # noqa: E731
    if mode == "reverse":   # grad of the sum of grad
        return jax.grad(lambda *x: sum(jnp.sum(g).astype(jnp.float64) for g in grad(*x)), argnums=argn)(*d)
    if mode == "fwd_over_rev":   # jvp of grad: a Hessian-vector product
        return jax.jvp(grad, d, ones)[1]
    if mode == "rev_over_fwd":   # grad of a jvp
        return jax.grad(lambda *x: jax.jvp(loss, x, ones)[1], argnums=argn)(*d)
    if mode == "linearize":   # jax.linearize of grad, applied to ones
        return jax.linearize(grad, *d)[1](*ones)
    raise ValueError(mode)


def save_unbatched_dots():
    """A custom policy over the params: save dot_general outputs whose dimension numbers name
    no batch dimension."""
    return lambda prim, *_, **params: prim.name == "dot_general" and not any(params["dimension_numbers"][1])
'''
)


def policy_source(p) -> str:
    """A policy as JAX source."""
    fields = {}
    for f in KINDS[p.kind].fields:
        v = getattr(p, f)
        fields[f] = policy_source(v) if f in ("a", "b") else repr(v) if f == "elements" else repr(list(v))
    if "ops" in KINDS[p.kind].fields:
        fields["prims"] = repr(sorted({pr for o in p.ops for pr in OPS[o].policy_ops}))
    return POLICIES[p.kind].format(**fields)


def op_text(op: str, args: list[str], params: dict, nondiff: str | None) -> str:
    return op_source(OPS, op, args, params, nondiff)
