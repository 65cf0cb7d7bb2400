"""What isolation costs: the same programs through the in-process and the isolated executor,
side by side in one run (interleaved, alternating which goes first), with per-program figures.

    python tools/bench_isolation.py [--programs 20] [--pipelines a,b] [--seed 0]

Prints the worker start-up time (paid once, and again after each crash), the per-program wall
time of both executors (mean, median), the paired difference (isolated - in-process) and the
bare round trip of one request that does no work.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time


def collect_programs(n: int, seed: int, max_stmts: int):
    """n generated (program, input seed) cases, deterministic for a seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from generators.programs import Config, cases
    got = []

    @hseed(seed)
    @settings(max_examples=n * 3, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(cases(Config(max_stmts=max_stmts)))
    def draw(case):
        if len(got) < n and case[0].content_hash() not in {p.content_hash() for p, _ in got}:
            got.append(case)

    draw()
    return got


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/bench_isolation.py", description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=20)
    ap.add_argument("--pipelines", default=None, help="default: the references and the default rivals")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-stmts", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)

    from conformance.engine.isolation import IsolatedExecutor
    from conformance.engine.runner import InProcessExecutor
    from conformance.pipelines import registry as reg
    from generators.programs import input_values

    names = (list(reg.REFERENCES) + [p for p in reg.CORE_PIPELINES if p not in reg.REFERENCES]
             if args.pipelines is None else args.pipelines.split(","))
    progs = collect_programs(args.programs + 1, args.seed, args.max_stmts)
    inproc = InProcessExecutor(args.device)
    iso = IsolatedExecutor(args.device, timeout=300)
    try:
        # warm-up (imports, first compilations, worker start) on a program that is not measured
        p0, s0 = progs[0]
        t = time.perf_counter()
        inproc.run(p0, input_values(p0, s0), names)
        warm_in = time.perf_counter() - t
        t = time.perf_counter()
        iso.run(p0, input_values(p0, s0), names)
        warm_iso = time.perf_counter() - t
        rows = []
        for i, (p, s) in enumerate(progs[1:]):
            inputs = input_values(p, s)
            order = [("in", inproc), ("iso", iso)] if i % 2 == 0 else [("iso", iso), ("in", inproc)]
            dt = {}
            for tag, ex in order:
                t = time.perf_counter()
                ex.run(p, inputs, names)
                dt[tag] = time.perf_counter() - t
            rows.append((p.size(), dt["in"], dt["iso"]))
        # the bare round trip: a request the worker answers without running anything
        rt = []
        for _ in range(50):
            t = time.perf_counter()
            iso.run(p0, input_values(p0, s0), ["bench:no-such-pipeline"])
            rt.append(time.perf_counter() - t)
        starts = list(iso.worker_starts)
    finally:
        iso.close()

    ins = [r[1] for r in rows]
    isos = [r[2] for r in rows]
    diff = [r[2] - r[1] for r in rows]
    n = len(rows)
    print(f"isolation benchmark: {n} programs x {len(names)} pipelines ({', '.join(names)}), device {args.device}")
    print(f"  worker start-up (spawn, import, ready): {', '.join(f'{s:.2f}s' for s in starts)}")
    print(f"  warm-up program (imports, first compile): in-process {warm_in:.2f}s, isolated {warm_iso:.2f}s")
    print(f"  {'':24}{'mean':>10}{'median':>10}")
    print(f"  {'in-process per program':24}{statistics.mean(ins) * 1e3:>8.1f}ms{statistics.median(ins) * 1e3:>8.1f}ms")
    print(f"  {'isolated per program':24}{statistics.mean(isos) * 1e3:>8.1f}ms{statistics.median(isos) * 1e3:>8.1f}ms")
    print(f"  {'difference (paired)':24}{statistics.mean(diff) * 1e3:>8.1f}ms{statistics.median(diff) * 1e3:>8.1f}ms"
          f"   ({statistics.median(diff) / statistics.median(ins) * 100:+.1f}% of the median in-process time)")
    print(f"  bare round trip (one request, no work): median {statistics.median(rt) * 1e3:.2f}ms "
          f"=> ~{statistics.median(rt) * len(names) * 1e3:.1f}ms per program of {len(names)} pipelines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
