"""What tests/data/behaviour.json records of one case: the judge's verdicts (as a set: each
distinct verdict once), every pipeline's canonical residual digest and its errors."""
from __future__ import annotations

# The checks that existed when the sample was recorded; checks added since (residual_report,
# trace_count, policy, ...) are new behaviour, tested by their own tests, and not recorded.
RECORDED_CHECKS = {"gradient", "residuals", "custom_rule", "error", "crash", "timeout"}


def behaviour(prog, inputs, pipelines: str) -> dict:
    from conformance.cli.main import parse_pipelines
    from conformance.engine.runner import InProcessExecutor
    from oracles.expectations import Expectations
    from oracles.judge import judge
    names = parse_pipelines(pipelines)
    obs = InProcessExecutor().run(prog, inputs, names)
    j = judge(prog, obs, Expectations.load())
    return {
        "verdicts": sorted({(v.check, v.pipeline, v.reference, v.status, v.error_type or "") for v in j.verdicts
                           if v.check in RECORDED_CHECKS}),
        "residuals": {n: sorted(f"{'/'.join(r.cls) or '?'}{r.names}:{r.dtype}{r.shape}x{r.copies}"
                                for r in o.residuals) for n, o in sorted(obs.items()) if o.residuals is not None},
        "errors": {n: [o.error.type, o.error.stage] for n, o in sorted(obs.items()) if o.error is not None},
    }
