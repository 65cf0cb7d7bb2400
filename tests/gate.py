"""The conformance gate's campaigns and its behaviour snapshot (tests/data/gate_snapshot.json).

Two campaigns at the fixed gate seed (tests/conftest.py), one over the default JAX pipelines, one
over the PyTorch SAC pipelines, each a fixed number of programs decided by count (family shares
by programs, not seconds: the same programs on any machine, however loaded). The snapshot records,
per gate, every program's verdicts (check|pipeline|reference -> status, error type and, for a
fail or expected verdict, the digest of what differed: conformance.engine.findings.detail_digest),
the digest of each pipeline's canonical saved residuals, and how many programs each pipeline ran
on. tests/test_conformance.py compares a fresh run with it; `make snapshot` (tools/snapshot.py)
records it again, and the commit that does says why.
"""
from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "tests" / "regressions"
SNAPSHOT = ROOT / "tests" / "data" / "gate_snapshot.json"
# Each adds the references (ref:f64, jax:none, jax:remat2) and the PyTorch one its baseline and
# cross-framework checks; (gated pipelines, programs).
GATES = {
    "jax": (["jax:remat2:jit", "jax:remat3", "jax:remat3:jit", "jax:remat3+cvjp3", "jax:remat3+cvjp3:jit"], 20),
    "torch": (["torch:eager-sac", "torch:compile-aot_eager"], 30),
}
# Small programs, shrunk by steps only (not seconds): a shrunk program keeps few incidental
# features on a loaded machine too, so that it folds into the corpus entry of its behaviour.
MAX_STMTS, SHRINK_STEPS = 4, 150
# The gate's family shares, by programs: its own, not the default campaign's (which spends less on torch.compile),
# so that the snapshot's programs per pipeline stay what they were recorded with.
FAMILY_SHARES = {"torch:compile": 0.4}


def gate_command(gated: list[str], programs: int, seed: int, out: str, budget: float) -> list[str]:
    """The gate's campaign: every gated pipeline, and the references, on every program (a twin's
    declared program share is lifted: registry.Share). The composition round's dimensions, drawn by default
    campaigns, are left out of the gate's programs (`--exclude`): its snapshot keeps the programs it was
    recorded with until what the gate would find among them is judged into the corpus."""
    from conformance.pipelines import registry
    from generators.swarm import COMPOSITIONS
    full = [a for n in registry.shared_pipelines(registry.run_set(gated)) for a in ("--share", f"{n}=1")]
    full += [a for fam, x in FAMILY_SHARES.items() for a in ("--share", f"{fam}={x:g}")]
    full += [a for d in COMPOSITIONS for a in ("--exclude", d)]
    return ["remat-conformance", "run", "--pipelines", ",".join(gated), *full, "--known", str(REG.relative_to(ROOT)),
            "--seed", str(seed), "--max-examples", str(programs), "--max-stmts", str(MAX_STMTS),
            "--shrink-steps", str(SHRINK_STEPS), "--shrink-seconds", "600", "--share-by", "programs",
            "--budget", f"{budget:g}", "--jobs", "1", "--strict", "--quiet", "--out", out, "--overwrite"]


def verdict_map(rec: dict) -> dict[str, str]:
    """One result record's verdicts: "check|pipeline|reference" -> "status[ error_type][ @digest]"
    (several verdicts of one triple, sorted and joined by " ; "), and "saved|pipeline" -> the
    digest of each pipeline's canonical saved residuals."""
    differed = rec.get("differed", {})
    out: dict[str, list[str]] = {}
    for check, pipeline, reference, status, error_type in rec["verdicts"]:
        digest = differed.get("|".join([check, pipeline, reference, error_type]))
        text = " ".join([status] + ([error_type] if error_type else []) + ([f"@{digest}"] if digest else []))
        out.setdefault(f"{check}|{pipeline}|{reference}", []).append(text)
    out.update({f"saved|{p}": [digest] for p, digest in rec.get("saved", {}).items()})
    return {k: " ; ".join(sorted(v)) for k, v in sorted(out.items())}


def gate_behaviour(results: list[dict]) -> dict:
    """What a gate campaign's results.jsonl says of its programs, in the snapshot's form."""
    programs, ran = {}, {}
    for rec in results:
        if rec.get("type") != "result":
            continue
        programs[rec["hash"]] = {"seq": rec["seq"], "verdicts": verdict_map(rec)}
        for p in rec.get("ran") or []:
            ran[p] = ran.get(p, 0) + 1
    return {"programs_per_pipeline": dict(sorted(ran.items())), "programs": programs}


def read_results(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]


def compare(want: dict, got: dict, complete: bool = True, limit: int | None = 40) -> list[str]:
    """Readable differences between a gate's snapshot and a run's behaviour (empty: the same).
    `complete`: the run checked the snapshot's whole program count (a smaller test profile runs a
    prefix, a larger one more programs: then only the programs both have are compared)."""
    diffs = []
    wp, gp = want["programs"], got["programs"]
    if complete:
        diffs += [f"program {h} (seq {wp[h]['seq']}) was not checked" for h in wp if h not in gp]
        diffs += [f"program {h} (seq {gp[h]['seq']}) is not in the snapshot" for h in gp if h not in wp]
        for p, n in want["programs_per_pipeline"].items():
            if got["programs_per_pipeline"].get(p, 0) < n:
                diffs.append(f"{p} ran on {got['programs_per_pipeline'].get(p, 0)} programs; the snapshot says {n}")
    for h in sorted(set(wp) & set(gp), key=lambda h: wp[h]["seq"]):
        a, b = wp[h]["verdicts"], gp[h]["verdicts"]
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                diffs.append(f"program {h} (seq {wp[h]['seq']}) {k}: "
                             f"was {a.get(k, 'absent')}, now {b.get(k, 'absent')}")
    if limit is None or len(diffs) <= limit:
        return diffs
    return diffs[:limit] + [f"... and {len(diffs) - limit} more"]


def load_snapshot() -> dict:
    return json.loads(SNAPSHOT.read_text())
