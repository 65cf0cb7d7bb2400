"""CPU against GPU: one pipeline's runs of one program on two devices must agree. Pure functions
over observations; they import no framework.

- Error status: both raise or both succeed (DeepREL's status equivalence, across devices).
- Values: outputs and gradients within the same-dtype (tight) tolerance of the gradient oracle
  (kernels differ by rounding, never by what remat does).
- Residuals: the same canonical residual classes, as a multiset of `class[names]:dtype[shape]`
  (remat decisions are made before lowering, in both frameworks: a device must not change what
  is saved). Memory kinds are not compared (host offload exists only beside a device).
"""
from __future__ import annotations

from collections import Counter

from conformance.ir.observation import Observation
from conformance.ir.program import Program
from conformance.ir.verdict import DEVICE_REFERENCE, Verdict
from oracles import gradients


def compare_devices(program: Program, pipeline: str, cpu: Observation, dev: Observation) -> list[Verdict]:
    """Verdicts of `pipeline` on a device (`dev`) against the same pipeline on the CPU (`cpu`)."""
    if cpu.unsupported or dev.unsupported:
        return [Verdict(check="gradient", pipeline=pipeline, reference=DEVICE_REFERENCE, status="unsupported",
                        detail={"reason": cpu.unsupported or dev.unsupported})]
    if (cpu.error is None) != (dev.error is None):
        err = dev.error or cpu.error
        return [
            Verdict(
                check="error",
                pipeline=pipeline,
                reference=DEVICE_REFERENCE,
                status="fail",
                error_type=err.type,
                detail={
                    "raised_on": "device" if dev.error else "cpu",
                    "got": err.model_dump(),
                    "status_differs_from": [f"{pipeline} on the {'cpu' if dev.error else 'device'}"],
                },
            )
        ]
    if cpu.error is not None:   # both raise: status equal (the campaign judges whether either should)
        return [Verdict(check="error", pipeline=pipeline, reference=DEVICE_REFERENCE, status="pass")]
    v = gradients.compare(program, dev, cpu, "tight")
    v.pipeline, v.reference = pipeline, DEVICE_REFERENCE
    out = [v]
    if cpu.residuals is None or dev.residuals is None:
        out.append(
            Verdict(
                check="residuals",
                pipeline=pipeline,
                reference=DEVICE_REFERENCE,
                status="skipped",
                detail={
                    "reason": "residuals not observed on " + ("the cpu" if cpu.residuals is None else "the device")
                },
            )
        )
        return out
    a = Counter(r.describe() for r in cpu.residuals)
    b = Counter(r.describe() for r in dev.residuals)
    missing, extra = sorted((a - b).elements()), sorted((b - a).elements())
    r = Verdict(check="residuals", pipeline=pipeline, reference=DEVICE_REFERENCE, status="pass")
    if missing or extra:
        r.status = "fail"
        r.error_type = "missing" if not extra else "extra" if not missing else "other"
        r.detail = {"missing": missing, "extra": extra, "reference_saved": sorted(a.elements()),
                    "saved": sorted(b.elements())}
    out.append(r)
    return out
