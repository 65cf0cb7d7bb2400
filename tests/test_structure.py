"""Programs with structure (issue 11): lax.scan with per-iteration residuals, and the second-order
modes (forward over reverse, reverse over forward, linearize), end to end: IR, reference, every
JAX pipeline, PyTorch, residual canonicalisation, the judge, repros and reductions."""
import numpy as np
import pytest

from conformance import repro
from conformance.engine.findings import make_finding
from conformance.engine.reduce import candidates
from conformance.engine.runner import InProcessExecutor
from conformance.ir.nodes import DIFF_MODES, ProgramError, iteration_ids, scan_lengths, walk
from conformance.ir.program import load_program, node_index
from conformance.ir.residuals import canonicalise
from conformance.ir.verdict import Verdict
from generators.programs import input_values
from oracles.expectations import Expectations
from oracles.judge import judge
from tests.programs import op, prog, region, sin_cvjp
from tests.test_repro import run_script

EXECUTOR = InProcessExecutor()
PACKAGED = Expectations.load()
F32 = "float32"


def scanned_layers(length=3, xs=True, policy=None):
    """A scanned model: per-layer weights w (stacked, the scan's xs), a carry through a
    checkpointed layer that names sin(c * w_k) 'a' and saves only it; the named values are also
    stacked out (ys)."""
    policy = policy or {"kind": "save_only_names", "names": ["a"]}
    layer = [op("mul", ["c", "wk" if xs else "c"], "m"), op("sin", ["m"], "s"), op("name", ["s"], "a", name="a"),
             op("mul", ["a", "y"], "b")]
    scan = {"kind": "scan", "args": ["x"] + (["w"] if xs else []) + ["y"], "carry": ["c"], "xs": ["wk"] if xs else [],
            "length": length, "body": [region(["c"] + (["wk"] if xs else []) + ["y"], layer, ["b", "a"], policy)],
            "carry_out": ["b"], "ys": ["a"], "results": ["cf", "ys"]}
    inputs = [{"id": "x", "shape": [3], "dtype": F32, "diff": True}]
    if xs:
        inputs.append({"id": "w", "shape": [length, 3], "dtype": F32, "diff": True})
    inputs.append({"id": "y", "shape": [3], "dtype": F32, "diff": True})
    return prog([scan], inputs=inputs, outputs=["cf", "ys"])


def named(obs):
    return sorted(tuple(r.cls) for r in obs.residuals if r.names)


def test_scan_validates_and_round_trips():
    p = scanned_layers()
    assert load_program(p.to_json_obj()) == p
    assert {"scan", "scan_xs", "checkpoint_in_scan", "names_in_scan"} <= p.features()
    assert p.types()["ys"] == ((3, 3), F32) and p.types()["wk"] == ((3,), F32)
    assert scan_lengths(p.body)["a"] == [3] and iteration_ids("a", [3]) == ["a@0", "a@1", "a@2"]
    assert node_index(p)["a@2"].name == "a"
    bad = p.to_json_obj()
    bad["inputs"][1]["shape"] = [2, 3]   # xs' leading axis must be the length
    with pytest.raises(ProgramError) as e:
        load_program(bad)
    assert e.value.field == "body[0].args[1]" and "leading axis 3" in e.value.reason
    bad = p.to_json_obj()
    bad["body"][0]["length"] = 9
    with pytest.raises(ProgramError) as e:
        load_program(bad)
    assert e.value.field == "body[0].length"
    bad = p.to_json_obj()
    bad["inputs"][0]["id"] = "x@0"
    with pytest.raises(ProgramError) as e:
        load_program(bad)
    assert "scan iteration" in e.value.reason


def test_a_stacked_residual_canonicalises_per_iteration():
    values = {"a@0": np.array([1.0, 2.0]), "a@1": np.array([3.0, 4.0]), "x": np.array([9.0, 9.0])}
    idx = {k: node_index(scanned_layers())["a@0"] for k in ("a@0", "a@1")}
    res = canonicalise([np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([9.0, 9.0])], values, idx)
    assert [r.cls for r in res] == [["a@0"], ["a@1"], ["x"]] and res[0].names == ["a"]
    # a stack one iteration short matches only the iterations it holds
    res = canonicalise([np.array([[1.0, 2.0]])], values, idx)
    assert [r.cls for r in res] == [["a@0"]]
    # an iteration's value whose leading axis has one element is that value, in its own layout,
    # not a stack of its rows (the view-layout check read such a saved slice as a reshaped view)
    one = {"v@0": np.array([[5.0, 6.0]]), "w@0": np.array([5.0, 6.0, 7.0])}
    res = canonicalise([np.array([[5.0, 6.0]])], one, {})
    assert [(r.cls, r.shape, r.exact) for r in res] == [(["v@0"], [1, 2], ["v@0"])]


def test_scan_runs_alike_in_every_pipeline_and_saves_each_iteration():
    p = scanned_layers()
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat2:jit", "jax:remat3", "jax:remat3+cvjp3",
             "torch:none", "torch:eager-sac"]
    obs = EXECUTOR.run(p, input_values(p, 0), names)
    j = judge(p, obs, PACKAGED)
    assert not j.failures(), [(v.key(), v.detail) for v in j.failures()]
    want = [(f"a@{k}", f"s@{k}") for k in range(3)]
    for n in ("jax:remat2", "jax:remat2:jit", "jax:remat3", "torch:eager-sac"):
        assert named(obs[n]) == want, (n, [r.describe() for r in obs[n].residuals])
    # JAX saves the named values as one stacked array: its own report agrees with the closure
    assert any(v.check == "residual_report" and v.status == "pass" for v in j.verdicts)
    # the reference recorded every iteration's value
    assert {"a@0", "a@1", "a@2", "c@0", "wk@2"} <= set(obs["ref:f64"].values)
    np.testing.assert_allclose(obs["jax:remat2"].grads["w"], obs["ref:f64"].grads["w"], rtol=1e-5)


def test_scan_repros_run_in_both_frameworks(tmp_path):
    p = scanned_layers(length=2)
    inputs = input_values(p, 0)
    for fw, pipeline, ref in (("jax", "jax:remat3", "jax:remat2"), ("torch", "torch:eager-sac", "jax:remat2")):
        v = Verdict(check="residuals", pipeline=pipeline, reference=ref, status="fail", error_type="missing")
        src = repro.generate(p, inputs, make_finding(v, p, inputs, {}, {}, "cpu"), fw)
        assert ("lax.scan(step_" in src) == (fw == "jax")
        rc, out = run_script(src, tmp_path, name=f"repro_{fw}.py")
        assert rc == 0, out
        assert "a@0/s@0['a']" in out and "a@1/s@1['a']" in out, out
    assert "scan(step_1, init=(x,), xs=(w,), length=2)" in repro.pseudo_code(p)


def test_scan_reductions_cut_it_to_one_iteration_then_inline_it():
    p = scanned_layers(xs=False)
    cut = [c for c in candidates(p) if c.body[0].kind == "scan" and c.body[0].length == 1]
    assert cut
    inlined = [c for c in candidates(cut[0]) if all(s.kind != "scan" for s in c.body)]
    assert inlined
    q = inlined[0]
    obs = EXECUTOR.run(q, input_values(q, 0), ["ref:f64", "jax:remat2"])
    assert obs["jax:remat2"].error is None and obs["ref:f64"].error is None


def _second_order(mode, body):
    p = prog(body, order=2)
    o = p.to_json_obj()
    o["diff"]["mode"] = mode
    return load_program(o)


PLAIN = [op("sin", ["x"], "a"), region(["a"], [op("cos", ["a"], "b"), op("mul", ["b", "a"], "m")], ["m"],
                                      {"kind": "nothing"})]


@pytest.mark.parametrize("mode", DIFF_MODES)
def test_every_second_order_mode_gives_h_times_ones(mode):
    p = _second_order(mode, PLAIN)
    assert ("forward_ad" in p.features()) == (mode != "reverse")
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3:jit", "torch:none"]
    obs = EXECUTOR.run(p, input_values(p, 0), names)
    # the same value whatever the mode: grad of sum(grad) of sin-then-cos(sin)*sin, from the reverse mode
    ref = EXECUTOR.run(_second_order("reverse", PLAIN), input_values(p, 0), ["ref:f64"])["ref:f64"]
    for n in names:
        if mode == "linearize" and n.startswith("torch"):
            assert obs[n].unsupported and "linearize" in obs[n].unsupported
            continue
        np.testing.assert_allclose(obs[n].grads2["x"], ref.grads2["x"], rtol=1e-5, err_msg=n)
    j = judge(p, obs, PACKAGED)
    assert not j.failures(), [(v.key(), v.detail) for v in j.failures()]


def test_a_perturbed_second_order_value_fails():
    # the judge compares second-order values: a hand-perturbed HVP fails against the same-dtype baseline
    p = _second_order("fwd_over_rev", PLAIN)
    obs = EXECUTOR.run(p, input_values(p, 0), ["ref:f64", "jax:none", "jax:remat2"])
    obs["jax:remat2"].grads2["x"][0] += 1e-2
    j = judge(p, obs, PACKAGED)
    assert any(v.pipeline == "jax:remat2" and v.check == "gradient" for v in j.failures())


def test_torch_declares_forward_modes_it_cannot_run():
    from conformance.pipelines.torch.pipelines import NO_FORWARD_AD, NO_LINEARIZE
    reasons = {e.id: e.unsupported.reason for e in PACKAGED.entries if e.unsupported}
    assert reasons["torch-no-linearize"] == NO_LINEARIZE
    assert reasons["torch-no-forward-ad-names"] == reasons["torch-no-forward-ad-custom-vjp"] == NO_FORWARD_AD
    named_prog = _second_order("fwd_over_rev", [op("sin", ["x"], "s"), op("name", ["s"], "n", name="a")])
    obs = EXECUTOR.run(named_prog, input_values(named_prog, 0), ["ref:f64", "jax:remat2", "torch:eager-sac"])
    assert obs["torch:eager-sac"].unsupported == NO_FORWARD_AD
    j = judge(named_prog, obs, PACKAGED)
    v = [v for v in j.verdicts if v.pipeline == "torch:eager-sac" and v.check == "error"]
    assert v and v[0].status == "unsupported" and v[0].expectation == "torch-no-forward-ad-names"


def test_grad_of_jvp_of_custom_vjp_raises():
    # JAX documents custom_vjp as reverse-mode only: grad of a jvp needs the rule's jvp
    p = _second_order("rev_over_fwd", [region(["x"], [sin_cvjp("x")], ["s"], {"kind": "nothing"})])
    obs = EXECUTOR.run(p, input_values(p, 0), ["ref:f64", "jax:remat2"])
    for n in ("ref:f64", "jax:remat2"):
        assert obs[n].error.type == "NotImplementedError" and "custom_lin" in obs[n].error.message
    j = judge(p, obs, PACKAGED)
    assert j.expectation_hits.get("jax-custom-vjp-no-forward-mode") == "fired"
    assert not [v for v in j.failures() if v.pipeline in ("ref:f64", "jax:remat2")]
    # a custom_vjp on a constant: the jvp never reaches it, nothing raises, nothing fails
    q = prog([op("sin", ["x"], "a"), sin_cvjp("c")], inputs=[{"id": "x", "shape": [3], "dtype": F32, "diff": True},
                                                             {"id": "c", "shape": [3], "dtype": F32, "diff": False}],
             outputs=["a", "s"], order=2).to_json_obj()
    q = load_program({**q, "diff": {"order": 2, "mode": "rev_over_fwd"}})
    obs = EXECUTOR.run(q, input_values(q, 0), ["ref:f64", "jax:none", "jax:remat2"])
    assert all(o.error is None for o in obs.values())
    assert not judge(q, obs, PACKAGED).failures()


def jit_program():
    """A jitted sub-function inside a region (naming sin(x) 'a'), and a region inside a jitted
    sub-function."""
    inner = {"kind": "jit", "args": ["x"], "body": [op("sin", ["x"], "s"), op("name", ["s"], "a", name="a"),
                                                  op("cos", ["a"], "c")], "results": ["c", "a"]}
    r1 = region(["x"], [inner, op("mul", ["c", "a"], "m")], ["m"], {"kind": "save_only_names", "names": ["a"]})
    r2 = {"kind": "jit", "args": ["m"], "body": [region(["m"], [op("exp", ["m"], "e"), op("name", ["e"], "b", name="b"),
                                                              op("tanh", ["b"], "t")], ["t"], {"kind": "nothing"})],
          "results": ["t"]}
    return prog([r1, r2], outputs=["t"])


def test_nested_jit_runs_alike_and_keeps_policies_inside_and_around():
    p = jit_program()
    assert {"nested_jit", "jit_in_checkpoint", "checkpoint_in_jit"} <= p.features()
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3", "jax:remat3:jit", "torch:none", "torch:eager-sac"]
    obs = EXECUTOR.run(p, input_values(p, 0), names)
    j = judge(p, obs, PACKAGED)
    assert not j.failures(), [(v.key(), v.detail) for v in j.failures()]
    for n in ("jax:remat2", "jax:remat3", "torch:eager-sac"):
        assert named(obs[n]) == [("a", "s")], (n, [r.describe() for r in obs[n].residuals])
    src = repro.generate(p, input_values(p, 0), None, "jax")
    assert "= jax.jit(jit_" in src
    assert "jit(jit_1)" in repro.pseudo_code(p)
    jits = lambda q: sum(s.kind == "jit" for s, *_ in walk(q.body))   # noqa: E731
    inlined = [c for c in candidates(p) if jits(c) == 1]
    assert len(inlined) >= 2 and all(load_program(c.to_json_obj()) == c for c in inlined)


def loop(spelling):
    """A checkpointed layer named 'a' as a fori_loop / while_loop (carry only) or a vmap (xs only)."""
    if spelling == "vmap":
        layer = [op("mul", ["wk", "y"], "m"), op("sin", ["m"], "s"), op("name", ["s"], "a", name="a"),
                 op("mul", ["a", "y"], "b")]
        body = [region(["wk", "y"], layer, ["b"], {"kind": "save_only_names", "names": ["a"]})]
        s = {"kind": "scan", "spelling": "vmap", "args": ["w", "y"], "carry": [], "xs": ["wk"], "length": 3,
             "body": body, "carry_out": [], "ys": ["b"], "results": ["bs"]}
        inputs = [{"id": "w", "shape": [3, 3], "dtype": F32, "diff": True},
                  {"id": "y", "shape": [3], "dtype": F32, "diff": True}]
        return prog([s], inputs=inputs, outputs=["bs"])
    p = scanned_layers(xs=False).to_json_obj()
    s = p["body"][0]
    s.update(spelling=spelling, ys=[], results=["cf"])
    p["outputs"] = ["cf"]
    if spelling == "while_loop":   # no gradient flows into it: y is read again after it
        p["body"].append(op("mul", ["cf", "y"], "o"))
        p["outputs"] = ["o"]
    return load_program(p)


@pytest.mark.parametrize("spelling", ["fori_loop", "while_loop", "vmap"])
def test_loops_and_vmap_run_alike(spelling, tmp_path):
    p = loop(spelling)
    assert spelling in p.features()
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3:jit", "torch:none", "torch:eager-sac"]
    obs = EXECUTOR.run(p, input_values(p, 0), names)
    j = judge(p, obs, PACKAGED)
    assert not j.failures(), [(v.key(), v.detail) for v in j.failures()]
    if spelling == "while_loop":   # only the last multiply is differentiated
        np.testing.assert_allclose(obs["jax:remat2"].grads["y"], obs["ref:f64"].outputs[0] / input_values(p, 0)["y"],
                                   rtol=1e-4)
        assert not named(obs["jax:remat2"])
    else:   # each iteration's named value is saved, as a stack in JAX and one by one in PyTorch
        for n in ("jax:remat2", "jax:remat3:jit", "torch:eager-sac"):
            assert named(obs[n]) == [(f"a@{k}", f"s@{k}") for k in range(3)], (n, obs[n].residuals)
    for fw in ("jax", "torch"):
        v = Verdict(check="residuals", pipeline="jax:remat3" if fw == "jax" else "torch:eager-sac",
                    reference="jax:remat2", status="fail", error_type="missing")
        src = repro.generate(p, input_values(p, 0), make_finding(v, p, input_values(p, 0), {}, {}, "cpu"), fw)
        rc, out = run_script(src, tmp_path, name=f"repro_{fw}.py")
        assert rc == 0, out


def cond_program(n=2):
    """A cond (or a switch of three) on a non-differentiated input p: each branch a checkpointed
    layer naming its nonlinearity 'a' (sin, cos, tanh), saving only it."""
    fns = ("sin", "cos", "tanh")[:n]
    branches = [
        [
            region(
                ["x"],
                [op(f, ["x"], f"s{k}"), op("name", [f"s{k}"], f"a{k}", name="a"), op("mul", [f"a{k}", "x"], f"m{k}")],
                [f"m{k}"],
                {"kind": "save_only_names", "names": ["a"]},
            )
        ]
        for k, f in enumerate(fns)
    ]
    c = {"kind": "cond", "args": ["p", "x"], "branches": branches, "branch_results": [[f"m{k}"] for k in range(n)],
         "results": ["r"]}
    return prog([c, op("exp", ["r"], "e")], inputs=[{"id": "x", "shape": [3], "dtype": F32, "diff": True},
                                                   {"id": "p", "shape": [2], "dtype": F32, "diff": False}],
                outputs=["e"])


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.slow)])   # (a switch of three: slow tier)
def test_cond_takes_the_same_branch_everywhere_and_saves_its_names(n, tmp_path):
    from conformance.ir.nodes import branch_thresholds
    p = cond_program(n)
    assert ("cond" if n == 2 else "switch") in p.features() and "checkpoint_in_cond" in p.features()
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3:jit", "torch:none", "torch:eager-sac",
             "torch:compile-aot_eager"]
    taken = set()
    for seed in range(6):
        inputs = input_values(p, seed)
        k = sum(float(inputs["p"].sum()) > t for t in branch_thresholds(n))
        taken.add(k)
        obs = EXECUTOR.run(p, inputs, names)
        j = judge(p, obs, PACKAGED)
        assert not j.failures(), [(v.key(), v.detail) for v in j.failures()]
        x = inputs["x"].astype(np.float64)
        s = [np.sin, np.cos, np.tanh][k](x)
        ds = [np.cos(x), -np.sin(x), 1 - np.tanh(x) ** 2][k]
        np.testing.assert_allclose(obs["ref:f64"].grads["x"], np.exp(s * x) * (ds * x + s), rtol=1e-10)
        for name in ("jax:remat2", "torch:eager-sac"):
            assert [c for c in named(obs[name])] == [(f"a{k}", f"s{k}")], (name, obs[name].residuals)
    assert len(taken) >= 2   # the seeds reach several branches
    v = Verdict(check="residuals", pipeline="jax:remat3", reference="jax:remat2", status="fail", error_type="missing")
    for fw in ("jax", "torch"):
        src = repro.generate(p, input_values(p, 0), make_finding(v, p, input_values(p, 0), {}, {}, "cpu"), fw)
        rc, out = run_script(src, tmp_path, name=f"repro_{fw}.py")
        assert rc == 0, out
    assert len([c for c in candidates(p) if "cond" not in c.features() and "switch" not in c.features()]) == n


def test_seeded_cotangents_reach_each_output_and_its_checkpoint():
    from conformance.ir.interpreter import seeded_cotangent
    p = scanned_layers(length=2, xs=False).to_json_obj()
    p["diff"]["cotangents"] = "seeded"
    p = load_program(p)
    assert "seeded_cotangents" in p.features() and "sum(outputs * seeded cotangents)" in repro.pseudo_code(p)
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3:jit", "torch:none", "torch:eager-sac"]
    obs = EXECUTOR.run(p, input_values(p, 0), names)
    assert not judge(p, obs, PACKAGED).failures()
    # the loss weights each output by its cotangent
    w = [np.asarray(seeded_cotangent(list(np.shape(o)))) for o in obs["ref:f64"].outputs]
    assert (
        abs(obs["ref:f64"].loss - sum(float(np.sum(np.asarray(o) * c)) for o, c in zip(obs["ref:f64"].outputs, w)))
        < 1e-9
    )
    q = load_program({**p.to_json_obj(), "diff": {"order": 1, "mode": "reverse"}})
    ones = EXECUTOR.run(q, input_values(q, 0), ["ref:f64"])["ref:f64"]
    assert not np.allclose(ones.grads["x"], obs["ref:f64"].grads["x"])
    with pytest.raises(ProgramError) as e:
        load_program({**p.to_json_obj(), "diff": {"order": 2, "mode": "reverse", "cotangents": "seeded"}})
    assert e.value.field == "diff.cotangents"
    # the JSON of a program with ones cotangents is unchanged (stored programs keep their hashes)
    assert "cotangents" not in q.to_json_obj()["diff"]
    src = repro.generate(p, input_values(p, 0), None, "jax")
    assert "COTANGENTS = [" in src


@pytest.mark.parametrize("tree,static", [("flat", True), ("tuple", False), ("dict", True)])
def test_region_static_flag_and_pytree_args_compute_the_same(tree, static, tmp_path):
    p = cond_program(2).to_json_obj()
    region_ = p["body"][0]["branches"][0][0]
    region_.update(static_flag=static, tree=tree)
    p = load_program(p)
    feats = p.features()
    assert ("static_argnums" in feats) == static and ("region_pytree" in feats) == (tree != "flat")
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3:jit", "torch:none", "torch:eager-sac"]
    for seed in (0, 1):
        obs = EXECUTOR.run(p, input_values(p, seed), names)
        j = judge(p, obs, PACKAGED)
        assert not j.failures(), [(v.key(), v.detail) for v in j.failures()]
    v = Verdict(check="residuals", pipeline="jax:remat3", reference="jax:remat2", status="fail", error_type="missing")
    for fw in ("jax", "torch"):
        src = repro.generate(p, input_values(p, 0), make_finding(v, p, input_values(p, 0), {}, {}, "cpu"), fw)
        assert (("static_argnums=(" in src) == static) or fw == "torch"
        rc, out = run_script(src, tmp_path, name=f"repro_{fw}.py")
        assert rc == 0, out


def test_aux_outputs_are_returned_and_not_differentiated(tmp_path):
    """diff.aux: the last outputs come back beside the loss (value_and_grad(has_aux=True)) and
    contribute nothing to the gradient, in every pipeline and in the repros."""
    body = [region(["x"], [op("sin", ["x"], "s"), op("name", ["s"], "a", name="a"), op("mul", ["a", "x"], "b")],
                   ["b", "a"], {"kind": "save_only_names", "names": ["a"]}),
            op("exp", ["a"], "e")]
    p = load_program(
        {**prog(body, outputs=["b", "e"]).to_json_obj(), "diff": {"order": 1, "mode": "reverse", "aux": 1}}
    )
    assert "aux_outputs" in p.features() and "has_aux=True" in repro.pseudo_code(p)
    only_b = prog(body, outputs=["b"])
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3", "jax:remat3:jit", "torch:none", "torch:eager-sac"]
    obs = EXECUTOR.run(p, input_values(p, 0), names)
    ref = EXECUTOR.run(only_b, input_values(p, 0), ["ref:f64"])["ref:f64"]
    j = judge(p, obs, PACKAGED)
    assert not j.failures(), [(v.key(), v.detail) for v in j.failures()]
    for name in names:
        np.testing.assert_allclose(obs[name].grads["x"], ref.grads["x"], rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(obs[name].outputs[1], np.exp(np.sin(input_values(p, 0)["x"])), rtol=1e-5)
        assert abs(obs[name].loss - ref.loss) < 1e-4, name
    with pytest.raises(ProgramError) as e:   # at least one output is differentiated
        load_program({**p.to_json_obj(), "diff": {"order": 1, "mode": "reverse", "aux": 2}})
    assert e.value.field == "diff.aux"
    assert "aux" not in only_b.to_json_obj()["diff"]   # stored programs keep their hashes
    for fw in ("jax", "torch"):
        src = repro.generate(p, input_values(p, 0), None, fw)
        assert "AUX = 1" in src
        rc, out = run_script(src, tmp_path, name=f"repro_{fw}.py")
        assert rc == 0, out


def pytree_rules(tree, spelling="defvjp", symbolic_zeros=False):
    """A custom_vjp of two args and two results (one unread: a zero cotangent) taking and
    returning them as `tree`, inside a region saving everything; then a custom_jvp as `tree`."""
    cvjp = {"kind": "custom_vjp", "args": ["x", "y"], "tree": tree, "spelling": spelling,
            # (no name in its fwd: remat3's open findings, the seed's and a missing named residual)
            "fwd": [op("sin", ["x"], "s"), op("cos", ["x"], "c"), op("mul", ["s", "y"], "m")],
            "results": ["m", "s"], "residuals": ["c", "s", "y"], "cts": ["gm", "gs"],
            "bwd": [op("mul", ["gm", "y"], "t1"), op("add", ["t1", "gs"], "t2"), op("mul", ["t2", "c"], "dx"),
                    op("mul", ["gm", "s"], "dy")],
            "bwd_results": ["dx", "dy"], "symbolic_zeros": symbolic_zeros}
    cjvp = {"kind": "custom_jvp", "args": ["m", "y"], "tree": tree, "body": [op("mul", ["m", "y"], "p")],
            "results": ["p"], "tangents": ["tm", "ty"],
            "jvp": [op("mul", ["tm", "y"], "j1"), op("mul", ["m", "ty"], "j2"), op("add", ["j1", "j2"], "tp")],
            "jvp_results": ["tp"]}
    body = [region(["x", "y"], [cvjp], ["m"], {"kind": "everything"}), cjvp]
    return prog(body, inputs=[{"id": "x", "shape": [3], "dtype": F32, "diff": True},
                              {"id": "y", "shape": [3], "dtype": F32, "diff": True}], outputs=["p"])


@pytest.mark.parametrize("tree,spelling,sz", [("tuple", "defvjp", True), ("dict", "defvjp", False),
                                               ("dict", "custom_gradient", False), ("tuple", "defremat", False)])
def test_custom_rules_over_pytrees_compute_the_same(tree, spelling, sz, tmp_path):
    p = pytree_rules(tree, spelling, sz)
    flat = pytree_rules("flat", spelling, sz)
    assert "rule_pytree" in p.features() and "rule_pytree" not in flat.features()
    assert f"args_as={tree!r}" in repro.pseudo_code(p)
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3", "jax:remat3+cvjp3:jit"]
    x = input_values(p, 0)
    obs, ref = EXECUTOR.run(p, x, names), EXECUTOR.run(flat, x, names)
    j = judge(p, obs, PACKAGED)
    assert not j.failures(), [(v.key(), v.detail) for v in j.failures()]
    for name in names:
        if ref[name].error is None:
            assert obs[name].error is None, (name, obs[name].error)
            for k in ("x", "y"):
                np.testing.assert_allclose(obs[name].grads[k], ref[name].grads[k], rtol=1e-6, err_msg=name)
        if sz and name != "ref:f64":   # the unread result's cotangent is a symbolic zero, in a pytree too
            assert [False, True] in next(iter(obs[name].custom_rules.values())).symbolic_zero_cts, name
    src = repro.generate(p, x, None, "jax", pipeline="jax:remat3+cvjp3")   # (defremat needs custom_vjp3)
    assert "tree_rules(" in src and "tree_jvp(" in src
    rc, out = run_script(src, tmp_path, name="repro_jax.py")
    assert rc == 0, out


def test_reductions_set_each_later_option_to_its_plain_value():
    p = pytree_rules("dict", "custom_gradient").to_json_obj()
    p["diff"]["aux"] = 0
    p["body"][0]["static_flag"] = True
    p = load_program(p)
    plain = {(c.body[0].static_flag, c.body[0].body[0].tree, c.body[0].body[0].spelling, c.body[1].tree)
             for c in candidates(p) if [s.kind for s in c.body] == ["checkpoint", "custom_jvp"]
             and [s.kind for s in c.body[0].body] == ["custom_vjp"]}
    assert {(False, "dict", "custom_gradient", "dict"), (True, "flat", "custom_gradient", "dict"),
            (True, "dict", "defvjp", "dict"), (True, "dict", "custom_gradient", "flat")} <= plain


def per_example_program(order=1, mode="reverse"):
    """Per-example gradients over 3 examples of x (a batched input) through shared weights w:
    x @ w, then sin named 'a' and cos, in a region saving only 'a'."""
    body = [op("matmul", ["x", "w"], "m"),
            region(["m"], [op("sin", ["m"], "s"), op("name", ["s"], "a", name="a"), op("cos", ["a"], "c")], ["c"],
                   {"kind": "save_only_names", "names": ["a"]})]
    return load_program({"schema_version": 1, "body": body, "outputs": ["c"],
                         "inputs": [{"id": "x", "shape": [2, 3], "dtype": F32, "diff": True, "batched": True},
                                    {"id": "w", "shape": [3, 2], "dtype": F32, "diff": True}],
                         "diff": {"order": order, "mode": mode, "batch": 3}})


def test_per_example_gradients_are_one_per_example_everywhere(tmp_path):
    from tests.test_reference import finite_difference
    p = per_example_program()
    assert "per_example" in p.features() and "vmap of value_and_grad" in repro.pseudo_code(p)
    x = input_values(p, 0)
    assert x["x"].shape == (3, 2, 3) and x["w"].shape == (3, 2)   # (a shared input keeps its shape)
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3", "jax:remat3:jit", "torch:none", "torch:eager-sac"]
    obs = EXECUTOR.run(p, x, names)
    j = judge(p, obs, PACKAGED)
    assert not j.failures(), [(v.key(), v.detail) for v in j.failures()]
    fd = finite_difference(p, {k: v.astype(np.float64) for k, v in x.items()})
    X, W = x["x"].astype(np.float64), x["w"].astype(np.float64)
    want = np.stack([X[b].T @ (-np.sin(np.sin(X[b] @ W)) * np.cos(X[b] @ W)) for b in range(3)])
    np.testing.assert_allclose(fd["w"], want, rtol=1e-5, atol=1e-7)
    for name in names:   # one gradient of the shared w per example, and the per-example residuals
        np.testing.assert_allclose(obs[name].grads["w"], want, rtol=1e-4, atol=1e-6, err_msg=name)
        np.testing.assert_allclose(obs[name].grads["x"], fd["x"], rtol=1e-3, atol=1e-5, err_msg=name)
    for name in ("jax:remat2", "jax:remat3", "torch:eager-sac"):
        assert named(obs[name]) == [(f"a@{b}", f"s@{b}") for b in range(3)], (name, obs[name].residuals)
    # reduced to one example; repros run in both frameworks
    q = load_program({**p.to_json_obj(), "inputs": [{**i, "batched": False} for i in p.to_json_obj()["inputs"]],
                      "diff": {"order": 1, "mode": "reverse"}})
    assert q in list(candidates(p))   # the reduction to one example per batch is a candidate
    v = Verdict(check="residuals", pipeline="jax:remat3", reference="jax:remat2", status="fail", error_type="missing")
    for fw in ("jax", "torch"):
        src = repro.generate(p, x, make_finding(v, p, x, {}, {}, "cpu"), fw)
        assert "BATCH = 3" in src
        rc, out = run_script(src, tmp_path, name=f"repro_{fw}.py")
        assert rc == 0, out


@pytest.mark.parametrize("mode", DIFF_MODES[:3])
def test_per_example_second_order_is_h_times_ones_per_example(mode):
    p = per_example_program(order=2, mode=mode)
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat3:jit", "torch:eager-sac"]
    obs = EXECUTOR.run(p, input_values(p, 0), names)
    j = judge(p, obs, PACKAGED)
    assert not j.failures(), [(v.key(), v.detail) for v in j.failures()]
    assert np.shape(obs["ref:f64"].grads2["w"]) == (3, 3, 2)
    one = load_program({**p.to_json_obj(), "inputs": [{**i, "batched": False} for i in p.to_json_obj()["inputs"]],
                        "diff": {"order": 2, "mode": mode}})
    x = input_values(p, 0)
    for b in range(3):   # example b's H @ ones is the program's on example b alone
        ob = EXECUTOR.run(one, {"x": x["x"][b], "w": x["w"]}, ["ref:f64"])["ref:f64"]
        np.testing.assert_allclose(obs["ref:f64"].grads2["w"][b], ob.grads2["w"], rtol=1e-9)


def test_a_dead_custom_vjp_whose_fwd_one_pipeline_skips_is_no_finding():
    """A campaign (seed 41) blamed remat3 for running only the primal of a custom_vjp whose result
    nothing reads (in a fori_loop in a region): dead code needs no rule, as a custom_jvp's
    tangents a rival did not need."""
    from oracles.judge import dead_blocks
    cvjp = {"kind": "custom_vjp", "args": ["c1"], "fwd": [op("sum", ["c1"], "v2", axis=None)], "results": ["v2"],
            "residuals": [], "cts": ["g4"], "bwd": [op("reshape", ["g4"], "b5", shape=[1, 1]),
                                                    op("broadcast", ["b5"], "b6", shape=[2, 2])], "bwd_results": ["b6"]}
    loop = {"kind": "scan", "spelling": "fori_loop", "args": ["x0"], "carry": ["c1"], "body": [cvjp],
            "carry_out": ["c1"], "results": ["s3"], "length": 1}
    p = prog([region(["x0"], [loop], ["s3"], {"kind": "nothing"})],
             inputs=[{"id": "x0", "shape": [2, 2], "dtype": F32, "diff": True}], outputs=["s3"])
    assert dead_blocks(p) == {"body[0].body[0].body[0]"}
    # also when its result is its own residual (make run, seed 0: exp, whose bwd reads its result)
    own = {**cvjp, "fwd": [op("exp", ["c1"], "v2")], "residuals": ["v2"], "bwd": [op("mul", ["g4", "v2"], "b6")]}
    q = prog([region(["x0"], [{**loop, "body": [own]}], ["s3"], {"kind": "nothing"})],
             inputs=[{"id": "x0", "shape": [2, 2], "dtype": F32, "diff": True}], outputs=["s3"])
    assert dead_blocks(q) == {"body[0].body[0].body[0]"}
    assert not [v.key() for v in judge(q, EXECUTOR.run(q, input_values(q, 0), ["ref:f64", "jax:none", "jax:remat2",
                                                                               "jax:remat3"]), PACKAGED).failures()
                if v.check == "custom_rule"]
    obs = EXECUTOR.run(p, input_values(p, 0), ["ref:f64", "jax:none", "jax:remat2", "jax:remat3"])
    rules = {n: o.custom_rules["body[0].body[0].body[0]"] for n, o in obs.items()}
    j = judge(p, obs, PACKAGED)
    assert not [v.key() for v in j.failures() if v.check == "custom_rule"], rules
    # the same block whose result the loop carries is live
    cvjp2 = {**cvjp, "fwd": [op("sin", ["c1"], "v2")], "bwd": [op("cos", ["c1"], "b5"), op("mul", ["g4", "b5"], "b6")],
             "residuals": ["c1"]}
    live = prog([region(["x0"], [{**loop, "body": [cvjp2], "carry_out": ["v2"]}], ["s3"], {"kind": "nothing"})],
                inputs=[{"id": "x0", "shape": [2, 2], "dtype": F32, "diff": True}], outputs=["s3"])
    assert dead_blocks(live) == frozenset()
    # dead through a dead reader: its result read only by a sum nothing reads (the CI gate, seed 3535:
    # remat3 skipped the fwd of such a block in a scan in a region, remat2 ran it)
    neg = {**cvjp, "fwd": [op("neg", ["c1"], "v2")], "bwd": [op("neg", ["g4"], "b6")]}
    chained = prog([region(["x0"], [{**loop, "body": [neg, op("sum", ["v2"], "v9", axis=None)]}], ["s3"],
                           {"kind": "nothing"})],
                   inputs=[{"id": "x0", "shape": [2, 2], "dtype": F32, "diff": True}], outputs=["s3"])
    assert dead_blocks(chained) == {"body[0].body[0].body[0]"}
    # and live when that reader's result is carried
    carried = prog([region(["x0"], [{**loop, "body": [neg, op("sum", ["v2"], "v9", axis=None),
                                                      op("reshape", ["v9"], "v11", shape=[1, 1]),
                                                      op("broadcast", ["v11"], "v12", shape=[2, 2]),
                                                      op("add", ["c1", "v12"], "v10")], "carry_out": ["v10"]}],
                           ["s3"], {"kind": "nothing"})],
                   inputs=[{"id": "x0", "shape": [2, 2], "dtype": F32, "diff": True}], outputs=["s3"])
    assert dead_blocks(carried) == frozenset()


def test_per_example_programs_do_not_judge_policies_that_decide_on_shapes():
    """Under dots_no_batch JAX's policy sees vmapped shapes: the repro's policy check (and the
    policy oracle, through the same helper) leaves per-example programs under it unjudged, and
    only those."""
    from conformance.ir.policy import judged_by_meaning
    from conformance.repro.plan import must_not_save
    obj = per_example_program().to_json_obj()
    obj["body"][1]["policy"] = {"kind": "dots_no_batch"}
    p = load_program(obj)
    one = load_program({**obj, "inputs": [{**i, "batched": False} for i in obj["inputs"]],
                        "diff": {"order": 1, "mode": "reverse"}})
    assert must_not_save(one) and must_not_save(p) == []
    assert must_not_save(per_example_program()) == ["s"] == must_not_save(load_program(
        {**per_example_program().to_json_obj(), "inputs": [{**i, "batched": False} for i in obj["inputs"]],
         "diff": {"order": 1, "mode": "reverse"}}))   # a names policy is judged per example as well
    assert not judged_by_meaning([p.body[1].policy], True) and judged_by_meaning([p.body[1].policy], False)
