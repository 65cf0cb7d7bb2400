"""Executors: run one program through a set of pipelines and return their observations.

InProcessExecutor runs in this process. The isolated executor (conformance.engine.isolation)
runs the same work in supervised worker processes with the same interface.
"""
from __future__ import annotations

import traceback

import numpy as np

from conformance.ir.observation import ErrorInfo, Observation
from conformance.ir.program import Program
from conformance.pipelines import registry


def run_one(name: str, program: Program, inputs: dict[str, np.ndarray], device: str) -> Observation:
    p = registry.get(name)
    try:
        return p.run(program, inputs, device)
    except Exception as e:  # a pipeline bug, not a framework error: report as such  # noqa: BLE001
        obs = Observation(pipeline=name, device=device)
        obs.error = ErrorInfo(type=f"HarnessError:{type(e).__name__}",
                              message=f"{e}\n{traceback.format_exc(limit=6)}"[:4000], stage="setup")
        return obs


class InProcessExecutor:
    isolated = False

    def __init__(self, device: str = "cpu"):
        self.device = device

    def run(self, program: Program, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, Observation]:
        return {n: run_one(n, program, inputs, self.device) for n in names}

    def close(self) -> None:
        pass
