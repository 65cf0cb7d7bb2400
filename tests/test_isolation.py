"""The isolated executor: crashes, hangs, OOM and garbage output in a pipeline are recorded as
observations (crash:SIG..., crash:exit-N, crash:oom, timeout) and never take the harness down.

Fault-injecting pipelines live in tests/fault_pipelines.py. Workers are reused: one executor
serves most tests of this module (a worker takes about a second to start and import jax).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

import tests.fault_pipelines as fault_pipelines
from conformance.engine.isolation import IsolatedExecutor, decode_inputs, encode_inputs
from conformance.engine.runner import InProcessExecutor
from conformance.ir.program import load_program
from generators.programs import Config, cases, input_values

REPO = Path(__file__).resolve().parents[1]
PLUGIN = fault_pipelines.__name__
TIMEOUT = 8.0   # ends the hang; generous enough that a loaded machine does not time out jax:none
PROG = load_program({"schema_version": 1, "inputs": [{"id": "x0", "shape": [3, 3], "dtype": "float32"}],
                     "body": [{"kind": "op", "op": "matmul", "args": ["x0", "x0"], "out": "v1"},
                              {"kind": "op", "op": "sin", "args": ["v1"], "out": "v2"}],
                     "outputs": ["v2"]})
INPUTS = input_values(PROG, 0)


@pytest.fixture(scope="module")
def ex():
    e = IsolatedExecutor(timeout=TIMEOUT, plugins=[PLUGIN])
    yield e
    e.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:   # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_every_fault_is_recorded_and_the_rest_still_runs(ex):
    names = ["fault:ok", "fault:abort", "fault:segv", "fault:exit", "fault:hang", "fault:bwd-raise",
             "fault:stdout", "jax:none"]
    restarts = ex.restarts
    t0 = time.monotonic()
    obs = ex.run(PROG, INPUTS, names)
    took = time.monotonic() - t0
    assert list(obs) == names                          # every pipeline has an observation
    want = {"fault:abort": ("crash:SIGABRT", "forward"), "fault:segv": ("crash:SIGSEGV", "backward"),
            "fault:exit": ("crash:exit-3", "forward"), "fault:hang": ("timeout", "backward"),
            "fault:bwd-raise": ("RuntimeError", "backward")}
    for n, (typ, stage) in want.items():
        e = obs[n].error
        assert e is not None and (e.type, e.stage) == (typ, stage), (n, e)
    assert "SIGSEGV" in obs["fault:segv"].error.message and "Segmentation fault" in obs["fault:segv"].error.message
    assert "status 3" in obs["fault:exit"].error.message
    assert f"{TIMEOUT:g}s" in obs["fault:hang"].error.message
    assert "injected failure in the backward pass" in obs["fault:bwd-raise"].error.message
    # results before and after the faults are intact, and equal
    ref = obs["jax:none"]
    assert ref.ok() and obs["fault:ok"].ok() and obs["fault:stdout"].ok()
    assert obs["fault:ok"].grads == ref.grads == obs["fault:stdout"].grads
    assert obs["fault:stdout"].pipeline == "fault:stdout"   # the forged protocol line on stdout was ignored
    assert ex.restarts - restarts == 4                # abort, segv, exit, hang; not bwd-raise, not stdout
    # the hang cost its timeout, not an hour: four restarts (each a worker importing jax, slow on
    # a loaded machine) + the timeout + the rest, with slack
    assert took < 4 * 20 + TIMEOUT + 30, took


def test_worker_is_reused_and_isolated_equals_in_process(ex):
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3:jit"]
    ex.run(PROG, INPUTS, names)
    pid = ex.worker_pid
    inproc = InProcessExecutor()
    checked = []

    @settings(max_examples=6, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(cases(Config(max_stmts=3, max_depth=2)))
    def compare(case):
        prog, seed = case
        inputs = input_values(prog, seed)
        a, b = ex.run(prog, inputs, names), inproc.run(prog, inputs, names)
        for n in names:
            da, db = a[n].model_dump(), b[n].model_dump()
            da.pop("timings"), db.pop("timings")
            assert json.dumps(da, sort_keys=True) == json.dumps(db, sort_keys=True), n
        checked.append(prog.content_hash())

    compare()
    assert len(checked) >= 3
    assert ex.worker_pid == pid                        # one worker served them all


def test_malformed_requests_are_rejected_by_the_worker(ex):
    bad = ex._run_one("jax:none", '{"schema_version": 1, "inputs": "nope"}', {})
    assert bad.error.type == "HarnessError:ProgramError" and bad.error.stage == "validation"
    wrong_inputs = ex._run_one("jax:none", PROG.to_json(), {"x0": {"dtype": "float32", "shape": [3, 3], "data": "!!"}})
    assert wrong_inputs.error.stage == "validation"
    unknown = ex.run(PROG, INPUTS, ["no:such-pipeline"])["no:such-pipeline"]
    assert unknown.error.type.startswith("HarnessError:")
    assert ex.run(PROG, INPUTS, ["jax:none"])["jax:none"].ok()


def test_inputs_round_trip_exactly():
    import numpy as np
    vals = {"x0": np.float32(np.pi) * np.ones((), np.float32), "x1": np.arange(6, dtype=np.float64).reshape(2, 3).T}
    prog = load_program({"schema_version": 1, "inputs": [{"id": "x0", "shape": [], "dtype": "float32"},
                                                         {"id": "x1", "shape": [3, 2], "dtype": "float64"}],
                         "body": [], "outputs": ["x0"]})
    back = decode_inputs(json.loads(json.dumps(encode_inputs(vals))), prog)
    for k in vals:
        assert back[k].dtype == vals[k].dtype and back[k].shape == vals[k].shape
        assert np.array_equal(back[k], vals[k])


def test_out_of_memory_under_the_worker_limit_is_a_crash_oom():
    # jax+numpy need ~1.3 GB of address space; 2.5 GiB leaves room to run and little to waste.
    with IsolatedExecutor(timeout=30, plugins=[PLUGIN], memory_limit=int(2.5 * 2**30)) as small:
        obs = small.run(PROG, INPUTS, ["jax:none", "fault:oom", "fault:oom-xla", "jax:remat2"])
        assert obs["jax:none"].ok() and obs["jax:remat2"].ok(), obs
        for n in ("fault:oom", "fault:oom-xla"):
            assert obs[n].error.type == "crash:oom", obs[n].error
            assert obs[n].error.stage == "forward"
        assert "MemoryError" in obs["fault:oom"].error.message
        assert "RESOURCE_EXHAUSTED" in obs["fault:oom-xla"].error.message
        assert obs["jax:remat2"].grads == obs["jax:none"].grads


SUPERVISOR = r"""
import json, os, sys, time
sys.path[:0] = [{repo!r}]
from conformance.engine.isolation import IsolatedExecutor
from conformance.ir.program import load_program
from generators.programs import input_values
if __name__ == "__main__":
    prog = load_program(json.loads({prog!r}))
    ex = IsolatedExecutor(timeout=30, plugins=[{plugin!r}])
    ex.run(prog, input_values(prog, 0), ["fault:ok"])
    print(ex.worker_pid, flush=True)
    if sys.argv[1] == "hang":
        ex.run(prog, input_values(prog, 0), ["fault:hang"])
    time.sleep(60)
"""


@pytest.mark.parametrize("when", ["idle", "hang"])
def test_workers_ignore_sigint_and_exit_when_the_supervisor_dies(tmp_path, when):
    script = tmp_path / "sup.py"
    script.write_text(SUPERVISOR.format(repo=str(REPO), prog=json.dumps(PROG.to_json_obj()), plugin=PLUGIN))
    mark = tmp_path / "hanging"
    env = {**os.environ, fault_pipelines.HANG_MARK_ENV: str(mark)}
    p = subprocess.Popen([sys.executable, str(script), when], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        pid = int(p.stdout.readline())     # idle: the worker has answered and waits for a request
        if when == "hang":                 # the worker is inside fault:hang
            deadline = time.monotonic() + 60
            while not mark.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert mark.exists(), "the worker never reached the hang"
        os.kill(pid, signal.SIGINT)        # the supervisor decides what Ctrl-C means, not the worker
        # a negative (the worker does not die of it) needs a window: half a second, not a sync
        time.sleep(0.5)
        assert _alive(pid)
        p.kill()                           # SIGKILL: no cleanup runs in the supervisor
        p.wait(10)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(pid), "worker outlived its supervisor"
    finally:
        if p.poll() is None:
            p.kill()


# the slow tier (make test-slow, nightly): a campaign through crashing and hanging pipelines, waiting out their timeouts
@pytest.mark.slow
def test_campaign_survives_crashes_and_hangs(tmp_path):
    """A whole campaign whose rival segfaults and hangs on every program: both behaviours become
    findings (crash, timeout), every program is recorded once, and the hang does not eat the
    budget (each shrink step is bounded by the timeout)."""
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO), "REMAT_CONFORMANCE_PLUGINS": PLUGIN}
    # a 6 s timeout: the references must not time out under load; the budget leaves time for the
    # second behaviour of the first program (the hang) to be shrunk after the crash
    budget, timeout, shrink_s = 30.0, 6.0, 4.0
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--pipelines", "fault:segv,fault:hang",
                        "--budget", str(budget), "--timeout", str(timeout), "--shrink-seconds", str(shrink_s),
                        "--shrink-steps", "3", "--max-stmts", "2", "--jobs", "1", "--out", str(out), "--quiet"],
                       capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    # bound: budget + two shrinks (their seconds + one step past them) + one program's worth of
    # timeouts + startup (a subprocess importing jax and torch, 60 s of slack for a loaded
    # machine). An unbounded hang would take an hour.
    assert took < budget + 2 * (shrink_s + timeout + 2) + 2 * (timeout + 2) + 60, took
    recs = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    results = [x for x in recs if x["type"] == "result"]
    assert results, recs
    assert [x["seq"] for x in results] == list(range(len(results)))
    assert len({(x["hash"], x["seed"]) for x in results}) == len(results)
    for x in results:   # both symptoms, in every program, and the references still ran (a reference may
        # raise what the expectations say it raises, e.g. remat2 on an offloading both(p, q) policy)
        faults = {k: v for k, v in x["errors"].items() if k.startswith("fault:")}
        assert faults == {"fault:segv": "crash:SIGSEGV", "fault:hang": "timeout"}, x["errors"]
        assert ["crash", "fault:segv", "expectations", "fail", "crash:SIGSEGV"] in x["verdicts"]
        assert ["timeout", "fault:hang", "expectations", "fail", "timeout"] in x["verdicts"]
    findings = json.loads((out / "findings.json").read_text())
    kinds = {(f["check"], f["pipeline"], f["error_type"]) for f in findings}
    assert ("crash", "fault:segv", "crash:SIGSEGV") in kinds, kinds
    assert ("timeout", "fault:hang", "timeout") in kinds, kinds
    hang = next(f for f in findings if f["check"] == "timeout")
    assert hang["detail"]["got"]["type"] == "timeout" and hang["detail"]["got"]["stage"] == "backward", hang["detail"]
    crash = next(f for f in findings if f["check"] == "crash")
    assert crash["shrunk"] and crash["detail"]["got"]["stage"] == "backward"
    assert "Segmentation fault" in crash["detail"]["got"]["message"]
    summary = (out / "summary.md").read_text()
    assert "fault:segv" in summary


def test_a_killed_supervisors_workers_folder_is_removed_by_the_next_supervisor(tmp_path, monkeypatch):
    """A campaign killed with SIGKILL cannot remove its workers' folder; the next executor on the machine does,
    and leaves a living supervisor's folder and anything else alone."""
    code = ("import os, signal\nfrom conformance.engine.isolation import IsolatedExecutor\n"
            "e = IsolatedExecutor(plugins=[])\nprint(e._dir, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO,
                       env={**os.environ, "TMPDIR": str(tmp_path)})
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    orphan = Path(r.stdout.strip())
    assert orphan.parent == tmp_path and orphan.is_dir()
    other = tmp_path / "remat-conformance-workers-notapid"
    other.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    with IsolatedExecutor(plugins=[]) as e:
        assert Path(e._dir).is_dir() and str(os.getpid()) in Path(e._dir).name
        assert not orphan.exists() and other.is_dir()
        with IsolatedExecutor(plugins=[]) as e2:   # a living supervisor's folder stays
            assert Path(e._dir).is_dir() and Path(e2._dir).is_dir()
    assert not Path(e._dir).exists()
