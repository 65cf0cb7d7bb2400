"""A regression-corpus entry from a hand-reduced program: judge it, write the entry if it fails.

    .venv/bin/python tools/corpus_entry.py PROGRAM.json --like tests/regressions/ENTRY.json \
        [--key CHECK PIPELINE REFERENCE ERROR_TYPE] [--seed N] --out DIR

When the shrinker leaves noise, reduce the program by hand (a bare program JSON), then run this:
it replays the program as a campaign replays a shrunk finding (the key's pipelines and the
default set of its framework), and when the key fails writes `DIR/<check>-<pipeline>-<hash8>.json`,
a corpus entry like a campaign's (the finding made from the verdict, its observations, exact input
values, and `reproduces`: the sibling pipelines failing the same way, which `run --known` counts
as the same behaviour), ready to copy into tests/regressions/. The key comes from `--like` (the entry found by a campaign) or `--key`.
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
    from conformance import pipelines as registry
    from conformance.runner import InProcessExecutor
    from conformance.search import obs_digest, replay_pipelines
    from generators.programs import input_values
    from oracles.expectations import Expectations
    from oracles.judge import judge

    if (a.like is None) == (a.key is None):
        ap.error("give exactly one of --like and --key")
    like = load_program_file(a.like)[2] if a.like else None
    key = tuple(a.key) if a.key else like.key()
    prog, _, _ = load_program_file(a.program)
    inputs = input_values(prog, a.seed)
    # as a campaign files a finding: replayed on every pipeline of its framework's default set
    # (and the like-entry's siblings), the keys failing the same way are its siblings
    fw = registry.framework_of(key[1])
    names = registry.run_set(list(dict.fromkeys(
        [key[1]] + ([k[1] for k in like.reproduces] if like else [])
        + [n for n in registry.DEFAULT_PIPELINES if registry.framework_of(n) == fw])))
    obs = InProcessExecutor("cpu").run(prog, inputs, list(dict.fromkeys(replay_pipelines(key) + names)))
    j = judge(prog, obs, Expectations.load(), "cpu")
    v = next((v for v in j.failures() if v.key() == key), None)
    if v is None:
        print(f"{a.program}: {'|'.join(key)} does not fail; failing: "
              f"{sorted('|'.join(v.key()) for v in j.failures()) or 'nothing'}")
        return 1
    o = obs[key[1]]
    f = make_finding(v, prog, inputs, o.versions, o.flags, "cpu")
    f.shrunk = True
    f.detail = {**f.detail, "observations": obs_digest(obs, key[1])}
    f.reproduces = sorted([list(w.key()) for w in j.failures()
                           if w.check == key[0] and (w.error_type or "") == key[3] and w.key() != key])
    entry = CorpusEntry(program=f.program, inputs=f.inputs, finding=f, versions=o.versions)
    out = Path(a.out) / f"{corpus_entry_stem(f.check, f.pipeline, f.program_hash)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(entry.model_dump(), indent=1) + "\n")
    print(f"wrote {out}: {f.signature} ({f.size} statements)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
