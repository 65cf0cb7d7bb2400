"""Program IR nodes: a small, framework-neutral, JSON-serialisable differentiable program.

A program is a list of statements in SSA form over string value ids. Statements are
ops, checkpoint regions (nested, each with a policy) and custom-VJP blocks. A region or
block takes `args` (ids visible outside, re-bound to the same ids inside) and exports
`results` (ids defined in its body, visible after it). Evaluating a program while
ignoring region boundaries gives exactly the no-remat semantics.

The statement and input models, walking a body and the structural queries (live values,
region contexts, ids) that need no types. Imports conformance.ir.ops, .dtypes and .policy only;
the Program model and loading are conformance.ir.program.
"""

from __future__ import annotations

import json  # noqa: F401
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from conformance.ir import ops as O
from conformance.ir.dtypes import DTYPES as FLOAT_DTYPES
from conformance.ir.policy import Policy

if TYPE_CHECKING:
    from conformance.ir.program import Program

SCHEMA_VERSION = 1
DTYPES = tuple(FLOAT_DTYPES)   # (conformance.ir.dtypes declares each)
DTYPE_BYTES = {k: d.bytes for k, d in FLOAT_DTYPES.items()}
DType = Literal[DTYPES]   # (a Literal of the declared names)

class Limits(BaseModel):
    """Configurable limits checked before anything runs."""
    model_config = ConfigDict(extra="forbid")
    max_rank: int = 3
    max_dim: int = 64
    max_elements: int = 4096
    max_depth: int = 6
    max_statements: int = 400
    max_name_length: int = 64
    max_inputs: int = 16


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class Input(_M):
    id: str
    shape: list[StrictInt]
    dtype: DType
    diff: bool = True
    # Per-example programs (diff.batch B > 0): a batched input's value holds one example per
    # leading-axis slice, shape (B, *shape); the program sees one example. Others are shared.
    batched: bool = False


class Op(_M):
    kind: Literal["op"] = "op"
    op: str
    args: list[str]
    params: dict[str, Any] = Field(default_factory=dict)
    out: str


class Checkpoint(_M):
    kind: Literal["checkpoint"] = "checkpoint"
    args: list[str]
    body: list["Stmt"]
    results: list[str]
    policy: Policy
    prevent_cse: bool = True
    # jax.checkpoint options beyond the policy: `static_flag`, the region's function takes one
    # more argument, True, passed as a static argument (static_argnums) that its Python code
    # branches on; `tree`, it takes and returns its values as one tuple or dict (a pytree)
    # instead of positionally. Neither changes what the program computes.
    static_flag: bool = False
    tree: Literal["flat", "tuple", "dict"] = "flat"
    # How the static flag is declared and passed (STATIC_SPELLINGS); `static_value`, what it is:
    # True, or [True] (an unhashable value: jax.checkpoint hashes static arguments by identity).
    static_by: Literal["argnums", "negative_argnums", "argnames", "missing_argnum"] = "argnums"
    static_value: Literal["bool", "unhashable"] = "bool"
    # `extras`: the region's function also returns non-tensor values after its results (NON_TENSOR_OUTPUTS: None,
    # an int and, in PyTorch, a string: jax.checkpoint accepts no string output), which the caller checks and drops.
    extras: bool = False
    # prevent_cse per positional argument (jax.checkpoint's tuple of bools, one per arg); empty:
    # the bool `prevent_cse` for all
    prevent_cse_args: list[bool] = Field(default_factory=list)
    # Mutable state the region's function closes over (STATE_KINDS): a scalar jax.new_ref made
    # before the region, zero; the function reads it into its first result, writes the sum of that
    # result to it, or adds that sum to it (then multiplies the result by it); after the region
    # the first result adds the ref's value. The references run the same code without checkpoint.
    state: Literal["none", "read", "write", "accumulate"] = "none"


# How a region's static flag reaches jax.checkpoint: static_argnums=(n,) and the flag passed
# last; static_argnums=(-1,); static_argnames=("flag",) and the flag passed by keyword; or
# static_argnums=(n + 1,), an index no argument has (the flag still passed last).
STATIC_SPELLINGS = ("argnums", "negative_argnums", "argnames", "missing_argnum")
STATE_KINDS = ("none", "read", "write", "accumulate")


class CustomVJP(_M):
    """custom_vjp block. fwd computes `results` (primal outputs) and `residuals` from
    `args`; the primal function is the same body. bwd maps (residuals, cotangents named
    `cts`, one per result) to one cotangent per arg (`bwd_results`, None = zero)."""
    kind: Literal["custom_vjp"] = "custom_vjp"
    args: list[str]
    fwd: list["Stmt"]
    results: list[str]
    residuals: list[str]
    cts: list[str]
    bwd: list["Stmt"]
    bwd_results: list[str | None]
    nondiff: list[float] = Field(default_factory=list)
    symbolic_zeros: bool = False
    optimize_remat: bool = False
    # How the rule is spelled in JAX: custom_vjp + defvjp; jax.custom_gradient (bwd closes over
    # the residuals), with remat=True (a rem function recomputes the residuals); defremat (fwd
    # saves nothing, rem recomputes the residuals from the args). The last two need
    # jax_custom_vjp3 and jax_remat3. PyTorch has one spelling (autograd.Function).
    spelling: Literal["defvjp", "custom_gradient", "custom_gradient_remat", "defremat"] = "defvjp"
    # The pytree the residuals travel in from fwd (or defremat's rem) to bwd: a flat tuple, a
    # dict, or nested tuples and dicts. custom_gradient closes over them instead.
    residual_tree: Literal["tuple", "dict", "nested"] = "tuple"
    # symbolic_zeros rules that branch on CustomVJPPrimal.perturbed, as users write them: fwd
    # marks the perturbed args in its residual pytree's structure, bwd returns None (a zero
    # cotangent) for every arg fwd saw unperturbed.
    perturbed_branch: bool = False
    # How the rule takes its (differentiated) args and returns its results: positionally, or as
    # one tuple or one dict keyed by value id (its bwd then returns one cotangent pytree of the
    # same structure, None for a zero leaf). PyTorch's autograd.Function takes tensors positionally.
    tree: Literal["flat", "tuple", "dict"] = "flat"
    # autograd.Function as people write it (JAX: stop_gradient on those results; bwd_branch alike):
    # results marked non-differentiable; a once_differentiable backward; a bwd that doubles its first
    # cotangent when its first result's cotangent sums below 0 (a data-dependent Python branch)
    non_differentiable: list[str] = Field(default_factory=list)
    once_differentiable: bool = False
    bwd_branch: bool = False


class CustomJVP(_M):
    """jax.custom_jvp block. `body` is the primal function of `args`, computing `results`. The
    jvp rule runs `body` again on the primals (its names included), binds one tangent id per
    arg (`tangents`), then runs `jvp`, which computes one output tangent per result
    (`jvp_results`) from the primal values and the tangents."""
    kind: Literal["custom_jvp"] = "custom_jvp"
    args: list[str]
    body: list["Stmt"]
    results: list[str]
    tangents: list[str]
    jvp: list["Stmt"]
    jvp_results: list[str]
    # As a custom_vjp's: args, results and tangents as one tuple or dict keyed by value id.
    tree: Literal["flat", "tuple", "dict"] = "flat"


class Scan(_M):
    """lax.scan over `length` iterations. `args`, the outer values it reads: the carries'
    initial values (one per `carry`), the stacked sequences it scans over (one per `xs`, leading
    axis `length`), then the values its body closes over (re-bound to the same ids inside, as a
    region's args). Each iteration binds `carry` (the carries' current values) and `xs` (this
    iteration's slices) and runs `body`; `carry_out` (one per carry, same types) are the next
    carries and `ys` are stacked. `results`: the final carries, then the stacked ys.

    `spelling`, how JAX writes the loop: `scan` (lax.scan); `fori_loop` (lax.fori_loop with a
    static trip count: carries only); `while_loop` (lax.while_loop counting to `length`: carries
    only, and no gradient flows into it: every value it reads is under stop_gradient, as
    reverse mode requires); `vmap` (jax.vmap of the body over the xs: no carries, each
    iteration independent). PyTorch runs each as a Python loop (detached for while_loop)."""
    kind: Literal["scan"] = "scan"
    spelling: Literal["scan", "fori_loop", "while_loop", "vmap"] = "scan"
    args: list[str]
    carry: list[str]
    xs: list[str] = Field(default_factory=list)
    body: list["Stmt"]
    carry_out: list[str]
    ys: list[str] = Field(default_factory=list)
    results: list[str]
    length: StrictInt
    unroll: StrictInt = 1

    def split_args(self) -> tuple[list[str], list[str], list[str]]:
        """(carry initial values, stacked xs, closed-over values)."""
        nc, nx = len(self.carry), len(self.xs)
        return self.args[:nc], self.args[nc:nc + nx], self.args[nc + nx:]


class Jit(_M):
    """A jax.jit-ted sub-function: `body` over `args` (re-bound to the same ids inside, as a
    region's), exporting `results`. It inlines into the program's semantics (PyTorch runs it
    inline); regions may stand inside it and it inside regions."""
    kind: Literal["jit"] = "jit"
    args: list[str]
    body: list["Stmt"]
    results: list[str]


class Cond(_M):
    """lax.cond (two branches) or lax.switch (more) on an index computed from `args[0]`, a
    program input that is not differentiated: the index counts the thresholds
    `branch_thresholds(n)` below the sum of its elements. The other args are the operands,
    re-bound to the same ids in every branch; branch k defines `branch_results[k]`, one id per
    result (the same types in every branch); `results` are the values after the cond."""
    kind: Literal["cond"] = "cond"
    args: list[str]
    branches: list[list["Stmt"]]
    branch_results: list[list[str]]
    results: list[str]


def branch_thresholds(n: int) -> list[float]:
    """A cond's index on n branches: how many of these lie below the sum of its predicate."""
    return [-0.5 + (j + 1) / n for j in range(n - 1)]


MAX_BRANCHES = 3


Stmt = Annotated[Union[Op, Checkpoint, CustomVJP, CustomJVP, Scan, Jit, Cond], Field(discriminator="kind")]
Checkpoint.model_rebuild()
CustomVJP.model_rebuild()
CustomJVP.model_rebuild()
Scan.model_rebuild()
Jit.model_rebuild()
Cond.model_rebuild()
# Statement fields, declared once for the code that rewrites programs as JSON (the reducer, the
# generator's derived cond branches): lists of ids a statement reads or exports, lists of ids it
# binds for its body (a custom_vjp's cotangents, a custom_jvp's tangents, a scan's carries and
# slices), lists of such lists (a cond's per-branch results), and nested statement lists.
READ_ID_FIELDS = ("args", "results", "residuals", "bwd_results", "jvp_results", "carry_out", "ys", "non_differentiable")
BOUND_ID_FIELDS = ("cts", "tangents", "carry", "xs")
ID_LISTS_FIELDS = ("branch_results",)
BODY_FIELDS = ("body", "fwd", "bwd", "jvp")
MAX_SCAN_LENGTH = 4
# A value inside a scan body has one value per iteration: `<id>@<k>` names iteration k's value
# (recorded values, residual classes). Program ids never contain the separator.
ITER_SEP = "@"


def base_id(i: str) -> str:
    """The program value id of an iteration value id (`v@1` -> `v`); other ids unchanged."""
    return i.split(ITER_SEP, 1)[0]
# walk() contexts: "main" (the program), "fwd" (a custom_vjp fwd rule), "bwd" (its bwd rule),
# "primal" (a custom_jvp's primal body, run by its jvp rule too), "jvp" (its tangent statements).
# Derivative contexts hold rule code, not program values.
DERIVATIVE_CTX = ("bwd", "jvp")


# How a second-order program is differentiated. Each mode computes the same value, H @ ones
# (H the Hessian of the loss, ones one per differentiated input), so that every mode is compared
# with the float64 reference and with every other: grad of the sum of grad (reverse over
# reverse), jvp of grad (forward over reverse), grad of jvp (reverse over forward), and
# jax.linearize of grad applied to ones.
DIFF_MODES = ("reverse", "fwd_over_rev", "rev_over_fwd", "linearize")


class Diff(_M):
    order: Literal[1, 2] = 1
    mode: Literal["reverse", "fwd_over_rev", "rev_over_fwd", "linearize"] = "reverse"
    # The cotangent each output's backward receives: "ones" (the loss sums every output), or
    # "seeded": a fixed non-scalar pattern per output (interpreter.seeded_cotangent), the loss
    # being sum(output * pattern) (first order only).
    cotangents: Literal["ones", "seeded"] = "ones"
    # The last `aux` outputs are auxiliary: returned beside the loss and not differentiated
    # (jax.value_and_grad(..., has_aux=True), as a training step returns its metrics).
    aux: StrictInt = 0
    # Per-example gradients: B > 0 differentiates each of B examples on its own (jax.vmap of
    # jax.grad over the batched inputs, the shared ones broadcast): every gradient, output and
    # loss has one value per example, stacked on a leading axis.
    batch: StrictInt = 0


# custom_vjp fields added after programs were first stored: left out of the JSON at their
# defaults, so that those programs keep their content hashes.
_LATER_DEFAULTS = {"spelling": "defvjp", "residual_tree": "tuple", "perturbed_branch": False, "tree": "flat",
                   "non_differentiable": [], "once_differentiable": False, "bwd_branch": False}
_LATER_REGION_DEFAULTS = {"static_flag": False, "tree": "flat", "static_by": "argnums", "static_value": "bool",
                          "prevent_cse_args": [], "state": "none", "extras": False}
_LATER_RULE_DEFAULTS = {"tree": "flat"}   # custom_jvp
_LATER_DIFF_DEFAULTS = {"cotangents": "ones", "aux": 0, "batch": 0}   # the same for the diff part
_LATER_INPUT_DEFAULTS = {"batched": False}
# Statement kind -> its later options at their plain values (the reducer sets them so, too).
LATER_OPTIONS = {"custom_vjp": _LATER_DEFAULTS, "checkpoint": _LATER_REGION_DEFAULTS,
                 "custom_jvp": _LATER_RULE_DEFAULTS, "diff": _LATER_DIFF_DEFAULTS}
# A region's later option -> those that only its non-plain value allows: typecheck refuses them without it, the
# reducer sets them plain with it.
OPTIONS_NEEDING = {"static_flag": ("static_by", "static_value")}


def drop_later_defaults(x):
    """A custom_vjp block's later fields are left out of its JSON at their defaults."""
    if isinstance(x, dict):
        later = LATER_OPTIONS.get(x.get("kind"))
        if later:
            x = {k: v for k, v in x.items() if not (k in later and v == later[k])}
        out = {k: drop_later_defaults(v) for k, v in x.items()}
        if isinstance(out.get("inputs"), list):
            out["inputs"] = [
                {k: v for k, v in i.items() if not (k in _LATER_INPUT_DEFAULTS and v == _LATER_INPUT_DEFAULTS[k])}
                if isinstance(i, dict)
                else i
                for i in out["inputs"]
            ]
        if isinstance(out.get("diff"), dict):
            out["diff"] = {k: v for k, v in out["diff"].items()
                           if not (k in _LATER_DIFF_DEFAULTS and v == _LATER_DIFF_DEFAULTS[k])}
        return out
    if isinstance(x, list):
        return [drop_later_defaults(v) for v in x]
    return x


# ---------------------------------------------------------------------------------
class ProgramError(ValueError):
    """A program that fails validation. `field` is a path such as body[2].args[0]."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def children(s) -> list[tuple[str, list, str | None]]:
    """A statement's bodies, the one place that knows them: (path suffix, body, context), where
    the context is 'fwd', 'bwd', 'primal' or 'jvp' inside a custom rule, None where the body
    runs in the statement's own context (regions, scans, jitted functions, cond branches)."""
    if isinstance(s, (Checkpoint, Scan, Jit)):
        return [(".body", s.body, None)]
    if isinstance(s, CustomVJP):
        return [(".fwd", s.fwd, "fwd"), (".bwd", s.bwd, "bwd")]
    if isinstance(s, CustomJVP):
        return [(".body", s.body, "primal"), (".jvp", s.jvp, "jvp")]
    if isinstance(s, Cond):
        return [(f".branches[{k}]", b, None) for k, b in enumerate(s.branches)]
    return []


def walk(body, depth=0, path="body", ctx=None):
    """Yield (stmt, depth, path, ctx) for every statement, recursively.
    depth counts enclosing checkpoint regions; ctx is 'main', 'fwd', 'bwd', 'primal' or 'jvp'."""
    ctx = ctx or "main"
    for i, s in enumerate(body):
        p = f"{path}[{i}]"
        yield s, depth, p, ctx
        for suffix, b, inner in children(s):
            yield from walk(b, depth + isinstance(s, Checkpoint), p + suffix, inner or ctx)


MAX_BATCH = 4


def scan_lengths(body) -> dict[str, list[int]]:
    """Id of every value defined inside a scan body (carries and slices included) -> the
    lengths of the scans around it, outermost first."""
    out: dict[str, list[int]] = {}

    def visit(stmts, lengths):
        for s in stmts:
            if isinstance(s, Scan):
                inner = lengths + [s.length]
                for i in s.carry + s.xs:
                    out[i] = inner
                visit(s.body, inner)
            elif isinstance(s, Op):
                if lengths:
                    out[s.out] = lengths
            else:   # the primal bodies (not a rule's derivative)
                for _, b, ctx in children(s):
                    if ctx not in DERIVATIVE_CTX:
                        visit(b, lengths)
    visit(body, [])
    return out


def iteration_ids(i: str, lengths: list[int]) -> list[str]:
    """The iteration value ids of a value inside scans of these lengths (innermost index last)."""
    out = [i]
    for n in lengths:
        out = [f"{x}{ITER_SEP}{k}" for x in out for k in range(n)]
    return out


def iteration_values(values: dict, i: str, lengths: dict[str, list[int]]) -> list:
    """A value's recorded values: one, or one per iteration of the scans around it."""
    return [values[x] for x in iteration_ids(i, lengths.get(i, [])) if x in values]


def unrolled_size(body) -> int:
    """Statements counted once per iteration of the scans around them (rounding grows with it)."""
    n = 0
    for s, _, _, _ in walk(body):
        n += 1
        if isinstance(s, Scan):
            n += (s.length - 1) * sum(1 for _ in walk(s.body))
    return n


def input_elements(s: "Op", types: dict) -> int | None:
    """How many elements an op's first input has (what a size policy decides on)."""
    return math.prod(types[s.args[0]][0]) if s.args else None


def is_name(s) -> bool:
    return isinstance(s, Op) and s.op in O.NAME_OPS


def checkpoint_name_of(s) -> str | None:
    return s.params.get("name") if is_name(s) else None


# ---------------------------------------------------------------------------------
# Walkers shared by the lowerings, the emitters, the oracles and the generator.
@dataclass(frozen=True)
class NodeInfo:
    id: str
    path: str
    op: str | None          # op kind, or 'input'
    name: str | None        # checkpoint name, if a name op
    region_depth: int
    ctx: str


def primal_ops(prog: Program) -> dict[str, Op]:
    """Value id -> the op defining it, for every op outside custom_vjp bwd rules."""
    return {s.out: s for s, _, _, ctx in walk(prog.body) if isinstance(s, Op) and ctx not in DERIVATIVE_CTX}


def live_values(prog: "Program", cotangent: bool = False) -> set[str]:
    """Ids the program's outputs depend on (through statements, scan carries and ys, cond branch
    results, custom_vjp residuals), to a fixpoint; the rest is dead code a pipeline may drop. A
    region's or sub-function's args are re-bound to the same ids inside: its body's statements
    say which it reads (an arg nothing inside reads is not live through it). `cotangent`: the ids a
    cotangent reaches, a piecewise-constant op (tangent "zero": step) passing none to what it reads."""
    stmts = [st for st, _, _, ctx in walk(prog.body) if ctx not in DERIVATIVE_CTX]
    live = set(prog.outputs)
    changed = True
    while changed:   # a statement is live when one of its results is; then what it reads is
        changed = False
        for st in stmts:
            if not live & set([st.out] if isinstance(st, Op) else st.results):
                continue
            reads = set() if isinstance(st, (Checkpoint, Jit)) else set(st.args)
            if cotangent and isinstance(st, Op) and O.OPS[st.op].tangent == "zero":
                reads = set()
            elif cotangent and isinstance(st, CustomJVP):
                reads = _jvp_reads(st, live)
            elif cotangent and isinstance(st, Scan) and st.spelling == "while_loop":
                reads = set()   # no cotangent flows into a while_loop: what it reads is under stop_gradient
            elif cotangent and isinstance(st, Scan):
                reads = _scan_reads(st, live)
            elif isinstance(st, Scan):
                reads.update(st.carry_out + st.ys)
            elif cotangent and isinstance(st, Cond):   # (its operands are re-bound inside: the branches' statements
                # say which a cotangent reaches; the branch values behind each live result, and the predicate)
                reads = {st.args[0]} | {rs[j] for rs in st.branch_results
                                        for j, r in enumerate(st.results) if r in live}
            elif isinstance(st, Cond):
                reads.update(r for rs in st.branch_results for r in rs)
            elif isinstance(st, CustomVJP):   # its bwd reads its residuals
                reads.update(st.residuals)
            if not reads <= live:
                live |= reads
                changed = True
    return live


def _scan_reads(st: Scan, live: set[str]) -> set[str]:
    """What of a loop a cotangent reaches, output by output: the body's value behind each live result (a final carry,
    a stacked ys), each carry's next value and initial value where the body's reads of it are live (the next
    iteration reads what this one passes on), the sequence of each slice read. A closed-over value is the same id
    inside: a live reader inside makes it live."""
    init, seqs, _ = st.split_args()
    reads = {o for r, o in zip(st.results, st.carry_out + st.ys) if r in live}
    for c, nxt, first, r in zip(st.carry, st.carry_out, init, st.results):
        if c in live or r in live:
            reads |= {nxt, first}
    reads.update(a for x, a in zip(st.xs, seqs) if x in live)
    return reads


def _jvp_reads(st: CustomJVP, live: set[str]) -> set[str]:
    """The args of custom_jvp `st` a cotangent reaches: those whose tangents its jvp rule passes on to the
    tangent of a live result (a rule's output tangent that nothing downstream reads carries no cotangent back)."""
    need = {t for r, t in zip(st.results, st.jvp_results) if r in live}
    inner = [s for s, _, _, _ in walk(st.jvp)]
    changed = True
    while changed:
        changed = False
        for s in inner:
            if need & ({s.out} if isinstance(s, Op) else set(s.results)) and not set(s.args) <= need:
                need |= set(s.args)
                changed = True
    return {a for a, t in zip(st.args, st.tangents) if t in need}


def region_context(prog: Program) -> tuple[dict[str, list], set[str]]:
    """value id -> enclosing region policies (outermost first); and the ids a policy does not
    govern (inputs, region args/results, custom_vjp args/results, top-level values)."""
    policies: dict[str, list] = {}
    exempt: set[str] = {i.id for i in prog.inputs}

    def visit(body, stack):
        for s in body:
            if isinstance(s, Op):
                policies[s.out] = list(stack)
                if not stack:
                    exempt.add(s.out)
            elif isinstance(s, Checkpoint):
                exempt.update(s.args)
                exempt.update(s.results)
                visit(s.body, stack + [s.policy])
            elif isinstance(s, CustomVJP):
                exempt.update(s.args)
                exempt.update(s.results)
                visit(s.fwd, stack)
            elif isinstance(s, CustomJVP):
                exempt.update(s.args)
                exempt.update(s.results)
                visit(s.body, stack)
            elif isinstance(s, Jit):   # transparent: the policies around it decide for its values
                visit(s.body, stack)
            elif isinstance(s, Cond):   # its operands and results are its boundary
                exempt.update(s.args)
                exempt.update(s.results)
                exempt.update(r for rs in s.branch_results for r in rs)
                for b in s.branches:
                    visit(b, stack)
            elif isinstance(s, Scan):   # a scan's carries, slices and results are its boundary
                exempt.update(s.args)
                exempt.update(s.results)
                exempt.update(s.carry + s.xs + s.carry_out + s.ys)
                visit(s.body, stack)
    visit(prog.body, [])
    return policies, exempt


def defined_ids(body) -> set[str]:
    """Every id a body defines, its regions' and blocks' bodies included (not bwd rules)."""
    return {s.out for s, _, _, ctx in walk(body) if isinstance(s, Op) and ctx not in DERIVATIVE_CTX} | {
        r for s, _, _, ctx in walk(body) if not isinstance(s, Op) and ctx not in DERIVATIVE_CTX for r in s.results}


def free_vars(body) -> list[str]:
    """Ids read by `body` that it does not define, in first-use order (a region or block reads
    only its args)."""
    defined, free = set(), []
    for s in body:
        for a in s.args:
            if a not in defined and a not in free:
                free.append(a)
        defined |= defined_ids([s])
    return free
