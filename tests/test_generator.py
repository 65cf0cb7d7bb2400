"""The program generator: valid by construction, swarm testing (every feature both on and off,
none crowding out the rest), and shrinking to small programs."""
import collections
import random
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import seed as hseed

from conformance.ir import ops as O
from conformance.ir.nodes import DERIVATIVE_CTX, Checkpoint, CustomJVP, CustomVJP, Op, walk
from conformance.ir.policy import KINDS, offloads
from conformance.ir.program import validate
from generators.programs import DIMS, RARE_DIMS, Config, op_families, programs, swarm_dimensions, swarms

SAMPLE = 300


@lru_cache(maxsize=None)
def sample(cfg=None, n=SAMPLE, seed=0):
    """A fixed, seeded sample of generated programs (as the campaign draws them)."""
    out = []

    @hseed(seed)
    @settings(max_examples=n, database=None, deadline=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(programs(cfg and Config(**dict(cfg))))
    def collect(p):
        out.append(p)
    collect()
    return tuple(out[:n])


def regions(p):
    return [s for s, *_ in walk(p.body) if isinstance(s, Checkpoint)]


def blocks(p):
    return [s for s, *_ in walk(p.body) if isinstance(s, CustomVJP)]


def jvp_blocks(p):
    return [s for s, *_ in walk(p.body) if isinstance(s, CustomJVP)]


def primal_ops(p):
    return [s for s, _, _, ctx in walk(p.body) if isinstance(s, Op) and ctx not in DERIVATIVE_CTX]


def primal_size(p):
    """Statements outside custom rules' derivative code and outside a cond's later branches
    (derived from the primal code and the first branch, not drawn)."""
    return sum(1 for _, _, path, ctx in walk(p.body) if ctx not in DERIVATIVE_CTX and not _later_branch(path))


def _later_branch(path: str) -> bool:
    return any(not part.startswith("[0]") for part in path.split(".branches")[1:])


def dead_values(p):
    """Op values nothing reads: no statement, custom_vjp rule or program output."""
    read = set(p.outputs)
    for s, *_ in walk(p.body):
        read.update(s.args)
        if isinstance(s, CustomVJP):
            read.update(s.residuals)
            read.update(r for r in s.bwd_results if r)
        read.update(getattr(s, "carry_out", []) + getattr(s, "ys", []))   # a scan's
        read.update(r for rs in getattr(s, "branch_results", []) for r in rs)   # a cond's
        if isinstance(s, CustomJVP):
            read.update(s.jvp_results)
    return [s.out for s in primal_ops(p) if s.out not in read]


def nonstandard_rule(p):
    return any(
        s.op == O.SCALE_OP and s.params.get("c") == 3.0 and s.out in b.bwd_results for b in blocks(p) for s in b.bwd
    ) or any(
        s.op == O.SCALE_OP and s.params.get("c") == 3.0 and s.out in b.jvp_results for b in jvp_blocks(p) for s in b.jvp
    )


def families(p):
    return {O.OPS[s.op].family for s in primal_ops(p)}


# How each swarm dimension shows in a program. Policy kinds and op families are derived from the
# declarations, so that kinds and families added later are checked too.
SHOWS = {
    "checkpoint": lambda p: bool(regions(p)),
    "nesting": lambda p: "nested_checkpoint" in p.features(),
    "prevent_cse": lambda p: "prevent_cse_false" in p.features(),
    "custom_vjp": lambda p: bool(blocks(p)),
    "custom_jvp": lambda p: bool(jvp_blocks(p)),
    "rule_spellings": lambda p: any(b.spelling != "defvjp" for b in blocks(p)),
    "residual_trees": lambda p: "residual_pytree" in p.features(),
    "perturbed_branch": lambda p: "perturbed_branch" in p.features(),
    "symbolic_zeros": lambda p: "symbolic_zeros" in p.features(),
    "optimize_remat": lambda p: "optimize_remat" in p.features(),
    "nondiff_args": lambda p: "nondiff_args" in p.features(),
    "nonstandard_rules": nonstandard_rule,
    "unused_results": lambda p: "unused_result" in p.features(),
    "extra_inputs": lambda p: len(p.inputs) > 1,
    "nondiff_inputs": lambda p: "nondiff_input" in p.features(),
    "dead_values": lambda p: bool(dead_values(p)),
    "second_order": lambda p: p.diff.order == 2,
    "scan": lambda p: bool({"scan", "fori_loop", "while_loop", "vmap"} & p.features()),
    "loop_spellings": lambda p: bool({"fori_loop", "while_loop", "vmap"} & p.features()),
    "scan_xs": lambda p: "scan_xs" in p.features(),
    "scan_unroll": lambda p: "scan_unroll" in p.features(),
    "diff_modes": lambda p: p.diff.mode != "reverse",
    "nested_jit": lambda p: "nested_jit" in p.features(),
    "cond": lambda p: bool({"cond", "switch"} & p.features()),
    "cond_switch": lambda p: "switch" in p.features(),
    "seeded_cotangents": lambda p: p.diff.cotangents == "seeded",
    "region_options": lambda p: bool({"static_argnums", "region_pytree"} & p.features()),
    "aux_outputs": lambda p: p.diff.aux > 0,
    "rule_trees": lambda p: "rule_pytree" in p.features(),
    "per_example": lambda p: p.diff.batch > 0,
    "function_options": lambda p: bool({"non_differentiable", "once_differentiable", "bwd_branch"} & p.features()),
    "checkpoint_in_rules": lambda p: "checkpoint_in_custom_vjp" in p.features(),
    "sequential_regions": lambda p: "sequential_regions" in p.features(),
    "mutable_state": lambda p: "region_state" in p.features(),
    "effects": lambda p: "effects" in p.features(),
    "multi_output": lambda p: "multi_output_op" in p.features(),
    "data_dependent": lambda p: "data_dependent_op" in p.features(),
    "non_tensor_outputs": lambda p: "region_non_tensor_outputs" in p.features(),
    "func_transforms": lambda p: "func_transform_op" in p.features(),
    **{f"policy:{k}": (lambda k: lambda p: any(r.policy.kind == k for r in regions(p)))(k) for k in KINDS},
    **{f"family:{f}": (lambda f: lambda p: f in families(p))(f)
       for f in op_families() + O.generated_families(True, True)},
    **{f"dtype:{d}": (lambda d: lambda p: p.inputs[0].dtype == d)(d) for d in Config().dtypes},
}


def test_swarm_dimensions_are_derived_from_the_declarations():
    dims = set(swarm_dimensions())
    assert {f"policy:{k}" for k in list(KINDS)[1:]} <= dims
    assert {f"family:{f}" for f in op_families()[1:]} <= dims
    assert set(O.generated_families(False)) <= set(op_families())
    assert dims <= set(SHOWS), dims - set(SHOWS)


@given(programs())
def test_generated_programs_validate(p):
    assert validate(p) is p
    assert p.size() >= 1
    x0 = p.inputs[0]   # inputs that op hints add (matmul weights) take their shapes from values
    assert all(d in DIMS + RARE_DIMS for d in x0.shape) and len(x0.shape) <= 3


@pytest.mark.parametrize("dim", sorted(SHOWS))
def test_every_swarm_dimension_occurs_on_and_off(dim):
    # every dimension is drawn by default, the composition round's included (no construct only under --require)
    shows = [SHOWS[dim](p) for p in sample()]
    assert any(shows), f"{dim} never occurs in {SAMPLE} programs"
    assert not all(shows), f"{dim} occurs in every program"


def test_no_feature_crowds_out_the_rest():
    progs = sample()
    share = {d: sum(map(SHOWS[d], progs)) / len(progs) for d in SHOWS}
    assert share["custom_vjp"] < 0.5, share
    assert share["checkpoint"] > 0.3, share
    # simple programs of every kind: plain programs, and small ones with each structure
    sizes = [p.size() for p in progs]
    assert sum(s <= 3 for s in sizes) >= 0.1 * len(progs)
    assert any(len(p.body) == 1 and isinstance(p.body[0], Op) for p in progs)
    assert any(not regions(p) and not blocks(p) for p in progs)
    for d in ("checkpoint", "custom_vjp"):
        assert any(SHOWS[d](p) and primal_size(p) <= 3 for p in progs), d
    # outputs are meaningful: most programs have no dead code at all
    assert sum(not dead_values(p) for p in progs) > 0.5 * len(progs)


def test_programs_are_mostly_distinct():
    progs = sample()
    assert len({p.content_hash() for p in progs}) > 0.85 * len(progs)


def test_shapes_come_from_a_small_vocabulary():
    # eager JAX compiles one kernel per (primitive, shape, dtype, params): few shapes, fast runs
    shapes = collections.Counter(tuple(i.shape) for p in sample() for i in p.inputs)
    assert sum(n for _, n in shapes.most_common(10)) > 0.6 * sum(shapes.values())
    dims = collections.Counter(d for s in shapes.elements() for d in s)
    assert dims[2] + dims[3] > 2 * (dims[1] + dims[4]) > 0


CONFIGS = {
    "no custom_vjp": (dict(custom_vjp=False), lambda p: not blocks(p)),
    "no checkpoint": (dict(checkpoint=False), lambda p: not regions(p)),
    "first order": (dict(second_order=False), lambda p: p.diff.order == 1),
    "no offload": (dict(offload_policies=False), lambda p: not any(offloads(r.policy) for r in regions(p))),
    "float64": (dict(dtypes=("float64",)), lambda p: all(i.dtype == "float64" for i in p.inputs)),
    "depth 1": (dict(max_depth=1), lambda p: "nested_checkpoint" not in p.features()),
    "no custom_jvp": (dict(custom_jvp=False), lambda p: not jvp_blocks(p)),
    "small": (dict(max_stmts=2, max_inputs=2), lambda p: len(p.inputs) <= 2 and primal_size(p) <= 4 * 2),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_switches_features_off(name):
    kw, holds = CONFIGS[name]
    progs = sample(tuple(sorted(kw.items())), n=60)
    assert progs
    for p in progs:
        assert holds(p), p.to_json()


@given(swarms(Config(custom_vjp=False, checkpoint=False)))
def test_config_forces_swarm_flags_off(sw):
    assert not sw["custom_vjp"] and not sw["symbolic_zeros"] and not sw["checkpoint"] and not sw["nesting"]
    assert not any(sw[f"policy:{k}"] for k in KINDS)


# ---- shrinking ------------------------------------------------------------------------------
def smallest(pred, cfg=None, strategy=None):
    s = settings(settings.default, max_examples=3000, database=None, deadline=None, derandomize=False,
                 suppress_health_check=list(HealthCheck), phases=(Phase.generate, Phase.shrink))
    return find(programs(cfg) if strategy is None else strategy, pred, settings=s, random=random.Random(0))


def shrunk(pred, cfg=None):
    """What a campaign makes of a finding: Hypothesis's shrink, then the IR reductions
    (conformance.engine.reduce) kept while the predicate holds."""
    from conformance.engine.reduce import candidates
    p = smallest(pred, cfg)
    while (q := next((c for c in candidates(p) if pred(c)), None)) is not None:
        p = q
    return p


def test_swarm_flags_shrink_to_the_plain_form():
    sw = smallest(lambda sw: sw["checkpoint"] and sw["policy:both"] and sw["family:matmul"], strategy=swarms())
    assert sorted(n for n, on in sw.on.items() if on) == ["checkpoint", "family:matmul", "policy:both"]
    assert sw.dtype == Config().dtypes[0]


SHRINK_TARGETS = {
    # name: (predicate, the largest acceptable shrunk size counted without derived bwd rules[, with them;
    # default: 3 more])
    "region with policy " + list(KINDS)[0]: (lambda p: any(r.policy.kind == list(KINDS)[0] for r in regions(p)), 2),
    "region with policy both": (lambda p: any(r.policy.kind == "both" for r in regions(p)), 2),
    "region with policy save_and_offload_names":
        (lambda p: any(r.policy.kind == "save_and_offload_names" for r in regions(p)), 2),
    "custom_vjp with symbolic zeros": (lambda p: any(b.symbolic_zeros for b in blocks(p)), 2),
    "nested region": (lambda p: "nested_checkpoint" in p.features(), 3),
    # two blocks around one op; a bwd rule and a jvp rule of two statements each, and each may keep
    # its deliberate scale (the nonstandard_rules swarm dimension): 9 in all
    "custom_jvp in a custom_vjp fwd": (lambda p: "custom_jvp_in_fwd" in p.features(), 3, 9),
    "symbolic zeros with a named fwd in a region": (lambda p: "sz_fwd_remat" in p.features(), 3),
    "region inside a scan": (lambda p: "checkpoint_in_scan" in p.features(), 3),
    "second order in forward over reverse": (lambda p: p.diff.mode == "fwd_over_rev", 1),
    "matmul inside a region": (lambda p: any(s.op == "matmul" for r in regions(p) for s in r.body
                                             if isinstance(s, Op)), 3),   # on a vector: broadcast first
}


@pytest.mark.parametrize("name", sorted(SHRINK_TARGETS))
def test_shrinks_to_a_small_program(name):
    pred, limit, *size_limit = SHRINK_TARGETS[name]
    p = shrunk(pred)
    assert pred(p)
    assert primal_size(p) <= limit, p.to_json()
    assert p.size() <= (size_limit[0] if size_limit else limit + 3), p.to_json()


@pytest.mark.parametrize("n", [6, 10])
def test_statements_are_deleted_one_at_a_time(n):
    # the shrinker can take any statement away, not only the last ones (and past the statement
    # budget too): a program of at least n statements with a region and a block shrinks to n
    def pred(p):
        return primal_size(p) >= n and regions(p) and blocks(p)
    p = smallest(pred)
    assert primal_size(p) == n, p.to_json()


def test_structures_shrink_independently():
    # two blocks and a region side by side: each shrinks to one op, nothing else is left (a region
    # of the item stream beside the blocks: the derived checkpoint_sequential tail, or a region in a
    # block's fwd, is one more structure)
    def pred(p):
        return (sum(isinstance(s, CustomVJP) for s in p.body) >= 2 and any(isinstance(s, Checkpoint) for s in p.body)
                and not {"sequential_regions", "checkpoint_in_custom_vjp"} & p.features())
    p = smallest(pred)
    assert len(p.body) == 3 and primal_size(p) == 6, p.to_json()


# -- focus (coverage-directed rounds) --------------------------------------------------------
def test_focus_declarations_name_features_and_dimensions():
    from conformance.ir.features import FEATURE_DOC
    from generators.swarm import FOCUS, focus_features
    for f, dims in FOCUS.items():
        assert f in FEATURE_DOC or f.split(":")[0] + ":<kind>" in FEATURE_DOC, f
        assert set(dims) <= set(swarm_dimensions()), (f, dims)
    assert {f"policy:{k}" for k in KINDS} <= set(FOCUS)
    # a config that cannot generate a feature does not aim at it
    assert "while_loop" not in focus_features(Config(scan=False)) and "float16" not in focus_features(
        Config(dtypes=("float32",)))


@pytest.mark.parametrize("feature", ["checkpoint_in_jit", "while_loop", "linearize", "policy:no_policy", "float16",
                                     "static_argnums", "static_argnames", "static_argnum_missing", "prevent_cse_tuple",
                                     "region_state", "state_accumulate"])
def test_a_focused_program_has_its_feature(feature):
    """Half of a focused round's programs aim at one feature; those have it (rare ones: 3-5% of
    unfocused programs)."""
    from dataclasses import replace

    from generators.programs import cases
    got = []

    @hseed(7)
    @settings(max_examples=30, deadline=None, database=None, phases=(Phase.generate,),
              suppress_health_check=list(HealthCheck))
    @given(cases(replace(Config(), focus=(feature,))))
    def run(case):
        got.append(feature in case[0].features())

    run()
    assert sum(got) >= 0.4 * len(got), (feature, sum(got), len(got))


def test_every_focus_feature_occurs_within_three_rounds():
    """What a default campaign generates in its first three rounds (120 programs) covers every
    focus feature: round 0 as drawn, rounds 1 and 2 aimed at what the earlier rounds missed."""
    from conformance.engine.options import Options
    from conformance.engine.search import Coverage
    for seed in range(4):
        cov = Coverage(Options(pipelines=[], seed=seed))
        assert cov.focus(0) == ()
        assert not set(cov.features) & cov.generated(0) & set(cov.focus(1))
        assert cov.focus(3) == (), (seed, cov.focus(3))
