"""Isolated execution: pipelines run in supervised worker processes.

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

Timeouts: `timeout` bounds one pipeline's `run` on one program (started when the worker reports
that the pipeline is set up, so framework imports do not count; they have `setup_timeout`).
The worst case for one program is therefore `len(names) * timeout`; the campaign checks its
budget and shrink limits between programs.

Test-only pipelines: a spawned worker knows only the registry's pipelines. Modules named in
`plugins` (or in the environment variable REMAT_CONFORMANCE_PLUGINS, comma-separated) are
imported in the worker, and by `load_plugins()` in the supervisor, before anything runs; they
register their pipelines on import (`pipelines.register_instance`).
"""
from __future__ import annotations

import base64
import contextlib
import importlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from multiprocessing.connection import wait as mp_wait
from typing import Any, Sequence

import numpy as np

from conformance.observation import ErrorInfo, Observation

PLUGINS_ENV = "REMAT_CONFORMANCE_PLUGINS"
MEMORY_ENV = "REMAT_CONFORMANCE_WORKER_MEMORY_GB"
DEFAULT_MEMORY_LIMIT = 16 * 2**30
STAGES = ("setup", "validation", "lowering", "forward", "backward", "second_order")
TAIL_BYTES = 3000
# Error text that means the pipeline ran out of memory (Python, XLA, torch, C++).
OOM_MARKERS = ("MemoryError", "RESOURCE_EXHAUSTED", "std::bad_alloc", "Cannot allocate memory",
               "OutOfMemoryError", "out of memory", "Out of memory")


class ProtocolError(RuntimeError):
    pass


def load_plugins(modules: Sequence[str] | None = None) -> list[str]:
    """Import plugin modules (default: $REMAT_CONFORMANCE_PLUGINS). Returns their names."""
    if modules is None:
        modules = [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
    for m in modules:
        importlib.import_module(m)
    return list(modules)


# ---------------------------------------------------------------------------------------
# Encoding (both sides)
def encode_inputs(inputs: dict[str, np.ndarray]) -> dict[str, dict]:
    out = {}
    for k, v in inputs.items():
        a = np.asarray(v)   # tobytes() is C order whatever the layout (ascontiguousarray would make 0-d 1-d)
        out[k] = {"dtype": str(a.dtype), "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode()}
    return out


def decode_inputs(obj: Any, program) -> dict[str, np.ndarray]:
    """Inputs from their JSON form, checked against the program's inputs (ValueError if wrong)."""
    if not isinstance(obj, dict):
        raise ValueError("inputs: must be an object")
    types = {i.id: i for i in program.inputs}
    if set(obj) != set(types):
        raise ValueError(f"inputs: ids {sorted(obj)} do not match the program's {sorted(types)}")
    out = {}
    for k, d in obj.items():
        t = types[k]
        if (not isinstance(d, dict) or d.get("dtype") not in ("float16", "float32", "float64")
                or d.get("shape") != list(t.shape) or not isinstance(d.get("data"), str)):
            raise ValueError(f"inputs.{k}: not a float array of the program's shape {t.shape}")
        raw = base64.b64decode(d["data"], validate=True)
        a = np.frombuffer(raw, dtype=d["dtype"])
        if a.size != int(np.prod(t.shape, dtype=np.int64)):
            raise ValueError(f"inputs.{k}: {a.size} elements, expected shape {t.shape}")
        out[k] = a.reshape(t.shape).copy()
    return out


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def _dumps(obj) -> bytes:
    return json.dumps(obj, default=_json_default, separators=(",", ":")).encode()


def looks_oom(text: str) -> bool:
    return any(m in text for m in OOM_MARKERS)


# ---------------------------------------------------------------------------------------
# Worker side
_STAGE = None   # shared RawValue('i'): index into STAGES of the stage the pipeline is in, -1 none


def _mark(stage: str | None) -> None:
    if _STAGE is not None:
        _STAGE.value = STAGES.index(stage) if stage in STAGES else -1


def _install_stage_marker() -> None:
    """Wrap pipelines.base.timed (which every pipeline uses around its stages) so that the
    supervisor can tell in which stage a worker crashed or hung. Done before any pipeline
    module is imported, so their `from ... import timed` picks up the wrapper."""
    from conformance.pipelines import base
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
    except Exception:
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
    from conformance import pipelines as registry
    from conformance.ir import Limits
    load_plugins(cfg.get("plugins", []))
    limits = Limits(**cfg["limits"]) if cfg.get("limits") else None
    for name in cfg.get("preload", []):
        try:
            registry.get(name)
        except Exception:
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
    from conformance import pipelines as registry
    from conformance.ir import ProgramError, load_program
    from conformance.runner import run_one
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
    except Exception:
        pass   # run_one reports it as a HarnessError
    conn.send_bytes(_dumps({"type": "begin", "id": rid}))
    recycle = False
    try:
        obs = run_one(name, program, inputs, device)
    except MemoryError as e:   # run_one catches Exception; this is for safety
        obs = Observation(pipeline=name, device=device)
        obs.error = ErrorInfo(type="crash:oom", message=f"MemoryError: {e}", stage="setup")
    except Exception as e:     # e.g. an unknown pipeline name (run_one lets registry errors through)
        obs = Observation(pipeline=name, device=device)
        obs.error = ErrorInfo(type=f"HarnessError:{type(e).__name__}", message=str(e)[:4000], stage="setup")
    finally:
        stage = STAGES[_STAGE.value] if _STAGE is not None and _STAGE.value >= 0 else "setup"
        _mark(None)
    if obs.error is not None and not obs.error.type.startswith("crash:") and looks_oom(
            f"{obs.error.type} {obs.error.message[:2000]}"):
        # Out of memory under the worker's limit: a crash of the pipeline; the worker's heap is
        # suspect, so it is replaced after replying.
        obs.error = ErrorInfo(type="crash:oom", message=f"out of memory in the worker ({obs.error.type}, stage "
                              f"{obs.error.stage}): {obs.error.message}"[:4000],
                              stage=obs.error.stage if obs.error.stage != "setup" else stage)
        recycle = True
    return {"type": "result", "id": rid, "obs": obs.model_dump()}, recycle


# ---------------------------------------------------------------------------------------
# Supervisor side
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
        if self.proc.exitcode is None:
            for target in (lambda: os.killpg(self.pid, signal.SIGKILL), lambda: os.kill(self.pid, signal.SIGKILL)):
                try:
                    target()
                    break
                except (ProcessLookupError, PermissionError, OSError):
                    continue
        self.proc.join(5)
        with contextlib.suppress(Exception):
            self.conn.close()

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
        return "crash:unknown", "the worker stopped answering"
    if code < 0:
        try:
            sig = signal.Signals(-code).name
        except ValueError:
            sig = f"SIG{-code}"
        words = f"the worker was killed by {sig}"
        if sig == "SIGKILL":
            words += " (the kernel's OOM killer, or an external kill)"
        return f"crash:{sig}", words
    return f"crash:exit-{code}", f"the worker exited with status {code}"


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
        self._dir = tempfile.mkdtemp(prefix="remat-conformance-workers-")
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
            type_ = "crash:oom"
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
            obs = self._fail(name, "timeout", f"{name}: the worker did not start within {self.start_timeout:.0f}s\n"
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
                    return self._fail(name, "timeout", m, stage)
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
                    if obs.error is not None and obs.error.type == "crash:oom":
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


def _worker_limits():
    """The worker validates programs again, as untrusted input; its bounds are loose (the
    supervisor applied the user's limits) and stop only absurd sizes."""
    from conformance.ir import Limits
    return Limits(max_rank=8, max_dim=1 << 16, max_elements=1 << 26, max_depth=64, max_statements=100_000,
                  max_name_length=4096, max_inputs=1024)
