"""PyTorch programs as people write them: views a policy names (checked exactly), in-place ops,
what autograd.Function rules receive, policies with state. Each construct runs through the real
pipelines; each oracle that judges it is shown to fail on a mutant."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from conformance.ir.nodes import Checkpoint, Input, Op, ProgramError
from conformance.ir.policy import Everything, Ops
from conformance.ir.program import Program, validate
from conformance.pipelines import registry as P
from conformance.pipelines.torch import pipelines as TP
from generators.programs import input_values
from oracles import cross_framework as X
from oracles import gradients as G
from oracles import residuals as R
from oracles.expectations import Expectations
from oracles.judge import judge


def inputs_for(prog, seed=0):
    return input_values(prog, seed)


def view_program(view: str = "transpose") -> Program:
    """x -> sin -> a view of it -> sin, in one region whose policy saves the view (sin's backward
    reads it: the view is a residual)."""
    params = {"transpose": {"perm": [1, 0]}, "matrix_t": {}, "reshape": {"shape": [6]},
              "select": {"axis": 0, "index": 1}, "slice": {"axis": 1, "start": 1, "stop": 3}}[view]
    return validate(Program(
        inputs=[Input(id="x", shape=[2, 3], dtype="float64")],
        body=[Checkpoint(args=["x"], results=["y"], policy=Ops(ops=[view]),
                         body=[Op(op="sin", args=["x"], out="a"), Op(op=view, args=["a"], params=params, out="v"),
                               Op(op="sin", args=["v"], out="y")])],
        outputs=["y"]))


@pytest.mark.parametrize("view", ["transpose", "matrix_t", "reshape", "select", "slice"])
def test_a_view_the_policy_saves_is_saved_exactly_by_eager_sac(view):
    prog = view_program(view)
    obs = P.get("torch:eager-sac").run(prog, inputs_for(prog))
    assert obs.ok(), obs.error
    saved = [r for r in obs.residuals if "v" in r.cls]
    assert saved and all("v" in r.exact for r in saved), [r.model_dump() for r in obs.residuals]
    assert R.check_policy(prog, obs).status == "pass"


class SavesViewsFlattened(TP.TorchSAC):
    """Mutant: reports every saved tensor of rank 2 or more flattened (a view saved in another
    layout than its own and its base's): equal to the view modulo layout, so only the exact view
    check can tell."""

    def _capture(self, saved):
        return [s.reshape(-1) if s.dim() >= 2 else s for s in saved]


def test_mutant_saving_a_view_in_another_layout_fails_the_exact_view_check():
    prog = view_program("transpose")
    mutant = SavesViewsFlattened(P.derive("torch:eager-sac", "torch:mutant-flatten-saved"))
    obs = mutant.run(prog, inputs_for(prog))
    assert obs.ok() and any("v" in r.cls for r in obs.residuals)   # modulo layout, still the view's class
    v = R.check_policy(prog, obs)
    assert v.status == "fail" and v.error_type == "view_layout", v.detail
    assert "['v']" in v.detail["view_in_another_layout"][0]


# ---- in-place ops -------------------------------------------------------------------------------
def inplace_program(policy=None, target="mul") -> Program:
    """a = x * x (or sin x); a.add_(x); sin of it, in one region (nothing but add_ reads a)."""
    return validate(Program(
        inputs=[Input(id="x", shape=[2, 3], dtype="float64")],
        body=[Checkpoint(args=["x"], results=["y"], policy=policy or Ops(ops=["sin"]),
                         body=[Op(op=target, args=["x", "x"] if target == "mul" else ["x"], out="a"),
                               Op(op="add_", args=["a", "x"], out="b"), Op(op="sin", args=["b"], out="y")])],
        outputs=["y"]))


@pytest.mark.parametrize("bad, field", [
    ([Op(op="add_", args=["x", "x"], out="b")], "body[0].args[0]"),                       # an input
    ([Op(op="neg", args=["x"], out="a"), Op(op="add_", args=["a", "x"], out="b"),
      Op(op="sin", args=["a"], out="c")], "body[2].args[0]"),                             # read after
    ([Op(op="transpose", args=["x"], params={"perm": [1, 0]}, out="a"),
      Op(op="relu_", args=["a"], out="b")], "body[1].args[0]"),                           # a view
    ([Op(op="neg", args=["x"], out="a"), Op(op="matrix_t", args=["a"], out="t"),
      Op(op="relu_", args=["a"], out="b")], "body[2].args[0]"),                           # viewed
])
def test_an_in_place_op_must_consume_a_value_nothing_else_sees(bad, field):
    prog = Program(inputs=[Input(id="x", shape=[2, 2], dtype="float64")], body=bad, outputs=[bad[-1].out])
    with pytest.raises(ProgramError) as e:
        validate(prog)
    assert e.value.field == field, e.value


def test_in_place_ops_compute_what_jax_computes():
    prog = inplace_program()
    inp = inputs_for(prog)
    ref = P.get("ref:f64").run(prog, inp)
    for name in ("torch:none", "torch:eager-sac", "torch:compile-aot_eager", "jax:remat3"):
        obs = P.get(name).run(prog, inp)
        assert obs.ok(), (name, obs.error)
        assert G.compare(prog, obs, ref, "loose").status == "pass", name


def _dropout_program() -> Program:
    return validate(Program(
        inputs=[Input(id="x", shape=[4], dtype="float32")],
        body=[Checkpoint(args=["x"], results=["d"], policy=Everything(),
                         body=[Op(op="dropout", args=["x"], params={"p": 0.5, "seed": 0}, out="d")])],
        outputs=["d"]))


@pytest.mark.parametrize(
    "make", [lambda: inplace_program(Everything()), _dropout_program], ids=["user-add_", "dropout"]
)
def test_eager_sac_refuses_a_mutated_cached_tensor(make):
    """(expectation torch-eager-sac-mutated-cache) A policy caching a value that is then mutated in
    place: the user's a.add_(x), or CPU dropout's own output (empty_like, then bernoulli_ and div_ in
    place; create_selective_checkpoint_contexts documents allow_cache_entry_mutation; the dropout
    program is corpus variant error-torch_eager-sac-f89e9b26's). Eager SAC raises in backward; no
    checkpoint and torch.compile compute the gradients; the judge calls the difference expected."""
    prog = make()
    if "random" in prog.features():
        assert "checkpoint" in prog.features() and "inplace" not in prog.features()
    inp = inputs_for(prog)
    names = ["torch:none", "torch:eager-sac", "torch:compile-aot_eager", "ref:f64", "jax:none", "jax:remat2"]
    obs = {n: P.get(n).run(prog, inp) for n in names}
    assert "has been mutated" in obs["torch:eager-sac"].error.message
    assert obs["torch:none"].ok() and obs["torch:compile-aot_eager"].ok()
    j = judge(prog, obs, Expectations.load())
    assert not [v for v in j.verdicts if v.status == "fail"], [v for v in j.verdicts if v.status == "fail"]
    assert "torch-eager-sac-mutated-cache" in j.expectation_hits


def test_inplace_on_a_saved_tensor_raises():
    """(expectation torch-inplace-on-saved) sin saves its input; mutating it afterwards is an error
    in every eager PyTorch pipeline, a plain value in JAX."""
    prog = validate(Program(
        inputs=[Input(id="x", shape=[3], dtype="float64")],
        body=[Op(op="neg", args=["x"], out="a"), Op(op="sin", args=["a"], out="s"),
              Op(op="relu_", args=["a"], out="b"), Op(op="add", args=["s", "b"], out="y")],
        outputs=["y"]))
    inp = inputs_for(prog)
    obs = {n: P.get(n).run(prog, inp) for n in ["torch:none", "ref:f64", "jax:none", "jax:remat2"]}
    assert "modified by an inplace operation" in obs["torch:none"].error.message
    assert obs["jax:none"].ok()
    j = judge(prog, obs, Expectations.load())
    assert not [v for v in j.verdicts if v.status == "fail"]
    assert "torch-inplace-on-saved" in j.expectation_hits
    assert np.isfinite(obs["jax:none"].loss) and torch.__version__


# ---- what an autograd.Function's backward receives --------------------------------------------
def three_results_program(region: bool = False) -> Program:
    """A symbolic_zeros block with three results: s read by the loss (a value), c read only as
    c - c (autograd sums +1 and -1: a tensor of zeros), e unread (None)."""
    from conformance.ir.nodes import CustomVJP
    block = CustomVJP(args=["x"], fwd=[Op(op="sin", args=["x"], out="s"), Op(op="cos", args=["x"], out="c"),
                                       Op(op="neg", args=["x"], out="e")],
                      results=["s", "c", "e"], residuals=["x"], cts=["gs", "gc", "ge"],
                      bwd=[Op(op="cos", args=["x"], out="dx"), Op(op="mul", args=["gs", "dx"], out="b1"),
                           Op(op="sin", args=["x"], out="sx"), Op(op="mul", args=["gc", "sx"], out="b2"),
                           Op(op="sub", args=["b1", "b2"], out="b3"), Op(op="sub", args=["b3", "ge"], out="b4")],
                      bwd_results=["b4"], symbolic_zeros=True)
    body = [block, Op(op="square", args=["s"], out="y"), Op(op="sub", args=["c", "c"], out="z"),
            Op(op="add", args=["y", "z"], out="o")]
    if region:
        body = [Checkpoint(args=["x"], results=["o"], policy=Ops(ops=["square"]), body=body)]
    return validate(Program(inputs=[Input(id="x", shape=[4], dtype="float64")], body=body, outputs=["o"]))


@pytest.mark.parametrize("name", ["torch:none", "torch:eager-sac"])
def test_a_rule_sees_none_a_zero_tensor_or_a_value_per_cotangent(name):
    prog = three_results_program(region=name != "torch:none")
    obs = P.get(name).run(prog, inputs_for(prog))
    assert obs.ok(), obs.error
    (log,) = obs.custom_rules.values()
    assert log.ct_kinds == [["value", "zero", "none"]]
    assert log.symbolic_zero_cts == [[False, False, True]]


class MaterializesZeros(TP.TorchSAC):
    """Mutant: its Functions leave set_materialize_grads on, so rules get zero tensors where
    PyTorch promises None."""

    def _options(self):
        return {**super()._options(), "materialize_grads": True}


def test_mutant_materialising_zeros_fails_the_none_vs_zero_observation():
    prog = three_results_program(region=True)
    inp = inputs_for(prog)
    mutant = MaterializesZeros(P.derive("torch:eager-sac", "torch:mutant-materialize-grads"))
    obs, ref = mutant.run(prog, inp), P.get("torch:none").run(prog, inp)
    assert obs.ok() and ref.ok()
    (log,) = obs.custom_rules.values()
    assert log.ct_kinds == [["value", "zero", "zero"]]   # the unread result's None became zeros
    v = judge_custom_rules(obs, ref)
    assert v.status == "fail" and "ct_kinds" in v.error_type, v.detail
    assert G.compare(prog, obs, P.get("ref:f64").run(prog, inp), "loose").status == "pass"   # values alike


def judge_custom_rules(obs, ref):
    from oracles.judge import compare_custom_rules
    return compare_custom_rules(obs, ref)


def function_options_program(order: int = 1) -> Program:
    """A block of three results: c marked non-differentiable (its gradient path x -> c -> y is
    cut), a once_differentiable backward, and a bwd that doubles its cotangent where the first
    result's cotangent sums below 0 (seeded: it does for some elements' signs)."""
    from conformance.ir.nodes import CustomVJP, Diff
    block = CustomVJP(args=["x"], fwd=[Op(op="sin", args=["x"], out="s"), Op(op="cos", args=["x"], out="c")],
                      results=["s", "c"], residuals=["x"], cts=["gs", "gc"],
                      bwd=[Op(op="cos", args=["x"], out="dx"), Op(op="mul", args=["gs", "dx"], out="b1"),
                           Op(op="sin", args=["x"], out="sx"), Op(op="mul", args=["gc", "sx"], out="b2"),
                           Op(op="sub", args=["b1", "b2"], out="b3")],
                      bwd_results=["b3"], non_differentiable=["c"], once_differentiable=True, bwd_branch=True)
    body = [Checkpoint(args=["x"], results=["y"], policy=Ops(ops=["sin"]),
                       body=[block, Op(op="neg", args=["s"], out="n"), Op(op="mul", args=["n", "c"], out="y")])]
    return validate(Program(inputs=[Input(id="x", shape=[5], dtype="float64")], body=body, outputs=["y"],
                            diff=Diff(order=order)))


def test_function_options_run_alike_in_both_frameworks():
    """mark_non_differentiable (JAX: stop_gradient), once_differentiable and a data-dependent branch
    in bwd: every pipeline computes the reference's gradient, which the options change (the
    branch doubles it: -cos(x) * cos(x) sums below 0); second order is declared unsupported in
    PyTorch (expectation torch-once-differentiable-first-order)."""
    prog = function_options_program()
    assert {"non_differentiable", "once_differentiable", "bwd_branch"} <= set(prog.features())
    inp = inputs_for(prog)
    ref = P.get("ref:f64").run(prog, inp)
    x = np.asarray(inp["x"], np.float64)
    np.testing.assert_allclose(ref.grads["x"], -2 * np.cos(x) * np.cos(x), rtol=1e-9)
    for name in ("torch:none", "torch:eager-sac", "torch:compile-aot_eager", "jax:remat2", "jax:remat3"):
        obs = P.get(name).run(prog, inp)
        assert obs.ok(), (name, obs.error)
        assert G.compare(prog, obs, ref, "loose").status == "pass", name
    obs = P.get("torch:eager-sac").run(function_options_program(order=2), inp)
    assert obs.unsupported == TP.ONCE_DIFFERENTIABLE
    entry = next(e for e in Expectations.load().entries if e.id == "torch-once-differentiable-first-order")
    assert entry.unsupported.reason == TP.ONCE_DIFFERENTIABLE


# ---- policies with state ------------------------------------------------------------------------
def saving_program(batch: int = 0) -> Program:
    """One region whose policy saves three ops' outputs (matmul, sin, matmul): a stateful policy
    saving every other one saves the first and the third."""
    from conformance.ir.nodes import Diff
    return validate(Program(
        inputs=[Input(id="x", shape=[3, 3], dtype="float64", batched=bool(batch)),
                Input(id="w", shape=[3, 3], dtype="float64")],
        body=[Checkpoint(args=["x", "w"], results=["y"], policy=Ops(ops=["sin", "matmul"]),
                         body=[Op(op="matmul", args=["x", "w"], out="a0"), Op(op="sin", args=["a0"], out="a"),
                               Op(op="cos", args=["a"], out="a2"), Op(op="matmul", args=["a2", "w"], out="b"),
                               Op(op="tanh", args=["b"], out="y")])],
        outputs=["y"], diff=Diff(batch=batch)))


def saved(obs) -> set:
    return {c for r in obs.residuals for c in r.cls}


def test_a_stateful_policy_saves_every_other_op_eager_and_compiled():
    prog = saving_program()
    inp = inputs_for(prog)
    stateless, eager, compiled = (P.get(n).run(prog, inp) for n in (
        "torch:eager-sac", "torch:eager-sac:stateful", "torch:compile-aot_eager:stateful"))
    assert stateless.ok() and eager.ok() and compiled.ok(), (eager.error, compiled.error)
    assert eager.flags["policy_state"] == "every_other"
    assert {"a0", "a", "b"} <= saved(stateless) and "b" in saved(eager) and "a" not in saved(eager)
    assert G.compare(prog, eager, stateless, "tight").status == "pass"
    assert X.compare_residuals(compiled, eager, prog, across=False).status == "pass"
    assert R.check_policy(prog, eager).status == "pass"


class SharesStateAcrossCalls(TP.TorchSAC):
    """Mutant: one stateful policy_fn for every checkpoint call (the state is not made afresh per
    call, a common slip): a region run once per example counts on from the previous example."""

    def _run(self, program, inputs, obs, device):
        from conformance.pipelines.torch import lowering as TL
        real = TL.context_fn

        def shared(p, names, prefer=False, calls=None, state=None, allow_mutation=False, sac_log=None):
            fn = TL.policy_fn(p, names, prefer, calls, state)
            return lambda: TL.create_selective_checkpoint_contexts(fn)
        TL.context_fn = shared
        try:
            super()._run(program, inputs, obs, device)
        finally:
            TL.context_fn = real


def test_mutant_stateful_policy_shared_across_calls_fails_against_the_real_one():
    prog = saving_program(batch=2)   # the region runs once per example
    inp = inputs_for(prog)
    mutant = SharesStateAcrossCalls(P.derive("torch:eager-sac:stateful", "torch:mutant-shared-policy-state"))
    obs, ref = mutant.run(prog, inp), P.get("torch:eager-sac:stateful").run(prog, inp)
    assert obs.ok() and ref.ok(), (obs.error, ref.error)
    assert G.compare(prog, obs, ref, "tight").status == "pass"   # values alike
    v = R.compare(obs, ref)
    assert v.status == "fail", v.detail   # the second example saved what the first did not


def test_compiled_reentrant_checkpoint_computes_eager_reentrant_values():
    prog = saving_program()
    inp = inputs_for(prog)
    eager, compiled = (
        P.get("torch:eager-reentrant").run(prog, inp),
        P.get("torch:compile-aot_eager:reentrant").run(prog, inp),
    )
    assert eager.ok() and compiled.ok(), (eager.error, compiled.error)
    assert compiled.flags["reentrant"] and compiled.flags["compile"] == "aot_eager"
    assert G.compare(prog, compiled, eager, "tight").status == "pass"
    assert saved(compiled) <= {"x", "w"}   # no policy: only the region's inputs are kept



@pytest.mark.parametrize("reads_carry, dead", [(None, True), ("dead", True), ("live", False)])
def test_a_draw_only_a_later_iteration_overwrites_is_dead_random(reads_carry, dead):
    """A scan whose body draws a mask into its carry: the draws of all iterations but the last
    are dead when no live value reads the carry (torch.compile drops them: entry
    torch-compile-drops-dead-random-ops), live when the next iteration's draw depends on it."""
    from conformance.ir.nodes import Scan
    body = [Op(op="dropout", args=["x"] if reads_carry != "live" else ["c"], params={"p": 0.5, "seed": 0}, out="d")]
    if reads_carry == "dead":
        body.append(Op(op="sum", args=["c"], params={"axis": None}, out="unused"))
    prog = validate(Program(inputs=[Input(id="x", shape=[4], dtype="float32")],
                            body=[Scan(args=["x", "x"] if reads_carry != "live" else ["x"], carry=["c"], body=body,
                                       carry_out=["d"], results=["s"], length=2, spelling="fori_loop")],
                            outputs=["s"]))
    assert ("dead_random" in prog.features()) == dead


@pytest.mark.parametrize("length", [1, 2])
@pytest.mark.parametrize("final_carry_read", [False, True])
def test_a_draw_into_a_final_carry_nothing_reads_is_dead_random(length, final_carry_read):
    """A scan whose ys are read but whose carry, drawn anew each iteration, the program never reads
    after the loop: every draw into it is dead code (torch.compile drops it and later draws shift:
    a default campaign, seed 12, flagged torch:compile-aot_eager's gradient for it before the
    feature saw a dead final carry)."""
    from conformance.ir.nodes import Scan
    body = [Op(op="dropout", args=["c"], params={"p": 0.25, "seed": 0}, out="d"),
            Op(op="dropout", args=["x"], params={"p": 0.5, "seed": 1}, out="m"),
            Op(op="sum", args=["m"], params={"axis": None}, out="y")]
    outputs = ["ys", "s"] if final_carry_read else ["ys"]
    prog = validate(Program(inputs=[Input(id="x", shape=[4], dtype="float32")],
                            body=[Scan(args=["x", "x"], carry=["c"], body=body, carry_out=["d"], ys=["y"],
                                       results=["s", "ys"], length=length)],
                            outputs=outputs))
    assert ("dead_random" in prog.features()) == (not final_carry_read)


# ---- checkpoint_sequential ------------------------------------------------------------------------
def chained_regions_program() -> Program:
    """Two regions without a policy chained on one value, then an op reading the last result: what
    checkpoint_sequential([region1, region2, op], 3, x) computes and saves."""
    from conformance.ir.policy import NoPolicy
    return validate(Program(
        inputs=[Input(id="x", shape=[2, 3], dtype="float64")],
        body=[Checkpoint(args=["x"], results=["r1"], policy=NoPolicy(),
                         body=[Op(op="sin", args=["x"], out="a"), Op(op="cos", args=["a"], out="r1")]),
              Checkpoint(args=["r1"], results=["r2"], policy=NoPolicy(), body=[Op(op="tanh", args=["r1"], out="r2")]),
              Op(op="exp", args=["r2"], out="y")],
        outputs=["y"]))


def test_chained_regions_run_as_checkpoint_sequential_alike(monkeypatch):
    prog = chained_regions_program()
    assert "sequential_regions" in prog.features()
    calls = []
    real = torch.utils.checkpoint.checkpoint_sequential
    monkeypatch.setattr(torch.utils.checkpoint, "checkpoint_sequential",
                        lambda fns, segments, x, **kw: calls.append(len(fns)) or real(fns, segments, x, **kw))
    inp = inputs_for(prog)
    obs, ref = P.get("torch:eager-sequential").run(prog, inp), P.get("torch:eager-sac").run(prog, inp)
    assert obs.ok() and ref.ok(), (obs.error, ref.error)
    assert calls == [3]   # two checkpointed segments, the op un-checkpointed
    assert R.compare(obs, ref).status == "pass" and G.compare(prog, obs, ref, "tight").status == "pass"
    assert saved(obs) == saved(ref) == {"x", "r1", "y"}   # each segment's input, and exp's output


def test_compiled_reentrant_passes_gradients_through_nested_structures():
    """(expectation torch-compile-reentrant-nested-structures) a region taking its args as one tuple:
    eager reentrant checkpoint passes them no gradient (documented), compiled reentrant does."""
    prog = validate(Program(inputs=[Input(id="x", shape=[3], dtype="float64")],
                            body=[Checkpoint(args=["x"], results=["y"], policy=Ops(ops=["sin"]), tree="tuple",
                                             body=[Op(op="sin", args=["x"], out="y")])], outputs=["y"]))
    inp = inputs_for(prog)
    names = P.run_set(["torch:compile-aot_eager:reentrant"])
    obs = {n: P.get(n).run(prog, inp) for n in names}
    np.testing.assert_allclose(obs["torch:eager-reentrant"].grads["x"], 0.0)
    np.testing.assert_allclose(obs["torch:compile-aot_eager:reentrant"].grads["x"], np.cos(inp["x"]), rtol=1e-9)
    j = judge(prog, obs, Expectations.load())
    assert "torch-compile-reentrant-nested-structures" in j.expectation_hits
    assert not [v for v in j.verdicts if v.status == "fail" and v.pipeline == "torch:compile-aot_eager:reentrant"]


_COND_IN_DICT_REGION = {"kind": "checkpoint", "args": ["x1", "x0"], "results": ["s3"], "tree": "dict",
                        "policy": {"kind": "nothing"},
                        "body": [{"kind": "cond", "args": ["x1", "x0"], "results": ["s3"],
                                  "branches": [[{"kind": "op", "op": "sin", "args": ["x0"], "out": "v2", "params": {}}],
                                               []],
                                  "branch_results": [["v2"], ["x0"]]}]}
# (a 30-minute default campaign's shrunk program: .item() inside a region taking a tuple)
_ITEM_IN_TUPLE_REGION = {"kind": "checkpoint", "args": ["x0"], "results": ["s3"], "tree": "tuple",
                         "policy": {"kind": "nothing"},
                         "body": [{"kind": "op", "op": "scale_by_max", "args": ["x0"], "out": "s3", "params": {}}]}


@pytest.mark.parametrize("region", [_COND_IN_DICT_REGION, _ITEM_IN_TUPLE_REGION], ids=["cond", "item"])
def test_compiled_reentrant_after_a_graph_break_follows_eager(region):
    """(expectation torch-compile-reentrant-nested-structures-after-graph-break) a cond (a Python branch on a tensor)
    inside a region taking its args as one dict, or a data-dependent op (`.item()`) inside one taking a tuple: dynamo
    breaks the graph there and the reentrant checkpoint runs eagerly, passing no gradient like eager reentrant, where
    the baselines give one; the entry excuses it."""
    from conformance.ir.program import load_program
    prog = load_program({"schema_version": 1, "diff": {"mode": "reverse", "order": 1}, "outputs": ["s3"],
                         "inputs": [{"id": "x0", "shape": [3, 2], "dtype": "float64", "diff": True},
                                    {"id": "x1", "shape": [], "dtype": "float64", "diff": False}],
                         "body": [region]})
    inp = {"x0": np.array([[0.3, -0.2], [0.5, 0.1], [0.7, -0.4]]), "x1": np.array(-0.7)}
    names = P.run_set(["torch:compile-aot_eager:reentrant"])
    obs = {n: P.get(n).run(prog, inp) for n in names}
    assert obs["torch:compile-aot_eager:reentrant"].flags["graph_breaks"] >= 1
    np.testing.assert_allclose(obs["torch:compile-aot_eager:reentrant"].grads["x0"], 0.0)
    assert np.any(np.asarray(obs["torch:none"].grads["x0"]) != 0.0)
    j = judge(prog, obs, Expectations.load())
    assert "torch-compile-reentrant-nested-structures-after-graph-break" in j.expectation_hits
    assert not [v for v in j.verdicts if v.status == "fail" and v.pipeline == "torch:compile-aot_eager:reentrant"]
