"""The supervising side of isolated execution: `IsolatedExecutor` and its worker handle.

`IsolatedExecutor` has the interface of `runner.InProcessExecutor`
(`run(program, inputs, names) -> {name: Observation}`, `close()`), but each pipeline runs in a
worker process started with the multiprocessing *spawn* context (never fork: JAX and torch own
threads). One worker is reused from program to program, so the frameworks are imported and
initialised once; isolation costs a round trip of two small JSON messages per pipeline
(`python -m conformance.bench_isolation` measures it).

What the supervisor guarantees
- A worker that dies (a signal, an abort, `os._exit`, the memory limit) or does not finish one
  pipeline within `timeout` seconds is killed (with its process group) and replaced; that
  pipeline's observation gets `error = ErrorInfo(type=...)` with type `crash:SIGSEGV`,
  `crash:SIGABRT`, `crash:SIGKILL`, `crash:exit-N`, `crash:oom` or `timeout`, a message with the
  signal or exit status and the tail of the worker's stderr, and the stage the pipeline was in
  when the worker's stage marker knew it (`setup` otherwise). The program's remaining pipelines
  still run, in a fresh worker.
- Messages travel over a multiprocessing Pipe as JSON bytes (`send_bytes`/`recv_bytes`), never
  pickle: programs go as IR JSON and are validated again in the worker, inputs as base64 raw
  bytes with dtype and shape, observations come back as JSON of `Observation.model_dump()`
  and are validated by pydantic. The worker's fd 1 and fd 2 go to a log file, so whatever a
  pipeline prints cannot corrupt the protocol; the file's tail goes into crash messages.
- Workers ignore SIGINT (the supervisor decides what Ctrl-C means), sit in their own process
  group (a terminal's Ctrl-C does not reach them), exit by themselves when the supervisor dies
  (a thread polls `os.getppid()`), and run under `RLIMIT_AS` (`memory_limit` bytes, 16 GiB by
  default on CPU, environment `REMAT_CONFORMANCE_WORKER_MEMORY_GB`), so running out of memory
  fails in the worker (MemoryError, XLA RESOURCE_EXHAUSTED: reported as `crash:oom`, worker
  recycled) and the OOM killer never picks the test runner. On CUDA no address-space limit is
  set unless asked for (the CUDA driver reserves large virtual ranges).
- The workers' logs live in a temporary folder named with the supervisor's pid, removed on close; one left by a
  supervisor that was killed (SIGKILL) is removed by the next supervisor started on the machine.

Timeouts: `timeout` bounds one pipeline's `run` on one program (started when the worker reports
that the pipeline is set up, so framework imports do not count; they have `setup_timeout`).
The worst case for one program is therefore `len(names) * timeout`; the campaign checks its
budget and shrink limits between programs.

Plugins (test-only pipelines) are described in conformance.engine.isolation.protocol.
"""
from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import time
import weakref
from multiprocessing.connection import wait as mp_wait
from typing import Sequence

import numpy as np

from conformance.engine.isolation.protocol import ProtocolError, _dumps, encode_inputs, load_plugins, looks_oom
from conformance.engine.isolation.worker import _worker_limits, _worker_main
from conformance.ir.observation import ErrorInfo, Observation
from conformance.ir.verdict import CRASH_OOM, STAGES, TIMEOUT, crash_type

MEMORY_ENV = "REMAT_CONFORMANCE_WORKER_MEMORY_GB"
DEFAULT_MEMORY_LIMIT = 16 * 2**30
TAIL_BYTES = 3000


class _Worker:
    def __init__(self, ctx, cfg: dict):
        self.log = cfg["log"]
        self.stage = ctx.RawValue("i", -1)
        self.conn, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, cfg, self.stage), daemon=True,
                                name="remat-conformance-worker")
        self.started = time.monotonic()
        with _main_not_reimported():
            self.proc.start()
        child.close()
        self.ready = False
        self.pid = self.proc.pid

    def alive(self) -> bool:
        return self.proc.exitcode is None

    def kill(self) -> None:
        kill_process(self.proc, self.conn)

    def stop(self, grace: float = 2.0) -> None:
        if self.proc.exitcode is None:
            with contextlib.suppress(Exception):
                self.conn.send_bytes(_dumps({"type": "exit"}))
            self.proc.join(grace)
        self.kill()

    def stage_name(self) -> str:
        v = self.stage.value
        return STAGES[v] if 0 <= v < len(STAGES) else "setup"

    def tail(self) -> str:
        try:
            with open(self.log, "rb") as f:
                f.seek(0, os.SEEK_END)
                n = f.tell()
                f.seek(max(0, n - TAIL_BYTES))
                data = f.read()
        except OSError:
            return ""
        return data.decode("utf-8", errors="replace").strip()


def kill_process(proc, conn) -> None:
    """SIGKILL a worker process and its process group (it leads one), reap it, close its pipe."""
    if proc.exitcode is None:
        for target in (lambda: os.killpg(proc.pid, signal.SIGKILL), lambda: os.kill(proc.pid, signal.SIGKILL)):
            try:
                target()
                break
            except (ProcessLookupError, PermissionError, OSError):
                continue
    proc.join(5)
    with contextlib.suppress(Exception):
        conn.close()


@contextlib.contextmanager
def _main_not_reimported():
    """Spawn normally re-imports the parent's __main__ in the child (a script without a
    __main__ guard would run again, pytest would be imported for nothing). Workers need nothing
    from __main__, so it is hidden while the worker is started."""
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__spec__", "__file__") if main is not None and k in main.__dict__}
    try:
        if main is not None:
            main.__dict__["__spec__"] = None
            main.__dict__.pop("__file__", None)
        yield
    finally:
        if main is not None:
            main.__dict__.update(saved)


class _Died(Exception):
    pass


class _TimedOut(Exception):
    pass


def _describe_exit(code: int | None) -> tuple[str, str]:
    """(error type, words) for a worker's exit code."""
    if code is None:
        return crash_type("unknown"), "the worker stopped answering"
    if code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"SIG{-code}"
        words = f"the worker was killed by {sig}"
        if sig == "SIGKILL":
            words += " (the kernel's OOM killer, or an external kill)"
        return crash_type(sig), words
    return crash_type(f"exit-{code}"), f"the worker exited with status {code}"


WORKERS_DIR_PREFIX = "remat-conformance-workers-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's
        return True
    return True


def sweep_orphaned_worker_dirs(root: str | None = None) -> int:
    """Remove the workers' folders (their logs) of supervisors that died without closing (a SIGKILL: a killed
    campaign, a resume test); each folder's name carries its supervisor's pid. Returns how many went."""
    root = root or tempfile.gettempdir()
    gone = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(root):
            if not name.startswith(WORKERS_DIR_PREFIX):
                continue
            pid = name.removeprefix(WORKERS_DIR_PREFIX).split("-", 1)[0]
            if pid.isdigit() and not _alive(int(pid)):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
                gone += 1
    return gone


class IsolatedExecutor:
    """Runs pipelines in a supervised, reused worker process. See the module docstring."""
    isolated = True

    def __init__(self, device: str = "cpu", timeout: float = 120.0, memory_limit: int | None | str = "default",
                 plugins: Sequence[str] | None = None, preload: Sequence[str] = (), limits=None,
                 setup_timeout: float = 300.0, start_timeout: float = 120.0):
        self.device = device
        self.timeout = float(timeout)
        self.setup_timeout = max(float(setup_timeout), self.timeout)
        self.start_timeout = float(start_timeout)
        if memory_limit == "default":
            env = os.environ.get(MEMORY_ENV)
            if env:
                memory_limit = int(float(env) * 2**30) if float(env) > 0 else None
            else:
                memory_limit = DEFAULT_MEMORY_LIMIT if device == "cpu" else None
        self.memory_limit = memory_limit
        self.plugins = load_plugins(plugins)
        self.preload = list(preload)
        self.limits = limits if limits is not None else _worker_limits()
        self._ctx = mp.get_context("spawn")
        sweep_orphaned_worker_dirs()
        self._dir = tempfile.mkdtemp(prefix=f"{WORKERS_DIR_PREFIX}{os.getpid()}-")
        self._worker: _Worker | None = None
        self._n = 0
        self._req = 0
        self._used: list[str] = []
        # counters, for tests and the benchmark
        self.restarts = 0
        self.crashes = 0
        self.timeouts = 0
        self.worker_starts: list[float] = []   # seconds from spawn to ready
        self._finalizer = weakref.finalize(self, IsolatedExecutor._cleanup, self._holder(), self._dir)

    # -- lifecycle ---------------------------------------------------------------------------
    def _holder(self):
        self._box = [None]
        return self._box

    @staticmethod
    def _cleanup(box, d):
        w = box[0]
        if w is not None:
            with contextlib.suppress(Exception):
                w.kill()
        shutil.rmtree(d, ignore_errors=True)

    def _spawn(self) -> _Worker:
        self._n += 1
        cfg = {"log": os.path.join(self._dir, f"worker{self._n}.log"), "ppid": os.getpid(),
               "memory_limit": self.memory_limit, "plugins": self.plugins,
               "preload": list(dict.fromkeys(self.preload + self._used)),
               "limits": self.limits.model_dump() if self.limits is not None else None}
        w = _Worker(self._ctx, cfg)
        self._worker = w
        self._box[0] = w
        return w

    def _ensure(self) -> _Worker:
        w = self._worker
        if w is None or not w.alive():
            if w is not None:
                w.kill()
                self.restarts += 1
            w = self._spawn()
        if not w.ready:
            msg = self._recv(w, time.monotonic() + self.start_timeout)   # _Died, _TimedOut propagate
            if msg.get("type") != "ready":
                raise ProtocolError(f"expected ready, got {msg.get('type')!r}")
            w.ready = True
            self.worker_starts.append(time.monotonic() - w.started)
        return w

    def _replace(self, w: _Worker) -> None:
        """Kill a dead, hung or suspect worker and start its successor now, so that the
        successor imports the frameworks while the supervisor carries on."""
        w.kill()
        self._worker = None
        self._box[0] = None
        self.restarts += 1
        self._spawn()

    def close(self) -> None:
        w = self._worker
        self._worker = None
        self._box[0] = None
        if w is not None:
            if w.ready:
                w.stop()
            else:
                w.kill()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def worker_pid(self) -> int | None:
        return self._worker.pid if self._worker is not None else None

    # -- messages ------------------------------------------------------------------------
    def _recv(self, w: _Worker, deadline: float) -> dict:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _TimedOut()
            ready = mp_wait([w.conn, w.proc.sentinel], timeout=min(left, 1.0))
            if w.conn in ready:
                try:
                    data = w.conn.recv_bytes()
                except (EOFError, OSError):
                    w.proc.join(2)
                    raise _Died() from None
                try:
                    msg = json.loads(data)
                except (json.JSONDecodeError, UnicodeDecodeError) as e:
                    raise ProtocolError(f"undecodable message from the worker: {e}") from None
                if not isinstance(msg, dict):
                    raise ProtocolError("a message from the worker is not an object")
                return msg
            if w.proc.sentinel in ready or not w.alive():
                # Drain a reply that raced with the exit (a recycled worker replies, then exits).
                if w.conn.poll(0):
                    continue
                w.proc.join(2)
                raise _Died()

    # -- running ---------------------------------------------------------------------------
    def run(self, program, inputs: dict[str, np.ndarray], names: list[str]) -> dict[str, Observation]:
        payload_program = program.to_json()
        payload_inputs = encode_inputs(inputs)
        for n in names:
            if n not in self._used:
                self._used.append(n)
        return {n: self._run_one(n, payload_program, payload_inputs) for n in names}

    def _fail(self, name: str, type_: str, message: str, stage: str) -> Observation:
        obs = Observation(pipeline=name, device=self.device)
        obs.error = ErrorInfo(type=type_, message=message[:4000], stage=stage)
        return obs

    def _crash_obs(self, name: str, w: _Worker, stage: str, when: str) -> Observation:
        w.proc.join(2)
        code = w.proc.exitcode
        tail = w.tail()
        type_, words = _describe_exit(code)
        if looks_oom(tail):
            type_ = CRASH_OOM
            words += " after running out of memory"
        self.crashes += 1
        msg = f"{name}: {words} {when} (exit status {code}); stage {stage}"
        if tail:
            msg += f"\n--- worker stderr (tail) ---\n{tail[-TAIL_BYTES:]}"
        return self._fail(name, type_, msg, stage)

    def _run_one(self, name: str, program_json: str, inputs_json: dict) -> Observation:
        try:
            w = self._ensure()
        except ProtocolError as e:
            w = self._worker
            self._replace(w)
            return self._fail(name, "HarnessError:ProtocolError", f"{name}: {e}", "setup")
        except _Died:
            w = self._worker
            obs = self._crash_obs(name, w, "setup", "while starting")
            self._replace(w)
            return obs
        except _TimedOut:
            w = self._worker
            obs = self._fail(name, TIMEOUT, f"{name}: the worker did not start within {self.start_timeout:.0f}s\n"
                             + w.tail(), "setup")
            self.timeouts += 1
            self._replace(w)
            return obs
        self._req += 1
        rid = self._req
        with contextlib.suppress(OSError):
            os.truncate(w.log, 0)
        w.stage.value = -1
        busy = True
        try:
            w.conn.send_bytes(_dumps({"type": "run", "id": rid, "name": name, "device": self.device,
                                      "program": program_json, "inputs": inputs_json}))
            began = False
            deadline = time.monotonic() + self.setup_timeout
            while True:
                try:
                    msg = self._recv(w, deadline)
                except _TimedOut:
                    stage = w.stage_name()
                    limit = self.timeout if began else self.setup_timeout
                    tail = w.tail()
                    w.kill()
                    self.timeouts += 1
                    self._replace(w)
                    busy = False
                    m = (f"{name}: no result within {limit:g}s ({'running' if began else 'setting up'}, stage "
                         f"{stage}); the worker was killed")
                    if tail:
                        m += f"\n--- worker stderr (tail) ---\n{tail[-TAIL_BYTES:]}"
                    return self._fail(name, TIMEOUT, m, stage)
                except _Died:
                    stage = w.stage_name()
                    obs = self._crash_obs(name, w, stage, "while running" if began else "while setting up")
                    self._replace(w)
                    busy = False
                    return obs
                if msg.get("id") != rid:
                    raise ProtocolError(f"reply for request {msg.get('id')!r}, expected {rid}")
                if msg.get("type") == "begin":
                    began = True
                    deadline = time.monotonic() + self.timeout
                    continue
                if msg.get("type") == "result":
                    busy = False
                    obs = Observation.model_validate(msg["obs"])
                    if obs.error is not None and obs.error.type == CRASH_OOM:
                        self.crashes += 1
                        tail = w.tail()
                        if tail:
                            obs.error.message = (obs.error.message + f"\n--- worker stderr (tail) ---\n{tail}")[:4000]
                        w.proc.join(5)   # it exits by itself after an OOM
                        self._replace(w)
                    return obs
                raise ProtocolError(f"unexpected message type {msg.get('type')!r}")
        except ProtocolError as e:
            busy = False
            self._replace(w)
            return self._fail(name, "HarnessError:ProtocolError", f"{name}: {e}", "setup")
        except (ValueError, TypeError) as e:   # an observation that does not validate
            busy = False
            self._replace(w)
            return self._fail(name, f"HarnessError:{type(e).__name__}", f"{name}: bad reply from the worker: {e}",
                              "setup")
        finally:
            if busy:   # interrupted (Ctrl-C) while the worker works: it cannot be trusted to be idle
                w.kill()
                self._worker = None
                self._box[0] = None
