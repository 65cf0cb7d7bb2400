"""IR reductions after the shrink (conformance.engine.reduce) and their use by the campaign."""
from __future__ import annotations

import json
import time
from collections import Counter

import numpy as np
import pytest

import tests.mutants  # noqa: F401  (registers the mutant pipelines)
from conformance.engine.findings import Finding, decode_inputs
from conformance.engine.loading import load_program_file
from conformance.engine.options import Options
from conformance.engine.reduce import SIMPLEST_POLICY, candidates
from conformance.engine.runner import InProcessExecutor
from conformance.engine.search import REDUCE_STEPS, Searcher, Target, _Found, needed_pipelines
from conformance.ir.program import load_program
from conformance.pipelines import registry
from oracles.expectations import Expectations
from oracles.judge import judge
from tests.corpus_files import variant_path


def op(o, args, out):
    return {"kind": "op", "op": o, "args": args, "params": {}, "out": out}


PROG = {"schema_version": 1, "diff": {"order": 1, "mode": "reverse"}, "extensions": {},
        "inputs": [{"id": "x0", "shape": [2], "dtype": "float32", "diff": True}],
        "outputs": ["v1", "v3"],
        "body": [{"kind": "checkpoint", "args": ["x0"], "prevent_cse": True,
                  "policy": {"kind": "save_only_names", "names": ["a"]}, "results": ["v1", "v2"],
                  "body": [op("sin", ["x0"], "v1"), op("cos", ["x0"], "v2")]},
                 op("exp", ["v2"], "v3"), op("tanh", ["x0"], "v4")]}


def test_candidates_remove_dead_code_drop_outputs_and_simplify_policies():
    prog = load_program(PROG)
    cands = list(candidates(prog))
    assert cands and all(c.size() <= prog.size() for c in cands)
    assert len({c.content_hash() for c in cands}) == len(cands) and prog.content_hash() not in \
        {c.content_hash() for c in cands}
    bodies = [c.to_json_obj() for c in cands]
    # 1. dead code: v4 (read by nothing) goes, everything else stays
    dce = bodies[0]
    assert dce["outputs"] == ["v1", "v3"] and [s.get("out") for s in dce["body"][1:]] == ["v3"]
    # 2. dropping output v3 removes exp and the region's result v2 with the cos computing it
    drop_v3 = next(b for b in bodies if b["outputs"] == ["v1"])
    region = drop_v3["body"][0]
    assert len(drop_v3["body"]) == 1 and region["results"] == ["v1"] and [s["out"] for s in region["body"]] == ["v1"]
    drop_v1 = next(b for b in bodies if b["outputs"] == ["v3"])
    assert drop_v1["body"][0]["results"] == ["v2"]
    # 3. the region's policy replaced by the simplest kind, program otherwise unchanged
    simple = next(b for b in bodies if b["body"][0].get("policy") == SIMPLEST_POLICY)
    assert simple["outputs"] == PROG["outputs"] and len(simple["body"]) == 3
    # 4. the region inlined
    assert any(b["body"][0] == op("sin", ["x0"], "v1") for b in bodies)
    # what is left of the region after all of these: its body, inlined
    last = load_program({**PROG, "outputs": ["v1"], "body": [{**PROG["body"][0], "results": ["v1"],
                         "policy": SIMPLEST_POLICY, "body": [op("sin", ["x0"], "v1")]}]})
    assert [c.to_json_obj()["body"] for c in candidates(last)] == [[op("sin", ["x0"], "v1")]]
    # nothing left to do on the fully reduced program
    assert list(candidates(load_program({**PROG, "outputs": ["v1"], "body": [op("sin", ["x0"], "v1")]}))) == []


def test_dead_code_goes_inside_cond_branches_too():
    """A branch keeps what its results need: statements no result reads go from every branch."""
    cond = {"kind": "cond", "args": ["x1", "x0"],
            "branches": [[op("sin", ["x0"], "a0"), op("cos", ["x0"], "d0")],
                         [op("tanh", ["x0"], "d1"), op("exp", ["x0"], "a1")]],
            "branch_results": [["a0"], ["a1"]], "results": ["s"]}
    prog = load_program({**PROG, "inputs": PROG["inputs"] + [{"id": "x1", "shape": [], "dtype": "float32",
                                                             "diff": False}],
                         "outputs": ["s"], "body": [cond]})
    dce = next(candidates(prog)).to_json_obj()["body"][0]
    assert dce["branches"] == [[op("sin", ["x0"], "a0")], [op("exp", ["x0"], "a1")]]
    assert dce["branch_results"] == [["a0"], ["a1"]] and dce["results"] == ["s"]


def test_nested_policies_and_custom_rule_bodies_are_reduced_in_place():
    inner = {"kind": "checkpoint", "args": ["x0"], "prevent_cse": True, "policy": {"kind": "everything"},
             "results": ["w1"], "body": [op("sin", ["x0"], "w1")]}
    prog = load_program({**PROG, "outputs": ["w1"], "body": [
        {"kind": "checkpoint", "args": ["x0"], "prevent_cse": True, "policy": SIMPLEST_POLICY, "results": ["w1"],
         "body": [op("cos", ["x0"], "dead"), inner]}]})
    cands = [c.to_json_obj() for c in candidates(prog)]
    assert [s.get("kind") for s in cands[0]["body"][0]["body"]] == ["checkpoint"]       # dead cos gone
    assert any(c["body"][0].get("body", [{}])[-1].get("policy") == SIMPLEST_POLICY for c in cands)  # inner simplified
    # either region inlined, the other kept
    assert any([s["kind"] for s in c["body"]] == ["op", "checkpoint"] for c in cands)
    assert any([s["kind"] for s in c["body"][0]["body"]] == ["op", "op"] for c in cands if c["body"][0]["kind"] != "op")


def test_candidates_inline_regions_and_drop_names():
    named = {"kind": "op", "op": "name", "args": ["x0"], "params": {"name": "a"}, "out": "n0"}
    prog = load_program({**PROG, "outputs": ["w2"], "body": [named, {
        "kind": "checkpoint", "args": ["n0"], "prevent_cse": True, "policy": SIMPLEST_POLICY, "results": ["w2"],
        "body": [op("sin", ["n0"], "w1"), {"kind": "op", "op": "name", "args": ["w1"], "params": {"name": "b"},
                                           "out": "w2"}]}]})
    cands = [c.to_json_obj() for c in candidates(prog)]
    # the region inlined: its body in its place, nothing else changed
    assert {
        "outputs": ["w2"],
        "body": [named, op("sin", ["n0"], "w1"), named | {"args": ["w1"], "params": {"name": "b"}, "out": "w2"}],
    } in [{"outputs": c["outputs"], "body": c["body"]} for c in cands]
    # name a dropped: the region reads x0
    no_a = next(c for c in cands if c["body"][0]["kind"] == "checkpoint")
    assert no_a["body"][0]["args"] == ["x0"] and no_a["body"][0]["body"][0]["args"] == ["x0"]
    # name b dropped: sin's value is the region's result and the program's output
    no_b = next(c for c in cands if c["outputs"] == ["w1"])
    assert no_b["body"][1]["results"] == ["w1"] and len(no_b["body"][1]["body"]) == 1
    assert all(load_program(c).size() < prog.size() for c in (no_a, no_b))


MUTANT = "jax:mutant-perturb-gradient"
MUTANT_RUN = list(registry.REFERENCES) + [MUTANT]


def _mutant_target(events: list, **opts) -> tuple[Searcher, Target]:
    """A Searcher over a gradient mutant (it fails on every program) and its shrink target PROG,
    left as is (Hypothesis's budget spent)."""
    opts = Options(pipelines=MUTANT_RUN, budget=600, max_examples=1, seed=5, shrink_steps=1, **opts)
    s = Searcher(opts, InProcessExecutor(), Expectations.load(), events.append, [], set(), Counter(),
                 lambda grace=0: False)
    prog = load_program(PROG)
    _, obs, j = s.evaluate(prog, 7, MUTANT_RUN)
    v = next(v for v in j.failures() if v.pipeline == MUTANT and v.check == "gradient")
    return s, Target(key=v.key(), program=prog, seed=7, verdict=v, observations=obs, original_size=prog.size(),
                     origin=(prog.content_hash(), 7), started=time.monotonic())


def test_the_searcher_reports_the_reduced_program():
    """The mutant's target is reported reduced to one output and only what the failure needs,
    with the reduction's evaluations counted in its shrink steps."""
    events = []
    s, t = _mutant_target(events)
    prog = t.program
    s._finish(t)
    f = Finding.model_validate(next(e for e in events if e["ev"] == "finding")["finding"])
    small = load_program(f.program)
    assert f.original_size == prog.size() and f.size < prog.size() and len(small.outputs) == 1, f.program
    assert 0 < f.shrink_steps <= REDUCE_STEPS
    # no reduction of what is reported still fails the mutant's way
    inputs, pipes = decode_inputs(f.inputs), needed_pipelines(f.key(), MUTANT_RUN)
    for c in candidates(small):
        obs = InProcessExecutor().run(c, inputs, pipes)
        assert all(v.key() != f.key() for v in judge(c, obs, Expectations.load(), "cpu").failures()), c.to_json()


def test_the_reductions_stop_at_the_targets_shrink_time():
    """Reductions of a compiled-torch target take seconds each: they get the target's shrink
    time once more and no longer (here none: the first candidate is not evaluated)."""
    s, t = _mutant_target([], shrink_seconds=1e-9)
    prog = t.program
    s._reduce(t)
    assert t.steps == 0 and t.program is prog
    s.opts = s.opts.model_copy(update={"shrink_seconds": 600.0})
    s._reduce(t)
    assert t.steps > 0 and t.program.size() < prog.size()


def test_a_hand_reduced_program_becomes_a_corpus_entry_when_its_key_still_fails(tmp_path):
    """tools/corpus_entry.py: judged on the key's pipelines; an entry written only when it fails."""
    from conformance.engine.loading import load_program_file
    from tools.corpus_entry import main
    prog = tmp_path / "p.json"
    prog.write_text(json.dumps({**PROG, "outputs": ["v1"], "body": [op("sin", ["x0"], "v1")]}))
    key = ["gradient", "jax:mutant-perturb-gradient", "jax:none", ""]
    assert main([str(prog), "--key", *key, "--out", str(tmp_path / "out")]) == 0
    (entry,) = (tmp_path / "out").glob("*.json")
    p, inputs, finding = load_program_file(str(entry))
    assert list(finding.key()) == key and p.content_hash() == finding.program_hash and finding.shrunk
    assert entry.name == f"gradient-jax_mutant-perturb-gradient-{finding.program_hash[:8]}.json"
    assert set(inputs) == {"x0"}
    # replayed as a campaign files a finding: on its framework's default set, siblings recorded
    assert set(finding.detail["observations"]) >= {n for n in registry.CORE_PIPELINES
                                                   if registry.framework_of(n) == "jax"}
    assert finding.reproduces == []   # the mutant's perturbation is its own
    # a key the program does not fail: nothing written
    assert main([str(prog), "--key", "gradient", "jax:remat3", "jax:none", "", "--out", str(tmp_path / "none")]) == 1
    assert not (tmp_path / "none").exists()


def test_sibling_keys_are_added_to_existing_entries(tmp_path):
    """tools/corpus_entry.py --siblings: an entry filed without its siblings gets the keys its program
    fails the same way on the pipelines it names; the rest of the entry is kept; an entry whose key
    no longer fails is left as it is."""
    from conformance.engine.findings import CorpusEntry
    from conformance.engine.loading import load_program_file
    from tests.mutants import PerturbGradient
    from tools.corpus_entry import main
    twin = "jax:mutant-perturb-gradient-sibling"
    if twin not in registry.known_names():
        registry.register_instance(PerturbGradient(registry.derive("jax:remat3", twin, variant="remat2")))
    prog = tmp_path / "p.json"
    prog.write_text(json.dumps({**PROG, "outputs": ["v1"], "body": [op("sin", ["x0"], "v1")]}))
    key = ["gradient", "jax:mutant-perturb-gradient", "jax:none", ""]
    assert main([str(prog), "--key", *key, "--out", str(tmp_path / "e")]) == 0
    (entry,) = (tmp_path / "e").glob("*.json")
    obj = json.loads(entry.read_text())
    obj["finding"]["reproduces"] = [["gradient", twin, "ref:f64", "stale"]]   # what an old entry may say
    entry.write_text(json.dumps(obj))
    gone = tmp_path / "gone.json"   # a key this program does not fail (remat2's gradient)
    gone.write_text(json.dumps({**obj, "finding": {**obj["finding"], "pipeline": "jax:remat2"}}))
    before = gone.read_text()
    assert main(["--siblings", str(entry), str(gone)]) == 0
    _, _, f = load_program_file(str(entry))
    assert ["gradient", twin, "jax:none", ""] in f.reproduces and ["gradient", twin, "ref:f64", "stale"] in f.reproduces
    assert CorpusEntry.model_validate(json.loads(entry.read_text())).program == obj["program"]
    assert gone.read_text() == before


def _rule_program():
    """checkpoint { custom_vjp { fwd: custom_jvp { sin } ; bwd: 3 * cos(x0) * g } } with the
    custom_jvp's tangent rule scaled the same way: the generator's form of such a block."""
    cjvp = {"kind": "custom_jvp", "args": ["x0"], "body": [op("sin", ["x0"], "v1")], "results": ["v1"],
            "tangents": ["t2"], "jvp": [op("cos", ["x0"], "j3"), op("mul", ["t2", "j3"], "j4"),
                                        {**op("scale", ["j4"], "j5"), "params": {"c": 3.0}}], "jvp_results": ["j5"]}
    cvjp = {"kind": "custom_vjp", "args": ["x0"], "fwd": [cjvp], "results": ["v1"], "residuals": ["x0"],
            "cts": ["g6"], "bwd": [op("cos", ["x0"], "b7"), op("mul", ["g6", "b7"], "b8"),
                                   {**op("scale", ["b8"], "b9"), "params": {"c": 3.0}}], "bwd_results": ["b9"]}
    return load_program({**PROG, "outputs": ["v1"], "body": [
        {"kind": "checkpoint", "args": ["x0"], "prevent_cse": True, "policy": SIMPLEST_POLICY,
         "results": ["v1"], "body": [cvjp]}]})


def test_custom_rule_ops_become_the_simplest_op_with_their_rules_derived_again():
    prog = _rule_program()
    cands = [c for c in candidates(prog) if "op:neg" in c.features()]
    assert len(cands) == 1
    simple = cands[0]
    cvjp = simple.to_json_obj()["body"][0]["body"][0]
    cjvp = cvjp["fwd"][0]
    assert cjvp["body"] == [op("neg", ["x0"], "v1")]
    # the residual sin's derivative read is gone with it; both rules keep their scale
    assert cvjp["residuals"] == [] and "residual_is_arg" not in simple.features()
    assert [s["op"] for s in cvjp["bwd"]] == ["neg", "scale"] and [s["op"] for s in cjvp["jvp"]] == ["neg", "scale"]
    assert simple.size() == prog.size() - 2
    # the rules are still the derivative of the new primal code, scaled by 3: d/dx sum(-x) * 3
    x = np.array([0.3, -1.2])
    obs = InProcessExecutor("cpu").run(simple, {"x0": x}, ["ref:f64"])["ref:f64"]
    np.testing.assert_allclose(np.asarray(obs.grads["x0"]), [-3.0, -3.0])
    # plain code keeps its ops (policies decide on them)
    assert not any("op:neg" in c.features() for c in candidates(load_program(PROG)))


def test_non_standard_rules_are_made_standard_one_at_a_time():
    prog = _rule_program()
    cands = [c.to_json_obj()["body"][0]["body"][0] for c in candidates(prog)
             if c.size() == prog.size() - 1 and "op:sin" in c.features() and "checkpoint" in c.features()]
    bwds = [c for c in cands if [s["op"] for s in c["bwd"]] == ["cos", "mul"]]
    jvps = [c for c in cands if [s["op"] for s in c["fwd"][0]["jvp"]] == ["cos", "mul"]]
    assert len(bwds) == 1 and bwds[0]["bwd_results"] == ["b8"] and bwds[0]["fwd"][0]["jvp_results"] == ["j5"]
    assert len(jvps) == 1 and jvps[0]["fwd"][0]["jvp_results"] == ["j4"] and jvps[0]["bwd_results"] == ["b9"]


def test_custom_rule_blocks_are_inlined_and_ops_bypassed():
    prog = _rule_program()
    kinds = [[s["kind"] for s in c.to_json_obj()["body"][0].get("body", [])] for c in candidates(prog)]
    # the custom_vjp inlined: the region holds its fwd (the custom_jvp)
    assert ["custom_jvp"] in kinds
    # the custom_jvp inlined into the fwd: sin's derivative rule derived again, scale kept
    inl = next(c.to_json_obj()["body"][0]["body"][0] for c in candidates(prog)
               if c.to_json_obj()["body"][0].get("body", [{}])[0].get("fwd", [{}])[0].get("kind") == "op")
    assert inl["fwd"] == [op("sin", ["x0"], "v1")] and inl["residuals"] == ["x0"]
    assert [s["op"] for s in inl["bwd"]] == ["cos", "mul", "scale"]
    # plain code: exp bypassed, its reader (the output) reads its argument v2
    bypassed = [c.to_json_obj() for c in candidates(load_program(PROG))]
    assert any(b["outputs"] == ["v1", "v2"] and all(s.get("op") != "exp" for s in b["body"]) for b in bypassed)


def test_a_custom_vjp_result_nothing_reads_is_dropped_with_what_only_it_needed():
    """(v1, v2, v2) from fwd, v1 the only one read: v2 goes (both copies), with cos and its
    cotangents; bwd is the derivative of what is left; v1 itself cannot go (the output reads it)."""
    block = {"kind": "custom_vjp", "args": ["x0"],
             "fwd": [op("sin", ["x0"], "v1"), op("cos", ["x0"], "v2")],
             "results": ["v1", "v2", "v2"], "residuals": ["x0"], "cts": ["g1", "g2", "g3"],
             "bwd": [op("cos", ["x0"], "b1"), op("mul", ["g1", "b1"], "b2"), op("sin", ["x0"], "b3"),
                     op("neg", ["b3"], "b4"), op("add", ["g2", "g3"], "b5"), op("mul", ["b5", "b4"], "b6"),
                     op("add", ["b2", "b6"], "b7")],
             "bwd_results": ["b7"]}
    prog = load_program({**PROG, "outputs": ["v1"], "body": [block]})
    dropped = [c.to_json_obj()["body"][0] for c in candidates(prog)
               if c.to_json_obj()["body"][0].get("results") == ["v1"]]
    assert len(dropped) == 1
    d = dropped[0]
    assert d["fwd"] == [op("sin", ["x0"], "v1")] and d["cts"] == ["g1"]
    assert [s["op"] for s in d["bwd"]] == ["cos", "mul"]
    x = np.array([0.3, -1.2])
    obs = InProcessExecutor("cpu").run(load_program({**PROG, "outputs": ["v1"], "body": [d]}), {"x0": x},
                                       ["ref:f64"])["ref:f64"]
    np.testing.assert_allclose(np.asarray(obs.grads["x0"]), np.cos(x))
    assert not any(c.to_json_obj()["body"][0].get("results") == ["v2", "v2"] for c in candidates(prog))


@pytest.mark.parametrize("entry", ["error-jax_remat3-7d6b302d", "error-jax_remat3+cvjp3-905855a5",
                                   "error-ref_f64-bfa081b4"])
def test_an_error_against_the_expectations_is_judged_the_same_on_the_pipelines_its_shrink_runs(entry):
    """A shrink step of an error-vs-expectations finding runs only the pipeline and the value
    reference: on those, the program fails that key exactly as on the whole run set."""
    prog, inputs, f = load_program_file(str(variant_path(f"{entry}.json")))
    everything = registry.run_set([f.pipeline]) if not registry.is_reference(f.pipeline) else list(registry.REFERENCES)
    few = needed_pipelines(f.key(), everything)
    assert few == list(dict.fromkeys([registry.value_reference(), f.pipeline])), few
    keys = []
    for names in (everything, few):
        obs = InProcessExecutor().run(prog, inputs, names)
        keys.append({v.key() for v in judge(prog, obs, Expectations.load(), "cpu").failures() if v.check == "error"})
    assert f.key() in keys[0] and f.key() in keys[1], keys


def test_the_differentiation_is_made_first_order_reverse_and_inputs_differentiated():
    obj = {**json.loads(json.dumps(PROG)), "diff": {"order": 2, "mode": "fwd_over_rev"}}
    obj["inputs"] = obj["inputs"] + [{"id": "x1", "shape": [2], "dtype": "float32", "diff": False}]
    obj["body"] = obj["body"] + [op("mul", ["x0", "x1"], "v5")]
    obj["outputs"] = obj["outputs"] + ["v5"]
    got = [c.to_json_obj() for c in candidates(load_program(obj))]
    diffs = [(c["diff"].get("order", 1), c["diff"].get("mode", "reverse")) for c in got]
    assert (1, "reverse") in diffs and (2, "reverse") in diffs
    assert any(c["inputs"][1].get("diff", True) and c["diff"] == obj["diff"] for c in got)


def test_a_replayed_program_shrinks_only_the_failures_no_finding_record_holds():
    """A campaign killed between two shrinks of one program replays that program on resume: the shrink that ended
    (a finding record names the program and the failure it started from) is not run again, even where `known`
    does not match the failure to the finding it gave (the soak's duplicated finding record: an error whose
    message on the unshrunk program has another root than on the shrunk one); the one cut short is."""
    pipes = MUTANT_RUN + ["jax:mutant-perturb-gradient-beyond-loose"]
    opts = Options(pipelines=pipes, budget=600, max_examples=1, seed=5, shrink_steps=1)
    prog = load_program(PROG)
    h = (prog.content_hash(), 7)

    def step(done):
        events = []
        s = Searcher(opts, InProcessExecutor(), Expectations.load(), events.append, [], set(), Counter(),
                     lambda grace=0: False, done_shrinks=done)
        with pytest.raises(_Found):   # a shrink starts: the Hypothesis signal of a failure to shrink
            s._search_step(prog, 7, h)
        rec = next(ev for ev in events if ev["ev"] == "result")["rec"]
        return s.target.key, [tuple(k) for k in rec["new"]], [v.key() for v in s.deferred[h][0]]

    first, new, deferred = step(set())
    assert first == new[0] and deferred == new[1:] and len(new) >= 2
    assert {k[1] for k in new} == {MUTANT, "jax:mutant-perturb-gradient-beyond-loose"}
    second, new2, deferred2 = step({(h, first)})   # the first shrink ended before the kill
    assert new2 == new[1:] and second == new[1] and deferred2 == new[2:]


def test_a_static_flag_goes_plain_with_the_spelling_and_value_only_it_allows():
    """A region's static flag passed as an unhashable value: setting the flag plain alone is refused by the type
    check, the value plain alone may lose the failure (r35 F49: eager SAC with user hooks and dropout fails with
    [True] as the flag and without a flag, not with True), so the flag goes plain with its value and spelling."""
    p = json.loads(json.dumps(PROG))
    p["body"][0].update(static_flag=True, static_value="unhashable", static_by="argnames")
    plain = [c.to_json_obj()["body"][0] for c in candidates(load_program(p))]
    assert any(not r.get("static_flag") and r.get("static_value", "bool") == "bool"
               and r.get("static_by", "argnums") == "argnums" and r["kind"] == "checkpoint" for r in plain)
