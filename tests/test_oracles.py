"""Oracles are pure functions: each verdict on hand-made observations."""
import json

import pytest

from conformance.ir.observation import CustomRuleLog, ErrorInfo, Observation, Residual
from oracles import gradients, residuals
from oracles.expectations import Entry, Expectations, ExpectationsError
from oracles.judge import compare_custom_rules, judge
from tests.programs import named_chain, seed_program

V = {"jax": "0.12.0.1"}


def obs(name, grads=None, res=None, error=None, rules=None, outputs=None):
    return Observation(pipeline=name, grads=grads, residuals=res, outputs=outputs or [[1.0]], versions=V,
                       error=error, custom_rules=rules or {})


def R(cls, names=(), shape=(3,), dtype="float64"):
    return Residual(cls=list(cls), names=list(names), shape=list(shape), dtype=dtype, bytes=8 * 3)


def test_gradient_oracle_tight_and_loose():
    p = named_chain()
    ref = obs("ref:f64", {"x": [1.0, 2.0]})
    assert gradients.compare(p, obs("jax:remat3", {"x": [1.0, 2.0]}), ref, "tight").status == "pass"
    v = gradients.compare(p, obs("jax:remat3", {"x": [1.0, 2.0 + 1e-6]}), ref, "tight")
    assert v.status == "fail" and v.detail["value"] == "grad[x]" and v.detail["want"] == 2.0
    assert gradients.compare(p, obs("jax:remat3", {"x": [1.0, 2.0 + 1e-12]}), ref, "tight").status == "pass"
    nan = gradients.compare(p, obs("jax:remat3", {"x": [1.0, float("nan")]}), ref, "loose")
    assert nan.status == "fail" and "non-finite" in nan.detail["reason"]


def test_gradient_oracle_skips_programs_at_a_nonsmooth_kink(monkeypatch):
    """An op declared nonsmooth whose input sits at its kink makes the value checks skip
    (float32 and float64 may take either side); away from the kink they judge as usual."""
    import dataclasses

    from conformance.ir import ops
    from tests.programs import op, prog
    monkeypatch.setitem(ops.OPS, "sin", dataclasses.replace(ops.OPS["sin"], nonsmooth=True))
    p = prog([op("sin", ["x"], "y")])
    ref, bad = obs("ref:f64", {"x": [1.0, 2.0]}), obs("jax:remat3", {"x": [1.0, 2.5]})
    at_kink = {"x": [0.5, 1e-14, 1.0], "y": [0.0, 0.0, 0.0]}   # float64: the band is ~4e-13
    away = {"x": [0.5, 0.2, 1.0], "y": [0.0, 0.0, 0.0]}
    v = gradients.compare(p, bad, ref, "loose", at_kink)
    assert v.status == "skipped" and v.detail["values"] == ["x"]
    assert gradients.compare(p, bad, ref, "loose", away).status == "fail"
    monkeypatch.setitem(ops.OPS, "sin", dataclasses.replace(ops.OPS["sin"], nonsmooth=False))
    assert gradients.compare(p, bad, ref, "loose", at_kink).status == "fail"


def test_residual_oracle_names_missing_and_extra():
    a = obs("jax:remat3", res=[R(["s", "na"], ["a"]), R(["x"])])
    b = obs("jax:remat2", res=[R(["s", "na"], ["a"]), R(["c", "nb"], ["b"]), R(["x"])])
    v = residuals.compare(a, b)
    assert v.status == "fail" and v.error_type == "missing"
    assert v.detail["missing_named"] == ["c/nb"] and v.detail["extra_named"] == []
    assert residuals.compare(b, a).error_type == "extra"
    assert residuals.compare(b, b).status == "pass"
    other = residuals.compare(obs("p", res=[R([], shape=(2,))]), obs("q", res=[R([], shape=(3,))]))
    assert other.status == "fail" and other.error_type == "other"


def test_policy_oracle():
    p = named_chain()   # region saves only 'a'
    ok = obs("jax:remat2", res=[R(["na", "s"], ["a"]), R(["w"]), R(["x"])])
    assert residuals.check_policy(p, ok).status == "pass"
    bad = obs("jax:remat2", res=[R(["na", "s"], ["a"]), R(["c", "nb"], ["b"])])
    v = residuals.check_policy(p, bad)
    assert v.status == "fail" and v.reference == "policy" and "c/nb['b']" in v.detail["saved_against_policy"][0]
    # the matmul output is not named and the policy does not save dots
    assert residuals.check_policy(p, obs("jax:remat2", res=[R(["m"])])).status == "fail"


def test_custom_rule_oracle():
    a = obs("jax:remat3", rules={"body[0]": CustomRuleLog(perturbed=[[True]], fwd_traces=1)})
    b = obs("jax:remat2", rules={"body[0]": CustomRuleLog(perturbed=[[False]], fwd_traces=1)})
    v = compare_custom_rules(a, b)
    assert v.status == "fail" and v.error_type == "perturbed"
    c = obs("jax:remat2", rules={"body[0]": CustomRuleLog(fwd_traces=0)})
    assert compare_custom_rules(a, c).error_type == "fwd_ran"
    assert compare_custom_rules(a, a).status == "pass"


def _exp(**kw):
    return Expectations([Entry.model_validate({"id": "e", "pipelines": ["jax:remat3*"], **kw})])


def test_raises_expectation_is_enforced_and_reported_stale_when_it_never_fires():
    p = seed_program()
    exp = _exp(features=["sz_fwd_remat"], raises={"type": ".*", "regex": "symbolic"})
    ref = obs("ref:f64", {"x": [1.0, 1.0, 1.0]})
    silent = judge(p, {"ref:f64": ref, "jax:remat3": obs("jax:remat3", {"x": [1.0, 1.0, 1.0]})}, exp)
    f = silent.failures()
    assert [(v.check, v.pipeline, v.reference, v.error_type) for v in f] == [
        ("error", "jax:remat3", "expectations", "none")
    ]
    assert silent.expectation_hits == {"e": "idle"}
    err = ErrorInfo(type="ValueError", message="no symbolic zeros under remat3", stage="forward")
    raised = judge(p, {"ref:f64": ref, "jax:remat3": obs("jax:remat3", error=err)}, exp)
    assert not raised.failures() and raised.expectation_hits == {"e": "fired"}
    wrong = judge(
        p, {"ref:f64": ref, "jax:remat3": obs("jax:remat3", error=err.model_copy(update={"message": "x"}))}, exp
    )
    assert wrong.failures()[0].error_type == "ValueError"


def test_unexpected_error_is_a_finding_and_diverges_entries_excuse_it():
    p = named_chain()
    ref = obs("ref:f64", {"x": [1.0]})
    err = ErrorInfo(type="RuntimeError", message="boom", stage="backward")
    j = judge(p, {"ref:f64": ref, "jax:remat3": obs("jax:remat3", error=err)}, Expectations([]))
    assert [v.key() for v in j.failures()] == [("error", "jax:remat3", "expectations", "RuntimeError")]
    exp = _exp(diverges={"check": "error", "reason": "known"})
    assert not judge(p, {"ref:f64": ref, "jax:remat3": obs("jax:remat3", error=err)}, exp).failures()


def test_expectation_keys_versions_devices_dtypes_features():
    e = Entry.model_validate({"id": "e", "pipelines": ["jax:remat3"], "versions": {"jax": ">=0.12,<0.13"},
                              "devices": ["cuda"], "dtypes": ["float32"], "features": ["custom_vjp"],
                              "unsupported": {"reason": "r"}})
    args = dict(pipeline="jax:remat3", versions={"jax": "0.12.0.1"}, device="cuda", dtypes={"float32"},
                features={"custom_vjp"})
    assert e.matches(**args)
    assert not e.matches(**{**args, "versions": {"jax": "0.11.2"}})
    assert not e.matches(**{**args, "device": "cpu"})
    assert not e.matches(**{**args, "dtypes": {"float64"}})
    assert not e.matches(**{**args, "features": set()})
    assert not e.matches(**{**args, "pipeline": "jax:remat3:jit"})


@pytest.mark.parametrize("obj, field", [
    ({"entries": [{"id": "a", "pipelines": ["*"]}]}, "entries[0]"),
    ({"entries": [{"id": "a", "pipelines": ["*"], "unsupported": {"reason": "r"}, "versions": {"jax": "~~1"}}]},
     "entries[0]"),
    ({"entries": "nope"}, "entries"),
    # an error regex matches an error: on a gradient divergence it is refused, not a judge crash
    ({"entries": [{"id": "a", "pipelines": ["*"], "diverges": {"check": "gradient", "error_regex": "x",
                                                                "reason": "r"}}]}, "entries[0]"),
    ({"entries": [{"id": "a", "pipelines": ["*"], "diverges": {"check": "error", "error_regex": "(",
                                                                "reason": "r"}}]}, "entries[0]"),
])
def test_bad_expectations_name_the_entry(obj, field, tmp_path):
    f = tmp_path / "e.json"
    f.write_text(json.dumps(obj))
    with pytest.raises(ExpectationsError) as e:
        Expectations.load(f)
    assert e.value.file == str(f) and e.value.field.startswith(field)


def test_packaged_expectations_load_and_are_verified():
    exp = Expectations.load()
    assert {e.id for e in exp.entries} >= {"remat3-symbolic-zeros-fwd-remat"}
    for e in exp.entries:
        assert e.verified_by, f"{e.id} says nothing about how it was verified"


# -- checks do not mask each other -------------------------------------------------------
G = {"x": [1.0, 1.0, 1.0]}
WRONG = {"x": [1.0, 1.5, 1.0]}


def _keys(j, status="fail"):
    return sorted(v.key() for v in j.verdicts if v.status == status)


def _exp_entries(*entries):
    return Expectations([Entry.model_validate({"id": f"e{k}", **e}) for k, e in enumerate(entries)])


SZ_RAISES = {"pipelines": ["jax:remat3*"], "features": ["sz_fwd_remat"], "raises": {"type": ".*", "regex": "symbolic"}}


def test_a_pipeline_that_failed_to_raise_is_still_judged_on_its_values_and_custom_rules():
    p = seed_program()
    rules = lambda flag: {"body[1].body[0]": CustomRuleLog(perturbed=[[flag]], fwd_traces=1)}
    o = {"ref:f64": obs("ref:f64", G), "jax:none": obs("jax:none", G),
         "jax:remat2": obs("jax:remat2", G, res=[], rules=rules(False)),
         "jax:remat3": obs("jax:remat3", WRONG, res=[], rules=rules(True))}
    j = judge(p, o, _exp_entries(SZ_RAISES))
    assert _keys(j) == [("custom_rule", "jax:remat3", "jax:remat2", "perturbed"),
                        ("error", "jax:remat3", "expectations", "none"),
                        ("gradient", "jax:remat3", "jax:none", ""), ("gradient", "jax:remat3", "ref:f64", "")]


def test_a_pipeline_that_raised_as_expected_masks_no_other_pipeline():
    """ref:f64 and jax:remat3 raise as their entries say; jax:remat3:jit and jax:remat2
    did not, and their values are still checked against the baseline."""
    p = named_chain()
    err = ErrorInfo(type="ValueError", message="documented limitation", stage="forward")
    exp = _exp_entries(
        {"pipelines": ["ref:f64", "jax:remat3"], "raises": {"type": "ValueError", "regex": "documented"}}
    )
    o = {"ref:f64": obs("ref:f64", error=err), "jax:none": obs("jax:none", G), "jax:remat2": obs("jax:remat2", G),
         "jax:remat3": obs("jax:remat3", error=err), "jax:remat3:jit": obs("jax:remat3:jit", WRONG)}
    j = judge(p, o, exp)
    assert ("gradient", "jax:remat3:jit", "jax:none", "") in _keys(j)
    assert ("gradient", "jax:remat2", "jax:none", "") in _keys(j, "pass")
    assert ("error", "jax:remat3", "expectations", "ValueError") in _keys(j, "expected")
    # jax:remat3's own status differs from jax:remat2 and jax:none, declared by its entry
    assert {("error", "jax:remat3", r, "ValueError") for r in ("jax:remat2", "jax:none")} <= set(_keys(j, "expected"))


def test_when_the_value_reference_fails_the_baseline_still_checks_values():
    p = named_chain()
    err = ErrorInfo(type="RuntimeError", message="f64 only", stage="forward")
    o = {"ref:f64": obs("ref:f64", error=err), "jax:none": obs("jax:none", G), "jax:remat3": obs("jax:remat3", WRONG)}
    j = judge(p, o, Expectations([]))
    assert _keys(j) == [
        ("error", "ref:f64", "expectations", "RuntimeError"),
        ("gradient", "jax:remat3", "jax:none", ""),
    ]
    loose = next(v for v in j.verdicts if v.check == "gradient" and v.reference == "ref:f64")
    assert loose.status == "skipped" and loose.detail["reason"] == "ref:f64 raised RuntimeError (forward)"


def test_without_reference_values_a_nonsmooth_program_skips_the_value_checks():
    from tests.programs import op, prog
    p = prog([op("relu", ["x"], "y")])
    err = ErrorInfo(type="RuntimeError", message="f64 only", stage="forward")
    o = {"ref:f64": obs("ref:f64", error=err), "jax:none": obs("jax:none", G), "jax:remat3": obs("jax:remat3", WRONG)}
    tight = next(
        v for v in judge(p, o, Expectations([])).verdicts if v.key()[:3] == ("gradient", "jax:remat3", "jax:none")
    )
    assert tight.status == "skipped" and "kink" in tight.detail["reason"] and "ref:f64 raised" in tight.detail["reason"]


def test_first_order_values_are_compared_when_a_run_failed_at_second_order():
    p = named_chain()
    err = ErrorInfo(type="ValueError", message="no second order", stage="second_order")
    o = {"ref:f64": obs("ref:f64", G, error=err), "jax:none": obs("jax:none", G),
         "jax:remat3": Observation(pipeline="jax:remat3", grads=WRONG, grads2=G, outputs=[[1.0]], versions=V)}
    j = judge(p, o, Expectations([]))
    assert ("gradient", "jax:remat3", "ref:f64", "") in _keys(j)


def test_a_pipeline_that_raised_has_its_checks_skipped_with_a_reason_not_failed():
    p = named_chain()
    err = ErrorInfo(type="RuntimeError", message="boom", stage="backward")
    o = {"ref:f64": obs("ref:f64", G), "jax:none": obs("jax:none", G), "jax:remat2": obs("jax:remat2", G, res=[]),
         "jax:remat3": obs("jax:remat3", error=err)}
    j = judge(p, o, Expectations([]))
    assert _keys(j) == [("error", "jax:remat3", "expectations", "RuntimeError")]
    mine = [v for v in j.verdicts if v.pipeline == "jax:remat3" and v.check != "error"]
    assert {(v.check, v.reference) for v in mine} == {("gradient", "jax:none"), ("gradient", "ref:f64"),
                                                      ("residuals", "policy"), ("residuals", "jax:remat2"),
                                                      ("custom_rule", "jax:remat2"), ("trace_count", "jax:remat2")}
    assert all(v.status == "skipped" and v.detail["reason"] == "jax:remat3 raised RuntimeError (backward)"
               for v in mine)
    # one root behaviour, one failing verdict: the status differences are listed in it
    own = next(v for v in j.verdicts if v.key() == ("error", "jax:remat3", "expectations", "RuntimeError"))
    assert own.detail["status_differs_from"] == ["jax:remat2", "jax:none"]


def test_status_equivalence_a_rival_that_raises_where_its_reference_succeeded():
    """jax:remat3 raises what ref:f64 raised (so its own error verdict defers to ref:f64's)
    but jax:remat2 and jax:none do not: one failing status verdict, vs jax:remat2."""
    p = named_chain()
    err = ErrorInfo(type="ValueError", message="bad", stage="forward")
    o = {"ref:f64": obs("ref:f64", error=err), "jax:none": obs("jax:none", G), "jax:remat2": obs("jax:remat2", G),
         "jax:remat3": obs("jax:remat3", error=err)}
    j = judge(p, o, Expectations([]))
    assert _keys(j) == [
        ("error", "jax:remat3", "jax:remat2", "ValueError"),
        ("error", "ref:f64", "expectations", "ValueError"),
    ]
    se = next(v for v in j.failures() if v.reference == "jax:remat2")
    assert se.detail["also_differs_from"] == ["jax:none"] and se.detail["reference_error"] is None
    declared = _exp_entries({"pipelines": ["jax:remat3"], "diverges": {"check": "error", "reason": "known"}})
    assert _keys(judge(p, o, declared)) == [("error", "ref:f64", "expectations", "ValueError")]


def test_status_equivalence_a_rival_that_succeeds_where_its_reference_raised():
    """jax:remat2 raises as its own entry says; that entry does not excuse jax:remat3's silence."""
    p = named_chain()
    err = ErrorInfo(type="ValueError", message="documented", stage="forward")
    only_remat2 = {"pipelines": ["jax:remat2"], "raises": {"type": "ValueError", "regex": "documented"}}
    o = {"ref:f64": obs("ref:f64", G), "jax:none": obs("jax:none", G), "jax:remat2": obs("jax:remat2", error=err),
         "jax:remat3": obs("jax:remat3", G, res=[])}
    j = judge(p, o, _exp_entries(only_remat2))
    assert _keys(j) == [("error", "jax:remat3", "jax:remat2", "none")]
    assert ("error", "jax:remat2", "jax:none", "ValueError") in _keys(j, "expected")
    skipped = next(v for v in j.verdicts if v.key()[:3] == ("residuals", "jax:remat3", "jax:remat2"))
    assert skipped.status == "skipped" and skipped.detail["reason"] == "jax:remat2 raised ValueError (forward)"
    # declared for the rival: an entry of its own (diverges, check error) excuses it
    mine = {"pipelines": ["jax:remat3"], "diverges": {"check": "error", "error_regex": "ValueError: documented",
                                                      "reason": "remat3 lifts the limitation"}}
    j = judge(p, o, _exp_entries(only_remat2, mine))
    assert not j.failures() and ("error", "jax:remat3", "jax:remat2", "none") in _keys(j, "expected")
    assert j.expectation_hits["e1"] == "fired"
    # the reference's error unexpected: its own verdict is the finding, the rival's silence passes
    j = judge(p, o, Expectations([]))
    assert _keys(j) == [("error", "jax:remat2", "expectations", "ValueError")]
    assert ("error", "jax:remat3", "jax:remat2", "none") in _keys(j, "pass")


def test_a_rival_that_failed_to_raise_fails_once_on_error_status():
    """Expected to raise like its reference and silent: one error finding (vs expectations)."""
    p = seed_program()
    err = ErrorInfo(type="ValueError", message="symbolic zeros", stage="forward")
    exp = _exp_entries({**SZ_RAISES, "pipelines": ["jax:remat*"]})
    o = {"ref:f64": obs("ref:f64", G), "jax:none": obs("jax:none", G), "jax:remat2": obs("jax:remat2", error=err),
         "jax:remat3": obs("jax:remat3", G)}
    j = judge(p, o, exp)
    assert [v.key() for v in j.failures()] == [("error", "jax:remat3", "expectations", "none")]
    assert j.failures()[0].detail["status_differs_from"] == ["jax:remat2"]


def test_judge_wires_torch_pipelines_to_their_baseline_eager_and_cross_references():
    """A compiled :prefer pipeline is judged against torch:none (tight), ref:f64 (loose), the
    policy, eager SAC with the same hints (torch:eager-sac:prefer, not torch:eager-sac) and
    jax:remat2 across frameworks; each pair fails exactly when its two sides differ."""
    p = named_chain()
    g = {"x": [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], "w": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]}
    off = {"x": [[1.5, 2.0, 3.0], [4.0, 5.0, 6.0]], "w": g["w"]}
    res = [R(["s", "na"], ["a"], shape=(2, 2))]
    names = ["ref:f64", "jax:none", "jax:remat2", "torch:none", "torch:eager-sac", "torch:eager-sac:prefer",
             "torch:compile-inductor:prefer"]

    def judged(compiled_grads, eager_prefer_grads):
        o = {n: obs(n, grads=g, res=res if n not in ("ref:f64", "jax:none", "torch:none") else None)
             for n in names}
        o["torch:compile-inductor:prefer"] = obs("torch:compile-inductor:prefer", grads=compiled_grads, res=res)
        o["torch:eager-sac:prefer"] = obs("torch:eager-sac:prefer", grads=eager_prefer_grads, res=res)
        j = judge(p, o, Expectations([]))
        return {(v.check, v.reference): v.status for v in j.verdicts if v.pipeline == "torch:compile-inductor:prefer"}

    same = judged(g, g)
    assert {k for k in same} >= {("gradient", "torch:none"), ("gradient", "ref:f64"), ("residuals", "policy"),
                                 ("gradient", "torch:eager-sac:prefer"), ("residuals", "torch:eager-sac:prefer"),
                                 ("gradient", "jax:remat2"), ("residuals", "jax:remat2")}, same
    assert not [k for k in same if k[1] == "torch:eager-sac"]
    assert set(same.values()) == {"pass"}, same
    # wrong against everything but eager SAC with the same hints (which is wrong the same way)
    v = judged(off, off)
    assert v[("gradient", "torch:eager-sac:prefer")] == "pass"
    assert v[("gradient", "torch:none")] == v[("gradient", "ref:f64")] == v[("gradient", "jax:remat2")] == "fail"
    # right, but its eager counterpart is not: only the eager comparison fails
    v = judged(g, off)
    assert [k for k, s in v.items() if s == "fail"] == [("gradient", "torch:eager-sac:prefer")], v


def test_every_comparison_mode_is_dispatched_and_explained_and_a_misspelt_one_is_refused():
    from conformance.engine.describe import WHY_COMPARED
    from conformance.pipelines.registry import SPECS, Compare, CompareMode
    from oracles.judge import COMPARISONS
    assert set(COMPARISONS) == set(CompareMode) == set(WHY_COMPARED)
    assert {c.mode for s in SPECS.values() for c in s.compare} == set(CompareMode)   # each mode is used
    with pytest.raises(ValueError, match="'crosss' is not a valid CompareMode"):
        Compare(("jax:remat2",), "crosss")


def test_every_check_is_declared_once_with_its_words_and_evidence():
    from conformance.engine.describe import expected_actual, title
    from conformance.engine.findings import Finding
    from conformance.ir.verdict import CHECK_SPECS, CHECKS, PAIRWISE_CHECKS, Verdict
    assert CHECKS == tuple(c.name for c in CHECK_SPECS) and set(PAIRWISE_CHECKS) < set(CHECKS)
    assert set(Verdict.model_fields["check"].annotation.__args__) == set(CHECKS)
    for c in CHECK_SPECS:
        assert c.sentence and c.title and c.expected and c.evidence, c.name
        f = Finding.model_validate({"check": c.name, "pipeline": "jax:remat3", "reference": "jax:remat2",
                                    "error_type": "x", "detail": {}, "features": [], "signature": "s",
                                    "program_hash": "h", "program": {}, "inputs": {}})
        assert title(f).startswith("jax:remat3: ") and "{" not in title(f)
        assert "{" not in expected_actual(f)[0]
