"""Program IR: a small, framework-neutral, JSON-serialisable differentiable program.

A program is a list of statements in SSA form over string value ids. Statements are
ops, checkpoint regions (nested, each with a policy) and custom-VJP blocks. A region or
block takes `args` (ids visible outside, re-bound to the same ids inside) and exports
`results` (ids defined in its body, visible after it). Evaluating a program while
ignoring region boundaries gives exactly the no-remat semantics.

This module imports nothing of the project and neither jax nor torch.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from conformance.policy import Policy, policy_names

SCHEMA_VERSION = 1
DTYPES = ("float32", "float64")
DTYPE_BYTES = {"float32": 4, "float64": 8}

# op kind -> arity. Params are per op (see _infer).
UNARY = ("sin", "cos", "tanh", "exp", "sigmoid", "square", "neg", "scale")
BINARY = ("add", "sub", "mul")
OP_ARITY: dict[str, int] = {
    **{u: 1 for u in UNARY},
    **{b: 2 for b in BINARY},
    "matmul": 2,      # (m,k)@(k,n) or batched (b,m,k)@(b,k,n)
    "sum": 1,         # params: axis (int or None)
    "mean": 1,        # params: axis (int or None)
    "transpose": 1,   # params: perm
    "reshape": 1,     # params: shape
    "broadcast": 1,   # params: shape (numpy broadcast_to)
    "name": 1,        # params: name  -> checkpoint_name(x, name)
    "nondiff_scale": 1,  # params: index -> x * nondiff[index] (custom_vjp blocks only)
}
# exp is only generated on bounded input; validation keeps it finite for any input by
# construction of the generator, the interpreter does not clamp.
DOT_OPS = ("matmul",)


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
    shape: list[int]
    dtype: Literal["float32", "float64"]
    diff: bool = True


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


Stmt = Annotated[Union[Op, Checkpoint, CustomVJP], Field(discriminator="kind")]
Checkpoint.model_rebuild()
CustomVJP.model_rebuild()


class Diff(_M):
    order: Literal[1, 2] = 1
    mode: Literal["reverse"] = "reverse"   # room for forward-over-reverse


class Program(_M):
    schema_version: Literal[1] = SCHEMA_VERSION
    inputs: list[Input]
    body: list[Stmt]
    outputs: list[str]
    diff: Diff = Field(default_factory=Diff)
    # Room for later additions (scan/cond bodies, pytrees...) without changing the shape.
    extensions: dict[str, Any] = Field(default_factory=dict)

    # --- serialisation -------------------------------------------------------------
    def to_json_obj(self) -> dict:
        return self.model_dump(mode="json", exclude_defaults=False)

    def to_json(self) -> str:
        return json.dumps(self.to_json_obj(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json_obj(cls, obj: Any) -> "Program":
        return cls.model_validate(obj)

    def content_hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]

    def diff_inputs(self) -> list[Input]:
        return [i for i in self.inputs if i.diff]

    def size(self) -> int:
        return sum(1 for _ in walk(self.body))

    def features(self) -> frozenset[str]:
        return frozenset(compute_features(self))

    def types(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return infer_types(self)


# ---------------------------------------------------------------------------------
class ProgramError(ValueError):
    """A program that fails validation. `field` is a path such as body[2].args[0]."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def walk(body, depth=0, path="body", ctx=None):
    """Yield (stmt, depth, path, ctx) for every statement, recursively.
    depth counts enclosing checkpoint regions; ctx is 'main', 'fwd' or 'bwd'."""
    ctx = ctx or "main"
    for i, s in enumerate(body):
        p = f"{path}[{i}]"
        yield s, depth, p, ctx
        if isinstance(s, Checkpoint):
            yield from walk(s.body, depth + 1, p + ".body", ctx)
        elif isinstance(s, CustomVJP):
            yield from walk(s.fwd, depth, p + ".fwd", "fwd")
            yield from walk(s.bwd, depth, p + ".bwd", "bwd")


def _bcast_ok(src, dst):
    if len(src) > len(dst):
        return False
    for a, b in zip(reversed(src), reversed(dst)):
        if a != b and a != 1:
            return False
    return True


def _infer(op: Op, arg_types, path, nondiff) -> tuple[tuple[int, ...], str]:
    if op.op not in OP_ARITY:
        raise ProgramError(f"{path}.op", f"unknown op {op.op!r}; known: {sorted(OP_ARITY)}")
    if len(op.args) != OP_ARITY[op.op]:
        raise ProgramError(f"{path}.args", f"{op.op} takes {OP_ARITY[op.op]} args, got {len(op.args)}")
    shapes = [t[0] for t in arg_types]
    dtypes = {t[1] for t in arg_types}
    if len(dtypes) != 1:
        raise ProgramError(f"{path}.args", f"mixed dtypes {sorted(dtypes)}")
    dt = arg_types[0][1]
    s0 = shapes[0]
    p = op.params
    allowed = {"scale": {"c"}, "sum": {"axis"}, "mean": {"axis"}, "transpose": {"perm"},
               "reshape": {"shape"}, "broadcast": {"shape"}, "name": {"name"},
               "nondiff_scale": {"index"}}.get(op.op, set())
    extra = set(p) - allowed
    if extra:
        raise ProgramError(f"{path}.params", f"unexpected params {sorted(extra)} for {op.op}")
    missing = allowed - set(p)
    if missing:
        raise ProgramError(f"{path}.params", f"missing params {sorted(missing)} for {op.op}")
    o = op.op
    if o in UNARY:
        if o == "scale" and not (isinstance(p["c"], (int, float)) and math.isfinite(p["c"])):
            raise ProgramError(f"{path}.params.c", "must be a finite number")
        return s0, dt
    if o in BINARY:
        if shapes[0] != shapes[1]:
            raise ProgramError(f"{path}.args", f"{o} needs equal shapes, got {shapes[0]} and {shapes[1]}")
        return s0, dt
    if o == "matmul":
        a, b = shapes
        if len(a) == 2 and len(b) == 2 and a[1] == b[0]:
            return (a[0], b[1]), dt
        if len(a) == 3 and len(b) == 3 and a[0] == b[0] and a[2] == b[1]:
            return (a[0], a[1], b[2]), dt
        raise ProgramError(f"{path}.args", f"matmul needs (m,k)@(k,n) or (b,m,k)@(b,k,n), got {a}@{b}")
    if o in ("sum", "mean"):
        ax = p["axis"]
        if ax is None:
            return (), dt
        if not isinstance(ax, int) or isinstance(ax, bool) or not (0 <= ax < len(s0)):
            raise ProgramError(f"{path}.params.axis", f"axis {ax!r} out of range for rank {len(s0)}")
        return tuple(d for i, d in enumerate(s0) if i != ax), dt
    if o == "transpose":
        perm = p["perm"]
        if (not isinstance(perm, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in perm)
                or sorted(perm) != list(range(len(s0)))):
            raise ProgramError(f"{path}.params.perm", f"not a permutation of rank {len(s0)}: {perm!r}")
        return tuple(s0[i] for i in perm), dt
    if o in ("reshape", "broadcast"):
        shp = p["shape"]
        if not isinstance(shp, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shp):
            raise ProgramError(f"{path}.params.shape", f"not a shape: {shp!r}")
        if o == "reshape" and math.prod(shp) != math.prod(s0):
            raise ProgramError(f"{path}.params.shape", f"cannot reshape {list(s0)} to {shp}")
        if o == "broadcast" and not _bcast_ok(s0, shp):
            raise ProgramError(f"{path}.params.shape", f"cannot broadcast {list(s0)} to {shp}")
        return tuple(shp), dt
    if o == "name":
        n = p["name"]
        if not isinstance(n, str) or not n or not n.isidentifier():
            raise ProgramError(f"{path}.params.name", f"name must be a non-empty identifier, got {n!r}")
        return s0, dt
    if o == "nondiff_scale":
        ix = p["index"]
        if not isinstance(ix, int) or isinstance(ix, bool) or not (0 <= ix < len(nondiff)):
            raise ProgramError(f"{path}.params.index", f"no nondiff argument {ix!r} (block has {len(nondiff)})")
        return s0, dt
    raise AssertionError(o)


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
        shape, _ = t
        if len(shape) > limits.max_rank:
            raise ProgramError(shape_path, f"rank {len(shape)} exceeds the limit {limits.max_rank}")
        if any(d > limits.max_dim for d in shape):
            raise ProgramError(shape_path, f"dimension exceeds the limit {limits.max_dim}: {list(shape)}")
        if math.prod(shape) > limits.max_elements:
            raise ProgramError(shape_path, f"{math.prod(shape)} elements exceed the limit {limits.max_elements}")
        defined.add(i)
        types[i] = t

    for k, inp in enumerate(prog.inputs):
        if any((not isinstance(d, int)) or d < 1 for d in inp.shape):
            raise ProgramError(f"inputs[{k}].shape", f"dimensions must be positive integers: {inp.shape}")
        define(inp.id, (tuple(inp.shape), inp.dtype), f"inputs[{k}].id", f"inputs[{k}].shape")
    if not prog.diff_inputs():
        raise ProgramError("inputs", "at least one input must have diff=true")

    def check_body(body, scope: set[str], path: str, depth: int, nondiff: list[float] | None):
        if depth > limits.max_depth:
            raise ProgramError(path, f"nesting depth {depth} exceeds the limit {limits.max_depth}")
        scope = set(scope)
        for i, s in enumerate(body):
            p = f"{path}[{i}]"
            for k, a in enumerate(s.args):
                if a not in scope:
                    raise ProgramError(f"{p}.args[{k}]", f"value {a!r} is not defined here")
            if isinstance(s, Op):
                if s.op == "nondiff_scale" and nondiff is None:
                    raise ProgramError(f"{p}.op", "nondiff_scale is only allowed inside custom_vjp fwd/bwd")
                if s.op == "name" and len(str(s.params.get("name", ""))) > limits.max_name_length:
                    raise ProgramError(f"{p}.params.name", f"name longer than {limits.max_name_length} characters")
                t = _infer(s, [types[a] for a in s.args], p, nondiff or [])
                define(s.out, t, f"{p}.out")
                scope.add(s.out)
            elif isinstance(s, Checkpoint):
                if len(set(s.args)) != len(s.args):
                    raise ProgramError(f"{p}.args", "duplicate args")
                for nm in policy_names(s.policy):
                    if len(nm) > limits.max_name_length:
                        raise ProgramError(f"{p}.policy", f"name longer than {limits.max_name_length} characters")
                inner = check_body(s.body, set(s.args), f"{p}.body", depth + 1, nondiff)
                if not s.results:
                    raise ProgramError(f"{p}.results", "a region must export at least one value")
                for k, r in enumerate(s.results):
                    if r not in inner or r in s.args:
                        raise ProgramError(f"{p}.results[{k}]", f"{r!r} is not defined in the region body")
                    scope.add(r)
            elif isinstance(s, CustomVJP):
                if nondiff is not None:
                    raise ProgramError(p, "custom_vjp blocks cannot nest inside custom_vjp rules")
                if len(set(s.args)) != len(s.args):
                    raise ProgramError(f"{p}.args", "duplicate args")
                for k, v in enumerate(s.nondiff):
                    if not isinstance(v, (int, float)) or not math.isfinite(v):
                        raise ProgramError(f"{p}.nondiff[{k}]", "must be a finite number")
                inner = check_body(s.fwd, set(s.args), f"{p}.fwd", depth, list(s.nondiff))
                if not s.results:
                    raise ProgramError(f"{p}.results", "a custom_vjp block must have at least one result")
                for k, r in enumerate(s.results):
                    if r not in inner or r in s.args:
                        raise ProgramError(f"{p}.results[{k}]", f"{r!r} is not defined in fwd")
                for k, r in enumerate(s.residuals):
                    if r not in inner:
                        raise ProgramError(f"{p}.residuals[{k}]", f"{r!r} is not defined in fwd or args")
                if len(s.cts) != len(s.results):
                    raise ProgramError(f"{p}.cts", f"need one cotangent id per result ({len(s.results)})")
                for k, (c, r) in enumerate(zip(s.cts, s.results)):
                    define(c, types[r], f"{p}.cts[{k}]")
                bscope = set(s.residuals) | set(s.cts)
                binner = check_body(s.bwd, bscope, f"{p}.bwd", depth, list(s.nondiff))
                if len(s.bwd_results) != len(s.args):
                    raise ProgramError(f"{p}.bwd_results", f"need one entry per arg ({len(s.args)})")
                for k, (r, a) in enumerate(zip(s.bwd_results, s.args)):
                    if r is None:
                        continue
                    if r not in binner:
                        raise ProgramError(f"{p}.bwd_results[{k}]", f"{r!r} is not defined in bwd")
                    if types[r] != types[a]:
                        raise ProgramError(f"{p}.bwd_results[{k}]",
                                           f"cotangent type {types[r]} differs from arg type {types[a]}")
                for r in s.results:
                    scope.add(r)
        return scope

    top = check_body(prog.body, {i.id for i in prog.inputs}, "body", 0, None)
    n = prog.size()
    if n > limits.max_statements:
        raise ProgramError("body", f"{n} statements exceed the limit {limits.max_statements}")
    if not prog.outputs:
        raise ProgramError("outputs", "a program needs at least one output")
    for k, o in enumerate(prog.outputs):
        if o not in top:
            raise ProgramError(f"outputs[{k}]", f"value {o!r} is not defined at top level")
    return types


def validate(prog: Program, limits: Limits | None = None) -> Program:
    infer_types(prog, limits)
    return prog


_TAGS = {"op", "checkpoint", "custom_vjp"}


def error_location(loc) -> str:
    """A pydantic error location as a field path (body[2].policy.names), without the
    discriminator tags pydantic inserts for tagged unions."""
    from conformance.policy import POLICY_KINDS
    parts = []
    prev = None
    for x in loc:
        tag = x in _TAGS or x in POLICY_KINDS
        if tag and (isinstance(prev, int) or prev in ("policy", "a", "b")):
            prev = x
            continue
        parts.append(f"[{x}]" if isinstance(x, int) else f".{x}")
        prev = x
    return "".join(parts).lstrip(".")


def load_program(obj: Any, limits: Limits | None = None) -> Program:
    """Parse and validate a program from a JSON object. Raises ProgramError naming the field."""
    if not isinstance(obj, dict):
        raise ProgramError("<root>", f"a program must be a JSON object, got {type(obj).__name__}")
    sv = obj.get("schema_version")
    if sv != SCHEMA_VERSION:
        raise ProgramError("schema_version", f"unsupported schema_version {sv!r} (this harness reads {SCHEMA_VERSION})")
    try:
        prog = Program.model_validate(obj)
    except ValidationError as e:
        err = e.errors()[0]
        raise ProgramError(error_location(err["loc"]) or "<root>", err["msg"]) from None
    except RecursionError:
        raise ProgramError("<root>", "nesting too deep") from None
    return validate(prog, limits)


# ---------------------------------------------------------------------------------
# Features: a documented vocabulary (README "Feature vocabulary").
FEATURE_DOC: dict[str, str] = {
    "checkpoint": "at least one checkpoint region",
    "nested_checkpoint": "a region inside another region",
    "depth3": "regions nested three deep or more",
    "prevent_cse_false": "a region with prevent_cse=False",
    "offload_in_both": "a both(p, q) policy one of whose parts offloads",
    "policy:<kind>": "a region uses this policy kind (everything, nothing, dots, ...)",
    "names": "checkpoint_name used",
    "dup_names": "the same name on several values",
    "unread_name": "a named value that nothing reads",
    "names_in_fwd": "checkpoint_name inside a custom_vjp fwd",
    "custom_vjp": "a custom_vjp block",
    "custom_vjp_in_checkpoint": "a custom_vjp block inside a checkpoint region",
    "symbolic_zeros": "custom_vjp with symbolic_zeros=True",
    "optimize_remat": "custom_vjp with optimize_remat=True",
    "optimize_remat_symbolic_zeros": "one custom_vjp block with both optimize_remat and symbolic_zeros",
    "sz_fwd_remat": "a symbolic_zeros custom_vjp inside a checkpoint region whose fwd has checkpoint names "
                    "(remat3 must rematerialise that fwd)",
    "nondiff_args": "custom_vjp with nondiff arguments",
    "unused_result": "a custom_vjp result that nothing reads (zero cotangent)",
    "nondiff_input": "a program input that is not differentiated",
    "residual_is_arg": "a custom_vjp residual that is one of its args",
    "matmul": "a matrix product",
    "batch_matmul": "a batched matrix product",
    "reduction": "sum or mean",
    "layout": "transpose, reshape or broadcast",
    "second_order": "grad of grad",
    "float32": "a float32 value",
    "float64": "a float64 value",
}


def compute_features(prog: Program) -> set[str]:
    f: set[str] = set()
    types = infer_types(prog)
    name_counts: dict[str, int] = {}
    reads: dict[str, int] = {}
    for s, depth, _, ctx in walk(prog.body):
        for a in s.args:
            reads[a] = reads.get(a, 0) + 1
        if isinstance(s, Checkpoint):
            f.add("checkpoint")
            f.add(f"policy:{s.policy.kind}")
            if s.policy.kind == "both" and {s.policy.a.kind, s.policy.b.kind} & {"offload_dots_no_batch",
                                                                               "save_and_offload_names"}:
                f.add("offload_in_both")
            if depth >= 1:
                f.add("nested_checkpoint")
            if depth >= 2:
                f.add("depth3")
            if not s.prevent_cse:
                f.add("prevent_cse_false")
        elif isinstance(s, CustomVJP):
            f.add("custom_vjp")
            if depth >= 1:
                f.add("custom_vjp_in_checkpoint")
            if s.symbolic_zeros:
                f.add("symbolic_zeros")
            if s.optimize_remat:
                f.add("optimize_remat")
                if s.symbolic_zeros:
                    f.add("optimize_remat_symbolic_zeros")
            if (s.symbolic_zeros and depth >= 1
                    and any(isinstance(x, Op) and x.op == "name" for x, _, _, _ in walk(s.fwd))):
                f.add("sz_fwd_remat")
            if s.nondiff:
                f.add("nondiff_args")
            if set(s.residuals) & set(s.args):
                f.add("residual_is_arg")
            for r in s.residuals:
                reads[r] = reads.get(r, 0) + 1
        elif isinstance(s, Op):
            if s.op == "name":
                f.add("names")
                if ctx == "fwd":
                    f.add("names_in_fwd")
                n = s.params["name"]
                name_counts[n] = name_counts.get(n, 0) + 1
            elif s.op == "matmul":
                f.add("batch_matmul" if len(types[s.args[0]][0]) == 3 else "matmul")
            elif s.op in ("sum", "mean"):
                f.add("reduction")
            elif s.op in ("transpose", "reshape", "broadcast"):
                f.add("layout")
    for o in prog.outputs:
        reads[o] = reads.get(o, 0) + 1
    for s, _, _, _ in walk(prog.body):
        if isinstance(s, Op) and s.op == "name" and reads.get(s.out, 0) == 0:
            f.add("unread_name")
        if isinstance(s, CustomVJP) and any(reads.get(r, 0) == 0 for r in s.results):
            f.add("unused_result")
    if any(c > 1 for c in name_counts.values()):
        f.add("dup_names")
    if any(not i.diff for i in prog.inputs):
        f.add("nondiff_input")
    if prog.diff.order == 2:
        f.add("second_order")
    for _, dt in types.values():
        f.add(dt)
    return f


@dataclass(frozen=True)
class NodeInfo:
    id: str
    path: str
    op: str | None          # op kind, or 'input'
    name: str | None        # checkpoint name, if a name op
    region_depth: int
    ctx: str


def node_index(prog: Program) -> dict[str, NodeInfo]:
    """Every primal value id -> where it is defined (bwd-rule values excluded)."""
    out = {i.id: NodeInfo(i.id, f"inputs[{k}]", "input", None, 0, "main") for k, i in enumerate(prog.inputs)}
    for s, depth, path, ctx in walk(prog.body):
        if isinstance(s, Op) and ctx != "bwd":
            out[s.out] = NodeInfo(s.out, path, s.op, s.params.get("name") if s.op == "name" else None, depth, ctx)
    return out
