"""Type checking of the program IR: every id defined once and read where it is visible, op
shapes inferred from the op table, regions, custom rules and scans well formed, the limits
held. conformance.ir.program.validate and Program.types call it; it raises ProgramError naming the field.

Program layer: imports the IR and the op table only.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from conformance.ir import ops as O
from conformance.ir.nodes import (
    ITER_SEP,
    LATER_OPTIONS,
    MAX_BATCH,
    MAX_BRANCHES,
    MAX_SCAN_LENGTH,
    OPTIONS_NEEDING,
    Checkpoint,
    Cond,
    CustomJVP,
    CustomVJP,
    Jit,
    Limits,
    Op,
    ProgramError,
    Scan,
)
from conformance.ir.policy import policy_names

if TYPE_CHECKING:   # (the Program model reads this module)
    from conformance.ir.program import Program


def _infer(op: Op, arg_types, path, nondiff) -> tuple[tuple[int, ...], str]:
    try:
        shape = O.infer(op.op, [t[0] for t in arg_types], op.params, nondiff)
    except O.ParamError as e:
        raise ProgramError(f"{path}.{e.field}", e.reason) from None
    dtypes = {t[1] for t in arg_types}
    if len(dtypes) > 1:
        raise ProgramError(f"{path}.args", f"mixed dtypes {sorted(dtypes)}")
    return shape, O.result_dtype(op.op, op.params, arg_types[0][1])


def infer_types(prog: Program, limits: Limits | None = None) -> dict[str, tuple[tuple[int, ...], str]]:
    """Type-check the program; return id -> (shape, dtype). Raises ProgramError."""
    limits = limits or Limits()
    types: dict[str, tuple[tuple[int, ...], str]] = {}
    defined: set[str] = set()

    if not prog.inputs:
        raise ProgramError("inputs", "a program needs at least one input")
    if len(prog.inputs) > limits.max_inputs:
        raise ProgramError("inputs", f"{len(prog.inputs)} inputs exceed the limit {limits.max_inputs}")

    def define(i, t, path, shape_path=None):
        shape_path = shape_path or path
        if not isinstance(i, str) or not i:
            raise ProgramError(path, "value ids must be non-empty strings")
        if len(i) > limits.max_name_length:
            raise ProgramError(path, f"id longer than {limits.max_name_length} characters")
        if i in defined:
            raise ProgramError(path, f"value {i!r} defined twice")
        if ITER_SEP in i:
            raise ProgramError(path, f"value ids may not contain {ITER_SEP!r} (it names a scan iteration's value)")
        shape, _ = t
        if len(shape) > limits.max_rank:
            raise ProgramError(shape_path, f"rank {len(shape)} exceeds the limit {limits.max_rank}")
        if any(d > limits.max_dim for d in shape):
            raise ProgramError(shape_path, f"dimension exceeds the limit {limits.max_dim}: {list(shape)}")
        if math.prod(shape) > limits.max_elements:
            raise ProgramError(shape_path, f"{math.prod(shape)} elements exceed the limit {limits.max_elements}")
        defined.add(i)
        types[i] = t

    nondiff_inputs = {i.id for i in prog.inputs if not i.diff}
    for k, inp in enumerate(prog.inputs):
        if any((not isinstance(d, int)) or d < 1 for d in inp.shape):
            raise ProgramError(f"inputs[{k}].shape", f"dimensions must be positive integers: {inp.shape}")
        define(inp.id, (tuple(inp.shape), inp.dtype), f"inputs[{k}].id", f"inputs[{k}].shape")
    if not prog.diff_inputs():
        raise ProgramError("inputs", "at least one input must have diff=true")

    viewed: set[str] = set()   # values a view op (or a cast, which may alias) has read

    def check_inplace(s: Op, p: str, local: dict, nondiff):
        """An in-place op consumes its first arg: an op's output in this body, no view (nor a value
        a view was taken of); the caller then drops it from scope, so nothing after reads it."""
        x = s.args[0]
        if nondiff is not None:
            raise ProgramError(f"{p}.op", f"{s.op} (in-place) is not allowed inside custom rules")
        if x not in local:
            raise ProgramError(f"{p}.args[0]", f"{s.op} mutates {x!r}, which is not an op's output in this body "
                                               "(an input, a region's argument or an outer value)")
        if O.OPS[local[x].op].view or local[x].op == O.CAST_OP or x in viewed:
            raise ProgramError(f"{p}.args[0]", f"{s.op} mutates {x!r}, which shares memory with another value "
                                               "(a view, or viewed)")
        if x in s.args[1:]:
            raise ProgramError(f"{p}.args", f"{s.op} reads the value it mutates")

    def check_region_options(s: Checkpoint, p: str) -> None:
        plain = LATER_OPTIONS["checkpoint"]
        for option, needing in OPTIONS_NEEDING.items():   # (what the reducer sets plain with the option)
            if getattr(s, option) == plain[option] and any(getattr(s, k) != plain[k] for k in needing):
                raise ProgramError(f"{p}.{needing[0]}", f"{' and '.join(needing)} need {option}")
        if s.state != "none" and (s.tree != "flat" or s.static_flag or prog.diff.batch):
            raise ProgramError(f"{p}.state", "mutable state needs a flat region without a static flag, in a program "
                                             "that is not per example")
        if s.extras and (s.tree == "dict" or s.state != "none"):
            raise ProgramError(f"{p}.extras", "non-tensor outputs need a flat or tuple region without mutable state")
        if s.prevent_cse_args and (s.tree != "flat" or len(s.prevent_cse_args) != len(s.args)):
            raise ProgramError(f"{p}.prevent_cse_args", f"one bool per arg of a flat region ({len(s.args)} args, "
                                                        f"tree {s.tree!r})")

    def check_body(body, scope: set[str], path: str, depth: int, nondiff: list[float] | None, in_fwd=False):
        if depth > limits.max_depth:
            raise ProgramError(path, f"nesting depth {depth} exceeds the limit {limits.max_depth}")
        scope = set(scope)
        local: dict[str, Op] = {}   # this body's op outputs
        for i, s in enumerate(body):
            p = f"{path}[{i}]"
            for k, a in enumerate(s.args):
                if a not in scope:
                    raise ProgramError(f"{p}.args[{k}]", f"value {a!r} is not defined here")
            if isinstance(s, Op):
                if s.op in O.OPS and O.OPS[s.op].in_rules_only and nondiff is None:
                    raise ProgramError(f"{p}.op", f"{s.op} is only allowed inside custom_vjp fwd/bwd")
                if s.op in O.NAME_OPS and len(str(s.params.get("name", ""))) > limits.max_name_length:
                    raise ProgramError(f"{p}.params.name", f"name longer than {limits.max_name_length} characters")
                t = _infer(s, [types[a] for a in s.args], p, nondiff or [])
                if O.OPS[s.op].inplace:
                    check_inplace(s, p, local, nondiff)
                    scope.discard(s.args[0])   # consumed: nothing after reads it
                elif O.OPS[s.op].view or s.op == O.CAST_OP:
                    viewed.add(s.args[0])
                define(s.out, t, f"{p}.out")
                scope.add(s.out)
                local[s.out] = s
            elif isinstance(s, (Checkpoint, Jit)):   # a region, or a jitted sub-function
                what = "region" if isinstance(s, Checkpoint) else "jitted sub-function"
                if len(set(s.args)) != len(s.args):
                    raise ProgramError(f"{p}.args", "duplicate args")
                for nm in policy_names(s.policy) if isinstance(s, Checkpoint) else ():
                    if len(nm) > limits.max_name_length:
                        raise ProgramError(f"{p}.policy", f"name longer than {limits.max_name_length} characters")
                if isinstance(s, Checkpoint):
                    check_region_options(s, p)
                inner = check_body(s.body, set(s.args), f"{p}.body", depth + 1, nondiff,
                                   in_fwd and isinstance(s, Jit))
                if not s.results:
                    raise ProgramError(f"{p}.results", f"a {what} must export at least one value")
                for k, r in enumerate(s.results):
                    if r not in inner or r in s.args:
                        raise ProgramError(f"{p}.results[{k}]", f"{r!r} is not defined in the {what}'s body")
                    scope.add(r)
            elif isinstance(s, CustomVJP):
                if nondiff is not None:
                    raise ProgramError(p, "custom_vjp blocks cannot nest inside custom_vjp rules")
                if len(set(s.args)) != len(s.args):
                    raise ProgramError(f"{p}.args", "duplicate args")
                for k, v in enumerate(s.nondiff):
                    if not isinstance(v, (int, float)) or not math.isfinite(v):
                        raise ProgramError(f"{p}.nondiff[{k}]", "must be a finite number")
                if s.perturbed_branch and not s.symbolic_zeros:
                    raise ProgramError(f"{p}.perturbed_branch", "needs symbolic_zeros (fwd sees perturbed flags "
                                                                "only then)")
                if s.residual_tree != "tuple" and s.spelling.startswith("custom_gradient"):
                    raise ProgramError(f"{p}.residual_tree", f"{s.spelling} passes no residuals (its bwd closes "
                                                             "over them)")
                if s.spelling != "defvjp" and (s.non_differentiable or s.once_differentiable or s.bwd_branch):
                    raise ProgramError(f"{p}.spelling", f"{s.spelling} has no non_differentiable results, "
                                                        "once_differentiable or bwd_branch")
                if s.spelling != "defvjp" and (s.symbolic_zeros or s.optimize_remat or s.nondiff):
                    raise ProgramError(f"{p}.spelling", f"{s.spelling} has no symbolic_zeros, optimize_remat "
                                                        "or nondiff arguments")
                inner = check_body(s.fwd, set(s.args), f"{p}.fwd", depth, list(s.nondiff), in_fwd=True)
                if not s.results:
                    raise ProgramError(f"{p}.results", "a custom_vjp block must have at least one result")
                for k, r in enumerate(s.results):
                    if r not in inner or r in s.args:
                        raise ProgramError(f"{p}.results[{k}]", f"{r!r} is not defined in fwd")
                for k, r in enumerate(s.non_differentiable):
                    if r not in s.results:
                        raise ProgramError(f"{p}.non_differentiable[{k}]", f"{r!r} is not a result of the block")
                for k, r in enumerate(s.residuals):
                    if r not in inner:
                        raise ProgramError(f"{p}.residuals[{k}]", f"{r!r} is not defined in fwd or args")
                if len(s.cts) != len(s.results):
                    raise ProgramError(f"{p}.cts", f"need one cotangent id per result ({len(s.results)})")
                for k, (c, r) in enumerate(zip(s.cts, s.results)):
                    define(c, types[r], f"{p}.cts[{k}]")
                bscope = set(s.residuals) | set(s.cts)
                binner = check_body(s.bwd, bscope, f"{p}.bwd", depth, list(s.nondiff))
                rule_results(f"{p}.bwd_results", s.bwd_results, s.args, binner, "bwd", "cotangent", "arg")
                for r in s.results:
                    scope.add(r)
            elif isinstance(s, CustomJVP):
                if nondiff is not None and not in_fwd:
                    raise ProgramError(p, "custom_jvp blocks nest only in a custom_vjp fwd rule")
                if len(set(s.args)) != len(s.args):
                    raise ProgramError(f"{p}.args", "duplicate args")
                inner = check_body(s.body, set(s.args), f"{p}.body", depth, [])
                if not s.results:
                    raise ProgramError(f"{p}.results", "a custom_jvp block must have at least one result")
                for k, r in enumerate(s.results):
                    if r not in inner or r in s.args:
                        raise ProgramError(f"{p}.results[{k}]", f"{r!r} is not defined in the body")
                if len(s.tangents) != len(s.args):
                    raise ProgramError(f"{p}.tangents", f"need one tangent id per arg ({len(s.args)})")
                for k, (t, a) in enumerate(zip(s.tangents, s.args)):
                    define(t, types[a], f"{p}.tangents[{k}]")
                jinner = check_body(s.jvp, inner | set(s.tangents), f"{p}.jvp", depth, [])
                rule_results(f"{p}.jvp_results", s.jvp_results, s.results, jinner, "jvp", "tangent", "result")
                for r in s.results:
                    scope.add(r)
            elif isinstance(s, Scan):
                check_scan(s, p, scope, depth, nondiff)
                scope.update(s.results)
            elif isinstance(s, Cond):
                check_cond(s, p, depth, nondiff)
                scope.update(s.results)
        return scope

    def rule_results(path, got, of, inner, rule, what, whose):
        """A custom rule's results: one per counterpart, each defined in the rule (None: a zero) and of
        its counterpart's type."""
        if len(got) != len(of):
            raise ProgramError(path, f"need one {what} per {whose} ({len(of)})")
        for k, (r, a) in enumerate(zip(got, of)):
            if r is None:
                continue
            if r not in inner:
                raise ProgramError(f"{path}[{k}]", f"{r!r} is not defined in {rule}")
            if types[r] != types[a]:
                raise ProgramError(f"{path}[{k}]", f"{what} type {types[r]} differs from {whose} type {types[a]}")

    def check_cond(s: "Cond", p: str, depth: int, nondiff):
        if nondiff is not None:
            raise ProgramError(p, "conds do not nest inside custom rules")
        if not s.args or s.args[0] not in nondiff_inputs:
            raise ProgramError(f"{p}.args[0]", "the predicate must be a program input that is not differentiated")
        ops = s.args[1:]
        if len(set(ops)) != len(ops):
            raise ProgramError(f"{p}.args", "duplicate operands")
        if not 2 <= len(s.branches) <= MAX_BRANCHES:
            raise ProgramError(f"{p}.branches", f"need 2 to {MAX_BRANCHES} branches")
        if len(s.branch_results) != len(s.branches):
            raise ProgramError(f"{p}.branch_results", "need one result list per branch")
        if not s.results:
            raise ProgramError(f"{p}.results", "a cond must have at least one result")
        for k, (b, rs) in enumerate(zip(s.branches, s.branch_results)):
            inner = check_body(b, set(ops), f"{p}.branches[{k}]", depth, None)
            if len(rs) != len(s.results):
                raise ProgramError(f"{p}.branch_results[{k}]", f"need one id per result ({len(s.results)})")
            for j, r in enumerate(rs):
                if r not in inner:
                    raise ProgramError(f"{p}.branch_results[{k}][{j}]", f"{r!r} is not defined in branch {k}")
                if types[r] != types[s.branch_results[0][j]]:
                    raise ProgramError(f"{p}.branch_results[{k}][{j}]",
                                       f"type {types[r]} differs from branch 0's {types[s.branch_results[0][j]]}")
        for j, r in enumerate(s.results):
            define(r, types[s.branch_results[0][j]], f"{p}.results[{j}]")

    def check_scan(s: "Scan", p: str, scope: set[str], depth: int, nondiff):
        if nondiff is not None:
            raise ProgramError(p, "scans do not nest inside custom rules")
        if not 1 <= s.length <= MAX_SCAN_LENGTH:
            raise ProgramError(f"{p}.length", f"must be between 1 and {MAX_SCAN_LENGTH}")
        if s.unroll < 1:
            raise ProgramError(f"{p}.unroll", "must be a positive integer")
        if s.spelling in ("fori_loop", "while_loop") and (s.xs or s.ys):
            raise ProgramError(f"{p}.spelling", f"a {s.spelling} has carries only (no xs, no ys)")
        if s.spelling == "vmap" and (s.carry or not s.xs or not s.ys):
            raise ProgramError(f"{p}.spelling", "a vmap has no carries, and at least one xs and one ys")
        if len(s.args) < len(s.carry) + len(s.xs):
            raise ProgramError(f"{p}.args", f"need the {len(s.carry)} carries' initial values and the "
                                            f"{len(s.xs)} stacked xs first")
        init, xs, consts = s.split_args()
        if len(set(consts)) != len(consts):
            raise ProgramError(f"{p}.args", "duplicate closed-over values")
        for k, (c, a) in enumerate(zip(s.carry, init)):
            define(c, types[a], f"{p}.carry[{k}]")
        for k, (x, a) in enumerate(zip(s.xs, xs)):
            shp, dt = types[a]
            if not shp or shp[0] != s.length:
                raise ProgramError(f"{p}.args[{len(init) + k}]",
                                   f"a scanned sequence needs leading axis {s.length}, has shape {list(shp)}")
            define(x, (shp[1:], dt), f"{p}.xs[{k}]")
        inner = check_body(s.body, set(consts) | set(s.carry) | set(s.xs), f"{p}.body", depth, None)
        if len(s.carry_out) != len(s.carry):
            raise ProgramError(f"{p}.carry_out", f"need one new value per carry ({len(s.carry)})")
        for k, (c, c0) in enumerate(zip(s.carry_out, s.carry)):
            if c not in inner:
                raise ProgramError(f"{p}.carry_out[{k}]", f"{c!r} is not defined in the scan body")
            if types[c] != types[c0]:
                raise ProgramError(f"{p}.carry_out[{k}]", f"type {types[c]} differs from the carry's {types[c0]}")
        for k, y in enumerate(s.ys):
            if y not in inner:
                raise ProgramError(f"{p}.ys[{k}]", f"{y!r} is not defined in the scan body")
        if len(s.results) != len(s.carry) + len(s.ys):
            raise ProgramError(f"{p}.results", f"need one id per carry and per ys ({len(s.carry) + len(s.ys)})")
        if not s.results:
            raise ProgramError(f"{p}.results", "a scan must have a carry or a ys")
        for k, (r, src) in enumerate(zip(s.results, s.carry_out + s.ys)):
            shp, dt = types[src]
            define(r, (shp if k < len(s.carry) else (s.length,) + tuple(shp), dt), f"{p}.results[{k}]")

    if prog.diff.cotangents != "ones" and prog.diff.order != 1:
        raise ProgramError("diff.cotangents", "seeded cotangents are for first-order programs")
    if prog.diff.mode != "reverse" and prog.diff.order != 2:
        raise ProgramError("diff.mode", f"{prog.diff.mode} is a second-order mode (needs order 2)")
    top = check_body(prog.body, {i.id for i in prog.inputs}, "body", 0, None)
    n = prog.size()
    if n > limits.max_statements:
        raise ProgramError("body", f"{n} statements exceed the limit {limits.max_statements}")
    if not prog.outputs:
        raise ProgramError("outputs", "a program needs at least one output")
    if not 0 <= prog.diff.batch <= MAX_BATCH:
        raise ProgramError("diff.batch", f"{prog.diff.batch} examples: need 0 (no batch) to {MAX_BATCH}")
    for k, i in enumerate(prog.inputs):
        if i.batched and not prog.diff.batch:
            raise ProgramError(f"inputs[{k}].batched", "a batched input needs diff.batch > 0 (per-example gradients)")
    if prog.diff.batch and not any(i.batched for i in prog.inputs):
        raise ProgramError("diff.batch", "per-example gradients need at least one batched input")
    if not 0 <= prog.diff.aux < len(prog.outputs):
        raise ProgramError("diff.aux", f"{prog.diff.aux} auxiliary outputs: need 0 to {len(prog.outputs) - 1} "
                                       "(at least one output is differentiated)")
    for k, o in enumerate(prog.outputs):
        if o not in top:
            raise ProgramError(f"outputs[{k}]", f"value {o!r} is not defined at top level")
    return types
