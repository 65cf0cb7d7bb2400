"""Every entry of oracles/expectations.json, verified as data: a program is judged with the
packaged entries, and the test fails if the entry stops matching (its verdict is no longer
`expected` under its id) or stops being needed (without it the same verdict would not fail)."""
import json
from pathlib import Path

import pytest

from conformance.engine.runner import InProcessExecutor
from generators.programs import input_values
from oracles.expectations import Expectations
from oracles.judge import judge
from tests.programs import op, prog, seed_program

PACKAGED = Expectations.load()
EXECUTOR = InProcessExecutor()
REPO = Path(__file__).resolve().parents[1]


def _verdicts(j, pipeline, check):
    return [v for v in j.verdicts if v.pipeline == pipeline and v.check == check]


def verify(entry_id, p, names, pipeline, check, needed=True):
    """Judge p on names with the packaged entries: the (pipeline, check) verdict is excused by
    entry_id, and (needed) judged without entry_id it fails."""
    obs = EXECUTOR.run(p, input_values(p, 0), names)
    j = judge(p, obs, PACKAGED)
    got = _verdicts(j, pipeline, check)
    assert any(v.status == "expected" and v.expectation == entry_id for v in got), \
        [(v.status, v.expectation, v.detail) for v in got]
    assert j.expectation_hits.get(entry_id) == "fired", j.expectation_hits
    if not needed:
        return obs
    without = Expectations([e for e in PACKAGED.entries if e.id != entry_id], PACKAGED.source)
    j2 = judge(p, obs, without)
    assert any(v.status == "fail" for v in _verdicts(j2, pipeline, check)), \
        f"{entry_id} is not needed: without it {[(v.status, v.detail) for v in _verdicts(j2, pipeline, check)]}"
    return obs


def _sz_optimize_remat():
    return prog([{"kind": "custom_vjp", "args": ["x"], "fwd": [op("sin", ["x"], "s")], "results": ["s"],
                  "residuals": ["x"], "cts": ["g"], "bwd": [op("cos", ["x"], "c"), op("mul", ["g", "c"], "d")],
                  "bwd_results": ["d"], "symbolic_zeros": True, "optimize_remat": True}])


@pytest.mark.parametrize("pipeline", ["ref:f64", "jax:remat2", "jax:remat3"])
def test_optimize_remat_with_symbolic_zeros_raises(pipeline):
    # The entry is needed by the value reference; a rival raising the reference's own error is
    # judged against the reference without it, so for rivals the test asserts the entry matches.
    obs = verify("optimize-remat-symbolic-zeros", _sz_optimize_remat(), ["ref:f64", "jax:none", pipeline],
                 pipeline, "error", needed=pipeline == "ref:f64")
    assert obs[pipeline].grads is None
    assert obs[pipeline].error.type == "NotImplementedError"


def test_both_policies_with_offload_raises():
    p = prog([{"kind": "checkpoint", "args": ["x"], "results": ["y"], "prevent_cse": True,
               "policy": {"kind": "both", "a": {"kind": "dots"},
                          "b": {"kind": "save_and_offload_names", "saved": [], "offloaded": ["h"]}},
               "body": [op("sin", ["x"], "s"), op("name", ["s"], "h", name="h"), op("cos", ["h"], "y")]}])
    assert "offload_in_both" in p.features()
    verify("jax-both-policies-cannot-offload", p, ["ref:f64", "jax:none", "jax:remat2"], "jax:remat2", "error")


def _nested(outer, inner):
    pol = lambda save: {"kind": "save_only_names", "names": ["s"]} if save else {"kind": "nothing"}
    return prog([{"kind": "checkpoint", "args": ["x"], "results": ["y"], "prevent_cse": True, "policy": pol(outer),
                  "body": [{"kind": "checkpoint", "args": ["x"], "results": ["c"], "prevent_cse": True,
                            "policy": pol(inner),
                            "body": [op("sin", ["x"], "s0"), op("name", ["s0"], "s1", name="s"),
                                     op("cos", ["s1"], "c")]},
                           op("tanh", ["c"], "y")]}])


@pytest.mark.parametrize("pipeline, outer, inner", [
    ("torch:eager-sac", False, True),            # eager SAC: a value saved at any level is saved
    ("torch:eager-sac:prefer", False, True),
    ("torch:compile-aot_eager", False, True),    # compiled: the innermost policy decides
    ("torch:compile-aot_eager", True, False),
    ("torch:compile-aot_eager:prefer", True, False),
    ("torch:compile-aot_eager+default-partitioner", False, True),
    ("torch:compile-aot_eager+default-partitioner:prefer", True, False),
    ("torch:compile-inductor", True, False),
    ("torch:compile-inductor:prefer", False, True),
])
def test_nested_policy_precedence_differs(pipeline, outer, inner):
    # JAX: the outer policy decides
    p = _nested(outer, inner)
    assert "nested_policy_conflict" in p.features()
    obs = verify("torch-vs-jax-nested-policy-precedence", p, ["ref:f64", "jax:none", "jax:remat2", pipeline],
                 pipeline, "residuals")
    saves = lambda n: any("s1" in r.cls for r in obs[n].residuals)
    assert saves("jax:remat2") == outer and saves(pipeline) == (inner or pipeline.startswith("torch:eager"))


@pytest.mark.parametrize("save", [True, False])
def test_nested_regions_with_one_policy_are_not_excused(save):
    """The precedence entry needs a conflict: nested regions with the same policy save alike in
    JAX and PyTorch, and the entry does not match them."""
    pol = {"kind": "save_only_names", "names": ["s"]} if save else {"kind": "nothing"}
    p = prog([{"kind": "checkpoint", "args": ["x"], "results": ["y"], "prevent_cse": True, "policy": pol,
               "body": [{"kind": "checkpoint", "args": ["x"], "results": ["c"], "prevent_cse": True, "policy": pol,
                         "body": [op("sin", ["x"], "s0"), op("name", ["s0"], "s1", name="s"),
                                  op("cos", ["s1"], "c")]},
                        op("tanh", ["c"], "y")]}])
    assert "nested_checkpoint" in p.features() and "nested_policy_conflict" not in p.features()
    names = ["ref:f64", "jax:none", "jax:remat2", "torch:none", "torch:eager-sac", "torch:compile-aot_eager"]
    obs = EXECUTOR.run(p, input_values(p, 0), names)
    j = judge(p, obs, PACKAGED)
    assert "torch-vs-jax-nested-policy-precedence" not in j.expectation_hits
    res = [v for v in j.verdicts if v.check == "residuals" and v.pipeline.startswith("torch:")]
    assert res and all(v.status == "pass" for v in res), [(v.pipeline, v.reference, v.status, v.detail) for v in res]
    assert {any("s1" in r.cls for r in obs[n].residuals) for n in names[2:] if n != "torch:none"} == {save}


def test_eager_sac_double_backward_raises():
    p = prog([{"kind": "checkpoint", "args": ["x"], "results": ["c"], "prevent_cse": True,
               "policy": {"kind": "save_only_names", "names": ["s"]},
               "body": [op("sin", ["x"], "s0"), op("name", ["s0"], "s1", name="s"), op("cos", ["s1"], "c")]}],
             order=2)
    verify("torch-eager-sac-no-double-backward", p, ["ref:f64", "jax:none", "torch:eager-sac"],
           "torch:eager-sac", "error")


def test_remat3_symbolic_zeros_entry_matches_the_seed_and_names_its_corpus_test():
    """The seed's entry declares an error remat3 must raise and (jax 0.12.0.1) does not: the open
    bug is tested by its regression-corpus entry (strict xfail), which `verified_by` names. Here:
    the entry matches the seed program on every remat3 pipeline and on no other."""
    e = next(e for e in PACKAGED.entries if e.id == "remat3-symbolic-zeros-fwd-remat")
    corpus = e.verified_by.split()[0]
    assert (REPO / corpus).is_file(), e.verified_by
    root = json.loads((REPO / corpus).read_text())
    assert root["triage"]["class"] == e.triage.class_ == "question"
    assert all(v["finding"]["expectation"] == e.id for v in root["variants"])
    p = seed_program()
    feats, versions = set(p.features()), {"jax": "0.12.0.1"}
    for name in ("jax:remat3", "jax:remat3:jit", "jax:remat3+cvjp3", "jax:remat3+cvjp3:jit"):
        assert e in PACKAGED.matching(name, versions, "cpu", {"float32"}, feats), name
    for name in ("jax:remat2", "jax:none", "torch:eager-sac"):
        assert e not in PACKAGED.matching(name, versions, "cpu", {"float32"}, feats), name
    # ...and says, as data, that it is a question: the error it declares was proposed (jax PR
    # #40309, closed unmerged), not documented
    assert e.triage is not None and e.triage.class_ == "question" and e.triage.confirmed
    assert "proposed" in e.triage.reason and "not a documented" in e.triage.reason
    assert any("40309" in link for link in e.triage.links)


def test_an_entry_may_name_its_triage_class_and_older_entries_load_without_one():
    from pydantic import ValidationError

    from oracles.expectations import Entry
    base = {"id": "t", "pipelines": ["jax:*"], "diverges": {"check": "gradient", "reason": "r"}}
    assert Entry.model_validate(base).triage is None
    for cls in ("bug", "documented", "question", "harness"):
        e = Entry.model_validate({**base, "triage": {"class": cls, "reason": "why"}})
        assert e.triage.class_ == cls and e.model_dump(mode="json")["triage"]["class"] == cls
    for bad in ({"class": "maybe", "reason": "why"}, {"class": "bug"}, {"class": "bug", "reason": "r", "x": 1}):
        with pytest.raises(ValidationError):
            Entry.model_validate({**base, "triage": bad})
    # the packaged file: every class given is one of the four
    assert {e.triage.class_ for e in PACKAGED.entries if e.triage} <= {"bug", "documented", "question", "harness"}


def test_any_features_needs_one_of_them():
    from oracles.expectations import Entry
    e = Entry.model_validate({"id": "t", "pipelines": ["torch:*"], "features": ["checkpoint"],
                              "any_features": ["inplace", "random"], "diverges": {"check": "error", "reason": "r"}})
    m = lambda feats: e.matches("torch:eager-sac", {}, "cpu", {"float32"}, set(feats))   # noqa: E731
    assert m({"checkpoint", "inplace"}) and m({"checkpoint", "random"}) and m({"checkpoint", "inplace", "random"})
    assert not m({"checkpoint"}) and not m({"random"})
    assert Entry.model_validate({"id": "t", "pipelines": ["x"], "diverges": {"check": "error", "reason": "r"}}
                                ).matches("x", {}, "cpu", {"float32"}, set())   # none given: no condition


def test_eager_sac_mutated_cache_covers_dropout():
    """CPU dropout mutates its own output (empty_like, bernoulli_): eager SAC with a policy that
    caches it raises the documented mutated-cache error (corpus entry error-torch_eager-sac-f89e9b26)."""
    p = prog(
        [
            {
                "kind": "checkpoint",
                "args": ["x"],
                "results": ["d"],
                "prevent_cse": True,
                "policy": {"kind": "everything"},
                "body": [op("dropout", ["x"], "d", p=0.5, seed=0)],
            }
        ],
        outputs=["d"],
        inputs=[{"id": "x", "shape": [4], "dtype": "float32", "diff": True}],
    )
    assert "random" in p.features() and "inplace" not in p.features()
    obs = verify("torch-eager-sac-mutated-cache", p, ["ref:f64", "jax:none", "torch:none", "torch:eager-sac"],
                 "torch:eager-sac", "error")
    assert "has been mutated" in obs["torch:eager-sac"].error.message
    # torch.utils.checkpoint.checkpoint_sequential with the same policy caches it too (a 10-minute campaign on torch
    # 2.6.0 reported it as torch:eager-sequential's own error)
    obs = verify("torch-eager-sac-mutated-cache", p, ["ref:f64", "jax:none", "torch:none", "torch:eager-sac",
                                                      "torch:eager-sequential"], "torch:eager-sequential", "error")
    assert "has been mutated" in obs["torch:eager-sequential"].error.message
    # a compiled function inside the eager checkpoint is functionalized too: it runs where eager SAC raises (a
    # 240 s campaign reported it as torch:checkpoint-of-compiled not raising eager SAC's error)
    # (needed only while eager SAC's error is expected: the rival is then held to it, and this scope excuses it)
    rival = "torch:checkpoint-of-compiled"
    obs = verify("torch-eager-sac-mutated-cache", p, ["ref:f64", "jax:none", "torch:none", "torch:eager-sac", rival],
                 rival, "error", needed=False)
    assert obs[rival].error is None and obs[rival].grads
    narrower = [e.model_copy(update={"pipelines": [g for g in e.pipelines if g != rival]})
                if e.id == "torch-eager-sac-mutated-cache" else e for e in PACKAGED.entries]
    assert any(v.status == "fail" for v in _verdicts(judge(p, obs, Expectations(narrower, PACKAGED.source)),
                                                     rival, "error"))


def _higher_order_custom_rule(nondiff):
    # sin(custom(x)) with custom(x) = sin(x) whose bwd rule is 3 cos(x) g (not the derivative)
    return prog([{"kind": "custom_vjp", "args": ["x"], "fwd": [op("sin", ["x"], "v")], "results": ["v"],
                  "residuals": ["x"], "cts": ["g"], "nondiff": [2.0] if nondiff else [],
                  "bwd": [op("cos", ["x"], "c"), op("mul", ["g", "c"], "d"), op("scale", ["d"], "e", c=3.0)],
                  "bwd_results": ["e"], "symbolic_zeros": False, "optimize_remat": False},
                 op("sin", ["v"], "y")], inputs=[{"id": "x", "shape": [], "dtype": "float32", "diff": True}],
                outputs=["y"], order=2)


@pytest.mark.parametrize("pipeline, nondiff", [("torch:eager-sac", True), ("torch:eager-sac", False),
                                               ("torch:eager-sac:prefer", False)])
def test_custom_rule_higher_order_differs(pipeline, nondiff):
    """JAX: d2/dx2 sin(c(x)) = -sin(sin x) 3cos(x) cos(x) - 3cos(sin x) sin x (the fwd rule is
    differentiated as code); PyTorch: the custom backward again, 3cos(x) for cos(x). (Compiled
    PyTorch pipelines do not run second order: unsupported, so the entry names eager SAC only.)"""
    import math
    p = _higher_order_custom_rule(nondiff)
    obs = verify("torch-vs-jax-custom-rule-higher-order", p, ["ref:f64", "jax:none", "jax:remat2", "torch:none",
                                                              pipeline], pipeline, "gradient")
    x = float(input_values(p, 0)["x"])
    s, c = math.sin(x), math.cos(x)
    jax_rule = -math.sin(s) * 3 * c * c - 3 * math.cos(s) * s
    torch_rule = -math.sin(s) * 9 * c * c - 3 * math.cos(s) * s
    j = judge(p, obs, PACKAGED)
    cross = [v for v in j.verdicts if v.pipeline == pipeline and v.check == "gradient" and v.reference == "jax:remat2"]
    assert cross and all(v.status == "expected" for v in cross), [(v.status, v.detail) for v in cross]
    base = [v for v in j.verdicts if v.pipeline == pipeline and v.check == "gradient" and v.reference == "torch:none"]
    assert base and all(v.status == "pass" for v in base)   # the entry never excuses PyTorch against itself
    got = next(v for v in _verdicts(j, pipeline, "gradient") if v.reference == "ref:f64").detail
    assert math.isclose(got["want"], jax_rule, rel_tol=1e-5) and math.isclose(got["got"], torch_rule, rel_tol=1e-4), got


def _custom_jvp_program():
    # sin with its jvp rule (cos), under grad; the rule runs the body again, names included
    return prog(
        [
            {
                "kind": "custom_jvp",
                "args": ["x"],
                "body": [op("sin", ["x"], "s"), op("name", ["s"], "n", name="a")],
                "results": ["n"],
                "tangents": ["t"],
                "jvp": [op("cos", ["x"], "c"), op("mul", ["t", "c"], "d")],
                "jvp_results": ["d"],
            }
        ]
    )


def test_torch_declares_custom_jvp_unsupported():
    from conformance.pipelines.torch.pipelines import NO_CUSTOM_JVP
    p = _custom_jvp_program()
    names = ["ref:f64", "jax:none", "jax:remat2", "torch:none", "torch:eager-sac", "torch:compile-aot_eager"]
    obs = EXECUTOR.run(p, input_values(p, 0), names)
    j = judge(p, obs, PACKAGED)
    entry = next(e for e in PACKAGED.entries if e.id == "torch-no-custom-jvp")
    assert entry.unsupported.reason == NO_CUSTOM_JVP   # one reason, said by the pipeline and the data
    for name in ("torch:eager-sac", "torch:compile-aot_eager"):
        assert obs[name].unsupported == NO_CUSTOM_JVP and obs[name].grads is None
        (v,) = _verdicts(j, name, "error")
        assert (v.status, v.expectation) == ("unsupported", "torch-no-custom-jvp")
    assert j.expectation_hits.get("torch-no-custom-jvp") == "fired"
    # JAX runs it, through the rule: the gradient is cos(x), and the rule ran
    x = input_values(p, 0)["x"]
    assert obs["jax:remat2"].custom_rules["body[0]"].fwd_traces >= 1
    import numpy as np
    np.testing.assert_allclose(obs["ref:f64"].grads["x"], np.cos(x), rtol=1e-12)
    assert not j.failures(), [v.key() for v in j.failures()]


def _spelled_block(spelling):
    return {"kind": "custom_vjp", "args": ["x"], "fwd": [op("sin", ["x"], "s")], "results": ["s"], "residuals": ["x"],
            "cts": ["g"], "bwd": [op("cos", ["x"], "c"), op("mul", ["g", "c"], "d")], "bwd_results": ["d"],
            "spelling": spelling}


@pytest.mark.parametrize("spelling", ["defremat", "custom_gradient_remat"])
def test_rule_remat_needs_custom_vjp3(spelling):
    from tests.programs import region
    p = prog([region(["x"], [_spelled_block(spelling), op("tanh", ["s"], "y")], ["y"], {"kind": "nothing"})])
    assert "rule_remat" in p.features()
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3", "jax:remat3+cvjp3"]
    obs = EXECUTOR.run(p, input_values(p, 0), names)
    j = judge(p, obs, PACKAGED)
    for name in ("jax:remat2", "jax:remat3"):
        got = {(v.reference, v.status, v.expectation) for v in _verdicts(j, name, "error")}
        assert ("expectations", "expected", "rule-remat-needs-custom-vjp3") in got, got
        assert obs[name].error.type == "NotImplementedError"
    # custom_vjp3 runs the rule: its rem ran on the backward pass, its gradients are the reference's
    assert obs["jax:remat3+cvjp3"].error is None
    assert obs["jax:remat3+cvjp3"].custom_rules["body[0].body[0]"].rem_traces >= 1
    status = [v for v in _verdicts(j, "jax:remat3+cvjp3", "error") if v.reference == "jax:remat2"]
    assert [(v.status, v.expectation) for v in status] == [("expected", "rule-remat-reference-cannot-run")]
    assert [v.status for v in _verdicts(j, "jax:remat3+cvjp3", "gradient")] == ["pass", "pass"]
    assert not j.failures(), [v.key() for v in j.failures()]
    # each entry is needed: without the first the references' error is a finding, without the
    # second custom_vjp3's success where its reference raised is
    for gone, key in (("rule-remat-needs-custom-vjp3", ("error", "jax:remat2", "expectations")),
                      ("rule-remat-reference-cannot-run", ("error", "jax:remat3+cvjp3", "jax:remat2"))):
        without = Expectations([e for e in PACKAGED.entries if e.id != gone], PACKAGED.source)
        keys = {v.key()[:3] for v in judge(p, obs, without).failures()}
        assert key in keys, (gone, keys)


def test_custom_gradient_spelling_runs_everywhere_and_agrees():
    from tests.programs import region
    p = prog([region(["x"], [_spelled_block("custom_gradient"), op("tanh", ["s"], "y")], ["y"], {"kind": "nothing"})])
    assert "custom_gradient" in p.features() and p.to_json_obj()["body"][0]["body"][0]["spelling"] == "custom_gradient"
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3", "jax:remat3+cvjp3", "torch:none", "torch:eager-sac"]
    obs = EXECUTOR.run(p, input_values(p, 0), names)
    j = judge(p, obs, PACKAGED)
    assert all(o.error is None for o in obs.values()), {n: o.error for n, o in obs.items()}
    assert obs["jax:remat2"].custom_rules["body[0].body[0]"].bwd_calls >= 1
    assert not j.failures(), [v.key() for v in j.failures()]


@pytest.mark.parametrize("where", ["top", "cond"])
def test_a_rule_counts_its_traces_alike_whichever_way_it_is_spelled(where):
    """jax.custom_gradient runs one function as the primal and as the fwd rule; each run is counted as what it ran
    for, so that a custom_vjp spelled defvjp or custom_gradient counts alike in every pipeline (custom_vjp3 tracing
    the primal under grad is a primal trace in both, not a second fwd trace under custom_gradient), in a cond too."""
    def program(spelling):
        block = _spelled_block(spelling)
        if where == "cond":   # (on a non-differentiated p, each branch taken by some seed)
            c = {"kind": "cond", "args": ["p", "x"], "branches": [[block], [op("cos", ["x"], "s2")]],
                 "branch_results": [["s"], ["s2"]], "results": ["r"]}
            return prog([c], inputs=[{"id": "x", "shape": [3], "dtype": "float32", "diff": True},
                                     {"id": "p", "shape": [2], "dtype": "float32", "diff": False}], outputs=["r"])
        return prog([block])
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3+cvjp3", "jax:remat2:jit", "jax:remat3+cvjp3:jit"]
    counts = {}
    for spelling in ("defvjp", "custom_gradient"):
        p = program(spelling)
        seed = next(k for k in range(20) if where == "top" or input_values(p, k)["p"][0] > 0)   # the rule's branch
        obs = EXECUTOR.run(p, input_values(p, seed), names)
        assert all(o.error is None for o in obs.values()), {n: o.error for n, o in obs.items()}
        counts[spelling] = {n: {k: (r.primal_traces, r.fwd_traces) for k, r in o.custom_rules.items()}
                            for n, o in obs.items()}   # (bwd calls may differ: JAX's rule, not the counting)
    assert counts["custom_gradient"] == counts["defvjp"]
    assert any(c[0] for c in counts["defvjp"]["jax:remat3+cvjp3"].values())   # the primal traced: counted as such


def _reentrant_region(tree="flat", nonsmooth=False):
    from tests.programs import region
    body = [op("step", ["x"], "s")] if nonsmooth else [op("sin", ["x"], "s")]
    r = region(["x"], body, ["s"], {"kind": "nothing"})
    r["tree"] = tree
    return prog([r])


REENTRANT = ["ref:f64", "jax:none", "jax:remat2", "torch:none", "torch:eager-sac", "torch:eager-reentrant"]


@pytest.mark.parametrize("tree", ["tuple", "dict"])
def test_reentrant_checkpoint_ignores_nested_tensors(tree):
    obs = verify("torch-reentrant-nested-structures", _reentrant_region(tree), REENTRANT, "torch:eager-reentrant",
                 "gradient")
    assert not any(obs["torch:eager-reentrant"].grads["x"]) and any(obs["torch:eager-sac"].grads["x"])
    # flat args: the reentrant version's gradients are SAC's
    flat = _reentrant_region("flat")
    j = judge(flat, EXECUTOR.run(flat, input_values(flat, 0), REENTRANT), PACKAGED)
    assert not j.failures() and "torch-reentrant-nested-structures" not in j.expectation_hits


def test_reentrant_checkpoint_needs_outputs_with_grad():
    obs = verify("torch-reentrant-outputs-without-grad", _reentrant_region(nonsmooth=True), REENTRANT,
                 "torch:eager-reentrant", "error")
    assert obs["torch:eager-reentrant"].error.stage == "backward" and obs["torch:eager-sac"].ok()


def test_eager_sac_backward_twice_raises_compiled_runs():
    p = prog([{"kind": "checkpoint", "args": ["x"], "results": ["c"], "prevent_cse": True,
               "policy": {"kind": "save_only_names", "names": ["s"]},
               "body": [op("sin", ["x"], "s0"), op("name", ["s0"], "s1", name="s"), op("cos", ["s1"], "c")]}])
    names = ["ref:f64", "jax:none", "jax:remat2", "torch:none", "torch:eager-sac", "torch:eager-sac:backward-twice",
             "torch:compile-aot_eager:backward-twice"]
    obs = verify("torch-eager-sac-one-backward", p, names, "torch:eager-sac:backward-twice", "error")
    assert obs["torch:eager-sac:backward-twice"].error.stage == "backward"
    # compiled SAC runs the second backward, and its gradients are eager SAC's
    j = judge(p, obs, PACKAGED)
    mine = [v for v in j.verdicts if v.pipeline == "torch:compile-aot_eager:backward-twice"]
    assert obs["torch:compile-aot_eager:backward-twice"].ok() and not [v for v in mine if v.status == "fail"]
    assert ("gradient", "torch:eager-sac", "pass") in {(v.check, v.reference, v.status) for v in mine}
    # without a policy (plain non-reentrant checkpoint) eager runs it too
    p2 = prog([{"kind": "checkpoint", "args": ["x"], "results": ["c"], "policy": {"kind": "no_policy"},
                "body": [op("sin", ["x"], "s0"), op("cos", ["s0"], "c")]}])
    o2 = EXECUTOR.run(p2, input_values(p2, 0), names)
    assert not judge(p2, o2, PACKAGED).failures() and o2["torch:eager-sac:backward-twice"].ok()


def test_compiled_sac_after_a_graph_break_allows_one_backward():
    """A data-dependent op in a saving region (a 30-minute campaign's shrunk program: x * 0.5, then a masked sum, under
    an ops policy saving the scale): dynamo breaks the graph, the region runs as eager SAC and its second backward
    raises; the entry excuses it, and the same region without the masked sum runs both backwards compiled."""
    x = [{"id": "x", "shape": [], "dtype": "float32", "diff": True}]
    region = {"kind": "checkpoint", "args": ["x"], "results": ["s"], "prevent_cse": True,
              "policy": {"kind": "ops", "ops": ["scale"]},
              "body": [op("scale", ["x"], "v", c=0.5), op("masked_sum", ["v"], "s")]}
    names = ["ref:f64", "jax:none", "jax:remat2", "torch:none", "torch:eager-sac",
             "torch:compile-aot_eager:backward-twice"]
    obs = verify("torch-compile-sac-one-backward-after-graph-break", prog([region], inputs=x), names,
                 "torch:compile-aot_eager:backward-twice", "error")
    assert obs["torch:compile-aot_eager:backward-twice"].error.stage == "backward"
    plain = prog([{**region, "body": [op("scale", ["x"], "v", c=0.5), op("sin", ["v"], "s")]}], inputs=x)
    o2 = EXECUTOR.run(plain, input_values(plain, 0), names)
    assert o2["torch:compile-aot_eager:backward-twice"].ok(), o2["torch:compile-aot_eager:backward-twice"].error
    # the masked sum after the region: dynamo breaks the graph outside it, the region stays compiled SAC and runs both
    # backwards; the entry is keyed on the op inside a region, so it would excuse nothing here
    after = prog([{**region, "results": ["v"], "body": [op("scale", ["x"], "v", c=0.5)]}, op("masked_sum", ["v"], "s")],
                 inputs=x)
    assert "data_dependent_op" in after.features() and "data_dependent_in_checkpoint" not in after.features()
    o3 = EXECUTOR.run(after, input_values(after, 0), names)
    assert o3["torch:compile-aot_eager:backward-twice"].ok(), o3["torch:compile-aot_eager:backward-twice"].error
    entry = "torch-compile-sac-one-backward-after-graph-break"
    assert entry not in judge(after, o3, PACKAGED).expectation_hits
    versions = o3["torch:compile-aot_eager:backward-twice"].versions

    def matching(p):
        return {e.id for e in PACKAGED.matching("torch:compile-aot_eager:backward-twice", versions, "cpu", {"float32"},
                                                p.features())}
    assert entry not in matching(after) and entry not in matching(plain)
    assert entry in matching(prog([region], inputs=x))


def test_compiled_pytorch_drops_dead_random_ops():
    """A dead dropout before a live one (the CI gate's torch campaign, seed 11): torch.compile
    drops the dead one, so the live one draws the numbers eager's dead one drew."""
    def dropouts(dead):
        body = [op("dropout", ["x"], "d0", p=0.5, seed=0)] if dead else []
        return prog(body + [op("dropout", ["x"], "d1", p=0.25, seed=0), op("sin", ["d1"], "y")],
                    inputs=[{"id": "x", "shape": [16], "dtype": "float32", "diff": True}])
    names = ["ref:f64", "jax:none", "jax:remat2", "torch:none", "torch:eager-sac", "torch:compile-aot_eager"]
    p = dropouts(True)
    assert "dead_random" in p.features()
    obs = verify("torch-compile-drops-dead-random-ops", p, names, "torch:compile-aot_eager", "gradient")
    assert obs["torch:compile-aot_eager"].ok() and obs["torch:eager-sac"].ok()
    # without the dead op, compiled draws what eager draws
    p2 = dropouts(False)
    assert "dead_random" not in p2.features() and "random" in p2.features()
    assert not judge(p2, EXECUTOR.run(p2, input_values(p2, 0), names), PACKAGED).failures()


def _static_flag_program(static_by: str):
    return prog([op("sin", ["x"], "a"),
                 {"kind": "checkpoint", "args": ["a"], "results": ["b"], "prevent_cse": True,
                  "policy": {"kind": "nothing"}, "body": [op("cos", ["a"], "b")], "static_flag": True,
                  "static_by": static_by},
                 op("mul", ["b", "x"], "y")])


def test_a_static_argnum_no_argument_has_raises():
    obs = verify("jax-static-argnum-out-of-range", _static_flag_program("missing_argnum"),
                 ["ref:f64", "jax:none", "jax:remat2"], "jax:remat2", "error")
    assert obs["jax:remat2"].error.type == "ValueError" and obs["jax:none"].error is None


def test_a_traced_static_flag_raises_one_message_whatever_its_value():
    # remat2 traces a static_argnames argument (root remat2-ignores-static-argnames): the region's check
    # raises, with one message for a flag of True and of [True] (one behaviour, one error root)
    messages = set()
    for value in ("bool", "unhashable"):
        p = _static_flag_program("argnames")
        p = p.model_copy(update={"body": [p.body[0], p.body[1].model_copy(update={"static_value": value}), p.body[2]]})
        obs = EXECUTOR.run(p, input_values(p, 0), ["jax:remat2"])
        messages.add((obs["jax:remat2"].error.type, obs["jax:remat2"].error.message))
    assert messages == {("ValueError", "the region's static flag must be True")}


def test_the_reentrant_checkpoint_rejects_a_keyword_argument():
    obs = verify("torch-reentrant-no-keyword-arguments", _static_flag_program("argnames"),
                 ["torch:none", "torch:eager-sac", "torch:eager-reentrant"], "torch:eager-reentrant", "error")
    # the non-reentrant checkpoint passes the keyword on: its gradient is the reference's
    assert obs["torch:eager-sac"].error is None and obs["torch:eager-reentrant"].error.type == "ValueError"


def test_torch_declares_region_state_unsupported():
    from conformance.pipelines.torch.pipelines import NO_REGION_STATE
    p = prog([op("sin", ["x"], "a"),
              {"kind": "checkpoint", "args": ["a"], "results": ["b"], "policy": {"kind": "nothing"},
               "body": [op("cos", ["a"], "b")], "state": "read"}, op("mul", ["b", "x"], "y")])
    obs = EXECUTOR.run(p, input_values(p, 0), ["ref:f64", "jax:none", "torch:none", "torch:eager-sac"])
    j = judge(p, obs, PACKAGED)
    entry = next(e for e in PACKAGED.entries if e.id == "torch-no-region-state")
    assert entry.unsupported.reason == NO_REGION_STATE   # one reason, said by the pipeline and the data
    assert obs["torch:eager-sac"].unsupported == NO_REGION_STATE and obs["jax:none"].grads is not None
    (v,) = _verdicts(j, "torch:eager-sac", "error")
    assert (v.status, v.expectation) == ("unsupported", "torch-no-region-state")


@pytest.mark.parametrize("kind", ["callback", "ordered", "io", "io_ordered"])
def test_an_optimize_remat_fwd_effect_is_refused_only_where_its_release_refuses_it(kind):
    """jax before 0.12 refuses an io_callback in an optimize_remat fwd; a jax.debug.callback only before 0.6.2
    (DebugEffect joined custom_derivatives_allowed_effects there). A 0.10.2 campaign's debug.callback program
    raised nothing where the harness expected the refusal: its own false alarm (program 03903b69)."""
    rule = {"kind": "custom_vjp", "args": ["x"], "fwd": [op("effect", ["x"], "e", kind=kind), op("sin", ["e"], "s")],
            "results": ["s"], "residuals": ["x"], "cts": ["g"],
            "bwd": [op("cos", ["x"], "c"), op("mul", ["g", "c"], "d")],
            "bwd_results": ["d"], "optimize_remat": True}
    feats = set(prog([rule], outputs=["s"]).features())
    io = kind.startswith("io")
    assert {"effect_in_optimize_remat_fwd", f"{'io' if io else 'debug'}_effect_in_optimize_remat_fwd"} <= feats
    assert f"{'debug' if io else 'io'}_effect_in_optimize_remat_fwd" not in feats
    refusal = {"jax-before-0.12-optimize-remat-refuses-fwd-effects",
               "jax-before-0.6.2-optimize-remat-refuses-fwd-debug-callbacks"}

    def refused(version):
        return {e.id for e in PACKAGED.matching("jax:remat2", {"jax": version}, "cpu", {"float64"}, feats)} & refusal
    assert refused("0.6.1") and refused("0.4.38")
    assert bool(refused("0.6.2")) == bool(refused("0.11.2")) == io
    assert not refused("0.12.0")


def test_custom_vjp3_refuses_an_io_callback_in_a_custom_vjp_only_before_0_12():
    """jax before 0.12 applies jax_custom_vjp3 where jax.custom_vjp is applied and refuses an io_callback in its
    primal ('Effects not supported in `custom_jvp`'; the harness's false alarm on a jax 0.10.2 campaign, program
    e43a36b4); 0.12 runs it. Only the custom_vjp3 pipelines, only with an io_callback in the rule."""
    def rule(kind):
        return {"kind": "custom_vjp", "args": ["x"],
                "fwd": [op("effect", ["x"], "e", kind=kind), op("sin", ["e"], "s")],
                "results": ["s"], "residuals": ["x"], "cts": ["g"],
                "bwd": [op("cos", ["x"], "c"), op("mul", ["g", "c"], "d")], "bwd_results": ["d"]}
    eid = "jax-before-0.12-cvjp3-refuses-io-callbacks-in-custom-vjp"

    def expected(kind, pipeline, version):
        feats = set(prog([rule(kind)], outputs=["s"]).features())
        return eid in {e.id for e in PACKAGED.matching(pipeline, {"jax": version}, "cpu", {"float64"}, feats)}
    assert expected("io", "jax:remat3+cvjp3", "0.11.2") and expected("io_ordered", "jax:remat3+cvjp3:jit", "0.10.2")
    assert not expected("io", "jax:remat3+cvjp3", "0.12.0") and not expected("io", "jax:remat3", "0.11.2")
    assert not expected("callback", "jax:remat3+cvjp3", "0.11.2")
