"""The program IR: validation, exact JSON round-trip, stable hashes, features."""
import json

import pytest
from hypothesis import given

from conformance.ir.features import FEATURE_DOC
from conformance.ir.nodes import Limits, ProgramError
from conformance.ir.program import Program, load_program
from generators.programs import cases
from tests.corpus_files import variant_path
from tests.programs import named_chain, op, prog, region, seed_program


@given(cases())
def test_generated_programs_round_trip_exactly(case):
    p, _ = case
    text = p.to_json()
    q = load_program(json.loads(text))
    assert q.to_json() == text
    assert q.content_hash() == p.content_hash()
    assert q == p


@given(cases())
def test_features_come_from_the_documented_vocabulary(case):
    p, _ = case
    from conformance.ir.features import known_features
    documented = known_features()
    assert {k for k in FEATURE_DOC if "<" not in k} <= documented
    for f in p.features():
        assert f in documented, f


def test_hash_is_stable_and_content_sensitive():
    a, b = seed_program(), seed_program()
    assert a.content_hash() == b.content_hash()
    assert len(a.content_hash()) == 16
    assert seed_program("float64").content_hash() != a.content_hash()


def test_seed_program_features():
    f = seed_program().features()
    assert {"checkpoint", "custom_vjp", "custom_vjp_in_checkpoint", "symbolic_zeros", "names_in_fwd",
            "sz_fwd_remat", "policy:save_only_names", "float32"} <= f
    assert "nested_checkpoint" not in f


@pytest.mark.parametrize("mutate, field, reason", [
    (lambda o: o["body"][0].update(op="frobnicate"), "body[0].op", "unknown op"),
    (lambda o: o["body"][0].update(args=["nope"]), "body[0].args[0]", "not defined"),
    (lambda o: o["inputs"][0].update(dtype="int32"), "inputs[0].dtype", "float32"),
    (lambda o: o["inputs"][0].update(shape=[10000]), "inputs[0].shape", "exceeds the limit"),
    (lambda o: o.update(outputs=["ghost"]), "outputs[0]", "not defined"),
    (lambda o: o["body"][0].update(out="x"), "body[0].out", "defined twice"),
    (lambda o: o.update(schema_version=7), "schema_version", "unsupported"),
    (lambda o: o["body"][0]["params"].update(c=1), "body[0].params", "unexpected params"),
])
def test_bad_programs_are_rejected_naming_the_field(mutate, field, reason):
    obj = prog([op("sin", ["x"], "y")]).to_json_obj()
    mutate(obj)
    with pytest.raises(ProgramError) as e:
        load_program(obj)
    assert e.value.field == field
    assert reason in e.value.reason


def test_bad_policy_name_is_rejected():
    obj = named_chain().to_json_obj()
    obj["body"][0]["policy"] = {"kind": "save_everything_please"}
    with pytest.raises(ProgramError) as e:
        load_program(obj)
    assert e.value.field == "body[0].policy"
    assert "save_everything_please" in e.value.reason


def test_region_scoping_is_enforced():
    # a region body may read only its args
    with pytest.raises(ProgramError, match="not defined"):
        prog([op("sin", ["x"], "a"),
              region(["a"], [op("mul", ["a", "x"], "b")], ["b"], {"kind": "nothing"})])


def test_limits_are_configurable():
    deep = op("sin", ["x"], "y0")
    body = [deep]
    inner = [op("cos", ["x"], "z")]
    for d in range(4):
        inner = [region(["x"], inner, ["z"], {"kind": "nothing"})]
    body = inner
    p = prog(body, outputs=["z"])
    assert p.size() == 5
    with pytest.raises(ProgramError, match="nesting depth"):
        load_program(p.to_json_obj(), Limits(max_depth=2))
    with pytest.raises(ProgramError, match="limit 2"):
        load_program(p.to_json_obj(), Limits(max_statements=2))


def test_program_json_schema_exports():
    schema = Program.model_json_schema()
    assert "inputs" in schema["properties"] and "body" in schema["properties"]


def test_later_custom_vjp_fields_at_their_defaults_keep_old_hashes():
    # spelling, residual_tree and perturbed_branch were added after programs were stored: at their
    # defaults they are left out of the JSON, so a stored program hashes as it did
    import json
    entry = json.loads(variant_path("b324b466757472b7.json").read_text())
    p = load_program(entry["program"])
    assert p.content_hash() == entry["finding"]["program_hash"] == "b324b466757472b7"
    assert "spelling" not in p.to_json() and "residual_tree" not in p.to_json()
    obj = p.to_json_obj()
    blk = obj["body"][1]["body"][0]
    blk["spelling"], blk["residual_tree"] = "defremat", "dict"
    blk["symbolic_zeros"] = False
    q = load_program(obj)
    assert '"spelling":"defremat"' in q.to_json() and '"residual_tree":"dict"' in q.to_json()
    assert q.content_hash() != p.content_hash() and load_program(q.to_json_obj()) == q


def test_a_custom_jvp_nests_only_in_a_custom_vjp_fwd_rule():
    cjvp = {"kind": "custom_jvp", "args": ["x"], "body": [op("sin", ["x"], "s")], "results": ["s"],
            "tangents": ["t"], "jvp": [op("cos", ["x"], "c"), op("mul", ["t", "c"], "ts")], "jvp_results": ["ts"]}

    def block(fwd, bwd, residuals):
        return {"kind": "custom_vjp", "args": ["x"], "fwd": fwd, "results": ["s"], "residuals": residuals,
                "cts": ["g"], "bwd": bwd, "bwd_results": ["d"]}
    in_fwd = prog([block([cjvp], [op("cos", ["x"], "c2"), op("mul", ["g", "c2"], "d")], ["x"])], outputs=["s"])
    assert "custom_jvp_in_fwd" in in_fwd.features() and "custom_jvp_in_checkpoint" not in in_fwd.features()
    in_bwd = {
        **in_fwd.to_json_obj(),
        "body": [
            block(
                [op("sin", ["x"], "s")],
                [
                    {
                        **cjvp,
                        "args": ["g"],
                        "body": [op("sin", ["g"], "d")],
                        "results": ["d"],
                        "jvp": [op("cos", ["g"], "c"), op("mul", ["t", "c"], "ts")],
                    }
                ],
                ["x"],
            )
        ],
    }
    with pytest.raises(ProgramError, match="nest only in a custom_vjp fwd") as e:
        load_program(in_bwd)
    assert e.value.field == "body[0].bwd[0]"
    in_jvp_body = {**in_fwd.to_json_obj(), "body": [{**cjvp, "body": [cjvp | {"tangents": ["t2"], "jvp": [
        op("cos", ["x"], "c3"), op("mul", ["t2", "c3"], "ts2")], "jvp_results": ["ts2"]}]}]}
    with pytest.raises(ProgramError, match="nest only in a custom_vjp fwd"):
        load_program(in_jvp_body)


def test_id_field_declarations_cover_every_statement_field():
    """ir.READ_ID_FIELDS / BOUND_ID_FIELDS / ID_LISTS_FIELDS / BODY_FIELDS, read by the reducer and
    the generator's branch renaming, name every field of every statement that holds ids or bodies."""
    from conformance.ir import nodes as ir
    declared = set(ir.READ_ID_FIELDS + ir.BOUND_ID_FIELDS)
    for model in (ir.Op, ir.Checkpoint, ir.CustomVJP, ir.CustomJVP, ir.Scan, ir.Jit, ir.Cond):
        for name, f in model.model_fields.items():
            ann = str(f.annotation)
            if ann in ("list[str]", "list[str | None]"):
                assert name in declared, (model.__name__, name)
            elif ann == "list[list[str]]":
                assert name in ir.ID_LISTS_FIELDS, (model.__name__, name)
            elif "Stmt" in ann or "Annotated" in ann and "list" in ann:
                assert name in ir.BODY_FIELDS or name == "branches", (model.__name__, name, ann)
    assert not declared & set(ir.ID_LISTS_FIELDS + ir.BODY_FIELDS)


def test_live_values_follow_reads_into_regions():
    """A value passed into a region that nothing inside reads is dead (the CI gate's torch campaign,
    seed 12: a dropout whose value only a region's args listed, dropped by torch.compile)."""
    from conformance.ir.nodes import live_values
    from tests.programs import op, prog, region
    p = prog([op("sin", ["x"], "a"), op("cos", ["x"], "b"),
              region(["a", "b"], [op("tanh", ["b"], "t")], ["t"], {"kind": "nothing"}), op("exp", ["x"], "e")],
             outputs=["t"])
    assert live_values(p) == {"t", "b", "x"}
    # through a scan, every arg counts (carries and sequences are re-bound to other ids)
    q = prog([op("sin", ["x"], "a"), {"kind": "scan", "args": ["x", "a"], "carry": ["c"], "xs": [], "length": 2,
                                      "body": [op("sin", ["c"], "y")], "carry_out": ["y"], "ys": ["y"],
                                      "results": ["cf", "ys"]}], outputs=["cf"])
    assert {"a", "x", "y"} <= live_values(q)


def test_a_cotangent_reaches_a_custom_jvp_arg_only_through_its_rules_live_tangents():
    """make run's campaign: a region's callback result read only by a custom_jvp whose jvp rule passes its tangent
    to an output the loss does not read. A cotangent reaches the other arg, not that one (remat2 rematerialises
    the region all the same: a value no cotangent reaches, tests/regressions/remat2-reruns-callbacks-of-region-
    without-cotangent.json)."""
    from conformance.ir.nodes import live_values
    from tests.programs import op, prog
    x = [{"id": i, "shape": [3], "dtype": "float32", "diff": True} for i in ("x", "y")]
    cjvp = {"kind": "custom_jvp", "args": ["x", "y"], "body": [op("neg", ["x"], "a"), op("sin", ["y"], "b")],
            "results": ["a", "b"], "tangents": ["tx", "ty"],
            "jvp": [op("neg", ["tx"], "ta"), op("cos", ["y"], "c"), op("mul", ["ty", "c"], "tb")],
            "jvp_results": ["ta", "tb"]}
    p = prog([cjvp], inputs=x, outputs=["a"])
    assert {"x", "y"} <= live_values(p)   # the rule reads both values
    assert "x" in live_values(p, cotangent=True) and "y" not in live_values(p, cotangent=True)
    q = prog([cjvp], inputs=x, outputs=["b"])   # the other output: the other arg
    assert "y" in live_values(q, cotangent=True) and "x" not in live_values(q, cotangent=True)


def test_no_cotangent_flows_into_a_while_loop():
    """A 30-minute default campaign: a custom_vjp's result reaches the outputs only through a while_loop's initial
    carry; reverse mode passes no cotangent into a while_loop (every value it reads is under stop_gradient), so
    none reaches the rule's results (remat3 calling its bwd with a symbolic zero is remat3-no-zero-propagation)."""
    from conformance.ir.nodes import live_values
    from tests.programs import op, prog

    def loop(spelling):
        return {"kind": "scan", "spelling": spelling, "args": ["a"], "carry": ["c"], "xs": [], "length": 1,
                "body": [op("sin", ["c"], "y")], "carry_out": ["y"], "ys": [], "results": ["cf"]}
    p = prog([op("exp", ["x"], "a"), loop("while_loop"), op("cos", ["x"], "b")], outputs=["cf", "b"])
    assert "a" in live_values(p) and "a" not in live_values(p, cotangent=True)
    assert {"x", "b"} <= live_values(p, cotangent=True)   # through the cos beside it
    q = prog([op("exp", ["x"], "a"), loop("fori_loop"), op("cos", ["x"], "b")], outputs=["cf", "b"])
    assert "a" in live_values(q, cotangent=True)


def test_feature_focus_is_declared_with_the_features():
    """A feature is declared once (its name, doc and focus dimensions, conformance.ir.features or the
    op table; docs/reference/features.md is generated from them, tests/test_docs.py); the campaign's focus is the
    declarations' (every focus feature declared, every dimension one the generator has)."""
    from conformance.ir.features import known_features
    from generators.swarm import FOCUS
    assert set(FOCUS) <= known_features(), set(FOCUS) - known_features()
    from conformance.ir.features import FEATURE_FOCUS
    from generators.swarm import swarm_dimensions
    assert {k: FOCUS[k] for k in FEATURE_FOCUS} == FEATURE_FOCUS and {"scan", "random", "aux_outputs"} <= set(FOCUS)
    dims = {d for v in FOCUS.values() for d in v}
    assert dims <= set(swarm_dimensions()), dims - set(swarm_dimensions())


@pytest.mark.parametrize("options, field, reason", [
    ({"prevent_cse_args": [True, False]}, "body[0].prevent_cse_args", "one bool per arg"),
    ({"prevent_cse_args": [True], "tree": "tuple"}, "body[0].prevent_cse_args", "flat region"),
    ({"static_by": "argnames"}, "body[0].static_by", "need static_flag"),
    ({"static_value": "unhashable"}, "body[0].static_by", "need static_flag"),
    ({"static_by": "by_name", "static_flag": True}, "body[0].static_by", ""),
    ({"state": "accumulate", "tree": "tuple"}, "body[0].state", "flat region"),
    ({"state": "read", "static_flag": True}, "body[0].state", "without a static flag"),
    ({"state": "everything"}, "body[0].state", ""),
])
def test_bad_region_options_are_rejected_naming_the_field(options, field, reason):
    obj = prog([op("sin", ["x"], "y")]).to_json_obj()
    obj["body"] = [{"kind": "checkpoint", "args": ["x"], "results": ["y"], "policy": {"kind": "nothing"},
                    "body": [op("sin", ["x"], "y")], **options}]
    with pytest.raises(ProgramError) as e:
        load_program(obj)
    assert e.value.field.startswith(field) and reason in e.value.reason, (e.value.field, e.value.reason)


def test_the_reducer_keeps_a_per_argument_prevent_cse_one_bool_per_arg():
    from conformance.engine.reduce import candidates
    p = prog([op("sin", ["x"], "a"),
              {"kind": "checkpoint", "args": ["a", "x"], "results": ["c"], "policy": {"kind": "nothing"},
               "prevent_cse_args": [False, True], "body": [op("mul", ["a", "x"], "c")]}], outputs=["c"])
    # bypassing sin makes the region read x twice: it passes x once, with the first one's bool
    fitted = [s for c in candidates(p) for s in c.body if getattr(s, "prevent_cse_args", None)
              and len(s.args) != 2]
    assert [(s.args, s.prevent_cse_args) for s in fitted] == [(["x"], [False])]
