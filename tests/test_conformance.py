"""The conformance gate: a campaign run anew each time, judged by its behaviour snapshot and by
the campaign's own rule.

The snapshot (tests/gate.py, tests/data/gate_snapshot.json). Every program's verdicts (status,
error type, and what differed for a fail or expected one) must be the recorded ones, and each gated
pipeline must have run on the recorded number of programs: a harness change that moves a verdict
fails here even where its finding would land under a tracked key (a rival's gradients pushed past
the tolerance, a lowering that raises everywhere, a residual class mislabelled). A change meant to
move verdicts re-records it (`make snapshot`) in a commit that says why.

A short campaign (the real engine, CLI and isolation) runs over every default JAX pipeline
(jax:remat2's own policy verdict included), another over the PyTorch SAC pipelines, with the
regression corpus as its known behaviours (`run --known tests/regressions`). A program that
fails a known way (the same key and the core features of the entry's shrunk program, or a
sibling of it) is counted under that entry; anything else is shrunk, and a shrunk finding
that is not one of the corpus behaviours is new (see below). Fixed corpus keys are not known:
their recurrence fails. The seed is fixed (tests/conftest.py: a seed whose campaigns find only
corpus behaviours at the pinned versions), so that the gate judges the change under test;
REMAT_GATE_SEED=N replays seed N, REMAT_GATE_SEED=fresh draws one (exploration: a discovery
then fails the gate until it is judged). The seed is printed in pytest's summary and failures.

What fails, and what is reported. Every finding is matched by key and core features (above):
a new variant of a tracked key (the same check, pipeline, reference and error type, its shrunk
and reduced program with core features no entry of that key has) is not counted as known. It
fails the gate when its key is new (no open entry has it: a check that was clean on that pipeline
fails now, as a harness regression makes it); when the key is tracked, it is a discovery about a
behaviour already tracked, and is reported instead: copied to reports/gate/<seed>-<gate>/ and
listed at the end of pytest's output with the command that adopts it. (A fresh seed finds such
variants in about one campaign in five at this corpus; failing on them would make `make test`
fail on discoveries about pinned frameworks, not on the change under test.)
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.engine.loading import corpus_entry_stem, load_known
from tests.conftest import GATE_SEED, GATE_SEED_DEFAULT
from tests.corpus_files import variant_path, variants
from tests.gate import GATES, REG, ROOT, compare, gate_behaviour, gate_command, load_snapshot, read_results

SCALE_PROGRAMS = {"dev": 0.5, "ci": 1, "nightly": 10}[os.environ.get("HYPOTHESIS_PROFILE", "ci")]
BUDGET = float(os.environ.get("REMAT_GATE_BUDGET", "600"))


GATE_REPORTS = ROOT / "reports" / "gate"


def finding_key(f: dict) -> tuple:
    return (f["check"], f["pipeline"], f["reference"], f["error_type"] or "")


def tracked_keys() -> set[tuple]:
    return {tuple(f.key()) for f in load_known([str(REG)])}


def split_new(new: list[dict], tracked: set[tuple]) -> tuple[list[dict], list[dict]]:
    """(variants of tracked keys: reported, findings of keys no open entry has: failures). A residual difference
    that names its causes is new by its causes, whatever its key: the campaign found no tracked root holding
    them (issue 45: a new cause under a known direction fails the gate)."""
    def variant(f):
        return finding_key(f) in tracked and not (f["check"] == "residuals" and (f.get("detail") or {}).get("causes"))
    return [f for f in new if variant(f)], [f for f in new if not variant(f)]


def keep_variants(variants: list[dict], out: Path, dest: Path) -> list[Path]:
    """Copy each variant's corpus entry from the campaign's output to dest, named as the
    regression corpus names its entries (ready to adopt)."""
    kept = []
    for f in variants:
        dest.mkdir(parents=True, exist_ok=True)
        p = dest / f"{corpus_entry_stem(f['check'], f['pipeline'], f['program_hash'])}.json"
        p.write_text((out / "corpus" / p.name).read_text())
        kept.append(p)
    return kept


def test_new_keys_fail_and_variants_of_tracked_keys_are_reported(tmp_path):
    tracked = tracked_keys()
    assert ("residuals", "jax:remat3", "jax:remat2", "other") in tracked
    # a fixed root's variant is not tracked (its recurrence is a regression); the open root of the
    # same key is
    from conformance.engine.loading import load_known
    fixed = [f for f in load_known([str(REG / "optimize-remat-symbolic-zeros-documented-error.json")])]
    assert fixed and all(tuple(f.key()) in tracked for f in fixed)   # the key: tracked by another root
    assert not [f for f in load_known([str(REG)]) if f.tracked == "optimize-remat-symbolic-zeros-documented-error.json"]
    f = {"check": "residuals", "pipeline": "jax:remat3", "reference": "jax:remat2", "error_type": "other"}
    g = {**f, "pipeline": "jax:remat2:jit"}
    assert split_new([f, g], tracked) == ([f], [g])
    caused = {**f, "detail": {"causes": ["recomputes a dot's output [dots:save]"]}}   # a new cause, a tracked key
    assert split_new([caused], tracked) == ([], [caused])
    # a variant's entry is kept, named like a corpus entry, loadable as one
    entry = variant_path(sorted(n for n in variants() if n.startswith("residuals-jax_remat3-"))[0])
    (tmp_path / "o" / "corpus").mkdir(parents=True)
    h = json.loads(entry.read_text())["finding"]["program_hash"]
    (tmp_path / "o" / "corpus" / entry.name).write_text(entry.read_text())
    kept = keep_variants([{**f, "program_hash": h}], tmp_path / "o", tmp_path / "keep")
    assert [p.name for p in kept] == [f"residuals-jax_remat3-{h[:8]}.json"]
    assert [x.key() for x in load_known([str(kept[0])])] == [finding_key(json.loads(entry.read_text())["finding"])]


@pytest.mark.parametrize("gate", list(GATES))
def test_fresh_campaign_finds_only_known_behaviours(gate, tmp_path):
    gated, programs = GATES[gate]
    programs = max(1, int(programs * SCALE_PROGRAMS))
    out = tmp_path / "gate"
    cmd = gate_command(gated, programs, GATE_SEED, str(out), BUDGET * SCALE_PROGRAMS)
    r = subprocess.run([sys.executable, "-m", "conformance.cli", *cmd[1:]], cwd=ROOT, capture_output=True,
                       text=True, timeout=BUDGET * SCALE_PROGRAMS + 300)
    replay = (f"REMAT_GATE_SEED={GATE_SEED} pytest tests/test_conformance.py, or: "
              + " ".join(gate_command(gated, programs, GATE_SEED, "DIR", BUDGET * SCALE_PROGRAMS)))
    assert r.returncode in (0, 1), f"gate campaign failed to run (exit {r.returncode}):\n{r.stderr[-3000:]}"
    findings = json.loads((out / "findings.json").read_text())
    run = json.loads((out / "run.json").read_text())
    assert run["options"]["seed"] == GATE_SEED and set(gated) <= set(run["options"]["pipelines"])
    recs = read_results(out)
    checked = sum(1 for x in recs if x.get("type") == "result")
    rounds = {x["round"] for x in recs if x.get("type") == "round"}
    # every slot checked (a program Hypothesis drew twice is checked once)
    assert checked and rounds == set(range(-(-programs // 40))), \
        f"the gate checked {checked} of its {programs} programs in its budget\n{r.stdout}"
    if GATE_SEED == GATE_SEED_DEFAULT:
        diffs = compare(load_snapshot()["gates"][gate], gate_behaviour(recs), complete=SCALE_PROGRAMS == 1)
        assert not diffs, (
            f"the {gate} gate's programs are judged otherwise than tests/data/gate_snapshot.json records "
            f"({len(diffs)} difference(s)); replay: {replay}\n" + "\n".join(f"- {d}" for d in diffs)
            + "\nA harness change that moves verdicts is a regression unless meant; if meant, `make snapshot` "
              "re-records it and the commit says why.")
    new = [f for f in findings if f.get("tracked") is None]
    assert (r.returncode == 1) == bool(new), f"--strict exit {r.returncode} with {len(new)} new findings"
    variants, new = split_new(new, tracked_keys())
    keep_variants(variants, out, GATE_REPORTS / f"{GATE_SEED}-{gate}")
    assert not new, (
        f"{len(new)} behaviour(s) that no open regression-corpus entry tracks, seed {GATE_SEED}; replay: {replay}\n"
        + "\n".join(f"- [{f['check']}] {f['pipeline']} vs {f['reference']} {f['error_type'] or ''} "
                    f"(signature {f['signature']}; {f['size']} statements)\n"
                    f"  program: {json.dumps(f['program'])}\n  inputs: {json.dumps(f['inputs'])}"
                    for f in new)
        + "\nJudge each (DESIGN.md): a framework discrepancy -> copy its corpus entry into "
          "tests/regressions/; a documented difference -> an expectation; a harness bug -> fix it.")
