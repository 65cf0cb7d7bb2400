"""jobs > 1: searchers in worker processes (spawn context), the coordinator in this one.

Each searcher process builds its own executor (isolated framework workers by default) and runs
the rounds it is handed, sending every event back as JSON over a Pipe; the coordinator
(conformance.engine.campaign.Campaign.handle) is the only writer of the output directory, so records
are stored in arrival order, each once. A new finding is sent to every searcher, so that the
others count it as known instead of shrinking it again; while one searcher shrinks, the others
go on searching. Searchers ignore SIGINT, sit in their own process group and exit when the
coordinator dies; on Ctrl-C or at the end the coordinator stops them (and kills what does not
stop): a round that was not finished is not recorded as done and is run again on resume.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.connection import wait as mp_wait

from conformance.engine.findings import Finding
from conformance.engine.isolation import IsolatedExecutor, load_plugins
from conformance.engine.isolation.supervisor import DEFAULT_MEMORY_LIMIT, _main_not_reimported, kill_process
from conformance.engine.isolation.worker import _watch_parent
from conformance.engine.options import Options
from conformance.engine.runner import InProcessExecutor
from conformance.engine.search import Searcher, merge_finding
from generators.programs import Config
from oracles.expectations import Expectations

RESTARTS = 3


def _dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def worker_memory_limit(jobs: int) -> int | None:
    """Each job's framework worker gets an equal part of the machine's memory (at most 16 GiB)."""
    try:
        with open("/proc/meminfo") as f:
            total = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemTotal:"))
    except (OSError, StopIteration, ValueError):
        return DEFAULT_MEMORY_LIMIT
    return int(min(DEFAULT_MEMORY_LIMIT, 0.85 * total / max(jobs, 1)))


def _options_cfg(opts) -> dict:
    d = opts.model_dump(mode="json")
    d["generator"] = dataclasses.asdict(opts.generator) if opts.generator else None
    return d


# -- the searcher process --------------------------------------------------------------------
def _searcher_main(conn, cfg: dict) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    try:
        mp.current_process().daemon = False   # its executor starts worker processes
    except Exception:  # noqa: BLE001
        pass
    threading.Thread(target=_watch_parent, args=(cfg["ppid"],), daemon=True, name="parent-watch").start()
    from collections import Counter

    if os.environ.get("REMAT_CONFORMANCE_PLUGINS"):
        load_plugins()
    o = dict(cfg["options"])
    if o["generator"] is not None:
        o["generator"] = Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in o["generator"].items()})
    opts = Options(**o)
    if opts.isolate is not False:
        executor = IsolatedExecutor(opts.device, timeout=opts.timeout, memory_limit=opts.memory_limit)
    else:
        executor = InProcessExecutor(opts.device)
    expectations = Expectations.load(opts.expectations)
    findings: list[Finding] = []
    seen: set = set()
    done_shrinks: set = set()   # shrinks finding records hold (Searcher.done_shrinks)
    spk: Counter = Counter()
    state = {"deadline": 0.0, "stop": False}
    inbox: list[dict] = []

    def absorb(msg: dict) -> None:
        if msg["type"] == "findings":
            findings[:] = [Finding.model_validate(f) for f in msg["findings"]]
            for k, n in msg.get("shrinks_per_key", []):
                spk[tuple(k)] = max(spk[tuple(k)], n)
        elif msg["type"] == "stop":
            state["stop"] = True
        else:
            inbox.append(msg)

    def should_stop(grace: float = 0.0) -> bool:
        while conn.poll():
            absorb(json.loads(conn.recv_bytes()))
        return state["stop"] or time.time() >= state["deadline"] + grace

    def emit(ev: dict) -> None:
        conn.send_bytes(_dumps(ev))
        if ev["ev"] == "finding":
            merge_finding(findings, Finding.model_validate(ev["finding"]))

    searcher = Searcher(opts, executor, expectations, emit, findings, seen, spk, should_stop, cfg.get("versions"),
                        part=tuple(cfg.get("part", (0, 1))), done_shrinks=done_shrinks)
    try:
        while not state["stop"]:
            if not inbox:
                absorb(json.loads(conn.recv_bytes()))
                continue
            msg = inbox.pop(0)
            if msg["type"] != "round":
                continue
            state["deadline"] = msg["deadline"]
            seen.update(tuple(x) for x in msg["seen"])
            done_shrinks.update((tuple(o), tuple(k)) for o, k in msg.get("done_shrinks", []))
            findings[:] = [Finding.model_validate(f) for f in msg["findings"]]
            for k, n in msg["shrinks_per_key"]:
                spk[tuple(k)] = max(spk[tuple(k)], n)
            done = searcher.run_round(msg["round"])
            conn.send_bytes(_dumps({"ev": "idle", "round": msg["round"], "done": done}))
    except (EOFError, OSError, BrokenPipeError):
        pass
    finally:
        executor.close()


# -- the coordinator side --------------------------------------------------------------------
class _Slot:
    def __init__(self, ctx, index: int, cfg: dict):
        self.index = index
        self.conn, child = ctx.Pipe(duplex=True)
        part = {"part": (index, cfg["options"]["jobs"])}   # which explorers it runs (search.Shares)
        self.proc = ctx.Process(target=_searcher_main, args=(child, {**cfg, **part}), daemon=True,
                                name=f"remat-conformance-searcher-{index}")
        with _main_not_reimported():
            self.proc.start()
        child.close()
        self.round: int | None = None

    def send(self, obj) -> None:
        with contextlib.suppress(OSError, BrokenPipeError):
            self.conn.send_bytes(_dumps(obj))

    def stop(self) -> None:
        self.send({"type": "stop"})

    def kill(self) -> None:
        kill_process(self.proc, self.conn)


def run_parallel(c) -> None:
    ctx = mp.get_context("spawn")
    cfg = {"options": _options_cfg(c.opts), "ppid": os.getpid(), "versions": c.versions}
    rounds = c.pending_rounds()
    retry: list[int] = []
    slots = [_Slot(ctx, i, cfg) for i in range(c.opts.jobs)]
    restarts = 0

    def findings_msg():
        return [f.model_dump(mode="json") for f in c.findings]

    def assign(s: _Slot) -> bool:
        if c.over_budget():
            return False
        r = retry.pop(0) if retry else next(rounds, None)
        if r is None:
            return False
        s.round = r
        s.send({"type": "round", "round": r, "deadline": time.time() + c.opts.budget - c.elapsed(),
                "seen": sorted(c.seen), "findings": findings_msg(),
                "done_shrinks": [[list(o), list(k)] for o, k in sorted(c.done_shrinks)],
                "shrinks_per_key": [[list(k), n] for k, n in c.shrinks_per_key.items()]})
        return True

    def broadcast(_f):
        for s in slots:
            s.send({"type": "findings", "findings": findings_msg(),
                    "shrinks_per_key": [[list(k), n] for k, n in c.shrinks_per_key.items()]})

    c.on_finding = broadcast
    try:
        busy = [s for s in slots if assign(s)]
        while busy:
            ready = mp_wait([s.conn for s in busy] + [s.proc.sentinel for s in busy], timeout=0.5)
            for s in list(busy):
                if s.conn in ready or s.conn.poll():
                    try:
                        while s.conn.poll():
                            msg = json.loads(s.conn.recv_bytes())
                            if msg["ev"] == "idle":
                                s.round = None
                                if not (msg["done"] and assign(s)):
                                    busy.remove(s)
                                    s.stop()
                                break
                            c.handle(msg, searcher=s.index)
                    except (EOFError, OSError):
                        pass
                if s in busy and s.proc.exitcode is not None and not s.conn.poll():
                    # a searcher died (a harness bug, or killed): its round runs again elsewhere
                    busy.remove(s)
                    c.shrinking.pop(s.index, None)
                    if s.round is not None:
                        retry.append(s.round)
                    restarts += 1
                    if restarts > RESTARTS:
                        raise RuntimeError(f"searcher processes died {restarts} times (exit {s.proc.exitcode})")
                    fresh = _Slot(ctx, s.index, cfg)
                    slots[slots.index(s)] = fresh
                    if assign(fresh):
                        busy.append(fresh)
            c.progress(c)
            if c.elapsed() > c.opts.budget + 3 * c.opts.shrink_seconds + 60:
                break   # a searcher that does not stop in time is killed below
    finally:
        c.on_finding = None
        for s in slots:
            s.stop()
        t_end = time.monotonic() + 3
        for s in slots:
            s.proc.join(max(0.0, t_end - time.monotonic()))
            s.kill()
