"""Everything that runs inside a worker process: the entry point (spawn context), request
handling, the stage marker, the parent watch and the worker's own program limits.

Workers ignore SIGINT, sit in their own process group, exit by themselves when the
supervisor dies, send fd 1 and fd 2 to a log file and run under RLIMIT_AS when asked.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import sys
import threading
import time

from conformance.engine.isolation.protocol import _dumps, decode_inputs, load_plugins, looks_oom
from conformance.engine.runner import run_one
from conformance.ir.nodes import Limits, ProgramError
from conformance.ir.observation import ErrorInfo, Observation
from conformance.ir.program import load_program
from conformance.ir.verdict import CRASH_OOM, CRASH_PREFIX, STAGES
from conformance.pipelines import base, registry

_STAGE = None   # shared RawValue('i'): index into STAGES of the stage the pipeline is in, -1 none


def _mark(stage: str | None) -> None:
    if _STAGE is not None:
        _STAGE.value = STAGES.index(stage) if stage in STAGES else -1


def _install_stage_marker() -> None:
    """Wrap pipelines.base.timed (which every pipeline uses around its stages) so that the
    supervisor can tell in which stage a worker crashed or hung. Done before any pipeline
    module is imported, so their `from ... import timed` picks up the wrapper."""
    orig = base.timed

    @contextlib.contextmanager
    def timed(timings, key):
        if key in STAGES:
            _mark(key)
        with orig(timings, key):
            yield
    base.timed = timed


def _watch_parent(ppid: int) -> None:
    while True:
        time.sleep(0.5)
        if os.getppid() != ppid:
            os._exit(70)


def _worker_main(conn, cfg: dict, stage_value) -> None:
    """Entry point of a worker process (spawn context)."""
    global _STAGE
    _STAGE = stage_value
    try:   # a daemonic process may not start children; the frameworks' compile pools may
        mp.current_process().daemon = False
    except Exception:  # noqa: BLE001
        pass
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    fd = os.open(cfg["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    import faulthandler
    faulthandler.enable(file=sys.stderr, all_threads=False)
    threading.Thread(target=_watch_parent, args=(cfg["ppid"],), daemon=True, name="parent-watch").start()
    if cfg.get("memory_limit"):
        import resource
        lim = int(cfg["memory_limit"])
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    _install_stage_marker()
    load_plugins(cfg.get("plugins", []))
    limits = Limits(**cfg["limits"]) if cfg.get("limits") else None
    for name in cfg.get("preload", []):
        try:
            registry.get(name)
        except Exception:  # noqa: BLE001
            pass   # reported when the pipeline is asked for
    conn.send_bytes(_dumps({"type": "ready", "pid": os.getpid()}))
    while True:
        try:
            req = json.loads(conn.recv_bytes())
        except EOFError:
            return
        if req.get("type") == "exit":
            return
        if req.get("type") == "run":
            reply, recycle = _handle(conn, req, limits)
            conn.send_bytes(_dumps(reply))
            if recycle:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(0)


def _handle(conn, req: dict, limits) -> tuple[dict, bool]:
    name, device, rid = req["name"], req["device"], req["id"]
    _mark("validation")
    obs = Observation(pipeline=name, device=device)
    try:
        program = load_program(json.loads(req["program"]), limits)
        inputs = decode_inputs(req["inputs"], program)
    except (ProgramError, ValueError, TypeError) as e:
        obs.error = ErrorInfo(type=f"HarnessError:{type(e).__name__}", message=f"worker: invalid request: {e}"[:4000],
                              stage="validation")
        return {"type": "result", "id": rid, "obs": obs.model_dump()}, False
    _mark("setup")
    try:
        registry.get(name)
    except Exception:  # noqa: BLE001
        pass   # run_one reports it as a HarnessError
    conn.send_bytes(_dumps({"type": "begin", "id": rid}))
    recycle = False
    try:
        obs = run_one(name, program, inputs, device)
    except MemoryError as e:   # run_one catches Exception; this is for safety
        obs = Observation(pipeline=name, device=device)
        obs.error = ErrorInfo(type=CRASH_OOM, message=f"MemoryError: {e}", stage="setup")
    except Exception as e:     # e.g. an unknown pipeline name (run_one lets registry errors through)  # noqa: BLE001
        obs = Observation(pipeline=name, device=device)
        obs.error = ErrorInfo(type=f"HarnessError:{type(e).__name__}", message=str(e)[:4000], stage="setup")
    finally:
        stage = STAGES[_STAGE.value] if _STAGE is not None and _STAGE.value >= 0 else "setup"
        _mark(None)
    if obs.error is not None and not obs.error.type.startswith(CRASH_PREFIX) and looks_oom(
            f"{obs.error.type} {obs.error.message[:2000]}"):
        # Out of memory under the worker's limit: a crash of the pipeline; the worker's heap is
        # suspect, so it is replaced after replying.
        obs.error = ErrorInfo(type=CRASH_OOM, message=f"out of memory in the worker ({obs.error.type}, stage "
                              f"{obs.error.stage}): {obs.error.message}"[:4000],
                              stage=obs.error.stage if obs.error.stage != "setup" else stage)
        recycle = True
    return {"type": "result", "id": rid, "obs": obs.model_dump()}, recycle


def _worker_limits():
    """The worker validates programs again, as untrusted input; its bounds are loose (the
    supervisor applied the user's limits) and stop only absurd sizes."""
    return Limits(max_rank=8, max_dim=1 << 16, max_elements=1 << 26, max_depth=64, max_statements=100_000,
                  max_name_length=4096, max_inputs=1024)
