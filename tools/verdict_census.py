"""Census of the judge's verdicts on generated programs, run in-process.

    .venv/bin/python tools/verdict_census.py --programs 120 --seed 0 --pipelines jax:remat2,jax:remat3 [--no-custom-vjp]

Prints, per check, the number of programs with at least one failing verdict of that check
(and per (check, pipeline, reference)), then per (pipeline, check) the verdict counts by status.
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STATUSES = ("pass", "fail", "expected", "skipped", "unsupported")


def sample(n: int, seed: int, cfg):
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from generators.programs import cases
    out = []

    @hseed(seed)
    @settings(max_examples=n, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(cases(cfg))
    def collect(case):
        out.append(case)
    collect()
    return out[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--programs", type=int, default=120)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pipelines", default=None, help="rivals, comma-separated (references are added)")
    ap.add_argument("--no-custom-vjp", action="store_true", help="generate no custom_vjp blocks")
    a = ap.parse_args(argv)
    from conformance.cli.main import parse_pipelines
    from conformance.engine.runner import InProcessExecutor
    from generators.programs import Config, input_values
    from oracles.expectations import Expectations
    from oracles.judge import judge

    cfg = Config(custom_vjp=False) if a.no_custom_vjp else Config()
    names, exp, ex = parse_pipelines(a.pipelines), Expectations.load(), InProcessExecutor()
    by_check, by_key, counts = Counter(), Counter(), defaultdict(Counter)
    progs = sample(a.programs, a.seed, cfg)
    for k, (prog, seed) in enumerate(progs):
        j = judge(prog, ex.run(prog, input_values(prog, seed), names), exp)
        for v in j.verdicts:
            counts[(v.pipeline, v.check)][v.status] += 1
        fails = j.failures()
        by_check.update({v.check for v in fails})
        by_key.update({(v.check, v.pipeline, v.reference) for v in fails})
        print(f"\r{k + 1}/{len(progs)}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    print(f"{len(progs)} programs, seed {a.seed}, pipelines {','.join(names)}"
          + (", no custom_vjp" if a.no_custom_vjp else ""))
    print("\nprograms with a failing verdict, per check")
    for c, n in sorted(by_check.items(), key=lambda x: -x[1]):
        print(f"  {c:<12} {n:>5}")
    print("\nprograms with a failing verdict, per (check, pipeline, reference)")
    for (c, p, r), n in sorted(by_key.items(), key=lambda x: (-x[1], x[0])):
        print(f"  {c:<12} {p:<22} {r:<16} {n:>5}")
    print(f"\nverdicts per (pipeline, check)\n  {'pipeline':<22} {'check':<12}" + "".join(f"{s:>12}" for s in STATUSES))
    for (p, c), cnt in sorted(
        counts.items(), key=lambda x: (names.index(x[0][0]) if x[0][0] in names else 99, x[0][1])
    ):
        print(f"  {p:<22} {c:<12}" + "".join(f"{cnt.get(s, 0):>12}" for s in STATUSES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
