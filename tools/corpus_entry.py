"""Regression-corpus entries made or refreshed by hand, replayed as a campaign files a finding.

    .venv/bin/python tools/corpus_entry.py PROGRAM.json --like tests/regressions/ENTRY.json \
        [--key CHECK PIPELINE REFERENCE ERROR_TYPE] [--seed N] --out DIR
    .venv/bin/python tools/corpus_entry.py --siblings tests/regressions/*.json

When the shrinker leaves noise, reduce the program by hand (a bare program JSON), then run the
first form: it replays the program as a campaign replays a shrunk finding (the key's pipelines
and the default set of its framework), and when the key fails writes
`DIR/<check>-<pipeline>-<hash8>.json`, a corpus entry like a campaign's (the finding made from
the verdict, its observations, exact input values, and `reproduces`: the sibling keys failing
the same way, which `run --known` counts as the same behaviour), ready to copy into
tests/regressions/. The key comes from `--like` (the entry found by a campaign) or `--key`.
Exit 1, writing nothing, when the key does not fail on the program.

`--siblings` replays existing entries the same way and adds the sibling keys that fail the same
way now to each entry's `reproduces` (entries filed before siblings were recorded lack them).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def replay(prog, inputs, key: tuple, also=()):
    """(observations, judgement, verdict of `key` or None): the program on the key's pipelines,
    the default set of its framework and the pipelines `also` names."""
    from conformance.engine.runner import InProcessExecutor
    from conformance.engine.search import replay_pipelines
    from conformance.pipelines import registry
    from oracles.expectations import Expectations
    from oracles.judge import judge
    fw = registry.framework_of(key[1])
    names = registry.run_set(list(dict.fromkeys(
        [key[1], *also] + [n for n in registry.CORE_PIPELINES if registry.framework_of(n) == fw])))
    obs = InProcessExecutor("cpu").run(prog, inputs, list(dict.fromkeys(replay_pipelines(key) + names)))
    j = judge(prog, obs, Expectations.load(), "cpu")
    return obs, j, next((v for v in j.failures() if v.key() == tuple(key)), None)


def refresh_siblings(paths: list[str]) -> int:
    from conformance.engine.findings import CorpusEntry
    from conformance.engine.loading import load_program_file
    from conformance.engine.search import sibling_keys
    for path in paths:
        if Path(path).name == "status.json":
            continue
        prog, inputs, f = load_program_file(path)
        _, j, v = replay(prog, inputs, f.key(), [k[1] for k in f.reproduces])
        if v is None:
            print(f"{path}: {'|'.join(f.key())} no longer fails; left as it is")
            continue
        new = [s for s in sibling_keys(j, f.key()) if s not in f.reproduces]
        if new:
            entry = CorpusEntry.model_validate(json.loads(Path(path).read_text()))
            entry.finding.reproduces = sorted(f.reproduces + new)
            Path(path).write_text(json.dumps(entry.model_dump(), indent=1) + "\n")
            print(f"{path}: + {['|'.join(s) for s in new]}")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program", nargs="?")
    ap.add_argument("--like", help="a corpus entry whose finding key the program must fail")
    ap.add_argument("--key", nargs=4, metavar=("CHECK", "PIPELINE", "REFERENCE", "ERROR_TYPE"))
    ap.add_argument("--seed", type=int, default=0, help="input seed")
    ap.add_argument("--out")
    ap.add_argument("--siblings", nargs="+", metavar="ENTRY", help="refresh these entries' sibling keys")
    a = ap.parse_args(argv)
    if a.siblings:
        return refresh_siblings(a.siblings)
    from conformance.engine.findings import CorpusEntry, make_finding
    from conformance.engine.loading import corpus_entry_stem, load_program_file
    from conformance.engine.search import obs_digest, sibling_keys
    from generators.programs import input_values

    if a.program is None or a.out is None or (a.like is None) == (a.key is None):
        ap.error("give PROGRAM, --out and exactly one of --like and --key (or --siblings ENTRY...)")
    like = load_program_file(a.like)[2] if a.like else None
    key = tuple(a.key) if a.key else like.key()
    prog, _, _ = load_program_file(a.program)
    inputs = input_values(prog, a.seed)
    obs, j, v = replay(prog, inputs, key, [k[1] for k in like.reproduces] if like else [])
    if v is None:
        print(f"{a.program}: {'|'.join(key)} does not fail; failing: "
              f"{sorted('|'.join(v.key()) for v in j.failures()) or 'nothing'}")
        return 1
    o = obs[key[1]]
    f = make_finding(v, prog, inputs, o.versions, o.flags, "cpu")
    f.shrunk = True
    f.detail = {**f.detail, "observations": obs_digest(obs, key[1])}
    f.reproduces = sibling_keys(j, key)
    entry = CorpusEntry(program=f.program, inputs=f.inputs, finding=f, versions=o.versions)
    out = Path(a.out) / f"{corpus_entry_stem(f.check, f.pipeline, f.program_hash)}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(entry.model_dump(), indent=1) + "\n")
    print(f"wrote {out}: {f.signature} ({f.size} statements)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
