"""One finding per cause (issue 45): a residual difference names the decision behind each differing value,
roots and `--known` key on those causes, a bare error roots on where it was raised, and every corpus variant
roots under its own root. No framework runs."""
from __future__ import annotations

import json
from collections import defaultdict

import pytest

from conformance.engine.describe import cause_text, title
from conformance.engine.findings import Finding, error_root, signature
from conformance.engine.loading import load_known
from conformance.engine.roots import evidence_root, root_key, stamp, with_causes
from conformance.engine.search import known_finding, merge_finding, same_behaviour
from conformance.ir.policy import Both, Dots, SaveOnlyNames, deciding_rule
from conformance.ir.program import Program, load_program
from oracles.residual_causes import causes, core, effect_causes
from tests.programs import op, prog, region, sin_cvjp

# jax's seed: a value named inside a custom_vjp fwd, in a region saving only that name
SEED = {"body": [{"args": ["x1"], "body": [
    {"args": ["x1"], "bwd": [{"args": ["g6"], "kind": "op", "op": "neg", "out": "r6", "params": {}}],
     "bwd_results": ["r6"], "cts": ["g6"],
     "fwd": [{"args": ["x1"], "kind": "op", "op": "neg", "out": "v1", "params": {}},
             {"args": ["v1"], "kind": "op", "op": "name", "out": "v4", "params": {"name": "a"}}],
     "kind": "custom_vjp", "nondiff": [], "optimize_remat": False, "residuals": [], "results": ["v4"],
     "symbolic_zeros": False},
    {"args": ["v4"], "kind": "op", "op": "sin", "out": "v5", "params": {}}],
    "kind": "checkpoint", "policy": {"kind": "save_only_names", "names": ["a"]}, "prevent_cse": True,
    "results": ["v5"]}],
    "diff": {"mode": "reverse", "order": 1}, "extensions": {},
    "inputs": [{"diff": True, "dtype": "float32", "id": "x1", "shape": []}], "outputs": ["v5"], "schema_version": 1}
# what remat3 does with it: recomputes the named value, saves the region's input instead
SEED_DETAIL = {"missing_named": ["v1/v4"], "extra_named": [], "missing_other": [],
               "extra_other": ["float32[] (a program input)"],
               "saved": ["x1:float32[]"], "reference_saved": ["v1/v4['a']:float32[]"]}
NAMED_FWD = "recomputes a value named in a custom_vjp fwd [names:save]"


def _finding(program, detail, pipeline="jax:remat3", reference="jax:remat2", label="missing", tracked=None):
    feats = sorted(Program.model_validate(program).features())
    return Finding(signature=signature("residuals", pipeline, reference, label, feats), check="residuals",
                   pipeline=pipeline, reference=reference, error_type=label, features=feats, program=program,
                   program_hash="0" * 16, detail=dict(detail), tracked=tracked)


def test_the_seed_names_the_value_named_in_the_fwd_that_the_names_policy_saves():
    # the saved input is what the recompute starts from: its consequence, not a second cause
    assert causes(Program.model_validate(SEED), SEED_DETAIL) == [NAMED_FWD]
    f = stamp(_finding(SEED, SEED_DETAIL))
    # the root keys on the decision departed from (save), not on the rule that made it (names)
    assert f.root == "residuals|jax:remat3|jax:remat2|recomputes a value named in a custom_vjp fwd [save]"
    assert cause_text(NAMED_FWD) == "recomputes a value named in a custom_vjp fwd that its names policy saves"
    assert title(f) == ("jax:remat3 recomputes a value named in a custom_vjp fwd that its names policy saves, "
                        "which jax:remat2 saves")


def test_each_value_kind_and_each_policy_decision_is_a_cause_of_its_own():
    p = prog([region(["x"], [op("matmul", ["x", "x"], "m"), op("sin", ["m"], "s"), op("tanh", ["s"], "y")],
                     ["y"], {"kind": "dots"})], inputs=[{"id": "x", "shape": [3, 3], "dtype": "float64", "diff": True}])
    dot = causes(p, {"missing_other": ["float64[3, 3]"], "reference_saved": ["m:float64[3, 3]", "x:float64[3, 3]"],
                     "saved": ["x:float64[3, 3]"]})
    assert dot == ["recomputes a dot's output [dots:save]"]
    op_out = causes(p, {"extra_other": ["float64[3, 3]"], "saved": ["s:float64[3, 3]", "m:float64[3, 3]"],
                        "reference_saved": ["m:float64[3, 3]"]})
    assert op_out == ["saves an op's output [dots:recompute]"]
    # a value outside every region saved alone (nothing recomputed) is a cause, whatever it is (no policy decides
    # on it); an unmatched value is one too
    assert causes(p, {"extra_other": ["float64[3, 3] (a program input)"], "saved": ["x:float64[3, 3]"],
                      "reference_saved": []}) == ["saves a value outside every region"]
    assert causes(p, {"extra_other": ["float64[3, 3]"], "saved": ["?:float64[3, 3]"],
                      "reference_saved": []}) == ["saves an unmatched value"]


def test_a_value_saved_that_the_loss_does_not_read_is_one_cause_whatever_it_is_and_its_policy():
    """remat3-no-zero-propagation showed as three residual findings of one 30-minute campaign (a dead value outside
    every region, a dot's output only a dead tanh needs, an unmatched value): the reference drops each before any
    policy decides, so each is `saves a value the loss does not read`."""
    x = [{"id": "x", "shape": [2, 2], "dtype": "float32", "diff": True}]
    # m feeds the loss through neg (linear: its derivative does not read m) and a tanh returned as aux (no
    # cotangent): only code the loss does not read needs m's value
    aux = prog([region(["x"], [op("matmul", ["x", "x"], "m"), op("neg", ["m"], "n"), op("tanh", ["m"], "t")],
                       ["n", "t"], {"kind": "dots"})], inputs=x, outputs=["n", "t"])
    aux = aux.model_copy(update={"diff": aux.diff.model_copy(update={"aux": 1})})
    found = causes(aux, {"extra_other": ["float32[2, 2]"], "saved": ["x:float32[2, 2]", "m:float32[2, 2]"],
                         "reference_saved": ["x:float32[2, 2]"]})
    assert found == ["saves a dot's output the loss does not read [dots:save]"]
    assert list(map(core, found)) == ["saves a value the loss does not read"]
    # an input needed only to recompute what such code reads (n = -x, tanh(n) returned as aux)
    negated = prog([region(["x"], [op("neg", ["x"], "n"), op("tanh", ["n"], "t")], ["n", "t"], {"kind": "nothing"})],
                   inputs=x, outputs=["n", "t"])
    negated = negated.model_copy(update={"diff": negated.diff.model_copy(update={"aux": 1})})
    assert core(causes(negated, {"extra_other": ["float32[2, 2] (a program input)"], "saved": ["x:float32[2, 2]"],
                                 "reference_saved": []})[0]) == "saves a value the loss does not read"
    # a step passes no cotangent: what only it reads is not read by the loss
    stepped = prog([region(["x"], [op("sin", ["x"], "s"), op("step", ["s"], "y")], ["y"], {"kind": "nothing"})],
                   inputs=x)
    assert causes(stepped, {"extra_other": ["float32[2, 2]"], "saved": ["s:float32[2, 2]"], "reference_saved": []}) \
        == ["saves an op's output the loss does not read [nothing:recompute]"]
    # an unmatched value shaped as a dead value is read as one; the same save in a program without one is not
    dead = prog([op("sin", ["x"], "d"), region(["x"], [op("neg", ["x"], "y")], ["y"], {"kind": "nothing"})],
                inputs=x, outputs=["y"])
    unmatched = {"extra_other": ["float32[2, 2]"], "saved": ["?:float32[2, 2]"], "reference_saved": []}
    assert causes(dead, unmatched) == ["saves an unmatched value shaped as one the loss does not read"]
    assert causes(stepped, {**unmatched, "extra_other": ["float32[3]"], "saved": ["?:float32[3]"]}) == \
        ["saves an unmatched value"]
    # a value the loss reads and a policy saves stays its own cause; a recompute is never read as dead code's
    assert core(causes(aux, {"extra_other": ["float32[2, 2]"], "saved": ["n:float32[2, 2]"],
                             "reference_saved": []})[0]) == "saves an op's output [recompute]"


def test_the_rule_a_policy_decided_by_is_a_variant_but_the_decision_and_optimize_remat_are_causes():
    """One remat3 behaviour (an op with no remat rule is recomputed whatever the policy says) showed as six findings
    in a 30-minute campaign, one per rule that said save ([custom:save], [everything_but_names:save], ...)."""
    def root(cause):
        return evidence_root("residuals", "jax:remat3", "jax:remat2", {"causes": [cause]})
    op_out = "recomputes an op's output"
    assert root(f"{op_out} [custom:save]") == root(f"{op_out} [everything_but_names:save]")
    assert root("recomputes an op's output [custom:save]") != root("recomputes an op's output [custom:offload]")
    assert root("recomputes a value [names:save > custom:recompute]") == "recomputes a value [save > recompute]"
    # a custom_vjp with optimize_remat is bound as a primitive of its own: its residual is another cause
    def cvjp_residual(optimize_remat):
        rule = {"kind": "custom_vjp", "args": ["x"], "fwd": [op("tanh", ["x"], "t")], "results": ["t"],
                "residuals": ["t"], "cts": ["g"], "bwd": [op("mul", ["g", "t"], "b")], "bwd_results": ["b"],
                "nondiff": [], "optimize_remat": optimize_remat, "symbolic_zeros": False}
        p = prog([region(["x"], [rule], ["t"], {"kind": "save_anything_except_names", "names": ["a"]})],
                 inputs=[{"id": "x", "shape": [], "dtype": "float32", "diff": True}], outputs=["t"])
        return causes(p, {"missing_other": ["float32[]"], "reference_saved": ["t:float32[]"], "saved": []})
    assert cvjp_residual(False) == ["recomputes a custom_vjp residual [everything_but_names:save]"]
    assert cvjp_residual(True) == ["recomputes an optimize_remat custom_vjp residual [everything_but_names:save]"]


def test_an_unmatched_value_beside_a_program_value_of_the_same_decision_is_not_a_cause_of_its_own():
    """Eager SAC recomputing an offloaded torch.max recomputes its indices too (int64, no program value): one
    cause, the corpus root's (a 240 s campaign filed it as new for the indices alone)."""
    p = prog([region(["x"], [op("max_dim", ["x"], "m", axis=0)], ["m"], {"kind": "offload_ops", "ops": ["max_dim"]})],
             inputs=[{"id": "x", "shape": [3], "dtype": "float32", "diff": True}], outputs=["m"])
    detail = {"recomputed_against_policy": ["?:int64[]", "m:float32[]"], "aten_ops": ["aten.max"],
              "saved": ["x:float32[3]"]}
    assert causes(p, detail) == ["recomputes against its policy an op's output [custom:offload]"]
    # alone, an unmatched value is a cause
    alone = {"recomputed_against_policy": ["?:int64[]"], "aten_ops": ["aten.max"], "saved": ["x:float32[3]"]}
    assert causes(p, alone) == ["recomputes against its policy an unmatched value"]


def test_an_op_a_region_decides_on_is_its_output_even_as_a_cond_branchs_result():
    """remat3 recomputing tanh's output that an offloading policy keeps is one cause whether or not the region sits
    in a cond branch whose result it is (a 30-minute campaign split the two)."""
    region_ = region(["v"], [op("cos", ["v"], "c"), op("tanh", ["c"], "t")], ["t"],
                     {"kind": "offload_ops", "ops": ["tanh"]})
    inputs = [{"id": "x", "shape": [], "dtype": "float32", "diff": True},
              {"id": "p", "shape": [2], "dtype": "float32", "diff": False}]
    plain = prog([op("sin", ["x"], "v"), region_], inputs=inputs, outputs=["t"])
    in_cond = prog([op("sin", ["x"], "v"), {"kind": "cond", "args": ["p", "x", "v"], "branches": [[region_], []],
                                            "branch_results": [["t"], ["v"]], "results": ["s"]}],
                   inputs=inputs, outputs=["s"])
    detail = {"missing_other": ["float32[]"], "reference_saved": ["t:float32[]", "v:float32[]"],
              "saved": ["v:float32[]"]}
    assert causes(plain, detail) == causes(in_cond, detail) == ["recomputes an op's output [custom:offload]"]


def test_save_from_both_policies_is_read_as_the_sub_policy_that_decided():
    both = Both(a=SaveOnlyNames(names=["a"]), b=Dots())
    assert deciding_rule(both, "name", "a") == "names"
    assert deciding_rule(both, "matmul", None) == "dots"
    assert deciding_rule(both, "sin", None) == "names"   # neither saves: the first


def test_a_new_cause_under_a_known_direction_is_not_swallowed():
    """The issue's measured defect: a remat3 policy saving less of another kind of value was counted under
    remat3-ignores-names-in-custom-vjp-fwd (one direction: saves less). Keyed on causes it is new."""
    known = stamp(_finding(SEED, SEED_DETAIL, tracked="remat3-ignores-names-in-custom-vjp-fwd.json"))
    key = ("residuals", "jax:remat3:jit", "jax:remat2:jit", "other")
    same = f"{NAMED_FWD}"
    assert known_finding([known], key, set(), {key}, same) is known          # the same cause, a twin pipeline
    dot = "recomputes a dot's output [dots:save]"
    assert known_finding([known], key, set(), {key}, dot) is None            # a new cause
    assert known_finding([known], key, set(), {key}, f"{dot} + {NAMED_FWD}") is None   # one of two is new
    # once a finding holds the new cause, a program showing both is counted (under its first cause's finding)
    new = _finding(SEED, {}, label="other")
    new.detail = {"causes": [dot]}
    stamp(new)
    assert known_finding([known, new], key, set(), {key}, f"{dot} + {NAMED_FWD}") is new
    # the same decision shown at second order, or on a value the loss does not read, is the cause the shrunk
    # program showed (the shrink may drop both): counted under it, not shrunk again and again
    assert known_finding([known], key, set(), {key}, f"{NAMED_FWD}, second order (fwd_over_rev)") is known
    dead = NAMED_FWD.replace(" [", " the loss does not read [")
    assert known_finding([known], key, set(), {key}, dead) is known
    # a value saved that the loss does not read is one cause, whatever the value and its policy (the reference
    # drops it before a policy decides: no zero cotangent propagated)
    assert core("saves a value outside every region the loss does not read, per example") == \
        core("saves a dot's output the loss does not read [dots:save]") == "saves a value the loss does not read"
    # a shrunk finding folds into one holding all its causes, never into one holding fewer
    assert same_behaviour(known, _finding(SEED, SEED_DETAIL, pipeline="jax:remat3+cvjp3"))
    assert not same_behaviour(known, new) and not same_behaviour(new, known)
    findings = [known]
    kept, changed = merge_finding(findings, new)
    assert changed and findings == [known, new]


def test_a_bare_error_roots_on_the_frame_that_raised_it():
    bare = {"got": {"type": "AssertionError", "message": "", "stage": "forward"}}
    assert error_root(bare) is None
    where = {"got": {**bare["got"], "where": "jax/_src/lax/control_flow/loops.py:_while_partial_eval_custom"}}
    other = {"got": {**bare["got"], "where": "jax/_src/ad_checkpoint.py:_remat_bind"}}
    assert error_root(where) == ("AssertionError: raised in "
                                 "jax/_src/lax/control_flow/loops.py:_while_partial_eval_custom")
    assert error_root(where) != error_root(other)
    # a message long enough keeps rooting on the message, wherever it was raised
    long = {"got": {"type": "ValueError", "message": "safe_zip() argument 1 has length 6", "where": "x.py:f"}}
    assert error_root(long).startswith("ValueError: safe_zip()")


def test_a_raise_roots_alike_whatever_its_float_width_unbacked_symbols_or_failing_equation():
    """What the program put into a message is not the raise (r36, once each raise was shrunk: `Ref{bfloat16[]}`
    beside `Ref{float32[]}`, `{u1, zuf1}` beside `{zuf1}`, and JAX's failing equation, the program's own jaxpr,
    each filed one raise as two findings); a message that differs before them is another raise."""
    def raised(message, t="ValueError"):
        return error_root({"got": {"type": t, "message": message, "stage": "backward"}})
    assert raised("Expected cotangent type Ref{bfloat16[]} but got bfloat16[]") == raised(
        "Expected cotangent type Ref{float32[2]} but got float32[2]")
    pending = "Pending unbacked symbols {%s} not in returned outputs [FakeTensor(..., size=(1, 4))] ."
    assert raised(pending % "u1, zuf1", "PendingUnbackedSymbolNotFound") == raised(
        pending % "zuf1", "PendingUnbackedSymbolNotFound")
    effect = ("`JaxprInputEffect` Write<Var(id=1407):float32[]> does not have a corresponding jaxpr input.\n"
              " Equation: a:f32[] b:f32[] = RematTraced[\n  jaxpr={ lambda ; c:Ref{f32[]} d:f32[]. let")
    assert raised(effect) == raised(effect.replace("f32", "bf16").replace("float32", "bfloat16").replace(
        "lambda ; c", "lambda ; z")) == "ValueError: `JaxprInputEffect` Effect<Var(id=N):floatN[N]> does not have " \
        "a corresponding jaxpr input."
    assert raised("Expected cotangent type Ref{float32[]} but got int32[]") != raised(
        "Expected cotangent type Ref{float32[]} but got float32[]")


def test_a_raise_site_is_the_framework_frame_that_raised_and_the_framework_frame_that_called_it(tmp_path):
    """One bare assertion reached from two framework callers is two raise sites (jax's _remat_bind assert, from
    fun_remat for jax PR #33217's bug, from eval_jaxpr for nested regions); a harness frame calling the framework
    is no caller of it."""
    import importlib.util

    from conformance.pipelines.base import raise_site
    src = tmp_path / "framework_stand_in.py"
    src.write_text("def check(x):\n    assert x\n\ndef bind(x):\n    check(x)\n\ndef rule(x):\n    check(x)\n")
    spec = importlib.util.spec_from_file_location("framework_stand_in", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    sites = []
    for call in (mod.bind, mod.rule, mod.check):
        with pytest.raises(AssertionError) as e:
            call(False)
        sites.append(raise_site(e.value))
    assert sites == ["framework_stand_in.py:check, called from framework_stand_in.py:bind",
                     "framework_stand_in.py:check, called from framework_stand_in.py:rule",
                     "framework_stand_in.py:check"]
    assert len({error_root({"got": {"type": "AssertionError", "message": "", "stage": "forward", "where": s}})
                for s in sites}) == 3


def test_every_corpus_variant_roots_under_its_own_root_and_no_two_roots_share_a_key():
    """The campaign's own functions (roots.stamp on --known, search.known_finding on a failing verdict) on
    every variant's recorded verdict: each is counted under its own root."""
    known = load_known(["tests/regressions"])
    tracked = [stamp(f.model_copy(update={"count": 0, "variants": {}}, deep=True)) for f in known]
    keys: dict[str, set[str]] = defaultdict(set)
    misrooted = []
    for f in known:
        v = with_causes(f.model_copy(deep=True))
        keys[root_key(v)].add(f.tracked)
        failing = {v.key()} | {tuple(k) for k in v.reproduces}
        g = known_finding(tracked, v.key(), set(v.features), failing,
                          evidence_root(v.check, v.pipeline, v.reference, v.detail))
        if g is None or g.tracked != f.tracked:
            misrooted.append((f.tracked, v.key(), g.tracked if g else None))
    assert len(known) > 100 and not misrooted
    assert {k: r for k, r in keys.items() if len(r) > 1} == {}
    # the residual roots are keyed on causes, not on a direction two roots shared
    residual = {k for k in keys if k.startswith("residuals|jax:remat3|jax:remat2|")}
    assert residual and not {k for k in residual if k.endswith(("saves less", "saves more"))}


def _corpus_keys(name: str) -> dict[str, set[str]]:
    """Each recorded verdict of a corpus root's variants, by the root key a campaign gives it now: check -> keys."""
    out: dict[str, set[str]] = defaultdict(set)
    for f in load_known([f"tests/regressions/{name}.json"]):
        v = with_causes(f.model_copy(deep=True))
        out[v.check].add(root_key(v))
    return out


def test_an_effect_count_roots_on_where_the_effect_is_and_its_policys_decision_not_on_leftover_constructs():
    """remat3-reruns-callback-under-custom-saving-policy showed as three findings of one 30-minute campaign, each
    shrunk program keeping another construct (a name, a data-dependent op, a scan's slices): one cause, a callback
    a saving policy keeps in a region that remat3 runs again. Keyed on where the effect is and what decided on it,
    its variants are two roots, one per effect kind: nested regions that each save (each region rematerialised runs
    the callback once more, by the same decision) are the innermost region's cause."""
    keys = _corpus_keys("remat3-reruns-callback-under-custom-saving-policy")["effect_count"]
    assert keys == {"effect_count|jax:remat3|jax:remat2|callback runs more in a region [save]",
                    "effect_count|jax:remat3|jax:remat2|ordered runs more in a region [save]"}
    # regions deciding otherwise on the value are a cause of their own (remat2 saves what the outer policy keeps)
    nested = _corpus_keys("remat3-nested-recompute-region-callback-count-differs")["effect_count"]
    assert nested == {"effect_count|jax:remat3|jax:remat2|callback runs more in a region in a region [save]"}
    # the loop around a callback, a region around its custom rule, and a value no cotangent reaches are causes
    loop = _corpus_keys("remat3-runs-loop-invariant-scan-callback-per-iteration")["effect_count"]
    assert loop == {"effect_count|jax:remat3|jax:remat2|callback runs more in a loop in a region [recompute]"}
    dry = _corpus_keys("remat2-reruns-callbacks-of-region-without-cotangent")["effect_count"]
    # callback, ordered (one in a custom_jvp whose result only an unread custom_jvp output reads among the callbacks:
    # differentiated, JAX runs the jvp rule's copy of the effect, not the function around it)
    assert all(k.endswith("on a value no cotangent reaches") for k in dry) and len(dry) == 2


def test_an_effect_is_described_by_the_member_of_its_value_a_policy_keeps_and_a_view_is_a_kind_under_torch_only():
    x = [{"id": "x", "shape": [3], "dtype": "float32", "diff": True}]
    # a names policy keeps the named value the callback reads (not the callback's output): the value is kept
    named = prog([region(["x"], [op("sin", ["x"], "s"), op("name", ["s"], "n", name="b"),
                                 op("effect", ["n"], "e", kind="callback")], ["e"],
                        {"kind": "save_only_names", "names": ["b"]})], inputs=x)
    more = {"effects": {"callback": {"got": 2, "reference": 1}}}
    assert effect_causes(named, more) == ["callback runs more in a region [names:save]"]
    nothing = prog([region(["x"], [op("sin", ["x"], "s"), op("effect", ["s"], "e", kind="callback")], ["e"],
                           {"kind": "nothing"})], inputs=x)
    assert effect_causes(nothing, more) == ["callback runs more in a region [nothing:recompute]"]
    # where the pipelines count per statement (JAX's), only the statement whose count differs is a cause: a second
    # callback in a loop beside it is not
    two = prog([region(["x"], [op("sin", ["x"], "s"), op("effect", ["s"], "e", kind="callback")], ["e"],
                       {"kind": "nothing"}),
                op("effect", ["e"], "f", kind="callback")], inputs=x)
    assert effect_causes(two, more) == ["callback runs more in a region [nothing:recompute]"]   # (enclosed only)
    assert effect_causes(two, {**more, "sites": {"f": {"got": 2, "reference": 1}}}) == \
        ["callback runs more outside every region"]
    # remat3 recomputing a transpose a policy saves: an op's output under JAX, a view's under PyTorch
    t = prog([region(["x"], [op("sin", ["x"], "s"), op("transpose", ["s"], "t", perm=[0]), op("sin", ["t"], "y")],
                     ["y"], {"kind": "everything"})], inputs=x)
    recomputed = {"missing_other": ["float32[3]"], "saved": ["x:float32[3]"],
                  "reference_saved": ["t:float32[3]", "x:float32[3]"]}
    assert causes(t, recomputed, "jax:remat3") == ["recomputes an op's output [everything:save]"]
    assert causes(t, recomputed, "torch:compile-aot_eager") == ["recomputes a view's output [everything:save]"]


def test_eager_sac_tells_no_kind_of_op_output_apart():
    """Eager SAC caches an op's outputs per op call on its policy's decision alone (torch.utils.checkpoint's
    _CachingTorchDispatchMode caches MUST_SAVE and PREFER_SAVE, whatever the op): a view, a dot, a name tag it
    recomputes against an offloading policy are one cause (r32 filed the offload root three times, by value kind).
    torch.compile may treat a view apart; PyTorch has one kind of name (checkpoint_name_fwd is JAX's)."""
    x = [{"id": "x", "shape": [3], "dtype": "float32", "diff": True}]
    offload = {"kind": "offload_ops", "ops": ["transpose", "sin", "name_fwd"]}
    against = {"recomputed_against_policy": ["t:float32[3]"], "saved": ["x:float32[3]"]}
    seen = {}
    for what, body in (("view", [op("transpose", ["x"], "t", perm=[0])]),
                       ("op", [op("sin", ["x"], "t")]),
                       ("name", [op("sin", ["x"], "s"), op("name_fwd", ["s"], "t", name="a")])):
        p = prog([region(["x"], body + [op("cos", ["t"], "y")], ["y"], offload)], inputs=x)
        seen[what] = {pipe: causes(p, against, pipe) for pipe in ("torch:eager-sac", "torch:eager-sac:user-hooks",
                                                                   "torch:compile-aot_eager")}
    assert {c for d in seen.values() for c in (d["torch:eager-sac"][0], d["torch:eager-sac:user-hooks"][0])} == \
        {"recomputes against its policy an op's output [custom:offload]"}
    assert seen["view"]["torch:compile-aot_eager"] == ["recomputes against its policy a view's output [custom:offload]"]
    assert "checkpoint_name_fwd" not in seen["name"]["torch:compile-aot_eager"][0]


def test_an_unmatched_value_recomputed_reads_as_the_kept_op_whose_derivative_reads_it():
    """remat3 recomputing sin under a policy that saves it: remat2 keeps cos(x) (sin's derivative reads it), a value
    no program value equals. Read as the sin it belongs to, it is the tracked op-output cause, not one of its own."""
    x = [{"id": "x", "shape": [2, 2], "dtype": "float32", "diff": True}]
    p = prog([region(["x"], [op("sin", ["x"], "s")], ["s"], {"kind": "everything"})], inputs=x)
    detail = {"missing_other": ["float32[2, 2]"], "extra_other": ["float32[2, 2] (a program input)"],
              "reference_saved": ["?:float32[2, 2]"], "saved": ["x:float32[2, 2]"]}
    assert causes(p, detail) == ["recomputes an unmatched value shaped as an op's output [everything:save]"]
    assert core(causes(p, detail)[0]) == "recomputes an op's output [save]"
    # per example (vmapped over 3): remat2 keeps the whole batch's cos(x), the batch in front of sin's shape (r32
    # filed it apart, "recomputes an unmatched value, per example", as the shape alone was compared)
    batched = load_program({"schema_version": 1, "inputs": [{**x[0], "batched": True}], "outputs": ["s"],
                            "body": [region(["x"], [op("sin", ["x"], "s")], ["s"], {"kind": "everything"})],
                            "diff": {"order": 1, "mode": "reverse", "batch": 3}})
    per_example = {"missing_other": ["float32[3, 2, 2]"], "reference_saved": ["?:float32[3, 2, 2]"],
                   "extra_other": ["float32[2, 2]"] * 3, "saved": [f"x@{k}:float32[2, 2]" for k in range(3)]}
    assert core(causes(batched, per_example)[0]) == "recomputes an op's output [save]"
    # a dot of that shape beside it (a conv1d before the inner grad of sin of a 30-minute campaign): a dot's
    # derivative reads its operands, program values, so the unmatched value is the other op's
    xs = [{"id": "x", "shape": [2, 2, 2], "dtype": "float32", "diff": True},
          {"id": "w", "shape": [2, 2, 1], "dtype": "float32", "diff": True}]
    conv = prog([region(["x", "w"], [op("conv1d", ["x", "w"], "c"), op("grad_of_sin", ["c"], "g")], ["g"],
                        {"kind": "save_anything_except_names", "names": ["a"]})], inputs=xs)
    unmatched = {"missing_other": ["float32[2, 2, 2]"], "reference_saved": ["?:float32[2, 2, 2]", "c:float32[2, 2, 2]"],
                 "saved": ["c:float32[2, 2, 2]"]}
    assert causes(conv, unmatched) == ["recomputes an unmatched value shaped as an op's output "
                                       "[everything_but_names:save]"]
    # no op a policy keeps has its shape: an unmatched value, as before
    assert causes(p, {**detail, "missing_other": ["float32[3]"], "reference_saved": ["?:float32[3]"]}) == \
        ["recomputes an unmatched value"]


def test_a_custom_rule_whose_results_no_cotangent_reaches_is_one_cause_wherever_it_is():
    """remat3-no-zero-propagation's symbolic-zero cotangents showed as two findings (a custom_vjp in a region,
    one before it): remat2 never calls a bwd whose results get no cotangent, whatever encloses it."""
    keys = _corpus_keys("remat3-no-zero-propagation")
    assert keys["custom_rule"] == {"custom_rule|jax:remat3|jax:remat2|symbolic_zero_cts differs for a custom_vjp "
                                   "(symbolic_zeros) whose results no cotangent reaches"}
    # and each residual it saves for code no cotangent reaches is one cause, whatever the value
    assert "residuals|jax:remat3|jax:remat2|saves a value the loss does not read" in keys["residuals"]
    # a rule whose results the loss reads keeps where it is: a region around it is a cause
    fwd_ran = _corpus_keys("remat3-cvjp3-fwd-runs-for-unperturbed-args")["custom_rule"]
    assert "custom_rule|jax:remat3|jax:remat2|fwd_ran differs for a custom_vjp in a region" in fwd_ran


def test_a_known_comparison_root_covers_the_policy_check_of_the_program_it_also_fails():
    # the corpus's budget-0 root: compiled at activation_memory_budget=0, the named value a save_only_names policy
    # keeps is recomputed (against eager SAC, which saves it); its program also fails the policy check (what the
    # partitioner's backward graph recomputes of a MUST_SAVE node): one decision, one root
    known = [with_causes(f) for f in load_known(["tests/regressions/torch-compile-budget0-drops-must-save.json"])]
    (f,) = known
    key = ("residuals", f.pipeline, "policy", "recomputed_against_policy")
    assert list(key) in f.reproduces
    prog_ = Program.model_validate(f.program)
    detail = {"recomputed_against_policy": ["h/s['h']:float32[4]"], "aten_ops": ["rc.tag"], "saved": ["x:float32[4]"]}
    detail["causes"] = causes(prog_, detail)
    assert detail["causes"] == ["recomputes against its policy a value named in plain code [names:save]"]
    root = evidence_root("residuals", f.pipeline, "policy", detail)
    assert known_finding(known, key, set(f.features), {key, f.key()}, root) is f
    # another value recomputed against the policy is a cause that root does not hold: new
    other = {**detail, "causes": ["recomputes against its policy an op's output [names:save]"]}
    assert known_finding(known, key, set(f.features), {key, f.key()},
                         evidence_root("residuals", f.pipeline, "policy", other)) is None


def test_two_raises_of_one_error_type_on_one_construct_are_two_findings():
    """jax 0.11.2 raised ValueError 'Accumulator aval mismatch' under remat3 for a region writing a jax.new_ref; the
    corpus tracks another ValueError of that construct ('Cannot lower jaxpr with effects', still raised by 0.12).
    Neither the campaign's --known matching nor the report's merge may fold one into the other."""
    prog = {"schema_version": 1, "inputs": [{"id": "x", "shape": [2], "dtype": "float32", "diff": True}],
            "body": [{"kind": "checkpoint", "args": ["x"], "policy": {"kind": "nothing"}, "results": ["y"],
                      "body": [{"kind": "op", "op": "sin", "args": ["x"], "out": "y", "params": {}}]}],
            "outputs": ["y"], "diff": {"order": 1, "mode": "reverse"}}
    feats = sorted(Program.model_validate(prog).features())

    def err(message, extra=()):
        f = sorted({*feats, *extra})
        return Finding(signature=signature("error", "jax:remat3", "expectations", "ValueError", f), check="error",
                       pipeline="jax:remat3", reference="expectations", error_type="ValueError", features=f,
                       program=prog, program_hash="0" * 16,
                       detail={"got": {"type": "ValueError", "message": message, "stage": "backward"}})
    tracked = err("Cannot lower jaxpr with effects: {WriteEffect(Var(id=1)), ReadEffect(Var(id=1))}")
    other = err("Accumulator aval mismatch: expected Ref{float32[]}, got float32[].", extra=("layout",))
    same = err("Cannot lower jaxpr with effects: {ReadEffect(Var(id=7)), WriteEffect(Var(id=7))}", extra=("layout",))
    assert not same_behaviour(tracked, other) and not same_behaviour(other, tracked)
    assert same_behaviour(tracked, same)
    key = other.key()
    assert known_finding([tracked], key, set(other.features), {key}, error_root(other.detail)) is None
    assert known_finding([tracked], key, set(same.features), {key}, error_root(same.detail)) is tracked


def test_an_effect_in_an_optimize_remat_fwd_is_named_by_that_option_whatever_the_policy_or_the_cotangent():
    """optimize-remat-fwd-callback-not-rerun-under-remat2 showed as three findings of one 30-minute campaign (a live
    value under save-nothing, an offloading dots policy, a value no cotangent reaches): remat2 does not run an
    optimize_remat fwd's callback again in a region's recompute, whatever the region's policy says of its value."""
    x = [{"id": "x", "shape": [3], "dtype": "float32", "diff": True}]
    more = {"effects": {"callback": {"got": 2, "reference": 1}}}

    def block(optimize_remat: bool, policy: dict, read: bool, kind: str = "callback"):
        rule = sin_cvjp(arg="x", optimize_remat=optimize_remat)
        rule["fwd"] = [op("sin", ["x"], "s0"), op("effect", ["s0"], "s", kind=kind)] + rule["fwd"][1:]
        body = [region(["x"], [rule], ["s"], policy)] + ([] if read else [op("cos", ["x"], "y")])
        return prog(body, inputs=x, outputs=["s" if read else "y"])
    seen = {tuple(effect_causes(block(True, pol, read), more)) for pol in ({"kind": "nothing"}, {"kind": "dots"})
            for read in (True, False)}
    assert seen == {("effect runs more in a custom_vjp (optimize_remat) fwd in a region",)}
    # nor the effect's kind (r32's two findings, a callback and an ordered one; plain JAX: remat2 1, remat3 2 for
    # both, eager and jit)
    ordered = {"effects": {"ordered": {"got": 2, "reference": 1}}}
    assert effect_causes(block(True, {"kind": "nothing"}, True, "ordered"), ordered) == list(seen.pop())
    # nor the regions around that region, which decide otherwise (a 30-minute campaign's save-nothing region in a
    # save_any_names_but_these one; plain JAX: remat2 1 run nested or not, remat3 2 in one region, 3 in two; without
    # the option 2 and 3 alike)
    inner = block(True, {"kind": "nothing"}, True)
    nested = prog([region(["x"], inner.model_dump(mode="json")["body"], ["s"],
                          {"kind": "save_any_names_but_these", "names": ["a", "b"]})], inputs=x, outputs=["s"])
    assert effect_causes(nested, {"effects": {"callback": {"got": 3, "reference": 1}}}) == \
        ["effect runs more in a custom_vjp (optimize_remat) fwd in a region"]
    # without the option the policy's decision and the cotangent stay causes
    assert effect_causes(block(False, {"kind": "nothing"}, True), more) == \
        ["callback runs more in a custom_vjp fwd in a region [nothing:recompute]"]
    assert effect_causes(block(False, {"kind": "nothing"}, False), more) == \
        ["callback runs more in a custom_vjp fwd in a region on a value no cotangent reaches"]


def test_a_cotangent_reaches_a_loops_values_output_by_output():
    """A region in a scan body whose stacked result is only an auxiliary output: no cotangent reaches its callback's
    value, though the scan's carry is the loss (remat2-reruns-callbacks-of-region-without-cotangent, shrunk by a
    30-minute campaign to a region in a loop and named as a recompute its policy asked for)."""
    from conformance.ir.nodes import live_values
    from conformance.ir.program import load_program
    scan = {"kind": "scan", "args": ["v", "xs"], "carry": ["c"], "xs": ["w"], "length": 2,
            "body": [region(["c"], [op("sum", ["c"], "t", axis=None), op("effect", ["t"], "e", kind="callback")],
                            ["e"], {"kind": "nothing"})],
            "carry_out": ["c"], "ys": ["e"], "results": ["fin", "stacked"]}
    p = load_program({"schema_version": 1, "body": [op("sin", ["x"], "v"), scan, op("sum", ["fin"], "loss", axis=None)],
                      "inputs": [{"id": "x", "shape": [2], "dtype": "float32", "diff": True},
                                 {"id": "xs", "shape": [2, 1], "dtype": "float32", "diff": True}],
                      "outputs": ["loss", "stacked"], "diff": {"order": 1, "mode": "reverse", "aux": 1}})
    live = live_values(p.model_copy(update={"outputs": ["loss"]}), cotangent=True)
    assert "e" not in live and {"fin", "c", "v", "x"} <= live and "xs" not in live
    assert effect_causes(p, {"effects": {"callback": {"got": 2, "reference": 4}}}, "jax:remat3") == \
        ["callback runs fewer in a region on a value no cotangent reaches"]
    # the stacked result read by the loss: the region's value is live again
    both = live_values(p.model_copy(update={"outputs": ["loss", "stacked"]}), cotangent=True)
    assert {"e", "t"} <= both


def test_an_effect_count_is_known_only_when_each_of_its_causes_is():
    """--known matches an effect-count difference on its causes, as a residual one: a corpus finding of the same key
    whose program has the same constructs does not swallow a callback that runs more for another reason."""
    corpus = "tests/regressions/optimize-remat-fwd-callback-not-rerun-under-remat2.json"
    known = [stamp(f) for f in load_known([corpus])]
    key = ("effect_count", "jax:remat3+cvjp3:jit", "jax:remat2:jit", "ordered:more")
    held = "effect runs more in a custom_vjp (optimize_remat) fwd in a region"
    assert known_finding(known, key, set(), {key}, held) is known[0]
    other = "ordered runs more in a loop in a region [recompute]"
    own, feats = known[0].key(), set(known[0].features)   # (its own key, every construct of its program: still new)
    assert known_finding(known, own, feats, {own}, other) is None
    assert known_finding(known, own, feats, {own}, f"{held} + {other}") is None
    assert known_finding(known, own, feats, {own}, held) is known[0]


def test_a_shrink_may_drop_what_encloses_an_effect_inside_its_region_but_not_a_region_nor_the_decision():
    """A 30-minute campaign kept a loop and a cond branch around a named value's callback (remat3 2 runs, remat2 1):
    dropping either changed the cause's words, so the shrink refused it, and the finding stood apart from its root.
    Replayed by hand, the callback in the region alone differs the same way: the loop and the branch were context."""
    from types import SimpleNamespace

    from conformance.engine.search import Target
    from oracles.residual_causes import narrows
    original = "callback runs more in a loop in a cond branch in a region [names:save]"
    assert narrows("callback runs more in a region [names:save]", original)
    assert narrows("callback runs more in a cond branch in a region [names:save]", original)
    assert not narrows("callback runs more in a region [nothing:recompute]", original)   # another decision
    assert not narrows("ordered runs more in a region [names:save]", original)            # another effect
    assert not narrows("callback runs fewer in a region [names:save]", original)         # another direction
    assert not narrows("callback runs more in a region [save]", "callback runs more in a region in a region [save]")
    assert not narrows(original, original)

    def judged(cause):
        v = SimpleNamespace(check="effect_count", detail={"causes": [cause]},
                            key=lambda: ("effect_count", "jax:remat3", "jax:remat2", "callback:more"))
        return SimpleNamespace(failures=lambda: [v])
    t = Target(key=("effect_count", "jax:remat3", "jax:remat2", "callback:more"), program=None, seed=0, verdict=None,
               observations={}, original_size=6, origin=("h", 0), started=0.0, cause=original)
    assert t.failure(judged("callback runs more in a region [nothing:recompute]")) is None
    assert t.failure(judged("callback runs more in a cond branch in a region [names:save]")) is not None
    assert t.cause == "callback runs more in a cond branch in a region [names:save]"   # kept from then on
    assert t.failure(judged(original)) is None   # the loop back: not the cause the shrink now keeps


def test_a_residual_report_that_raised_roots_on_its_raise_wherever_the_checkout_is():
    """JAX's residual report raising 'mutable array references cannot be returned' for a stateful region, in a
    program without the dropout the corpus's variant kept, was filed as new: keyed on its constructs, not its raise.
    Keyed on the raise, with the directories of the files a message names dropped (the harness's checkout, the
    release's site-packages), it is the tracked root."""
    msg = ("ValueError: function <lambda> at {site}/jax/_src/ad_checkpoint.py:469 traced for jit returned a mutable "
           "array reference of type Ref{{float32[]}} at output tree path result[1][1][0], but mutable array "
           "references cannot be returned.\n\nThe returned mutable array was created on line "
           "{repo}/conformance/pipelines/jax/pipelines.py:251:18 (Lowering.stateful_region.<locals>.run).")
    here = {"got": {"type": "ValueError", "message": msg.format(site="/work/main/.venv/lib/python3.12/site-packages",
                                                                 repo="/tmp/dev-wt")}}
    there = {"got": {"type": "ValueError", "message": msg.format(site="/root/.cache/envs/jax-0.11/site-packages",
                                                                  repo="/home/ci/remat-conformance")}}
    root = evidence_root("residual_report", "jax:remat3+cvjp3:jit", "vjp", here)
    assert root == evidence_root("residual_report", "jax:remat2:jit", "vjp", there) == error_root(there)
    assert "ad_checkpoint.py" in root and "/tmp/" not in root and "site-packages" not in root
    corpus = "tests/regressions/jax-saved-residuals-of-checkpoint-closing-over-ref-valueerror.json"
    known = [stamp(f) for f in load_known([corpus])]
    key = ("residual_report", "jax:remat3+cvjp3:jit", "vjp", "ValueError")
    assert known_finding(known, key, {"checkpoint", "region_state", "state_accumulate"}, {key}, root) is not None
    # a residual report that did not raise (a saved set told apart) has no raise to key on
    assert evidence_root("residual_report", "jax:remat3:jit", "vjp", {"missing": ["x:float32[3]"]}) is None


def test_a_value_only_a_dead_dot_needs_beside_a_dropout_is_one_the_loss_does_not_read():
    """r32's F39 (NEW, two causes): remat3 saves a dead matmul's operands, one of them also dropped out into the
    loss. Dropout's derivative is its mask times the cotangent: no value of its argument is read, so only the dead
    dot needs it, one cause with the other operand (remat3-no-zero-propagation's)."""
    xs = [{"id": "x", "shape": [2, 2], "dtype": "float32", "diff": True},
          {"id": "w", "shape": [2, 2], "dtype": "float32", "diff": True}]
    p = load_program({"schema_version": 1, "inputs": xs, "outputs": ["d", "m"],
                      "body": [op("cos", ["x"], "c"),
                               region(["c", "w"], [op("dropout", ["c"], "d", p=0.5, seed=1),
                                                   op("matmul", ["c", "w"], "m")], ["d", "m"], {"kind": "everything"})],
                      "diff": {"order": 1, "mode": "reverse", "aux": 1}})
    detail = {"saved": ["?:float32[2, 2]", "c:float32[2, 2]", "w:float32[2, 2]"],
              "reference_saved": ["?:float32[2, 2]"], "missing_other": [],
              "extra_other": ["float32[2, 2]", "float32[2, 2] (a program input)"]}
    assert causes(p, detail, "jax:remat3") == ["saves a value outside every region the loss does not read"]
    # read by the loss through a sin instead (its derivative reads its argument): a live value, a cause of its own
    live = load_program({**p.model_dump(mode="json"), "body": [
        op("cos", ["x"], "c"), region(["c", "w"], [op("sin", ["c"], "d"), op("matmul", ["c", "w"], "m")], ["d", "m"],
                                      {"kind": "everything"})]})
    assert "saves a value outside every region" in causes(live, detail, "jax:remat3")


def test_a_loop_needs_what_its_body_needs_and_an_inplace_op_derives_as_its_twin():
    """r32's F50, filed under a callback's root: remat3 saves a value an empty loop passes on that only a dead sin
    reads (remat2 saves nothing; the loss is linear: a neg and an in-place add). A loop needs what its body needs, not
    every value it reads, and add_ derives as add: the value is one the loss does not read (no zero propagated)."""
    xs = [{"id": "x", "shape": [2, 3], "dtype": "float32", "diff": True}]
    loop = {"kind": "scan", "args": ["x"], "carry": ["c"], "body": [], "carry_out": ["c"], "results": ["s"],
            "length": 1}

    def program(dead: bool):
        body = [op("neg", ["x"], "n"), op("add_", ["n", "s"], "a"), op("sin", ["s"], "y")]
        return load_program({"schema_version": 1, "inputs": xs, "outputs": ["a", "y"],
                             "body": [loop, region(["x", "s"], body, ["a", "y"], {"kind": "everything"})],
                             "diff": {"order": 1, "mode": "reverse", "aux": 1 if dead else 0}})
    detail = {"saved": ["c@0/s/x:float32[2, 3]"], "reference_saved": [], "missing_other": [],
              "extra_other": ["float32[2, 3] (a program input)"]}
    assert causes(program(True), detail, "jax:remat3") == ["saves a loop carry the loss does not read [boundary]"]
    assert causes(program(False), detail, "jax:remat3") == ["saves a loop carry [boundary]"]   # (sin's read)


def test_in_a_loop_in_a_region_an_effect_run_more_is_the_policys_decision_read_or_not():
    """r32's F51 (NEW): remat3 ran a fori_loop's callback on a loop-invariant value no cotangent reaches once more
    than remat2, in a save-nothing region: filed apart from remat3-runs-loop-invariant-scan-callback-per-iteration
    (the same, on a value the loss reads) as the cotangent was a cause. Plain JAX: in a nothing_saveable region's
    fori_loop, a callback on a loop-invariant value, read or not, or on an unread per-iteration one, runs 2 times
    under remat2 and 3 under remat3; under a custom policy saving everything 1 and 3, read or not."""
    x = [{"id": "x", "shape": [2, 2], "dtype": "float32", "diff": True}]

    def program(read: bool):
        loop = {"kind": "scan", "args": ["x", "x"], "carry": ["c"], "length": 2,
                "body": [op("sin", ["x"], "v"), op("effect", ["v"], "e", kind="callback")],
                "carry_out": ["c"], "ys": ["e"], "results": ["s", "st"]}
        out = "st" if read else "s"
        return load_program({"schema_version": 1, "inputs": x, "outputs": ["t", out],
                             "body": [region(["x"], [op("tanh", ["x"], "t"), loop], ["t", out], {"kind": "nothing"})],
                             "diff": {"order": 1, "mode": "reverse"}})
    more = {"effects": {"callback": {"got": 3, "reference": 2}}, "sites": {"e": {"got": 3, "reference": 2}}}
    assert effect_causes(program(False), more) == effect_causes(program(True), more) == \
        ["callback runs more in a loop in a region [nothing:recompute]"]
    # outside a loop, a value no cotangent reaches stays a cause (remat2-reruns-callbacks-of-region-without-cotangent)
    plain = load_program({"schema_version": 1, "inputs": x, "outputs": ["t"],
                          "body": [region(["x"], [op("tanh", ["x"], "t"), op("sin", ["x"], "v"),
                                                  op("effect", ["v"], "e", kind="callback")], ["t"],
                                          {"kind": "nothing"})], "diff": {"order": 1, "mode": "reverse"}})
    assert effect_causes(plain, more) == ["callback runs more in a region on a value no cotangent reaches"]


def test_a_saved_member_of_a_class_is_the_one_of_its_dtype_and_shape():
    """r33's F40 (NEW, two causes): remat3 saved a transposed float64 copy of a float16 input that only a dead matmul
    reads; the class of equal values held the input too, which a live matmul reads, so the one value showed as a live
    and a dead save. The member of the saved dtype and shape is the value saved."""
    xs = [{"id": "x", "shape": [4, 3], "dtype": "float16", "diff": True},
          {"id": "w", "shape": [3, 3], "dtype": "float16", "diff": True},
          {"id": "k", "shape": [4, 3], "dtype": "bfloat16", "diff": True}]
    p = load_program({"schema_version": 1, "inputs": xs, "outputs": ["l", "d"],
                      "body": [op("cast", ["x"], "c", dtype="float64"), op("matrix_t", ["c"], "t"),
                               op("matmul", ["x", "w"], "l"),
                               region(["t", "k"], [op("cast", ["t"], "b", dtype="bfloat16"),
                                                   op("matmul", ["b", "k"], "d")],
                                      ["d"], {"kind": "everything"})],
                      "diff": {"order": 1, "mode": "reverse", "aux": 1}})
    detail = {"saved": ["b/c/t/x:float64[3, 4]"], "reference_saved": [], "missing_other": [],
              "extra_other": ["float64[3, 4] (a program input)"]}
    assert causes(p, detail, "jax:remat3") == ["saves a value outside every region the loss does not read"]


def test_pytorch_has_no_optimize_remat_and_eager_sac_no_custom_rule_residual_apart():
    """r33's F47 (NEW): eager SAC recomputing against its offloading policy a name tag that an optimize_remat
    custom_vjp keeps as a residual, filed apart from torch-eager-sac-recomputes-cpu-offload-policy by the residual's
    kind. optimize_remat is JAX's; eager SAC caches the tag op's output as any op's."""
    x = [{"id": "x", "shape": [3], "dtype": "float32", "diff": True}]
    rule = sin_cvjp(arg="x", optimize_remat=True)
    rule.update(fwd=rule["fwd"][:2], residuals=["c0"], bwd=[op("mul", ["g", "c0"], "dt")])
    p = prog([region(["x"], [rule], rule["results"], {"kind": "offload_ops", "ops": ["cos"]})], inputs=x,
             outputs=rule["results"])
    against = {"recomputed_against_policy": ["c0:float32[3]"], "saved": ["x:float32[3]"]}
    assert causes(p, against, "torch:eager-sac") == ["recomputes against its policy an op's output [custom:offload]"]
    assert causes(p, against, "torch:compile-aot_eager") == \
        ["recomputes against its policy a custom_vjp residual [custom:offload]"]
    assert causes(p, against, "jax:remat3") == \
        ["recomputes against its policy an optimize_remat custom_vjp residual [custom:offload]"]


def test_a_conds_branch_index_is_named_and_what_recomputing_it_needs_is_its_consequence():
    """r32's F23 and r33's F25 (two causes each): remat2 saves the integer branch index of a cond in a region, remat3
    recomputes it from the predicate and saves the predicate and the thresholds its sum is compared with (the lowering's
    values, not the program's: conformance.ir.nodes.branch_thresholds). One cause, the index recomputed."""
    xs = [{"id": "x", "shape": [2], "dtype": "float32", "diff": True},
          {"id": "p", "shape": [2, 2], "dtype": "float32", "diff": False}]
    cond = {"kind": "cond", "args": ["p", "x"], "branches": [[], [op("neg", ["x"], "n")]],
            "branch_results": [["x"], ["n"]], "results": ["r"]}
    p = prog([region(["x", "p"], [cond], ["r"], {"kind": "ops", "ops": ["mean", "sin"]})], inputs=xs, outputs=["r"])
    detail = {"saved": ["?:float32[1]", "p:float32[2, 2]"], "reference_saved": ["?:int64[]"],
              "missing_other": ["int64[]"], "extra_other": ["float32[1]", "float32[2, 2] (a program input)"]}
    assert causes(p, detail, "jax:remat3") == ["recomputes a cond's branch index"]
    # a max over a vector beside it: its index is an integer scalar the program makes, not named as the branch's
    with_max = prog([op("max_dim", ["x"], "m", axis=0),
                     region(["x", "p"], [cond], ["r"], {"kind": "ops", "ops": ["mean", "sin"]})],
                    inputs=xs, outputs=["r"])
    assert "recomputes a cond's branch index" not in causes(with_max, detail, "jax:remat3")
    # a max over a matrix's rows (r35's F42): its indices are a vector, the scalar is the branch's
    over_rows = prog([op("max_dim", ["p"], "m", axis=0),
                      region(["x", "p"], [cond], ["r"], {"kind": "ops", "ops": ["mean", "sin"]})],
                     inputs=xs, outputs=["r"])
    assert causes(over_rows, detail, "jax:remat3") == ["recomputes a cond's branch index"]


def test_a_cond_needs_its_predicate_and_what_its_branches_need():
    """r34's F46 (NEW): remat3 saves x for a dead x * x whose product only reaches a region argument a branch passes
    and the region never reads; remat2 saves only the branch index (plain JAX: saved_residuals, remat2 [int32[]],
    remat3 [float32[2,3,4] x, int32[]]). A cond's operands are re-bound in its branches: what the branches read says
    what a cotangent reaches and what the backward needs, so x is a value the loss does not read."""
    xs = [{"id": "x", "shape": [2, 3], "dtype": "float32", "diff": True},
          {"id": "p", "shape": [2], "dtype": "float32", "diff": False}]
    cond = {"kind": "cond", "args": ["p", "m", "x"],
            "branches": [[op("sum", ["x"], "a", axis=1)],
                         [op("select", ["m"], "u", axis=0, index=1),
                          region(["u", "x"], [op("sum", ["x"], "b", axis=1)], ["b"], {"kind": "nothing"})]],
            "branch_results": [["a"], ["b"]], "results": ["r"]}
    from conformance.ir.nodes import live_values
    p = prog([op("mul", ["x", "x"], "m"), cond], inputs=xs, outputs=["r"])
    live = live_values(p, cotangent=True)
    assert "x" in live and "m" not in live and "u" not in live
    detail = {"saved": ["?:int32[]", "x:float32[2, 3]"], "reference_saved": ["?:int32[]"], "missing_other": [],
              "extra_other": ["float32[2, 3] (a program input)"]}
    assert causes(p, detail, "jax:remat3") == ["saves a value outside every region the loss does not read"]
    # a branch reading the product: live, and what the backward of mul needs
    read = prog([op("mul", ["x", "x"], "m"), {**cond, "branches": [[op("sum", ["m"], "a", axis=1)],
                                                                   cond["branches"][1]]}], inputs=xs, outputs=["r"])
    assert causes(read, detail, "jax:remat3") == ["saves a value outside every region"]


def test_a_difference_that_shows_a_pipelines_departure_from_its_policy_is_that_departure():
    """compile saves a tanh output its offload policy offloads where eager SAC recomputes it, and eager SAC
    recomputes it against that policy (r35: F46 beside F47, two findings of the corpus root
    torch-eager-sac-recomputes-cpu-offload-policy): the difference shows eager SAC's departure, one cause.
    Either one found first holds the other, and `--known` counts the other's later programs under it."""
    from conformance.engine.roots import covering_finding, departure_keys
    from conformance.ir.verdict import Verdict
    with open("tests/regressions/torch-eager-sac-recomputes-cpu-offload-policy.json") as fh:
        entry = [v["finding"] for v in json.load(fh)["variants"]]
    policy = Finding.model_validate(next(f for f in entry if f["reference"] == "policy"
                                         and "op's output" in f["detail"]["causes"][0]))
    pair = Finding.model_validate(next(f for f in entry if f["reference"] == "torch:eager-sac"))
    assert policy.detail["causes"] == ["recomputes against its policy an op's output [custom:offload]"]
    assert pair.detail["causes"] == ["saves an op's output [custom:offload]"]

    def verdict(f):
        return Verdict(check=f.check, pipeline=f.pipeline, reference=f.reference, status="fail",
                       error_type=f.error_type, detail=f.detail)
    # the pair's program fails eager SAC's policy check on its value: that key is among what it reproduces
    keys = departure_keys("residuals", pair.key(), pair.detail["causes"], [verdict(pair), verdict(policy)])
    assert keys == [list(policy.key())]
    unrelated = policy.model_copy(update={"detail": {**policy.detail, "causes": [
        "recomputes against its policy a dot's output [dots:save]"]}})
    assert departure_keys("residuals", pair.key(), pair.detail["causes"], [verdict(unrelated)]) == []
    assert not same_behaviour(policy, pair)   # (without that evidence, two families are two findings)
    pair.reproduces = keys
    assert same_behaviour(policy, pair) and same_behaviour(pair, policy)
    assert not same_behaviour(unrelated, pair)
    for first, later in ((policy, pair), (pair, policy)):
        held = [first.model_copy(deep=True)]
        kept, _ = merge_finding(held, later.model_copy(deep=True))
        assert len(held) == 1 and kept is held[0]
        # a later program showing either one is counted under the finding held, not shrunk as new
        assert covering_finding(held, pair.key(), pair.detail["causes"]) is held[0]
        assert covering_finding(held, policy.key(), policy.detail["causes"]) is held[0]
    # r37: the policy finding filed was eager SAC's with user hooks, whose program fails eager SAC's policy check
    # too (its reproduces), the key the difference departs to: one cause still, held either way
    twin = policy.model_copy(update={"pipeline": "torch:eager-sac:user-hooks", "reproduces": [list(policy.key())]})
    assert same_behaviour(pair, twin) and same_behaviour(twin, pair)
    for first, later in ((pair, twin), (twin, pair)):
        held = [first.model_copy(deep=True)]
        merge_finding(held, later.model_copy(deep=True))
        assert len(held) == 1 and covering_finding(held, twin.key(), twin.detail["causes"]) is held[0]
        assert covering_finding(held, pair.key(), pair.detail["causes"]) is held[0]
