"""Oracles are pure functions: each verdict on hand-made observations."""
import json

import pytest

from conformance.observation import CustomRuleLog, ErrorInfo, Observation, Residual
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
    from conformance import ops
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
    assert [(v.check, v.pipeline, v.reference, v.error_type) for v in f] == [("error", "jax:remat3", "expectations", "none")]
    assert silent.expectation_hits == {"e": "idle"}
    err = ErrorInfo(type="ValueError", message="no symbolic zeros under remat3", stage="forward")
    raised = judge(p, {"ref:f64": ref, "jax:remat3": obs("jax:remat3", error=err)}, exp)
    assert not raised.failures() and raised.expectation_hits == {"e": "fired"}
    wrong = judge(p, {"ref:f64": ref, "jax:remat3": obs("jax:remat3", error=err.model_copy(update={"message": "x"}))}, exp)
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
