"""Program features: the documented vocabulary (docs/reference/features.md, generated) and what a
program has of it. Expectations, signatures, the swarm's coverage table and reports read them.

Program layer: imports the IR and the op table only.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from conformance.ir import ops as O
from conformance.ir import releases
from conformance.ir.nodes import (
    Checkpoint,
    Cond,
    CustomJVP,
    CustomVJP,
    Jit,
    Op,
    Scan,
    children,
    is_name,
    live_values,
    walk,
)
from conformance.ir.ops.core import Feature
from conformance.ir.policy import KINDS, POLICY_KINDS, combines, moves_to_host, offloads

if TYPE_CHECKING:   # (the Program model reads this module)
    from conformance.ir.program import Program

# Features: a documented vocabulary (docs/reference/features.md, generated), each declared once with what a
# campaign's focus needs to generate it (the generator's swarm dimensions: generators.swarm reads them).
# Op features come from the op table (conformance.ir.ops.feature).
FEATURES: dict[str, Feature] = {
    "checkpoint": Feature("at least one checkpoint region"),
    "nested_checkpoint": Feature("a region inside another region", focus=("nesting",)),
    "depth3": Feature("regions nested three deep or more"),
    "nested_policy_conflict": Feature("a region inside another region with a different policy"),
    "prevent_cse_false": Feature("a region with prevent_cse=False"),
    "static_argnums": Feature("a region whose function takes a static argument (static_argnums) it branches on",
                              focus=("region_options",)),
    "region_pytree": Feature("a region whose function takes and returns its values as one tuple or dict",
                             focus=("region_options",)),
    "static_argnames": Feature("a region's static argument declared by name (static_argnames) and passed by keyword",
                               focus=("region_options",), needs=("jax.checkpoint(static_argnames=)",)),
    "static_argnums_negative": Feature("a region's static argument declared by a negative index (static_argnums=(-1,))",
                                       focus=("region_options",)),
    "static_argnum_missing": Feature("a region declares a static argument index that no argument has",
                                     focus=("region_options",)),
    "region_non_tensor_outputs": Feature("a region's function returns non-tensor values after its results (None, an "
                                         "int; PyTorch: a string too)", focus=("non_tensor_outputs",)),
    "static_unhashable": Feature("a region's static argument is unhashable (a list)", focus=("region_options",)),
    "region_state": Feature("a region closes over mutable state (a jax.new_ref) and reads it",
                            focus=("mutable_state",), needs=("jax.new_ref",)),
    "state_write": Feature("a region writes the mutable state it closes over", focus=("mutable_state",),
                           needs=("jax.new_ref",)),
    "state_accumulate": Feature("a region adds to the mutable state it closes over (+=)", focus=("mutable_state",),
                                needs=("jax.new_ref",)),
    "func_transform_in_checkpoint": Feature("jax.grad / torch.func.grad inside a checkpoint region",
                                            focus=(O.FUNC_TRANSFORMS,)),
    "data_dependent_in_checkpoint": Feature("a data-dependent op (a boolean mask, .item()) inside a checkpoint region "
                                            "(under torch.compile, a graph break inside the region)",
                                            focus=(O.DATA_DEPENDENT,)),
    "effect:<kind>": Feature("an effect of this kind (callback, ordered, io, io_ordered)"),
    "effect_in_checkpoint": Feature("an effect inside a checkpoint region (a recompute runs it again)",
                                    focus=("effects",)),
    "io_callback_in_checkpoint": Feature("an io_callback inside a checkpoint region (JAX's remat refuses effects "
                                         "other than debug callbacks: entry jax-checkpoint-refuses-io-effects)",
                                         focus=("effects",)),
    "prevent_cse_tuple": Feature("a region with prevent_cse given per argument (a tuple of bools)",
                                 focus=("prevent_cse",)),
    "offload_in_both": Feature("a both(p, q) policy one of whose parts is of an offloading kind"),
    "offloading": Feature("a policy that can move a value to host memory (an offloading kind with something to "
                          "offload)", needs=("checkpoint offload to pinned_host on the CPU",
                                             "CheckpointPolicy.MUST_CPU_OFFLOAD")),
    "policy:<kind>": Feature("a region uses this policy kind (everything, nothing, dots, ...)"),
    "op:<op>": Feature("the program uses this op (for expectations; not part of signatures)"),
    "names": Feature("checkpoint_name used", needs=("torch.library.custom_op",)),   # (PyTorch: the tag op)
    "dup_names": Feature("the same name on several values"),
    "unread_name": Feature("a named value that nothing reads"),
    "dead_random": Feature("a random op whose value the outputs do not depend on (torch.compile drops it, and later "
                           "draws differ from eager's: entry torch-compile-drops-dead-random-ops)"),
    "names_in_fwd": Feature("checkpoint_name inside a custom_vjp fwd"),
    "custom_vjp": Feature("a custom_vjp block"),
    "custom_vjp_in_checkpoint": Feature("a custom_vjp block inside a checkpoint region",
                                        focus=("custom_vjp", "checkpoint")),
    "symbolic_zeros": Feature("custom_vjp with symbolic_zeros=True"),
    "optimize_remat": Feature("custom_vjp with optimize_remat=True", needs=("defvjp(optimize_remat=)",)),
    "optimize_remat_symbolic_zeros": Feature("one custom_vjp block with both optimize_remat and symbolic_zeros"),
    "effect_in_optimize_remat_fwd": Feature("an effect in the fwd rule of a custom_vjp with optimize_remat=True"),
    "io_effect_in_custom_vjp_fwd": Feature("an io_callback in the fwd rule (and so the primal) of a custom_vjp (jax "
                                           "before 0.12 refuses it under jax_custom_vjp3: expectation "
                                           "jax-before-0.12-cvjp3-refuses-io-callbacks-in-custom-vjp)"),
    "io_effect_in_optimize_remat_fwd": Feature("an io_callback in the fwd rule of a custom_vjp with "
                                               "optimize_remat=True (jax before 0.12 refuses it: expectation "
                                               "jax-before-0.12-optimize-remat-refuses-fwd-effects)"),
    "debug_effect_in_optimize_remat_fwd": Feature("a jax.debug.callback in the fwd rule of a custom_vjp with "
                                                  "optimize_remat=True (jax before 0.6.2 refuses it: expectation "
                                                  "jax-before-0.6.2-optimize-remat-refuses-fwd-debug-callbacks)"),
    "sz_fwd_remat": Feature("a symbolic_zeros custom_vjp inside a checkpoint region whose fwd has checkpoint names "
                            "(remat3 must rematerialise that fwd)"),
    "nondiff_args": Feature("custom_vjp with nondiff arguments"),
    "unused_result": Feature("a custom_vjp result that nothing reads (zero cotangent)"),
    "nondiff_input": Feature("a program input that is not differentiated"),
    "residual_is_arg": Feature("a custom_vjp residual that is one of its args"),
    "residual_is_result": Feature("a custom_vjp residual that is one of its results (an output aliased by a residual)"),
    "perturbed_branch": Feature("a symbolic_zeros custom_vjp whose bwd returns None for the args its fwd saw "
                                "unperturbed"),
    "non_differentiable": Feature("a custom rule result marked non-differentiable (PyTorch: "
                                  "ctx.mark_non_differentiable)", focus=("custom_vjp", "function_options")),
    "once_differentiable": Feature("a custom rule whose PyTorch backward is decorated @once_differentiable",
                                   focus=("custom_vjp", "function_options")),
    "bwd_branch": Feature("a custom rule whose bwd branches on its cotangent's value (PyTorch: a Python if)",
                          focus=("custom_vjp", "function_options")),
    "checkpoint_in_custom_vjp": Feature("a checkpoint region in a custom_vjp fwd rule (PyTorch: in a Function's "
                                        "forward)",
                                        focus=("custom_vjp", "checkpoint", "checkpoint_in_rules")),
    "sequential_regions": Feature("regions without a policy chained on one value, then an op reading it: what "
                                  "checkpoint_sequential spells",
                                  focus=("sequential_regions", "policy:no_policy", "checkpoint")),
    "rule_pytree": Feature("a custom_vjp or custom_jvp taking its args and returning its results (and cotangents or "
                           "tangents) as one tuple or dict", focus=("rule_trees",)),
    "residual_pytree": Feature("custom_vjp residuals passed to bwd as a dict or as nested tuples and dicts",
                               focus=("custom_vjp", "residual_trees")),
    "bwd_none": Feature("a custom_vjp bwd rule that returns None (a zero cotangent) for some argument"),
    "custom_gradient": Feature("a custom rule spelled with jax.custom_gradient (remat=False)"),
    "rule_remat": Feature("a custom rule with a rematerialisation rule: defremat or custom_gradient(remat=True) "
                          "(needs jax_custom_vjp3 and jax_remat3)", needs=("custom_vjp.defremat",
                                                                          "jax.custom_gradient(remat=)")),
    "custom_jvp": Feature("a custom_jvp block"),
    "custom_jvp_in_checkpoint": Feature("a custom_jvp block inside a checkpoint region",
                                        focus=("custom_jvp", "checkpoint")),
    "custom_jvp_in_fwd": Feature("a custom_jvp block inside a custom_vjp fwd rule"),
    "names_in_custom_jvp": Feature("checkpoint names in a custom_jvp body (its jvp rule runs them too)"),
    "scan": Feature("a lax.scan (PyTorch: a Python loop over the body)", focus=("scan",)),
    "fori_loop": Feature("a lax.fori_loop with a static trip count (differentiated; PyTorch: a Python loop)",
                         focus=("scan", "loop_spellings")),
    "while_loop": Feature("a lax.while_loop that no gradient flows into (its inputs under stop_gradient)",
                          focus=("scan", "loop_spellings")),
    "vmap": Feature("jax.vmap of a sub-function over stacked inputs (PyTorch: a Python loop)",
                    focus=("scan", "loop_spellings")),
    "scan_xs": Feature("a scan or vmap over a stacked sequence (its xs, e.g. per-layer weights)",
                       focus=("scan", "scan_xs")),
    "scan_unroll": Feature("a scan or fori_loop with unroll > 1", focus=("scan", "scan_unroll")),
    "checkpoint_in_scan": Feature("a checkpoint region inside a scan, loop or vmap body (the checkpointed layer "
                                  "of a scanned model)", focus=("scan", "checkpoint")),
    "scan_in_checkpoint": Feature("a scan, loop or vmap inside a checkpoint region (jax.checkpoint around a whole "
                                  "scan)",
                                  focus=("scan", "checkpoint")),
    "names_in_scan": Feature("checkpoint names inside a scan, loop or vmap body", focus=("scan", "family:name")),
    "cond": Feature("a lax.cond on a non-differentiated input (PyTorch: a Python if)", focus=("cond",)),
    "switch": Feature("a lax.switch of three branches", focus=("cond", "cond_switch")),
    "checkpoint_in_cond": Feature("a checkpoint region inside a cond branch", focus=("cond", "checkpoint")),
    "cond_in_checkpoint": Feature("a cond inside a checkpoint region", focus=("cond", "checkpoint")),
    "names_in_cond": Feature("checkpoint names inside a cond branch", focus=("cond", "family:name")),
    "nested_jit": Feature("a jax.jit-ted sub-function inside the program (PyTorch: inline)", focus=("nested_jit",)),
    "jit_in_checkpoint": Feature("a jitted sub-function inside a checkpoint region", focus=("nested_jit",)),
    "checkpoint_in_jit": Feature("a checkpoint region inside a jitted sub-function", focus=("nested_jit",)),
    **O.FEATURES,
    "second_order": Feature("a second-order program (H @ ones), in any mode", focus=("second_order",)),
    "fwd_over_rev": Feature("second order as jvp of grad (forward over reverse: a Hessian-vector product)",
                            focus=("second_order", "diff_modes")),
    "rev_over_fwd": Feature("second order as grad of a jvp (reverse over forward)",
                            focus=("second_order", "diff_modes")),
    "linearize": Feature("second order as jax.linearize of grad, applied to ones",
                         focus=("second_order", "diff_modes")),
    "seeded_cotangents": Feature("first order with a non-scalar cotangent per output (a fixed pattern, not ones)",
                                 focus=("seeded_cotangents",)),
    "per_example": Feature("per-example gradients: jax.vmap of value_and_grad over batched inputs, shared ones "
                           "broadcast (PyTorch: a loop over the examples)", focus=("per_example",)),
    "aux_outputs": Feature("outputs returned as aux beside the loss, not differentiated (value_and_grad(has_aux=True))",
                           focus=("aux_outputs",)),
    "forward_ad": Feature("a second-order mode that uses forward-mode AD (fwd_over_rev, rev_over_fwd, linearize)"),
    "float32": Feature("a float32 value"),
    "float64": Feature("a float64 value"),
    "bfloat16": Feature("a bfloat16 value (inputs of that dtype, or a cast to it)"),
    "float16": Feature("a float16 value (inputs of that dtype, or a cast to it)"),
}
FEATURE_DOC: dict[str, str] = {k: f.doc for k, f in FEATURES.items()}
# feature -> the swarm dimensions a program needs on to have it (a campaign round aims at features
# earlier rounds did not generate: conformance.engine.search.Coverage), declaration order
FEATURE_FOCUS: dict[str, tuple[str, ...]] = {k: f.focus for k, f in FEATURES.items() if f.focus}
# feature -> the release APIs it is written with (conformance.ir.releases), policy kinds included
FEATURE_NEEDS: dict[str, tuple[str, ...]] = {
    **{k: f.needs for k, f in {**O.FEATURES, **FEATURES}.items() if f.needs},
    **{f"policy:{k}": d.needs for k, d in KINDS.items() if d.needs},
    "effect:io_ordered": ("io_callback(ordered=True) under jax.grad",),
    "effect:io": ("io_callback(ordered=True) under jax.grad",)}   # (unordered: "IO callbacks do not support JVP")


def lacking_features(frameworks, versions: dict[str, str] | None = None) -> dict[str, list[str]]:
    """Feature -> the APIs of these frameworks it needs that the releases (default: the installed ones) lack."""
    out = {}
    for f, needs in FEATURE_NEEDS.items():
        lack = releases.lacking([n for n in needs if releases.APIS[n].framework in frameworks], versions)
        if lack:
            out[f] = lack
    return out

def known_features() -> set[str]:
    """Every feature name a program can have: the vocabulary with its patterns expanded."""
    return ({k for k in FEATURE_DOC if "<" not in k} | {f"policy:{k}" for k in POLICY_KINDS}
            | {f"op:{o}" for o in O.OPS} | {f"effect:{k}" for k in O.EFFECT_KINDS})


def compute_features(prog: Program) -> set[str]:
    f: set[str] = set()
    types = prog.types()
    name_counts: dict[str, int] = {}
    reads: dict[str, int] = {}
    for s, depth, _, ctx in walk(prog.body):
        for a in s.args:
            reads[a] = reads.get(a, 0) + 1
        if isinstance(s, Checkpoint):
            f.add("checkpoint")
            if ctx == "fwd":
                f.add("checkpoint_in_custom_vjp")
            f.add(f"policy:{s.policy.kind}")
            if combines(s.policy) and offloads(s.policy):
                f.add("offload_in_both")
            if moves_to_host(s.policy):
                f.add("offloading")
            if depth >= 1:
                f.add("nested_checkpoint")
            if depth >= 2:
                f.add("depth3")
            if not s.prevent_cse:
                f.add("prevent_cse_false")
            if s.static_flag:
                f.add("static_argnums")
                f.update({"argnames": ("static_argnames",), "negative_argnums": ("static_argnums_negative",),
                          "missing_argnum": ("static_argnum_missing",)}.get(s.static_by, ()))
                if s.static_value == "unhashable":
                    f.add("static_unhashable")
            if s.prevent_cse_args:
                f.add("prevent_cse_tuple")
            if s.state != "none":
                f.add("region_state")
                if s.state != "read":
                    f.add(f"state_{s.state}")
            if s.tree != "flat":
                f.add("region_pytree")
            if s.extras:
                f.add("region_non_tensor_outputs")
        elif isinstance(s, CustomVJP):
            f.add("custom_vjp")
            if depth >= 1:
                f.add("custom_vjp_in_checkpoint")
            if s.symbolic_zeros:
                f.add("symbolic_zeros")
            kinds = {x.params["kind"] for x, _, _, _ in walk(s.fwd) if isinstance(x, Op) and x.op == O.EFFECT_OP}
            if kinds & set(O.IO_EFFECTS):
                f.add("io_effect_in_custom_vjp_fwd")
            if s.optimize_remat:
                f.add("optimize_remat")
                if s.symbolic_zeros:
                    f.add("optimize_remat_symbolic_zeros")
                if kinds:
                    f.add("effect_in_optimize_remat_fwd")
                    f.update(f"{'io' if k in O.IO_EFFECTS else 'debug'}_effect_in_optimize_remat_fwd" for k in kinds)
            if s.symbolic_zeros and depth >= 1 and any(is_name(x) for x, _, _, _ in walk(s.fwd)):
                f.add("sz_fwd_remat")
            if s.nondiff:
                f.add("nondiff_args")
            if set(s.residuals) & set(s.args):
                f.add("residual_is_arg")
            if set(s.residuals) & set(s.results):
                f.add("residual_is_result")
            # (rule options whose feature is their field's name)
            f.update(k for k in ("perturbed_branch", "non_differentiable", "once_differentiable", "bwd_branch")
                     if getattr(s, k))
            if s.residual_tree != "tuple":
                f.add("residual_pytree")
            if s.tree != "flat":
                f.add("rule_pytree")
            if any(r is None for r in s.bwd_results):
                f.add("bwd_none")
            if s.spelling == "custom_gradient":
                f.add("custom_gradient")
            elif s.spelling in ("defremat", "custom_gradient_remat"):
                f.add("rule_remat")
            for r in s.residuals:
                reads[r] = reads.get(r, 0) + 1
        elif isinstance(s, CustomJVP):
            f.add("custom_jvp")
            if depth >= 1:
                f.add("custom_jvp_in_checkpoint")
            if ctx == "fwd":
                f.add("custom_jvp_in_fwd")
            if any(is_name(x) for x, _, _, _ in walk(s.body)):
                f.add("names_in_custom_jvp")
            if s.tree != "flat":
                f.add("rule_pytree")
        elif isinstance(s, Scan):
            f.add(s.spelling)
            if s.xs:
                f.add("scan_xs")
            if s.unroll > 1:
                f.add("scan_unroll")
            if depth >= 1:
                f.add("scan_in_checkpoint")
            inner = [x for x, _, _, _ in walk(s.body)]
            if any(isinstance(x, Checkpoint) for x in inner):
                f.add("checkpoint_in_scan")
            if any(is_name(x) for x in inner):
                f.add("names_in_scan")
            for r in s.carry_out + s.ys:
                reads[r] = reads.get(r, 0) + 1
        elif isinstance(s, Cond):
            f.add("cond" if len(s.branches) == 2 else "switch")
            if depth >= 1:
                f.add("cond_in_checkpoint")
            inner = [x for b in s.branches for x, _, _, _ in walk(b)]
            if any(isinstance(x, Checkpoint) for x in inner):
                f.add("checkpoint_in_cond")
            if any(is_name(x) for x in inner):
                f.add("names_in_cond")
            for r in (r for rs in s.branch_results for r in rs):
                reads[r] = reads.get(r, 0) + 1
        elif isinstance(s, Jit):
            f.add("nested_jit")
            if depth >= 1:
                f.add("jit_in_checkpoint")
            if any(isinstance(x, Checkpoint) for x, _, _, _ in walk(s.body)):
                f.add("checkpoint_in_jit")
        elif isinstance(s, Op):
            f.add(f"op:{s.op}")
            if is_name(s):
                f.add("names")
                if ctx == "fwd":
                    f.add("names_in_fwd")
                n = s.params["name"]
                name_counts[n] = name_counts.get(n, 0) + 1
            if O.OPS[s.op].family == O.FUNC_TRANSFORMS and depth >= 1:
                f.add("func_transform_in_checkpoint")
            if O.DATA_DEPENDENT_OP in O.OPS[s.op].features and depth >= 1:
                f.add("data_dependent_in_checkpoint")
            if s.op == O.EFFECT_OP:
                f.add(f"effect:{s.params['kind']}")
                if depth >= 1:
                    f.add("effect_in_checkpoint")
                    if s.params["kind"] in O.IO_EFFECTS:
                        f.add("io_callback_in_checkpoint")
            d = O.OPS[s.op]
            if d.features:
                shapes = [types[a][0] for a in s.args]
                f.add(d.batched_feature if d.batched(shapes) else d.features[0])
                f.update(d.features[1:])
    for o in prog.outputs:
        reads[o] = reads.get(o, 0) + 1
    for s, _, _, _ in walk(prog.body):
        if is_name(s) and reads.get(s.out, 0) == 0:
            f.add("unread_name")
        if isinstance(s, (CustomVJP, CustomJVP)) and any(reads.get(r, 0) == 0 for r in s.results):
            f.add("unused_result")
    if sequential_runs(prog):
        f.add("sequential_regions")
    if "random" in f:
        live = live_values(prog)
        if any(isinstance(s, Op) and "random" in O.OPS[s.op].features and s.out not in live
               for s, _, _, _ in walk(prog.body)) or _dead_in_early_iterations(prog):
            f.add("dead_random")
    if any(c > 1 for c in name_counts.values()):
        f.add("dup_names")
    if any(not i.diff for i in prog.inputs):
        f.add("nondiff_input")
    if prog.diff.cotangents == "seeded":
        f.add("seeded_cotangents")
    if prog.diff.aux:
        f.add("aux_outputs")
    if prog.diff.batch:
        f.add("per_example")
    if prog.diff.order == 2:
        f.add("second_order")
        if prog.diff.mode != "reverse":
            f.update((prog.diff.mode, "forward_ad"))
    if _policy_conflict(prog.body, None):
        f.add("nested_policy_conflict")
    for _, dt in types.values():
        f.add(dt)
    return f


def _chain_region(s) -> bool:
    return (isinstance(s, Checkpoint) and KINDS[s.policy.kind].region_only and len(s.args) == 1 and len(s.results) == 1
            and s.tree == "flat" and not s.static_flag)


def sequential_runs(prog: Program) -> dict[int, int]:
    """Runs of the program's top-level statements that a checkpoint_sequential spells exactly: one
    or more regions without a policy, each taking one value (the previous one's single result) and
    exporting one, then a one-argument op reading the last result, every result read only there.
    {first index: index of that op}."""
    body, reads = prog.body, {}
    for a in [a for st in body for a in st.args] + list(prog.outputs):   # (inner statements read through
        reads[a] = reads.get(a, 0) + 1                                   # their container's args)
    out, i = {}, 0
    while i < len(body):
        j = i
        while _chain_region(body[j]) and (j == i or body[j].args == body[j - 1].results) \
                and reads.get(body[j].results[0]) == 1 and j + 1 < len(body):
            j += 1
        last = body[j]
        if j > i and isinstance(last, Op) and last.args == body[j - 1].results:
            out[i] = j
            i = j + 1
        else:
            i += 1
    return out


def _dead_in_early_iterations(prog: Program) -> bool:
    """A random op in a scan body whose value reaches no ys and no carry that a live value of the
    next iteration reads (of 2 or more iterations: every iteration's draw but the last one's is
    dead code), or, in the last iteration, no ys and no final carry the program reads."""
    program_live = None
    for s, _, _, _ in walk(prog.body):
        if not isinstance(s, Scan):
            continue
        if program_live is None:
            program_live = live_values(prog)
        body = [st for st, _, _, ctx in walk(s.body) if isinstance(st, Op)]

        def closure(live):
            changed = True
            while changed:
                changed = False
                for st in body:
                    if st.out in live and not set(st.args) <= live:
                        live |= set(st.args)
                        changed = True
            return live
        # the last iteration: its carries are the scan's final results (live when the program reads them)
        final = {o for o, r in zip(s.carry_out, s.results[:len(s.carry)]) if r in program_live}
        last = closure(set(s.ys) | final)
        # an earlier iteration: what reaches the ys or a carry the last iteration's live values read
        live = closure(set(s.ys) | {o for c, o in zip(s.carry, s.carry_out) if c in last})
        if any("random" in O.OPS[st.op].features and st.out not in (live if s.length > 1 else last) for st in body):
            return True
    return False


def _policy_conflict(body, outer) -> bool:
    """A checkpoint region directly or indirectly inside another whose policy differs from the
    nearest enclosing region's (custom_vjp fwd/bwd bodies included)."""
    for s in body:
        if isinstance(s, Checkpoint):
            if outer is not None and s.policy != outer:
                return True
            if _policy_conflict(s.body, s.policy):
                return True
        elif any(_policy_conflict(b, outer) for _, b, ctx in children(s) if ctx != "jvp"):
            return True
    return False
