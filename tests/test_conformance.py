"""The conformance properties, as Hypothesis tests parametrised over pipelines.

For every rival pipeline and every generated program: values equal the no-remat references,
saved residuals follow the policy and agree with jax:remat2, custom rules see what they see
under jax:remat2, and errors are those the expectations data predicts. A failure whose
behaviour class (check, pipeline, reference, error type; jit and eager alike) an open
regression-corpus finding tracks is known there (strict xfail); anything else fails this
test with the verdict, so a new kind of discrepancy is never hidden. The campaign, not this
gate, tells behaviours within a class apart. HYPOTHESIS_PROFILE picks the depth.
"""
import json
from pathlib import Path

import pytest
from hypothesis import given, settings

from tests.conftest import SCALE

from conformance.campaign import needed_pipelines
from conformance.findings import Finding
from conformance.pipelines import DEFAULT_PIPELINES, REFERENCES
from conformance.runner import InProcessExecutor
from generators.programs import cases, input_values
from oracles.expectations import Expectations
from oracles.judge import judge

REG = Path(__file__).parent / "regressions"
FIXED = set(json.loads((REG / "status.json").read_text()).get("fixed", {}))
KNOWN = [f for f in (Finding.model_validate(json.loads(p.read_text())["finding"])
                     for p in sorted(REG.glob("*.json")) if p.name != "status.json")
         if "|".join(f.key()) not in FIXED]
EXPECTATIONS = Expectations.load()
EXECUTOR = InProcessExecutor()


def _behaviour(key):
    # jit and eager variants of one pipeline share a behaviour
    check, pipeline, reference, error_type = key
    strip = lambda p: p[:-4] if p.endswith(":jit") else p
    return (check, strip(pipeline), strip(reference), error_type)


def _parts(key):
    # jit and eager variants of one pipeline share a behaviour; a combined error type
    # ("perturbed+symbolic_zero_cts") is known when each part is.
    check, pipeline, reference, error_type = _behaviour(key)
    return {(check, pipeline, reference, part) for part in error_type.split("+")}


KNOWN_PARTS = set().union(*(_parts(f.key()) for f in KNOWN)) if KNOWN else set()


def known(v, prog):
    """This suite is a regression gate: it fails on a behaviour class, (check, pipeline,
    reference, error type), that no open corpus entry tracks. Telling apart behaviours
    within a class by program features is the campaign's job (its signatures)."""
    return _parts(v.key()) <= KNOWN_PARTS


@pytest.mark.parametrize("pipeline", [p for p in DEFAULT_PIPELINES if p not in REFERENCES])
@settings(max_examples=10 * SCALE)
@given(case=cases())
def test_pipeline_conforms(pipeline, case):
    prog, seed = case
    names = list(dict.fromkeys(list(REFERENCES) + needed_pipelines(("", pipeline, "", ""), list(REFERENCES) + [pipeline])))
    obs = EXECUTOR.run(prog, input_values(prog, seed), names)
    j = judge(prog, obs, EXPECTATIONS)
    new = [v for v in j.failures() if v.pipeline == pipeline and not known(v, prog)]
    assert not new, (f"new discrepancy for {pipeline}: " + "; ".join(
        f"[{v.check}] vs {v.reference} {v.error_type}: {json.dumps(v.detail, default=str)[:400]}" for v in new)
        + f"\nprogram: {prog.to_json()}\ninput seed: {seed}")
