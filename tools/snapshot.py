"""Record what the gate compares against (`make snapshot`). Only on purpose: a change meant to
change verdicts or what a finding shows; the commit that re-records says why.

1. The gate snapshot (tests/data/gate_snapshot.json): both gate campaigns (tests/gate.py) run at
   the gate seed, the same commands tests/test_conformance.py runs, and their per-program verdicts
   and per-pipeline program counts are written.
2. The regression corpus's details (tests/regressions/*.json): every open entry is replayed as
   tests/regressions/test_corpus.py replays it; where its key still fails but what differed
   (detail_digest) is not what the entry records, the entry's detail is replaced by the replayed
   one (its context keys, the observations a report shows, are kept). Prints each change.

    .venv/bin/python tools/snapshot.py [--gate-only | --corpus-only]
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def record_gates() -> None:
    from tests.conftest import GATE_SEED
    from tests.gate import GATES, SNAPSHOT, gate_behaviour, gate_command, read_results
    with tempfile.TemporaryDirectory() as tmp:
        runs = {}
        for gate, (gated, programs) in GATES.items():
            cmd = gate_command(gated, programs, GATE_SEED, str(Path(tmp) / gate), budget=1800)
            runs[gate] = subprocess.Popen([sys.executable, "-m", "conformance.cli", *cmd[1:]], cwd=ROOT)
        gates = {}
        for gate, p in runs.items():
            if p.wait() not in (0, 1):
                raise SystemExit(f"the {gate} gate campaign failed (exit {p.returncode}); nothing written")
            gates[gate] = gate_behaviour(read_results(Path(tmp) / gate))
            print(f"{gate}: {len(gates[gate]['programs'])} programs, {gates[gate]['programs_per_pipeline']}",
                  file=sys.stderr)
    SNAPSHOT.parent.mkdir(parents=True, exist_ok=True)
    SNAPSHOT.write_text(json.dumps({"doc": (sys.modules["tests.gate"].__doc__ or "").strip().splitlines()[0],
                                    "seed": GATE_SEED, "gates": gates}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT.relative_to(ROOT)}", file=sys.stderr)


def refresh_corpus() -> int:
    from conformance.engine.findings import DETAIL_CONTEXT, detail_digest
    from conformance.engine.loading import load_corpus_root
    from tests.regressions.test_corpus import _fixed, replay_failures
    changed = 0
    for path in sorted((ROOT / "tests" / "regressions").glob("*.json")):
        if path.name == "status.json":
            continue
        raw = json.loads(path.read_text())
        root, variants = load_corpus_root(str(path))
        stored = raw["variants"] if root is not None else [raw]
        dirty = False
        for obj, (name, prog, inputs, finding) in zip(stored, variants):
            if _fixed(path, finding, name):
                continue
            hit = [v for v in replay_failures(prog, inputs, finding) if v.key() == finding.key()]
            if not hit or detail_digest(hit[0].detail) == detail_digest(finding.detail):
                continue
            kept = {k: v for k, v in obj["finding"]["detail"].items() if k in DETAIL_CONTEXT}
            obj["finding"]["detail"] = {**{k: v for k, v in hit[0].detail.items() if k not in DETAIL_CONTEXT}, **kept}
            print(f"{path.name} {name}: detail re-recorded", file=sys.stderr)
            dirty = True
            changed += 1
        if dirty:
            path.write_text(json.dumps(raw, indent=1, sort_keys=root is not None) + "\n")
    return changed


def main() -> int:
    args = set(sys.argv[1:])
    if args - {"--gate-only", "--corpus-only"}:
        raise SystemExit(f"tools/snapshot.py: unknown option(s) {sorted(args)}; use --gate-only or --corpus-only")
    if "--gate-only" not in args:
        print(f"{refresh_corpus()} corpus detail(s) re-recorded", file=sys.stderr)
    if "--corpus-only" not in args:
        record_gates()
    return 0


if __name__ == "__main__":
    sys.exit(main())
