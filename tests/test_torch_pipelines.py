"""PyTorch pipelines: values against the float64 reference, residual capture under policies
(eager and compiled), mutants caught by the residual and cross-framework oracles, symbolic
zeros. Kept under a few minutes on 2 cores: inductor compiles one small program."""
from __future__ import annotations

import numpy as np
import pytest
import torch  # noqa: E402  (pinned: a missing torch is an error, not a skip)
from hypothesis import HealthCheck, given, settings  # noqa: E402

from conformance.ir.nodes import Checkpoint, CustomVJP, Diff, Input, Op
from conformance.ir.policy import Both, DotParams, Dots, DotsNoBatch, Everything, Nothing, Ops, SaveOnlyNames  # noqa: E402
from conformance.ir.program import Program, validate  # noqa: E402
from conformance.pipelines import registry as P  # noqa: E402
from conformance.pipelines.torch import lowering as TL  # noqa: E402
from conformance.pipelines.torch import pipelines as TP  # noqa: E402
from generators.programs import Config, cases, input_values  # noqa: E402
from oracles import cross_framework as X  # noqa: E402
from oracles import gradients as G  # noqa: E402
from oracles import residuals as R  # noqa: E402
from tests.corpus_files import REG as REGRESSIONS
from tests.corpus_files import variant_path

TORCH = [n for n in P.SPECS if P.framework_of(n) == "torch"]
EAGER = ["torch:none", "torch:eager-sac", "torch:eager-sac:prefer"]
AOT = ["torch:compile-aot_eager", "torch:compile-aot_eager:prefer",
       "torch:compile-aot_eager+default-partitioner", "torch:compile-aot_eager+default-partitioner:prefer"]


def named_program(dtype="float32", policy=None) -> Program:
    """x@W -> sin -> name h -> cos, in one region saving h."""
    return validate(Program(
        inputs=[Input(id="x", shape=[4, 5], dtype=dtype), Input(id="W", shape=[5, 3], dtype=dtype)],
        body=[Checkpoint(args=["x", "W"], results=["o"], policy=policy or SaveOnlyNames(names=["h"]),
                         body=[Op(op="matmul", args=["x", "W"], out="m"), Op(op="sin", args=["m"], out="s"),
                               Op(op="name", args=["s"], params={"name": "h"}, out="h"),
                               Op(op="cos", args=["h"], out="o")])],
        outputs=["o"]))


def nested_program(agreeing: bool = False) -> Program:
    """Nested regions with different policies, a batched matmul and a layout op (`agreeing`: the
    outer policy saves the inner one's matmul too, so that the levels do not conflict)."""
    inner = Checkpoint(args=["a"], results=["t"], policy=Dots(),
                       body=[Op(op="transpose", args=["a"], params={"perm": [0, 2, 1]}, out="at"),
                             Op(op="matmul", args=["a", "at"], out="aa"),
                             Op(op="tanh", args=["aa"], out="t")])
    return validate(Program(
        inputs=[Input(id="x", shape=[2, 3, 4], dtype="float64")],
        body=[Checkpoint(args=["x"], results=["r"], policy=Both(a=Ops(ops=["sin"] + ["matmul"] * agreeing),
                                                               b=SaveOnlyNames(names=["n"])),
                         body=[Op(op="sin", args=["x"], out="a"), inner,
                               Op(op="name", args=["t"], params={"name": "n"}, out="n"),
                               Op(op="mul", args=["n", "n"], out="r")]),
              Op(op="sum", args=["r"], params={"axis": 0}, out="out")],
        outputs=["out"]))


def custom_program(symbolic_zeros=True, dtype="float64", region=False) -> Program:
    """custom_vjp with two results, the second unused (its cotangent is a symbolic zero)."""
    block = CustomVJP(args=["x"], fwd=[Op(op="sin", args=["x"], out="s"), Op(op="cos", args=["x"], out="c")],
                      results=["s", "c"], residuals=["x"], cts=["gs", "gc"],
                      bwd=[Op(op="cos", args=["x"], out="dx"), Op(op="mul", args=["gs", "dx"], out="b1"),
                           Op(op="sin", args=["x"], out="sx"), Op(op="mul", args=["gc", "sx"], out="b2"),
                           Op(op="sub", args=["b1", "b2"], out="b3")],
                      bwd_results=["b3"], symbolic_zeros=symbolic_zeros)
    body = [block, Op(op="square", args=["s"], out="y")]
    if region:
        body = [Checkpoint(args=["x"], results=["y"], policy=Nothing(), body=body)]
    return validate(Program(inputs=[Input(id="x", shape=[5], dtype=dtype)], body=body, outputs=["y"]))


def inputs_for(prog, seed=0):
    return input_values(prog, seed)


@pytest.fixture(scope="module")
def ref_cache():
    cache = {}

    def get(prog, inputs):
        k = prog.content_hash()
        if k not in cache:
            cache[k] = P.get("ref:f64").run(prog, inputs)
        return cache[k]
    return get


def named_classes(obs):
    return sorted("/".join(r.cls) for r in obs.residuals if r.names)


# ---- registry, policy mapping ------------------------------------------------------------------
def test_registry_lists_torch_pipelines():
    for n in ["torch:none", "torch:eager-sac", "torch:compile-aot_eager",
              "torch:compile-aot_eager+default-partitioner", "torch:compile-inductor"]:
        assert n in P.SPECS and n + ":prefer" in P.SPECS or n == "torch:none"
        assert P.get(n).framework == "torch"
    assert P.is_reference("torch:none") and P.baseline_of("torch:compile-inductor") == "torch:none"
    assert P.comparisons("torch:compile-aot_eager:prefer", set(P.SPECS)) == [
        ("torch:eager-sac:prefer", "eager"), ("jax:remat2", "cross")]


def test_policy_mapping():
    """The SAC adapter: aten op -> IR op kind (and batched), then the one policy meaning."""
    A = torch.ops.aten
    C = torch.utils.checkpoint.CheckpointPolicy

    def d(policy, op, *args, names=("h", "g")):
        return TL.policy_fn(policy, list(names))(None, op, *args)
    fn = TL.policy_fn(SaveOnlyNames(names=["h"]), ["g", "h"])
    assert fn(None, TL.TAG, torch.zeros(1), "h") == C.MUST_SAVE
    assert fn(None, TL.TAG, torch.zeros(1), "g") == C.MUST_RECOMPUTE
    assert TL.policy_fn(SaveOnlyNames(names=["h"]), ["h"], prefer=True)(None, TL.TAG, None, "h") == C.PREFER_SAVE
    assert d(Dots(), A.bmm.default) == C.MUST_SAVE
    assert d(DotsNoBatch(), A.bmm.default) == C.MUST_RECOMPUTE
    assert d(DotsNoBatch(), A.mm.default) == C.MUST_SAVE
    assert d(Ops(ops=["sin", "add"]), A.add.Tensor) == C.MUST_SAVE
    assert d(Ops(ops=["sin"]), A.cos.default) == C.MUST_RECOMPUTE
    assert d(Ops(ops=["scale"]), A.mul.Tensor) == C.MUST_SAVE      # aten.mul is both scale and mul
    assert d(Everything(), A.view.default) == C.MUST_SAVE
    assert d(Everything(), A.clone.default) == C.MUST_SAVE          # an op the IR does not know
    assert d(Ops(ops=["sin"]), A.clone.default) == C.MUST_RECOMPUTE
    assert d(Both(a=Nothing(), b=Dots()), A.mm.default) == C.MUST_SAVE


@pytest.mark.parametrize("name", ["jax:remat2", "jax:remat2:jit", "torch:eager-sac", "torch:compile-aot_eager"])
def test_a_policy_over_params_saves_what_dots_no_batch_saves(name):
    """dot_params is a user's callable reading dot_general's dimension_numbers: where a framework
    honours it, it keeps the very residuals that the built-in dots_no_batch keeps (the unbatched
    product, not the batched one)."""
    def program(policy):
        return validate(Program(
            inputs=[Input(id="x", shape=[2, 3, 4], dtype="float32"), Input(id="w", shape=[2, 4, 3], dtype="float32")],
            body=[Checkpoint(args=["x", "w"], results=["o"], policy=policy,
                             body=[Op(op="matmul", args=["x", "w"], out="b"),          # batched: [2, 3, 3]
                                   Op(op="sum", args=["b"], params={"axis": 0}, out="m"),
                                   Op(op="matmul", args=["m", "m"], out="u"),          # unbatched: [3, 3]
                                   Op(op="sin", args=["u"], out="o")])],
            outputs=["o"]))
    by_params, built_in = program(DotParams()), program(DotsNoBatch())
    inp = inputs_for(by_params)
    a, b = P.get(name).run(by_params, inp), P.get(name).run(built_in, inp)
    assert a.ok() and b.ok()
    assert [r.describe() for r in a.residuals] == [r.describe() for r in b.residuals]
    assert any(r.cls == ["u"] for r in a.residuals)   # the unbatched product is kept
    assert R.check_policy(by_params, a).status == "pass"


# ---- values --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", EAGER + AOT)
@pytest.mark.parametrize("make", [named_program, nested_program, lambda: custom_program(True, region=True)],
                         ids=["named", "nested", "custom_in_region"])
def test_gradients_match_reference(name, make, ref_cache):
    prog = make()
    inp = inputs_for(prog)
    obs = P.get(name).run(prog, inp)
    assert obs.ok(), (obs.error, obs.unsupported)
    assert G.compare(prog, obs, ref_cache(prog, inp), "loose").status == "pass"
    assert G.compare(prog, obs, P.get("torch:none").run(prog, inp), "tight").status == "pass"


@settings(max_examples=6, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(cases(Config(max_stmts=4, second_order=False, custom_jvp=False)))   # custom_jvp: unsupported (data)
def test_generated_programs_eager_and_aot(case):
    """Every program runs: a pipeline that raises is judged, and its error must be documented (an
    expectation the judge applied) or be the behaviour of an open regression-corpus entry (matched
    as a campaign matches: key, core features, what it raised); one that runs has the reference's
    gradients (PyTorch's own unrematerialized ones tightly) and honours the policy."""
    from oracles.expectations import Expectations
    from oracles.judge import judge
    prog, seed = case
    inp = input_values(prog, seed)
    obs = {n: P.get(n).run(prog, inp) for n in ("ref:f64", "torch:none", "torch:eager-sac", "torch:compile-aot_eager")}
    j = judge(prog, obs, Expectations.load())
    assert not unaccounted_errors(prog, obs, j)
    ref, base = obs["ref:f64"], obs["torch:none"]
    for n in ("torch:eager-sac", "torch:compile-aot_eager"):
        if not obs[n].ok() or not base.ok():
            continue
        if ref.ok() and "random" not in prog.features():   # (JAX and PyTorch draw different masks)
            assert G.compare(prog, obs[n], ref, "loose").status == "pass", n
        assert G.compare(prog, obs[n], base, "tight").status == "pass", n
        assert R.check_policy(prog, obs[n]).status == "pass", n


def unaccounted_errors(prog, obs, j) -> list:
    """The pipelines that raised with neither an expectation nor an open corpus entry accounting for it."""
    from conformance.engine.findings import error_root
    from conformance.engine.loading import load_known
    from conformance.engine.search import known_finding
    tracked = load_known([str(REGRESSIONS)])
    failing = {v.key() for v in j.failures()}
    out = []
    for n, o in obs.items():
        if o.error is None:
            continue
        mine = [v for v in j.verdicts if v.check == "error" and v.pipeline == n]
        if any(v.status == "expected" for v in mine):
            continue
        if any(v.status == "fail" and known_finding(tracked, v.key(), prog.features(), failing,
                                                    error_root(v.detail)) is not None for v in mine):
            continue
        out.append((n, o.error, [(v.status, v.error_type) for v in mine]))
    return out


def test_inductor_gradients_and_named_residual(ref_cache):
    prog = named_program()
    inp = inputs_for(prog)
    obs = P.get("torch:compile-inductor").run(prog, inp)
    assert obs.ok(), obs.error
    assert G.compare(prog, obs, ref_cache(prog, inp), "loose").status == "pass"
    assert "h/s" in named_classes(obs)
    assert obs.flags["partitioner_saved"], "the recording partitioner ran"


# ---- residuals -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["torch:eager-sac", "torch:compile-aot_eager",
                                  "torch:compile-aot_eager+default-partitioner"])
def test_named_residual_saved_by_policy(name):
    prog = named_program()
    inp = inputs_for(prog)
    obs = P.get(name).run(prog, inp)
    assert obs.ok(), obs.error
    assert named_classes(obs) == ["h/s"]
    assert {tuple(r.cls) for r in obs.residuals} >= {("x",), ("W",), ("h", "s")}
    assert R.check_policy(prog, obs).status == "pass"
    # ...and not saved when the policy recomputes everything
    obs = P.get(name).run(named_program(policy=Nothing()), inp)
    assert obs.ok() and named_classes(obs) == []


def test_residuals_agree_with_jax_and_between_torch_pipelines():
    prog = named_program()
    inp = inputs_for(prog)
    jax_obs = P.get("jax:remat2").run(prog, inp)
    eager = P.get("torch:eager-sac").run(prog, inp)
    comp = P.get("torch:compile-aot_eager").run(prog, inp)
    for a, b in [(eager, jax_obs), (comp, jax_obs), (comp, eager)]:
        assert X.compare_residuals(a, b).status == "pass"
        assert X.compare_residuals(a, b, prog).status == "pass"
    assert X.compare_grads(prog, eager, jax_obs).status == "pass"
    assert X.compare_grads(prog, comp, eager).status == "pass"


class DropOneResidual(TP.TorchSAC):
    """Mutant: loses the captured residual of the named value (as a buggy capture would)."""

    def _capture(self, saved):
        h = torch.sin(torch.as_tensor(self._inp["x"]) @ torch.as_tensor(self._inp["W"]))
        return [s for s in saved if not (s.shape == h.shape and torch.allclose(s, h))]

    def run(self, program, inputs, device="cpu"):
        self._inp = inputs
        return super().run(program, inputs, device)


class TracingTimeCapture(TP.TorchSAC):
    """Stand-in for torch 2.4's compile of a reentrant checkpoint: the capture's hooks also saw a tracing-time
    tensor (there a FunctionalTensor; here a FakeTensor), which has no values."""

    def _capture(self, saved):
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode():
            fake = torch.empty(2)
        return [*saved, fake]


def test_a_capture_of_tracing_time_tensors_leaves_the_residuals_unobserved_not_an_error():
    prog = named_program()
    obs = TracingTimeCapture(P.derive("torch:eager-sac", "torch:mutant-tracing-capture")).run(prog, inputs_for(prog))
    assert obs.ok() and obs.residuals is None and obs.grads
    assert "tracing-time tensors" in obs.flags["residuals_unobserved"]


@pytest.mark.parametrize("compile", [None, "aot_eager"])
def test_mutant_dropping_a_residual_is_detected(compile):
    prog = named_program()
    inp = inputs_for(prog)
    like = "torch:compile-aot_eager" if compile else "torch:eager-sac"
    mutant = DropOneResidual(P.derive(like, "torch:mutant-drop-residual"))
    obs = mutant.run(prog, inp)
    assert obs.ok()
    jax_obs = P.get("jax:remat2").run(prog, inp)
    for scope in (None, prog):
        v = X.compare_residuals(obs, jax_obs, scope)
        assert v.status == "fail" and v.error_type == "missing" and v.detail["missing_named"] == ["h/s"]
        v = X.compare_residuals(obs, P.get("torch:eager-sac").run(prog, inp), scope)
        assert v.status == "fail"


@pytest.mark.parametrize("policy", [Everything(), SaveOnlyNames(names=["a"])])
def test_named_value_read_by_sin_across_frameworks(policy):
    """sin(name(sin(x))) (gate seed 352822). Under `everything` JAX saves cos of the named value
    (the factor of its sin rule) and eager SAC saves the value itself (its sin rule's input): a
    derivative-rule difference, left out of the cross comparison. Under save_only_names both keep it."""
    prog = validate(Program(inputs=[Input(id="x", shape=[], dtype="float32")],
                            body=[Checkpoint(args=["x"], results=["y"], policy=policy,
                                             body=[Op(op="sin", args=["x"], out="s"),
                                                   Op(op="name", args=["s"], params={"name": "a"}, out="n"),
                                                   Op(op="sin", args=["n"], out="y")])],
                            outputs=["y"]))
    inp = inputs_for(prog)
    torch_obs, jax_obs = P.get("torch:eager-sac").run(prog, inp), P.get("jax:remat2").run(prog, inp)
    assert named_classes(torch_obs) == ["n/s"]
    assert named_classes(jax_obs) == ([] if policy.kind == "everything" else ["n/s"])
    v = X.compare_residuals(torch_obs, jax_obs, prog)
    assert v.status == "pass", v.detail


def test_policy_named_scope():
    assert X.policy_named(named_program()) == {"h"}
    assert X.policy_named(named_program(policy=Nothing())) == set()
    assert X.policy_named(nested_program()) == {"n"}
    top = validate(Program(inputs=[Input(id="x", shape=[3], dtype="float64")],
                           body=[Op(op="name", args=["x"], params={"name": "a"}, out="a"),
                                 Op(op="sin", args=["a"], out="o")], outputs=["o"]))
    assert X.policy_named(top) == set()   # outside every region: derivative rules decide


def test_mutant_perturbed_gradient_is_detected_cross_framework():
    prog = named_program()
    inp = inputs_for(prog)
    jax_obs = P.get("jax:remat2").run(prog, inp)
    obs = P.get("torch:eager-sac").run(prog, inp)
    assert X.compare_grads(prog, obs, jax_obs).status == "pass"
    bad = obs.model_copy(deep=True)
    g = np.asarray(bad.grads["W"])
    g.flat[0] *= 1.001
    bad.grads["W"] = g.tolist()
    v = X.compare_grads(prog, bad, jax_obs)
    assert v.status == "fail" and v.detail["value"] == "grad[W]"


# ---- custom rules --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["torch:none", "torch:eager-sac"])
def test_symbolic_zero_reaches_eager_backward_as_none(name, ref_cache):
    prog = custom_program(symbolic_zeros=True, region=(name != "torch:none"))
    inp = inputs_for(prog)
    obs = P.get(name).run(prog, inp)
    assert obs.ok(), obs.error
    path = "body[0]" if name == "torch:none" else "body[0].body[0]"
    log = obs.custom_rules[path]
    assert log.bwd_calls >= 1
    assert log.symbolic_zero_cts == [[False, True]]   # cos result unused -> None arrived
    assert log.perturbed == [[True]]
    assert G.compare(prog, obs, ref_cache(prog, inp), "loose").status == "pass"
    # without symbolic_zeros the cotangent is materialised: nothing logged as a zero
    obs = P.get(name).run(custom_program(symbolic_zeros=False, region=(name != "torch:none")), inp)
    assert obs.custom_rules[path].symbolic_zero_cts == []


# ---- second order ---------------------------------------------------------------------------------
def test_second_order_compiled_is_unsupported_eager_is_recorded(ref_cache):
    prog = named_program(dtype="float64").model_copy(update={"diff": Diff(order=2)})
    inp = inputs_for(prog)
    obs = P.get("torch:compile-aot_eager").run(prog, inp)
    assert obs.unsupported and "double backward" in obs.unsupported
    base = P.get("torch:none").run(prog, inp)
    assert base.ok() and base.grads2 is not None
    assert G.compare(prog, base, ref_cache(prog, inp), "loose").status == "pass"
    # eager SAC: the region saved a named value, so the double backward raises (the packaged
    # expectation torch-eager-sac-no-double-backward); recorded as the second-order stage's error,
    # with the first-order gradients kept
    obs = P.get("torch:eager-sac").run(prog, inp)
    assert obs.grads is not None and any(r.names for r in obs.residuals)
    assert obs.error is not None and obs.error.stage == "second_order", obs.error
    assert obs.error.type == "RuntimeError" and "backward an extra time" in obs.error.message


# ---- devices ----------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", ["torch:eager-sac", "torch:compile-aot_eager", "torch:compile-inductor"])
def test_cuda_agrees_with_cpu(name):
    prog = named_program()
    inp = inputs_for(prog)
    cpu = P.get(name).run(prog, inp, device="cpu")
    gpu = P.get(name).run(prog, inp, device="cuda")
    assert gpu.ok(), gpu.error
    assert "cuda" in P.get(name).devices()
    assert X.compare_grads(prog, gpu, cpu, mode="loose").status == "pass"
    assert X.compare_residuals(gpu, cpu).status == "pass"


def test_second_order_differentiates_custom_rule_through_residuals(ref_cache):
    """bwd reads a residual computed in fwd (cos x): d/dx sum(g * cos x) = -sin x, as in JAX."""
    block = CustomVJP(args=["x"], fwd=[Op(op="cos", args=["x"], out="c"), Op(op="sin", args=["x"], out="s")],
                      results=["s"], residuals=["c"], cts=["g"],
                      bwd=[Op(op="mul", args=["g", "c"], out="b")], bwd_results=["b"])
    prog = validate(Program(inputs=[Input(id="x", shape=[3], dtype="float64")], body=[block], outputs=["s"],
                            diff=Diff(order=2)))
    inp = inputs_for(prog)
    for name in ("torch:none", "torch:eager-sac"):
        obs = P.get(name).run(prog, inp)
        assert obs.ok(), obs.error
        assert G.compare(prog, obs, ref_cache(prog, inp), "loose").status == "pass"
        assert np.allclose(obs.grads2["x"], -np.sin(inp["x"]))


@pytest.mark.parametrize("name", ["torch:eager-sac", "torch:compile-aot_eager"])
def test_min_elements_policy_decides_by_input_size_in_sac(name):
    # sin of a 4-element value is saved by min_elements(4), sin of a 2-element value is not: the
    # adapter's size classes reach the same decisions as policy.decide
    from tests.programs import op, prog, region
    p = prog([region(["x", "y"], [op("sin", ["x"], "a"), op("sin", ["a"], "b"), op("sin", ["y"], "c"),
                                  op("sin", ["c"], "d"), op("sum", ["b"], "e", axis=None),
                                  op("sum", ["d"], "f", axis=None), op("add", ["e", "f"], "g")],
                     ["g"], {"kind": "min_elements", "elements": 4})],
             inputs=[{"id": "x", "shape": [4], "dtype": "float32", "diff": True},
                     {"id": "y", "shape": [2], "dtype": "float32", "diff": True}], outputs=["g"])
    obs = P.get(name).run(p, input_values(p, 0))
    assert obs.ok(), obs.error
    saved = {c for r in obs.residuals for c in r.cls}
    assert not {"c", "d"} & saved, obs.residuals
    assert R.check_policy(p, obs).status == "pass"
    if name == "torch:eager-sac":   # eager SAC keeps what MUST_SAVE names
        assert {"a", "b"} <= saved, obs.residuals


# ---- checkpoint options and compile knobs -----------------------------------------------------------
OPTIONS = ["torch:eager-reentrant", "torch:eager-sac:checks-off", "torch:compile-aot_eager:budget-0.5",
           "torch:compile-aot_eager:budget-0", "torch:checkpoint-of-compiled", "torch:compile-aot_eager:backward-twice",
           "torch:compile-aot_eager:dynamic", "torch:compile-aot_eager:graph-break"]


def chain_program() -> Program:
    """x@W -> sin -> @W -> tanh -> square, outside every region: what the min-cut partitioner
    saves here depends on the activation memory budget alone."""
    return validate(Program(
        inputs=[Input(id="x", shape=[8, 8], dtype="float32"), Input(id="W", shape=[8, 8], dtype="float32")],
        body=[Op(op="matmul", args=["x", "W"], out="a"), Op(op="sin", args=["a"], out="b"),
              Op(op="matmul", args=["b", "W"], out="c"), Op(op="tanh", args=["c"], out="d"),
              Op(op="square", args=["d"], out="y")],
        outputs=["y"]))


def test_option_pipelines_are_declared_with_their_comparisons():
    assert set(OPTIONS) <= set(P.SPECS) and not any(P.SPECS[n].default for n in OPTIONS)
    assert P.comparisons("torch:eager-reentrant", set(P.SPECS)) == [("torch:eager-sac", "values")]
    assert P.comparisons("torch:compile-aot_eager:budget-0", set(P.SPECS)) == [
        ("torch:eager-sac", "eager"), ("torch:compile-aot_eager:budget-0.5", "budget")]
    assert P.get("torch:compile-aot_eager:budget-0.5").flags()["activation_memory_budget"] == 0.5
    assert P.get("torch:eager-reentrant").flags()["reentrant"] is True


@pytest.mark.parametrize("name", OPTIONS)
@pytest.mark.parametrize("make", [lambda: nested_program(agreeing=True), lambda: custom_program(True, region=True),
                                  chain_program], ids=["nested", "custom_in_region", "chain"])
def test_option_pipelines_agree_with_eager_sac(name, make):
    """Each option pipeline, judged as a campaign judges it (its comparisons from the registry),
    passes on programs where no option changes what is computed or kept."""
    from oracles.expectations import Expectations
    from oracles.judge import judge
    prog = make()
    inp = inputs_for(prog)
    names = P.run_set([name])
    obs = {n: P.get(n).run(prog, inp) for n in names}
    assert obs[name].ok(), (obs[name].error, obs[name].unsupported)
    j = judge(prog, obs, Expectations.load())
    mine = [v for v in j.verdicts if v.pipeline == name]
    # (but the bug the corpus tracks, residuals-torch_compile-aot_eager_budget-0-cbb41799: budget 0 saves
    # the graph's inputs only, dropping whatever the policy saves, under any saving policy)
    tracked = {("residuals", "torch:compile-aot_eager:budget-0", "torch:eager-sac", "missing"),
               ("residuals", "torch:compile-aot_eager:budget-0", "policy", "recomputed_against_policy")}
    assert variant_path("residuals-torch_compile-aot_eager_budget-0-cbb41799.json").is_file()
    new = [v for v in mine if v.status == "fail" and v.key() not in tracked]
    assert not new, [(v.key(), v.detail) for v in new]
    ran = {(v.check, v.reference) for v in mine if v.status == "pass"}
    for ref, mode in P.comparisons(name, set(names)):
        want = {"values": "gradient", "budget": "residuals", "same": "residuals", "eager": "gradient"}[mode]
        assert (want, ref) in ran, (mode, ref, ran)


def test_reentrant_checkpoint_matches_sac_values_and_declares_second_order():
    """use_reentrant=True: gradients by .backward() (it rejects autograd.grad), equal to SAC's;
    second order is out of its scope, with the packaged entry's reason."""
    from oracles.expectations import Expectations
    from oracles.judge import judge
    prog = named_program(dtype="float64")
    inp = inputs_for(prog)
    a, b = P.get("torch:eager-reentrant").run(prog, inp), P.get("torch:eager-sac").run(prog, inp)
    assert a.ok() and b.ok()
    assert X.compare_grads(prog, a, b).status == "pass"
    assert named_classes(a) == [] and named_classes(b) == ["h/s"]   # no policy: h is recomputed
    prog2 = prog.model_copy(update={"diff": Diff(order=2)})
    obs = {n: P.get(n).run(prog2, inp) for n in ["ref:f64", "jax:none", "jax:remat2", "torch:none",
                                                 "torch:eager-reentrant"]}
    assert obs["torch:eager-reentrant"].unsupported == TP.NO_REENTRANT_GRAD
    entry = next(e for e in Expectations.load().entries if e.id == "torch-reentrant-first-order")
    assert entry.unsupported.reason == TP.NO_REENTRANT_GRAD
    (v,) = [v for v in judge(prog2, obs, Expectations.load()).verdicts
            if v.pipeline == "torch:eager-reentrant" and v.check == "error"]
    assert (v.status, v.expectation) == ("unsupported", "torch-reentrant-first-order")


def test_saved_bytes_fall_with_the_budget():
    from oracles import memory_budget as MB
    prog = chain_program()
    inp = inputs_for(prog)
    runs = [P.get(n).run(prog, inp) for n in ["torch:compile-aot_eager", "torch:compile-aot_eager:budget-0.5",
                                              "torch:compile-aot_eager:budget-0"]]
    assert all(o.ok() for o in runs)
    sizes = [sum(MB.saved_bytes(o)) for o in runs]
    assert sizes[0] > sizes[2] and sizes == sorted(sizes, reverse=True), sizes
    assert sizes[2] == 2 * 8 * 8 * 4   # budget 0: the inputs only
    for low, high in zip(runs[1:], runs):
        v = MB.compare(low, high)
        assert v.status == "pass" and v.detail["budget"] < v.detail["reference_budget"], v.detail


def test_mutant_ignoring_the_budget_is_detected():
    """Mutant: a 'budget 0.5' pipeline whose partitioner saves everything backward reads (the
    default partitioner, which knows no budget): it saves more bytes than min-cut at budget 1."""
    from oracles import memory_budget as MB
    prog = chain_program()
    inp = inputs_for(prog)
    mutant = TP.TorchSAC(P.derive("torch:compile-aot_eager:budget-0.5", "torch:mutant-ignores-budget",
                                  partitioner="default"))
    obs, ref = mutant.run(prog, inp), P.get("torch:compile-aot_eager").run(prog, inp)
    assert obs.ok() and ref.ok()
    v = MB.compare(obs, ref)
    assert v.status == "fail" and v.error_type == MB.SYMPTOM, v.detail
    assert sum(v.detail["saved_bytes"]) > sum(v.detail["reference_saved_bytes"])


def test_budget_zero_drops_a_must_save_that_lower_budgets_keep():
    """torch 2.14: choose_saved_values_set returns the graph inputs at budget 0 before any SAC
    MUST_SAVE is looked at (budgets in (0, 1) keep MUST_SAVE nodes): the named value the
    policy saves is recomputed. The judge reports it against eager SAC (named class missing) and
    against the policy (its backward graph computes the MUST_SAVE node again)."""
    from oracles.expectations import Expectations
    from oracles.judge import judge
    prog = named_program()
    inp = inputs_for(prog)
    names = P.run_set(["torch:compile-aot_eager:budget-0.5", "torch:compile-aot_eager:budget-0"])
    obs = {n: P.get(n).run(prog, inp) for n in names}
    assert named_classes(obs["torch:compile-aot_eager:budget-0.5"]) == ["h/s"]
    assert named_classes(obs["torch:compile-aot_eager:budget-0"]) == []
    fails = sorted(v.key() for v in judge(prog, obs, Expectations.load()).failures())
    # (and against its policy: the backward graph computes the MUST_SAVE name tag again)
    assert fails == [("residuals", "torch:compile-aot_eager:budget-0", "policy", "recomputed_against_policy"),
                     ("residuals", "torch:compile-aot_eager:budget-0", "torch:eager-sac", "missing")], fails


# ---- randomness ----------------------------------------------------------------------------------------
def dropout_program(policy=None, dtype="float32") -> Program:
    """sin -> dropout -> sin in one region (recomputed by default: the recompute must draw the
    forward's mask again)."""
    return validate(Program(
        inputs=[Input(id="x", shape=[16], dtype=dtype)],
        body=[Checkpoint(args=["x"], results=["y"], policy=policy or Nothing(),
                         body=[Op(op="sin", args=["x"], out="a"),
                               Op(op="dropout", args=["a"], params={"p": 0.5, "seed": 3}, out="d"),
                               Op(op="sin", args=["d"], out="y")])],
        outputs=["y"]))


def test_dropout_values_agree_within_each_framework():
    """PyTorch pipelines draw from the generator seeded per run (inductor with fallback_random),
    JAX pipelines multiply by the statement's mask: each framework agrees with itself; across
    frameworks the values are not compared (skipped, with the reason)."""
    from oracles.expectations import Expectations
    from oracles.judge import judge
    prog = dropout_program()
    assert "random" in prog.features()
    inp = inputs_for(prog)
    names = P.run_set(["jax:remat3", "torch:eager-sac", "torch:compile-aot_eager", "torch:compile-inductor"])
    obs = {n: P.get(n).run(prog, inp) for n in names}
    assert all(o.ok() for o in obs.values()), {n: o.error for n, o in obs.items()}
    torch_masks = np.asarray(obs["torch:none"].grads["x"]) == 0
    assert torch_masks.any() and not torch_masks.all()   # dropout dropped some, kept some
    j = judge(prog, obs, Expectations.load())
    assert not j.failures(), [(v.key(), v.detail) for v in j.failures()]
    skipped = [v for v in j.verdicts if v.check == "gradient" and v.status == "skipped"
               and "random draws differ" in v.detail.get("reason", "")]
    assert {(v.pipeline, v.reference) for v in skipped} >= {("torch:eager-sac", "ref:f64"),
                                                            ("torch:eager-sac", "jax:remat2")}
    passed = {(v.pipeline, v.reference) for v in j.verdicts if v.check == "gradient" and v.status == "pass"}
    assert {("torch:compile-inductor", "torch:none"), ("torch:compile-aot_eager", "torch:eager-sac"),
            ("jax:remat3", "ref:f64")} <= passed


def test_mutant_recompute_drawing_new_numbers_is_detected():
    """Mutant: checkpoint with preserve_rng_state=False, so the recompute draws a new mask; the
    gradient against PyTorch without checkpoint, same seed, fails."""
    prog = dropout_program()
    inp = inputs_for(prog)
    mutant = TP.TorchSAC(P.derive("torch:eager-sac", "torch:mutant-no-rng-state", preserve_rng_state=False))
    obs, base = mutant.run(prog, inp), P.get("torch:none").run(prog, inp)
    assert obs.ok() and obs.flags["preserve_rng_state"] is False
    v = G.compare(prog, obs, base, "tight")
    assert v.status == "fail", v.detail
    assert np.allclose(obs.outputs[0], base.outputs[0])   # the forward drew the same mask; the backward did not
    assert G.compare(prog, P.get("torch:eager-sac").run(prog, inp), base, "tight").status == "pass"


def test_the_lowering_sets_no_attribute_inside_a_traced_region_and_names_dtypes_by_a_python_function():
    """torch 2.6's export refuses a region that sets an attribute of an outside object ("Mutating a variable not in
    the current scope") and cannot trace dict.__getitem__: a 10-minute campaign on torch 2.6.0 reported the harness's
    own scan (it restored `record` even when it had not changed it) and cast as export-strict errors."""
    import inspect

    from conformance.ir.program import Program
    from conformance.pipelines.torch.lowering import NAMESPACE, Lowering, tensor
    scan_in_region = Program.model_validate({
        "body": [{"args": ["x0"], "kind": "checkpoint", "policy": {"kind": "nothing"}, "prevent_cse": True,
                  "results": ["s4"], "body": [{"args": ["x0"], "body": [], "carry": ["c1"], "carry_out": ["c1"],
                                               "kind": "scan", "length": 2, "results": ["s3", "s4"],
                                               "spelling": "scan", "unroll": 1, "xs": [], "ys": ["c1"]}]}],
        "diff": {"mode": "reverse", "order": 1}, "extensions": {}, "outputs": ["s4"], "schema_version": 1,
        "inputs": [{"diff": True, "dtype": "float32", "id": "x0", "shape": []}]})
    set_attrs = []

    class Spy(Lowering):
        def __setattr__(self, name, value):
            set_attrs.append(name)
            super().__setattr__(name, value)
    low = Spy(scan_in_region, remat=True)
    set_attrs.clear()
    (out,) = low.outputs({}, ["x0"], [tensor(0.5, "float32").requires_grad_(True)])
    assert out.shape == (2,) and "record" not in set_attrs
    assert inspect.isfunction(NAMESPACE["dt"]) and NAMESPACE["dt"]("float64") is torch.float64
