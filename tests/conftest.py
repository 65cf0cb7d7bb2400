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

# Two CPU devices for JAX in every test process (set before JAX starts; xdist workers and campaign subprocesses
# inherit it), so that the shard_map pipelines and the corpus roots found on them run in-process.
os.environ.setdefault("REMAT_CONFORMANCE_CPU_DEVICES", "2")

# How many examples property tests draw per profile, for tests that scale their own loops.
SCALE = {"dev": 1, "ci": 2, "nightly": 20}[os.environ.get("HYPOTHESIS_PROFILE", "ci")]

# The conformance gate's campaign seed (tests/test_conformance.py): fixed, so that `make test`
# judges the change under test, not the luck of a draw (a fresh seed finds a new framework
# behaviour in about one run in ten: a discovery, which belongs to campaigns, not a verdict
# on the change). REMAT_GATE_SEED=N replays seed N; REMAT_GATE_SEED=fresh draws one (printed).
# Set here, before pytest-xdist starts its workers, so that they all inherit the one seed.
GATE_SEED_DEFAULT = 2024
_seed = os.environ.get("REMAT_GATE_SEED", "").strip() or str(GATE_SEED_DEFAULT)
if _seed == "fresh":
    _seed = str(random.SystemRandom().randrange(1, 10**6))
os.environ["REMAT_GATE_SEED"] = _seed
try:
    GATE_SEED = int(_seed)
except ValueError:
    raise SystemExit(f"REMAT_GATE_SEED: must be an integer or 'fresh', got {_seed!r}") from None


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
