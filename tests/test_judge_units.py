"""Unit tests of the judge's wiring (which comparison each registry pairing runs, and with what), of
the custom-rule, dead-block, cross-framework residual and range checks, on hand-built observations
and small programs (no framework runs)."""
from __future__ import annotations

from conformance.ir.observation import CustomRuleLog, ErrorInfo, Observation, Residual
from conformance.ir.program import load_program
from oracles import cross_framework, gradients, residual_report
from oracles.expectations import Entry, Expectations
from oracles.judge import compare_custom_rules, dead_blocks, judge
from tests.programs import op, prog, region
from tests.test_oracle_units import find, verdict

V = {"jax": "0.12.0.1"}
G = {"x": [1.0, 1.0, 1.0]}
WRONG = {"x": [1.0, 1.5, 1.0]}
NONE = Expectations([])


def ob(name, grads=G, *, res=(), rules=None, error=None, values=None, flags=None, outputs=None):
    return Observation(pipeline=name, grads=grads, outputs=[[1.0]] if outputs is None else outputs,
                       residuals=None if res is None else list(res), custom_rules=rules or {}, error=error,
                       values=values, flags=flags or {}, versions=V)


def R(cls, names=(), shape=(3,)):
    return Residual(cls=list(cls), names=list(names), shape=list(shape), dtype="float64", bytes=24)


def pairs(j, pipeline):
    return sorted((v.check, v.reference) for v in j.verdicts if v.pipeline == pipeline)


def observations(*names, **special):
    """One observation per pipeline (the references' values G, no residuals for value references
    and baselines), then the special ones."""
    o = {n: ob(n, res=None if n in ("ref:f64", "jax:none", "torch:none") else ()) for n in names}
    o.update(special)
    return o


def cvjp(arg, out, tag):
    """custom_vjp of sin (ids prefixed by tag)."""
    return {"kind": "custom_vjp", "args": [arg], "fwd": [op("sin", [arg], out), op("cos", [arg], f"{tag}c")],
            "results": [out], "residuals": [f"{tag}c"], "cts": [f"{tag}g"],
            "bwd": [op("mul", [f"{tag}g", f"{tag}c"], f"{tag}d")], "bwd_results": [f"{tag}d"]}


RAND = prog([op("dropout", ["x"], "d", p=0.5, seed=0), op("sin", ["d"], "y")])
SMOOTH = prog([op("sin", ["x"], "y")])
RELU = prog([op("sin", ["x"], "a"), op("relu", ["a"], "b"), op("cos", ["b"], "c")])
# body[0] is dead (nothing reads s), body[1] is live
DEAD = prog([cvjp("x", "s", "p"), cvjp("x", "t", "q"), op("cos", ["t"], "y")])
JAX = ("ref:f64", "jax:none", "jax:remat2")
TORCH = JAX + ("torch:none", "torch:eager-sac")


def named_chain(policy, consumer="sin"):
    """sin(x) named 'a', read by `consumer`, in one region."""
    return prog([region(["x"], [op("sin", ["x"], "s"), op("name", ["s"], "n", name="a"),
                                op(consumer, ["n"], "y")], ["y"], policy)])


# -- random programs: values are compared within a framework only ----------------------------------
def test_a_random_program_skips_value_checks_across_frameworks_only():
    o = observations(*TORCH, "torch:compile-aot_eager", "jax:remat3",
                     **{"torch:eager-sac": ob("torch:eager-sac", WRONG), "jax:remat3": ob("jax:remat3", WRONG),
                        "torch:compile-aot_eager": ob("torch:compile-aot_eager", G)})
    j = judge(RAND, o, NONE)
    reason = "random draws differ between torch and jax: values are compared within a framework"
    for r in ("ref:f64", "jax:remat2"):
        assert find(j, "gradient", "torch:eager-sac", r).model_dump() == verdict(
            "gradient", "torch:eager-sac", r, "skipped", detail={"reason": reason})
        assert find(j, "gradient", "torch:compile-aot_eager", r).status == "skipped"
    # within a framework the draws are the same: judged
    assert find(j, "gradient", "torch:eager-sac", "torch:none").status == "fail"
    assert find(j, "gradient", "torch:compile-aot_eager", "torch:eager-sac").error_type == "cross_value"
    assert find(j, "gradient", "jax:remat3", "ref:f64").status == "fail"
    assert find(j, "gradient", "jax:remat3", "jax:none").status == "fail"
    # a program that draws nothing is compared across frameworks too
    j = judge(SMOOTH, o, NONE)
    assert find(j, "gradient", "torch:eager-sac", "ref:f64").status == "fail"
    assert find(j, "gradient", "torch:eager-sac", "jax:remat2").error_type == "cross_value"


# -- which comparison each registry pairing runs ----------------------------------------------------
def test_across_frameworks_a_named_value_a_derivative_rule_decides_is_not_compared():
    """Under `everything` PyTorch's sin saves the named value n, JAX's saves cos(n): across
    frameworks that is no difference; between compiled and eager PyTorch (one framework's rules) it is."""
    p = named_chain({"kind": "everything"})
    named = [R(["n", "s"], ["a"])]
    o = observations(*TORCH, "torch:compile-aot_eager", **{"torch:eager-sac": ob("torch:eager-sac", res=named),
                                                          "torch:compile-aot_eager": ob("torch:compile-aot_eager")})
    j = judge(p, o, NONE)
    assert find(j, "residuals", "torch:eager-sac", "jax:remat2").model_dump() == verdict(
        "residuals", "torch:eager-sac", "jax:remat2", "pass")
    assert find(j, "residuals", "torch:compile-aot_eager", "jax:remat2").status == "pass"
    v = find(j, "residuals", "torch:compile-aot_eager", "torch:eager-sac")
    assert (v.status, v.error_type) == ("fail", "missing")
    assert v.detail == {"missing_named": ["n/s"], "extra_named": [], "scope": "policy_named", "saved": [],
                        "reference_saved": ["n/s['a']:float64[3]"],
                        "causes": ["recomputes a value named in plain code [everything:save]"]}


def test_a_compiled_pipelines_rule_calls_must_be_among_eager_ones_in_the_judge():
    p = prog([cvjp("x", "s", "p"), op("cos", ["s"], "y")])
    eager = {"body[0]": CustomRuleLog(perturbed=[[True], [False]], fwd_traces=2, bwd_calls=1, ct_kinds=[["value"]])}
    fewer = {"body[0]": CustomRuleLog(perturbed=[[True]], fwd_traces=1)}
    o = observations(*TORCH, **{"torch:eager-sac": ob("torch:eager-sac", rules=eager),
                                "torch:compile-aot_eager": ob("torch:compile-aot_eager", rules=fewer)})
    j = judge(p, o, NONE)
    assert pairs(j, "torch:compile-aot_eager") == [
        ("custom_rule", "torch:eager-sac"), ("gradient", "jax:remat2"), ("gradient", "ref:f64"),
        ("gradient", "torch:eager-sac"), ("gradient", "torch:none"), ("residuals", "jax:remat2"),
        ("residuals", "policy"), ("residuals", "torch:eager-sac")]
    assert find(j, "custom_rule", "torch:compile-aot_eager", "torch:eager-sac").status == "pass"
    other = {"body[0]": CustomRuleLog(perturbed=[[False]], fwd_traces=1, bwd_calls=1, ct_kinds=[["none"]])}
    o["torch:compile-aot_eager"] = ob("torch:compile-aot_eager", rules=other)
    v = find(judge(p, o, NONE), "custom_rule", "torch:compile-aot_eager", "torch:eager-sac")
    assert (v.status, v.error_type) == ("fail", "ct_kinds")
    assert v.detail["blocks"] == {"body[0]": {"ct_kinds": {"got": [["none"]], "reference": [["value"]]}}}
    # the cause: the field, the rule, where it is (a custom_vjp outside every region whose result the loss reads)
    assert v.detail["causes"] == ["ct_kinds differs for a custom_vjp outside every region"]


def test_the_eager_comparison_leaves_out_a_dead_block_the_compiled_pipeline_never_ran():
    eager = {"body[0]": CustomRuleLog(fwd_traces=1, bwd_calls=1, ct_kinds=[["value"]])}
    never = {"body[0]": CustomRuleLog(primal_traces=1, bwd_calls=1, ct_kinds=[["none"]])}
    o = observations(*TORCH, **{"torch:eager-sac": ob("torch:eager-sac", rules=eager),
                                "torch:compile-aot_eager": ob("torch:compile-aot_eager", rules=never)})
    assert find(judge(DEAD, o, NONE), "custom_rule", "torch:compile-aot_eager", "torch:eager-sac").status == "pass"
    # a live block is judged
    live = prog([cvjp("x", "s", "p"), op("cos", ["s"], "y")])
    assert find(judge(live, o, NONE), "custom_rule", "torch:compile-aot_eager", "torch:eager-sac").status == "fail"


def test_dead_blocks_are_the_custom_vjp_blocks_nothing_live_reads():
    assert dead_blocks(DEAD) == frozenset({"body[0]"})
    assert dead_blocks(prog([cvjp("x", "s", "p"), op("cos", ["s"], "y")])) == frozenset()
    assert dead_blocks(SMOOTH) == frozenset()


def test_a_jax_rival_that_ran_only_the_primal_of_a_dead_block_is_not_blamed():
    ran, primal = CustomRuleLog(fwd_traces=1), CustomRuleLog(primal_traces=1)
    o = observations(*JAX, **{"jax:remat2": ob("jax:remat2", rules={"body[0]": ran, "body[1]": ran}),
                              "jax:remat3": ob("jax:remat3", rules={"body[0]": primal, "body[1]": ran})})
    assert find(judge(DEAD, o, NONE), "custom_rule", "jax:remat3", "jax:remat2").status == "pass"
    o["jax:remat3"] = ob("jax:remat3", rules={"body[0]": ran, "body[1]": primal})
    v = find(judge(DEAD, o, NONE), "custom_rule", "jax:remat3", "jax:remat2")
    assert v.detail["blocks"] == {"body[1]": {"fwd_ran": {"got": 0, "reference": 1}}}
    assert len(v.detail["causes"]) == 1 and v.detail["causes"][0].startswith("fwd_ran differs for a custom_vjp")


def test_the_same_comparison_tells_a_saved_program_input_apart():
    p = prog([region(["x"], [op("sin", ["x"], "s"), op("cos", ["s"], "y")], ["y"], {"kind": "nothing"})])
    o = observations(*JAX, **{"jax:remat2": ob("jax:remat2", res=[R([])]),
                              "jax:remat3": ob("jax:remat3", res=[R(["x"])])})
    v = find(judge(p, o, NONE), "residuals", "jax:remat3", "jax:remat2")
    assert (v.status, v.error_type) == ("fail", "other")
    assert v.detail["missing_other"] == ["float64[3]"]
    assert v.detail["extra_other"] == ["float64[3] (a program input)"]


def test_a_values_only_comparison_checks_values_with_the_node_values_and_why_they_are_missing():
    o = observations(*TORCH, **{"torch:eager-reentrant": ob("torch:eager-reentrant", WRONG)})
    j = judge(SMOOTH, o, NONE)
    assert pairs(j, "torch:eager-reentrant") == [("gradient", "ref:f64"), ("gradient", "torch:eager-sac"),
                                                 ("gradient", "torch:none"), ("residuals", "policy")]
    v = find(j, "gradient", "torch:eager-reentrant", "torch:eager-sac")
    assert (v.status, v.error_type, v.detail["mode"], v.detail["value"]) == ("fail", "cross_value", "tight", "grad[x]")
    # at a kink of the value reference's node values: skipped
    o["ref:f64"] = ob("ref:f64", res=None, values={"a": [0.0, 1.0, 1.0]})
    v = find(judge(RELU, o, NONE), "gradient", "torch:eager-reentrant", "torch:eager-sac")
    assert v.model_dump() == verdict("gradient", "torch:eager-reentrant", "torch:eager-sac", "skipped", detail={
        "reason": "a nonsmooth op's input is at its kink (values may take either side)", "values": ["a"]})
    # the value reference failed: no node values, and the reason says why
    o["ref:f64"] = ob("ref:f64", res=None, error=ErrorInfo(type="RuntimeError", message="m", stage="second_order"))
    v = find(judge(RELU, o, NONE), "gradient", "torch:eager-reentrant", "torch:eager-sac")
    assert v.status == "skipped" and v.detail == {
        "reason": "ref:f64 raised RuntimeError (second_order): no node values to rule out a nonsmooth op at its kink"}


def test_a_lower_memory_budget_is_compared_with_the_next_higher_budgets_saved_bytes():
    def run(name, nbytes, budget=None):
        flags = {"partitioner_saved": [[["s", "float32", nbytes]]]}
        if budget is not None:
            flags["activation_memory_budget"] = budget
        return ob(name, flags=flags)
    low, high = "torch:compile-aot_eager:budget-0.5", "torch:compile-aot_eager"
    o = observations(*TORCH, **{low: run(low, 48, 0.5), high: run(high, 24)})
    j = judge(SMOOTH, o, NONE)
    assert find(j, "residuals", low, high).model_dump() == verdict(
        "residuals", low, high, "fail", error_type="saved_bytes_grew",
        detail={"saved_bytes": [48], "reference_saved_bytes": [24], "budget": 0.5, "reference_budget": 1.0})
    o[low] = run(low, 24, 0.5)
    assert find(judge(SMOOTH, o, NONE), "residuals", low, high).status == "pass"


def test_only_a_pipeline_that_records_jaxs_residual_report_gets_that_check():
    o = observations(*JAX, "jax:remat3", "jax:remat3:jit")
    j = judge(SMOOTH, o, NONE)
    assert find(j, "residual_report", "jax:remat3:jit", residual_report.REFERENCE).model_dump() == verdict(
        "residual_report", "jax:remat3:jit", residual_report.REFERENCE, "skipped",
        detail={"reason": "jax:remat3:jit records no residual report"})
    assert not any(v.check == "residual_report" and v.pipeline != "jax:remat3:jit" for v in j.verdicts)


def test_an_entry_keyed_by_framework_flags_matches_the_runs_flags():
    entry = Entry.model_validate({"id": "e0", "pipelines": ["jax:remat3"], "flags": {"jax_remat3": True},
                                  "diverges": {"check": "gradient", "reason": "r"}})
    o = observations(*JAX, **{"jax:remat3": ob("jax:remat3", WRONG, flags={"jax_remat3": True})})
    j = judge(SMOOTH, o, Expectations([entry]))
    assert j.failures() == [] and j.expectation_hits == {"e0": "fired"}
    o["jax:remat3"] = ob("jax:remat3", WRONG, flags={"jax_remat3": False})
    j = judge(SMOOTH, o, Expectations([entry]))
    assert [v.key() for v in j.failures()] == [("gradient", "jax:remat3", "jax:none", ""),
                                               ("gradient", "jax:remat3", "ref:f64", "")]


# -- compare_custom_rules: every block is judged ----------------------------------------------------
def test_a_skipped_jvp_block_does_not_end_the_comparison_of_later_blocks():
    a = ob("p", rules={"body[0]": CustomRuleLog(primal_traces=1), "body[1]": CustomRuleLog(perturbed=[[True]],
                                                                                            fwd_traces=1)})
    b = ob("q", rules={"body[0]": CustomRuleLog(fwd_traces=1), "body[1]": CustomRuleLog(perturbed=[[False]],
                                                                                        fwd_traces=1)})
    v = compare_custom_rules(a, b, frozenset({"body[0]"}))
    assert v.detail == {"blocks": {"body[1]": {"perturbed": {"got": [[True]], "reference": [[False]]}}}}
    v = compare_custom_rules(a, b, frozenset({"body[0]"}), observed_only=True)
    assert v.detail == {"blocks": {"body[1]": {"perturbed": {"got": [[True]], "reference": [[False]]}}}}


def test_observed_only_compares_perturbed_flags_where_both_ran_the_fwd_rule():
    eager = ob("e", rules={"body[0]": CustomRuleLog(perturbed=[[False]], fwd_traces=1)})
    both = ob("c", rules={"body[0]": CustomRuleLog(perturbed=[[True]], fwd_traces=1)})
    v = compare_custom_rules(both, eager, observed_only=True)
    assert (v.status, v.error_type) == ("fail", "perturbed")
    # the reference never ran its fwd rule (no flags of its own): nothing to be among
    assert compare_custom_rules(both, ob("e", rules={"body[0]": CustomRuleLog(primal_traces=1)}),
                                observed_only=True).status == "pass"
    # each block is judged, not only the first
    same = CustomRuleLog(perturbed=[[False]], fwd_traces=1)
    v = compare_custom_rules(ob("c", rules={"body[0]": same, "body[1]": both.custom_rules["body[0]"]}),
                             ob("e", rules={"body[0]": same, "body[1]": same}), observed_only=True)
    assert v.detail == {"blocks": {"body[1]": {"perturbed": {"got": [[True]], "reference": [[False]]}}}}


# -- cross_framework: policy_named and what compiled PyTorch keeps unnamed ---------------------------
def test_policy_named_decides_by_the_first_inputs_elements_and_the_dots_batch_dims():
    assert cross_framework.policy_named(named_chain({"kind": "min_elements", "elements": 3})) == {"n"}
    assert cross_framework.policy_named(named_chain({"kind": "min_elements", "elements": 4})) == set()
    dots = prog([region(["x", "w"], [op("matmul", ["x", "w"], "m"), op("sin", ["m"], "y")], ["y"],
                        {"kind": "dots_no_batch"})],
                inputs=[{"id": "x", "shape": [2, 3], "dtype": "float64", "diff": True},
                        {"id": "w", "shape": [3, 2], "dtype": "float64", "diff": True}])
    assert cross_framework.policy_named(dots, names_only=False) == {"m"}
    assert cross_framework.policy_named(dots) == set()


def test_policy_named_leaves_out_shape_policies_of_per_example_programs():
    def per_example(policy):
        p = named_chain(policy).to_json_obj()
        p["inputs"][0]["batched"] = True
        p["diff"]["batch"] = 2
        return load_program(p)
    assert cross_framework.policy_named(per_example({"kind": "min_elements", "elements": 3})) == set()
    assert cross_framework.policy_named(per_example({"kind": "save_only_names", "names": ["a"]})) == {"n"}


def test_policy_named_looks_inside_jitted_functions_and_cond_branches():
    inner = {"kind": "jit", "args": ["x"], "results": ["c", "a"],
             "body": [op("sin", ["x"], "s"), op("name", ["s"], "a", name="a"), op("cos", ["a"], "c")]}
    outer = {"kind": "jit", "args": ["m"], "results": ["t"], "body": [region(
        ["m"], [op("exp", ["m"], "e"), op("name", ["e"], "b", name="b"), op("tanh", ["b"], "t")], ["t"],
        {"kind": "save_only_names", "names": ["b"]})]}
    jitted = prog([region(["x"], [inner, op("mul", ["c", "a"], "m")], ["m"],
                          {"kind": "save_only_names", "names": ["a"]}), outer], outputs=["t"])
    assert cross_framework.policy_named(jitted) == {"a", "b"}
    cond = {"kind": "cond", "args": ["p", "x"], "branch_results": [["y"], ["w"]], "results": ["r"],
            "branches": [[op("sin", ["x"], "s"), op("name", ["s"], "n", name="a"), op("cos", ["n"], "y")],
                         [op("neg", ["x"], "w")]]}
    branched = prog([region(["x", "p"], [cond], ["r"], {"kind": "save_only_names", "names": ["a"]})],
                    inputs=[{"id": "x", "shape": [3], "dtype": "float64", "diff": True},
                            {"id": "p", "shape": [], "dtype": "float64", "diff": False}], outputs=["r"])
    assert cross_framework.policy_named(branched) == {"n"}


# cos(s) twice (one value class c/c2), saved by the policy and read by a product: no derivative
# rule decides whether it is kept
TWO_COS = prog([region(["x"], [op("sin", ["x"], "s"), op("cos", ["s"], "c"), op("cos", ["s"], "c2"),
                               op("mul", ["c", "c2"], "m"), op("tanh", ["m"], "y")], ["y"],
                       {"kind": "ops", "ops": ["cos"]})])


def test_compiled_pytorch_keeping_an_unnamed_policy_saved_class_eager_lacks_is_reported():
    v = cross_framework.compare_residuals(ob("torch:compile-aot_eager", res=[R(["c", "c2"])]),
                                          ob("torch:eager-sac", res=[R(["x"])]), TWO_COS, across=False)
    assert v.model_dump() == verdict("residuals", "torch:compile-aot_eager", "torch:eager-sac", "fail",
                                     error_type="extra", detail={
                                         "extra_saved": ["c/c2"], "missing_saved": [],
                                         "scope": "policy_saved_unnamed", "saved": ["c/c2:float64[3]"],
                                         "reference_saved": ["x:float64[3]"],
                                         "causes": ["saves an op's output [custom:save]"]})
    # across frameworks unnamed values are never compared
    assert cross_framework.compare_residuals(ob("torch:eager-sac", res=[R(["c", "c2"])]), ob("jax:remat2", res=[]),
                                             TWO_COS).model_dump() == verdict(
        "residuals", "torch:eager-sac", "jax:remat2", "pass")


# -- gradients: the 16-bit dtypes' range and kink band ------------------------------------------------
F16 = [{"id": "x", "shape": [1], "dtype": "float16", "diff": True}]
SIN16 = prog([op("sin", ["x"], "y")], inputs=F16)


def test_16_bit_values_beyond_a_sixteenth_of_the_range_skip_the_value_check():
    def cmp(got, want, **kw):
        return gradients.compare(SIN16, ob("p", {"x": got}, **kw), ob("q", {"x": want}), "tight")
    assert cmp([5000.0], [1.0]).model_dump() == verdict(
        "gradient", "p", "q", "skipped", detail={"reason": "values near the end of float16's range",
                                                 "values": ["grad[x]"]})
    assert cmp([1.0], [float("inf")], outputs=[[5000.0]]).detail["values"] == ["grad[x]", "output[0]"]
    # up to 65504 / 16 = 4094 they are judged
    assert cmp([4094.0], [4094.0]).status == "pass"
    assert cmp([4094.0], [3000.0]).status == "fail"
    assert cmp([1.0], [1.0]).status == "pass"
    # float32's range is no concern at these magnitudes
    s32 = prog([op("sin", ["x"], "y")], inputs=[{**F16[0], "dtype": "float32"}])
    assert gradients.compare(s32, ob("p", {"x": [5000.0]}), ob("q", {"x": [1.0]}), "tight").status == "fail"


def test_the_16_bit_kink_band_is_a_few_epsilons_per_statement():
    relu16 = prog([op("relu", ["x"], "y")], inputs=F16)
    band = 8 * 2.0 ** -10 * 2    # float16: 8 eps per statement, (1 + 1 statement)
    assert gradients.near_kink(relu16, {"x": [0.99 * band]}) == ["x"]
    assert gradients.near_kink(relu16, {"x": [1.01 * band]}) == []
    assert gradients.near_kink(relu16, {"x": [0.5]}) == []
