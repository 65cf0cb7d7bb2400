"""ref:f64 against central finite differences (float64, no checkpoint, custom rules kept)."""
import json
import random

import numpy as np
from hypothesis import HealthCheck, Phase, find, given, settings

from conformance.ir.batching import batch_id
from conformance.ir.interpreter import loss_outputs, output_cotangents
from conformance.ir.nodes import CustomJVP, CustomVJP, walk
from conformance.ir.ops import SCALE_OP
from conformance.pipelines import registry as pipelines
from conformance.pipelines.jax.pipelines import node_values
from generators.programs import Config, cases, input_values, programs
from tests.programs import named_chain, seed_program


def _loss(prog, inputs, b=None):
    """The loss (per-example programs: example b's loss)."""
    vals = node_values(prog, inputs, cast_f64=True)
    cts = output_cotangents(prog) or [1.0] * loss_outputs(prog)   # seeded cotangents weight them; aux: none
    key = (lambda o: o) if b is None else (lambda o: batch_id(o, b))
    return float(sum(np.sum(vals[key(o)] * np.asarray(c)) for o, c in zip(prog.outputs, cts)))


def finite_difference(prog, inputs, eps=1e-6):
    """Central differences of the loss; per-example programs: of each example's loss, w.r.t. its
    slice of a batched input or the whole of a shared one, stacked."""
    out = {}
    for i in prog.inputs:
        if not i.diff:
            continue
        x = inputs[i.id].astype(np.float64)
        grads = []
        for b in ([None] if not prog.diff.batch else range(prog.diff.batch)):
            g = np.zeros(i.shape)
            for k in np.ndindex(tuple(i.shape)):
                at = (b, *k) if (b is not None and i.batched) else k
                up, dn = x.copy(), x.copy()
                up[at] += eps
                dn[at] -= eps
                g[k] = (_loss(prog, {**inputs, i.id: up}, b) - _loss(prog, {**inputs, i.id: dn}, b)) / (2 * eps)
            grads.append(g)
        out[i.id] = grads[0] if not prog.diff.batch else np.stack(grads)
    return out


# custom_vjp and custom_jvp rules may be deliberately non-standard (scaled), so finite differences are
# compared on programs without them; the rules themselves are checked just below. A while_loop is
# under stop_gradient (no gradient flows into it), which finite differences do not see.
@settings(max_examples=15)
@given(cases(Config(custom_vjp=False, custom_jvp=False, second_order=False, max_stmts=4,
                     loop_spellings=("scan", "fori_loop", "vmap"))))
def test_reference_matches_finite_differences(case):
    prog, seed = case
    inputs = input_values(prog, seed)
    obs = pipelines.get("ref:f64").run(prog, inputs)
    assert obs.error is None, obs.error
    fd = finite_difference(prog, inputs)
    for k, g in fd.items():
        np.testing.assert_allclose(np.asarray(obs.grads[k]), g, rtol=1e-5, atol=1e-6)


def test_true_custom_vjp_rules_match_finite_differences():
    for p in (seed_program("float64"), named_chain()):
        inputs = input_values(p, 3)
        obs = pipelines.get("ref:f64").run(p, inputs)
        assert obs.error is None
        for k, g in finite_difference(p, inputs).items():
            np.testing.assert_allclose(np.asarray(obs.grads[k]), g, rtol=1e-5, atol=1e-6)


def test_reference_records_every_node_value():
    p = named_chain()
    obs = pipelines.get("ref:f64").run(p, input_values(p, 0))
    assert set(obs.values) >= {"m", "s", "na", "c", "nb", "y", "x", "w"}
    np.testing.assert_allclose(np.sin(np.asarray(obs.values["m"])), np.asarray(obs.values["s"]))


def _true_rules_with_a_custom_jvp_residual(p) -> bool:
    """A custom_vjp whose fwd holds a custom_jvp, one of whose body values only the bwd reads
    (a residual exported from the custom_jvp), every rule the true derivative, first order."""
    blocks = [s for s, *_ in walk(p.body) if isinstance(s, CustomVJP)]
    exported = any(set(b.residuals) & set(j.results) - {a for s in b.fwd for a in s.args} - set(b.results)
                   for b in blocks for j in b.fwd if isinstance(j, CustomJVP))
    scaled = any(
        o.op == SCALE_OP and o.params.get("c") == 3.0
        for s, *_ in walk(p.body)
        if isinstance(s, (CustomVJP, CustomJVP))
        for o in (s.bwd if isinstance(s, CustomVJP) else s.jvp)
    )
    return (exported and not scaled and p.diff.order == 1 and p.inputs[0].dtype == "float64"
            and "optimize_remat_symbolic_zeros" not in p.features())


def test_a_custom_vjp_rule_over_a_custom_jvp_matches_finite_differences():
    """The generator derives a custom_vjp's bwd through a custom_jvp in its fwd (the custom_jvp's
    body as the primal), exporting the body values the bwd reads as the custom_jvp's results."""
    s = settings(max_examples=5000, database=None, deadline=None, suppress_health_check=list(HealthCheck),
                 phases=(Phase.generate,))
    # (programs with both kinds of block, first order, float64: the condition is rare in the default mix)
    cfg = Config(require=("custom_vjp", "custom_jvp"), second_order=False, dtypes=("float64",))
    p = find(programs(cfg), _true_rules_with_a_custom_jvp_residual, settings=s, random=random.Random(0))
    inputs = input_values(p, 1)
    obs = pipelines.get("ref:f64").run(p, inputs)
    assert obs.error is None, obs.error
    for k, g in finite_difference(p, inputs).items():
        np.testing.assert_allclose(np.asarray(obs.grads[k]), g, rtol=1e-5, atol=1e-6)


# make run, seed 0 (hand-reduced): a custom_jvp in a custom_vjp fwd, at second order. remat2 runs the
# custom_jvp's rule; remat3 under checkpoint drops it, as nothing reads those tangents.
CUSTOM_JVP_RULE_NOT_NEEDED = json.loads(
    """{"schema_version": 1, "inputs": [{"id": "x2", "shape": [2, 2], "dtype": "float32", "diff": true}], "body": [{"kind": "checkpoint", "args": ["x2"], "body": [{"kind": "custom_vjp", "args": ["x2"], "fwd": [{"kind": "op", "op": "sin", "args": ["x2"], "params": {}, "out": "v7"}, {"kind": "custom_jvp", "args": ["v7"], "body": [{"kind": "op", "op": "sin", "args": ["v7"], "params": {}, "out": "v8"}, {"kind": "op", "op": "sin", "args": ["v7"], "params": {}, "out": "v9"}], "results": ["v8", "v9"], "tangents": ["t10"], "jvp": [{"kind": "op", "op": "cos", "args": ["v7"], "params": {}, "out": "j11"}, {"kind": "op", "op": "mul", "args": ["t10", "j11"], "params": {}, "out": "j12"}, {"kind": "op", "op": "cos", "args": ["v7"], "params": {}, "out": "j13"}, {"kind": "op", "op": "mul", "args": ["t10", "j13"], "params": {}, "out": "j14"}, {"kind": "op", "op": "scale", "args": ["j12"], "params": {"c": 3.0}, "out": "j15"}], "jvp_results": ["j15", "j14"]}], "results": ["v7", "v9"], "residuals": ["x2", "v7"], "cts": ["g16", "g17"], "bwd": [{"kind": "op", "op": "cos", "args": ["v7"], "params": {}, "out": "b18"}, {"kind": "op", "op": "mul", "args": ["g17", "b18"], "params": {}, "out": "b19"}, {"kind": "op", "op": "add", "args": ["g16", "b19"], "params": {}, "out": "b20"}, {"kind": "op", "op": "cos", "args": ["x2"], "params": {}, "out": "b21"}, {"kind": "op", "op": "mul", "args": ["b20", "b21"], "params": {}, "out": "b22"}, {"kind": "op", "op": "scale", "args": ["b22"], "params": {"c": 3.0}, "out": "b23"}], "bwd_results": ["b23"], "nondiff": [], "symbolic_zeros": false, "optimize_remat": false}], "results": ["v9"], "policy": {"kind": "nothing"}, "prevent_cse": true}], "outputs": ["v9"], "diff": {"order": 2, "mode": "reverse"}, "extensions": {}}"""  # noqa: E501
)


def test_a_custom_jvp_rule_remat3_does_not_need_is_no_finding():
    from conformance.engine.runner import InProcessExecutor
    from conformance.ir.program import load_program
    from oracles.expectations import Expectations
    from oracles.judge import judge
    p = load_program(CUSTOM_JVP_RULE_NOT_NEEDED)
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3"]
    obs = InProcessExecutor("cpu").run(p, input_values(p, 0), names)
    path = "body[0].body[0].fwd[1]"
    assert obs["jax:remat2"].custom_rules[path].fwd_traces >= 1 and obs["jax:remat3"].custom_rules[path].fwd_traces == 0
    j = judge(p, obs, Expectations.load())
    assert not [v.key() for v in j.failures() if v.pipeline == "jax:remat3"]
    assert any(v.key()[:3] == ("custom_rule", "jax:remat3", "jax:remat2") and v.status == "pass" for v in j.verdicts)
