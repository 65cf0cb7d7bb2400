"""Hypothesis profiles: dev (fast local loop), ci (default of `make test`), nightly (deep).
Choose with HYPOTHESIS_PROFILE=dev|ci|nightly."""
import os
import random

from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                     HealthCheck.filter_too_much], database=None,
               print_blob=True)
settings.register_profile("dev", max_examples=10, **_common)
settings.register_profile("ci", max_examples=25, derandomize=True, **_common)
settings.register_profile("nightly", max_examples=400, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# How many examples property tests draw per profile, for tests that scale their own loops.
SCALE = {"dev": 1, "ci": 2, "nightly": 20}[os.environ.get("HYPOTHESIS_PROFILE", "ci")]

# The conformance gate's campaign seed (tests/test_conformance.py): fresh each run unless
# REMAT_GATE_SEED is set. Set here, before pytest-xdist starts its workers, so that they all
# inherit the one seed the header prints.
if not os.environ.get("REMAT_GATE_SEED", "").strip():
    os.environ["REMAT_GATE_SEED"] = str(random.SystemRandom().randrange(1, 10**6))
try:
    GATE_SEED = int(os.environ["REMAT_GATE_SEED"])
except ValueError:
    raise SystemExit(f"REMAT_GATE_SEED: must be an integer, got {os.environ['REMAT_GATE_SEED']!r}") from None


def pytest_report_header(config):
    return f"conformance gate seed: {GATE_SEED} (replay: REMAT_GATE_SEED={GATE_SEED})"


def pytest_terminal_summary(terminalreporter):
    # `make test` runs pytest -q, which prints no header: the seed is also the summary's last word
    from pathlib import Path
    found = sorted((Path(__file__).resolve().parents[1] / "reports" / "gate").glob(f"{GATE_SEED}-*/*.json"))
    if found:   # the gate's discoveries: new variants of tracked behaviours (tests/test_conformance.py)
        terminalreporter.write_line(f"conformance gate: {len(found)} new variant(s) of tracked behaviours; "
                                    "judge each, adopt with: cp FILE tests/regressions/")
        for p in found:
            terminalreporter.write_line(f"  {p}")
    terminalreporter.write_line(f"conformance gate seed: {GATE_SEED} (replay: REMAT_GATE_SEED={GATE_SEED} make test)")
