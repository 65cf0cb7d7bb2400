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
from tests.test_dedup import KEY, _finding, _verdict

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


def test_a_known_root_is_recognised_before_shrinking_through_spellings_references_and_expectations():
    """Three ways a program showed a tracked root and was shrunk anyway in default campaigns (each shrink
    tens of runs, ending folded into the root): a switch where the root has a cond, a wrong gradient seen
    against another pipeline (cross_value) where the root was seen against the baselines, an expected error
    that did not come (its root is the expectation's, whatever the program)."""
    from conformance.engine.roots import root_key
    from conformance.engine.search import known_finding
    from tests.test_dedup import _searcher
    tc = ("trace_count", "jax:remat3+cvjp3", "jax:remat2", "bwd_calls+fwd_traces")
    cond = _finding(tc, features=("cond", "custom_vjp", "nondiff_input"))
    cond.root = root_key(cond)
    switch_program = {"switch", "custom_vjp", "nondiff_input", "bwd_none", "float32"}
    assert known_finding([cond], tc, switch_program, {tc}) is cond
    assert known_finding([cond], tc, switch_program - {"switch"}, {tc}) is None   # no cond, no switch: not it
    g = ("gradient", "torch:export-nonstrict", "torch:none", "")
    lost = _finding(g, features=("checkpoint", "nested_checkpoint"))
    cross = ("gradient", "torch:export-nonstrict", "torch:eager-sac", "cross_value")
    feats = {"checkpoint", "nested_checkpoint", "names", "float16"}
    assert known_finding([lost], cross, feats, {cross}) is lost
    residual = ("residuals", "torch:export-nonstrict", "torch:eager-sac", "other")   # another check: not it
    assert known_finding([lost], residual, feats, {residual}) is None
    err = ("error", "jax:remat3", "expectations", "none")
    asked = _finding(err, features=("custom_vjp", "symbolic_zeros", "scan"))
    asked.expectation, asked.detail = "remat3-symbolic-zeros-fwd-remat", {"got": None}
    asked.root = root_key(asked)
    v = _verdict(("error", "jax:remat3:jit", "expectations", "none"))
    v.expectation, v.detail = asked.expectation, {"got": None}
    s = _searcher([asked])
    assert s.known(v, {"custom_vjp", "random", "names"}, {v.key()}) is asked
    v.expectation = "another-expectation"
    assert s.known(v, {"custom_vjp", "random", "names"}, {v.key()}) is None


def test_a_root_seen_through_two_of_its_variants_is_one_tracked_behaviour(tmp_path):
    """A corpus root's variants are tracked one by one; a run that sees two of them reports the root once: the
    campaign's count of known behaviours and the report's entry (its count the sum, the unseen variant left out)."""
    from conformance.engine.campaign import Campaign
    from conformance.engine.options import Options
    from conformance.engine.store import Store
    from conformance.reporting.build import build
    from conformance.reporting.inputs import RunData
    g = ("gradient", "torch:export-nonstrict", "torch:none", "")
    slug = "torch-export-nonstrict-nested-checkpoint-loses-gradient.json"
    variants = [_finding(g, features=f).model_copy(update={"tracked": slug})
                for f in (("checkpoint", "nested_checkpoint"), ("checkpoint", "names", "nested_checkpoint"),
                          ("checkpoint", "nested_checkpoint", "scan"))]
    c = Campaign(Options(pipelines=["torch:export-nonstrict"]), Store(tmp_path / "o"), None, None)
    c.track(variants)
    c.findings[0].count, c.findings[1].count = 2, 1   # the third variant not seen
    assert list(c.tracked_roots()) == [slug] and len(c.tracked_roots()[slug]) == 2
    rep = build([RunData(dir=tmp_path / "o", info=None, findings=c.findings)], with_repro=False)
    tracked = [x for x in rep["findings"] if x["tracked"]]
    assert [(x["tracked"], x["count"]) for x in tracked] == [(slug, 3)]


def test_an_explorer_alone_on_a_program_is_known_by_the_raise_of_its_pipeline():
    """An explorer runs on a program without its core twin; its raise is the tracked root's where the root was seen
    under that explorer (a make run shrank torch-compile-rng-in-recompute-region again, 23 runs, from
    torch:compile-aot_eager:dynamic, whose family keeps its option, alone on the program)."""
    from conformance.engine.findings import error_root
    from conformance.engine.roots import stamp
    from conformance.engine.search import known_finding
    known = [stamp(f.model_copy(deep=True)) for f in load_known(["tests/regressions"])]
    rng = next(f for f in known if f.tracked.startswith("torch-compile-rng-in-recompute-region"))
    key = ("error", "torch:compile-aot_eager:dynamic", "expectations", "BackendCompilerFailed")
    assert key[1] in set(rng.variants["pipelines"])
    assert known_finding(known, key, set(rng.features) | {"vmap"}, {key}, error_root(rng.detail)) is rng
    stateful = ("error", "torch:compile-aot_eager:stateful", "expectations", "BackendCompilerFailed")   # an option
    assert stateful[1] not in set(rng.variants["pipelines"])   # it was never seen under: its pipeline's raise still
    assert known_finding(known, stateful, {"checkpoint"}, {stateful}, error_root(rng.detail)) is rng
    eager = ("error", "torch:eager-sac", "expectations", "BackendCompilerFailed")   # another pipeline: not it
    assert known_finding(known, eager, {"checkpoint"}, {eager}, error_root(rng.detail)) is None


def test_an_option_is_not_the_cause_where_the_pipeline_without_it_fails_the_same_verdict():
    """A 240 s campaign filed remat3's wrong gradient of a region accumulating into a ref (a corpus root, on
    jax:remat3) as new, seen through jax:remat3+cvjp3:sharded: the program failed jax:remat3+cvjp3 the same way,
    so the sharding is not its cause."""
    from conformance.engine.search import known_finding
    (root,) = [f for f in load_known([str(REG / "remat3-checkpoint-accumulating-into-ref-wrong-gradient.json")])]
    feats = set(root.features) | {"cast"}
    sharded = ("gradient", "jax:remat3+cvjp3:sharded", "jax:none", "")
    plain = ("gradient", "jax:remat3+cvjp3", "jax:none", "")
    assert known_finding([root], sharded, feats, {sharded, plain}) is root
    # alone (the pipeline without the option passed), the option may be the cause: not known
    assert known_finding([root], sharded, feats, {sharded}) is None
