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



def test_torch_func_grad_inside_a_region_runs_only_under_eager_reentrant_checkpoint():
    """grad_of_sin (jax.grad / torch.func.grad inside the program) in a region: JAX and eager reentrant checkpoint
    agree with the baselines (the torch forward runs without the residual capture's hooks); non-reentrant checkpoint
    raises torch.func's refusal (documented: entry torch-func-transform-inside-checkpoint); torch.compile fails the
    same way and leaves saved-tensor hooks disabled (root torch-compile-failure-leaves-saved-tensor-hooks-disabled):
    the pipeline reports it and re-enables them, so the next program is judged on its own."""
    import torch
    body = [region(["x"], [op("sin", ["x"], "a"), op("grad_of_sin", ["a"], "b"), op("tanh", ["b"], "y")], ["y"],
                   {"kind": "nothing"})]
    p = prog(body)
    assert {"func_transform_op", "func_transform_in_checkpoint"} <= p.features()
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3", "torch:none", "torch:eager-sac",
             "torch:eager-reentrant", "torch:compile-aot_eager"]
    obs = {n: P.get(n).run(p, input_values(p, 0)) for n in names}
    for n in ("jax:remat2", "jax:remat3", "torch:none", "torch:eager-reentrant"):
        assert obs[n].ok(), (n, obs[n].error)
        np.testing.assert_allclose(obs[n].grads["x"], obs["ref:f64"].grads["x"], rtol=1e-9, err_msg=n)
    assert "don't yet support saved tensor hooks" in obs["torch:eager-sac"].error.message
    assert obs["torch:compile-aot_eager"].error.type == "SavedTensorHooksLeftDisabled"
    assert torch._C._autograd._saved_tensors_hooks_is_enabled()
    j = judge(p, obs, PACKAGED)
    assert j.expectation_hits.get("torch-func-transform-inside-checkpoint") == "fired"
    fails = [(v.pipeline, v.error_type) for v in j.verdicts if v.status == "fail"]
    assert fails == [("torch:compile-aot_eager", "SavedTensorHooksLeftDisabled")], fails
    # (entry torch-func-transform-under-saved-tensor-hooks) outside any region, the user's or save_on_cpu's hooks
    plain = prog([op("grad_of_sin", ["x"], "b"), op("tanh", ["b"], "y")])
    obs = {n: P.get(n).run(plain, input_values(plain, 0)) for n in ["ref:f64", "torch:none", "torch:eager-sac",
                                                                     "torch:eager-sac:save-on-cpu"]}
    assert obs["torch:eager-sac"].ok() and "don't yet support" in obs["torch:eager-sac:save-on-cpu"].error.message
    j = judge(plain, obs, PACKAGED)
    assert j.expectation_hits.get("torch-func-transform-under-saved-tensor-hooks") == "fired"
    assert not [v for v in j.verdicts if v.status == "fail"]


def test_functional_call_inside_a_region_agrees_and_its_short_repro_runs(tmp_path):
    """functional_scale (PyTorch: torch.func.functional_call of a module, its buffer swapped in; JAX: the product) in
    a region whose policy names it: every pipeline, the exports included, gives the baselines' gradient, SAC's policy
    saves the aten.mul the call makes, and the short torch repro pastes the module and runs standalone."""
    import subprocess
    import sys

    from conformance.engine.findings import make_finding
    from conformance.ir.verdict import Verdict
    from conformance.repro.short import short_repro
    body = [region(["x"], [op("sin", ["x"], "a"), op("functional_scale", ["a"], "b", c=-1.5), op("tanh", ["b"], "y")],
                   ["y"], {"kind": "ops", "ops": ["functional_scale"]})]
    p = prog(body)
    inputs = input_values(p, 0)
    names = ["ref:f64", "jax:none", "jax:remat2", "torch:none", "torch:eager-sac", "torch:eager-reentrant",
             "torch:compile-aot_eager", "torch:export-strict", "torch:export-nonstrict"]
    obs = {n: P.get(n).run(p, inputs) for n in names}
    for n, o in obs.items():
        assert o.ok(), (n, o.error)
        np.testing.assert_allclose(o.grads["x"], obs["ref:f64"].grads["x"], rtol=1e-9, err_msg=n)
    assert "aten.mul.Tensor=save" in obs["torch:eager-sac"].flags["policy_ops"]
    v = Verdict(check="gradient", pipeline="torch:eager-sac", reference="torch:none", status="fail")
    src = short_repro(p, inputs, make_finding(v, p, inputs, {}, {}, "cpu"))
    assert "class Scale(torch.nn.Module)" in src and "torch.func.functional_call" in src
    (tmp_path / "repro.py").write_text(src)
    r = subprocess.run([sys.executable, "repro.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]   # conforming: exits 0
