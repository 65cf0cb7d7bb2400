"""The JAX helpers the lowering table's templates and the JAX pipelines call (custom policies,
custom rules' values as pytrees, cond branch selection, second-order products): a real module,
linted and imported by conformance.pipelines.jax.pipelines. Repros paste the helpers' source
(conformance.pipelines.jax.table.PRELUDE reads this file, so the table imports no framework)."""
from __future__ import annotations

import jax
import jax.numpy as jnp

# --- helpers: repros paste the source from here on ---
EFFECT_RUNS = {}   # effect kind -> how often its callbacks ran (the run resets it)
EFFECT_SITES = {}   # the harness's: the effect statement -> how often its callback ran (the run resets it)
EFFECT_SITE = [None]   # the harness's: the statement whose effect is traced next (None in a repro)


def effect(x, kind):
    """x, with a callback effect that counts its runs in EFFECT_RUNS[kind]: jax.debug.callback
    (ordered or not) on x, or io_callback (ordered or not) on stop_gradient(x), its result unused."""
    site = EFFECT_SITE[0]   # (bound where the effect is traced: its runs, a recompute's included, count there)

    def ran(*_):
        EFFECT_RUNS.update({kind: EFFECT_RUNS.get(kind, 0) + 1})
        if site is not None:
            EFFECT_SITES.update({site: EFFECT_SITES.get(site, 0) + 1})
    if kind in ("io", "io_ordered"):
        from jax.experimental import io_callback
        io_callback(lambda v: ran() or v, jax.ShapeDtypeStruct(x.shape, x.dtype), jax.lax.stop_gradient(x),
                    ordered=kind == "io_ordered")
    else:
        jax.debug.callback(ran, x, ordered=kind == "ordered")
    return x


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
    predicate (conformance.ir.nodes.branch_thresholds)."""
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


def with_state(kind, ref):
    """A region function whose first result goes through a scalar mutable state `ref`: read
    (result + ref), write (ref = sum(result), then result * ref) or accumulate (ref += sum(result),
    then result * ref)."""
    def wrap(fn):
        def stateful(*args):
            first, *rest = fn(*args)
            if kind == "read":
                first = first + ref[...].astype(first.dtype)
            else:
                total = jnp.sum(first).astype(ref.dtype)
                if kind == "write":
                    ref[...] = total
                else:
                    ref[...] += total
                first = first * ref[...].astype(first.dtype)
            return (first, *rest)
        return stateful
    return wrap


def read_state(out, ref):
    """The region's results after it: the first adds the state's value."""
    first, *rest = out
    return (first + ref[...].astype(first.dtype), *rest)

