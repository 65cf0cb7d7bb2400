"""Behaviour is unchanged where nothing new was added: every corpus entry and a fixed sample
of programs (tests/data/behaviour.json, recorded by tools/record_behaviour.py before the
op/policy/pipeline tables replaced the hand-written lowerings) get the same verdicts, the
same canonical residual sets and the same errors as then. Verdicts are compared as sets
(the old judge listed jax:remat2's policy verdict twice)."""
import json
from pathlib import Path

import pytest

from conformance.engine.findings import InputValue, decode_inputs
from conformance.ir.program import load_program
from tests.behaviour import RECORDED_CHECKS, behaviour

CASES = json.loads((Path(__file__).parent / "data" / "behaviour.json").read_text())["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_same_behaviour_as_recorded(case):
    prog = load_program(case["program"])
    inputs = decode_inputs({k: InputValue.model_validate(v) for k, v in case["inputs"].items()})
    got = behaviour(prog, inputs, case["pipelines"])
    got_v = {tuple(v) for v in got["verdicts"]}
    want_v = {tuple(v) for v in case["verdicts"]}
    assert {v[0] for v in want_v} <= RECORDED_CHECKS
    assert got_v == want_v, f"only now: {sorted(got_v - want_v)}; only before: {sorted(want_v - got_v)}"
    assert got["residuals"] == case["residuals"]
    assert got["errors"] == case["errors"]

