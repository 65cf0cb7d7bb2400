"""Pipeline interface. A pipeline lowers a program, runs forward and backward, and returns an
Observation. It never judges."""
from __future__ import annotations

import time
from contextlib import contextmanager

import numpy as np

from conformance.ir.observation import Observation
from conformance.ir.program import Program


class Pipeline:
    """One registry entry made runnable. `spec` (a conformance.pipelines.Spec) holds its settings."""

    def __init__(self, spec):
        self.spec = spec
        self.name = spec.name

    @property
    def framework(self) -> str:
        return self.spec.framework

    def available(self) -> tuple[bool, str]:
        """(usable here, why not)."""
        return True, ""

    def versions(self) -> dict[str, str]:
        return {}

    def devices(self) -> list[str]:
        return ["cpu"]

    def run(self, program: Program, inputs: dict[str, np.ndarray], device: str = "cpu") -> Observation:
        raise NotImplementedError


@contextmanager
def timed(timings: dict, key: str):
    t0 = time.perf_counter()
    try:
        yield
    finally:
        timings[key] = timings.get(key, 0.0) + time.perf_counter() - t0
