"""Root behaviours: pipeline families, root keys, variants, folding, suggested classes, and corpus
roots on disk (tools/corpus_root.py). No framework runs."""
from __future__ import annotations

import json

import pytest

from conformance.engine.findings import Finding, signature
from conformance.engine.loading import load_corpus_variants, load_known, load_program_file
from conformance.engine.roots import pipeline_family, root_key, stamp, suggest_triage
from conformance.engine.search import merge_finding
from conformance.errors import UsageError


def _finding(check="residuals", pipeline="jax:remat3", reference="jax:remat2", label="other",
             features=("checkpoint", "policy:nothing"), detail=None):
    return Finding(signature=signature(check, pipeline, reference, label, features), check=check, pipeline=pipeline,
                   reference=reference, error_type=label, features=list(features), program={},
                   program_hash="0" * 16, detail=detail or {})


@pytest.mark.parametrize("name,family", [
    ("jax:remat3", "jax:remat3"), ("jax:remat3:jit", "jax:remat3"), ("jax:remat3+cvjp3:jit", "jax:remat3"),
    ("jax:remat3+cjvp3", "jax:remat3"), ("jax:remat2:jit", "jax:remat2"), ("ref:f64", "values"),
    ("jax:none", "values"), ("torch:none", "values"), ("torch:compile-inductor", "torch:compile"),
    ("torch:compile-aot_eager+default-partitioner:prefer", "torch:compile"),
    ("torch:compile-aot_eager:budget-0", "torch:compile:budget-0"), ("torch:eager-sac:prefer", "torch:eager-sac"),
    ("expectations", "expectations")])
def test_pipeline_families_fold_twins_and_keep_options(name, family):
    assert pipeline_family(name) == family


def test_labels_policies_dtypes_and_twins_are_variants_of_one_root():
    a = _finding(label="other", features=("checkpoint", "names", "policy:nothing", "float32"))
    b = _finding(pipeline="jax:remat3+cvjp3:jit", reference="jax:remat2:jit", label="extra",
                 features=("checkpoint", "names", "policy:everything", "bfloat16", "matmul"))
    assert root_key(a) == root_key(b) == "residuals|jax:remat3|jax:remat2|checkpoint+names"
    # a feature the minimal program cannot lose keeps roots apart
    assert root_key(_finding(features=("checkpoint", "policy:nothing"))) != root_key(a)
    # another check, another reference family: another root
    assert root_key(_finding(check="custom_rule", features=a.features)) != root_key(a)


def test_an_error_roots_on_what_it_raised_or_on_its_features_when_nothing_was_raised():
    got = {"got": {"type": "StoreException", "message": "Store occupied at 0x7f12 after 3 tries"}}
    e1 = _finding("error", "jax:remat3+cvjp3", "expectations", "StoreException", ("checkpoint", "nonsmooth"), got)
    e2 = _finding("error", "jax:remat3:jit", "expectations", "StoreException", ("custom_jvp", "policy:dots"), got)
    assert root_key(e1) == root_key(e2)
    none = _finding("error", "jax:remat3", "expectations", "none", ("custom_vjp", "symbolic_zeros"),
                    {"got": None, "expected": {"type": ".*", "regex": "symbolic"}})
    assert root_key(none) == "error|jax:remat3|expectations|none:custom_vjp+symbolic_zeros"


def test_an_error_root_blanks_what_a_message_says_of_one_programs_values_and_folds_options():
    """The same raise is one root whatever values it names (torch's fake tensors and symbol kinds), whatever the
    harness noted raised before hooks were left disabled, and under an option of the pipeline."""
    def err(pipeline, message, feats=("checkpoint",)):
        return _finding("error", pipeline, "expectations", "E", feats, {"got": {"type": "E", "message": message}})
    pending = "Pending unbacked symbols {%s} not in returned outputs [%s] .\nDid you accidentally call item()?"
    a = err("torch:export-strict", pending % ("u1", "FakeTensor(..., size=(3, 1), grad_fn=<ExpandBackward0>), "
                                                    "FakeTensor(..., size=(3,), requires_grad=True)"))
    b = err("torch:export-strict:reentrant", pending % ("zuf0", "FakeTensor(..., size=(1, 4), requires_grad=True)"),
            ("checkpoint", "cast"))
    assert root_key(a) == root_key(b)
    hooks = "after this run saved-tensor hooks stay disabled (it raised %s first)"
    assert root_key(err("torch:compile-aot_eager", hooks % "BackendCompilerFailed")) == root_key(
        err("torch:compile-inductor", hooks % "InternalTorchDynamoError"))
    # JAX names one effect of a set, in the order it iterates them: Write<...> in one run, Read<...> in the next
    effect = "`JaxprInputEffect` %s<Var(id=140608785327888):bfloat16[]> does not have a corresponding jaxpr input."
    assert root_key(err("jax:remat3", effect % "Write")) == root_key(err("jax:remat3", effect % "Read"))
    # torch.fx names the node of the harness's graph it was executing (its argument names, the checkpoint's kwargs):
    # the raise is the message before it (a 30-minute campaign filed export-strict's KeyError twice)
    fx = ("_checkpoint_context_fn\n\nWhile executing %%tag_activation_checkpoint : [num_users=1] = call_function["
          "target=torch.ops.higher_order.tag_activation_checkpoint](args = (%%wrap_body_0, %s), kwargs = "
          "{use_reentrant: %s})\nOriginal traceback:\n  File ...")
    assert root_key(err("torch:export-strict", fx % ("%l_flat_args_0_", "False"))) == root_key(
        err("torch:export-strict:reentrant", fx % ("%value", "True"), ("checkpoint", "scan")))
    # another raise, or the same raise under another pipeline, is another root
    assert root_key(a) != root_key(err("torch:export-strict", "Pending something else {u1}"))
    assert root_key(a) != root_key(err("torch:export-nonstrict", pending % ("u1", "FakeTensor(...)")))


def test_folding_records_each_variant_with_counts_and_first_seen():
    findings: list[Finding] = []
    a = stamp(_finding(label="other", features=("checkpoint", "policy:nothing")))
    a.first_seen = 10.0
    a.variants = {}
    stamp(a)
    merge_finding(findings, a)
    b = stamp(_finding(pipeline="jax:remat3:jit", reference="jax:remat2:jit", label="extra",
                       features=("checkpoint", "policy:dots", "float16")))
    b.first_seen = 20.0
    b.variants = {}
    stamp(b)
    kept, changed = merge_finding(findings, b)
    assert kept is a and not changed and len(findings) == 1
    assert a.count == 2
    assert set(a.variants["labels"]) == {"other", "extra"}
    assert a.variants["labels"]["extra"].first_seen == 20.0
    assert set(a.variants["pipelines"]) == {"jax:remat3", "jax:remat3:jit"}
    assert set(a.variants["policies"]) == {"nothing", "dots"}
    assert a.variants["features"]["float16"].count == 1
    assert ["residuals", "jax:remat3:jit", "jax:remat2:jit", "extra"] in a.reproduces


@pytest.mark.parametrize("finding,cls", [
    (_finding("gradient", "torch:compile-aot_eager", "ref:f64", ""), "bug"),
    (_finding("error", "jax:remat3", "expectations", "StoreException", detail={
        "got": {"type": "StoreException", "message": "Store occupied"}}), "bug"),
    (_finding("error", "jax:remat3", "expectations", "none", detail={"got": None}), "question"),
    (_finding("residuals", "jax:remat3", "jax:remat2", "extra"), "question"),
    (_finding("residuals", "torch:compile-aot_eager", "torch:eager-sac", "missing"), "bug"),
    (_finding("crash", "torch:compile-inductor", "expectations", "crash:SIGSEGV"), "bug"),
])
def test_rules_suggest_a_class_a_person_confirms(finding, cls):
    t = suggest_triage(finding)
    assert t.class_ == cls and not t.confirmed and t.reason.startswith("suggested:")


def _write_root(tmp_path, variants, **kw):
    from tools.corpus_root import make_root, write_root
    entries = []
    for k, v in enumerate(variants):
        p = tmp_path / f"e{k}.json"
        p.write_text(json.dumps(v))
        entries.append(p)
    obj = make_root(kw.get("slug", "one-root"), "remat3 saves what nothing reads", "question",
                    "a residual difference under an opt-in flag", ["https://example.invalid/1"], entries)
    return write_root(tmp_path, kw.get("slug", "one-root"), obj, entries, remove=True), entries


def _corpus_entries(n):
    from pathlib import Path
    reg = Path(__file__).parent / "regressions"
    out = []
    for p in sorted(reg.glob("*.json")):
        if p.name == "status.json":
            continue
        obj = json.loads(p.read_text())
        out += obj["variants"] if "variants" in obj else [obj]
        if len(out) >= n:
            return [{k: v for k, v in e.items() if k != "name"} for e in out[:n]]
    raise AssertionError("the corpus has too few entries")


def test_a_corpus_root_keeps_every_variant_and_loads_as_its_representative(tmp_path):
    entries = _corpus_entries(3)
    path, old = _write_root(tmp_path, entries)
    assert not any(p.exists() for p in old)   # --remove: the entries it replaced are gone
    obj = json.loads(path.read_text())
    assert obj["replaces"] == ["e0.json", "e1.json", "e2.json"] and obj["triage"]["class"] == "question"
    variants = load_corpus_variants(str(path))
    assert [v[0] for v in variants] == ["e0", "e1", "e2"]
    assert [v[3].program_hash for v in variants] == [e["finding"]["program_hash"] for e in entries]
    prog, _, f = load_program_file(str(path))
    assert prog.content_hash() == entries[0]["finding"]["program_hash"]
    assert f.title == "remat3 saves what nothing reads" and f.triage.class_ == "question"
    known = load_known([str(tmp_path)])
    assert len(known) == 3 and {k.tracked for k in known} == {"one-root.json"}


@pytest.mark.parametrize("damage,says", [
    (lambda o: o.update(variants=[]), "variants: must be a non-empty list"),
    (lambda o: o["triage"].update({"class": "feature"}), "triage.class"),
    (lambda o: o["variants"][1]["inputs"].clear(), "variants[1].inputs: ids"),
    (lambda o: o.update(root="bad slug!"), "root: must match"),
])
def test_a_damaged_root_is_refused_naming_the_field(tmp_path, damage, says):
    path, _ = _write_root(tmp_path, _corpus_entries(2))
    obj = json.loads(path.read_text())
    damage(obj)
    path.write_text(json.dumps(obj))
    with pytest.raises(UsageError) as e:
        load_corpus_variants(str(path))
    assert str(e.value).startswith(str(path)) and says in str(e.value)


def test_a_wrong_gradient_is_one_root_whichever_reference_showed_it():
    feats = ("custom_vjp", "non_differentiable")
    a = _finding("gradient", "torch:compile-aot_eager", "torch:none", "", feats)
    b = _finding("gradient", "torch:compile-inductor", "torch:eager-sac", "cross_value", feats)
    assert root_key(a) == root_key(b) == "gradient|torch:compile|values|custom_vjp+non_differentiable"


def test_spellings_and_rule_options_fold_but_constructs_keep_roots_apart():
    from conformance.engine.roots import nested_roots
    tc = "trace_count"
    base = _finding(tc, "jax:remat3+cvjp3", "jax:remat2", "primal_traces", ("custom_vjp",))
    spelled = _finding(tc, "jax:remat3+cvjp3:jit", "jax:remat2:jit", "primal_traces",
                       ("custom_vjp", "nondiff_args", "custom_gradient", "unused_result"))
    assert root_key(base) == root_key(spelled)       # spellings are variants
    cond = _finding(tc, "jax:remat3+cvjp3", "jax:remat2", "fwd_traces", ("cond", "custom_vjp", "nondiff_input"))
    switch = _finding(tc, "jax:remat3+cvjp3", "jax:remat2", "bwd_calls+fwd_traces",
                      ("switch", "custom_vjp", "nondiff_input", "symbolic_zeros"))
    assert nested_roots(cond, switch)                 # a switch is a cond; symbolic_zeros a rule option
    assert not nested_roots(base, _finding(tc, "jax:remat3+cvjp3", "jax:remat2", "primal_traces",
                                           ("cond", "custom_vjp")))   # a construct: another root
    assert not nested_roots(base, _finding(tc, "jax:remat3+cvjp3", "jax:remat2", "bwd_calls",
                                           ("custom_vjp", "symbolic_zeros")))   # another label
    # each with a rule option the other lacks (bwd_none, optimize_remat): still one root
    g = "gradient"
    tc_ = "torch:compile-aot_eager"
    assert nested_roots(_finding(g, tc_, "torch:none", "", ("custom_vjp", "bwd_branch", "bwd_none")),
                        _finding(g, tc_, "torch:none", "", ("custom_vjp", "bwd_branch", "optimize_remat")))
    assert not nested_roots(_finding(g, tc_, "torch:none", "", ("custom_vjp", "bwd_none")),
                            _finding(g, tc_, "torch:none", "", ("custom_vjp", "bwd_branch")))


def test_a_missing_expected_error_roots_on_the_expectation_that_asked_for_it():
    a = _finding("error", "jax:remat3", "expectations", "none", ("custom_vjp", "symbolic_zeros", "scan"), {"got": None})
    b = _finding("error", "jax:remat3:jit", "expectations", "none", ("custom_vjp", "symbolic_zeros", "random"),
                 {"got": None})
    a.expectation = b.expectation = "remat3-symbolic-zeros-fwd-remat"
    assert (
        root_key(a) == root_key(b) == "error|jax:remat3|expectations|none:expectation remat3-symbolic-zeros-fwd-remat"
    )


def test_a_residual_difference_between_pipelines_of_one_semantics_roots_on_its_direction():
    """remat3 recomputing more than remat2 is one root whether it shows through a scan, a cond or a
    name (the constructs are variants); keeping more is another; where only named residuals are
    compared (compiled PyTorch against eager), the features still key the root."""
    from conformance.engine.search import known_finding
    less = {"missing_other": ["float32[2]"], "extra_other": ["float32[2] (a program input)"]}
    scan = _finding(features=("checkpoint", "scan", "checkpoint_in_scan", "policy:min_elements"), detail=less)
    cond = _finding(pipeline="jax:remat3:jit", reference="jax:remat2:jit", label="missing",
                    features=("checkpoint", "cond", "names"), detail={"missing_named": ["a"], "extra_named": []})
    assert root_key(scan) == root_key(cond) == "residuals|jax:remat3|jax:remat2|saves less"
    aux = _finding(features=("checkpoint", "aux_outputs"), detail={"missing_named": [], "extra_named": ["v2/x0"]})
    assert root_key(aux) == "residuals|jax:remat3|jax:remat2|saves more"
    assert root_key(_finding(detail={"bytes": 4, "reference_bytes": 8})).endswith("|saves less")
    assert root_key(_finding(detail={})) == "residuals|jax:remat3|jax:remat2|checkpoint"   # nothing told apart
    named_only = _finding(pipeline="torch:compile-aot_eager", reference="torch:eager-sac",
                          features=("checkpoint", "names", "policy:nothing"), detail=less)
    assert root_key(named_only) == "residuals|torch:compile|torch:eager-sac|checkpoint+names"
    # before shrinking, a program departing the same way is counted under the known finding
    key = ("residuals", "jax:remat3", "jax:remat2", "other")
    assert known_finding([stamp(scan)], key, {"checkpoint", "names"}, {key}, "saves less") is scan
    assert known_finding([stamp(scan)], key, {"checkpoint", "names"}, {key}, "saves more") is None
    # after shrinking, two findings of one direction are one
    findings: list[Finding] = []
    merge_finding(findings, stamp(scan))
    kept, changed = merge_finding(findings, stamp(cond))
    assert findings == [scan] and kept is scan and not changed and scan.count == 2
    assert {"scan", "cond", "names"} <= set(scan.variants["constructs"])   # what it showed through
    merge_finding(findings, stamp(aux))
    assert len(findings) == 2


def test_a_scalars_shape_reads_as_any_other_shape_in_an_error_root():
    """jax's 'Expected cotangent type float32[] but got float32<host>[]' (a scalar) is the tracked
    offload-policy-second-order-cotangent-type raise of float32[2]: a campaign on the pinned jax filed it as new."""
    from conformance.engine.findings import error_root
    roots = {error_root({"got": {"type": "ValueError", "message": f"Expected cotangent type float32{s} but got "
                                                                   f"float32<host>{s}"}})
             for s in ("[]", "[2]", "[2, 2]", "[2,3,4]")}
    assert len(roots) == 1, roots
    assert error_root({"got": {"type": "ValueError", "message": "Expected cotangent type float32[] but got "
                                                                 "bfloat16[]"}}) not in roots
