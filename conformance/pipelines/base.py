"""Pipeline interface. A pipeline lowers a program, runs forward and backward, and returns an
Observation. It never judges."""
from __future__ import annotations

import os
import time
import traceback
from contextlib import contextmanager

import numpy as np

from conformance.ir import releases
from conformance.ir.features import FEATURE_NEEDS
from conformance.ir.observation import ErrorInfo, Observation
from conformance.ir.program import Program

# A message shorter than this tells no error apart from another (engine.findings.error_root): the raise
# site is recorded instead.
SHORT_MESSAGE = 12
_HARNESS = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def raise_site(e: BaseException) -> str | None:
    """Where the framework raised: the innermost frame of the traceback outside the harness and the framework
    frame that called it, as `package/path.py:function, called from package/path.py:function` (the part after
    site-packages, no line numbers: lines move between releases, functions rarely). One bare assertion checks
    one condition, but two bugs can break it from two callers (jax's `_remat_bind` assert reached from
    `fun_remat` and from a partial-evaluation rule): the caller tells them apart."""
    frames = list(reversed(traceback.extract_tb(e.__traceback__)))
    at = next((i for i, fr in enumerate(frames) if _framework(fr.filename)), None)
    if at is None:
        return None
    site = _frame_name(frames[at])
    if at + 1 < len(frames) and _framework(frames[at + 1].filename):   # (a harness frame calling it is no caller)
        site += f", called from {_frame_name(frames[at + 1])}"
    return site


def _framework(filename: str) -> bool:
    path = os.path.abspath(filename)
    return not path.startswith(_HARNESS + os.sep) or "site-packages" in path


def _frame_name(fr) -> str:
    path = os.path.abspath(fr.filename)
    tail = path.split("site-packages" + os.sep, 1)[-1] if "site-packages" in path else os.path.basename(path)
    return f"{tail}:{fr.name}"


def error_info(e: BaseException, stage: str) -> ErrorInfo:
    """What an observation records of an exception; where its message is too short to tell it apart, the
    framework frame that raised it."""
    message = str(e)
    where = raise_site(e) if len(message.strip()) < SHORT_MESSAGE else None
    return ErrorInfo(type=type(e).__name__, message=message[:4000], stage=stage, where=where)


_PROBED: dict[str, dict[str, bool]] = {}   # framework -> API -> whether the imported release has it


class Pipeline:
    """One registry entry made runnable. `spec` (a conformance.pipelines.Spec) holds its settings."""

    def __init__(self, spec):
        self.spec = spec
        self.name = spec.name

    @property
    def framework(self) -> str:
        return self.spec.framework

    def namespace(self) -> dict:
        """The framework's modules, for the release probes (conformance.ir.releases)."""
        return {}

    def _lacking(self, names) -> list[str]:
        got = _PROBED.setdefault(self.framework, {})
        for n in names:
            if n not in got:
                got[n] = not releases.probe_lacking([n], self.namespace())
        return [n for n in names if not got[n]]

    def available(self) -> tuple[bool, str]:
        """(usable here, why not): whether this release has every API the pipeline runs with."""
        lack = self._lacking(self.spec.needs)
        return (False, releases.why(lack)) if lack else (True, "")

    def cannot_express(self, program: Program) -> str | None:
        """Why this release cannot express the program (a feature written with an API it lacks), or None."""
        needs = [n for f in sorted(program.features()) for n in FEATURE_NEEDS.get(f, ())
                 if releases.APIS[n].framework == self.framework]
        lack = self._lacking(list(dict.fromkeys(needs)))
        return releases.why(lack) if lack else None

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
