"""Multi-output and data-dependent ops (conformance.ir.ops.selection): each lowers in both frameworks to the
same values, a PyTorch SAC policy sees the multi-output call as one aten op (values and indices), ties along
an axis count as the op's kink (value checks skip them). (That the families are drawn only where a campaign
requires them: tests/test_generator.py, SHOWS.)"""
from __future__ import annotations

import numpy as np
import pytest

from conformance.ir import ops as O
from conformance.pipelines import registry as P
from generators.programs import input_values
from oracles.expectations import Expectations
from oracles.gradients import near_kink
from oracles.judge import judge
from tests.programs import op, prog, region

PACKAGED = Expectations.load()
CASES = [("var_mean", {"axis": 1}, "aten.var_mean"), ("topk", {"axis": 1, "k": 2}, "aten.topk"),
         ("max_dim", {"axis": 0}, "aten.max"), ("sort", {"axis": 1}, "aten.sort"),
         ("masked_sum", {}, "aten.index"), ("scale_by_max", {}, "aten.mul")]
MATRIX = {"id": "x", "shape": [3, 4], "dtype": "float64", "diff": True}


@pytest.mark.parametrize("kind,params,aten", CASES, ids=[c[0] for c in CASES])
def test_each_op_agrees_across_frameworks_and_a_policy_naming_it_sees_its_aten_call(kind, params, aten):
    body = [region(["x"], [op("sin", ["x"], "a"), op(kind, ["a"], "b", **params), op("tanh", ["b"], "y")], ["y"],
                   {"kind": "ops", "ops": [kind]})]
    p = prog(body, inputs=[MATRIX], outputs=["y"])
    assert f"op:{kind}" in p.features()
    # (not jax:remat3: it ignores the policy on top_k, reduce_max, sort and mul, corpus root
    # remat3-policy-ignored-for-ops-without-remat-rules)
    names = ["ref:f64", "jax:none", "jax:remat2", "torch:none", "torch:eager-sac"]
    obs = {n: P.get(n).run(p, input_values(p, 3)) for n in names}
    for n, o in obs.items():
        assert o.ok(), (n, o.error)
        np.testing.assert_allclose(o.grads["x"], obs["ref:f64"].grads["x"], rtol=1e-9, atol=1e-12, err_msg=n)
    seen = obs["torch:eager-sac"].flags["policy_ops"]
    assert any(s.startswith(aten) and s.endswith("=save") for s in seen), seen
    assert not [v for v in judge(p, obs, PACKAGED).verdicts if v.status == "fail"]


def test_ties_along_the_axis_are_a_kink_that_value_checks_skip():
    tied = {"a": [[1.0, 1.0, 2.0], [0.5, 0.0, -1.0]]}
    apart = {"a": [[1.0, 1.5, 2.0], [0.5, 0.0, -1.0]]}
    p = prog([op("sort", ["x"], "a", axis=1), op("sort", ["a"], "y", axis=1)],
             inputs=[{"id": "x", "shape": [2, 3], "dtype": "float64", "diff": True}], outputs=["y"])
    assert near_kink(p, tied) == ["a"] and near_kink(p, apart) == []
    assert O.OPS["sort"].kink(np.array([3.0]), {"axis": 0}).size == 0   # one value: no tie

