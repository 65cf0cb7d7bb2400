"""Residual oracle: saved arrays that equal a region value by coincidence are not blamed on the policy. Two
harness false alarms of the issue-32 campaign (300 s, every composition dimension required), each replayed here
on its shrunk program: a custom_jvp rule's tangent-free factor (relu's step(x), outside the region) equal to a
dead region value step(relu(x)); a per-example factor of zeros (x * max(x) of a zero difference) equal to a
saved select view of zeros in another layout."""
from __future__ import annotations

import numpy as np

from conformance.ir.program import load_program
from conformance.pipelines import registry as P
from generators.programs import input_values
from oracles.expectations import Expectations
from oracles.judge import judge


def _prog(body, inputs, outputs, diff):
    return load_program({"schema_version": 1, "inputs": inputs, "body": body, "outputs": outputs, "diff": diff})


RULE_FACTOR = _prog(
    [{"kind": "custom_jvp", "args": ["x0"], "body": [{"kind": "op", "op": "relu", "args": ["x0"], "out": "v1",
                                                     "params": {}}],
      "tangents": ["t13"], "jvp": [{"kind": "op", "op": "step", "args": ["x0"], "out": "j14", "params": {}},
                                   {"kind": "op", "op": "mul", "args": ["t13", "j14"], "out": "j15", "params": {}}],
      "jvp_results": ["j15"], "results": ["v1"]},
     {"kind": "checkpoint", "args": ["x0", "v1"], "policy": {"kind": "nothing"}, "results": ["v8"],
      "body": [{"kind": "op", "op": "step", "args": ["v1"], "out": "v6", "params": {}},
               {"kind": "op", "op": "effect", "args": ["x0"], "out": "v8", "params": {"kind": "callback"}}]}],
    [{"id": "x0", "shape": [2, 2, 1], "dtype": "float32", "diff": True}], ["v8"], {"order": 1, "mode": "reverse"})

ZERO_FACTOR = _prog(
    [{"kind": "op", "op": "max_dim", "args": ["x0"], "out": "v1", "params": {"axis": 0}},
     {"kind": "op", "op": "sub", "args": ["v1", "v1"], "out": "v3", "params": {}},
     {"kind": "op", "op": "scale_by_max", "args": ["v3"], "out": "v10", "params": {}},
     {"kind": "checkpoint", "args": ["v10"], "policy": {"kind": "save_anything_except_names", "names": ["a"]},
      "results": ["v13"], "body": [{"kind": "op", "op": "select", "args": ["v10"], "out": "v13",
                                    "params": {"axis": 1, "index": 1}}]}],
    [{"id": "x0", "shape": [2, 3, 3], "dtype": "float32", "diff": True, "batched": True}], ["v10"],
    {"order": 1, "mode": "reverse", "batch": 3})


def _policy_verdicts(p, pipeline):
    obs = {n: P.get(n).run(p, input_values(p, 0)) for n in ["ref:f64", "jax:none", "jax:remat2", pipeline]}
    return obs, [v for v in judge(p, obs, Expectations.load()).verdicts
                 if v.check == "residuals" and v.reference == "policy" and v.pipeline == pipeline]


def test_a_custom_jvp_rule_factor_is_a_candidate_for_a_saved_array():
    obs, verdicts = _policy_verdicts(RULE_FACTOR, "jax:remat3")
    assert "j14" in obs["ref:f64"].values   # the rule's tangent-free statement is recorded
    saved = [r.describe() for r in obs["jax:remat3"].residuals]
    assert any("j14" in s and "v6" in s for s in saved), saved   # both values it may be
    assert verdicts and all(v.status == "pass" for v in verdicts), [(v.status, v.detail) for v in verdicts]


def test_a_saved_class_of_zeros_is_not_a_view_in_another_layout():
    obs, verdicts = _policy_verdicts(ZERO_FACTOR, "jax:remat2")
    v13 = [k for k in obs["ref:f64"].values if k.startswith("v13")]
    assert v13 and not any(np.any(np.asarray(obs["ref:f64"].values[k])) for k in v13)   # the view is zeros
    assert verdicts and all(v.status == "pass" for v in verdicts), [(v.status, v.detail) for v in verdicts]


# scale_by_max's backward multiplies by the max (a constant it saves): here max(x0) = 0.8 = masked_sum(x0), a dead
# scalar inside a save-nothing region (a jax 0.4.37 campaign's false alarm, on the pinned jax too)
MAX_FACTOR = _prog(
    [{"kind": "op", "op": "reshape", "args": ["x0"], "out": "v1", "params": {"shape": [1, 2]}},
     {"kind": "op", "op": "scale_by_max", "args": ["v1"], "out": "v2", "params": {}},
     {"kind": "checkpoint", "args": ["x0", "v2", "x2"], "policy": {"kind": "nothing"}, "results": ["v9"],
      "body": [{"kind": "op", "op": "masked_sum", "args": ["x0"], "out": "v7", "params": {}},
               {"kind": "op", "op": "matmul", "args": ["v2", "x2"], "out": "v9", "params": {}}]}],
    [{"id": "x0", "shape": [2], "dtype": "float32", "diff": True},
     {"id": "x2", "shape": [2, 1], "dtype": "float32", "diff": True}], ["v9"], {"order": 1, "mode": "reverse"})


def test_the_max_scale_by_max_saves_is_a_candidate_for_a_saved_array():
    inputs = {"x0": np.array([-0.5, 0.8], np.float32), "x2": np.array([[0.25], [-0.5]], np.float32)}
    obs = {n: P.get(n).run(MAX_FACTOR, inputs) for n in ["ref:f64", "jax:none", "jax:remat2"]}
    saved = [r.describe() for r in obs["jax:remat2"].residuals]
    assert any(s.startswith("v7:") for s in saved), saved   # the saved max reads as the dead masked_sum
    verdicts = [v for v in judge(MAX_FACTOR, obs, Expectations.load()).verdicts
                if v.check == "residuals" and v.reference == "policy" and v.pipeline == "jax:remat2"]
    assert verdicts and all(v.status == "pass" for v in verdicts), [(v.status, v.detail) for v in verdicts]
