"""Record the harness's behaviour on a fixed set of programs: tests/data/behaviour.json.

The set: every program of the regression corpus (each root's variants) and the fixture corpora, plus a fixed sample of
generated programs (stored as programs, so later generator changes do not move it). For
each case it stores the judge's verdicts and every pipeline's canonical residual digest.
tests/test_behaviour.py replays the set and asserts the same. Re-record only on purpose
(a change that is meant to change verdicts), and say so in the commit:

    .venv/bin/python tools/record_behaviour.py

`--keep-cases` re-records the stored cases (their programs and inputs) instead of building
the set anew, so that a judge change is recorded without a generator change moving the sample.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "tests" / "data" / "behaviour.json"

# Pipelines each kind of case runs (references are added by the registry).
ENTRY_PIPELINES = "jax:remat2:jit,jax:remat3,jax:remat3:jit,jax:remat3+cvjp3,jax:remat3+cvjp3:jit,torch:eager-sac"
SAMPLE_PIPELINES = ENTRY_PIPELINES
COMPILED_PIPELINES = "jax:remat3,torch:compile-aot_eager"
N_SAMPLE, N_COMPILED = 36, 8


def sample_programs(n: int, seed: int):
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from generators.programs import cases
    out = []

    @hseed(seed)
    @settings(max_examples=n, database=None, phases=(Phase.generate,), deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(cases())
    def collect(case):
        out.append(case)
    collect()
    return out[:n]


def new_cases():
    from conformance.engine.loading import load_corpus_variants
    from generators.programs import input_values
    cases = []
    entries = sorted(ROOT.glob("tests/regressions/*.json")) + sorted(ROOT.glob("tests/fixtures/*/corpus/*.json"))
    for p in entries:
        if p.name == "status.json":
            continue
        for name, prog, inputs, _ in load_corpus_variants(str(p)):
            cases.append((f"entry:{p.relative_to(ROOT)}:{name}", prog, inputs, ENTRY_PIPELINES))
    for k, (prog, seed) in enumerate(sample_programs(N_SAMPLE, 7)):
        cases.append((f"sample:{k}", prog, input_values(prog, seed), SAMPLE_PIPELINES))
    for k, (prog, seed) in enumerate(sample_programs(N_COMPILED, 99)):
        cases.append((f"compiled:{k}", prog, input_values(prog, seed), COMPILED_PIPELINES))
    return cases


def stored_cases():
    from conformance.engine.findings import InputValue, decode_inputs
    from conformance.ir.program import load_program
    return [(c["id"], load_program(c["program"]),
             decode_inputs({k: InputValue.model_validate(v) for k, v in c["inputs"].items()}), c["pipelines"])
            for c in json.loads(OUT.read_text())["cases"]]


def main() -> int:
    from conformance.engine.findings import encode_inputs
    from tests.behaviour import behaviour
    cases = stored_cases() if "--keep-cases" in sys.argv[1:] else new_cases()
    out = []
    for cid, prog, inputs, pipes in cases:
        print(cid, file=sys.stderr)
        out.append({"id": cid, "pipelines": pipes, "program": prog.to_json_obj(),
                    "inputs": {k: v.model_dump() for k, v in encode_inputs(inputs).items()},
                    **{k: (list(map(list, v)) if k == "verdicts" else v)
                       for k, v in behaviour(prog, inputs, pipes).items()}})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"doc": __doc__.strip().splitlines()[0], "cases": out}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT} ({len(out)} cases)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
