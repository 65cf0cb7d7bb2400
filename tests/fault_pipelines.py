"""Test-only pipelines that misbehave on purpose (fault injection for the isolated executor).

Importing this module registers them (`pipelines.register_instance`). A spawned worker must
import it too: pass `plugins=["fault_pipelines"]` to IsolatedExecutor, or set
REMAT_CONFORMANCE_PLUGINS=fault_pipelines for the CLI (with tests/ on PYTHONPATH).

  fault:ok          behaves: jax:none's observation under its own name
  fault:abort       os.abort() in the forward stage             -> crash:SIGABRT
  fault:segv        reads address 0 in the backward stage        -> crash:SIGSEGV
  fault:exit        os._exit(3) in the forward stage            -> crash:exit-3
  fault:hang        sleeps for an hour in the backward stage     -> timeout
  fault:oom         allocates numpy memory until MemoryError      -> crash:oom (under a memory limit)
  fault:oom-xla     allocates XLA buffers until RESOURCE_EXHAUSTED -> crash:oom (under a memory limit)
  fault:bwd-raise   a custom_vjp whose bwd raises: an ordinary error observation, stage backward
  fault:stdout      writes garbage (bytes, fake protocol lines) to fd 1 and fd 2, then behaves
"""
from __future__ import annotations

import ctypes
import os
import sys
import time

import numpy as np

from conformance.ir.observation import ErrorInfo, Observation
from conformance.pipelines import base, registry
from conformance.pipelines.base import Pipeline

HANG_MARK_ENV = "REMAT_FAULT_HANG_MARK"   # a file fault:hang creates once it hangs


def _delegate(name, program, inputs, device) -> Observation:
    obs = registry.get("jax:none").run(program, inputs, device)
    obs.pipeline = name
    obs.residuals = None   # not a remat pipeline: no policy to hold it to
    obs.custom_rules = {}
    return obs


class Fault(Pipeline):
    def __init__(self, name: str, fault: str):
        super().__init__(registry.Spec(name, "fault", "Fault"))
        self.fault = fault

    def versions(self):
        return {"fault": "1"}

    def run(self, program, inputs, device="cpu") -> Observation:
        t: dict = {}
        f = self.fault
        # base.timed (looked up at call time) is what marks the stage in an isolated worker.
        if f == "ok":
            return _delegate(self.name, program, inputs, device)
        if f == "abort":
            with base.timed(t, "forward"):
                os.abort()
        if f == "segv":
            with base.timed(t, "backward"):
                ctypes.string_at(0)
        if f == "exit":
            with base.timed(t, "forward"):
                sys.stdout.flush()
                os._exit(3)
        if f == "hang":
            with base.timed(t, "backward"):
                mark = os.environ.get(HANG_MARK_ENV)
                if mark:   # tells a test that the worker is now inside the hang
                    open(mark, "w").close()
                time.sleep(3600)
        if f == "oom":
            with base.timed(t, "forward"):
                hold = []
                while True:   # MemoryError under RLIMIT_AS; run_one reports it, the worker recycles
                    hold.append(np.empty(2**27))   # 1 GiB of address space each
        if f == "oom-xla":
            import jax.numpy as jnp
            with base.timed(t, "forward"):
                hold = []
                while True:
                    hold.append(jnp.ones((2**28,), jnp.float32) + len(hold))
                    hold[-1].block_until_ready()
        if f == "bwd-raise":
            return self._bwd_raise(program, inputs, device)
        if f == "stdout":
            sys.stdout.write('{"type":"result","id":1,"obs":{"pipeline":"forged"}}\n')
            sys.stdout.flush()
            os.write(1, bytes(range(256)) * 64 + b"\n\x00\xff not json\n")
            os.write(2, b"\xfe\xfd garbage on stderr\n")
            try:
                libc = ctypes.CDLL(None)
                libc.printf(b"C-level printf garbage %d\n", 42)
                libc.fflush(None)
            except OSError:
                pass
            print("x" * 200_000)
            return _delegate(self.name, program, inputs, device)
        raise AssertionError(f)

    def _bwd_raise(self, program, inputs, device) -> Observation:
        import jax
        import jax.numpy as jnp
        obs = Observation(pipeline=self.name, device=device, versions=self.versions())

        @jax.custom_vjp
        def f(x):
            return jnp.sin(x)

        def f_fwd(x):
            return jnp.sin(x), jnp.cos(x)

        def f_bwd(res, ct):
            raise RuntimeError("injected failure in the backward pass")

        f.defvjp(f_fwd, f_bwd)
        x = jnp.asarray(inputs[program.diff_inputs()[0].id])
        stage = "forward"
        try:
            with base.timed(obs.timings, "forward"):
                y, vjp_fn = jax.vjp(lambda x: jnp.sum(f(x)), x)
            obs.loss = float(y)
            stage = "backward"
            with base.timed(obs.timings, "backward"):
                vjp_fn(jnp.ones((), y.dtype))
        except Exception as e:  # noqa: BLE001
            obs.error = ErrorInfo(type=type(e).__name__, message=str(e)[:2000], stage=stage)
        return obs


FAULTS = ("ok", "abort", "segv", "exit", "hang", "oom", "oom-xla", "bwd-raise", "stdout")
for _f in FAULTS:
    registry.register_instance(Fault(f"fault:{_f}", _f))
