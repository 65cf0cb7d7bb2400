"""Hypothesis profiles: dev (fast local loop), ci (default of `make test`), nightly (deep).
Choose with HYPOTHESIS_PROFILE=dev|ci|nightly."""
import os

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
