"""Effects (jax.debug.callback, io_callback, ordered or not) in checkpointed programs: how often
they run under each remat implementation (the effect_count oracle), what JAX refuses by design
(expectation jax-checkpoint-refuses-io-effects), and PyTorch's declared lack of them."""
from __future__ import annotations

import numpy as np
import pytest

from conformance.ir.observation import Observation
from conformance.pipelines import registry
from oracles import effects
from oracles.expectations import Expectations
from oracles.judge import judge
from tests.programs import op, prog, region

X = {"x": np.array([0.3, -0.2, 0.5])}


def _effect_in_region(kind: str, policy="nothing"):
    """sin, then the effect, then cos, all in one region: a recompute runs the effect again."""
    return prog([region(["x"], [op("sin", ["x"], "a"), op("effect", ["a"], "b", kind=kind), op("cos", ["b"], "c")],
                        ["c"], {"kind": policy})])


def _run(p, names):
    return {n: registry.get(n).run(p, X) for n in names}


@pytest.mark.parametrize("kind", ["callback", "ordered"])
def test_a_recompute_runs_a_debug_callback_again_under_both_implementations(kind):
    p = _effect_in_region(kind)
    obs = _run(p, ["jax:none", "jax:remat2", "jax:remat3", "jax:remat2:jit", "jax:remat3:jit"])
    assert all(o.error is None for o in obs.values()), {n: o.error for n, o in obs.items()}
    assert obs["jax:none"].effects == {kind: 1}
    assert obs["jax:remat2"].effects == obs["jax:remat3"].effects == {kind: 2}   # forward, then the recompute
    assert obs["jax:remat3"].effect_sites == {"b": 2} and obs["jax:none"].effect_sites == {"b": 1}   # per statement
    j = judge(p, obs, Expectations.load())
    counts = [v for v in j.verdicts if v.check == "effect_count"]
    assert {(v.pipeline, v.reference) for v in counts} >= {("jax:remat3", "jax:remat2"), ("jax:remat2", "jax:none"),
                                                          ("jax:remat3:jit", "jax:remat2:jit")}
    assert all(v.status == "pass" or (v.status == "skipped" and not registry.same_mode(v.pipeline, v.reference))
               for v in counts), [(v.pipeline, v.reference, v.status, v.detail) for v in counts]
    # a policy that saves everything needs no recompute: the effect runs once
    saved = _run(_effect_in_region(kind, "everything"), ["jax:remat2"])["jax:remat2"]
    assert saved.effects == {kind: 1}


def test_io_callback_in_a_differentiated_region_is_refused():
    p = _effect_in_region("io")
    assert "io_callback_in_checkpoint" in p.features()
    obs = _run(p, ["ref:f64", "jax:none", "jax:remat2", "jax:remat3"])
    assert obs["jax:none"].error is None and obs["jax:none"].effects == {"io": 1}
    for n in ("jax:remat2", "jax:remat3"):
        assert obs[n].error is not None and obs[n].error.type == "NotImplementedError", obs[n].error
        assert "Effects not supported in" in obs[n].error.message
    j = judge(p, obs, Expectations.load())
    errs = {v.pipeline: v for v in j.verdicts if v.check == "error" and v.pipeline in ("jax:remat2", "jax:remat3")}
    assert {v.status for v in errs.values()} == {"expected"}, errs
    assert j.expectation_hits.get("jax-checkpoint-refuses-io-effects") == "fired"


def test_torch_declares_effects_unsupported():
    p = _effect_in_region("callback")
    obs = _run(p, ["torch:none", "torch:eager-sac"])
    assert all(o.unsupported and "effect" in o.unsupported for o in obs.values())
    j = judge(p, obs, Expectations.load())
    assert {v.status for v in j.verdicts if v.check == "error"} == {"unsupported"}


def _obs(name, counts):
    return Observation(pipeline=name, outputs=[], grads={}, effects=counts)


def test_the_effect_count_oracle_fails_on_any_difference_and_on_fewer_runs_than_without_checkpoint():
    same = effects.compare(_obs("jax:remat3", {"callback": 2, "ordered": 2}),
                           _obs("jax:remat2", {"callback": 2, "ordered": 2}), True)
    assert same.status == "pass"
    v = effects.compare(_obs("jax:remat3", {"callback": 1, "ordered": 3}),
                        _obs("jax:remat2", {"callback": 2, "ordered": 2}), True)
    assert v.status == "fail" and v.error_type == "callback:fewer+ordered:more"
    assert v.detail["effects"]["callback"] == {"got": 1, "reference": 2}
    # a kind one side never ran counts as 0
    assert effects.compare(_obs("jax:remat3", {}), _obs("jax:remat2", {"io": 1}), True).error_type == "io:fewer"
    # against the program without checkpoint, only fewer runs fail (a recompute adds runs)
    assert effects.compare_baseline(_obs("jax:remat2", {"callback": 3}), _obs("jax:none", {"callback": 2}),
                                    True).status == "pass"
    dropped = effects.compare_baseline(_obs("jax:remat2", {"callback": 1}), _obs("jax:none", {"callback": 2}), True)
    assert dropped.status == "fail" and dropped.error_type == "callback:dropped"
    # eager and jit run different programs: not compared; a pipeline without counts: skipped
    assert effects.compare(_obs("jax:remat3:jit", {"callback": 1}), _obs("jax:remat2", {"callback": 2}),
                           False).status == "skipped"
    assert effects.compare(_obs("jax:remat3", None), _obs("jax:remat2", {"callback": 2}), True).status == "skipped"
    # counted per statement too: the detail names the statements whose counts differ
    a, b = _obs("jax:remat3", {"callback": 3}), _obs("jax:remat2", {"callback": 2})
    a.effect_sites, b.effect_sites = {"e": 2, "f": 1}, {"e": 1, "f": 1}
    assert effects.compare(a, b, True).detail["sites"] == {"e": {"got": 2, "reference": 1}}


def test_effects_are_generated_only_when_required_and_never_ordered_per_example():
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from generators.programs import Config, cases
    seen = []

    @hseed(3)
    @settings(max_examples=80, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(cases(Config(require=("effects",))))
    def collect(case):
        seen.append(case[0].features())
    collect()
    kinds = {f for fs in seen for f in fs if f.startswith("effect:")}
    assert kinds == {"effect:callback", "effect:ordered", "effect:io", "effect:io_ordered"}, kinds
    assert any("io_callback_in_checkpoint" in fs for fs in seen)
    assert not any({"effect:ordered", "effect:io", "effect:io_ordered"} & fs for fs in seen if "per_example" in fs)


def test_ordered_effects_are_refused_on_more_than_one_device():
    """A sharded (NamedSharding over two CPU devices) or shard_map run of a program with an ordered effect raises
    JAX's explicit refusal (documented: entry jax-ordered-effects-single-device); an unordered callback runs and
    counts as on one device."""
    names = ["ref:f64", "jax:none", "jax:remat2", "jax:remat2:jit", "jax:remat2:sharded", "jax:remat2:shard-map"]
    obs = _run(_effect_in_region("ordered"), names)
    for n in ("jax:remat2:sharded", "jax:remat2:shard-map"):
        assert obs[n].error is not None and "not supported for more than 1 device" in obs[n].error.message, n
    j = judge(_effect_in_region("ordered"), obs, Expectations.load())
    assert j.expectation_hits.get("jax-ordered-effects-single-device") == "fired"
    assert not [v for v in j.verdicts if v.status == "fail"]
    plain = _run(_effect_in_region("callback"), ["jax:remat2:jit", "jax:remat2:sharded"])
    assert plain["jax:remat2:sharded"].error is None
    assert plain["jax:remat2:sharded"].effects == plain["jax:remat2:jit"].effects == {"callback": 2}


def test_short_repros_keep_an_effect_nothing_reads():
    """An effect whose value nothing reads still runs: the short repro's dead-code pass keeps it (and what it reads),
    and pastes the debug-callback form of the effect helper where no io_callback is used."""
    from conformance.repro.short_common import dead_code_removed
    from conformance.repro.short_jax import CALLBACK_EFFECT, _effect_helper
    p = prog([region(["x"], [op("sin", ["x"], "a"), op("effect", ["a"], "b", kind="callback"), op("cos", ["x"], "c")],
                     ["c"], {"kind": "nothing"})])
    kept = [s.op for s in dead_code_removed(p, "effect_count").body[0].body]
    assert kept == ["sin", "effect", "cos"], kept
    from conformance.pipelines.jax import table as jax_table
    from conformance.repro.short_common import used_helpers
    helpers = used_helpers(jax_table.PRELUDE, "effect(a, 'callback')")
    short = _effect_helper(helpers, p)
    assert CALLBACK_EFFECT.rstrip("\n") in short and "io_callback" not in short
    assert "io_callback" in _effect_helper(helpers, _effect_in_region("io"))
