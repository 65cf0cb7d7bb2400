"""bfloat16 and float16: inputs of those dtypes, casts between dtypes (mixed precision), their
tolerances, residual matching and bytes, their encodings (corpus, worker protocol, repros)."""
import numpy as np
import pytest

from conformance import repro
from conformance.engine.findings import decode_inputs, encode_inputs
from conformance.engine.isolation import protocol
from conformance.ir.dtypes import DTYPES, np_dtype
from conformance.ir.nodes import ProgramError
from conformance.ir.observation import Observation
from conformance.ir.program import load_program
from generators.programs import input_values
from oracles import gradients
from oracles.expectations import Expectations
from oracles.judge import judge
from tests.programs import op, region
from tests.test_repro import run_script
from tests.test_structure import EXECUTOR

NAMES = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3", "jax:remat3:jit", "torch:none", "torch:eager-sac",
         "torch:compile-aot_eager"]


def mixed(low: str):
    """Mixed precision: a float32 input cast to `low`, a matmul with weights stored in `low`, a
    region saving only the name 'a' computed in `low`, the result cast back to float32."""
    body = [op("cast", ["x"], "xl", dtype=low), op("matmul", ["xl", "w"], "m"),
            region(["m"], [op("sin", ["m"], "s"), op("name", ["s"], "a", name="a"), op("cos", ["a"], "c")], ["c"],
                   {"kind": "save_only_names", "names": ["a"]}),
            op("cast", ["c"], "y", dtype="float32")]
    return load_program({"schema_version": 1, "body": body, "outputs": ["y"], "diff": {"order": 1},
                         "inputs": [{"id": "x", "shape": [2, 3], "dtype": "float32", "diff": True},
                                    {"id": "w", "shape": [3, 2], "dtype": low, "diff": True}]})


@pytest.mark.parametrize("low", ["bfloat16", "float16"])
def test_mixed_precision_runs_alike_everywhere_and_saves_in_its_dtype(low, tmp_path):
    p = mixed(low)
    assert {"cast", low, "float32"} <= p.features()
    x = input_values(p, 0)
    assert str(x["w"].dtype) == low
    obs = EXECUTOR.run(p, x, NAMES)
    j = judge(p, obs, Expectations.load())
    assert not j.failures(), [(v.key(), v.detail) for v in j.failures()]
    ref = np.asarray(obs["ref:f64"].grads["w"])
    for name in NAMES[1:]:
        got = np.asarray(obs[name].grads["w"])
        assert not np.array_equal(got, ref), name   # computed in the low dtype, not float64
        np.testing.assert_allclose(got, ref, rtol=0.05, atol=0.01, err_msg=name)
        if name.endswith("none"):
            continue
        named = [r for r in obs[name].residuals if r.names]   # the policy's residual, 2 bytes an element
        assert [(r.dtype, r.bytes) for r in named] == [(low, 2 * 4)], (name, obs[name].residuals)
    for fw in ("jax", "torch"):
        src = repro.generate(p, x, None, fw)
        assert f"'w': '{low}'" in src
        rc, out = run_script(src, tmp_path, name=f"repro_{fw}.py")
        assert rc == 0, out


def test_a_cast_names_its_dtype_and_the_reference_keeps_float64():
    with pytest.raises(ProgramError) as e:
        load_program({**mixed("bfloat16").to_json_obj(), "body": [op("cast", ["x"], "y", dtype="int8")]})
    assert e.value.field == "body[0].params.dtype"
    p = mixed("bfloat16")
    assert p.types()["xl"] == ((2, 3), "bfloat16") and p.types()["y"] == ((2, 2), "float32")
    from conformance.pipelines.jax.pipelines import node_values
    x = input_values(p, 0)
    f64 = node_values(p, x, cast_f64=True)
    assert f64["xl"].dtype == np.float64 and np.array_equal(f64["xl"], x["x"].astype(np.float64))
    assert str(node_values(p, x)["xl"].dtype) == "bfloat16"


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_inputs_of_every_dtype_encode_exactly(dtype):
    a = (np.linspace(-1, 1, 6).reshape(2, 3) / 3).astype(np_dtype(dtype))
    back = decode_inputs(encode_inputs({"x": a}))["x"]
    assert back.dtype == a.dtype and np.array_equal(back.astype(np.float64), a.astype(np.float64))
    p = load_program({"schema_version": 1, "body": [op("sin", ["x"], "y")], "outputs": ["y"],
                      "inputs": [{"id": "x", "shape": [2, 3], "dtype": dtype, "diff": True}]})
    wire = protocol.decode_inputs(protocol.encode_inputs({"x": a}), p)["x"]
    assert wire.dtype == a.dtype and np.array_equal(wire.astype(np.float64), a.astype(np.float64))


def test_low_precision_overflow_is_skipped_not_blamed():
    p = load_program({"schema_version": 1, "body": [op("exp", ["x"], "y")], "outputs": ["y"],
                      "inputs": [{"id": "x", "shape": [2], "dtype": "float16", "diff": True}]})
    ref = Observation(pipeline="ref:f64", outputs=[[1e5, 1.0]], grads={"x": [1e5, 1.0]})
    got = Observation(pipeline="jax:remat2", outputs=[[float("inf"), 1.0]], grads={"x": [float("inf"), 1.0]})
    v = gradients.compare(p, got, ref, "loose", values={"x": [11.5, 0.0], "y": [1e5, 1.0]})
    assert v.status == "skipped" and "float16" in v.detail["reason"]
    small = Observation(pipeline="jax:remat2", outputs=[[2.0, 1.0]], grads={"x": [2.0, 1.0]})
    assert gradients.compare(p, small, Observation(pipeline="ref:f64", outputs=[[1.0, 1.0]], grads={"x": [1.0, 1.0]}),
                             "loose", values={"x": [0.0, 0.0], "y": [1.0, 1.0]}).status == "fail"


def test_a_cast_rule_casts_its_cotangent_back_and_its_tangent_forward():
    """The derivative rules a custom_vjp/custom_jvp derives through a cast (generators.irgrad)."""
    import jax
    import jax.numpy as jnp

    from conformance.ir.nodes import Op
    from conformance.pipelines.jax import pipelines as J
    from generators.irgrad import jvp_ops, vjp_ops
    s = Op(op="cast", args=["a"], params={"dtype": "float32"}, out="y")
    types = {"a": ((3,), "float64"), "y": ((3,), "float32"), "g": ((3,), "float32")}
    k = iter(range(100))
    bwd, cts, _ = vjp_ops([s], types, ["y"], ["g"], ["a"], lambda: f"b{next(k)}")
    assert [(o.op, o.params) for o in bwd] == [("cast", {"dtype": "float64"})]
    x, g = jnp.linspace(-1, 1, 3), jnp.linspace(0.5, 1, 3, dtype=jnp.float32)
    want = jax.vjp(lambda a: J.OPS["cast"]([a], s.params, []), x)[1](g)[0]
    got = J.OPS["cast"]([g], bwd[0].params, [])
    assert got.dtype == jnp.float64 and np.array_equal(np.asarray(got), np.asarray(want))
    jvp, tan = jvp_ops([s], types, ["a"], ["t"], lambda: f"j{next(k)}")
    assert [(o.op, o.args, o.params) for o in jvp] == [("cast", ["t"], {"dtype": "float32"})]
