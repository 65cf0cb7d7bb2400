"""The conformance gate: a fresh campaign each run, judged by the campaign's own rule.

A short campaign (the real engine, CLI and isolation) runs over every default JAX pipeline
(jax:remat2's own policy verdict included), another over the PyTorch SAC pipelines, with the
regression corpus as its known behaviours (`run --known tests/regressions`). A program that
fails a known way (the same key and the core features of the entry's shrunk program, or a
sibling of it) is counted under that entry; anything else is shrunk, and a shrunk finding
that is not one of the corpus behaviours fails this test. Fixed corpus keys are not known:
their recurrence fails too. The seed is fresh each run, printed in pytest's header and in
the failure (REMAT_GATE_SEED replays it); the fixed corpus itself is tests/regressions.

A new variant of a tracked key (the same check, pipeline, reference and error type, shrunk and
reduced to core features no entry of that key has) fails the gate too: features are what the
gate sees. Variants that differ only by what the shrinker left by accident are folded first (the
campaign's reductions put a region's policy to the simplest kind the behaviour allows, and drop
dead statements and outputs), so that a failure here is a behaviour to judge, not noise.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import GATE_SEED

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "tests" / "regressions"
# Two campaigns, so that pytest-xdist runs them side by side; each adds the references
# (ref:f64, jax:none, jax:remat2) and the PyTorch one its baseline and cross-framework checks.
# Each checks a fixed number of programs (the same ones for one seed, however loaded the
# machine); the budget only bounds a run that went wrong.
GATES = {
    "jax": (["jax:remat2:jit", "jax:remat3", "jax:remat3:jit", "jax:remat3+cvjp3", "jax:remat3+cvjp3:jit"], 20),
    "torch": (["torch:eager-sac", "torch:compile-aot_eager"], 30),
}
SCALE_PROGRAMS = {"dev": 0.5, "ci": 1, "nightly": 10}[os.environ.get("HYPOTHESIS_PROFILE", "ci")]
BUDGET = float(os.environ.get("REMAT_GATE_BUDGET", "600"))
# Small programs, shrunk by steps only (not seconds): a shrunk program keeps few incidental
# features on a loaded machine too, so that it folds into the corpus entry of its behaviour.
MAX_STMTS, SHRINK_STEPS = 4, 150


def gate_command(gated: list[str], programs: int, seed: int, out: str) -> list[str]:
    return ["remat-conformance", "run", "--pipelines", ",".join(gated), "--known", str(REG.relative_to(ROOT)),
            "--seed", str(seed), "--max-examples", str(programs), "--max-stmts", str(MAX_STMTS),
            "--shrink-steps", str(SHRINK_STEPS), "--shrink-seconds", "600",
            "--budget", f"{BUDGET * SCALE_PROGRAMS:g}", "--jobs", "1", "--strict", "--quiet", "--out", out,
            "--overwrite"]


@pytest.mark.parametrize("gate", list(GATES))
def test_fresh_campaign_finds_only_known_behaviours(gate, tmp_path):
    gated, programs = GATES[gate]
    programs = max(1, int(programs * SCALE_PROGRAMS))
    out = tmp_path / "gate"
    cmd = gate_command(gated, programs, GATE_SEED, str(out))
    r = subprocess.run([sys.executable, "-m", "conformance.cli", *cmd[1:]], cwd=ROOT, capture_output=True,
                       text=True, timeout=BUDGET * SCALE_PROGRAMS + 300)
    replay = (f"REMAT_GATE_SEED={GATE_SEED} pytest tests/test_conformance.py, or: "
              + " ".join(gate_command(gated, programs, GATE_SEED, "DIR")))
    assert r.returncode in (0, 1), f"gate campaign failed to run (exit {r.returncode}):\n{r.stderr[-3000:]}"
    findings = json.loads((out / "findings.json").read_text())
    run = json.loads((out / "run.json").read_text())
    assert run["options"]["seed"] == GATE_SEED and set(gated) <= set(run["options"]["pipelines"])
    recs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    checked = sum(1 for x in recs if x.get("type") == "result")
    rounds = {x["round"] for x in recs if x.get("type") == "round"}
    # every slot checked (a program Hypothesis drew twice is checked once)
    assert checked and rounds == set(range(-(-programs // 40))), \
        f"the gate checked {checked} of its {programs} programs in its budget\n{r.stdout}"
    new = [f for f in findings if f.get("tracked") is None]
    assert (r.returncode == 1) == bool(new), f"--strict exit {r.returncode} with {len(new)} new findings"
    assert not new, (
        f"{len(new)} behaviour(s) that no open regression-corpus entry tracks, seed {GATE_SEED}; replay: {replay}\n"
        + "\n".join(f"- [{f['check']}] {f['pipeline']} vs {f['reference']} {f['error_type'] or ''} "
                    f"(signature {f['signature']}; {f['size']} statements)\n"
                    f"  program: {json.dumps(f['program'])}\n  inputs: {json.dumps(f['inputs'])}"
                    for f in new)
        + "\nJudge each (DESIGN.md): a framework discrepancy -> copy its corpus/<hash>.json into "
          "tests/regressions/; a documented difference -> an expectation; a harness bug -> fix it.")
