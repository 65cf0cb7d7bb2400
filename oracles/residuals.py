"""Residual oracles: saved-residual sets against another pipeline and against the policy.

Named value classes (those containing a checkpoint-named value) are compared exactly;
other residuals by the multiset of (shape, dtype, whether it is a program input) and by total
bytes: saving an input where the reference saves a value computed from it (recomputing more) is a
difference even where the two have one shape.
"""
from __future__ import annotations

from collections import Counter

import numpy as np

from conformance.ir.dtypes import LOW_PRECISION, match_tol
from conformance.ir.interpreter import output_cotangents
from conformance.ir.nodes import (
    DERIVATIVE_CTX,
    Checkpoint,
    Op,
    base_id,
    checkpoint_name_of,
    input_elements,
    live_values,
    primal_ops,
    walk,
)
from conformance.ir.observation import Observation, Residual
from conformance.ir.ops import OPS, dropout_mask
from conformance.ir.policy import decide, judged_by_meaning, saves_everything, saves_unnamed
from conformance.ir.program import Program
from conformance.ir.verdict import Verdict
from conformance.pipelines import registry
from oracles.missing import missing, skip_unless
from oracles.residual_causes import causes


def _key(r: Residual, inputs: frozenset[str]) -> tuple:
    """What a residual is compared by: a named one by its value class, another by shape, dtype and input-ness."""
    return tuple(r.cls) if r.names else (tuple(r.shape), r.dtype, _INPUT if inputs.intersection(r.cls) else "")


def _named(res: list[Residual]) -> Counter:
    return Counter(_key(r, frozenset()) for r in res if r.names)


def _other(res: list[Residual], inputs: frozenset[str]) -> Counter:
    return Counter(_key(r, inputs) for r in res if not r.names)


_INPUT = " (a program input)"


def describe(res: list[Residual]) -> list[str]:
    return [r.describe() for r in res]


def compare(obs: Observation, ref: Observation, named_only: bool = False,
            inputs: frozenset[str] = frozenset(), program: Program | None = None) -> Verdict:
    """`inputs`: the program's input ids (an unnamed residual that is one is told apart; the `program`'s by
    default). With the `program`, a difference names its causes (oracles.residual_causes) in the detail."""
    if program is not None and not inputs:
        inputs = frozenset(i.id for i in program.inputs)
    v = Verdict(check="residuals", pipeline=obs.pipeline, reference=ref.pipeline, status="pass")
    if skip_unless(v, "residuals", obs, ref):
        return v
    a, b = _named(obs.residuals), _named(ref.residuals)
    missing = sorted("/".join(c) for c in (b - a).elements())
    extra = sorted("/".join(c) for c in (a - b).elements())
    detail: dict = {}
    if missing or extra:
        detail.update(missing_named=missing, extra_named=extra)
    if not named_only:
        oa, ob = _other(obs.residuals, inputs), _other(ref.residuals, inputs)
        if oa != ob:
            detail.update(missing_other=[f"{d}{list(s)}{i}" for s, d, i in sorted((ob - oa).elements())],
                          extra_other=[f"{d}{list(s)}{i}" for s, d, i in sorted((oa - ob).elements())])
        ba = sum(r.bytes for r in obs.residuals)
        bb = sum(r.bytes for r in ref.residuals)
        if ba != bb:
            detail.update(bytes=ba, reference_bytes=bb)
    if detail:
        v.status = "fail"
        v.error_type = "missing" if missing and not extra else "extra" if extra and not missing else (
            "named" if missing or extra else "other")
        v.detail = {**detail, "saved": describe(obs.residuals), "reference_saved": describe(ref.residuals)}
        if program is not None:
            v.detail["causes"] = causes(program, v.detail, obs.pipeline)
    return v


def _saves_factors(policies: list) -> bool:
    """Whether an op under these enclosing policies may have its own derivative factor saved:
    outside every region, or under a policy that saves ops other than names and dots (JAX's
    cos(x) rule emits a sin primitive, which a policy saving sin keeps)."""
    return not policies or any(map(saves_unnamed, policies))


def _factor_ops(program: Program, policies: dict, anywhere: bool = False):
    """The ops that may have their own derivative factor saved (_saves_factors, or `anywhere`:
    a partitioner that may move any backward op into the forward) and declare it."""
    return (s for s, _, _, ctx in walk(program.body) if isinstance(s, Op) and OPS[s.op].outside_factors
            and ctx not in DERIVATIVE_CTX and (anywhere or _saves_factors(policies.get(s.out) or [])))


def _derivative_factors(program: Program, policies: dict, values: dict, anywhere: bool = False) -> list[np.ndarray]:
    """Values that ops may save for their own backward (cos(x) for sin(x), ...) where their
    policies allow it (_saves_factors), which can equal a program value inside a region by
    coincidence (sin(0) = 0 = x - x)."""
    out = []
    iterations: dict[str, list[str]] = {}   # a value's id -> its keys (`v@i`: one per scan iteration)
    for k in values:
        iterations.setdefault(base_id(k), []).append(k)
    for s in _factor_ops(program, policies, anywhere):
        for k in iterations.get(s.args[0], []):
            y = s.out + k[len(s.args[0]):]   # the same iteration's output
            if y in values:
                out += OPS[s.op].outside_factors(np.asarray(values[k], np.float64), np.asarray(values[y], np.float64))
    return out


def _partitioned(pipeline: str) -> bool:
    """Whether a partitioner (torch.compile) chooses what the pipeline saves."""
    try:
        return registry.spec(pipeline).compile is not None
    except registry.UnknownPipeline:
        return False


def _saved_constants(program: Program, pipeline: str = "") -> list[np.ndarray]:
    """Constants that a pipeline saves for its backward: the seeded cotangents (the loss is
    sum(output * pattern)) and, in JAX, dropout's masks (the lowering multiplies by a constant;
    the make run of this stop: a mask of zeros equal to the dropout's output), which can equal
    a program value by coincidence."""
    out = []
    if program.diff.cotangents == "seeded":
        out += [np.asarray(c, np.float64) for c in output_cotangents(program) or []]
    if registry.framework_of(pipeline) == "jax":
        types = program.types()
        out += [dropout_mask(types[s.args[0]][0], s.params["p"], s.params["seed"])
                for s, _, _, _ in walk(program.body) if isinstance(s, Op) and s.op == "dropout"]
    return out


def _aliases(value, shape, factors, *dtypes: str) -> bool:
    """Whether a saved array of `shape` classed as `value` may be one of the factors: a factor of
    the saved array's shape equal to the value within twice the residual matching tolerance of
    the saved array's and the value's dtypes (sin(x) is x within bfloat16's for small x). (A value
    of one element classes saved arrays of any shape of one element.)"""
    v = np.asarray(value, np.float64).ravel()
    tol = 2 * match_tol(*dtypes)
    return any(f.shape == tuple(shape) and f.size == v.size
               and np.allclose(f.ravel(), v, rtol=max(tol, 1e-6), atol=max(tol, 1e-9)) for f in factors)


def judged_against_no_checkpoint(name: str, present) -> bool:
    """Whether a pipeline's saving policies are judged against the no-checkpoint baseline (check_policy's `none`):
    JAX's implementation that no other of its semantics is compared with (remat2, the residual reference; on a
    release before remat3 the only one), eager like the baseline."""
    base = registry.baseline_of(name)
    return (registry.framework_of(name) == "jax" and base is not None and registry.same_mode(name, base)
            and not any(m == registry.CompareMode.SAME for _, m in registry.comparisons(name, present)))


# The programs judged against the no-checkpoint baseline: regions of ops, first-order reverse mode, every op's output
# live. Elsewhere the baseline keeps residuals JAX does not need, which a region drops whatever its policy (measured
# on pinned jax with every region set to everything_saveable): dead code's derivative factors, an op's own
# (OpDecl.baseline_keeps); loops, conds, custom rules and jit add their own.


def saves_everywhere(program: Program) -> bool:
    """Whether the program is one the no-checkpoint baseline judges (plain reverse mode, every op's output live, no
    op whose baseline keeps extra residuals) and every checkpoint region of it is under a policy that saves every
    value (saves_everything)."""
    d = program.diff
    if (d.order, d.mode, d.batch) != (1, "reverse", 0):
        return False
    stmts = [(s, ctx) for s, _, _, ctx in walk(program.body)]
    if not all(isinstance(s, Checkpoint) or (isinstance(s, Op) and OPS[s.op].baseline_keeps != "extra")
               for s, _ in stmts):
        return False
    regions = [s for s, _ in stmts if isinstance(s, Checkpoint)]
    if not regions or not all(saves_everything(s.policy) for s in regions):
        return False
    live = live_values(program)
    return all(s.out in live for s, _ in stmts if isinstance(s, Op))


def _recomputed_against_saving_policies(program: Program, obs: Observation, none: Observation) -> list[Residual]:
    """What the no-checkpoint baseline saves that the pipeline does not, where every region's policy saves every
    value: the region then keeps what the program keeps without it, so each such value was recomputed against the
    policy (jax before 0.4.38: save_from_both_policies(save_and_offload_only_these_names([], []),
    everything_saveable) ignored its second policy and recomputed everything). Compared as `compare` does."""
    if none.residuals is None or not saves_everywhere(program):
        return []
    inputs = frozenset(i.id for i in program.inputs)
    # (where an op takes a constant operand (baseline_keeps), an unmatched scalar may be that constant, which the
    # no-checkpoint program saves and a region keeps in its jaxpr: left out on both sides)
    consts = any(isinstance(s, Op) and OPS[s.op].baseline_keeps == "constant" for s, _, _, _ in walk(program.body))
    base, got = ([r for r in rs if r.cls or r.shape or not consts] for rs in (none.residuals, obs.residuals))
    left = Counter(_key(r, inputs) for r in base) - Counter(_key(r, inputs) for r in got)
    out = []
    for r in base:
        if left[_key(r, inputs)] > 0:
            left[_key(r, inputs)] -= 1
            out.append(r)
    return out


def check_policy(program: Program, obs: Observation, ref: Observation | None = None,
                 none: Observation | None = None) -> Verdict:
    """No value that every enclosing policy says to recompute may be saved.

    With the value reference's observation (its recorded node values), a saved value that
    equals what an op saves for its own backward where its policies allow that (outside every
    region, or under a policy saving other ops than names and dots) is not blamed; when
    the value reference failed (no node values), a violation on a program with such ops is
    skipped rather than blamed.

    Under a cond, a saved class of zeros is not blamed either: lax.cond saves zeros in place of
    the residuals of the branch it did not take. Nor is an unnamed class of a 16-bit dtype (the
    saved array's or the value's): matched within a few bfloat16/float16 ulps, it equals too many
    values a pipeline may legitimately save (derivative factors, the loss's constants, a
    primitive's intermediates); named classes are judged in every dtype.

    A saved class is a violation when each of its values lies inside checkpoint regions,
    is none of the values a region or block boundary may legitimately keep, and every
    enclosing policy decides 'recompute' for it (a name op is judged by its name).

    The other way: a value the pipeline's policy asked it to save that it recomputes instead
    (Observation.recomputed_against_policy: what eager SAC's cache holds as to recompute after
    an op its policy_fn marked MUST_SAVE or PREFER_SAVE; what a torch.compile partitioner's backward
    graph computes again of a node the policy marked MUST_SAVE) is a violation too; so is, with `none` (the
    no-checkpoint baseline's observation, given for judged_against_no_checkpoint's pipelines), a value the baseline
    saves that the pipeline does not where every region's policy saves every value."""
    v = Verdict(check="residuals", pipeline=obs.pipeline, reference="policy", status="pass")
    if skip_unless(v, "residuals", obs):
        return v
    policies, exempt = program.analysis().contexts
    values = (ref.values or {}) if ref is not None else {}
    # torch.compile's partitioner may compute a backward op (cos(x) for sin(x)) in the forward and
    # save it: no policy decides on ops autograd creates (the CI gate's torch campaign: cos(0) = 1 =
    # exp(0), a dead value in a scan, blamed on torch:compile-aot_eager)
    partitioned = _partitioned(obs.pipeline)
    factors = ((_derivative_factors(program, policies, values, partitioned) if values else [])
               + _saved_constants(program, obs.pipeline))
    types = program.types()
    ops = primal_ops(program)
    conds = bool({"cond", "switch"} & program.features())
    bad = []
    for r in obs.residuals:
        value_dtype = types[base_id(r.cls[0])][1] if r.cls and base_id(r.cls[0]) in types else None
        if not r.cls or (not r.names and {r.dtype, value_dtype} & set(LOW_PRECISION)):
            continue   # unnamed and matched within a 16-bit tolerance: too many values coincide there
        ok_to_save = False
        for i in map(base_id, r.cls):   # an iteration's value is judged as the value
            if i in exempt or i not in policies or not policies[i] or not judged_by_meaning(
                    policies[i], bool(program.diff.batch)):
                ok_to_save = True
                break
            s = ops[i]
            batched = OPS[s.op].batched([types[a][0] for a in s.args])
            n = input_elements(s, types)
            if any(decide(p, s.op, checkpoint_name_of(s), batched, n) != "recompute" for p in policies[i]):
                ok_to_save = True
                break
        if (not ok_to_save and factors and r.cls[0] in values
                and _aliases(values[r.cls[0]], r.shape, factors, r.dtype, value_dtype)):
            ok_to_save = True   # indistinguishable from a derivative factor an op may save
        if not ok_to_save and conds and r.cls[0] in values and not np.any(np.asarray(values[r.cls[0]])):
            ok_to_save = True   # indistinguishable from the zeros a cond saves for the branch it did not take
        if not ok_to_save:
            bad.append(r)
    if bad and ref is not None and not ref.ok() and any(_factor_ops(program, policies, partitioned)):
        # The value reference failed: without its node values a derivative factor an op may
        # save cannot be told apart from an equal-valued region value.
        v.status = "skipped"
        v.detail = {"reason": f"{missing(ref, 'node_values')}: cannot tell an outside op's residual "
                              f"from an equal region value"}
        return v
    if bad:
        v.status = "fail"
        v.error_type = "saved_against_policy"
        v.detail = {"saved_against_policy": describe(bad), "saved": describe(obs.residuals)}
        v.detail["causes"] = causes(program, v.detail, obs.pipeline)
        return v
    recomputed = _recomputed_against_saving_policies(program, obs, none) if none is not None else []
    if recomputed:
        v.status = "fail"
        v.error_type = "recomputed_against_policy"
        v.detail = {"recomputed_against_policy": describe(recomputed), "saved": describe(obs.residuals),
                    "reference_saved": describe(none.residuals), "no_checkpoint": none.pipeline}
        v.detail["causes"] = causes(program, v.detail, obs.pipeline)
        return v
    if obs.recomputed_against_policy or obs.flags.get("recomputed_ops"):
        # asked to save, recomputed (eager SAC's cache; a partitioner's backward graph: pipelines.torch)
        v.status = "fail"
        v.error_type = "recomputed_against_policy"
        v.detail = {"recomputed_against_policy": describe(obs.recomputed_against_policy or []),
                    "aten_ops": list(obs.flags.get("recomputed_ops", [])), "saved": describe(obs.residuals)}
        v.detail["causes"] = causes(program, v.detail, obs.pipeline)
        return v
    # (a partitioner may save any layout of what the backward reads: eager pipelines are checked)
    layout = [] if partitioned else _views_in_another_layout(program, obs, policies, types, ops, values)
    if layout:
        v.status = "fail"
        v.error_type = "view_layout"
        v.detail = {"view_in_another_layout": layout, "saved": describe(obs.residuals)}
    return v


def _views_in_another_layout(program: Program, obs: Observation, policies: dict, types: dict, ops: dict,
                             values: dict | None = None) -> list[str]:
    """A view a policy saves (transpose, reshape, slice, select...) is checked exactly, not modulo
    layout: what is saved must be the view itself or a value it views (its base, recomputed from),
    element for element in its own shape. Each saved array of more than one element whose class
    holds such a view but which equals no program value in its own layout is described. A class
    of zeros is not (any zero residual, a factor an op saves, equals it in some layout: the
    issue-32 campaign's x * max(x) of zeros, per example)."""
    out = []
    values = values or {}
    for r in obs.residuals:
        if r.exact or not r.cls or int(np.prod(r.shape)) <= 1:
            continue
        if r.cls[0] in values and not np.any(np.asarray(values[r.cls[0]])):
            continue
        views = []
        for i in map(base_id, r.cls):
            s = ops.get(i)
            if s is None or not OPS[s.op].view or not policies.get(i):
                continue
            batched = OPS[s.op].batched([types[a][0] for a in s.args])
            if any(decide(p, s.op, None, batched, input_elements(s, types)) == "save" for p in policies[i]):
                if not _unsqueezed(r.shape, types[i][0]):
                    views.append(i)
        if views:
            out.append(f"{r.describe()} equals the saved view(s) {views} only in another layout")
    return out


def _unsqueezed(saved, view) -> bool:
    """Whether a saved shape is the view's with unit axes added: an op of several primitives, a slice then a
    squeeze (index_in_dim), whose slice a policy saves, keeps the view with its unit axis (the same layout)."""
    def squeezed(shape):
        return [int(d) for d in shape if int(d) != 1]
    return len(saved) > len(view) and squeezed(saved) == squeezed(view)
