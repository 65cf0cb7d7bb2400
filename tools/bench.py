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
import contextlib
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
from conformance.pipelines.jax import eager_cache, xla_cache
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
    return [n for n in reg.run_set(list(reg.CORE_PIPELINES)) if torch or reg.framework_of(n) == "jax"]


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
    jit = reg.get(name).traced()   # as the pipeline runs (ref:f64: jitted unless under framework defaults)
    with jax_flags(s.flags):
        try:
            if jit:
                jax.block_until_ready(jax.jit(jax.value_and_grad(loss, argnums=argnums))(*d))
            else:
                out, pullback = jax.vjp(loss, *d)
                jax.block_until_ready(pullback(jnp.ones((), jnp.float64)))
            if prog.diff.order == 2:
                g2 = jax.grad(lambda *x: sum(jnp.sum(g) for g in jax.grad(loss, argnums=argnums)(*x)), argnums=argnums)
                jax.block_until_ready((jax.jit(g2) if jit else g2)(*d))
        except Exception:   # a program that raises costs what it costs  # noqa: BLE001
            pass


def torch_floor(name: str, prog, inputs) -> None:
    from contextlib import nullcontext

    import torch

    from conformance.pipelines.torch import prelude
    from conformance.pipelines.torch.lowering import Lowering, tensor
    s = reg.spec(name)
    low = Lowering(prog, remat=s.remat, prefer=s.prefer,
                   options={"respect_hooks": s.hooks != "user_bypassed", "func_vmap": s.func_vmap})
    diff = [i.id for i in prog.inputs if i.diff]
    const = {i.id: tensor(inputs[i.id], i.dtype) for i in prog.inputs if not i.diff}
    d = [tensor(inputs[i.id], i.dtype).requires_grad_(True) for i in prog.inputs if i.diff]

    def loss(*xs):
        return sum(torch.sum(o).to(torch.float64) for o in low.outputs(const, diff, xs))
    try:
        fn = torch.compile(loss, backend=s.compile, dynamic=False) if s.compile else loss
        if s.export:   # the composition options, as the pipelines run them
            fn = prelude.exported(fn, d, strict=s.export == "strict")
        if s.functional_call:
            fn = prelude.functional(fn, 0)
        hooks = (torch.autograd.graph.disable_saved_tensors_hooks(prelude.HOOKS_OFF) if s.hooks == "disabled"
                 else torch.autograd.graph.saved_tensors_hooks(*prelude.saved_tensor_hooks(s.hooks)) if s.hooks
                 else nullcontext())
        with hooks, torch.utils.checkpoint.set_checkpoint_early_stop(not s.early_stop_off):
            out = fn(*d)
        if out.requires_grad:
            torch.autograd.grad(out, d, allow_unused=True)
    except Exception:  # noqa: BLE001
        pass
    finally:
        if s.compile:
            torch._dynamo.reset()


def part_floor(progs, names, selected: list[list[str]]) -> dict:
    """The floor of the pipelines the harness's campaign path selected on each program."""
    per = {n: 0.0 for n in names}
    for n in names:   # warm-up: imports and first kernels
        (torch_floor if reg.framework_of(n) == "torch" else jax_floor)(n, *_warm(progs))
    for (prog, seed), chosen in zip(progs, selected):
        inputs = input_values(prog, seed)
        for n in chosen:
            t = time.perf_counter()
            (torch_floor if reg.framework_of(n) == "torch" else jax_floor)(n, prog, inputs)
            per[n] += time.perf_counter() - t
    return {"per": per}


def _warm(progs):
    """The warm-up program: the last one sampled, outside the timed ones."""
    prog, seed = progs[-1]
    return prog, input_values(prog, seed)


# -- the harness --------------------------------------------------------------------------
def part_harness(progs, names, before: bool = False) -> dict:
    """The harness on the programs as a campaign checks them: the pipelines its shares select
    (search.Shares: family time shares, the declared program shares of twins), the isolated
    executor, judging; then each selected pipeline's own time (`pipeline.run`)."""
    from conformance.engine.isolation import IsolatedExecutor
    from conformance.engine.search import Shares
    from oracles.expectations import Expectations
    from oracles.judge import judge
    exp = Expectations.load()
    # First, the whole per-program path a campaign takes: generation, the isolated executor,
    # judging. First, so that a compile cache it is given starts empty, as a campaign's does
    # (measured after the per-pipeline loop, it would read back what that loop compiled).
    ex = IsolatedExecutor()
    ex.run(*_warm(progs), names)   # warm-up on a program outside the timed ones
    t0 = time.perf_counter()
    sample_programs(len(progs), 1)
    gen = time.perf_counter() - t0
    # before: every pipeline on every program (no declared program shares)
    shares, selected = Shares(names, {n: 1.0 for n in reg.shared_pipelines(names)} if before else None), []
    t0 = time.perf_counter()
    for prog, seed in progs[:-1]:
        chosen = shares.select(prog, names)
        obs = ex.run(prog, input_values(prog, seed), chosen)
        judge(prog, obs, exp)
        shares.account(prog, obs)
        selected.append(chosen)
    whole = time.perf_counter() - t0 + gen
    ex.close()
    per = {n: 0.0 for n in names}
    for n in names:
        reg.get(n).run(*_warm(progs))
    for (prog, seed), chosen in zip(progs, selected):
        inputs = input_values(prog, seed)
        for n in chosen:
            t = time.perf_counter()
            reg.get(n).run(prog, inputs)
            per[n] += time.perf_counter() - t
    return {"per": per, "whole": whole, "generation": gen, "selected": selected}


def _part(kind: str, n: int, seed: int, torch: bool, cache: str = "off", before: bool = False,
          selected: str | None = None) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", kind, "--programs", str(n), "--seed", str(seed)]
    if not torch:
        cmd.append("--jax-only")
    if before:
        cmd.append("--before")
    if selected:
        cmd += ["--selected", selected]
    # both sides cold: no compile cache shared between them (`cache`: a fresh one of its own)
    env = {**os.environ, "PYTHONPATH": str(ROOT), xla_cache.ENV: cache}
    if before:   # JAX as configured: a compile per flag setting, every pipeline on every program
        env[eager_cache.DEFAULTS_ENV] = "1"
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if r.returncode != 0:
        raise SystemExit(f"bench part {kind} failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def side(n: int, seed: int, torch: bool, before: bool, cache: bool = False) -> tuple[dict, dict]:
    """(harness, floor) of one configuration; the floor runs what the harness selected. `cache`:
    each side with a fresh XLA compile cache of its own (a cold campaign's; make run's is the machine's)."""
    def fresh():
        return xla_cache.fresh_cache() if cache else contextlib.nullcontext("off")
    with fresh() as d:
        harness = _part("harness", n, seed, torch, cache=d, before=before)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(harness["selected"], f)
    try:
        with fresh() as d:
            return harness, _part("floor", n, seed, torch, cache=d, before=before, selected=f.name)
    finally:
        os.unlink(f.name)


# -- campaigns ------------------------------------------------------------------------------
def campaign(jobs: int, seconds: float, seed: int, before: bool = False) -> dict:
    """A default campaign (`make run`'s: the corpus as --known) of `seconds`; `before`: JAX's own eager cache per
    flag setting, every pipeline on every program, torch.compile's time share as it was (0.4), and no --known (every
    failing program's new key shrunk)."""
    out = Path(tempfile.mkdtemp(prefix=f"bench-jobs{jobs}-"))
    cmd = [sys.executable, "-m", "conformance.cli", "run", "--budget", str(seconds), "--seed", str(seed),
           "--jobs", str(jobs), "--out", str(out / "run"), "--quiet"]
    # cold: a compile cache of its own (make run's is the machine's, warm from earlier campaigns)
    env = {**os.environ, xla_cache.ENV: xla_cache.FRESH}
    if before:
        env[eager_cache.DEFAULTS_ENV] = "1"
        for n in reg.shared_pipelines(reg.run_set(list(reg.CORE_PIPELINES))):
            cmd += ["--share", f"{n}=1"]
        cmd += ["--share", "torch:compile=0.4"]
    else:
        cmd += ["--known", str(ROOT / "tests" / "regressions")]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)})
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"campaign --jobs {jobs} failed:\n{r.stderr[-3000:]}")
    recs = [json.loads(x) for x in (out / "run" / "results.jsonl").read_text().splitlines() if x.strip()]
    findings = [f for f in json.loads((out / "run" / "findings.json").read_text())
                if not f.get("tracked") or f.get("count")]   # (a --known root this run never saw is not a finding)
    sizes = [f["size"] for f in recs if f["type"] == "finding" and isinstance(f.get("size"), int)]
    return {"programs": sum(x["type"] == "result" for x in recs), "wall": wall, "findings": len(findings),
            "roots": len({f.get("tracked") or f.get("root") or f["check"] + f["pipeline"] for f in findings}),
            "behaviours": [f"{f['check']}|{f['pipeline']}|{f['error_type']}" for f in findings], "sizes": sizes,
            "siblings": sum(len(f.get("reproduces", [])) for f in findings)}


def _dist(sizes: list[int]) -> str:
    if not sizes:
        return "no shrinks"
    s = sorted(sizes)
    p90 = statistics.quantiles(s, n=10, method="inclusive")[8] if len(s) > 1 else s[0]
    return f"{len(s)} shrinks: median {statistics.median(s):g}, 90th percentile {p90:g}, max {s[-1]} statements"


def _print_side(label: str, n: int, harness: dict, floor: dict, names: list[str]) -> float:
    print(f"{label}:")
    print(f"  {'pipeline':<28} {'programs':>8} {'harness ms':>11} {'floor ms':>9} {'ratio':>6}")
    ran = {p: sum(p in c for c in harness["selected"]) for p in names}
    for p in names:   # per program it ran on
        k = max(ran[p], 1)
        h, f = harness["per"][p] / k * 1e3, floor["per"][p] / k * 1e3
        print(f"  {p:<28} {ran[p]:>8} {h:>11.1f} {f:>9.1f} {h / f if f else float('nan'):>6.2f}")
    fl = sum(floor["per"].values()) / n * 1e3
    wh = harness["whole"] / n * 1e3
    print(f"  {'default set, per program':<28} {n:>8} {wh:>11.1f} {fl:>9.1f} {wh / fl:>6.2f}"
          f"   (harness: generation {harness['generation'] / n * 1e3:.1f} ms, isolated executor, judge)")
    return fl


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/bench.py")
    ap.add_argument("--programs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--campaign-seconds", type=float, default=90.0, help="0: skip the campaigns")
    ap.add_argument("--jax-only", dest="torch", action="store_false",
                    help="time the default set's JAX pipelines only")
    ap.add_argument("--no-information", dest="information", action="store_false",
                    help="skip the corpus measure of which pipelines detect which roots (tools/information.py)")
    ap.add_argument("--part", choices=["floor", "harness"], help=argparse.SUPPRESS)
    ap.add_argument("--before", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--selected", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    names = _names(args.torch)
    if args.part:
        progs = sample_programs(args.programs + 1, args.seed)
        if args.part == "floor":
            res = part_floor(progs, names, json.loads(Path(args.selected).read_text()))
        else:
            res = part_harness(progs, names, args.before)
        print(json.dumps(res))
        return 0

    n = args.programs
    print(f"remat-conformance bench: {n} generated programs (seed {args.seed}) as a campaign selects their "
          f"pipelines; each side in a fresh process; per pipeline, ms per program it ran on")
    hb, fb = side(n, args.seed, args.torch, before=True)
    floor_before = _print_side("before: JAX's own eager cache per flag setting, every pipeline on every program, "
                               "no compile cache", n, hb, fb, names)
    ha, fa = side(n, args.seed, args.torch, before=False)
    floor_after = _print_side("after: the shared eager cache, the jitted float64 reference, twins on their "
                              "declared shares, no compile cache", n, ha, fa, names)
    hc, fc = side(n, args.seed, args.torch, before=False, cache=True)
    floor_cached = _print_side("after, each side with a fresh XLA compile cache of its own (as a campaign runs)",
                               n, hc, fc, names)
    print(f"floor per program of the default set: {floor_before:.0f} ms before, {floor_after:.0f} ms after "
          f"({floor_before / floor_after:.2f}x lower), {floor_cached:.0f} ms after with a campaign's compile cache "
          f"({floor_before / floor_cached:.2f}x lower); the harness against it: "
          f"{hb['whole'] / n * 1e3 / floor_before:.2f}x, {ha['whole'] / n * 1e3 / floor_after:.2f}x, "
          f"{hc['whole'] / n * 1e3 / floor_cached:.2f}x")
    cores = os.cpu_count() or 1
    print(f"{'  ceiling at the floor':<28} {cores * 240 / (floor_cached / 1e3):>11.0f} programs in 240 s on {cores} "
          f"cores (every core busy with nothing but these framework calls: no start-up, judging or shrinking)")
    if args.information:
        sys.path.insert(0, str(ROOT / "tools"))
        import information
        info = information.measure()
        print("where detection comes from: the corpus roots each default pipeline detects (tools/information.py)")
        information.print_table(information.table(info, names), info)
    if args.campaign_seconds > 0:
        t = args.campaign_seconds
        before = campaign(cores, t, args.seed, before=True)
        one, two = campaign(1, t, args.seed), campaign(cores, t, args.seed)
        print(f"campaign of the default set, {t:g}s budget, seed {args.seed}, {cores} cores:")
        for label, c in (("before, --jobs %d" % cores, before), ("--jobs 1", one), (f"--jobs {cores}", two)):
            print(f"  {label}: {c['programs']} programs ({c['programs'] / c['wall'] * 60:.0f}/min over "
                  f"{c['wall']:.0f}s wall), {c['findings']} findings of {c['roots']} roots "
                  f"({c['findings'] / max(c['roots'], 1):.2f} per root, {c['siblings']} sibling pipelines merged); "
                  f"shrunk sizes: {_dist(c['sizes'])}")
        print(f"  programs after / before: {two['programs'] / max(before['programs'], 1):.2f}x; "
              f"speed-up jobs={cores} / jobs=1: {two['programs'] / max(one['programs'], 1):.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
