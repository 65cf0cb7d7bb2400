"""Campaign dedup: when a failing verdict is an instance of a known finding (Searcher.known), the
per-key shrink limit, and the signature's stripping of incidental features. No framework runs."""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

from conformance.engine.findings import Finding, Seen, signature, signature_features
from conformance.engine.search import Searcher
from conformance.ir.verdict import Verdict

KEY = ("residuals", "jax:remat3", "jax:remat2", "other")
SIB = ("residuals", "jax:remat3:jit", "jax:remat2:jit", "other")


def _finding(key=KEY, features=("checkpoint", "policy:nothing", "op:sin", "float32"), reproduces=()):
    check, pipeline, reference, et = key
    return Finding(signature=signature(check, pipeline, reference, et, features), check=check, pipeline=pipeline,
                   reference=reference, error_type=et, features=list(features), program={}, program_hash="0" * 16,
                   reproduces=[list(k) for k in reproduces])


def _verdict(key=KEY):
    check, pipeline, reference, et = key
    return Verdict(check=check, pipeline=pipeline, reference=reference, status="fail", error_type=et)


def _searcher(findings, shrinks=None, max_shrinks=3):
    opts = SimpleNamespace(pipelines=[], max_shrinks_per_key=max_shrinks, shares=None)
    return Searcher(opts, None, None, lambda ev: None, findings, set(), Counter(shrinks or {}), lambda **_: False)


def test_signature_strips_dtype_ops_and_incidental_features():
    feats = ["checkpoint", "policy:nothing", "float32", "op:sin", "layout", "dup_names", "matmul"]
    assert signature_features(feats) == ["checkpoint", "matmul", "policy:nothing"]
    assert signature(*KEY, feats) == "residuals|jax:remat3|jax:remat2|other|checkpoint+matmul+policy:nothing"
    assert signature("gradient", "p", "r", "", []) == "gradient|p|r|-|"


def test_same_key_is_known_only_where_the_program_has_the_findings_root_features():
    f = _finding(features=("checkpoint", "names", "policy:nothing", "op:sin", "float32"))
    s = _searcher([f])
    assert s.known(_verdict(), {"checkpoint", "names", "policy:nothing", "nesting", "float64"}, {KEY}) is f
    # a program lacking a root feature is another candidate behaviour: shrunk again
    assert s.known(_verdict(), {"checkpoint", "policy:nothing"}, {KEY}) is None
    # policy kinds, dtypes and op families are variants of the root, not part of it
    assert s.known(_verdict(), {"checkpoint", "names", "policy:ops", "bfloat16", "matmul"}, {KEY}) is f


def test_a_label_or_twin_is_known_once_seen_in_the_root():
    f = _finding()
    s = _searcher([f])
    feats = {"checkpoint", "policy:nothing"}
    extra = ("residuals", "jax:remat3", "jax:remat2", "extra")
    assert s.known(_verdict(extra), feats, {extra}) is None          # a new label: shrunk once
    f.variants = {"labels": {"extra": Seen(count=1)}}
    assert s.known(_verdict(extra), feats, {extra}) is f             # then it folds into the root


def test_a_key_shrunk_max_times_is_counted_under_the_closest_finding():
    a = _finding(features=("checkpoint", "names", "policy:nothing"))
    b = _finding(features=("checkpoint", "policy:ops", "nested_checkpoint", "scan"))
    feats = {"checkpoint", "policy:save_only_names", "nested_checkpoint"}
    assert _searcher([a, b], {KEY: 2}).known(_verdict(), feats, {KEY}) is None
    assert _searcher([a, b], {KEY: 3}).known(_verdict(), feats, {KEY}) is b    # shares 2 core features
    assert _searcher([a, b], {KEY: 1}, max_shrinks=1).known(_verdict(), {"checkpoint"}, {KEY}) is a   # fewer extras


def test_a_twin_key_is_known_only_with_a_pipeline_of_the_finding_failing_too():
    f = _finding(reproduces=[SIB])
    s = _searcher([f])
    feats = {"checkpoint", "policy:nothing"}
    assert s.known(_verdict(SIB), feats, {KEY, SIB}) is f
    other = ("residuals", "jax:remat3+cvjp3", "jax:remat2", "other")
    assert s.known(_verdict(other), feats, {KEY, other}) is f      # a twin, with the finding's own failing
    assert s.known(_verdict(other), feats, {other}) is None         # only the twin fails: shrunk once
    plain = _finding()
    assert _searcher([plain]).known(_verdict(SIB), feats, {SIB}) is None


def test_a_key_folded_into_another_finding_is_capped_by_that_finding():
    """A shrunk finding of one key that folded into another key's finding (its key in the other's
    `reproduces`) leaves no finding of its own key: the cap still counts further programs under it."""
    other = ("error", "jax:remat3+cvjp3", "expectations", "ValueError")
    f = _finding(("error", "jax:remat3", "expectations", "ValueError"), reproduces=[other])
    feats = {"checkpoint"}   # lacks the finding's core features: not known by them
    assert _searcher([f], {other: 1}).known(_verdict(other), feats, {other}) is None
    assert _searcher([f], {other: 3}).known(_verdict(other), feats, {other}) is f


ERR = ("error", "torch:eager-sac", "expectations", "RuntimeError")
ERR_COMPILED = ("error", "torch:compile-aot_eager", "expectations", "RuntimeError")
MUTATED = {
    "got": {"type": "RuntimeError", "message": "Tensor cached during selective activation checkpoint has been mutated"}
}


def _raising(key, features, detail):
    f = _finding(key, features)
    f.detail = detail
    return f


def test_one_raise_under_another_policy_or_pipeline_is_the_same_error_finding():
    """The same error (type and message) is one root however the program reached it: eager SAC's
    mutated-cache error under policy:everything, then under policy:min_elements; and the compiled
    pipeline raising it where a graph break ran the region eagerly (stop 27's CI gate)."""
    from conformance.engine.findings import error_root
    f = _raising(ERR, ("checkpoint", "policy:everything", "random"), MUTATED)
    s = _searcher([f])
    feats = {"checkpoint", "policy:min_elements", "random", "dead_random"}
    v = Verdict(check="error", pipeline=ERR[1], reference=ERR[2], status="fail", error_type=ERR[3], detail=MUTATED)
    assert s.known(v, feats, {ERR}) is f
    w = Verdict(
        check="error", pipeline=ERR_COMPILED[1], reference=ERR[2], status="fail", error_type=ERR[3], detail=MUTATED
    )
    assert s.known(w, feats | {"cond"}, {ERR, ERR_COMPILED}) is f
    assert s.known(w, feats, {ERR_COMPILED}) is None  # eager does not raise it here: another root
    other = {
        "got": {"type": "RuntimeError", "message": "element 0 of tensors does not require grad and has no grad_fn"}
    }
    v2 = Verdict(check="error", pipeline=ERR[1], reference=ERR[2], status="fail", error_type=ERR[3], detail=other)
    assert s.known(v2, feats, {ERR}) is None                     # another message: another root
    # numbers and addresses do not make roots differ; a too short message tells nothing
    a = {"got": {"type": "ValueError", "message": "Expected cotangent type float32[2] but got float32<host>[2]"}}
    b = {"got": {"type": "ValueError", "message": "Expected cotangent type float32[2,2] but got float32<host>[2,2]"}}
    assert error_root(a) == error_root(b) and error_root({"got": {"type": "E", "message": "boom"}}) is None
    from conformance.engine.search import same_behaviour
    g = _raising(ERR, ("checkpoint", "policy:min_elements", "random"), MUTATED)
    assert same_behaviour(f, g) and not same_behaviour(f, _raising(ERR, ("checkpoint", "policy:min_elements"), other))


def test_a_raise_no_finding_holds_is_shrunk_once_whatever_its_keys_count():
    """An error type's first raise must not close its key to another raise (r35: after a remat2 ValueError of a
    static flag was shrunk, the safe_zip ValueError of a prevent_cse tuple was counted under it, never shown);
    the shrink keeps the raise, so a reduction raising something else of that type fails the target."""
    from conformance.engine.search import Target
    key = ("error", "jax:remat2", "expectations", "ValueError")

    def raising(message):
        v = _verdict(key)
        v.detail = {"got": {"type": "ValueError", "message": message, "stage": "backward"}}
        return v
    held, new = raising("the region's static flag must be True"), raising("safe_zip() argument 1 has length 6 but 4")
    f = _finding(key, features=("checkpoint", "policy:nothing", "static_argnames"))
    f.detail = dict(held.detail)
    s = _searcher([f], {key: 3})
    feats = {"checkpoint", "policy:nothing", "static_argnames", "prevent_cse_tuple"}
    assert s.known(held, feats, {key}) is f
    assert s.known(new, feats, {key}) is None                  # a new raise: shrunk, the key's count spent or not
    s.raises_shrunk.add((key, "ValueError: safe_zip() argument N has length N but N"))
    assert s.known(new, feats, {key}) is f                     # shrunk once here: then the cap holds
    t = Target(key=key, program=None, seed=0, verdict=new, observations={}, original_size=1, origin=("h", 0),
               started=0.0, raised="ValueError: safe_zip() argument N has length N but N")
    judged = SimpleNamespace(failures=lambda: [held])
    assert t.failure(judged) is None                           # the same type, another raise: not this target
    judged = SimpleNamespace(failures=lambda: [new])
    assert t.failure(judged) is new
