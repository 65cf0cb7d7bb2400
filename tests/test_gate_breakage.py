"""The gate catches the harness's own regressions that land under tracked keys.

Each test breaks the harness in one way (a monkeypatch of its real code, not a mutant pipeline),
runs the JAX gate's own command in-process (`--no-isolate`, so that the patch reaches every
pipeline) on the first programs of the gate, and shows the snapshot comparison failing: on
verdicts of programs the snapshot holds (the same programs, so the change is the breakage's).
Findings of such breakages land under keys the regression corpus tracks (an error of ref:f64, a
remat3 gradient against jax:none, a remat3-vs-remat2 residual difference), where the rule that
fails only new keys let them pass (a remat3 gradient scaled by 1.01 kept that gate green).
"""
import pytest

from conformance.cli.main import main as cli_main
from tests.conftest import GATE_SEED, GATE_SEED_DEFAULT
from tests.gate import GATES, compare, gate_behaviour, gate_command, load_snapshot, read_results
from tests.mutants import _perturb

PROGRAMS = 6   # a prefix of the JAX gate's programs (the same ones: slots are seeded per round)

pytestmark = pytest.mark.skipif(GATE_SEED != GATE_SEED_DEFAULT, reason="the snapshot is of the default gate seed")


def gate_diffs(tmp_path) -> list[str]:
    gated, _ = GATES["jax"]
    out = tmp_path / "gate"
    cmd = gate_command(gated, PROGRAMS, GATE_SEED, str(out), budget=600)
    # (the breakage's findings are shrunk briefly: the comparison reads the programs' own verdicts)
    assert cli_main([*cmd[1:], "--no-isolate", "--shrink-steps", "1", "--max-shrinks-per-key", "1"]) in (0, 1)
    got = gate_behaviour(read_results(out))
    want = load_snapshot()["gates"]["jax"]
    assert set(got["programs"]) <= set(want["programs"]), "not the gate's programs: the comparison would be vacuous"
    assert len(got["programs"]) >= PROGRAMS - 1
    return compare(want, got, complete=False, limit=None)


def raise_in_every_lowered_op(monkeypatch):
    """A lowering that raises in every JAX pipeline (ref:f64 included)."""
    from conformance.pipelines.jax.pipelines import Lowering

    def op(self, s, args, nondiff):
        raise TypeError("broken lowering")
    monkeypatch.setattr(Lowering, "op", op)


def push_remat3_gradients_past_the_tolerance(monkeypatch):
    """jax:remat3's gradients (every form of it) off by a relative 1% in one element."""
    from conformance.pipelines.jax.pipelines import JaxRemat
    run = JaxRemat._run

    def _run(self, program, inputs, obs):
        run(self, program, inputs, obs)
        if self.name.startswith("jax:remat3"):
            _perturb(obs, 0.01)
    monkeypatch.setattr(JaxRemat, "_run", _run)


def mislabel_program_inputs(monkeypatch):
    """Residual canonicalisation that mislabels one class: a saved program input loses the
    input's id (it reads as no program value), in every pipeline alike, so that every residual
    comparison of two pipelines still agrees; the snapshot's saved-residual digests move."""
    from conformance.ir import residuals
    cls = residuals._cls

    def _cls(arr, values):
        return [i for i in cls(arr, values) if not i.startswith("x")]
    monkeypatch.setattr(residuals, "_cls", _cls)


@pytest.mark.parametrize("breakage", [raise_in_every_lowered_op, push_remat3_gradients_past_the_tolerance,
                                      mislabel_program_inputs], ids=lambda f: f.__name__)
def test_gate_fails_on_a_broken_harness(breakage, monkeypatch, tmp_path):
    breakage(monkeypatch)
    diffs = gate_diffs(tmp_path)
    assert diffs, f"the gate did not notice {breakage.__name__}"
    assert all(": was " in d and ", now " in d for d in diffs), diffs   # verdicts moved, programs the same
