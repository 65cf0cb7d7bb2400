"""Unit tests of the CPU-against-device oracle (oracles.devices.compare_devices) on hand-built
observations (no framework runs).

Pinned: the whole verdict list of each branch (unsupported on either side; an error on one side
only, with the detail a report shows: where it raised, what, and which run's status it differs
from; an error on both; residuals not observed on either side; residual multisets equal, missing,
extra or both), each verdict's reference being the CPU run of the same pipeline."""
from __future__ import annotations

from conformance.ir.observation import ErrorInfo, Observation, Residual
from conformance.ir.verdict import DEVICE_REFERENCE
from oracles.devices import compare_devices
from tests.programs import op, prog

P = "jax:remat3"
SIN = prog([op("sin", ["x"], "y")])   # float64, x of shape [3]
G = {"x": [1.0, 2.0, 3.0]}
PASS_GRADIENT = {"check": "gradient", "pipeline": P, "reference": DEVICE_REFERENCE, "status": "pass",
                 "error_type": None, "detail": {}, "expectation": None}


def ob(*, res=(), error=None, unsupported=None, device="cpu"):
    """One run of P; `res` lists residual descriptions as (cls, shape), None: none observed."""
    return Observation(pipeline=P, device=device, outputs=[[1.0, 2.0, 3.0]], grads=G, error=error,
                       unsupported=unsupported,
                       residuals=None if res is None else [Residual(cls=list(c), shape=list(s), dtype="float64",
                                                                    bytes=8) for c, s in res])


def dev(**kw):
    return ob(device="cuda", **kw)


def boom(type="RuntimeError"):
    return ErrorInfo(type=type, message="boom", stage="backward")


def dumped(verdicts):
    return [v.model_dump() for v in verdicts]


def verdict(check, status, error_type=None, detail=None):
    return {"check": check, "pipeline": P, "reference": DEVICE_REFERENCE, "status": status,
            "error_type": error_type, "detail": detail or {}, "expectation": None}


def test_a_program_unsupported_on_either_side_is_one_unsupported_verdict_with_that_sides_reason():
    want = lambda why: [verdict("gradient", "unsupported", detail={"reason": why})]
    assert dumped(compare_devices(SIN, P, ob(unsupported="no scan"), dev())) == want("no scan")
    assert dumped(compare_devices(SIN, P, ob(), dev(unsupported="no cuda kernel"))) == want("no cuda kernel")
    # both: the cpu's reason
    assert dumped(compare_devices(SIN, P, ob(unsupported="a"), dev(unsupported="b", error=boom()))) == want("a")


def test_an_error_on_the_device_only_fails_the_error_check_and_says_where_it_raised():
    e = boom("XlaRuntimeError")
    assert dumped(compare_devices(SIN, P, ob(), dev(error=e))) == [
        verdict("error", "fail", "XlaRuntimeError",
                {"raised_on": "device", "got": e.model_dump(), "status_differs_from": [f"{P} on the cpu"]})]


def test_an_error_on_the_cpu_only_fails_the_error_check_and_says_where_it_raised():
    e = boom("ValueError")
    assert dumped(compare_devices(SIN, P, ob(error=e), dev())) == [
        verdict("error", "fail", "ValueError",
                {"raised_on": "cpu", "got": e.model_dump(), "status_differs_from": [f"{P} on the device"]})]


def test_an_error_on_both_sides_is_equal_status_whatever_the_errors():
    assert dumped(compare_devices(SIN, P, ob(error=boom("A")), dev(error=boom("B")))) == [verdict("error", "pass")]


def test_equal_runs_pass_the_gradient_and_the_residual_checks():
    res = [(["y"], [3]), (["x"], [3])]
    assert dumped(compare_devices(SIN, P, ob(res=res), dev(res=list(reversed(res))))) == [
        PASS_GRADIENT, verdict("residuals", "pass")]


def test_residuals_not_observed_on_one_side_skip_the_residual_check_and_say_which():
    for cpu_res, dev_res, where in ((None, [(["y"], [3])], "the cpu"), ([(["y"], [3])], None, "the device"),
                                    (None, None, "the cpu")):
        assert dumped(compare_devices(SIN, P, ob(res=cpu_res), dev(res=dev_res))) == [
            PASS_GRADIENT, verdict("residuals", "skipped", detail={"reason": f"residuals not observed on {where}"})]


def test_a_residual_saved_on_the_cpu_only_is_missing_on_the_device():
    cpu, d = ob(res=[(["y"], [3]), (["x"], [3]), (["x"], [3])]), dev(res=[(["x"], [3])])
    assert dumped(compare_devices(SIN, P, cpu, d))[1] == verdict(
        "residuals", "fail", "missing",
        {"missing": ["x:float64[3]", "y:float64[3]"], "extra": [],
         "reference_saved": ["x:float64[3]", "x:float64[3]", "y:float64[3]"], "saved": ["x:float64[3]"]})


def test_a_residual_saved_on_the_device_only_is_extra():
    cpu, d = ob(res=[]), dev(res=[([], [2])])
    assert dumped(compare_devices(SIN, P, cpu, d))[1] == verdict(
        "residuals", "fail", "extra", {"missing": [], "extra": ["?:float64[2]"], "reference_saved": [],
                                        "saved": ["?:float64[2]"]})


def test_residuals_both_missing_and_extra_are_other():
    cpu, d = ob(res=[(["y"], [3])]), dev(res=[(["y"], [1, 3])])
    assert dumped(compare_devices(SIN, P, cpu, d))[1] == verdict(
        "residuals", "fail", "other", {"missing": ["y:float64[3]"], "extra": ["y:float64[1, 3]"],
                                        "reference_saved": ["y:float64[3]"], "saved": ["y:float64[1, 3]"]})


def test_the_gradient_verdict_is_the_device_run_against_the_cpu_run():
    d = dev()
    d.grads = {"x": [1.0, 2.5, 3.0]}
    [g, r] = compare_devices(SIN, P, ob(), d)
    assert (g.check, g.pipeline, g.reference, g.status, r.status) == ("gradient", P, DEVICE_REFERENCE, "fail", "pass")
    assert (g.detail["value"], g.detail["got"], g.detail["want"], g.detail["mode"]) == ("grad[x]", 2.5, 2.0, "tight")
