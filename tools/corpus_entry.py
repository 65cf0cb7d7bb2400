"""A regression-corpus entry from a hand-reduced program: judge it, write the entry if it fails.

    .venv/bin/python tools/corpus_entry.py PROGRAM.json --like tests/regressions/ENTRY.json \
        [--key CHECK PIPELINE REFERENCE ERROR_TYPE] [--seed N] --out DIR

When the shrinker leaves noise, reduce the program by hand (a bare program JSON), then run this:
it replays the program on the pipelines that key needs (as `tests/regressions/test_corpus.py`
does), and when the key fails writes `DIR/<check>-<pipeline>-<hash8>.json`, a corpus entry like a
campaign's (the finding made from the verdict, exact input values), ready to copy into
tests/regressions/. The key comes from `--like` (the entry found by a campaign) or `--key`.
Exit 1, writing nothing, when the key does not fail on the program.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program")
    ap.add_argument("--like", help="a corpus entry whose finding key the program must fail")
    ap.add_argument("--key", nargs=4, metavar=("CHECK", "PIPELINE", "REFERENCE", "ERROR_TYPE"))
    ap.add_argument("--seed", type=int, default=0, help="input seed")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    from conformance.findings import CorpusEntry, make_finding
    from conformance.loading import corpus_entry_stem, load_program_file
    from conformance.runner import InProcessExecutor
    from conformance.search import replay_pipelines
    from generators.programs import input_values
    from oracles.expectations import Expectations
    from oracles.judge import judge

    if (a.like is None) == (a.key is None):
        ap.error("give exactly one of --like and --key")
    key = tuple(a.key) if a.key else load_program_file(a.like)[2].key()
    prog, _, _ = load_program_file(a.program)
    inputs = input_values(prog, a.seed)
    obs = InProcessExecutor("cpu").run(prog, inputs, replay_pipelines(key))
    j = judge(prog, obs, Expectations.load(), "cpu")
    v = next((v for v in j.failures() if v.key() == key), None)
    if v is None:
        print(f"{a.program}: {'|'.join(key)} does not fail; failing: "
              f"{sorted('|'.join(v.key()) for v in j.failures()) or 'nothing'}")
        return 1
    o = obs[key[1]]
    f = make_finding(v, prog, inputs, o.versions, o.flags, "cpu")
    f.shrunk = True
    entry = CorpusEntry(program=f.program, inputs=f.inputs, finding=f, versions=o.versions)
    out = Path(a.out) / f"{corpus_entry_stem(f.check, f.pipeline, f.program_hash)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(entry.model_dump(), indent=1) + "\n")
    print(f"wrote {out}: {f.signature} ({f.size} statements)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
