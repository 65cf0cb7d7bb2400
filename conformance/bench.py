"""Throughput benchmark (`make bench`): programs checked per second for each JAX pipeline and
for the default set, and the share of time spent inside framework calls, in one run.

    python -m conformance.bench [--programs N] [--seed S] [--torch]

All pipelines see the same programs, interleaved program by program, so machine noise
hits them alike; the figures that matter are the ratios printed side by side.
"""
from __future__ import annotations

import argparse
import time

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hseed

from conformance import pipelines as reg
from generators.programs import Config, cases, input_values
from oracles.expectations import Expectations
from oracles.judge import judge


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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m conformance.bench")
    ap.add_argument("--programs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--torch", action="store_true", help="also time the PyTorch pipelines")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    progs = sample_programs(args.programs, args.seed)
    gen_time = time.perf_counter() - t0
    names = list(reg.REFERENCES) + [p for p in reg.DEFAULT_PIPELINES if p not in reg.REFERENCES]
    if args.torch:
        names += ["torch:none", "torch:eager-sac", "torch:compile-aot_eager", "torch:compile-inductor"]
    exp = Expectations.load()
    per = {n: 0.0 for n in names}
    judge_time = 0.0
    # warm-up: first use imports the frameworks and compiles common kernels
    for n in names:
        reg.get(n).run(progs[0][0], input_values(*progs[0]))
    wall0 = time.perf_counter()
    for prog, seed in progs:
        inputs = input_values(prog, seed)
        obs = {}
        for n in names:
            t = time.perf_counter()
            obs[n] = reg.get(n).run(prog, inputs)
            per[n] += time.perf_counter() - t
        t = time.perf_counter()
        judge(prog, obs, exp)
        judge_time += time.perf_counter() - t
    wall = time.perf_counter() - wall0
    framework = sum(per.values())
    print(f"remat-conformance bench: {len(progs)} generated programs (seed {args.seed}), "
          f"generation {gen_time / len(progs) * 1e3:.1f} ms/program")
    print(f"{'pipeline':<34} {'programs/s':>10} {'ms/program':>11}")
    for n in names:
        print(f"{n:<34} {len(progs) / per[n]:>10.2f} {per[n] / len(progs) * 1e3:>11.1f}")
    print(f"{'default set (all of the above + judge)':<34} {len(progs) / wall:>10.2f} {wall / len(progs) * 1e3:>11.1f}")
    print(f"share of time inside framework calls (pipeline.run): {framework / wall:.1%}; "
          f"judging: {judge_time / wall:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
