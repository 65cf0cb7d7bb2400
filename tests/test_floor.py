"""The floor: twins on declared program shares, the shared eager cache, the jitted float64 reference."""
from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conformance.engine.search import Shares
from conformance.ir.residuals import _close
from conformance.pipelines import registry as reg
from oracles.judge import judge
from tests.programs import op, prog
from tests.test_oracle_units import G, exps, find, ob

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = reg.run_set(list(reg.CORE_PIPELINES))
TWINS = ["jax:remat2:jit", "jax:remat3:jit", "jax:remat3+cvjp3:jit"]


def _hashes(n=2000, seed=0):
    rnd = random.Random(seed)
    return [f"{rnd.getrandbits(64):016x}" for _ in range(n)]


def test_every_share_names_a_cheaper_sibling_that_runs_beside_it_in_the_default_set():
    shared = reg.shared_pipelines(DEFAULT)
    assert set(TWINS) | {"jax:none"} <= set(shared)
    for name, sh in shared.items():
        assert sh.sibling in DEFAULT and sh.why
        if reg.spec(name).jit:   # a :jit twin's sibling is its eager self
            assert sh.sibling == name.removesuffix(":jit") and not reg.spec(sh.sibling).jit
    with pytest.raises(ValueError, match="fraction"):
        reg.Share(0.0, "jax:remat2", "never")


def test_a_share_picks_its_fraction_of_programs_by_hash_the_same_for_every_twin():
    hs = _hashes()
    picked = {t: {h for h in hs if reg.on_share(t, h, {"float32"}, DEFAULT)} for t in TWINS}
    assert picked[TWINS[0]] == picked[TWINS[1]] == picked[TWINS[2]]   # jit twins compare on one set
    frac = len(picked[TWINS[0]]) / len(hs)
    assert abs(frac - reg.JIT_TWIN_SHARE) < 0.04, frac
    # a fraction given on the command line, and a twin whose sibling is not in the run: every program
    assert all(reg.on_share(TWINS[1], h, {"float32"}, DEFAULT, fraction=1.0) for h in hs)
    assert all(reg.on_share("jax:remat3:jit", h, {"float32"}, ["jax:remat3:jit", "jax:remat2"]) for h in hs)
    # jax:none's share holds on float64-only programs only
    assert all(reg.on_share("jax:none", h, {"float64", "float32"}, DEFAULT) for h in hs)
    assert 0.15 < sum(reg.on_share("jax:none", h, {"float64"}, DEFAULT) for h in hs) / len(hs) < 0.25


def _programs(n):
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from generators.programs import Config, cases
    out = []

    @hseed(7)
    @settings(max_examples=n, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(cases(Config()))
    def collect(case):
        out.append(case[0])
    collect()
    return out


def test_a_campaign_selection_leaves_twins_out_of_most_programs_and_a_share_flag_restores_them():
    progs = _programs(60)
    shares, lifted = Shares(DEFAULT, by="programs"), Shares(DEFAULT, {t: 1.0 for t in TWINS}, by="programs")
    ran, full = [], []
    for p in progs:
        ran.append(shares.select(p, DEFAULT))
        full.append(lifted.select(p, DEFAULT))
    for t in TWINS:
        assert 0 < sum(t in r for r in ran) < len(progs) / 2
        assert sum(t in r for r in full) == len(progs)
        assert shares.skipped[t] == len(progs) - sum(t in r for r in ran)
    for r in ran:   # a twin never runs without its sibling, nor the references without the rivals' needs
        assert "ref:f64" in r and "jax:remat2" in r
        assert all(t.removesuffix(":jit") in r for t in TWINS if t in r)


def test_on_a_float64_program_without_jax_none_ref_f64_is_the_tight_baseline():
    p = prog([op("sin", ["x"], "y")])   # float64 throughout
    close = {"x": [v * (1 + 1e-8) for v in G["x"]]}   # within the loose bound, beyond the tight one
    j = judge(p, {"ref:f64": ob("ref:f64", G), "jax:remat2": ob("jax:remat2", G),
                  "jax:remat3": ob("jax:remat3", close)}, exps())
    v = find(j, "gradient", "jax:remat3", "ref:f64")
    assert v.status == "fail" and v.detail.get("mode") == "tight", v.detail
    # with jax:none present it is the baseline, and ref:f64 the loose reference
    j = judge(p, {"ref:f64": ob("ref:f64", G), "jax:none": ob("jax:none", G), "jax:remat2": ob("jax:remat2", G),
                  "jax:remat3": ob("jax:remat3", close)}, exps())
    assert find(j, "gradient", "jax:remat3", "jax:none").status == "fail"
    assert find(j, "gradient", "jax:remat3", "ref:f64").status == "pass"


def test_on_a_float32_program_a_missing_baseline_is_not_replaced():
    p = prog([op("sin", ["x"], "y")], inputs=[{"id": "x", "shape": [3], "dtype": "float32", "diff": True}])
    j = judge(p, {"ref:f64": ob("ref:f64", G), "jax:remat2": ob("jax:remat2", G),
                  "jax:remat3": ob("jax:remat3", G)}, exps())
    v = find(j, "gradient", "jax:remat3", "ref:f64")
    assert v.status == "pass" and v.detail.get("mode") != "tight"


_SCRIPT = r"""
import json, sys
import numpy as np
from conformance.pipelines import registry as reg
from tests.programs import op, prog, region
p = prog([op("sin", ["x"], "a"), region(["a"], [op("cos", ["a"], "b"), op("name", ["b"], "c", name="c"),
          op("tanh", ["c"], "d")], ["d"], {"kind": "save_only_names", "names": ["c"]}), op("mul", ["d", "x"], "y")],
         inputs=[{"id": "x", "shape": [3], "dtype": "float32", "diff": True}])
inputs = {"x": np.array([0.3, -0.7, 1.1], dtype="float32")}
from jax._src import util
misses = []
util.test_event_listener = lambda name, *a: misses.append(name) if name == "xla_primitive_callable_cache_miss" else None
out, counts = {}, {}
for n in ["jax:none", "jax:remat2", "jax:remat3", "jax:remat3+cvjp3", "ref:f64"]:
    before = len(misses)
    o = reg.get(n).run(p, inputs)
    counts[n] = len(misses) - before
    out[n] = o.model_dump(mode="json", exclude={"timings", "versions"})
print(json.dumps({"obs": out, "misses": counts}))
"""


def _run(defaults: bool) -> dict:
    import json
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REMAT_CONFORMANCE_COMPILE_CACHE": "off"}
    env.pop("REMAT_CONFORMANCE_FRAMEWORK_DEFAULTS", None)
    if defaults:
        env["REMAT_CONFORMANCE_FRAMEWORK_DEFAULTS"] = "1"
    r = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_shared_eager_cache_compiles_a_primitive_once_for_every_flag_setting_and_changes_no_observation():
    shared, defaults = _run(False), _run(True)
    # JAX's own cache compiles the eager primitives again under each new flag setting; shared, the
    # remat3 pipelines find every first-order primitive remat2's flags compiled
    assert defaults["misses"]["jax:remat3"] > 0 and defaults["misses"]["jax:remat3+cvjp3"] > 0
    assert shared["misses"]["jax:remat3"] < defaults["misses"]["jax:remat3"]
    assert shared["misses"]["jax:remat3+cvjp3"] < defaults["misses"]["jax:remat3+cvjp3"]
    # ... and every observation is the same: values, gradients, residuals, rule logs (ref:f64 runs
    # under jit there, eagerly under framework defaults: the same float64 values to the ulp)
    for n, o in shared["obs"].items():
        d = defaults["obs"][n]
        if n == "ref:f64":
            for k in ("grads", "outputs"):
                for key in (o[k] if isinstance(o[k], dict) else range(len(o[k]))):
                    assert o[k][key] == pytest.approx(d[k][key], rel=1e-14, abs=1e-300), (n, k)
            assert set(o["values"]) == set(d["values"])
        else:
            assert o == d, n


_JIT_SCRIPT = r"""
import json
from conformance.pipelines.jax import eager_cache
eager_cache.share()
import jax, jax.numpy as jnp
from jax._src import compiler
x = jnp.arange(3.0, dtype=jnp.float32)
compiles, compile_or_get_cached = [], compiler.compile_or_get_cached
compiler.compile_or_get_cached = lambda *a, **k: compiles.append(1) or compile_or_get_cached(*a, **k)
outs = []
for flags in ({}, {}, {"jax_remat3": True}, {"jax_custom_vjp3": True}):
    f = lambda x: jnp.sin(x) * 2.0   # a new function: a new jaxpr of the same text, as a transformation makes
    eqn = jax.make_jaxpr(jax.jit(f))(x).jaxpr.eqns[0]
    for k, v in flags.items():
        jax.config.update(k, v)
    outs.append(eqn.primitive.bind(x, **eqn.params)[0].tolist())
    for k in flags:
        jax.config.update(k, False)
eqn = jax.make_jaxpr(jax.jit(lambda x: jnp.cos(x) * 2.0))(x).jaxpr.eqns[0]   # another text
other = eqn.primitive.bind(x, **eqn.params)[0].tolist()
print(json.dumps({"compiles": len(compiles), "outs": outs, "other": other}))
"""


def _jit_run(defaults: bool) -> dict:
    import json
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REMAT_CONFORMANCE_COMPILE_CACHE": "off"}
    env.pop("REMAT_CONFORMANCE_FRAMEWORK_DEFAULTS", None)
    if defaults:
        env["REMAT_CONFORMANCE_FRAMEWORK_DEFAULTS"] = "1"
    r = subprocess.run([sys.executable, "-c", _JIT_SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_eager_jit_calls_of_equal_first_order_jaxprs_compile_once_for_every_flag_setting():
    shared, defaults = _jit_run(False), _jit_run(True)
    # JAX keys an eager jit call by its jaxpr object and the flags: four compiles of one text, and
    # one of the other; shared, one canonical jaxpr per text, whatever the flags
    assert defaults["compiles"] == 5 and shared["compiles"] == 2, (shared, defaults)
    assert shared["outs"] == defaults["outs"] and len({str(o) for o in shared["outs"]}) == 1
    assert shared["other"] == defaults["other"] != shared["outs"][0]   # another text is not mapped onto it


def test_the_information_table_counts_roots_each_pipeline_detects_alone_and_beyond_its_sibling():
    sys.path.insert(0, str(ROOT / "tools"))
    import information
    info = {"a": {"class": "bug", "programs": 1, "pipelines": {"jax:remat3": 1, "jax:remat3:jit": 1}},
            "b": {"class": "bug", "programs": 2, "pipelines": {"jax:remat3:jit": 2}},
            "c": {"class": "question", "programs": 1, "pipelines": {"torch:compile-aot_eager": 1}},
            "d": {"class": "documented", "programs": 1, "pipelines": {}}}
    rows = {r["pipeline"]: r for r in information.table(info, DEFAULT)}
    assert rows["jax:remat3"]["roots"] == 1 and rows["jax:remat3"]["alone"] == []
    assert rows["jax:remat3:jit"]["alone"] == ["b"] and rows["jax:remat3:jit"]["beyond_sibling"] == ["b"]
    assert rows["torch:compile-aot_eager"]["alone"] == ["c"] and rows["torch:compile-aot_eager"]["sibling"] is None
    assert rows["jax:none"]["sibling"] == "ref:f64"
    import io
    out = io.StringIO()
    information.print_table(list(rows.values()), info, file=out)
    assert "only the pipelines on a share" in out.getvalue() and ": b\n" in out.getvalue()   # b is the twins' alone


_STAGE_SCRIPT = r"""
import json
import numpy as np
import jax._src.interpreters.pxla as pxla
from conformance.pipelines import registry as reg
from conformance.pipelines.jax.pipelines import _array
from tests.programs import op, prog
names, from_hlo = [], pxla.UnloadedMeshExecutable.from_hlo
pxla.UnloadedMeshExecutable.from_hlo = staticmethod(lambda name, *a, **k: names.append(name) or from_hlo(name, *a, **k))
p = prog([op("sin", ["x"], "y")], inputs=[{"id": "x", "shape": [5, 3], "dtype": "bfloat16", "diff": True}])
x = np.linspace(-1, 1, 15).reshape(5, 3)
for n in ["jax:none", "ref:f64"]:
    reg.get(n).run(p, {"x": x})
ran = list(names)
import jax.numpy as jnp
same = all(np.asarray(_array(x, dt)).tobytes() == np.asarray(jnp.asarray(np.asarray(x, dtype=dt))).tobytes()
           for dt in ("bfloat16", "float16", "float32", "float64"))
print(json.dumps({"names": ran, "same": same, "asarray": names[len(ran):]}))
"""


def test_inputs_reach_jax_without_a_compile_and_with_the_same_bits():
    # jnp.asarray of a NumPy array compiles an identity (jit(stage)) per shape and dtype: an XLA compile that
    # tests nothing, in every JAX pipeline's first run of a program
    import json
    env = {**os.environ, "PYTHONPATH": str(ROOT), "REMAT_CONFORMANCE_COMPILE_CACHE": "off"}
    r = subprocess.run([sys.executable, "-c", _STAGE_SCRIPT], capture_output=True, text=True, env=env, cwd=ROOT,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["names"] and "jit(stage)" not in out["names"], out["names"]
    assert out["same"] and "jit(stage)" in out["asarray"]   # (as jnp.asarray of the same arrays does)


def _shaped(progs, *want):
    """The first program among `progs` of each wanted shape: a cond or switch, a loop, a cond in a loop, examples."""
    loops = {"scan", "fori_loop", "while_loop", "vmap"}
    test = {"cond": lambda p: bool({"cond", "switch"} & p.features()),
            "loop": lambda p: bool(loops & p.features()),
            "cond_in_loop": lambda p: bool({"cond", "switch"} & p.features()) and bool(loops & p.features()),
            "examples": lambda p: bool(p.diff.batch)}
    return {w: next(p for p in progs if test[w](p) and not any(f.startswith("effect") for f in p.features()))
            for w in want}


def test_the_float64_reference_records_its_node_values_in_the_one_jit_of_value_and_gradient(monkeypatch):
    # ref:f64 recorded its node values by a jit of their own (a second compile a program), eagerly on a cond (an
    # XLA compile per primitive), and the first eager pipeline recorded the program's own dtypes op by op: now
    # both inside the jit of value and gradient, every branch recorded with a flag
    import jax._src.interpreters.pxla as pxla

    from conformance.pipelines.jax import pipelines as jp
    from generators.programs import input_values
    names, from_hlo = [], pxla.UnloadedMeshExecutable.from_hlo
    monkeypatch.setattr(pxla.UnloadedMeshExecutable, "from_hlo",
                        staticmethod(lambda name, *a, **k: names.append(name) or from_hlo(name, *a, **k)))
    ref = reg.get("ref:f64")
    for what, p in _shaped(_programs(80), "cond", "loop", "cond_in_loop", "examples").items():
        inputs = input_values(p, 0)
        jp._NODE_VALUES.clear()
        del names[:]
        o = ref.run(p, inputs)
        assert o.error is None, (what, o.error)
        assert names[0] == "jit(fwd_bwd)" and len(names) == p.diff.order, (what, names)   # (and the hvp's)
        # ... and the values in the program's own dtypes, which the other JAX pipelines' residuals are matched to
        own = jp._NODE_VALUES[jp._node_values_key(p, inputs, cast_f64=False, traced=False)]
        jp._NODE_VALUES.clear()
        eager = jp.node_values(p, inputs, cast_f64=True)   # the recording evaluation, op by op: branches taken
        assert set(o.values) == set(eager), (what, set(o.values) ^ set(eager))
        for k, v in eager.items():
            assert np.allclose(o.values[k], v, rtol=1e-13, atol=1e-300), (what, k)
        eager = jp.node_values(p, inputs)
        assert set(own) == set(eager) and all(own[k].dtype == v.dtype and _close(own[k], v) for k, v in eager.items())


def test_a_program_with_effects_is_recorded_in_the_same_jit_and_its_callbacks_run_as_often(monkeypatch):
    # A recording ran a callback again, so an effect's program was recorded apart, op by op (an XLA compile per
    # primitive in the first eager pipeline): a recording now runs no callback (Lowering.op), in the one jit
    import jax._src.interpreters.pxla as pxla

    from conformance.pipelines.jax import pipelines as jp
    from generators.programs import input_values
    from tests.programs import op, prog
    names, from_hlo = [], pxla.UnloadedMeshExecutable.from_hlo
    monkeypatch.setattr(pxla.UnloadedMeshExecutable, "from_hlo",
                        staticmethod(lambda name, *a, **k: names.append(name) or from_hlo(name, *a, **k)))
    x = [{"id": "x", "shape": [3], "dtype": "float32", "diff": True}]
    for kind in ("callback", "io_ordered"):
        p = prog([op("sin", ["x"], "s"), op("effect", ["s"], "e", kind=kind), op("exp", ["e"], "y")], inputs=x,
                 outputs=["y"])
        inputs = input_values(p, 0)
        jp._NODE_VALUES.clear()
        del names[:]
        o = reg.get("ref:f64").run(p, inputs)
        assert o.error is None and names == ["jit(fwd_bwd)"], (kind, o.error, names)
        assert o.effects == {kind: 1} and o.effect_sites == {"e": 1}   # forward only, as without a recording
        assert np.allclose(o.values["e"], np.sin(inputs["x"]), rtol=1e-6)
        none = reg.get("jax:none").run(p, inputs)   # the program's own dtypes: recorded there too, no callback
        assert none.effects == o.effects and none.effect_sites == o.effect_sites


def test_a_recording_that_cannot_trace_leaves_the_reference_as_it_was_and_records_apart(monkeypatch):
    import jax

    from conformance.pipelines.jax import pipelines as jp
    from generators.programs import input_values
    p = _shaped(_programs(80), "cond")["cond"]
    inputs = input_values(p, 0)
    ref = reg.get("ref:f64")
    jp._NODE_VALUES.clear()
    plain = ref.run(p, inputs)
    evaluate = jp._evaluate

    def untraceable(program, env, cast_f64):
        if any(isinstance(v, jax.core.Tracer) for v in env.values()):
            raise TypeError("cannot trace")
        return evaluate(program, env, cast_f64)
    monkeypatch.setattr(jp, "_evaluate", untraceable)
    jp._NODE_VALUES.clear()
    apart = ref.run(p, inputs)   # the value and gradient compiled again without it; the values recorded eagerly
    assert apart.error is None and apart.custom_rules == plain.custom_rules
    assert (apart.loss, apart.outputs, apart.grads) == (plain.loss, plain.outputs, plain.grads)
    assert set(apart.values) == set(plain.values)
    assert all(np.allclose(apart.values[k], plain.values[k], rtol=1e-13, atol=1e-300) for k in plain.values)
