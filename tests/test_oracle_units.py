"""Unit tests of the oracles and of the campaign's signature/dedup functions, on hand-built
observations (no framework runs): each test states what a verdict must be and why, from the
modules' documented semantics. They are also the tests `make mutation` runs (tools/mutation.py)."""
from __future__ import annotations

import json
from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

from conformance.engine.findings import INCIDENTAL_FEATURES, Finding, signature, signature_features
from conformance.engine.search import Searcher, merge_finding, same_behaviour
from conformance.ir.observation import CustomRuleLog, ErrorInfo, Observation, Residual
from conformance.ir.verdict import Verdict
from oracles import cross_framework, gradients, residuals
from oracles.expectations import DEFAULT_FILE, Entry, Expectations, ExpectationsError, stale
from oracles.judge import compare_custom_rules, judge
from oracles.missing import missing, skip_unless
from tests.programs import named_chain, op, prog, region, seed_program, sin_cvjp

V = {"jax": "0.12.0.1"}
G = {"x": [1.0, 1.0, 1.0]}
WRONG = {"x": [1.0, 1.5, 1.0]}


def ob(name, grads=None, *, res=None, error=None, rules=None, outputs=None, grads2=None, values=None,
       unsupported=None, versions=V):
    return Observation(pipeline=name, grads=grads, grads2=grads2, residuals=res,
                       outputs=[[1.0]] if outputs is None else outputs, values=values, error=error,
                       custom_rules=rules or {}, unsupported=unsupported, versions=versions)


def err(type="RuntimeError", message="boom", stage="backward"):
    return ErrorInfo(type=type, message=message, stage=stage)


def R(cls, names=(), shape=(3,), dtype="float64", nbytes=24):
    return Residual(cls=list(cls), names=list(names), shape=list(shape), dtype=dtype, bytes=nbytes)


def exps(*entries):
    """Expectations from entry dicts; an entry without an id gets e0, e1, ... by position."""
    return Expectations([Entry.model_validate({"id": f"e{k}", **e}) for k, e in enumerate(entries)])


def verdict(check, pipeline, reference, status, error_type=None, detail=None, expectation=None):
    """A verdict as model_dump() gives it, for whole-verdict comparisons."""
    return {"check": check, "pipeline": pipeline, "reference": reference, "status": status,
            "error_type": error_type, "detail": detail or {}, "expectation": expectation}


def find(j, check, pipeline, reference):
    got = [v for v in j.verdicts if (v.check, v.pipeline, v.reference) == (check, pipeline, reference)]
    assert len(got) == 1, [v.key() for v in j.verdicts]
    return got[0]


def triples(j):
    return sorted((v.check, v.pipeline, v.reference, v.status) for v in j.verdicts)


SIN = prog([op("sin", ["x"], "y")])                                             # size 1, float64
RELU = prog([op("sin", ["x"], "a"), op("relu", ["a"], "b"), op("cos", ["b"], "c")])   # size 3
RELU_IN_BWD = prog([{"kind": "custom_vjp", "args": ["x"], "fwd": [op("sin", ["x"], "s")], "results": ["s"],
                     "residuals": ["x"], "cts": ["g"],
                     "bwd": [op("relu", ["g"], "r"), op("cos", ["x"], "c"), op("mul", ["r", "c"], "d")],
                     "bwd_results": ["d"]}])


# -- oracles.missing ---------------------------------------------------------------------------
def test_missing_says_what_a_check_lacks_and_why():
    full = ob("p", G, res=[], values={"x": [0.0]})
    for what in ("values", "residuals", "custom_rules", "node_values"):
        assert missing(full, what) is None, what
    # values need both the gradients and the outputs
    assert missing(ob("p", None), "values") == "p records no values"
    assert missing(Observation(pipeline="p", grads=G, outputs=None), "values") == "p records no values"
    assert missing(ob("p", G, res=None), "residuals") == "p records no residuals"
    assert missing(ob("p", G), "node_values") == "p records no node-values"
    # custom-rule logs are complete only when the whole run completed
    e = err(stage="second_order")
    assert missing(ob("p", G, res=[], error=e), "custom_rules") == "p raised RuntimeError (second_order)"
    assert missing(ob("p", G, res=[], error=e), "values") is None   # first-order values survive
    assert missing(ob("p", error=err("crash:SIGSEGV", "", "forward")), "values") == "p crashed crash:SIGSEGV (forward)"
    assert missing(ob("p", error=err("timeout", "", "lowering")), "residuals") == "p timed out timeout (lowering)"
    # an unsupported program lacks everything, whatever was recorded
    assert missing(ob("p", G, res=[], unsupported="no"), "residuals") == "p does not support the program"


def test_skip_unless_marks_the_verdict_with_the_first_lacking_observation():
    v = Verdict(check="residuals", pipeline="a", reference="b", status="pass")
    assert skip_unless(v, "residuals", ob("a", res=[]), ob("b", res=[])) is False
    assert v.status == "pass" and v.detail == {}
    assert skip_unless(v, "residuals", ob("a", res=[]), ob("b"), ob("c")) is True
    assert v.status == "skipped" and v.detail == {"reason": "b records no residuals"}
    w = Verdict(check="residuals", pipeline="a", reference="b", status="pass")
    assert skip_unless(w, "residuals", ob("a"), ob("b")) and w.detail == {"reason": "a records no residuals"}


# -- oracles.gradients: tolerances ----------------------------------------------------------------
def test_tolerance_is_the_dtype_table_grown_by_size_and_second_order():
    # documented table: (rtol, atol) per dtype and mode
    assert gradients.TOLERANCES == {("float32", "tight"): (5e-5, 5e-6), ("float64", "tight"): (1e-10, 1e-12),
                                    ("float32", "loose"): (2e-3, 2e-4), ("float64", "loose"): (1e-8, 1e-10),
                                    ("bfloat16", "tight"): (3e-2, 3e-3), ("bfloat16", "loose"): (6e-2, 6e-3),
                                    ("float16", "tight"): (4e-3, 4e-4), ("float16", "loose"): (1e-2, 1e-3)}
    # grow = 1 + 0.1 * size (+ 4 at second order)
    assert gradients.tolerance(SIN, "tight") == pytest.approx((1e-10 * 1.1, 1e-12 * 1.1), rel=1e-12)
    assert gradients.tolerance(RELU, "tight") == pytest.approx((1e-10 * 1.3, 1e-12 * 1.3), rel=1e-12)
    assert gradients.tolerance(RELU, "loose") == pytest.approx((1e-8 * 1.3, 1e-10 * 1.3), rel=1e-12)
    second = prog([op("sin", ["x"], "y")], order=2)
    assert gradients.tolerance(second, "tight") == pytest.approx((1e-10 * 5.1, 1e-12 * 5.1), rel=1e-12)
    # a float32 input anywhere makes it a float32 program
    mixed = prog([op("sin", ["x"], "a"), op("cos", ["w"], "b")], outputs=["a", "b"],
                 inputs=[{"id": "x", "shape": [3], "dtype": "float64", "diff": True},
                         {"id": "w", "shape": [3], "dtype": "float32", "diff": True}])
    assert gradients.tolerance(mixed, "loose") == pytest.approx((2e-3 * 1.2, 2e-4 * 1.2), rel=1e-12)
    # so does a cast to bfloat16 anywhere make it a bfloat16 program; a float32 program stays tight
    cast = prog([op("cast", ["x"], "c", dtype="bfloat16"), op("sin", ["c"], "a")], outputs=["a"],
                inputs=[{"id": "x", "shape": [3], "dtype": "float32", "diff": True}])
    assert gradients.tolerance(cast, "tight") == pytest.approx((3e-2 * 1.2, 3e-3 * 1.2), rel=1e-12)
    assert gradients.tolerance(prog([op("sin", ["x"], "a")], inputs=[{"id": "x", "shape": [3], "dtype": "float32",
                                                                      "diff": True}]), "tight")[0] < 1e-4
    assert gradients.tolerance(seed_program("float64"), "tight") == pytest.approx((1e-10 * 1.7, 1e-12 * 1.7))
    assert gradients.tolerance(seed_program("float32"), "tight") == pytest.approx((5e-5 * 1.7, 5e-6 * 1.7))


def _cmp(got, want, mode="tight", p=SIN, **kw):
    return gradients.compare(p, ob("jax:remat3", got, **kw), ob("ref:f64", want), mode)


def test_a_difference_at_the_bound_passes_and_beyond_it_fails():
    rtol, atol = gradients.tolerance(SIN, "tight")
    # at a zero reference of magnitude <= 1 the bound is atol itself: exactly at it passes
    assert _cmp({"x": [atol]}, {"x": [0.0]}).status == "pass"
    assert _cmp({"x": [1.5 * atol]}, {"x": [0.0]}).status == "fail"
    assert _cmp({"x": [-1.5 * atol]}, {"x": [0.0]}).status == "fail"
    # the atol scale never drops below 1: a small reference does not shrink it
    assert _cmp({"x": [0.9 * atol, 0.5]}, {"x": [0.0, 0.5]}).status == "pass"
    assert _cmp({"x": [1.2 * atol, 0.5]}, {"x": [0.0, 0.5]}).status == "fail"
    # ... and the reference's magnitude scales it: |y| up to 100 allows 100 * atol at a zero element
    assert _cmp({"x": [50 * atol, 100.0]}, {"x": [0.0, 100.0]}).status == "pass"
    assert _cmp({"x": [150 * atol, 100.0]}, {"x": [0.0, 100.0]}).status == "fail"
    # rtol is relative to each element: 1e6 allows about 1e6 * (rtol + atol)
    assert _cmp({"x": [1e6 + 0.9e6 * rtol, 0.0]}, {"x": [1e6, 0.0]}).status == "pass"
    assert _cmp({"x": [1e6 + 1.2e6 * (rtol + atol), 0.0]}, {"x": [1e6, 0.0]}).status == "fail"
    # the same difference passes under the loose (float64 reference) tolerance
    assert _cmp({"x": [1.5 * atol]}, {"x": [0.0]}, "loose").status == "pass"
    assert _cmp({"x": [1.0 + 1e-9]}, {"x": [1.0]}, "loose").status == "pass"
    assert _cmp({"x": [1.0 + 1e-9]}, {"x": [1.0]}, "tight").status == "fail"


def test_a_failure_reports_the_worst_element():
    rtol, atol = gradients.tolerance(SIN, "tight")
    # element 0: large reference, tiny relative error; element 1: the worst ratio
    v = _cmp({"x": [100.0 + 1e-9, 2.0 + 5e-9]}, {"x": [100.0, 2.0]})
    assert v.status == "fail"
    bound1 = atol * 100.0 + rtol * 2.0
    assert set(v.detail) == {"mode", "value", "ratio", "max_abs_err", "max_rel_err", "got", "want", "rtol", "atol"}
    assert v.detail["mode"] == "tight" and v.detail["value"] == "grad[x]"
    assert v.detail["want"] == 2.0 and v.detail["got"] == 2.0 + 5e-9
    assert v.detail["ratio"] == pytest.approx(5e-9 / bound1, rel=1e-6)
    assert v.detail["max_abs_err"] == pytest.approx(5e-9, rel=1e-6)
    assert v.detail["max_rel_err"] == pytest.approx(2.5e-9, rel=1e-6)
    assert v.detail["rtol"] == rtol and v.detail["atol"] == pytest.approx(atol * 100.0)
    assert v.error_type is None
    # relative error against a zero reference: huge, not the absolute error
    z = _cmp({"x": [100.0, 1e-9]}, {"x": [100.0, 0.0]})
    assert z.status == "fail" and z.detail["want"] == 0.0 and z.detail["max_rel_err"] > 1e6
    # an infinite relative error is reported as None (JSON has no inf)
    with np.errstate(over="ignore"):
        inf = _cmp({"x": [1e280]}, {"x": [0.0]})
    assert inf.status == "fail" and inf.detail["max_rel_err"] is None


def test_the_worst_value_over_all_keys_is_reported():
    small, big = 1.0 + 3e-10, 1.0 + 3e-9     # ratios of about 1.4 and 14
    v = _cmp({"x": [small], "z": [big]}, {"x": [1.0], "z": [1.0]})
    assert v.detail["value"] == "grad[z]"
    v = _cmp({"x": [big], "z": [small]}, {"x": [1.0], "z": [1.0]})
    assert v.detail["value"] == "grad[x]"
    # equal ratios: the first key in sorted order stands
    v = _cmp({"x": [big], "z": [big]}, {"x": [1.0], "z": [1.0]})
    assert v.detail["value"] == "grad[x]"


def test_outputs_and_second_order_gradients_are_compared_too():
    v = gradients.compare(SIN, ob("p", G, outputs=[[1.0], [2.5]]), ob("q", G, outputs=[[1.0], [2.0]]), "tight")
    assert v.status == "fail" and v.detail["value"] == "output[1]" and v.detail["want"] == 2.0
    assert gradients.compare(SIN, ob("p", G, outputs=[[1.0], [2.0]]), ob("q", G, outputs=[[1.0], [2.0]]),
                             "tight").status == "pass"
    v = gradients.compare(SIN, ob("p", G, grads2={"x": [3.0]}), ob("q", G, grads2={"x": [2.0]}), "tight")
    assert v.status == "fail" and v.detail["value"] == "grad2[x]" and v.detail["got"] == 3.0


def test_missing_values_fail_except_second_order_gradients_not_asked_or_lost():
    # a gradient one side lacks, on either side
    v = _cmp({"x": [1.0]}, {"x": [1.0], "z": [1.0]})
    assert v.status == "fail" and v.detail == {"mode": "tight", "value": "grad[z]", "reason": "missing"}
    v = _cmp({"x": [1.0], "z": [1.0]}, {"x": [1.0]}, "loose")
    assert v.detail == {"mode": "loose", "value": "grad[z]", "reason": "missing"}
    # second order not asked of obs: not compared
    assert gradients.compare(SIN, ob("p", G), ob("q", G, grads2={"x": [2.0]}), "tight").status == "pass"
    # the reference failed at its second_order stage: its first-order values are still compared
    r2 = ob("q", G, error=err(stage="second_order"))
    assert gradients.compare(SIN, ob("p", G, grads2={"x": [2.0]}), r2, "tight").status == "pass"
    assert gradients.compare(SIN, ob("p", WRONG, grads2={"x": [2.0]}), ob("q", G, error=err(stage="second_order")),
                             "tight").detail["value"] == "grad[x]"
    # asked of both, the reference completed without them: missing
    v = gradients.compare(SIN, ob("p", G, grads2={"x": [2.0]}), ob("q", G), "tight")
    assert v.detail == {"mode": "tight", "value": "grad2[x]", "reason": "missing"}


def test_shape_and_non_finite_differences():
    v = _cmp({"x": [[1.0, 2.0]]}, {"x": [1.0, 2.0]})
    assert v.status == "fail" and v.detail == {"mode": "tight", "value": "grad[x]", "reason": "shape [1, 2] vs [2]"}
    v = _cmp({"x": [1.0, float("nan")]}, {"x": [1.0, 1.0]})
    assert v.detail == {"mode": "tight", "value": "grad[x]", "reason": "non-finite values differ"}
    assert _cmp({"x": [1.0, 1.0]}, {"x": [1.0, float("inf")]}).detail["reason"] == "non-finite values differ"
    # non-finite in the same places: only the finite elements are compared
    assert _cmp({"x": [float("inf"), 1.0]}, {"x": [float("inf"), 1.0]}).status == "pass"
    assert _cmp({"x": [float("nan"), 1.5]}, {"x": [float("nan"), 1.0]}).status == "fail"
    # all non-finite alike: that key passes, and the next keys are still compared
    v = _cmp({"x": [float("inf")], "z": [2.0]}, {"x": [float("inf")], "z": [1.0]})
    assert v.status == "fail" and v.detail["value"] == "grad[z]"
    # a structural difference ends the comparison with that key
    v = _cmp({"a": [1.0, 2.0], "x": [5.0]}, {"a": [1.0], "x": [1.0]})
    assert v.detail == {"mode": "tight", "value": "grad[a]", "reason": "shape [2] vs [1]"}


def test_values_missing_on_either_side_skip_the_comparison():
    v = gradients.compare(SIN, ob("p", None), ob("q", G), "tight")
    assert v.status == "skipped" and v.detail == {"reason": "p records no values"}
    v = gradients.compare(SIN, ob("p", G), ob("q", error=err(stage="forward")), "loose")
    assert v.status == "skipped" and v.detail == {"reason": "q raised RuntimeError (forward)"}
    assert (v.check, v.pipeline, v.reference) == ("gradient", "p", "q")


# -- oracles.gradients: nonsmooth ops at their kink -----------------------------------------------
def _band(p, dtype):
    return gradients.KINK_BAND_EPS * float(np.finfo(dtype).eps) * (1 + p.size())


def test_near_kink_band_scales_with_dtype_eps_and_program_size():
    assert gradients.KINK_BAND_EPS == 1000.0
    band = _band(RELU, np.float64)      # 1000 * eps * (1 + 3)
    assert band == pytest.approx(1000 * 2.220446049250313e-16 * 4)
    assert gradients.near_kink(RELU, {"a": [0.5, 0.99 * band]}) == ["a"]
    assert gradients.near_kink(RELU, {"a": [0.5, -0.99 * band]}) == ["a"]
    assert gradients.near_kink(RELU, {"a": [0.5, 1.01 * band]}) == []
    assert gradients.near_kink(RELU, {"a": [band]}) == []       # strictly inside the band
    # only the nonsmooth op's input counts; an absent value is no kink
    assert gradients.near_kink(RELU, {"x": [0.0], "b": [0.0]}) == []
    assert gradients.near_kink(RELU, {}) == [] and gradients.near_kink(RELU, None) == []
    # float32: eps is ~1.2e-7, so 1e-5 is at the kink there and not in float64
    relu32 = prog(RELU.model_dump()["body"], inputs=[{"id": "x", "shape": [3], "dtype": "float32", "diff": True}])
    assert gradients.near_kink(relu32, {"a": [1e-5]}) == ["a"]
    assert gradients.near_kink(RELU, {"a": [1e-5]}) == []
    assert gradients.near_kink(relu32, {"a": [1.01 * _band(relu32, np.float32)]}) == []


def test_near_kink_lists_each_input_once_sorted_and_ignores_bwd_rules():
    p = prog([op("sin", ["x"], "z"), op("cos", ["x"], "a"), op("relu", ["z"], "r1"), op("step", ["a"], "r2"),
              op("relu", ["z"], "r3"), op("add", ["r1", "r2"], "s"), op("add", ["s", "r3"], "y")])
    assert gradients.near_kink(p, {"z": [0.0], "a": [0.0]}) == ["a", "z"]
    assert gradients.has_nonsmooth(p)
    # a relu inside a custom_vjp bwd rule is outside near_kink's scope
    assert gradients.near_kink(RELU_IN_BWD, {"g": [0.0], "x": [0.0]}) == []
    assert not gradients.has_nonsmooth(RELU_IN_BWD)
    assert not gradients.has_nonsmooth(SIN) and gradients.has_nonsmooth(RELU)


def test_a_program_at_its_kink_or_without_node_values_is_skipped():
    v = gradients.compare(RELU, ob("p", WRONG), ob("q", G), "tight", values={"a": [0.0, 1.0, 1.0]})
    assert v.status == "skipped"
    assert v.detail == {"reason": "a nonsmooth op's input is at its kink (values may take either side)",
                        "values": ["a"]}
    # away from the kink it is judged
    assert gradients.compare(RELU, ob("p", WRONG), ob("q", G), "tight", values={"a": [1.0, 1.0, 1.0]}).status == "fail"
    # no node values, and why: a nonsmooth program is skipped, a smooth one judged
    v = gradients.compare(RELU, ob("p", WRONG), ob("q", G), "tight", values_missing="ref:f64 raised E (forward)")
    assert v.status == "skipped"
    assert v.detail == {"reason": "ref:f64 raised E (forward): no node values to rule out a nonsmooth op at its kink"}
    assert gradients.compare(SIN, ob("p", WRONG), ob("q", G), "tight", values_missing="why").status == "fail"
    assert gradients.compare(RELU, ob("p", WRONG), ob("q", G), "tight", values={"a": [1.0]},
                             values_missing="why").status == "fail"


# -- oracles.residuals: one pipeline's saved set against another's ---------------------------------
NA, NB = R(["na", "s"], ["a"]), R(["c", "nb"], ["b"])


def test_named_classes_are_compared_as_multisets():
    a = ob("p", res=[NA, R(["x"])])
    b = ob("q", res=[NA, NA, R(["x"])])          # two copies of the class: one missing
    v = residuals.compare(a, b)
    assert v.status == "fail" and v.error_type == "missing"
    assert v.detail["missing_named"] == ["na/s"] and v.detail["extra_named"] == []
    v = residuals.compare(b, a)
    assert v.error_type == "extra" and v.detail["extra_named"] == ["na/s"] and v.detail["missing_named"] == []
    # one missing and one extra: "named"
    v = residuals.compare(ob("p", res=[NB]), ob("q", res=[NA]))
    assert v.error_type == "named" and v.detail["missing_named"] == ["na/s"] and v.detail["extra_named"] == ["c/nb"]
    assert residuals.compare(ob("p", res=[NA, NB]), ob("q", res=[NB, NA])).status == "pass"


def test_unnamed_residuals_are_compared_by_shape_dtype_and_bytes():
    a = ob("p", res=[R(["x"], shape=(2,), nbytes=16), R([], shape=(4,), dtype="float32", nbytes=16)])
    b = ob("q", res=[R(["y"], shape=(3,), nbytes=24), R([], shape=(4,), dtype="float32", nbytes=16)])
    v = residuals.compare(a, b)
    assert v.status == "fail" and v.error_type == "other"
    assert v.detail == {"missing_other": ["float64[3]"], "extra_other": ["float64[2]"], "bytes": 32,
                        "reference_bytes": 40, "saved": ["x:float64[2]", "?:float32[4]"],
                        "reference_saved": ["y:float64[3]", "?:float32[4]"]}
    # the same shapes, more bytes (another copy): only the byte totals differ
    v = residuals.compare(ob("p", res=[R(["x"], nbytes=48)]), ob("q", res=[R(["y"], nbytes=24)]))
    assert v.error_type == "other" and v.detail["bytes"] == 48 and v.detail["reference_bytes"] == 24
    assert "missing_other" not in v.detail and "missing_named" not in v.detail
    # unnamed classes are told apart only by shape and dtype, not by their ids
    assert residuals.compare(ob("p", res=[R(["x"])]), ob("q", res=[R(["y"])])).status == "pass"
    # a named difference with equal unnamed sets reports no unnamed keys
    v = residuals.compare(ob("p", res=[R(["x"])]), ob("q", res=[R(["x"]), NB]))
    assert set(v.detail) == {"missing_named", "extra_named", "bytes", "reference_bytes", "saved", "reference_saved"}


def test_an_input_saved_where_the_reference_saves_a_value_of_its_shape_is_a_difference():
    """Recomputing more (saving the input x where the reference saves cos(x), one shape) differs;
    which computed value or which input is saved does not."""
    ins = frozenset({"x0", "x1"})
    v = residuals.compare(ob("p", res=[R(["x0"])]), ob("q", res=[R([])]), inputs=ins)
    assert v.status == "fail" and v.error_type == "other"
    assert v.detail["missing_other"] == ["float64[3]"] and v.detail["extra_other"] == ["float64[3] (a program input)"]
    v = residuals.compare(ob("p", res=[R(["c1@0", "x1"])]), ob("q", res=[R(["v2"])]), inputs=ins)
    assert v.detail["extra_other"] == ["float64[3] (a program input)"]   # a carry equal to an input is one
    assert residuals.compare(ob("p", res=[R(["x0"])]), ob("q", res=[R(["x1"])]), inputs=ins).status == "pass"
    assert residuals.compare(ob("p", res=[R(["v3"])]), ob("q", res=[R([])]), inputs=ins).status == "pass"
    assert residuals.compare(ob("p", res=[R(["x0"])]), ob("q", res=[R([])])).status == "pass"   # no inputs given


def test_named_only_ignores_unnamed_residuals_and_bytes():
    a = ob("p", res=[NA, R([], shape=(2,), nbytes=16)])
    b = ob("q", res=[NA, R([], shape=(5,), nbytes=40)])
    assert residuals.compare(a, b).status == "fail"
    assert residuals.compare(a, b, named_only=True).status == "pass"
    v = residuals.compare(a, ob("q", res=[]), named_only=True)
    assert v.detail == {"missing_named": [], "extra_named": ["na/s"], "saved": ["na/s['a']:float64[3]", "?:float64[2]"],
                        "reference_saved": []}


def test_residual_compare_skips_without_a_saved_set():
    v = residuals.compare(ob("p", res=[NA]), ob("q", res=None))
    assert v.model_dump() == verdict("residuals", "p", "q", "skipped", detail={"reason": "q records no residuals"})


# -- oracles.residuals: the policy --------------------------------------------------------------
def test_policy_blames_only_values_every_enclosing_policy_recomputes():
    p = named_chain()    # region(x, w) saving only 'a': m = x@w, s = sin, na = name a, c = cos, nb = name b, y
    ok = ob("jax:remat2", res=[R(["na", "s"], ["a"]), R(["w"]), R(["x"]), R(["y"]), R([]), R(["not_a_program_value"])])
    assert residuals.check_policy(p, ok).model_dump() == verdict("residuals", "jax:remat2", "policy", "pass")
    bad = ob("jax:remat2", res=[R([]), R(["m"]), R(["na", "s"], ["a"]), R(["c", "nb"], ["b"])])
    v = residuals.check_policy(p, bad)
    assert v.status == "fail" and v.error_type == "saved_against_policy"
    assert v.detail == {"saved_against_policy": ["m:float64[3]", "c/nb['b']:float64[3]"],
                        "saved": ["?:float64[3]", "m:float64[3]", "na/s['a']:float64[3]", "c/nb['b']:float64[3]"],
                        # each blamed value's cause: what it is and what its one policy (save only 'a') decided
                        "causes": ["saves against its policy a dot's output [names:recompute]",
                                   "saves against its policy a value named in plain code [names:recompute]"]}
    v = residuals.check_policy(p, ob("jax:remat2", res=None))
    assert v.status == "skipped" and v.detail == {"reason": "jax:remat2 records no residuals"}


def test_policy_decides_by_op_kind_name_and_batch_dims():
    dots = prog([region(["x"], [op("matmul", ["x", "x"], "m"), op("sin", ["m"], "y")], ["y"], {"kind": "dots"})],
                inputs=[{"id": "x", "shape": [3, 3], "dtype": "float64", "diff": True}])
    assert residuals.check_policy(dots, ob("p", res=[R(["m"])])).status == "pass"      # a dot is saveable
    assert residuals.check_policy(dots, ob("p", res=[R(["y"])])).status == "pass"      # the region's result
    batched = prog([region(["a", "b"], [op("matmul", ["a", "b"], "m"), op("sin", ["m"], "s"), op("cos", ["s"], "y")],
                           ["y"], {"kind": "dots_no_batch"})],
                   inputs=[{"id": "a", "shape": [2, 3, 4], "dtype": "float64", "diff": True},
                           {"id": "b", "shape": [2, 4, 5], "dtype": "float64", "diff": True}])
    # a batched product is not saved by dots_no_batch
    assert residuals.check_policy(batched, ob("p", res=[R(["m"])])).status == "fail"
    unbatched = prog([region(["a", "b"], [op("matmul", ["a", "b"], "m"), op("sin", ["m"], "y")], ["y"],
                             {"kind": "dots_no_batch"})],
                     inputs=[{"id": "a", "shape": [3, 4], "dtype": "float64", "diff": True},
                             {"id": "b", "shape": [4, 5], "dtype": "float64", "diff": True}])
    assert residuals.check_policy(unbatched, ob("p", res=[R(["m"])])).status == "pass"
    # nested regions: a value saved by any enclosing policy may be saved
    nested = prog([region(["x"], [region(["x"], [op("sin", ["x"], "s"), op("cos", ["s"], "c")], ["c"],
                                         {"kind": "nothing"}), op("tanh", ["c"], "y")], ["y"], {"kind": "everything"})])
    assert residuals.check_policy(nested, ob("p", res=[R(["s"])])).status == "pass"
    both_nothing = prog(
        [
            region(
                ["x"],
                [
                    region(["x"], [op("sin", ["x"], "s"), op("cos", ["s"], "c")], ["c"], {"kind": "nothing"}),
                    op("tanh", ["c"], "y"),
                ],
                ["y"],
                {"kind": "nothing"},
            )
        ]
    )
    assert residuals.check_policy(both_nothing, ob("p", res=[R(["s"])])).status == "fail"
    # a class is fine when any one of its values may be saved
    assert residuals.check_policy(both_nothing, ob("p", res=[R(["s", "x"])])).status == "pass"


def test_values_of_a_custom_vjp_fwd_outside_regions_are_not_governed():
    p = prog([sin_cvjp(arg="x")])      # fwd: s = sin(x), c0 = cos(x), c1 = name c; at top level
    assert residuals.check_policy(p, ob("p", res=[R(["c0"]), R(["c1"], ["c"])])).status == "pass"


# An op outside every region (sin) saves cos(x) for its own backward: a region value equal to cos(x)
# cannot be told from it.
ALIAS = prog([op("sin", ["x"], "s0"),
              region(["x"], [op("cos", ["x"], "c"), op("mul", ["c", "c"], "m"), op("sin", ["m"], "y")], ["y"],
                     {"kind": "nothing"}),
              op("add", ["s0", "y"], "z")])
XV = np.array([0.1, 0.2, 0.3])
ALIAS_VALUES = {"x": XV.tolist(), "s0": np.sin(XV).tolist(), "c": np.cos(XV).tolist(), "m": (np.cos(XV) ** 2).tolist(),
                "y": np.sin(np.cos(XV) ** 2).tolist()}


def test_a_region_value_equal_to_an_outside_ops_residual_is_not_blamed():
    ref = ob("ref:f64", G, values=ALIAS_VALUES)
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"])]), ref).status == "pass"
    # without the reference's node values it is blamed
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"])])).status == "fail"
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"])]), ob("ref:f64", G)).status == "fail"
    # a region value that equals no outside factor is still blamed
    v = residuals.check_policy(ALIAS, ob("p", res=[R(["c"]), R(["m"])]), ref)
    assert v.status == "fail" and v.detail["saved_against_policy"] == ["m:float64[3]"]
    # the outside op's factor needs both its input's and its output's recorded values
    no_out = {k: v for k, v in ALIAS_VALUES.items() if k != "s0"}
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"])]), ob("ref:f64", G, values=no_out)).status == "fail"
    no_in = {k: v for k, v in ALIAS_VALUES.items() if k != "x"}
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"])]), ob("ref:f64", G, values=no_in)).status == "fail"
    # equal within rtol 1e-6 / atol 1e-9, and of the same shape
    near = {**ALIAS_VALUES, "c": (np.cos(XV) * (1 + 1e-8)).tolist()}
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"])]), ob("ref:f64", G, values=near)).status == "pass"
    far = {**ALIAS_VALUES, "c": (np.cos(XV) * (1 + 1e-4)).tolist()}
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"])]), ob("ref:f64", G, values=far)).status == "fail"
    # the factor has the saved array's shape (the class's value may hold the same elements in another)
    reshaped = {**ALIAS_VALUES, "c": [np.cos(XV).tolist()]}
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"])]), ob("ref:f64", G, values=reshaped)).status == "pass"
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"], shape=(1, 3))]), ref).status == "fail"


# A region op whose policy saves ops other than names (ops: sin) may have its own derivative factor
# saved: cos(d) saves sin(d), which equals d = x - x = 0 (found by the gate: remat2 "saved against
# the policy" in float16, seed 699547).
ZERO = prog([op("sub", ["x", "x"], "d"), region(["d"], [op("add", ["d", "d"], "e"), op("cos", ["e"], "y")], ["y"],
                                                {"kind": "ops", "ops": ["sin"]})])
ZERO_VALUES = {"x": XV.tolist(), "d": [0.0] * 3, "e": [0.0] * 3, "y": [1.0] * 3}


def test_a_region_value_equal_to_a_saved_derivative_factor_of_a_region_op_is_not_blamed():
    ref = ob("ref:f64", G, values=ZERO_VALUES)
    assert residuals.check_policy(ZERO, ob("p", res=[R(["e"])]), ref).status == "pass"
    # a policy that saves no op kind keeps no factor: e is blamed
    names = prog([op("sub", ["x", "x"], "d"), region(["d"], [op("add", ["d", "d"], "e"), op("cos", ["e"], "y")], ["y"],
                                                     {"kind": "save_only_names", "names": ["a"]})])
    assert residuals.check_policy(names, ob("p", res=[R(["e"])]), ref).status == "fail"
    # a value that equals no factor is blamed under the saving policy too
    apart = {**ZERO_VALUES, "e": [0.5] * 3, "y": np.cos([0.5] * 3).tolist()}
    assert residuals.check_policy(ZERO, ob("p", res=[R(["e"])]), ob("ref:f64", G, values=apart)).status == "fail"
    # equal within the residual's dtype: sin(0.19) is 0.19 within float16's matching tolerance, not
    # within float64's (the gate's second shrink of the same behaviour, a sum's result)
    small = {**ZERO_VALUES, "e": [0.19] * 3, "y": np.cos([0.19] * 3).tolist()}
    assert residuals.check_policy(ZERO, ob("p", res=[R(["e"], dtype="float16")]),
                                  ob("ref:f64", G, values=small)).status == "pass"
    assert residuals.check_policy(ZERO, ob("p", res=[R(["e"])]), ob("ref:f64", G, values=small)).status == "fail"


def test_a_region_value_equal_to_a_seeded_cotangent_is_not_blamed():
    """JAX saves the loss's seeded cotangent (a literal) for the backward of sum(output * pattern);
    in bfloat16 it can equal a region value (the CI gate, seed 1313: cos(0.273) = 0.961 against the
    scalar pattern 0.978)."""
    from conformance.ir.interpreter import seeded_cotangent
    from conformance.ir.program import load_program

    def seeded(dtype, cotangents="seeded"):
        return load_program(
            {
                "schema_version": 1,
                "inputs": [{"id": "x", "shape": [], "dtype": dtype, "diff": True}],
                "body": [
                    region(
                        ["x"],
                        [
                            op("cos", ["x"], "c"),
                            op("name", ["c"], "n", name="a"),
                            op("cast", ["n"], "y", dtype="float32"),
                        ],
                        ["y"],
                        {"kind": "nothing"},
                    )
                ],
                "outputs": ["y"],
                "diff": {"order": 1, "mode": "reverse", "cotangents": cotangents},
            }
        )
    pattern = seeded_cotangent([])
    vals = {"x": 0.2734375, "c": 0.9609375, "n": 0.9609375, "y": 0.9609375}
    saved = ob("p", res=[R(["c", "n"], ["a"], shape=(), dtype="float32", nbytes=4)])
    assert abs(pattern - vals["c"]) > 0.01
    assert residuals.check_policy(seeded("bfloat16"), saved, ob("ref:f64", G, values=vals)).status == "pass"
    # in float32 the pattern is no match for c; without seeded cotangents there is no pattern
    assert residuals.check_policy(seeded("float32"), saved, ob("ref:f64", G, values=vals)).status == "fail"
    assert residuals.check_policy(seeded("bfloat16", "ones"), saved, ob("ref:f64", G, values=vals)).status == "fail"

    # an unnamed class matched within a 16-bit tolerance is not judged at all; in float32 it is
    unnamed = ob("p", res=[R(["c"], shape=(), dtype="float32", nbytes=4)])
    assert residuals.check_policy(seeded("bfloat16", "ones"), unnamed, ob("ref:f64", G, values=vals)).status == "pass"
    assert residuals.check_policy(seeded("float32", "ones"), unnamed, ob("ref:f64", G, values=vals)).status == "fail"


def test_saved_masks_and_indices_are_no_program_value():
    # a relu's bool mask, a cond's int32 branch index: equal in elements to a 0/1 program value (a
    # step), never that value (found by scan and cond campaigns: "saved against the policy")
    from conformance.ir.residuals import canonicalise
    values = {"st": np.array([0.0, 1.0, 1.0]), "one": np.array(1.0)}
    res = canonicalise([np.array([False, True, True]), np.array(1, np.int32), np.array([0.0, 1.0, 1.0])], values, {})
    assert [(r.cls, r.dtype) for r in res] == [([], "int32"), ([], "bool"), (["st"], "float64")]


def test_a_zero_residual_under_a_cond_is_not_blamed():
    # lax.cond saves zeros for the residuals of the branch it did not take
    body = [op("sub", ["x", "x"], "z"), op("sin", ["z"], "y")]
    c = {"kind": "cond", "args": ["p", "x"], "branches": [body, [op("neg", ["x"], "w")]],
         "branch_results": [["y"], ["w"]], "results": ["r"]}
    p = prog([region(["x", "p"], [c], ["r"], {"kind": "nothing"})],
             inputs=[{"id": "x", "shape": [3], "dtype": "float64", "diff": True},
                     {"id": "p", "shape": [], "dtype": "float64", "diff": False}], outputs=["r"])
    vals = {"x": [0.1, 0.2, 0.3], "z": [0.0, 0.0, 0.0], "y": [0.0, 0.0, 0.0], "p": -1.0}
    ref = ob("ref:f64", G, values=vals)
    assert residuals.check_policy(p, ob("p", res=[R(["z"])]), ref).status == "pass"
    assert residuals.check_policy(p, ob("p", res=[R(["x"]), R(["y"])]), ref).status == "pass"
    nonzero = {**vals, "z": [0.0, 1.0, 0.0]}
    assert residuals.check_policy(p, ob("p", res=[R(["z"])]), ob("ref:f64", G, values=nonzero)).status == "fail"


def test_aliasing_is_judged_within_rtol_1e_6_and_atol_1e_9():
    ref = lambda c: ob("ref:f64", G, values={**ALIAS_VALUES, "c": c.tolist()})
    cos = np.cos(XV)
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"])]), ref(cos * (1 + 5e-7))).status == "pass"
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"])]), ref(cos * (1 + 5e-6))).status == "fail"
    # near zero the absolute tolerance decides
    at_zero = np.array([np.pi / 2])
    vals = {"x": at_zero.tolist(), "s0": np.sin(at_zero).tolist()}
    near = ob("ref:f64", G, values={**vals, "c": (np.cos(at_zero) + 5e-10).tolist()})
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"], shape=(1,))]), near).status == "pass"
    off = ob("ref:f64", G, values={**vals, "c": (np.cos(at_zero) + 5e-9).tolist()})
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["c"], shape=(1,))]), off).status == "fail"


def test_outside_factors_read_the_ops_output_and_add_up_over_ops():
    # tanh saves 1 - y*y (its output's), sin saves cos(x): a region value equal to either is not blamed
    p = prog([op("tanh", ["x"], "t"), op("sin", ["x"], "s0"),
              region(["x"], [op("cos", ["x"], "c"), op("mul", ["c", "c"], "m"), op("exp", ["m"], "y")], ["y"],
                     {"kind": "nothing"}),
              op("add", ["t", "s0"], "u"), op("add", ["u", "y"], "z")])
    t = np.tanh(XV)
    base = {"x": XV.tolist(), "t": t.tolist(), "s0": np.sin(XV).tolist()}
    like_tanh = ob("ref:f64", G, values={**base, "c": (1 - t * t).tolist(), "m": [9.0, 9.0, 9.0]})
    assert residuals.check_policy(p, ob("p", res=[R(["c"])]), like_tanh).status == "pass"
    assert residuals.check_policy(p, ob("p", res=[R(["m"])]), like_tanh).status == "fail"
    like_sin = ob("ref:f64", G, values={**base, "c": np.cos(XV).tolist()})
    assert residuals.check_policy(p, ob("p", res=[R(["c"])]), like_sin).status == "pass"


def test_an_op_inside_a_region_or_a_bwd_rule_is_no_outside_factor():
    def inside_of(policy):
        return prog([region(["x"], [op("sin", ["x"], "s0")], ["s0"], policy),
                     region(["x"], [op("cos", ["x"], "c"), op("mul", ["c", "c"], "y")], ["y"], {"kind": "nothing"}),
                     op("add", ["s0", "y"], "z")])
    inside = inside_of({"kind": "nothing"})
    assert (
        residuals.check_policy(inside, ob("p", res=[R(["c"])]), ob("ref:f64", G, values=ALIAS_VALUES)).status == "fail"
    )
    # unless its region's policy saves op kinds: then sin's factor cos(x) may be saved there
    saving = inside_of({"kind": "everything"})
    assert (
        residuals.check_policy(saving, ob("p", res=[R(["c"])]), ob("ref:f64", G, values=ALIAS_VALUES)).status == "pass"
    )
    # ref failed: without node values, a violation is skipped only where an outside op could alias it
    failed = ob("ref:f64", error=err(stage="forward"))
    assert residuals.check_policy(inside, ob("p", res=[R(["c"])]), failed).status == "fail"
    bwd = prog([{"kind": "custom_vjp", "args": ["x"], "fwd": [op("neg", ["x"], "s")], "results": ["s"],
                 "residuals": ["x"], "cts": ["g"], "bwd": [op("sin", ["x"], "c"), op("mul", ["g", "c"], "d")],
                 "bwd_results": ["d"]},
                region(["x"], [op("cos", ["x"], "c2"), op("mul", ["c2", "c2"], "y")], ["y"], {"kind": "nothing"}),
                op("add", ["s", "y"], "z")])
    vals = {"x": XV.tolist(), "c": np.sin(XV).tolist(), "c2": np.cos(XV).tolist()}
    assert residuals.check_policy(bwd, ob("p", res=[R(["c2"])]), ob("ref:f64", G, values=vals)).status == "fail"
    assert residuals.check_policy(bwd, ob("p", res=[R(["c2"])]), failed).status == "fail"


def test_without_the_references_node_values_an_aliasable_violation_is_skipped():
    failed = ob("ref:f64", error=err("RuntimeError", "f64 only", "forward"))
    v = residuals.check_policy(ALIAS, ob("p", res=[R(["c"])]), failed)
    assert v.model_dump() == verdict(
        "residuals",
        "p",
        "policy",
        "skipped",
        detail={
            "reason": "ref:f64 raised RuntimeError (forward): "
            "cannot tell an outside op's residual from an equal region value"
        },
    )
    # nothing saved against the policy: a pass, not a skip
    assert residuals.check_policy(ALIAS, ob("p", res=[R(["x"])]), failed).status == "pass"
    # the reference completed (its values simply lack c): judged
    assert (
        residuals.check_policy(ALIAS, ob("p", res=[R(["c"])]), ob("ref:f64", G, values={"x": [1.0]})).status == "fail"
    )


# -- oracles.cross_framework ---------------------------------------------------------------------
def test_cross_framework_values_use_the_tight_bound_and_say_cross_value():
    v = cross_framework.compare_grads(SIN, ob("torch:eager-sac", {"x": [1.0 + 1e-9]}), ob("jax:remat2", {"x": [1.0]}))
    assert v.status == "fail" and v.error_type == "cross_value" and v.detail["mode"] == "tight"
    assert (v.check, v.pipeline, v.reference) == ("gradient", "torch:eager-sac", "jax:remat2")
    v = cross_framework.compare_grads(SIN, ob("t", {"x": [1.0 + 1e-9]}), ob("j", {"x": [1.0]}), "loose")
    assert v.status == "pass" and v.error_type is None
    # the kink and missing-node-value rules apply as for any value check
    v = cross_framework.compare_grads(RELU, ob("t", WRONG), ob("j", G), values={"a": [0.0]})
    assert v.status == "skipped" and v.error_type is None and v.detail["values"] == ["a"]
    v = cross_framework.compare_grads(RELU, ob("t", WRONG), ob("j", G), values_missing="ref:f64 raised E (forward)")
    assert v.status == "skipped" and v.detail["reason"].startswith("ref:f64 raised E (forward): no node values")


def test_policy_named_are_the_names_some_enclosing_policy_saves():
    p = named_chain()    # saves only 'a': na; nb is recomputed
    assert cross_framework.policy_named(p) == {"na"}
    outside = prog([op("sin", ["x"], "s"), op("name", ["s"], "n", name="a")])
    assert cross_framework.policy_named(outside) == set()
    nested = prog(
        [
            region(
                ["x"],
                [
                    region(
                        ["x"],
                        [op("sin", ["x"], "s"), op("name", ["s"], "n", name="a"), op("cos", ["n"], "c")],
                        ["c"],
                        {"kind": "save_only_names", "names": ["a"]},
                    ),
                    op("name", ["c"], "m", name="b"),
                    op("tanh", ["m"], "y"),
                ],
                ["y"],
                {"kind": "nothing"},
            )
        ]
    )
    assert cross_framework.policy_named(nested) == {"n"}      # the inner level saves it; the outer saves nothing
    everything = prog([region(["x"], [op("sin", ["x"], "s"), op("name", ["s"], "n", name="a"), op("cos", ["n"], "y")],
                              ["y"], {"kind": "everything"})])
    assert cross_framework.policy_named(everything) == {"n"}
    # a custom_vjp fwd inside a region is inside it
    assert cross_framework.policy_named(seed_program()) == {"c1"}
    # the policy decides by the op kind too: a policy saving name ops saves every name
    by_op = prog([region(["x"], [op("sin", ["x"], "s"), op("name", ["s"], "n", name="a"), op("cos", ["n"], "y")],
                         ["y"], {"kind": "ops", "ops": ["name"]})])
    assert cross_framework.policy_named(by_op) == {"n"}


def test_cross_framework_residuals_compare_only_policy_named_classes():
    p = named_chain()
    t = ob("torch:eager-sac", res=[R(["m"])])
    j = ob("jax:remat2", res=[NA, NB, R(["x"], nbytes=99)])
    v = cross_framework.compare_residuals(t, j, p)
    assert v.status == "fail" and v.error_type == "missing"
    assert v.detail["missing_named"] == ["na/s"] and v.detail["scope"] == "policy_named"
    assert v.detail["saved"] == [] and v.detail["reference_saved"] == ["na/s['a']:float64[3]"]
    # nb (recomputed by the policy) and the unnamed residuals are not compared
    assert cross_framework.compare_residuals(ob("t", res=[NA]), j, p).model_dump() == verdict(
        "residuals", "t", "jax:remat2", "pass")
    # a class that also holds a value any pipeline may keep (a region's result) is left out
    with_result = ob("j", res=[R(["na", "s", "y"], ["a"])])
    assert cross_framework.compare_residuals(ob("t", res=[]), with_result, p).status == "pass"
    # without the program every named class is compared (still not the unnamed ones)
    v = cross_framework.compare_residuals(ob("t", res=[NA]), j)
    assert v.status == "fail" and v.detail["missing_named"] == ["c/nb"] and "scope" not in v.detail
    assert cross_framework.compare_residuals(ob("t", res=[NA, NB]), j).status == "pass"
    # the inputs are not modified
    assert len(j.residuals) == 3 and len(t.residuals) == 1
    # the classes, not their byte counts (another copy, another layout), must agree
    two_copies = ob("t", res=[R(["na", "s"], ["a"], nbytes=48)])
    assert cross_framework.compare_residuals(two_copies, j, p).status == "pass"


def test_cross_framework_residuals_leave_out_what_derivative_rules_decide():
    """sin(name(sin(x))) under `everything`: JAX saves cos of the named value (its sin rule's
    factor, which the policy saves), PyTorch saves the named value (its sin rule's input). Under a
    policy that saves only names both must keep the named value (gate seed 352822)."""
    def chain(policy, consumer="sin"):
        return prog([region(["x"], [op("sin", ["x"], "s"), op("name", ["s"], "n", name="a"),
                                    op(consumer, ["n"], "y")], ["y"], policy)])
    torch_side, jax_side = ob("torch:eager-sac", res=[R(["n", "s"], ["a"])]), ob("jax:remat2", res=[])
    assert cross_framework.derivative_factor_reads(chain({"kind": "everything"})) == {"x", "n"}
    assert cross_framework.compare_residuals(torch_side, jax_side, chain({"kind": "everything"})).status == "pass"
    # within one framework (eager against compiled PyTorch) the derivative rules are the same: compared
    v = cross_framework.compare_residuals(
        torch_side, ob("torch:compile-aot_eager", res=[]), chain({"kind": "everything"}), across=False
    )
    assert v.status == "fail" and v.detail["missing_named"] == [] and v.detail["extra_named"] == ["n/s"]
    # an unnamed value the policy saves: what the compiled pipeline keeps of it must be among eager's
    # classes; eager caching one the partitioner does not keep (nothing reads c backward) is not judged
    unnamed = prog([region(["x"], [op("sin", ["x"], "s"), op("cos", ["s"], "c"), op("tanh", ["c"], "y")], ["y"],
                           {"kind": "ops", "ops": ["cos"]})])
    eager = ob("torch:eager-sac", res=[R(["c"], []), R(["x"], [])])
    assert cross_framework.compare_residuals(ob("torch:compile-aot_eager", res=[R(["x"], [])]), eager, unnamed,
                                             across=False).status == "pass"
    v = cross_framework.compare_residuals(ob("torch:compile-aot_eager", res=[R(["c"], [])]),
                                          ob("torch:eager-sac", res=[R(["x"], [])]), unnamed, across=False)
    assert v.status == "fail" and v.error_type == "extra" and v.detail["extra_saved"] == ["c"], v.detail
    assert v.detail["scope"] == "policy_saved_unnamed"
    # across frameworks unnamed values are never compared; nor is a class no policy saves (s)
    assert cross_framework.compare_residuals(ob("torch:eager-sac", res=[R(["c"], [])]), ob("jax:remat2", res=[]),
                                             unnamed).status == "pass"
    assert cross_framework.compare_residuals(ob("torch:compile-aot_eager", res=[R(["s"], [])]),
                                             ob("torch:eager-sac", res=[]), unnamed, across=False).status == "pass"
    for saves_unnamed in ({"kind": "ops", "ops": ["sin", "name"]}, {"kind": "min_elements", "elements": 1},
                          {"kind": "save_anything_except_names", "names": ["b"]}):
        assert cross_framework.derivative_factor_reads(chain(saves_unnamed)) == {"x", "n"}, saves_unnamed
    assert cross_framework.derivative_factor_reads(chain({"kind": "everything"}, "square")) == {"x", "n"}  # JAX: 2x
    # the named value is compared when no unnamed value may be saved (dots aside), or when its reader
    # saves its operands in both frameworks
    for compared in (
        chain({"kind": "save_only_names", "names": ["a"]}),
        chain({"kind": "ops", "ops": ["name", "matmul"]}),
    ):
        assert cross_framework.derivative_factor_reads(compared) == set()
        v = cross_framework.compare_residuals(torch_side, jax_side, compared)
        assert v.status == "fail" and v.detail["extra_named"] == ["n/s"]
    mul_reader = prog([region(["x"], [op("sin", ["x"], "s"), op("name", ["s"], "n", name="a"),
                                      op("mul", ["n", "x"], "y")], ["y"], {"kind": "everything"})])
    assert cross_framework.derivative_factor_reads(mul_reader) == {"x"}
    assert cross_framework.compare_residuals(torch_side, jax_side, mul_reader).status == "fail"


def test_cross_framework_residuals_skip_without_a_saved_set():
    v = cross_framework.compare_residuals(ob("t", res=None), ob("j", res=[NA]), named_chain())
    assert v.status == "skipped" and v.detail == {"reason": "t records no residuals"}
    v = cross_framework.compare_residuals(ob("t", res=[NA]), ob("j", res=None), named_chain())
    assert v.status == "skipped" and v.detail == {"reason": "j records no residuals"}


# -- oracles.judge: custom rules --------------------------------------------------------------
def test_custom_rule_logs_are_compared_per_block_and_field():
    a = ob("jax:remat3", rules={"body[0]": CustomRuleLog(perturbed=[[True], [False]], symbolic_zero_cts=[[True]],
                                                         fwd_traces=1)})
    same = ob("jax:remat2", rules={"body[0]": CustomRuleLog(perturbed=[[False], [True]], symbolic_zero_cts=[[True]],
                                                            fwd_traces=3)})
    assert compare_custom_rules(a, same).model_dump() == verdict("custom_rule", "jax:remat3", "jax:remat2", "pass")
    b = ob(
        "jax:remat2", rules={"body[0]": CustomRuleLog(perturbed=[[False]], symbolic_zero_cts=[[False]], fwd_traces=1)}
    )
    v = compare_custom_rules(a, b)
    assert v.model_dump() == verdict("custom_rule", "jax:remat3", "jax:remat2", "fail",
                                     error_type="perturbed+symbolic_zero_cts", detail={"blocks": {"body[0]": {
                                         "perturbed": {"got": [[False], [True]], "reference": [[False]]},
                                         "symbolic_zero_cts": {"got": [[True]], "reference": [[False]]}}}})


def test_a_fwd_rule_run_by_one_side_only_is_reported_alone_for_its_block():
    a = ob("p", rules={"body[0]": CustomRuleLog(perturbed=[[True]], fwd_traces=2),
                       "body[1]": CustomRuleLog(perturbed=[[True]], fwd_traces=1)})
    b = ob(
        "q", rules={"body[0]": CustomRuleLog(fwd_traces=0), "body[1]": CustomRuleLog(perturbed=[[False]], fwd_traces=1)}
    )
    v = compare_custom_rules(a, b)
    assert v.error_type == "fwd_ran+perturbed"
    assert v.detail == {"blocks": {"body[0]": {"fwd_ran": {"got": 2, "reference": 0}},
                                   "body[1]": {"perturbed": {"got": [[True]], "reference": [[False]]}}}}


def test_compiled_rule_observations_must_be_among_the_eager_ones():
    """A compiled pipeline observes only the rule calls it ran eagerly: what it saw must be among
    what eager saw (torch.compile passing a value where eager passes None for a
    mark_non_differentiable output is caught), not all of it; a rule it never ran is not judged."""
    eager = ob(
        "torch:eager-sac",
        rules={
            "body[0]": CustomRuleLog(
                perturbed=[[True], [False]], ct_kinds=[["value", "none"]], fwd_traces=2, bwd_calls=1
            )
        },
    )
    fewer = ob("torch:compile-aot_eager", rules={"body[0]": CustomRuleLog(perturbed=[[True]], fwd_traces=1)})
    assert compare_custom_rules(fewer, eager, observed_only=True).status == "pass"
    assert compare_custom_rules(fewer, eager).status == "fail"   # (the full comparison would blame it)
    other = ob("torch:compile-aot_eager", rules={"body[0]": CustomRuleLog(ct_kinds=[["value", "value"]], bwd_calls=1)})
    v = compare_custom_rules(other, eager, observed_only=True)
    assert v.status == "fail" and v.error_type == "ct_kinds", v
    assert v.detail == {"blocks": {"body[0]": {"ct_kinds": {"got": [["value", "value"]],
                                                            "reference": [["value", "none"]]}}}}
    never = ob("torch:compile-aot_eager", rules={"body[0]": CustomRuleLog(ct_kinds=[["value", "value"]])})
    assert compare_custom_rules(never, eager, observed_only=True).status == "pass"   # no bwd call of its own


def test_a_custom_jvp_rule_a_rival_did_not_need_is_not_judged():
    """custom_jvp rules compute tangents only: remat3 drops those nobody reads (a custom_jvp in a
    custom_vjp fwd, at second order: make run seed 0), remat2 runs the rule anyway. A custom_vjp's
    fwd that did not run is still judged, and so is a custom_jvp rule run where the reference's was not."""
    ran = ob(
        "jax:remat2", rules={"body[0]": CustomRuleLog(fwd_traces=1), "body[0].fwd[0]": CustomRuleLog(fwd_traces=1)}
    )
    skipped = ob("jax:remat3", rules={"body[0]": CustomRuleLog(fwd_traces=1),
                                      "body[0].fwd[0]": CustomRuleLog(primal_traces=1)})
    jvp = frozenset({"body[0].fwd[0]"})
    assert compare_custom_rules(skipped, ran, jvp).status == "pass"
    assert compare_custom_rules(skipped, ran).detail == {
        "blocks": {"body[0].fwd[0]": {"fwd_ran": {"got": 0, "reference": 1}}}
    }
    v = compare_custom_rules(ran, skipped, jvp)
    assert v.error_type == "fwd_ran" and v.detail == {
        "blocks": {"body[0].fwd[0]": {"fwd_ran": {"got": 1, "reference": 0}}}
    }
    vjp_skipped = ob(
        "jax:remat3", rules={"body[0]": CustomRuleLog(primal_traces=1), "body[0].fwd[0]": CustomRuleLog(fwd_traces=1)}
    )
    assert compare_custom_rules(vjp_skipped, ran, jvp).error_type == "fwd_ran"


def test_a_block_one_side_never_traced_is_not_judged():
    a = ob("p", rules={"body[0]": CustomRuleLog(fwd_traces=1), "body[1]": CustomRuleLog(symbolic_zero_cts=[[True]])})
    b = ob("q", rules={"body[1]": CustomRuleLog(symbolic_zero_cts=[[False]])})
    v = compare_custom_rules(a, b)
    assert v.error_type == "symbolic_zero_cts" and list(v.detail["blocks"]) == ["body[1]"]
    assert compare_custom_rules(b, a).detail["blocks"] == {"body[1]": {"symbolic_zero_cts": {"got": [[False]],
                                                                                             "reference": [[True]]}}}
    assert compare_custom_rules(ob("p", rules={"body[0]": CustomRuleLog(fwd_traces=1)}), ob("q")).status == "pass"


def test_custom_rules_skip_when_either_run_did_not_complete():
    rules = {"body[0]": CustomRuleLog(perturbed=[[True]], fwd_traces=1)}
    v = compare_custom_rules(ob("p", rules=rules), ob("q", error=err(stage="second_order"), rules={}))
    assert v.model_dump() == verdict("custom_rule", "p", "q", "skipped",
                                     detail={"reason": "q raised RuntimeError (second_order)"})
    v = compare_custom_rules(ob("p", error=err(), rules={}), ob("q", rules=rules))
    assert v.detail == {"reason": "p raised RuntimeError (backward)"}


# -- oracles.judge: which checks run ------------------------------------------------------------
def _jax(grads3=G, res3=(), **extra):
    o = {"ref:f64": ob("ref:f64", G), "jax:none": ob("jax:none", G), "jax:remat2": ob("jax:remat2", G, res=[]),
         "jax:remat3": ob("jax:remat3", grads3, res=list(res3))}
    o.update(extra)
    return o


def test_each_rival_gets_value_policy_and_comparison_checks_the_baseline_only_the_value_reference():
    j = judge(named_chain(), _jax(), Expectations([]))
    assert triples(j) == [
        ("custom_rule", "jax:remat3", "jax:remat2", "pass"),
        ("gradient", "jax:none", "ref:f64", "pass"),
        ("gradient", "jax:remat2", "jax:none", "pass"), ("gradient", "jax:remat2", "ref:f64", "pass"),
        ("gradient", "jax:remat3", "jax:none", "pass"), ("gradient", "jax:remat3", "ref:f64", "pass"),
        ("residuals", "jax:remat2", "policy", "pass"),
        ("residuals", "jax:remat3", "jax:remat2", "pass"), ("residuals", "jax:remat3", "policy", "pass"),
        ("trace_count", "jax:remat3", "jax:remat2", "pass")]
    assert j.failures() == [] and j.expectation_hits == {}
    # tight against the baseline, loose against the value reference
    j = judge(named_chain(), _jax(grads3={"x": [1.0, 1.0 + 1e-9, 1.0]}), Expectations([]))
    assert find(j, "gradient", "jax:remat3", "jax:none").status == "fail"
    assert find(j, "gradient", "jax:remat3", "jax:none").detail["mode"] == "tight"
    assert find(j, "gradient", "jax:remat3", "ref:f64").status == "pass"
    assert [v.key() for v in j.failures()] == [("gradient", "jax:remat3", "jax:none", "")]


def test_without_the_value_reference_the_baseline_still_judges():
    o = _jax(WRONG)
    del o["ref:f64"]
    j = judge(named_chain(), o, Expectations([]))
    assert [v.key() for v in j.failures()] == [("gradient", "jax:remat3", "jax:none", "")]
    assert not any(v.reference == "ref:f64" for v in j.verdicts)


def test_residuals_of_a_rival_are_judged_against_its_reference_and_the_policy():
    j = judge(named_chain(), _jax(res3=[R(["c", "nb"], ["b"])]), Expectations([]))
    assert find(j, "residuals", "jax:remat3", "policy").error_type == "saved_against_policy"
    assert find(j, "residuals", "jax:remat3", "jax:remat2").error_type == "extra"
    # the policy check sees the value reference's node values (an outside op's residual is no violation)
    o = {"ref:f64": ob("ref:f64", G, values=ALIAS_VALUES), "jax:none": ob("jax:none", G),
         "jax:remat3": ob("jax:remat3", G, res=[R(["c"])])}
    assert find(judge(ALIAS, o, Expectations([])), "residuals", "jax:remat3", "policy").status == "pass"
    o["ref:f64"] = ob("ref:f64", error=err(stage="forward"))
    assert find(judge(ALIAS, o, Expectations([])), "residuals", "jax:remat3", "policy").status == "skipped"


def test_the_value_references_node_values_rule_out_kinks_in_every_value_check():
    at_kink = {"a": [0.0, 1.0, 1.0]}
    o = {"ref:f64": ob("ref:f64", G, values=at_kink), "jax:none": ob("jax:none", G),
         "jax:remat3": ob("jax:remat3", WRONG, res=[])}
    j = judge(RELU, o, Expectations([]))
    assert find(j, "gradient", "jax:remat3", "jax:none").status == "skipped"
    assert find(j, "gradient", "jax:remat3", "ref:f64").status == "skipped"
    # the reference completed without node values: nothing says why they are absent, so judged
    o["ref:f64"] = ob("ref:f64", G)
    j = judge(RELU, o, Expectations([]))
    assert find(j, "gradient", "jax:remat3", "jax:none").status == "fail"
    # the reference failed at second_order: its values exist, its node values do not
    o["ref:f64"] = ob("ref:f64", G, error=err(stage="second_order"))
    j = judge(RELU, o, Expectations([]))
    for r in ("jax:none", "ref:f64"):
        v = find(j, "gradient", "jax:remat3", r)
        assert v.status == "skipped" and v.detail["reason"] == (
            "ref:f64 raised RuntimeError (second_order): no node values to rule out a nonsmooth op at its kink")


def _torch(t_grads, t_res=(), jax_res=(), prog_values=None, ref=None):
    return {"ref:f64": ref or ob("ref:f64", G, values=prog_values), "jax:none": ob("jax:none", G),
            "jax:remat2": ob("jax:remat2", G, res=list(jax_res)), "torch:none": ob("torch:none", t_grads),
            "torch:eager-sac": ob("torch:eager-sac", t_grads, res=list(t_res))}


def test_a_torch_rival_is_compared_with_jax_on_values_and_policy_named_residuals():
    close = {"x": [1.0, 1.0 + 1e-9, 1.0]}     # within the loose bound of the f64 reference, not the tight one
    j = judge(named_chain(), _torch(close, t_res=[R(["m"])], jax_res=[NA]), Expectations([]))
    mine = {(v.check, v.reference): v for v in j.verdicts if v.pipeline == "torch:eager-sac"}
    assert sorted(mine) == [("gradient", "jax:remat2"), ("gradient", "ref:f64"), ("gradient", "torch:none"),
                            ("residuals", "jax:remat2"), ("residuals", "policy")]
    assert mine["gradient", "torch:none"].status == "pass" and mine["gradient", "ref:f64"].status == "pass"
    g = mine["gradient", "jax:remat2"]
    assert g.status == "fail" and g.error_type == "cross_value" and g.detail["mode"] == "tight"
    r = mine["residuals", "jax:remat2"]
    assert r.status == "fail" and r.error_type == "missing" and r.detail["scope"] == "policy_named"
    assert r.detail["missing_named"] == ["na/s"]
    # the cross value check sees the node values (kink) and why they are missing
    j = judge(RELU, _torch(WRONG, prog_values={"a": [0.0, 1.0, 1.0]}), Expectations([]))
    assert find(j, "gradient", "torch:eager-sac", "jax:remat2").status == "skipped"
    j = judge(RELU, _torch(WRONG, ref=ob("ref:f64", G, error=err(stage="second_order"))), Expectations([]))
    v = find(j, "gradient", "torch:eager-sac", "jax:remat2")
    assert v.status == "skipped" and "no node values" in v.detail["reason"]


# -- oracles.judge: expectations keyed by device, dtype, versions, features -------------------------
GRAD_DIVERGES = {"pipelines": ["jax:remat3"], "diverges": {"check": "gradient", "reason": "known"}}


def test_diverges_entries_excuse_the_check_they_name_where_they_match():
    entry = {**GRAD_DIVERGES, "devices": ["cpu"], "dtypes": ["float64"], "versions": {"jax": ">=0.12"},
             "features": ["names"]}
    j = judge(named_chain(), _jax(WRONG), exps(entry))      # the default device is cpu
    assert j.failures() == []
    for r in ("jax:none", "ref:f64"):
        v = find(j, "gradient", "jax:remat3", r)
        assert v.status == "expected" and v.expectation == "e0"
    assert j.expectation_hits == {"e0": "fired"}
    # on another device, dtype or version, or without the feature, it does not match
    assert len(judge(named_chain(), _jax(WRONG), exps(entry), device="cuda").failures()) == 2
    assert len(judge(named_chain(), _jax(WRONG), exps({**entry, "dtypes": ["float32"]})).failures()) == 2
    assert len(judge(named_chain(), _jax(WRONG), exps({**entry, "versions": {"jax": "<0.12"}})).failures()) == 2
    assert len(judge(named_chain(), _jax(WRONG), exps({**entry, "features": ["custom_vjp"]})).failures()) == 2
    o = _jax(WRONG)
    o["jax:remat3"] = ob("jax:remat3", WRONG, res=[], versions={})
    assert len(judge(named_chain(), o, exps(entry)).failures()) == 2
    # matched where nothing failed: idle
    j = judge(named_chain(), _jax(), exps(entry))
    assert j.expectation_hits == {"e0": "idle"} and not any(v.status == "expected" for v in j.verdicts)


def test_a_diverges_entry_restricted_to_a_reference_excuses_only_that_comparison():
    entry = {"pipelines": ["jax:remat3"], "diverges": {"check": "gradient", "reference": "ref:f64", "reason": "r"}}
    j = judge(named_chain(), _jax(WRONG), exps(entry))
    assert find(j, "gradient", "jax:remat3", "ref:f64").status == "expected"
    assert find(j, "gradient", "jax:remat3", "jax:none").status == "fail"
    # another check's entry excuses nothing here; the first entry that applies is the one used
    other = {"pipelines": ["jax:remat3"], "diverges": {"check": "residuals", "reason": "r"}}
    j = judge(named_chain(), _jax(WRONG), exps(other, GRAD_DIVERGES, GRAD_DIVERGES))
    assert find(j, "gradient", "jax:remat3", "jax:none").expectation == "e1"
    assert j.expectation_hits == {"e0": "idle", "e1": "fired"}
    # an error_regex matches an error: on another check's entry the schema refuses it
    with pytest.raises(ValueError, match="error_regex: only for check 'error'"):
        exps({"pipelines": ["jax:remat3"], "diverges": {"check": "residuals", "error_regex": "x", "reason": "r"}})


def test_a_diverges_reference_names_one_reference_or_several():
    d = lambda ref: Entry.model_validate({"id": "e", "pipelines": ["*"], "diverges": {
        "check": "gradient", "reference": ref, "reason": "r"}}).diverges
    assert d(None).concerns("jax:none") and d(None).concerns("policy")
    assert d("jax:remat2").concerns("jax:remat2")
    assert not d("jax:remat2:jit").concerns("jax:remat2")       # a name, not a substring
    assert not d("jax:remat2").concerns("jax:remat2:jit")
    several = d(["ref:f64", "jax:remat2"])
    assert several.concerns("ref:f64") and several.concerns("jax:remat2") and not several.concerns("jax:none")
    entry = {"pipelines": ["jax:remat3"], "diverges": {"check": "gradient", "reference": ["ref:f64", "jax:none"],
                                                       "reason": "r"}}
    j = judge(named_chain(), _jax(WRONG), exps(entry))
    assert j.failures() == [] and find(j, "gradient", "jax:remat3", "jax:none").expectation == "e0"


# -- oracles.judge: unsupported, crashes, timeouts ------------------------------------------------
def test_an_unsupported_program_gets_one_verdict_and_masks_no_other_pipeline():
    o = {"jax:remat3": ob("jax:remat3", WRONG, unsupported="too large"), "jax:remat3:jit": ob("jax:remat3:jit", WRONG),
         "ref:f64": ob("ref:f64", G), "jax:none": ob("jax:none", G)}
    j = judge(named_chain(), o, Expectations([]))
    mine = [v for v in j.verdicts if v.pipeline == "jax:remat3"]
    assert [v.model_dump() for v in mine] == [verdict("error", "jax:remat3", "expectations", "unsupported",
                                                      detail={"reason": "too large"})]
    assert ("gradient", "jax:remat3:jit", "jax:none", "") in [v.key() for v in j.failures()]
    # declared by an entry: its reason and id; a recorded reason wins
    un = {"pipelines": ["jax:remat3*"], "unsupported": {"reason": "declared"}}
    j = judge(named_chain(), o, exps(un, {**un, "unsupported": {"reason": "declared later"}}))
    assert [v.model_dump() for v in j.verdicts if v.pipeline == "jax:remat3"] == [
        verdict("error", "jax:remat3", "expectations", "unsupported", detail={"reason": "too large"}, expectation="e0")]
    assert [v.model_dump() for v in j.verdicts if v.pipeline == "jax:remat3:jit"] == [
        verdict("error", "jax:remat3:jit", "expectations", "unsupported", detail={"reason": "declared"},
                expectation="e0")]
    assert j.expectation_hits == {"e0": "fired", "e1": "fired"} and j.failures() == []


@pytest.mark.parametrize("etype, check", [("crash:SIGSEGV", "crash"), ("timeout", "timeout")])
def test_crashes_and_timeouts_are_their_own_failing_verdicts(etype, check):
    e = err(etype, "worker died", "forward")
    o = _jax()
    o["jax:remat3"] = ob("jax:remat3", error=e)
    raises = {"pipelines": ["jax:remat3"], "raises": {"type": ".*", "regex": ".*"}}
    excuse = {"pipelines": ["jax:remat3"], "diverges": {"check": "error", "reason": "r"}}
    for ex in (Expectations([]), exps(raises), exps(excuse)):
        j = judge(named_chain(), o, ex)
        assert [v.model_dump() for v in j.failures()] == [
            verdict(check, "jax:remat3", "expectations", "fail", error_type=etype, detail={"got": e.model_dump()})]
        # no error status to compare: no status verdicts; every other check of it is skipped
        assert not any(v.check == "error" for v in j.verdicts)
        others = [v for v in j.verdicts if v.pipeline == "jax:remat3" and v.check != check]
        how = "crashed" if check == "crash" else "timed out"
        assert others and all(v.status == "skipped" and v.detail == {"reason": f"jax:remat3 {how} {etype} (forward)"}
                              for v in others)


# -- oracles.judge: error verdicts against the expectations ----------------------------------------
def _err_verdict(j, pipeline="jax:remat3"):
    return find(j, "error", pipeline, "expectations") if any(
        (v.check, v.pipeline, v.reference) == ("error", pipeline, "expectations") for v in j.verdicts) else None


RAISES = {"pipelines": ["jax:remat3*"], "raises": {"type": "ValueError", "regex": "documented"}}
DOC = err("ValueError", "a documented limitation", "forward")


def _raised(e, ref=None, **kw):
    o = _jax()
    o["jax:remat3"] = ob("jax:remat3", error=e)
    if ref is not None:
        o["ref:f64"] = ref
    o.update(kw)
    return o


def test_a_raises_entry_met_is_expected():
    j = judge(named_chain(), _raised(DOC), exps(RAISES))
    assert _err_verdict(j).model_dump() == verdict("error", "jax:remat3", "expectations", "expected",
                                                   error_type="ValueError", expectation="e0")
    assert j.expectation_hits == {"e0": "fired"}


def test_of_two_raises_entries_either_is_met():
    """Two documented errors apply (two blocks, each raising its own): the one raised is met,
    whichever entry comes first; an error neither declares still fails."""
    other = {"pipelines": ["jax:remat3*"], "raises": {"type": "TypeError", "regex": "another"}}
    for entries in ((RAISES, other), (other, RAISES)):
        v = _err_verdict(judge(named_chain(), _raised(DOC), exps(*entries)))
        assert v.status == "expected" and v.expectation == ("e0" if entries[0] is RAISES else "e1"), v
        v = _err_verdict(judge(named_chain(), _raised(err("KeyError", "neither", "forward")), exps(*entries)))
        assert v.status == "fail", v


def test_a_raises_entry_needs_both_the_type_and_the_message():
    for e in (err("TypeError", "a documented limitation", "forward"), err("ValueError", "other", "forward")):
        v = _err_verdict(judge(named_chain(), _raised(e), exps(RAISES)))
        assert v.model_dump() == verdict("error", "jax:remat3", "expectations", "fail", error_type=e.type,
                                         expectation="e0", detail={
                                             "expected": {"type": "ValueError", "regex": "documented"},
                                             "got": e.model_dump(),
                                             # its error status differs from its references': listed here, once
                                             "status_differs_from": ["jax:remat2", "jax:none"]})


def test_a_raises_entry_not_met_by_a_silent_run_fails_with_none():
    j = judge(named_chain(), _jax(), exps(RAISES))
    assert _err_verdict(j).model_dump() == verdict(
        "error", "jax:remat3", "expectations", "fail", error_type="none", expectation="e0",
        detail={"expected": {"type": "ValueError", "regex": "documented"}, "got": None})
    assert j.expectation_hits == {"e0": "idle"}


def test_an_expectation_once_fired_stays_fired():
    o = _raised(DOC, **{"jax:remat3:jit": ob("jax:remat3:jit", G)})
    assert judge(named_chain(), o, exps(RAISES)).expectation_hits == {"e0": "fired"}
    o = {"jax:remat3:jit": ob("jax:remat3:jit", G), **_raised(DOC)}
    assert judge(named_chain(), o, exps(RAISES)).expectation_hits == {"e0": "fired"}
    both_silent = {**_jax(), "jax:remat3:jit": ob("jax:remat3:jit", G)}
    assert judge(named_chain(), both_silent, exps(RAISES)).expectation_hits == {"e0": "idle"}
    # a gradient divergence that happens on jax:remat3 but not on jax:remat3:jit, judged after it
    grads = {**_jax(WRONG), "jax:remat3:jit": ob("jax:remat3:jit", G)}
    j = judge(named_chain(), grads, exps({**GRAD_DIVERGES, "pipelines": ["jax:remat3*"]}))
    assert j.expectation_hits == {"e0": "fired"}
    assert find(j, "gradient", "jax:remat3:jit", "jax:none").status == "pass"


def test_the_value_references_own_error_first_makes_a_rivals_error_a_pass():
    e = err("RuntimeError", "f64 only", "forward")
    # no entry: the rival raising the reference's error defers to the reference's verdict
    j = judge(named_chain(), _raised(e, ref=ob("ref:f64", error=e)), Expectations([]))
    assert _err_verdict(j, "ref:f64").model_dump() == verdict("error", "ref:f64", "expectations", "fail",
                                                              error_type="RuntimeError", detail={"got": e.model_dump()})
    assert find(j, "error", "jax:remat3", "ref:f64").model_dump() == verdict(
        "error", "jax:remat3", "ref:f64", "pass", error_type="RuntimeError", detail={"got": e.model_dump()})
    # with a raises entry it does not meet, likewise
    j = judge(named_chain(), _raised(e, ref=ob("ref:f64", error=e)), exps(RAISES))
    assert find(j, "error", "jax:remat3", "ref:f64").model_dump() == verdict(
        "error", "jax:remat3", "ref:f64", "pass", error_type="RuntimeError", detail={"got": e.model_dump()})
    assert j.expectation_hits == {}
    # the same error at another stage, or another error type, is the rival's own
    for other in (err("RuntimeError", "f64 only", "backward"), err("TypeError", "f64 only", "forward")):
        j = judge(named_chain(), _raised(e, ref=ob("ref:f64", error=other)), Expectations([]))
        assert _err_verdict(j).status == "fail"
        j = judge(named_chain(), _raised(e, ref=ob("ref:f64", error=other)), exps(RAISES))
        assert _err_verdict(j).status == "fail" and _err_verdict(j).expectation == "e0"


def test_a_documented_error_of_the_program_excuses_missing_an_expected_one():
    e = err("RuntimeError", "another limitation", "forward")
    first = {"pipelines": ["jax:remat3"], "diverges": {"check": "error", "error_regex": "RuntimeError: another",
                                                       "reason": "comes first"}}
    j = judge(named_chain(), _raised(e), exps(RAISES, first))
    assert _err_verdict(j).model_dump() == verdict("error", "jax:remat3", "expectations", "expected",
                                                   error_type="RuntimeError", expectation="e1")
    # a diverges entry without an error_regex, of another check, or not matching, does not
    for d in ({"check": "error", "reason": "r"}, {"check": "gradient", "reason": "r"},
              {"check": "error", "error_regex": "ValueError", "reason": "r"}):
        j = judge(named_chain(), _raised(e), exps(RAISES, {"pipelines": ["jax:remat3"], "diverges": d}))
        assert _err_verdict(j).status == "fail" and _err_verdict(j).expectation == "e0"


def test_an_unexpected_error_fails_unless_a_diverges_entry_for_errors_excuses_it():
    e = err("RuntimeError", "boom", "backward")
    j = judge(named_chain(), _raised(e), Expectations([]))
    assert _err_verdict(j).model_dump() == verdict("error", "jax:remat3", "expectations", "fail",
                                                   error_type="RuntimeError", detail={
                                                       "got": e.model_dump(),
                                                       "status_differs_from": ["jax:remat2", "jax:none"]})
    for d in ({"check": "error", "reason": "r"}, {"check": "error", "reference": "expectations", "reason": "r"},
              {"check": "error", "error_regex": "^RuntimeError: bo+m$", "reason": "r"}):
        j = judge(named_chain(), _raised(e), exps({"pipelines": ["jax:remat3"], "diverges": d}))
        assert _err_verdict(j).model_dump() == verdict("error", "jax:remat3", "expectations", "expected",
                                                       error_type="RuntimeError", detail={"got": e.model_dump()},
                                                       expectation="e0"), d
        assert j.expectation_hits == {"e0": "fired"}
    for d in ({"check": "error", "reference": "jax:none", "reason": "r"},
              {"check": "error", "error_regex": "ValueError", "reason": "r"},
              {"check": "error", "error_regex": "boom: RuntimeError", "reason": "r"},
              {"check": "gradient", "reason": "r"}):
        j = judge(named_chain(), _raised(e), exps({"pipelines": ["jax:remat3"], "diverges": d}))
        assert _err_verdict(j).status == "fail", d
    # an entry whose error_regex does not match is passed over for the next
    j = judge(named_chain(), _raised(e), exps({"pipelines": ["jax:remat3"], "diverges": {
        "check": "error", "error_regex": "ValueError", "reason": "r"}}, {"pipelines": ["jax:remat3"], "diverges": {
            "check": "error", "reason": "r"}}))
    assert _err_verdict(j).status == "expected" and _err_verdict(j).expectation == "e1"
    # the first entry that applies excuses it
    gradient, error = (
        {"pipelines": ["jax:remat3"], "diverges": {"check": c, "reason": "r"}} for c in ("gradient", "error")
    )
    j = judge(named_chain(), _raised(e), exps(gradient, error, error))
    assert _err_verdict(j).expectation == "e1"
    # e0 matched the (skipped) gradient verdicts; e2 was never reached
    assert j.expectation_hits == {"e0": "idle", "e1": "fired"}


def test_a_pipeline_that_neither_raised_nor_was_expected_to_has_no_error_verdict():
    j = judge(named_chain(), _jax(), exps({"pipelines": ["jax:remat2"], "raises": {"type": "X", "regex": "y"}}))
    assert [v.pipeline for v in j.verdicts if v.check == "error"] == ["jax:remat2"]


# -- oracles.judge: status equivalence ---------------------------------------------------------
E = err("RuntimeError", "bad", "forward")


def test_a_rival_raising_what_its_references_raised_has_no_status_verdict_against_them():
    # ref:f64, jax:remat2 and jax:remat3 raise alike, jax:none does not
    o = _raised(E, ref=ob("ref:f64", error=E), **{"jax:remat2": ob("jax:remat2", error=E)})
    j = judge(named_chain(), o, Expectations([]))
    st = [v for v in j.verdicts if v.check == "error" and v.pipeline == "jax:remat3"]
    assert [v.model_dump() for v in st] == [
        verdict("error", "jax:remat3", "ref:f64", "pass", error_type="RuntimeError", detail={"got": E.model_dump()}),
        verdict("error", "jax:remat3", "jax:none", "fail", error_type="RuntimeError",
                detail={"got": E.model_dump(), "reference_error": None})]


def test_a_silent_rival_passes_where_its_references_error_is_itself_unexpected():
    # jax:remat2 raises the value reference's error (its verdict defers to ref:f64's, which fails)
    o = {"ref:f64": ob("ref:f64", error=E), "jax:none": ob("jax:none", G), "jax:remat2": ob("jax:remat2", error=E),
         "jax:remat3": ob("jax:remat3", G, res=[])}
    j = judge(named_chain(), o, Expectations([]))
    assert find(j, "error", "jax:remat3", "jax:remat2").model_dump() == verdict(
        "error", "jax:remat3", "jax:remat2", "pass", error_type="none",
        detail={"got": None, "reference_error": E.model_dump(),
                "reason": "jax:remat2's error is not expected: its own error verdict carries the finding"})
    # the reference's error expected by its own entry: the rival's silence is the finding
    j = judge(named_chain(), o, exps({"pipelines": ["jax:remat2", "ref:f64"], "diverges": {"check": "error",
                                                                                          "reason": "r"}}))
    v = find(j, "error", "jax:remat3", "jax:remat2")
    assert v.status == "fail" and v.detail == {"got": None, "reference_error": E.model_dump()}


def test_a_status_difference_declared_against_one_reference_is_not_declared_against_another():
    o = {"ref:f64": ob("ref:f64", G), "jax:none": ob("jax:none", error=E), "jax:remat2": ob("jax:remat2", error=E),
         "jax:remat3": ob("jax:remat3", G, res=[])}
    only_remat2 = {"pipelines": ["jax:remat3"], "diverges": {"check": "error", "reference": "jax:remat2",
                                                             "reason": "declared vs remat2"}}
    j = judge(named_chain(), o, exps(only_remat2))
    assert find(j, "error", "jax:remat3", "jax:remat2").model_dump() == verdict(
        "error", "jax:remat3", "jax:remat2", "expected", error_type="none", expectation="e0",
        detail={"got": None, "reference_error": E.model_dump()})
    # vs jax:none not declared; jax:none's error is itself a finding, so the silence passes
    assert find(j, "error", "jax:remat3", "jax:none").status == "pass"
    assert j.expectation_hits == {"e0": "fired"}
    # an error_regex declares it only for the error that was raised
    for rx, status in (("RuntimeError: bad", "expected"), ("ValueError", "pass")):
        d = {"pipelines": ["jax:remat3"], "diverges": {"check": "error", "error_regex": rx, "reason": "r"}}
        assert find(judge(named_chain(), o, exps(d)), "error", "jax:remat3", "jax:remat2").status == status


def test_a_rival_whose_own_error_verdict_fails_lists_the_differing_references_there():
    # jax:remat2 unsupported and a crashed jax:none have no error status: not listed
    for ref_obs in ({"jax:remat2": ob("jax:remat2", unsupported="no")},
                    {"jax:none": ob("jax:none", error=err("crash:SIGABRT", "", "forward"))}):
        o = _raised(E, **ref_obs)
        j = judge(named_chain(), o, Expectations([]))
        own = _err_verdict(j)
        differing = [r for r in ("jax:remat2", "jax:none") if r not in ref_obs]
        assert own.status == "fail" and own.detail["status_differs_from"] == differing
        assert not any(v.check == "error" and v.pipeline == "jax:remat3" and v.reference != "expectations"
                       for v in j.verdicts)


def test_a_crashed_or_unsupported_rival_has_no_status_verdicts():
    o = _raised(err("timeout", "", "forward"))
    j = judge(named_chain(), o, Expectations([]))
    assert [v.check for v in j.verdicts if v.pipeline == "jax:remat3" and v.reference in ("jax:remat2", "jax:none")
            and v.check in ("error", "timeout")] == []


# -- oracles.expectations ---------------------------------------------------------------------
MATCH = dict(pipeline="jax:remat3", versions={"jax": "0.12.0.1", "torch": "2.14.1"}, device="cpu",
             dtypes={"float32", "float64"}, features={"custom_vjp", "names"})


def _entry(**kw):
    return Entry.model_validate({"id": "e", "pipelines": ["jax:remat3"], "unsupported": {"reason": "r"}, **kw})


def test_an_entry_matches_on_every_key_at_once():
    e = _entry(pipelines=["torch:*", "jax:remat3"], versions={"jax": ">=0.12,<0.13"}, devices=["cpu", "cuda"],
               dtypes=["float32"], features=["custom_vjp"], absent_features=["nesting"])
    assert e.matches(**MATCH)
    assert not e.matches(**{**MATCH, "pipeline": "jax:remat3:jit"})         # globs match the whole name
    assert e.matches(**{**MATCH, "pipeline": "torch:eager-sac"})
    assert not e.matches(**{**MATCH, "pipeline": "Torch:eager-sac"})        # case-sensitive
    assert not e.matches(**{**MATCH, "versions": {"jax": "0.13.0"}})
    assert not e.matches(**{**MATCH, "versions": {"torch": "2.14.1"}})      # the framework's version unknown
    assert not e.matches(**{**MATCH, "versions": {"jax": "not a version"}})
    assert not e.matches(**{**MATCH, "device": "tpu"})
    assert not e.matches(**{**MATCH, "dtypes": {"float64"}})
    assert not e.matches(**{**MATCH, "features": {"names"}})
    assert not e.matches(**{**MATCH, "features": MATCH["features"] | {"nesting"}})
    # unset keys match anything
    bare = _entry()
    assert bare.matches(**{**MATCH, "versions": {}, "device": "tpu", "dtypes": set(), "features": set()})
    assert _entry(features=["custom_vjp", "names"]).matches(**MATCH)
    assert not _entry(features=["custom_vjp", "names", "nesting"]).matches(**MATCH)
    # flags: the run must have had them (an unset flag counts as False)
    needs = _entry(flags={"jax_custom_vjp3": False})
    assert needs.matches(**MATCH) and needs.matches(**MATCH, flags={"jax_remat3": True})
    assert not needs.matches(**MATCH, flags={"jax_custom_vjp3": True})
    on = _entry(flags={"jax_custom_vjp3": True})
    assert on.matches(**MATCH, flags={"jax_custom_vjp3": True}) and not on.matches(**MATCH)


def test_matching_passes_every_key_to_the_entries():
    exp = Expectations([_entry(id="a", versions={"jax": ">=0.12"}), _entry(id="b", devices=["cuda"]),
                        _entry(id="c", dtypes=["float32"]), _entry(id="d", features=["names"]),
                        _entry(id="z", pipelines=["torch:*"])])
    assert [e.id for e in exp.matching(**MATCH)] == ["a", "c", "d"]
    assert [e.id for e in exp.matching(**{**MATCH, "device": "cuda"})] == ["a", "b", "c", "d"]
    assert [e.id for e in exp.matching(**{**MATCH, "versions": {}, "dtypes": {"float64"}, "features": set()})] == []


def test_expectation_ids_are_unique():
    exp = Expectations([_entry(id="a"), _entry(id="b")])
    assert exp.source == "<memory>" and [e.id for e in exp.entries] == ["a", "b"]
    assert Expectations([], "here.json").source == "here.json"
    with pytest.raises(ExpectationsError) as e:
        Expectations([_entry(id="b"), _entry(id="a"), _entry(id="b"), _entry(id="a"), _entry(id="c")])
    assert (e.value.file, e.value.field, e.value.reason) == ("<memory>", "id", "duplicate ids ['a', 'b']")
    assert str(e.value) == "<memory>: id: duplicate ids ['a', 'b']"
    with pytest.raises(ExpectationsError) as e:
        Expectations([_entry(id="a"), _entry(id="a")], "f.json")
    assert e.value.file == "f.json"


def _load_error(tmp_path, text: str | bytes):
    f = tmp_path / "e.json"
    f.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ExpectationsError) as e:
        Expectations.load(f)
    assert e.value.file == str(f)
    assert str(e.value) == f"{f}: {e.value.field}: {e.value.reason}"
    return e.value.field, e.value.reason


def test_loading_names_the_file_field_and_reason(tmp_path):
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps({"schema_version": 1, "entries": [{"id": "a", "pipelines": ["*"],
                                                                 "unsupported": {"reason": "r"}}]}))
    exp = Expectations.load(ok)
    assert exp.source == str(ok) and [e.id for e in exp.entries] == ["a"]
    assert Expectations.load(str(ok)).source == str(ok)
    assert Expectations.load().source == str(DEFAULT_FILE)
    # schema_version may be left out; another one is refused
    ok.write_text(json.dumps({"entries": []}))
    assert Expectations.load(ok).entries == []
    assert _load_error(tmp_path, json.dumps({"schema_version": 2, "entries": []})) == (
        "schema_version", "2 is not readable (this harness reads 1)")
    for bad in ([], {"entries": {}}, {"entry": []}):
        assert _load_error(tmp_path, json.dumps(bad)) == ("entries", "expected an object with a list 'entries'")
    # an entry: its index and the field pydantic names
    entries = [{"id": "a", "pipelines": ["*"], "unsupported": {"reason": "r"}},
               {"id": "b", "pipelines": ["*"], "raises": {"type": "x"}}]
    field, reason = _load_error(tmp_path, json.dumps({"entries": entries}))
    assert field == "entries[1].raises.regex" and reason == "Field required"
    field, reason = _load_error(tmp_path, json.dumps({"entries": [{"id": "a", "pipelines": ["*"]}]}))
    assert field == "entries[0]" and "exactly one of raises, diverges, unsupported" in reason


def test_loading_refuses_unreadable_or_malformed_files(tmp_path):
    field, reason = _load_error(tmp_path, '{\n  "entries": [,]\n}')
    try:
        json.loads('{\n  "entries": [,]\n}')
    except json.JSONDecodeError as e:
        assert (field, reason) == (f"line {e.lineno}", e.msg) and e.lineno == 2
    assert _load_error(tmp_path, b"\xff\xfe{}") == ("<file>", "not UTF-8 text")
    assert _load_error(tmp_path, "[" * 100_000 + "]" * 100_000) == ("<file>", "nesting too deep")
    field, reason = _load_error(tmp_path, '{"entries": [], "n": ' + "1" * 5000 + "}")
    assert field == "<file>" and "digits" in reason
    missing_file = tmp_path / "absent.json"
    with pytest.raises(ExpectationsError) as e:
        Expectations.load(missing_file)
    assert (e.value.file, e.value.field, e.value.reason) == (str(missing_file), "<file>", "No such file or directory")


def test_stale_entries_name_why():
    exp = Expectations([
        Entry.model_validate({"id": "r", "pipelines": ["jax:remat3"], "raises": {"type": "X", "regex": "y"}}),
        Entry.model_validate({"id": "d", "pipelines": ["jax:*"], "diverges": {"check": "gradient", "reason": "r"}}),
        Entry.model_validate({"id": "u", "pipelines": ["jax:remat2"], "unsupported": {"reason": "r"}}),
        Entry.model_validate({"id": "t", "pipelines": ["torch:*"], "unsupported": {"reason": "r"}}),
        Entry.model_validate({"id": "f", "pipelines": ["jax:remat3"], "diverges": {"check": "gradient",
                                                                                   "reason": "r"}})])
    hits = {"r": Counter(idle=3), "d": Counter(idle=1), "f": Counter(fired=1, idle=2)}
    assert stale(exp, ["jax:remat3", "jax:remat2"], hits) == [
        {"id": "r", "kind": "raises", "why": "matched 3 programs but never raised"},
        {"id": "d", "kind": "diverges", "why": "matched 1 programs but the divergence no longer happens"},
        {"id": "u", "kind": "unsupported", "why": "never matched a program in this run"}]
    # entries for pipelines the run did not have are not stale
    assert stale(exp, ["torch:eager-sac"], {"t": Counter(fired=1)}) == []
    assert stale(exp, ["torch:eager-sac"], {}) == [{"id": "t", "kind": "unsupported",
                                                     "why": "never matched a program in this run"}]
    assert stale(exp, ["jax:remat2"], {"u": Counter(fired=2), "d": Counter(fired=1)}) == []


# -- conformance.engine.findings: signatures -------------------------------------------------------------
def test_incidental_features_and_per_op_features_do_not_sign():
    assert INCIDENTAL_FEATURES == {"float32", "float64", "unread_name", "dup_names", "layout", "reduction",
                                   "prevent_cse_false"}
    feats = sorted(INCIDENTAL_FEATURES) + ["op:sin", "op:matmul", "names", "checkpoint", "matmul", "checkpoint"]
    assert signature_features(feats) == ["checkpoint", "matmul", "names"]
    assert signature_features(set(INCIDENTAL_FEATURES)) == []
    # only the op: prefix marks a per-op feature
    assert signature_features(["nop:x", "op"]) == ["nop:x", "op"]
    assert signature("residuals", "jax:remat3", "jax:remat2", "missing", feats) == \
        "residuals|jax:remat3|jax:remat2|missing|checkpoint+matmul+names"
    assert signature("error", "p", "expectations", "", ["b", "a"]) == "error|p|expectations|-|a+b"
    assert signature("error", "p", "expectations", None, []) == "error|p|expectations|-|"


# -- conformance.engine.search: one behaviour, one finding ---------------------------------------------
K = ("residuals", "jax:remat3", "jax:remat2", "other")
SIBLING = ("residuals", "jax:remat3:jit", "jax:remat2:jit", "other")


def _finding(key=K, features=("checkpoint", "policy:nothing"), reproduces=(), count=1, **kw):
    check, pipeline, reference, et = key
    return Finding(signature=signature(check, pipeline, reference, et, features), check=check, pipeline=pipeline,
                   reference=reference, error_type=et, features=list(features), program={}, program_hash="0" * 16,
                   reproduces=[list(k) for k in reproduces], count=count, **kw)


def test_core_features_are_the_signing_features():
    f = _finding(features=("checkpoint", "float32", "op:sin", "names"))
    assert f.core_features() == {"checkpoint", "names"}


def test_same_behaviour_same_key_needs_nested_core_features():
    a = _finding(features=("checkpoint", "policy:nothing"))
    b = _finding(features=("checkpoint", "policy:nothing", "nesting", "float64"))
    c = _finding(features=("checkpoint", "scan"))
    assert same_behaviour(a, b) and same_behaviour(b, a) and same_behaviour(a, a)
    assert not same_behaviour(a, c) and not same_behaviour(c, b)
    # a policy kind is a variant of the root, not another behaviour
    assert same_behaviour(a, _finding(features=("checkpoint", "policy:dots")))
    # incidental features do not make feature sets differ
    assert same_behaviour(a, _finding(features=("checkpoint", "policy:nothing", "float32", "op:cos")))


def test_same_behaviour_across_keys_needs_each_to_reproduce_the_other():
    a = _finding(K, reproduces=[SIBLING])
    b = _finding(SIBLING, reproduces=[K])
    assert same_behaviour(a, b) and same_behaviour(b, a)
    # twins of one family with the same root features are one root even one-sided; with other
    # root features, only siblings that reproduce each other are
    assert same_behaviour(a, _finding(SIBLING))
    assert not same_behaviour(a, _finding(SIBLING, features=("checkpoint", "scan")))
    assert not same_behaviour(_finding(K), _finding(SIBLING, features=("custom_vjp",)))
    # across keys features need not nest
    assert same_behaviour(a, _finding(SIBLING, features=("custom_vjp",), reproduces=[K]))


def test_merge_adds_a_new_behaviour():
    fs = [_finding(features=("checkpoint", "scan"))]
    f = _finding()
    assert merge_finding(fs, f) == (f, True)
    assert fs[1] is f and f.count == 1 and len(fs) == 2


def test_merge_folds_an_instance_into_the_standing_finding():
    g = _finding(count=3, reproduces=[SIBLING])
    other = _finding(features=("checkpoint", "scan"))
    fs = [other, g]
    third = ("residuals", "jax:remat3+cvjp3", "jax:remat2", "other")
    f = _finding(features=("checkpoint", "policy:nothing", "nesting"), reproduces=[SIBLING, third])
    assert merge_finding(fs, f) == (g, False)
    assert fs == [other, g] and g.count == 4 and other.count == 1
    assert g.reproduces == [list(SIBLING), list(third)]        # each key once, in order
    # an instance with the same core features does not replace it either
    same = _finding()
    assert merge_finding(fs, same) == (g, False) and g.count == 5


def test_merge_keeps_the_smaller_program_of_one_key():
    g = _finding(features=("checkpoint", "policy:nothing", "nesting"), count=2, reproduces=[SIBLING])
    other = _finding(features=("checkpoint", "scan"))
    fs = [other, g]
    third = ("residuals", "jax:remat3+cvjp3", "jax:remat2", "other")
    f = _finding(features=("checkpoint", "policy:nothing"), reproduces=[third])
    assert merge_finding(fs, f) == (f, True)
    assert fs == [other, f] and fs[1] is f
    assert f.count == 3 and f.reproduces == [list(SIBLING), list(third)]
    if "tracked" in Finding.model_fields:     # a tracked behaviour stays tracked
        h = _finding(features=("checkpoint", "policy:nothing", "nesting"), tracked="tests/regressions/x.json")
        fs = [h]
        assert merge_finding(fs, f2 := _finding()) == (f2, True) and fs[0].tracked == "tests/regressions/x.json"


def test_merge_folds_a_sibling_without_replacing_it():
    g = _finding(K, features=("checkpoint", "policy:nothing", "nesting"), reproduces=[SIBLING])
    f = _finding(SIBLING, features=("checkpoint",), reproduces=[K])
    fs = [g]
    assert merge_finding(fs, f) == (g, False)
    assert fs == [g] and g.count == 2 and g.reproduces == [list(SIBLING), list(K)]


def test_merge_uses_the_first_finding_of_the_behaviour():
    a = _finding(features=("checkpoint", "policy:nothing", "x"))
    b = _finding(features=("checkpoint", "policy:nothing", "y"))
    f = _finding(features=("checkpoint", "policy:nothing", "x", "y", "z"))
    fs = [a, b]
    assert merge_finding(fs, f) == (a, False) and a.count == 2 and b.count == 1


def _searcher(findings, shrinks=None, max_shrinks=3):
    opts = SimpleNamespace(pipelines=[], max_shrinks_per_key=max_shrinks, shares=None)
    return Searcher(opts, None, None, lambda ev: None, findings, set(), Counter(shrinks or {}), lambda **_: False)


def _v(key=K):
    return Verdict(check=key[0], pipeline=key[1], reference=key[2], status="fail", error_type=key[3])


def test_known_same_key_and_the_findings_root_features():
    f = _finding(features=("checkpoint", "names", "policy:nothing", "float32"))
    s = _searcher([f])
    assert s.known(_v(), {"checkpoint", "names", "policy:nothing"}, {K}) is f
    assert s.known(_v(), {"checkpoint", "names", "policy:dots"}, {K}) is f    # a policy kind is a variant
    assert s.known(_v(), {"checkpoint", "policy:nothing"}, {K}) is None       # lacks a root feature
    feats = {"checkpoint", "names", "policy:nothing"}
    assert s.known(_v(SIBLING), feats, {K, SIBLING}) is f      # a twin, the finding's own pipeline failing too
    assert s.known(_v(SIBLING), feats, {SIBLING}) is None      # only the twin fails: shrunk once
    # the first finding whose root features the program has
    g = _finding(features=("checkpoint",))
    assert _searcher([g, f]).known(_v(), feats, {K}) is g


def test_known_a_sibling_key_with_the_findings_own_key_failing():
    f = _finding(reproduces=[SIBLING])
    s = _searcher([f])
    feats = {"checkpoint", "policy:nothing"}
    assert s.known(_v(SIBLING), feats, {K, SIBLING}) is f
    assert s.known(_v(SIBLING), feats, {SIBLING}) is f          # a twin its shrunk program reproduces on
    assert s.known(_v(SIBLING), {"checkpoint"}, {K, SIBLING}) is f
    assert s.known(_v(SIBLING), {"scan"}, {K, SIBLING}) is None


def test_known_after_the_shrink_limit_counts_under_the_closest_finding():
    a = _finding(features=("checkpoint", "names", "policy:nothing"))
    b = _finding(features=("checkpoint", "policy:ops", "nested_checkpoint", "depth3", "while_loop"))
    c = _finding(features=("checkpoint", "policy:dots", "nested_checkpoint", "scan"))
    feats = {"checkpoint", "policy:save_only_names", "nested_checkpoint"}
    assert _searcher([a, b, c], {K: 2}).known(_v(), feats, {K}) is None
    # b and c share 2 core features with the program; c has fewer extras
    assert _searcher([a, b, c], {K: 3}).known(_v(), feats, {K}) is c
    assert _searcher([a, b, c], {K: 4}).known(_v(), feats, {K}) is c
    # never shrunk: not at the limit, even at a limit of 1
    assert _searcher([a], {}, max_shrinks=1).known(_v(), {"checkpoint"}, {K}) is None
    assert _searcher([a], {K: 1}, max_shrinks=1).known(_v(), {"checkpoint"}, {K}) is a
    # no finding of that key: nothing to count it under
    assert _searcher([_finding(SIBLING)], {K: 9}).known(_v(), feats, {K}) is None


# -- JAX's residual report against the closure -----------------------------------------------------
def _reported(obs_residuals, report, error=None):
    from conformance.ir.observation import ReportedResidual
    return Observation(pipeline="jax:remat3:jit", residuals=obs_residuals, grads={}, outputs=[],
                       residual_report=None if report is None else [ReportedResidual(**r) for r in report],
                       residual_report_error=error)


def test_residual_report_oracle_each_symptom():
    from oracles import residual_report
    a = Residual(cls=["na", "s"], names=["a"], shape=[2, 2], dtype="float64", bytes=32, copies=2)
    b = Residual(cls=["x"], shape=[2, 3], dtype="float64", bytes=48)
    row = lambda shape, name=None, dtype="float64": {"shape": shape, "dtype": dtype, "name": name,
                                                     "source": f"named '{name}' from f" if name else "output of sin"}
    good = [row([2, 2], "a"), row([2, 2]), row([2, 3])]
    assert residual_report.check(_reported([a, b], good)).status == "pass"
    # a saved value carries a name that the report does not print (saved as its producer): fine
    assert residual_report.check(_reported([a, b], [row([2, 2]), row([2, 2]), row([2, 3])])).status == "pass"
    v = residual_report.check(_reported([a, b], good[:2]))
    assert (v.status, v.error_type, v.reference) == ("fail", "count", "vjp")
    assert v.detail["missing_from_report"] == ["float64[6 elements]"] and v.detail["extra_in_report"] == []
    # copies of one class saved in two layouts (a value and its squeeze) count by element count
    c = Residual(cls=["v"], shape=[1, 2, 4], dtype="float32", bytes=32, copies=2)
    assert residual_report.check(_reported([c], [row([1, 2, 4], dtype="float32"), row([2, 4], dtype="float32")])
                                 ).status == "pass"
    v = residual_report.check(_reported([a, b], [row([2, 2], "a"), row([2, 2], "a"), row([2, 3], "a")]))
    assert (v.status, v.error_type) == ("fail", "names")
    assert v.detail["names"] == {"a": {"printed": 3, "saved": 2}}
    v = residual_report.check(_reported([a, b], None, "AssertionError: "))
    assert (v.status, v.error_type) == ("fail", "AssertionError")
    assert residual_report.check(_reported([a, b], None)).status == "skipped"
    assert residual_report.check(_reported(None, good)).status == "skipped"


def test_trace_count_oracle_judges_growth_in_one_execution_mode():
    from oracles import trace_counts
    log = lambda p, f, b: CustomRuleLog(primal_traces=p, fwd_traces=f, bwd_calls=b)
    ref = Observation(pipeline="jax:remat2", custom_rules={"body[0]": log(1, 1, 1), "body[1]": log(0, 1, 1)})
    same = Observation(pipeline="jax:remat3", custom_rules={"body[0]": log(1, 1, 1), "body[1]": log(0, 1, 1)})
    assert trace_counts.compare(same, ref, True).status == "pass"
    fewer = Observation(pipeline="jax:remat3", custom_rules={"body[0]": log(0, 1, 1), "body[1]": log(0, 1, 1)})
    assert trace_counts.compare(fewer, ref, True).status == "pass"
    more = Observation(pipeline="jax:remat3", custom_rules={"body[0]": log(2, 1, 1), "body[1]": log(0, 2, 1)})
    v = trace_counts.compare(more, ref, True)
    assert (v.status, v.error_type, v.reference) == ("fail", "fwd_traces+primal_traces", "jax:remat2")
    assert v.detail["blocks"] == {
        "body[0]": {"primal_traces": {"got": 2, "reference": 1}, "total": {"got": 3, "reference": 2}},
        "body[1]": {"fwd_traces": {"got": 2, "reference": 1}, "total": {"got": 2, "reference": 1}},
    }
    assert trace_counts.compare(more, ref, False).status == "skipped"
    # a fwd rule that runs where the reference's never ran is custom_rule's fwd_ran, not a count
    idle = Observation(pipeline="jax:remat2", custom_rules={"body[0]": log(1, 0, 0)})
    ran = Observation(pipeline="jax:remat3", custom_rules={"body[0]": log(1, 1, 1)})
    assert trace_counts.compare(ran, idle, True).status == "pass"
    raised = Observation(pipeline="jax:remat3", error=ErrorInfo(type="E", message="m", stage="forward"))
    assert trace_counts.compare(raised, ref, True).status == "skipped"
    # a custom_jvp in a custom_vjp fwd runs each time that fwd runs: its growth is the fwd's
    ref = Observation(pipeline="jax:remat2", custom_rules={"body[0]": log(0, 1, 1), "body[0].fwd[0]": log(1, 0, 0)})
    both = Observation(pipeline="jax:remat3", custom_rules={"body[0]": log(0, 2, 1), "body[0].fwd[0]": log(2, 0, 0)})
    v = trace_counts.compare(both, ref, True)
    assert (v.status, v.error_type) == ("fail", "fwd_traces")
    assert v.detail == {
        "blocks": {"body[0]": {"fwd_traces": {"got": 2, "reference": 1}, "total": {"got": 2, "reference": 1}}},
        "explained": {
            "body[0].fwd[0]": {"primal_traces": {"got": 2, "reference": 1}, "total": {"got": 2, "reference": 1}}
        },
    }
    # ...but not where only the outer block's bwd ran more (bwd does not run fwd's code), nor a sibling path
    bwd_only = Observation(
        pipeline="jax:remat3", custom_rules={"body[0]": log(0, 1, 2), "body[0].fwd[0]": log(2, 0, 0)}
    )
    assert trace_counts.compare(bwd_only, ref, True).error_type == "bwd_calls+primal_traces"
    ref10 = Observation(pipeline="jax:remat2", custom_rules={"body[1]": log(0, 1, 1), "body[10]": log(1, 0, 0)})
    sib = Observation(pipeline="jax:remat3", custom_rules={"body[1]": log(0, 2, 1), "body[10]": log(2, 0, 0)})
    assert trace_counts.compare(sib, ref10, True).error_type == "fwd_traces+primal_traces"


def test_trace_count_oracle_judges_the_total_runs_of_a_blocks_code_not_each_counter():
    from oracles import trace_counts
    log = lambda p, f, b, r=0: CustomRuleLog(primal_traces=p, fwd_traces=f, bwd_calls=b, rem_traces=r)
    ref = Observation(pipeline="jax:remat2", custom_rules={"body[0]": log(2, 1, 1)})
    # traces that only moved between primal and fwd (remat2: primal 2, fwd 1; remat3+cvjp3: 1, 2): no growth
    moved = Observation(pipeline="jax:remat3+cvjp3", custom_rules={"body[0]": log(1, 2, 1)})
    assert trace_counts.compare(moved, ref, True).status == "pass"
    # ...nor into a rem rule, nor moved and fewer in all
    assert trace_counts.compare(Observation(pipeline="jax:remat3+cvjp3", custom_rules={"body[0]": log(1, 1, 1, 1)}),
                                ref, True).status == "pass"
    assert trace_counts.compare(Observation(pipeline="jax:remat3", custom_rules={"body[0]": log(0, 2, 1)}),
                                ref, True).status == "pass"
    # a moved and grown total fails, naming the counters that grew, with every differing counter and the totals
    grown = Observation(pipeline="jax:remat3+cvjp3", custom_rules={"body[0]": log(1, 3, 1)})
    v = trace_counts.compare(grown, ref, True)
    assert (v.status, v.error_type) == ("fail", "fwd_traces")
    assert v.detail == {"blocks": {"body[0]": {"primal_traces": {"got": 1, "reference": 2},
                                               "fwd_traces": {"got": 3, "reference": 1},
                                               "total": {"got": 4, "reference": 3}}}}
    # bwd runs other code: its growth is not offset by fewer primal runs
    bwd = Observation(pipeline="jax:remat3", custom_rules={"body[0]": log(1, 1, 2)})
    v = trace_counts.compare(bwd, ref, True)
    assert (v.status, v.error_type) == ("fail", "bwd_calls")
    assert v.detail["blocks"]["body[0]"] == {
        "primal_traces": {"got": 1, "reference": 2},
        "bwd_calls": {"got": 2, "reference": 1},
        "total": {"got": 2, "reference": 3},
    }
    # a fwd that runs where the reference's never ran stays custom_rule's fwd_ran, out of both totals
    idle = Observation(pipeline="jax:remat2", custom_rules={"body[0]": log(2, 0, 0)})
    assert trace_counts.compare(Observation(pipeline="jax:remat3", custom_rules={"body[0]": log(2, 3, 1)}),
                                idle, True).status == "pass"
    # an inner block is judged on its own total where the outer block's traces only moved
    ref = Observation(pipeline="jax:remat2", custom_rules={"body[0]": log(2, 1, 1), "body[0].fwd[0]": log(2, 1, 0)})
    both_moved = Observation(pipeline="jax:remat3+cvjp3", custom_rules={"body[0]": log(1, 2, 1),
                                                                        "body[0].fwd[0]": log(1, 2, 0)})
    assert trace_counts.compare(both_moved, ref, True).status == "pass"
    inner = Observation(
        pipeline="jax:remat3+cvjp3", custom_rules={"body[0]": log(1, 2, 1), "body[0].fwd[0]": log(2, 2, 0)}
    )
    v = trace_counts.compare(inner, ref, True)
    assert (v.status, v.error_type, list(v.detail["blocks"])) == ("fail", "fwd_traces", ["body[0].fwd[0]"])


def test_min_elements_policy_decides_by_the_first_inputs_size_in_every_adapter():
    from conformance.ir.policy import Both, MinElements, decide, thresholds
    from conformance.pipelines.jax import table as jax_table
    from conformance.pipelines.torch import table as torch_table
    p = prog(
        [
            region(
                ["x", "y"],
                [
                    op("sin", ["x"], "a"),
                    op("sin", ["a"], "b"),
                    op("sin", ["y"], "c"),
                    op("sin", ["c"], "d"),
                    op("sum", ["b"], "e", axis=None),
                    op("sum", ["d"], "f", axis=None),
                    op("add", ["e", "f"], "g"),
                ],
                ["g"],
                {"kind": "min_elements", "elements": 4},
            )
        ],
        inputs=[
            {"id": "x", "shape": [4], "dtype": "float64", "diff": True},
            {"id": "y", "shape": [2], "dtype": "float64", "diff": True},
        ],
        outputs=["g"],
    )
    # sin(x) reads 4 elements: saveable; sin(y) reads 2: must be recomputed
    assert residuals.check_policy(p, ob("p", res=[R(["a"]), R(["b"])])).status == "pass"
    v = residuals.check_policy(p, ob("p", res=[R(["c"])]))
    assert v.status == "fail" and v.detail["saved_against_policy"] == ["c:float64[3]"]
    pol = Both(a=MinElements(elements=4), b=MinElements(elements=8))
    assert [decide(pol, "sin", None, False, n) for n in (None, 3, 4, 8)] == ["recompute", "recompute", "save", "save"]
    assert thresholds(pol) == [4, 8]
    table = torch_table.region_decisions(MinElements(elements=4), ["a"])
    assert table["bounds"] == [4]
    assert (table[("sin", False, 0)], table[("sin", False, 1)]) == ("recompute", "save")
    assert (table[("name", "a", 0)], table[("name", "a", 1)]) == ("recompute", "save")
    assert jax_table.policy_source(pol) == "cp.save_from_both_policies(save_min_elements(4), save_min_elements(8))"


# torch:compile-aot_eager, the CI gate's torch campaign (found while adding pipelines): the
# partitioner computed cos(v) for sin(v) in the forward and saved it; cos(0) = 1 = exp(0), a dead
# value in a scan under a recompute policy. Factors of ops in scan bodies are per iteration.
SCAN_FACTOR = prog([{"kind": "scan", "args": ["x", "x"], "carry": ["c"], "xs": [], "length": 2,
                     "body": [region(["x", "c"], [op("exp", ["x"], "e"), op("sin", ["c"], "y")], ["y"],
                                     {"kind": "nothing"})],
                     "carry_out": ["y"], "ys": ["y"], "results": ["cf", "ys"]}], outputs=["ys"])
SCAN_VALUES = {"x": [0.0] * 3, "c@0": [0.0] * 3, "e@0": [1.0] * 3, "y@0": [0.0] * 3,
               "c@1": [0.0] * 3, "e@1": [1.0] * 3, "y@1": [0.0] * 3, "cf": [0.0] * 3, "ys": [[0.0] * 3] * 2}


def test_a_partitioners_saved_factor_of_a_region_op_is_not_blamed():
    ref = ob("ref:f64", G, values=SCAN_VALUES)
    saved = [R(["e@0", "e@1"])]   # 1.0: exp(0), and cos(0), the factor of sin(c@i)
    v = residuals.check_policy(SCAN_FACTOR, ob("torch:compile-aot_eager", res=saved), ref)
    assert v.status == "pass", v.detail
    # eager SAC runs the policy's decision for every op it records: the same saved value is blamed
    v = residuals.check_policy(SCAN_FACTOR, ob("torch:eager-sac", res=saved), ref)
    assert v.status == "fail" and v.detail["saved_against_policy"] == ["e@0/e@1:float64[3]"]
    # and a value equal to no factor is blamed under the partitioner too
    other = {**SCAN_VALUES, "e@0": [2.0] * 3, "e@1": [2.0] * 3}
    assert residuals.check_policy(SCAN_FACTOR, ob("torch:compile-aot_eager", res=saved),
                                  ob("ref:f64", G, values=other)).status == "fail"


def test_a_saved_dropout_mask_equal_to_a_region_value_is_not_blamed_on_jax():
    """make run: JAX's dropout multiplies by a constant mask its vjp keeps; seed 2 on two elements
    draws a mask of zeros, equal to the dropout's output, which the policy recomputes."""
    from conformance.ir.ops import dropout_mask
    p = prog([region(["x"], [op("dropout", ["x"], "d", p=0.5, seed=2), op("cos", ["d"], "y")], ["y"],
                     {"kind": "nothing"})], inputs=[{"id": "x", "shape": [2], "dtype": "float32", "diff": True}])
    assert not dropout_mask([2], 0.5, 2).any()
    ref = ob("ref:f64", G, values={"x": [0.3, -0.5], "d": [0.0, 0.0], "y": [1.0, 1.0]})
    saved = [R(["d"], shape=(2,), dtype="float32", nbytes=8)]
    assert residuals.check_policy(p, ob("jax:remat2", res=saved), ref).status == "pass"
    # a mask the program's draws do not give is still blamed
    other = ob("ref:f64", G, values={"x": [0.3, -0.5], "d": [0.6, 0.0], "y": [1.0, 1.0]})
    assert residuals.check_policy(p, ob("jax:remat2", res=saved), other).status == "fail"


# ---- what a verdict differed by (the gate's snapshot and the corpus tests compare these) -----
def test_what_differed_keeps_the_behaviour_and_drops_numbers_context_and_tracebacks():
    from conformance.engine.findings import detail_digest, what_differed
    d = {"mode": "tight", "value": "grad[x]", "got": 1.5, "want": 2.0, "count": 3, "flag": True, "none": None,
         "observations": {"jax:remat3": {"saved": ["x"]}}, "note": "n", "status_differs_from": ["a"],
         "also_differs_from": ["b"],
         "blocks": [{"message": "boom  at 0x7f00ab\nfrom user code:\n  File \"/a/b.py\", line 3\nTip: x"}],
         "tail": "one\nTip: advice", "torch": "x\nSet TORCH_LOGS=+dynamo", "ellipsis": "object at 0x\u2026 ok"}
    assert what_differed(d) == {"blocks": [{"message": "boom at 0x?"}], "count": 3, "ellipsis": "object at 0x? ok",
                                "flag": True, "got": "<float>", "mode": "tight", "none": None, "tail": "one",
                                "torch": "x", "value": "grad[x]", "want": "<float>"}
    assert list(what_differed({"b": 1, "a": 2})) == ["a", "b"] and what_differed((1.0, "a")) == ["<float>", "a"]
    same = {**d, "got": 9.0, "note": "other", "observations": {},
            "blocks": [{"message": "boom at 0x1\nfrom user code:"}]}
    assert detail_digest(same) == detail_digest(d) and len(detail_digest(d)) == 12
    for other in ({**d, "mode": "loose"}, {**d, "count": 4}, {**d, "value": "grad[y]"},
                  {k: d[k] for k in d if k != "flag"}):
        assert detail_digest(other) != detail_digest(d), other


def test_residuals_digest_reads_class_names_dtype_shape_and_copies():
    from conformance.engine.findings import residuals_digest

    def r(**kw):
        return Residual(**{"cls": ["x0"], "names": [], "shape": [2], "dtype": "float32", "bytes": 8, **kw})
    base = [r(), r(cls=["v1", "v2"], names=["a"])]
    assert residuals_digest(base) == residuals_digest(list(reversed(base))) and len(residuals_digest(base)) == 12
    assert residuals_digest([r(), r(cls=["v1", "v2"], names=["a"], bytes=99, memory="pinned_host")]) == \
        residuals_digest(base)   # bytes and memory kinds are compared by their own oracles
    for other in ([r()], [r(cls=[]), base[1]], [r(names=["n"]), base[1]], [r(dtype="float16"), base[1]],
                  [r(shape=[1, 2]), base[1]], [r(copies=2), base[1]], [r(cls=["x1"]), base[1]]):
        assert residuals_digest(other) != residuals_digest(base), other


def test_memory_budget_oracle_each_outcome():
    from oracles import memory_budget as MB

    def run(name, graphs, budget=None, **kw):
        flags = {"partitioner_saved": graphs} if graphs is not None else {}
        if budget is not None:
            flags["activation_memory_budget"] = budget
        return Observation(pipeline=name, flags=flags, residuals=[], **kw)
    g = [[["a", [2], 8], ["b", [2], 8]], [["c", [1], None]]]
    assert MB.saved_bytes(run("p", g)) == [16, 0]
    assert MB.saved_bytes(run("p", None)) is None and MB.saved_bytes(run("p", [[["a", [2]]]])) is None
    assert MB.saved_bytes(run("p", [])) is None
    low, high = run("low", g, 0.5), run("high", [[["a", [2], 8], ["b", [2], 8]], [["c", [1], 4]]])
    v = MB.compare(low, high)
    assert (v.status, v.check, v.pipeline, v.reference) == ("pass", "residuals", "low", "high")
    assert v.detail == {"saved_bytes": [16, 0], "reference_saved_bytes": [16, 4], "budget": 0.5,
                        "reference_budget": 1.0}
    v = MB.compare(high, low)
    assert (v.status, v.error_type) == ("fail", MB.SYMPTOM) and v.detail["budget"] == 1.0
    equal = MB.compare(low, run("same", g))
    assert equal.status == "pass"   # equal bytes: not more
    v = MB.compare(low, run("one-graph", [[["a", [2], 8]]]))
    assert v.status == "skipped" and "compiled 2 and 1 graphs" in v.detail["reason"] and v.detail["budget"] == 0.5
    v = MB.compare(run("none", None), low)
    assert v.status == "skipped" and "compiled 0 and 2 graphs" in v.detail["reason"]
    err = Observation(pipeline="err", flags={"partitioner_saved": g}, residuals=None,
                      error=ErrorInfo(type="E", message="m", stage="forward"))
    v = MB.compare(err, low)
    assert v.status == "skipped" and v.detail == {"reason": "err raised E (forward)"}


# -- exact details the reports show, and the edges of the newer oracles ---------------------------
def test_residual_report_details_are_what_reports_show():
    from oracles import residual_report
    a = Residual(cls=["na", "s"], names=["a"], shape=[2, 2], dtype="float64", bytes=32, copies=2)
    v = residual_report.check(_reported([a], None, "AssertionError: x: y"))
    assert (v.status, v.error_type) == ("fail", "AssertionError")
    assert v.detail == {"got": {"type": "AssertionError", "message": "AssertionError: x: y"},
                        "saved": ["na/s['a']:float64[2, 2]"]}
    v = residual_report.check(_reported([a], None))
    assert v.detail == {"reason": "jax:remat3:jit records no residual report"}
    row = {"shape": [2, 2], "dtype": "float64", "name": "a", "source": "named 'a' from f"}
    v = residual_report.check(_reported([a], [row]))   # two copies saved, one listed, printed once
    assert v.detail == {"missing_from_report": ["float64[4 elements]"], "extra_in_report": [],
                        "report": ["float64[2, 2] named 'a' from f"], "saved": ["na/s['a']:float64[2, 2]"]}
    # a name printed as often as it is saved is right; once more is wrong
    assert residual_report.check(_reported([a], [row, row])).status == "pass"
    v = residual_report.check(_reported([a], [row, row, row]))
    assert v.error_type == "count" and v.detail["names"] == {"a": {"printed": 3, "saved": 2}}
    # the arrays as saved, where recorded, are what the report is compared with
    o = _reported([a], [row, row])
    o.saved_arrays = [(4, "float64")]
    v = residual_report.check(o)
    assert v.detail["extra_in_report"] == ["float64[4 elements]"]
    o.saved_arrays = [(4, "float64"), (4, "float64")]
    assert residual_report.check(o).status == "pass"


def test_trace_count_oracle_skips_with_its_reason_and_reads_blocks_both_sides_have():
    from oracles import trace_counts
    log = CustomRuleLog(primal_traces=1, fwd_traces=1, bwd_calls=1)
    ref = Observation(pipeline="jax:remat2", custom_rules={"body[0]": log})
    v = trace_counts.compare(Observation(pipeline="jax:remat3:jit", custom_rules={"body[0]": log}), ref, False)
    assert v.detail == {"reason": "jax:remat3:jit and jax:remat2 run in different execution modes (eager, jit)"}
    failed = Observation(pipeline="jax:remat2", error=ErrorInfo(type="E", message="m", stage="forward"))
    v = trace_counts.compare(Observation(pipeline="jax:remat3", custom_rules={"body[0]": log}), failed, True)
    assert (v.status, v.detail) == ("skipped", {"reason": "jax:remat2 raised E (forward)"})
    # a block only one side logged is not compared (it ran on one side only: custom_rule's business)
    extra = Observation(pipeline="jax:remat3", custom_rules={"body[0]": log, "body[1]": log})
    assert trace_counts.compare(extra, ref, True).status == "pass"


def test_memory_budget_reads_both_runs():
    from oracles import memory_budget as MB
    g = [[["a", [2], 8]]]
    low = Observation(pipeline="low", flags={"partitioner_saved": g, "activation_memory_budget": 0.5}, residuals=[])
    ref = Observation(pipeline="ref", flags={"partitioner_saved": g, "activation_memory_budget": 0.8}, residuals=None,
                      error=ErrorInfo(type="E", message="m", stage="forward"))
    v = MB.compare(low, ref)
    assert (v.status, v.detail) == ("skipped", {"reason": "ref raised E (forward)"})
    ref.error, ref.residuals = None, []
    assert MB.compare(low, ref).detail["reference_budget"] == 0.8


def test_view_saved_in_another_layout_fails_the_policy_check():
    """A view a policy saves must be saved as itself: equal only modulo layout is a failure."""
    p = prog([region(["x"], [op("transpose", ["x"], "t", perm=[1, 0]), op("sin", ["t"], "s"), op("cos", ["s"], "y")],
                     ["y"], {"kind": "ops", "ops": ["transpose", "sin"]})],
             inputs=[{"id": "x", "shape": [2, 3], "dtype": "float64", "diff": True}])

    def saved(cls, shape, exact=(), n=6):
        return Residual(cls=cls, shape=shape, dtype="float64", bytes=8 * n, exact=list(exact))
    v = residuals.check_policy(p, ob("jax:remat2", res=[saved(["t"], [2, 3]), saved(["x"], [2, 3], ["x"])]))
    assert (v.status, v.error_type) == ("fail", "view_layout")
    assert v.detail == {"view_in_another_layout": ["t:float64[2, 3] equals the saved view(s) ['t'] only in another "
                                                   "layout"],
                        "saved": ["t:float64[2, 3]", "x:float64[2, 3]"]}
    # the same class saved as itself, or a non-view op's value in another layout, or one element: fine
    for res in ([saved(["t"], [3, 2], ["t"])], [saved(["s"], [2, 3])], [saved(["t"], [1], n=1)]):
        assert residuals.check_policy(p, ob("jax:remat2", res=res)).status == "pass", res
    # several saved arrays: each is judged (the first being fine does not end the check)
    v = residuals.check_policy(p, ob("jax:remat2", res=[saved(["x"], [2, 3], ["x"]), saved(["t"], [2, 3])]))
    assert v.error_type == "view_layout" and len(v.detail["view_in_another_layout"]) == 1
    # a partitioner may save any layout of what the backward reads
    assert residuals.check_policy(p, ob("torch:compile-aot_eager", res=[saved(["t"], [2, 3])])).status == "pass"
    # a view the policy does not save is recomputed: its layout is not the policy's business
    q = prog([region(["x"], [op("transpose", ["x"], "t", perm=[1, 0]), op("sin", ["t"], "y")], ["y"],
                     {"kind": "ops", "ops": ["sin"]})],
             inputs=[{"id": "x", "shape": [2, 3], "dtype": "float64", "diff": True}])
    v = residuals.check_policy(q, ob("jax:remat2", res=[saved(["t"], [2, 3])]))
    assert v.error_type != "view_layout"


def test_error_root_blanks_numbers_and_addresses_and_needs_a_telling_message():
    from conformance.engine.findings import error_root
    got = {"type": "ValueError", "message": "Expected float32[2, 3] at 0xAbC12\n\n  got 17 items\nthird line"}
    assert error_root({"got": got}) == "ValueError: Expected floatN[N] at N / got N items"
    assert error_root({"got": {"message": "a much longer message"}}) == ": a much longer message"
    assert error_root({"got": {"type": "E", "message": "short words"}}) is None        # 11 characters
    assert error_root({"got": {"type": "E", "message": "twelve chars"}}) == "E: twelve chars"
    assert error_root({"got": {"type": "E", "message": "x" * 300}}) == "E: " + "x" * 240
    assert error_root({"got": None}) is None and error_root("not a dict") is None
    assert error_root({"got": {"type": "E", "message": 3}}) is None


def test_detail_digest_takes_values_json_cannot_write():
    from conformance.engine.findings import detail_digest
    assert detail_digest({"a": {1, 2}}) == detail_digest({"a": {1, 2}}) != detail_digest({"a": {1}})
    assert detail_digest({"n": np.int64(3)}) != detail_digest({"n": np.int64(4)})


def test_root_dedup_edges():
    from conformance.engine.roots import _same_label, is_variant_feature, nested_roots, residual_direction, root_key
    assert is_variant_feature("op:sin") and not is_variant_feature("scan")
    assert _same_label("trace_count", "fwd_traces+bwd_calls", "bwd_calls")
    assert not _same_label("trace_count", "fwd_traces", "bwd_calls") and not _same_label("residuals", "a+b", "b")
    assert not _same_label("trace_count", "", "fwd_traces") and not _same_label("trace_count", "fwd_traces", None)
    # direction: what is missing or extra first, then bytes
    d = lambda **kw: residual_direction("residuals", "jax:remat3", "jax:remat2", kw)
    assert d(extra_other=["float32[2]"]) == "saves more" and d(extra_named=["a"]) == "saves more"
    assert d(bytes=8, reference_bytes=4) == "saves more" and d(bytes=4, reference_bytes=8) == "saves less"
    assert d(bytes=8, reference_bytes=8) is None and d(bytes=8) is None and d(bytes=8.0, reference_bytes=4) is None

    def f(**kw):
        base = dict(signature="s", check="trace_count", pipeline="jax:remat3", reference="jax:remat2",
                    error_type="fwd_traces", features=["custom_vjp", "scan"], program={}, program_hash="0" * 16)
        return Finding(**{**base, **kw})
    assert nested_roots(f(), f(features=["custom_vjp", "scan", "symbolic_zeros"]))
    assert not nested_roots(f(), f(error_type="bwd_calls"))
    assert not nested_roots(f(check="error", reference="expectations", error_type="E"),
                            f(check="error", reference="expectations", error_type="E"))
    assert not nested_roots(f(), f(pipeline="torch:eager-sac"))
    missing = f(check="error", reference="expectations", error_type="", detail={}, expectation=None)
    assert root_key(missing).endswith("|none:custom_vjp+scan")
    assert root_key(f(check="error", reference="expectations", error_type="", expectation="e1")).endswith(
        "|none:expectation e1")


def test_expectations_match_any_features_and_flags():
    e = Entry.model_validate({"id": "x", "pipelines": ["jax:remat3"], "any_features": ["scan", "cond"],
                              "flags": {"jax_remat3": True}, "raises": {"type": "E", "regex": ".*"}})
    ex = Expectations([e], "test")
    assert ex.matching("jax:remat3", {}, "cpu", {"float32"}, {"scan"}, {"jax_remat3": True}) == [e]
    assert ex.matching("jax:remat3", {}, "cpu", {"float32"}, {"while_loop"}, {"jax_remat3": True}) == []
    assert ex.matching("jax:remat3", {}, "cpu", {"float32"}, {"cond"}, {}) == []


def test_known_finding_paths_in_order():
    from conformance.engine.findings import error_root
    from conformance.engine.search import known_finding
    f = _finding(features=("checkpoint", "policy:nothing"))
    # the program's features equal to the finding's core features: known (a subset, not only a proper one)
    assert known_finding([f], K, {"checkpoint"}, {K}) is f
    T = ("residuals", "torch:eager-sac", "jax:remat2", "other")   # (another family: no root-level match)
    sib = _finding(key=T, features=("checkpoint", "scan"), reproduces=[K])
    assert known_finding([sib], K, {"checkpoint", "scan"}, {K, T}) is sib
    assert known_finding([sib], K, {"checkpoint", "scan"}, {K}) is None          # its own key must fail too
    assert known_finding([sib], K, {"checkpoint"}, {K, T}) is None               # and the program have its features
    assert known_finding([_finding(key=T, features=("checkpoint", "scan"))], K, {"checkpoint", "scan"},
                         {K, T}) is None                                         # K is not one it reproduces
    # a raise: the finding of the same pipeline first, else one whose key the program fails
    E = ("error", "jax:remat3", "expectations", "TypeError")
    E2 = ("error", "jax:remat3+cvjp3:jit", "expectations", "TypeError")
    got = {"got": {"type": "TypeError", "message": "can't apply forward-mode autodiff (jvp) to a custom_vjp"}}
    root = error_root(got)
    other = _finding(key=E2, features=("scan",), detail=got)
    own = _finding(key=E, features=("scan",), detail=got)
    assert known_finding([other, own], E, {"cond"}, {E, E2}, root) is own
    assert known_finding([other], E, {"cond"}, {E, E2}, root) is other
    assert known_finding([other], E, {"cond"}, {E}, root) is other               # the root level: its family
    # the root level skips findings of another family and goes on
    far = _finding(key=("residuals", "torch:eager-sac", "jax:remat2", "other"), features=("checkpoint",))
    assert known_finding([far, f], K, {"checkpoint", "policy:dots"}, {K}) is f
    # a label the finding has seen, on a pipeline it has seen, with its root features; not for an error
    unlabelled = ("residuals", "jax:remat3", "jax:remat2", "")
    g = _finding(key=unlabelled, features=("checkpoint", "names"))
    assert known_finding([g], unlabelled, {"checkpoint", "names", "scan"}, set()) is g
    assert known_finding([g], ("residuals", "jax:remat3", "jax:remat2", "other"), {"checkpoint", "names"}, set()) \
        is None
    e_none = _finding(key=("error", "jax:remat3", "expectations", ""), features=("checkpoint",))
    assert known_finding([e_none], ("error", "jax:remat3:jit", "expectations", ""), {"checkpoint", "scan"},
                         set()) is None


def test_known_finding_covers_several_grown_counters_by_findings_of_some():
    from conformance.engine.search import known_finding
    T = ("trace_count", "jax:remat3", "jax:remat2")
    fb = _finding(key=(*T, "bwd_calls+fwd_traces"), features=("custom_vjp",))
    fp = _finding(key=(*T, "primal_traces"), features=("custom_vjp",))
    all3 = (*T, "bwd_calls+fwd_traces+primal_traces")
    feats = {"custom_vjp", "scan"}
    assert known_finding([fp, fb], all3, feats, {all3}) is fb          # the finding of the first counter
    assert known_finding([fb, fp], (*T, "primal_traces+bwd_calls+fwd_traces"), feats, set()) is fp
    assert known_finding([fb], all3, feats, set()) is None             # primal_traces uncovered
    assert known_finding([fb, fp], all3, {"scan"}, set()) is None      # the program lacks their features
    whole = _finding(key=all3, features=("cond",))
    assert known_finding([whole, fp], (*T, "bwd_calls+primal_traces"), feats, set()) is None   # not a part of it
    assert known_finding([fb, fp], ("trace_count", "jax:remat3", "jax:none", "bwd_calls+fwd_traces+primal_traces"),
                         feats, set()) is None                         # another reference
    assert known_finding([fb, fp], (*T, "primal_traces"), {"scan"}, set()) is None
    assert known_finding([_finding(key=(*T, "fwd_traces"), features=("cond",)),
                          _finding(key=(*T, "bwd_calls"), features=("cond",))],
                         ("custom_rule", "jax:remat3", "jax:remat2", "bwd_calls+fwd_traces"), {"cond"}, set()) is None


def test_searcher_known_matches_a_residual_difference_by_its_direction():
    less = {"missing_other": ["float32[2]"], "extra_other": [], "saved": [], "reference_saved": []}
    f = _finding(features=("checkpoint", "scan"), detail=less)
    v = _v()
    v.detail = less
    assert _searcher([f]).known(v, {"checkpoint", "cond"}, {K}) is f
    v.detail = {"missing_other": [], "extra_other": ["float32[2]"]}
    assert _searcher([f]).known(v, {"checkpoint", "cond"}, {K}) is None


def test_merge_keeps_a_tracked_class_and_the_title():
    from conformance.ir.verdict import Triage
    bug, question = Triage(class_="bug", reason="r"), Triage(class_="question", reason="q")
    big = _finding(features=("checkpoint", "names", "policy:nothing"), title="tracked title", triage=bug,
                   tracked="entry.json")
    small = _finding(features=("checkpoint",), title="new title", triage=question)
    out, changed = merge_finding([big], small)
    assert changed and out is small and (out.title, out.triage, out.tracked) == ("tracked title", bug, "entry.json")
    big = _finding(features=("checkpoint", "names", "policy:nothing"), title="", triage=bug)
    small = _finding(features=("checkpoint",), title="new title", triage=question)
    out, _ = merge_finding([big], small)
    assert (out.title, out.triage) == ("new title", question)


def test_known_finding_exact_features_labels_and_whole_counter_sets():
    from conformance.engine.search import known_finding
    # an error without evidence: only its own key with its core features (no root level for errors)
    E = ("error", "jax:remat3", "expectations", "")
    e = _finding(key=E, features=("checkpoint", "policy:nothing"))
    assert known_finding([e], E, {"checkpoint", "policy:nothing"}, {E}) is e
    assert known_finding([e], E, {"checkpoint"}, {E}) is None
    # an unlabelled residual difference folds in at the root level, its label read as "-"
    U = ("residuals", "jax:remat3", "jax:remat2", "")
    u = _finding(key=U, features=("checkpoint", "names", "policy:nothing"))
    assert known_finding([u], U, {"checkpoint", "names"}, {U}) is u
    # several counters of another check are not covered by findings of some of them
    C = ("custom_rule", "jax:remat3", "jax:remat2")
    parts = [_finding(key=(*C, "bwd_calls"), features=("cond",)), _finding(key=(*C, "fwd_traces"), features=("cond",))]
    assert known_finding(parts, (*C, "bwd_calls+fwd_traces"), {"cond"}, set()) is None
    # the same counters in another order: that finding is the whole, not a part that covers it
    T = ("trace_count", "jax:remat3", "jax:remat2")
    whole = _finding(key=(*T, "bwd_calls+fwd_traces+primal_traces"), features=("cond",))
    assert known_finding([whole], (*T, "primal_traces+bwd_calls+fwd_traces"), {"cond"}, set()) is None
    # parts whose core features are exactly the program's cover it
    fb = _finding(key=(*T, "bwd_calls+fwd_traces"), features=("custom_vjp",))
    fp = _finding(key=(*T, "primal_traces"), features=("custom_vjp",))
    assert known_finding([fb, fp], (*T, "bwd_calls+fwd_traces+primal_traces"), {"custom_vjp"}, set()) is fb


def test_what_differed_blanks_upper_case_addresses():
    from conformance.engine.findings import what_differed
    assert what_differed("object at 0xABCDEF") == "object at 0x?"


def test_residual_report_counts_each_class_of_one_size_and_dtype():
    from oracles import residual_report
    a = Residual(cls=["x"], shape=[2], dtype="float64", bytes=16)
    b = Residual(cls=["y"], shape=[2], dtype="float64", bytes=16)
    row = {"shape": [2], "dtype": "float64", "source": "output of sin"}
    assert residual_report.check(_reported([a, b], [row, row])).status == "pass"
    assert residual_report.check(_reported([a, b], [row])).detail["missing_from_report"] == ["float64[2 elements]"]


def test_view_layout_edges():
    def saved(cls, shape, n):
        return Residual(cls=cls, shape=shape, dtype="float64", bytes=8 * n)
    # two elements are enough to have a layout
    p = prog([region(["x"], [op("transpose", ["x"], "t", perm=[1, 0]), op("sin", ["t"], "y")], ["y"],
                     {"kind": "ops", "ops": ["transpose", "sin"]})],
             inputs=[{"id": "x", "shape": [1, 2], "dtype": "float64", "diff": True}])
    assert residuals.check_policy(p, ob("jax:remat2", res=[saved(["t"], [1, 2], 2)])).error_type == "view_layout"
    # a class holding a value that is no view and then a saved view: the view is found
    v = residuals.check_policy(p, ob("jax:remat2", res=[saved(["t", "y"], [1, 2], 2)]))
    assert v.detail["view_in_another_layout"] == [
        "t/y:float64[1, 2] equals the saved view(s) ['t'] only in another layout"]
    v = residuals.check_policy(p, ob("jax:remat2", res=[saved(["a_value", "t"], [1, 2], 2)]))
    assert v.error_type == "view_layout"
    # a policy deciding on the view's input size: a large enough view is saved, so checked exactly
    big = prog([region(["x"], [op("transpose", ["x"], "t", perm=[1, 0]), op("sin", ["t"], "y")], ["y"],
                       {"kind": "min_elements", "elements": 4})],
               inputs=[{"id": "x", "shape": [2, 3], "dtype": "float64", "diff": True}])
    assert residuals.check_policy(big, ob("jax:remat2", res=[saved(["t"], [2, 3], 6)])).error_type == "view_layout"
    # select (lax.index_in_dim) is a slice then a squeeze: a policy saving the slice's output keeps the view with a
    # unit axis more, the same layout (the 30-minute default campaign of issue 31, seed 0: blamed on remat2)
    sliced = prog([region(["x"], [op("select", ["x"], "v", index=0, axis=2), op("exp", ["v"], "y")], ["y"],
                          {"kind": "min_elements", "elements": 8})],
                  inputs=[{"id": "x", "shape": [2, 2, 2], "dtype": "float64", "diff": True}])
    assert residuals.check_policy(sliced, ob("jax:remat2", res=[saved(["v"], [2, 2, 1], 4)])).status == "pass"
    assert residuals.check_policy(sliced, ob("jax:remat2", res=[saved(["v"], [1, 2, 2], 4)])).status == "pass"


def test_a_shape_deciding_policy_is_not_judged_in_a_per_example_program():
    """jax.vmap changes the shapes JAX's policy sees: under min_elements a per-example program's
    saved value is not blamed, where the same program unbatched is."""
    from conformance.ir.program import load_program

    def program(batch):
        return load_program({
            "schema_version": 1, "outputs": ["y"], "diff": {"order": 1, "mode": "reverse", "batch": batch},
            "inputs": [{"id": "x", "shape": [2, 3], "dtype": "float64", "diff": True, "batched": batch > 0}],
            "body": [region(["x"], [op("sin", ["x"], "s"), op("cos", ["s"], "y")], ["y"],
                            {"kind": "min_elements", "elements": 100})]})
    res = [Residual(cls=["s"], shape=[2, 3], dtype="float64", bytes=48)]
    assert residuals.check_policy(program(0), ob("jax:remat2", res=res)).error_type == "saved_against_policy"
    assert residuals.check_policy(program(2), ob("jax:remat2", res=res)).status == "pass"


def test_a_difference_the_baseline_shares_is_the_baselines_finding_not_each_rivals():
    """jax 0.6.2's jitted conv of a scaled input: the float64 reference was wrong, the eager baseline and every
    rival agreed. One verdict, on the baseline against the reference; each rival that agrees with its baseline
    is skipped there with the reason, and one that departs from its baseline as well is still blamed."""
    o = _jax(grads3=WRONG, **{"ref:f64": ob("ref:f64", WRONG), "jax:remat2": ob("jax:remat2", G, res=[])})
    j = judge(named_chain(), o, Expectations([]))
    assert [(v.check, v.pipeline, v.reference) for v in j.failures() if v.check == "gradient"] == [
        ("gradient", "jax:none", "ref:f64")]
    # remat2 agrees with its baseline, remat3 (jitted, say) with the reference: neither is blamed for the other
    skipped = find(j, "gradient", "jax:remat2", "ref:f64")
    assert skipped.status == "skipped" and skipped.detail["reason"].startswith(
        "agrees with jax:none, and the no-remat baseline jax:none differs from ref:f64")
    assert find(j, "gradient", "jax:remat3", "jax:none").status == "skipped"
    assert find(j, "gradient", "jax:remat3", "ref:f64").status == "pass"
    # a rival that agrees with neither is blamed against both
    third = {"x": [1.0, 1.0, 2.0]}
    j = judge(named_chain(), {**o, "jax:remat3": ob("jax:remat3", third)}, Expectations([]))
    assert {find(j, "gradient", "jax:remat3", r).status for r in ("jax:none", "ref:f64")} == {"fail"}
    # a rival wrong on its own, beside a right baseline, is blamed against both
    j = judge(named_chain(), _jax(grads3=WRONG), Expectations([]))
    assert find(j, "gradient", "jax:none", "ref:f64").status == "pass"
    assert {find(j, "gradient", "jax:remat3", r).status for r in ("jax:none", "ref:f64")} == {"fail"}


def test_a_region_whose_policies_save_everything_is_judged_against_the_program_without_checkpoint():
    """remat2 (JAX's reference implementation, which no other JAX pipeline is compared with) recomputing what a
    saving policy keeps: the no-checkpoint baseline's residuals are what such a region keeps. jax 0.4.37's
    save_from_both_policies(save_and_offload_only_these_names([], []), everything_saveable) saved only x for
    sin(sin(x)); the baseline saves cos(x) and cos(sin(x))."""
    from pydantic import TypeAdapter

    from conformance.ir.policy import Policy, saves_everything
    load_policy = TypeAdapter(Policy).validate_python
    everything = {"kind": "both", "a": {"kind": "save_and_offload_names", "saved": [], "offloaded": []},
                  "b": {"kind": "everything"}}
    assert saves_everything(load_policy(everything))
    assert saves_everything(load_policy({"kind": "save_anything_except_names", "names": []}))
    assert not saves_everything(load_policy({"kind": "save_anything_except_names", "names": ["a"]}))
    assert not saves_everything(load_policy({"kind": "both", "a": {"kind": "nothing"}, "b": {"kind": "dots"}}))
    p = prog([region(["x"], [op("sin", ["x"], "v1"), op("sin", ["v1"], "v2")], ["v2"], everything)])
    factor = Residual(cls=[], shape=[3], dtype="float64", bytes=24)
    x = Residual(cls=["x"], exact=["x"], shape=[3], dtype="float64", bytes=24)
    none = Observation(pipeline="jax:none", residuals=[factor, factor])
    v = residuals.check_policy(p, Observation(pipeline="jax:remat2", residuals=[x]), None, none)
    assert (v.status, v.error_type) == ("fail", "recomputed_against_policy"), v
    assert v.detail["recomputed_against_policy"] == ["?:float64[3]", "?:float64[3]"]
    assert v.detail["causes"] == ["recomputes against its policy an unmatched value"]
    assert residuals.check_policy(p, Observation(pipeline="jax:remat2", residuals=[factor, factor]), None,
                                  none).status == "pass"
    dead = prog([op("sin", ["x"], "d"), *p.model_dump(mode="json")["body"]], outputs=["v2"])   # a dead sin outside
    assert residuals.check_policy(dead, Observation(pipeline="jax:remat2", residuals=[x]), None, none).status == "pass"
    assert residuals.judged_against_no_checkpoint("jax:remat2", ["jax:none", "jax:remat2", "jax:remat3"])
    assert not residuals.judged_against_no_checkpoint("jax:remat3", ["jax:none", "jax:remat2", "jax:remat3"])
    assert not residuals.judged_against_no_checkpoint("torch:eager-sac", ["torch:none", "torch:eager-sac"])
