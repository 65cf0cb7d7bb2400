"""Where detection comes from: which pipelines detect each corpus root, and which detect it alone.

    python tools/information.py [--corpus DIR] [--json OUT]

Every program of every root in the regression corpus (tests/regressions) is run, in one process,
on the default set's pipelines (the order a campaign runs them in) plus the root's own pipeline
and its references, and judged. A pipeline detects a root on a program when it has a failing
verdict of the root's check and label (error type, residual symptom) against a reference of the
root's reference family. Printed per pipeline: the roots it detects, the roots only it detects
among the default set, and (for a twin: a `:jit` pipeline, jax:none) the roots it detects that
its cheaper sibling does not. `make bench` prints the same table beside the costs.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from conformance.engine.loading import load_corpus_root
from conformance.engine.roots import family_key
from conformance.engine.runner import InProcessExecutor
from conformance.engine.search import replay_pipelines
from conformance.pipelines import registry as reg
from oracles.expectations import Expectations
from oracles.judge import judge

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "regressions"


def default_set() -> list[str]:
    return reg.run_set(list(reg.CORE_PIPELINES))


def detects(v, f) -> bool:
    """Whether failing verdict `v` shows the behaviour of finding `f` (its check and label, a
    reference of its reference family)."""
    return (v.check == f.check and (v.error_type or "") == (f.error_type or "")
            and family_key(*v.key()[:3])[2] == family_key(f.check, f.pipeline, f.reference)[2])


def measure(corpus: Path = CORPUS, progress=None) -> dict:
    """{root: {"class", "pipelines": {pipeline: programs detected}, "programs": n}} over the corpus."""
    exp = Expectations.load()
    base = default_set()
    out: dict[str, dict] = {}
    for path in sorted(corpus.glob("*.json")):
        if path.name == "status.json":
            continue
        root, variants = load_corpus_root(str(path))
        row = out.setdefault(path.stem, {"class": root.triage.class_ if root and root.triage else "",
                                         "pipelines": defaultdict(int), "programs": 0})
        for _name, prog, inputs, f in variants:
            names = list(dict.fromkeys(base + replay_pipelines(f.key())))
            obs = InProcessExecutor(f.device).run(prog, inputs, names)
            j = judge(prog, obs, exp, f.device)
            row["programs"] += 1
            for p in sorted({v.pipeline for v in j.failures() if detects(v, f)}):
                row["pipelines"][p] += 1
            if progress:
                progress(path.stem)
        row["pipelines"] = dict(row["pipelines"])
    return out


def sibling(name: str) -> str | None:
    """The cheaper pipeline a twin's share declares (registry.Share): a `:jit` twin's eager one,
    jax:none's float64 reference."""
    s = reg.spec(name).share
    return s.sibling if s else None


def table(info: dict, names: list[str]) -> list[dict]:
    """Per pipeline of `names`: roots detected, roots only it detects among `names`, and roots it
    detects that its sibling does not."""
    rows = []
    for p in names:
        mine = {r for r, x in info.items() if p in x["pipelines"]}
        alone = {r for r in mine if not (set(info[r]["pipelines"]) & set(names)) - {p}}
        sib = sibling(p)
        beyond = sorted(r for r in mine if sib is not None and sib not in info[r]["pipelines"])
        rows.append({"pipeline": p, "roots": len(mine), "alone": sorted(alone), "sibling": sib,
                     "beyond_sibling": beyond})
    return rows


def print_table(rows: list[dict], info: dict, file=sys.stdout) -> None:
    print(f"{'pipeline':<28} {'roots':>5} {'only it':>7}  {'sibling':<16} beyond its sibling", file=file)
    for r in rows:
        print(f"{r['pipeline']:<28} {r['roots']:>5} {len(r['alone']):>7}  {r['sibling'] or '-':<16} "
              f"{', '.join(r['beyond_sibling']) or '-'}", file=file)
    twins = [r["pipeline"] for r in rows if r["sibling"]]
    lost = sorted(k for k, x in info.items() if set(x["pipelines"]) & {r["pipeline"] for r in rows}
                  and not (set(x["pipelines"]) & {r["pipeline"] for r in rows}) - set(twins))
    print(f"roots that only the pipelines on a share ({', '.join(twins)}) detect: {', '.join(lost) or 'none'}",
          file=file)
    shown = {r["pipeline"] for r in rows}
    opt_in = sorted(k for k, x in info.items() if x["pipelines"] and not set(x["pipelines"]) & shown)
    quiet = sorted(k for k, x in info.items() if not x["pipelines"])
    print(f"{len(info)} corpus roots; {len(opt_in)} detected only by opt-in pipelines: {', '.join(opt_in) or '-'}; "
          f"{len(quiet)} not failing (documented: expected; fixed): {', '.join(quiet) or '-'}", file=file)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tools/information.py")
    ap.add_argument("--corpus", default=str(CORPUS))
    ap.add_argument("--json", help="also write the measurement here")
    args = ap.parse_args(argv)
    info = measure(Path(args.corpus), progress=lambda s: print(f"  {s}", file=sys.stderr, flush=True))
    print_table(table(info, default_set()), info)
    if args.json:
        Path(args.json).write_text(json.dumps(info, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
