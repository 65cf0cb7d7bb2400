"""Known behaviours (`run --known`): the corpus loader and how a campaign treats tracked
findings. No framework runs."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conformance.engine.loading import load_known
from conformance.engine.search import merge_finding
from conformance.errors import UsageError
from tests.corpus_files import root_files, variant_path, variants
from tests.test_dedup import KEY, _finding

REG = Path(__file__).parent / "regressions"


def test_load_known_names_each_root_and_leaves_out_fixed_keys_and_roots():
    known = load_known([str(REG)])
    fixed = set(json.loads((REG / "status.json").read_text())["fixed"])
    files = {p.name for p in root_files()}
    assert {f.tracked for f in known} <= files and known
    assert not [f for f in known if "|".join(f.key()) in fixed or f.tracked.removesuffix(".json") in fixed]
    # every variant of every root is known unless its key, its root or the variant itself is fixed
    want = [(root.name, v) for name, (root, v) in variants().items()
            if root.stem not in fixed and f"{root.stem}/{name}" not in fixed
            and "|".join(v["finding"][k] for k in ("check", "pipeline", "reference", "error_type")) not in fixed]
    assert any("/" in k for k in fixed)   # a variant fixed by its name ...
    assert len(want) < len([1 for root, _ in variants().values() if root.stem not in fixed])   # ... is left out
    assert len(known) == len(want)
    assert sorted(f.tracked for f in known) == sorted(r for r, _ in want)


def test_load_known_takes_one_entry_file_and_skips_a_second_copy(tmp_path):
    one = next(p for p in root_files() if len(json.loads(p.read_text())["variants"]) > 1)
    other = tmp_path / "d"
    other.mkdir()
    shutil.copy(one, other / one.name)
    known = load_known([str(one), str(other)])
    assert {f.tracked for f in known} == {one.name}
    assert len(known) == len(json.loads(one.read_text())["variants"])


@pytest.mark.parametrize("bad, says", [
    ("nope", "no such file or directory"),
    ("status", "fixed: must be an object"),
    ("broken", "invalid JSON"),
    ("digest", "detail.observations.torch:none.saved[0]: Input should be a valid string"),
])
def test_load_known_refuses_with_the_file_named(tmp_path, bad, says):
    d = tmp_path / "corpus"
    d.mkdir()
    shutil.copy(variant_path(next(iter(variants()))), d / "a.json")
    if bad == "status":
        (d / "status.json").write_text('{"fixed": ["x"]}')
    if bad == "broken":
        (d / "b.json").write_text("{")
    if bad == "digest":   # a pipeline digest the report could not show (it refused a whole nightly for one)
        e = json.loads((d / "a.json").read_text())
        e["finding"]["detail"]["observations"] = {"torch:none": {"saved": [["x"]]}}
        (d / "b.json").write_text(json.dumps(e))
    path = tmp_path / "missing" if bad == "nope" else d
    with pytest.raises(UsageError) as e:
        load_known([str(path)])
    assert says in str(e.value) and (path.name in str(e.value) or "b.json" in str(e.value)), str(e.value)


def test_a_smaller_finding_of_a_tracked_behaviour_stays_tracked():
    tracked = _finding(features=("checkpoint", "policy:nothing", "names")).model_copy(
        update={"tracked": "entry.json", "count": 0})
    smaller = _finding(features=("checkpoint", "policy:nothing"))
    findings = [tracked]
    kept, changed = merge_finding(findings, smaller)
    assert changed and findings == [kept] and kept is smaller
    assert kept.tracked == "entry.json" and kept.count == 1
    # a finding of another behaviour (another construct, no nesting of root features) is new
    other = _finding(features=("checkpoint", "scan"))
    kept, changed = merge_finding(findings, other)
    assert changed and kept.tracked is None and len(findings) == 2


def test_campaign_tracks_each_entry_once_and_counts_only_new_findings(tmp_path):
    from conformance.engine.campaign import Campaign
    from conformance.engine.options import Options
    from conformance.engine.store import Store
    c = Campaign(Options(pipelines=["jax:remat3"]), Store(tmp_path / "o"), None, None)
    known = [_finding().model_copy(update={"tracked": "a.json", "count": 5})]
    c.track(known)
    c.track(known)   # a resume: already tracked
    assert len(c.findings) == 1 and c.findings[0].count == 0   # counts are this run's
    assert c.new_findings() == [] and c.tracked_seen() == []
    c.findings[0].count = 2
    c.findings.append(_finding(key=("gradient",) + KEY[1:3] + ("",)))
    assert [f.check for f in c.new_findings()] == ["gradient"] and c.tracked_seen() == [c.findings[0]]


def test_a_trace_count_of_several_counters_is_known_when_each_counter_is():
    from conformance.engine.search import known_finding
    tc = ("trace_count", "jax:remat3+cvjp3", "jax:remat2")
    primal = _finding((*tc, "primal_traces"), features=("custom_vjp",))
    fwd = _finding((*tc, "fwd_traces"), features=("custom_gradient", "custom_vjp"))
    both = (*tc, "fwd_traces+primal_traces")
    feats = {"custom_gradient", "custom_vjp", "names"}
    assert known_finding([primal, fwd], both, feats, {both}) is fwd   # (the first counter's)
    # one counter alone known is not enough, nor both without the program having their core features
    assert known_finding([primal], both, feats, {both}) is None
    assert known_finding([primal, fwd], both, {"custom_vjp"}, {both}) is None
    # known findings of several counters each cover it too (the CI gate, seed 4343: bwd_calls+fwd_traces
    # and primal_traces tracked, a program growing all three)
    calls = _finding((*tc, "bwd_calls+fwd_traces"), features=("custom_vjp",))
    three = (*tc, "bwd_calls+fwd_traces+primal_traces")
    assert known_finding([primal, calls], three, feats, {three}) is calls
    assert known_finding([calls], three, feats, {three}) is None
