"""The regression corpus: one test per program of each corpus root (and plain entry) here.

A root (tools/corpus_root.py) holds one behaviour's class and its variants, the representative
first; every variant's finding is replayed in-process (the finding's pipeline and the references it
is judged against) and the test asserts that the finding's (check, pipeline, reference,
error_type) key is absent from the verdicts. Open bugs are xfail(strict=True,
raises=AssertionError), carrying the finding, so a fix upstream shows up as a strict XPASS
failure and a harness error as a plain failure; so does a key that still fails but differs
otherwise than the entry records (its detail_digest: which values, residuals, counters or error
message; `make snapshot` re-records a change meant so). Keys listed under `fixed` in status.json
are ordinary tests that assert their pipeline ran and was judged, with no failing verdict of
their (check, pipeline) at all.

Add an entry: copy `corpus/<hash>.json` from a campaign's output directory here, then make it a
root, or a variant of one: `tools/corpus_root.py make SLUG ... ENTRY.json --remove`.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from conformance.engine.loading import corpus_entry_stem, corpus_fixed_keys

HERE = Path(__file__).parent
FIXED = corpus_fixed_keys(HERE)     # the rule `run --known` reads status.json by


def _key_str(key) -> str:
    return "|".join(key)


def _fixed(path, finding, name: str = "") -> bool:
    """status.json's "fixed" names finding keys, whole roots by file name without .json (a
    harness artifact that was mended: its programs must now pass), or one variant of a root as
    "root/variant"."""
    return _key_str(finding.key()) in FIXED or path.stem in FIXED or f"{path.stem}/{name}" in FIXED


# Variants whose framework bug reads memory it never wrote: on a replay that memory may hold the very values the
# right answer needs (the allocator hands back the block the forward pass freed), and the variant passes. An XPASS
# of these is no fix (non-strict); every other variant of their roots stays strict.
UNINITIALISED = {
    "torch-sac-saved-tensor-hooks-skip-cache-mutation-check/gradient-torch_eager-sac_user-hooks-5cf5e365":
        "dropout under MUST_SAVE caches aten.empty_like's output before bernoulli_ fills it (failed once in 7 runs "
        "of the corpus, not again in 6; an XPASS is the likely way)",
}


def _entries():
    from conformance.engine.loading import load_corpus_root
    out = []
    for path in sorted(HERE.glob("*.json")):
        if path.name == "status.json":
            continue
        root, variants = load_corpus_root(str(path))
        for name, prog, inputs, finding in variants:
            if finding is None:
                raise pytest.UsageError(f"{path}: a regression entry needs a finding")
            tid = f"{path.stem}/{name}" if root is not None else \
                corpus_entry_stem(finding.check, finding.pipeline, finding.program_hash)
            marks = []
            if not _fixed(path, finding, name):
                marks.append(pytest.mark.xfail(strict=tid not in UNINITIALISED, raises=AssertionError, reason=(
                    f"open: [{finding.check}] {finding.pipeline} vs {finding.reference} "
                    f"{finding.error_type or ''} ({', '.join(finding.features)})")))
            out.append(pytest.param(path, name, prog, inputs, finding, id=tid, marks=marks))
    return out


def replay(prog, inputs, finding):
    """(observations, judgement) of one corpus program, run as a campaign would judge its finding."""
    from conformance.engine.runner import InProcessExecutor
    from conformance.engine.search import replay_pipelines
    from oracles.expectations import Expectations
    from oracles.judge import judge
    obs = InProcessExecutor(finding.device).run(prog, inputs, replay_pipelines(finding.key()))
    return obs, judge(prog, obs, Expectations.load(), finding.device)


def replay_failures(prog, inputs, finding):
    return replay(prog, inputs, finding)[1].failures()


class BehaviourChanged(Exception):
    """An open entry's key still fails, but not the way the entry records (not an AssertionError,
    so that its strict xfail reports it as a failure)."""


@pytest.mark.parametrize("path,name,prog,inputs,finding", _entries())
def test_regression(path, name, prog, inputs, finding):
    from conformance.engine.findings import detail_digest, what_differed
    obs, j = replay(prog, inputs, finding)
    if _fixed(path, finding, name):
        # A fixed entry: its pipeline ran and the check judged it (passed, or met an expectation),
        # and no failing verdict of that check on that pipeline at all (a key that only changed its
        # error type, say NotImplementedError -> none, is no fix).
        o = obs.get(finding.pipeline)
        assert o is not None and not o.unsupported, f"{path.name}: {finding.pipeline} did not run"
        judged = [v for v in j.verdicts if (v.check, v.pipeline) == (finding.check, finding.pipeline)]
        # (an error check that saw no raise and expected none judges nothing: the pipeline's clean run is the pass)
        clean = finding.check == "error" and o.error is None
        assert clean or any(v.status in ("pass", "expected") for v in judged), \
            f"{path.name}: no [{finding.check}] verdict of {finding.pipeline}: {[v.status for v in judged]}"
        hit = [v for v in judged if v.status == "fail"]
    else:
        hit = [v for v in j.failures() if v.key() == finding.key()]
        if hit and all(detail_digest(v.detail) != detail_digest(finding.detail) for v in hit):
            raise BehaviourChanged(
                f"{path.name}: [{finding.check}] {finding.pipeline} vs {finding.reference} still fails, but differs "
                f"otherwise than the entry records (a harness change meant so: `make snapshot` re-records it)\n"
                f"recorded: {json.dumps(what_differed(finding.detail))[:600]}\n"
                f"now:      {json.dumps(what_differed(hit[0].detail))[:600]}")
    assert not hit, (f"{path.name}: [{finding.check}] {finding.pipeline} vs {finding.reference} still fails: "
                     f"{json.dumps(hit[0].detail, default=str)[:600]}\n"
                     f"repro: remat-conformance repro {path}")


def test_the_corpus_replays_under_the_campaign_settings():
    """The entries above replay as a default campaign runs its pipelines (issue: every corpus root
    still reproduces under the campaign's settings): eager primitives shared across the remat
    flags, ref:f64 jitted, not JAX's framework defaults (the matrix cell that runs those)."""
    from conformance.pipelines import registry
    from conformance.pipelines.jax import eager_cache
    assert not eager_cache.framework_defaults()
    assert registry.get("ref:f64").traced()   # importing the JAX pipelines installed the shared cache
    assert eager_cache.share()


def test_only_variants_of_a_bug_reading_unwritten_memory_may_pass_unnoticed():
    """Each non-strict variant names a corpus variant that exists, whose root's reason says it reads memory the
    framework never wrote."""
    ids = {p.id: p for p in _entries()}
    for tid in UNINITIALISED:
        assert tid in ids, tid
        root = json.loads((HERE / f"{tid.split('/')[0]}.json").read_text())
        assert "uninitialised" in root["triage"]["reason"], tid
