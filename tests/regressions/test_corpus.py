"""The regression corpus: one test per program of each corpus root (and plain entry) here.

A root (tools/corpus_root.py) holds one behaviour's class and its variants, the representative
first; every variant's finding is replayed in-process (the finding's pipeline and the references it
is judged against) and the test asserts that the finding's (check, pipeline, reference,
error_type) key is absent from the verdicts. Open bugs are xfail(strict=True,
raises=AssertionError), carrying the finding, so a fix upstream shows up as a strict XPASS
failure and a harness error as a plain failure; keys listed under `fixed` in status.json are
ordinary tests that assert no failing verdict of their (check, pipeline) at all.

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


def _fixed(path, finding) -> bool:
    """status.json's "fixed" names finding keys, or whole roots by file name without .json (a
    harness artifact that was mended: its programs must now pass)."""
    return _key_str(finding.key()) in FIXED or path.stem in FIXED


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
            if not _fixed(path, finding):
                marks.append(pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
                    f"open: [{finding.check}] {finding.pipeline} vs {finding.reference} "
                    f"{finding.error_type or ''} ({', '.join(finding.features)})")))
            out.append(pytest.param(path, prog, inputs, finding, id=tid, marks=marks))
    return out


@pytest.mark.parametrize("path,prog,inputs,finding", _entries())
def test_regression(path, prog, inputs, finding):
    from conformance.engine.runner import InProcessExecutor
    from conformance.engine.search import replay_pipelines
    from oracles.expectations import Expectations
    from oracles.judge import judge
    names = replay_pipelines(finding.key())
    obs = InProcessExecutor(finding.device).run(prog, inputs, names)
    j = judge(prog, obs, Expectations.load(), finding.device)
    fixed = _fixed(path, finding)
    # A fixed entry: no failing verdict of that check on that pipeline at all (a key that only
    # changed its error type, say NotImplementedError -> none, is no fix). An open one: its key.
    hit = [v for v in j.failures() if (v.check, v.pipeline) == (finding.check, finding.pipeline)] if fixed \
        else [v for v in j.failures() if v.key() == finding.key()]
    assert not hit, (f"{path.name}: [{finding.check}] {finding.pipeline} vs {finding.reference} still fails: "
                     f"{json.dumps(hit[0].detail, default=str)[:600]}\n"
                     f"repro: remat-conformance repro {path}")
