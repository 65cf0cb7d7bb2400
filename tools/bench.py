"""Throughput benchmark (`make bench`), every figure measured side by side in one run.

    python tools/bench.py [--programs N] [--seed S] [--campaign-seconds T] [--jax-only]

1. The floor and the harness on the same generated programs, each in a fresh process (so each
   pays its own compiles): per pipeline, the harness's time (`pipeline.run`: observation,
   residual canonicalisation) against the floor, bare framework calls that do the same
   differentiation once (eager: one trace and execution of forward+backward; jit: one compile
   and execution; second order where the program asks for it); for the default set, the
   harness's whole per-program time (generation, the isolated executor, judging) against the
   sum of the pipelines' floors plus one reference evaluation.
2. Campaigns of the default set with --jobs 1 and --jobs 2 for the same wall time and seed:
   programs checked, the speed-up, findings, and the distribution of shrunk sizes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed

from conformance.pipelines import registry as reg
from conformance.pipelines.jax import xla_cache
from generators.programs import Config, cases, input_values

ROOT = Path(__file__).resolve().parents[1]


def sample_programs(n: int, seed: int):
    out = []

    @hseed(seed)
    @settings(max_examples=n, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(cases(Config()))
    def collect(case):
        out.append(case)
    collect()
    return out[:n]


def _names(torch: bool) -> list[str]:
    """The default campaign's pipelines (`torch` False: its JAX ones only)."""
    return [n for n in reg.run_set(list(reg.DEFAULT_PIPELINES)) if torch or reg.framework_of(n) == "jax"]


# -- the floor: bare framework calls --------------------------------------------------------
def jax_floor(name: str, prog, inputs) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from conformance.pipelines.jax.pipelines import Lowering, jax_flags
    s = reg.spec(name)
    low = Lowering(prog, remat=s.remat, cast_f64=s.f64)
    arr = {i.id: jnp.asarray(np.asarray(inputs[i.id], dtype="float64" if s.f64 else i.dtype)) for i in prog.inputs}
    diff = [i.id for i in prog.inputs if i.diff]
    const = {i.id: arr[i.id] for i in prog.inputs if not i.diff}
    d = [arr[i] for i in diff]

    def loss(*xs):
        return sum(jnp.sum(o).astype(jnp.float64) for o in low.outputs(const, diff, xs))
    argnums = tuple(range(len(d)))
    with jax_flags(s.flags):
        try:
            if s.jit:
                jax.block_until_ready(jax.jit(jax.value_and_grad(loss, argnums=argnums))(*d))
            else:
                out, pullback = jax.vjp(loss, *d)
                jax.block_until_ready(pullback(jnp.ones((), jnp.float64)))
            if prog.diff.order == 2:
                g2 = jax.grad(lambda *x: sum(jnp.sum(g) for g in jax.grad(loss, argnums=argnums)(*x)), argnums=argnums)
                jax.block_until_ready((jax.jit(g2) if s.jit else g2)(*d))
        except Exception:   # a program that raises costs what it costs  # noqa: BLE001
            pass


def torch_floor(name: str, prog, inputs) -> None:
    import torch

    from conformance.pipelines.torch.lowering import Lowering, tensor
    s = reg.spec(name)
    low = Lowering(prog, remat=s.remat, prefer=s.prefer)
    diff = [i.id for i in prog.inputs if i.diff]
    const = {i.id: tensor(inputs[i.id], i.dtype) for i in prog.inputs if not i.diff}
    d = [tensor(inputs[i.id], i.dtype).requires_grad_(True) for i in prog.inputs if i.diff]

    def loss(*xs):
        return sum(torch.sum(o).to(torch.float64) for o in low.outputs(const, diff, xs))
    try:
        fn = torch.compile(loss, backend=s.compile, dynamic=False) if s.compile else loss
        out = fn(*d)
        if out.requires_grad:
            torch.autograd.grad(out, d, allow_unused=True)
    except Exception:  # noqa: BLE001
        pass
    finally:
        if s.compile:
            torch._dynamo.reset()


def part_floor(progs, names) -> dict:
    per = {n: 0.0 for n in names}
    for n in names:   # warm-up: imports and first kernels
        (torch_floor if reg.framework_of(n) == "torch" else jax_floor)(n, *_first(progs))
    for prog, seed in progs:
        inputs = input_values(prog, seed)
        for n in names:
            t = time.perf_counter()
            (torch_floor if reg.framework_of(n) == "torch" else jax_floor)(n, prog, inputs)
            per[n] += time.perf_counter() - t
    return {"per": per}


def _first(progs):
    prog, seed = progs[0]
    return prog, input_values(prog, seed)


# -- the harness --------------------------------------------------------------------------
def part_harness(progs, names) -> dict:
    from conformance.engine.isolation import IsolatedExecutor
    from oracles.expectations import Expectations
    from oracles.judge import judge
    exp = Expectations.load()
    # First, the whole per-program path a campaign takes: generation, the isolated executor,
    # judging. First, so that a compile cache it is given starts empty, as a campaign's does
    # (measured after the per-pipeline loop, it would read back what that loop compiled).
    ex = IsolatedExecutor()
    ex.run(*_first(progs[-1:]), names)   # warm-up on a program outside the timed ones
    t0 = time.perf_counter()
    sample_programs(len(progs), 1)
    gen = time.perf_counter() - t0
    t0 = time.perf_counter()
    for prog, seed in progs[:-1]:
        inputs = input_values(prog, seed)
        judge(prog, ex.run(prog, inputs, names), exp)
    whole = (time.perf_counter() - t0) * len(progs) / max(len(progs) - 1, 1) + gen
    ex.close()
    per = {n: 0.0 for n in names}
    for n in names:
        reg.get(n).run(*_first(progs))
    for prog, seed in progs:
        inputs = input_values(prog, seed)
        for n in names:
            t = time.perf_counter()
            reg.get(n).run(prog, inputs)
            per[n] += time.perf_counter() - t
    return {"per": per, "whole": whole, "generation": gen}


def _part(kind: str, n: int, seed: int, torch: bool, cache: str = "off") -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", kind, "--programs", str(n), "--seed", str(seed)]
    if not torch:
        cmd.append("--jax-only")
    # both sides cold: no compile cache shared between them (`cache`: a fresh one of its own)
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), xla_cache.ENV: cache})
    if r.returncode != 0:
        raise SystemExit(f"bench part {kind} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- campaigns ------------------------------------------------------------------------------
def campaign(jobs: int, seconds: float, seed: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"bench-jobs{jobs}-"))
    cmd = [sys.executable, "-m", "conformance.cli", "run", "--budget", str(seconds), "--seed", str(seed),
           "--jobs", str(jobs), "--out", str(out / "run"), "--quiet"]
    t0 = time.perf_counter()
    # as `make run` runs: a compile cache of the campaign's own
    env = {k: v for k, v in os.environ.items() if k != xla_cache.ENV}
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"campaign --jobs {jobs} failed:\n{r.stderr[-3000:]}")
    recs = [json.loads(x) for x in (out / "run" / "results.jsonl").read_text().splitlines() if x.strip()]
    findings = json.loads((out / "run" / "findings.json").read_text())
    sizes = [f["size"] for f in recs if f["type"] == "finding" and isinstance(f.get("size"), int)]
    return {"programs": sum(x["type"] == "result" for x in recs), "wall": wall, "findings": len(findings),
            "behaviours": [f"{f['check']}|{f['pipeline']}|{f['error_type']}" for f in findings], "sizes": sizes,
            "siblings": sum(len(f.get("reproduces", [])) for f in findings)}


def _dist(sizes: list[int]) -> str:
    if not sizes:
        return "no shrinks"
    s = sorted(sizes)
    p90 = statistics.quantiles(s, n=10, method="inclusive")[8] if len(s) > 1 else s[0]
    return f"{len(s)} shrinks: median {statistics.median(s):g}, 90th percentile {p90:g}, max {s[-1]} statements"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/bench.py")
    ap.add_argument("--programs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--campaign-seconds", type=float, default=90.0, help="0: skip the campaigns")
    ap.add_argument("--jax-only", dest="torch", action="store_false",
                    help="time the default set's JAX pipelines only")
    ap.add_argument("--part", choices=["floor", "harness"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = _names(args.torch)
    if args.part:
        progs = sample_programs(args.programs, args.seed)
        res = (part_floor if args.part == "floor" else part_harness)(progs, names)
        print(json.dumps(res))
        return 0

    n = args.programs
    floor = _part("floor", n, args.seed, args.torch)
    harness = _part("harness", n, args.seed, args.torch)
    print(f"remat-conformance bench: {n} generated programs (seed {args.seed}); each side in a fresh process")
    print(f"{'pipeline':<28} {'harness ms':>11} {'floor ms':>9} {'ratio':>6}")
    for p in names:
        h, f = harness["per"][p] / n * 1e3, floor["per"][p] / n * 1e3
        print(f"{p:<28} {h:>11.1f} {f:>9.1f} {h / f:>6.2f}")
    fl = sum(floor["per"].values()) / n * 1e3
    wh = harness["whole"] / n * 1e3
    print(f"{'default set, per program':<28} {wh:>11.1f} {fl:>9.1f} {wh / fl:>6.2f}"
          f"   (harness: generation {harness['generation'] / n * 1e3:.1f} ms, isolated executor, judge)")
    cores = os.cpu_count() or 1
    print(f"{'  ceiling at the floor':<28} {cores * 240 / (fl / 1e3):>11.0f} programs in 240 s on {cores} cores "
          f"(every core busy with nothing but these framework calls: no start-up, judging or shrinking)")
    with xla_cache.campaign_cache() as d:   # the same harness with a campaign's compile cache, cold
        cached = _part("harness", n, args.seed, args.torch, cache=d)
    wc = cached["whole"] / n * 1e3
    print(f"{'  with the compile cache':<28} {wc:>11.1f} {fl:>9.1f} {wc / fl:>6.2f}"
          f"   (a fresh cache, as each campaign gets: {wh / wc:.2f}x the programs per second)")
    if args.campaign_seconds > 0:
        t = args.campaign_seconds
        one, two = campaign(1, t, args.seed), campaign(2, t, args.seed)
        print(f"campaign of the default set, {t:g}s budget, seed {args.seed}, {os.cpu_count()} cores:")
        for j, c in ((1, one), (2, two)):
            print(f"  --jobs {j}: {c['programs']} programs ({c['programs'] / c['wall']:.2f}/s over {c['wall']:.0f}s "
                  f"wall), {c['findings']} findings ({c['siblings']} sibling pipelines merged); shrunk sizes: "
                  f"{_dist(c['sizes'])}")
        print(f"  speed-up jobs=2 / jobs=1: {two['programs'] / max(one['programs'], 1):.2f}x programs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
