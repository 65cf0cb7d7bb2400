"""The op table's derivative rules are true derivatives: for every op with one, the IR bwd
statements built by generators.irgrad, evaluated by the JAX lowering, equal jax.vjp of the
op itself (the generator's custom_vjp rules rely on it)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conformance.ir.nodes import Op
from conformance.ir.ops import OPS
from conformance.pipelines.jax import pipelines as J
from generators.irgrad import vjp_ops

# (op, arg shapes, params) examples: every op with a derivative rule.
CASES = {
    "sin": ([(3,)], {}),
    "cos": ([(3,)], {}),
    "tanh": ([(2, 3)], {}),
    "exp": ([(3,)], {}),
    "sigmoid": ([(3,)], {}),
    "square": ([(3,)], {}),
    "neg": ([(3,)], {}),
    "scale": ([(3,)], {"c": -1.5}),
    "name": ([(3,)], {"name": "a"}),
    "name_fwd": ([(3,)], {"name": "a"}),
    "effect": ([(3,)], {"kind": "callback"}),
    "add": ([(3,), (3,)], {}),
    "sub": ([(3,), (3,)], {}),
    "mul": ([(3,), (3,)], {}),
    "matmul": ([(2, 3), (3, 4)], {}),
    "sum": ([(2, 3)], {"axis": 1}),
    "mean": ([(2, 3)], {"axis": None}),
    "transpose": ([(2, 3, 4)], {"perm": [2, 0, 1]}),
    "reshape": ([(2, 3)], {"shape": [3, 2]}),
    "broadcast": ([(1, 3)], {"shape": [2, 4, 3]}),
    "nondiff_scale": ([(3,)], {"index": 0}),
    "relu": ([(4,)], {}),
    "step": ([(4,)], {}),
    "cast": ([(3,)], {"dtype": "float64"}),  # (a cast to a coarser dtype: tests/test_dtypes.py)
    "slice": ([(2, 5)], {"axis": 1, "start": 1, "stop": 4}),
    "pad": ([(2, 3)], {"axis": 0, "before": 1, "after": 2}),
    "matrix_t": ([(2, 3)], {}),
    "select": ([(2, 4, 3)], {"axis": 1, "index": 2}),
}


def test_every_op_with_a_derivative_has_a_case():
    assert {o for o, d in OPS.items() if d.vjp is not None} == set(CASES)


@pytest.mark.parametrize("op", sorted(CASES))
@settings(max_examples=5)
@given(seed=st.integers(0, 2 ** 16))
def test_derivative_rule_matches_autodiff(op, seed):
    shapes, params = CASES[op]
    rng = np.random.default_rng(seed)
    args = [f"a{i}" for i in range(len(shapes))]
    xs = [rng.uniform(-1, 1, s) + (0.05 if op in ("relu", "step") else 0.0) for s in shapes]
    nondiff = [2.0]
    f = lambda *a: J.OPS[op](list(a), params, nondiff)   # noqa: E731
    y, pullback = jax.vjp(f, *[jnp.asarray(x) for x in xs])
    g = rng.uniform(-1, 1, np.shape(y))
    types = {a: (tuple(s), "float64") for a, s in zip(args, shapes)}
    types["y"], types["g"] = (tuple(np.shape(y)), "float64"), (tuple(np.shape(y)), "float64")
    k = iter(range(1000))
    bwd, cts, _ = vjp_ops([Op(op=op, args=args, params=params, out="y")], types, ["y"], ["g"], args,
                          lambda: f"b{next(k)}")
    env = {**dict(zip(args, map(jnp.asarray, xs))), "y": y, "g": jnp.asarray(g)}
    for s in bwd:
        env[s.out] = J.OPS[s.op]([env[a] for a in s.args], s.params, nondiff)
    want = pullback(jnp.asarray(g))
    for a, w in zip(args, want):
        got = env[cts[a]] if a in cts else np.zeros_like(w)
        np.testing.assert_allclose(np.asarray(got), np.asarray(w), rtol=1e-10, atol=1e-12, err_msg=f"{op} d/d{a}")


def test_every_op_with_a_derivative_has_a_tangent_rule():
    assert {o for o, d in OPS.items() if d.vjp is not None} == {o for o, d in OPS.items() if d.tangent}


@pytest.mark.parametrize("op", sorted(CASES))
@settings(max_examples=5)
@given(seed=st.integers(0, 2 ** 16))
def test_tangent_rule_matches_forward_mode_autodiff(op, seed):
    from generators.irgrad import jvp_ops
    shapes, params = CASES[op]
    rng = np.random.default_rng(seed)
    args = [f"a{i}" for i in range(len(shapes))]
    tangents = [f"t{i}" for i in range(len(shapes))]
    xs = [rng.uniform(-1, 1, s) + (0.05 if op in ("relu", "step") else 0.0) for s in shapes]
    ts = [rng.uniform(-1, 1, s) for s in shapes]
    nondiff = [2.0]
    f = lambda *a: J.OPS[op](list(a), params, nondiff)   # noqa: E731
    y, want = jax.jvp(f, [jnp.asarray(x) for x in xs], [jnp.asarray(t) for t in ts])
    types = {a: (tuple(s), "float64") for a, s in zip(args, shapes)}
    types["y"] = (tuple(np.shape(y)), "float64")
    k = iter(range(1000))
    stmts, tan = jvp_ops([Op(op=op, args=args, params=params, out="y")], types, args, tangents, lambda: f"j{next(k)}")
    env = {**dict(zip(args, map(jnp.asarray, xs))), **dict(zip(tangents, map(jnp.asarray, ts))), "y": y}
    for s in stmts:
        env[s.out] = J.OPS[s.op]([env[a] for a in s.args], s.params, nondiff)
    np.testing.assert_allclose(np.asarray(env[tan["y"]]), np.asarray(want), rtol=1e-10, atol=1e-12, err_msg=op)
