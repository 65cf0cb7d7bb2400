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

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError

from conformance import ops as O
from conformance.policy import POLICY_KINDS, Policy, policy_names

SCHEMA_VERSION = 1
DTYPES = ("float32", "float64")
DTYPE_BYTES = {"float32": 4, "float64": 8}

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


Stmt = Annotated[Union[Op, Checkpoint, CustomVJP, CustomJVP], Field(discriminator="kind")]
Checkpoint.model_rebuild()
CustomVJP.model_rebuild()
CustomJVP.model_rebuild()
# walk() contexts: "main" (the program), "fwd" (a custom_vjp fwd rule), "bwd" (its bwd rule),
# "primal" (a custom_jvp's primal body, run by its jvp rule too), "jvp" (its tangent statements).
# Derivative contexts hold rule code, not program values.
DERIVATIVE_CTX = ("bwd", "jvp")


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
        return _drop_later_defaults(self.model_dump(mode="json", exclude_defaults=False))

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
        from conformance.features import compute_features
        return frozenset(compute_features(self))

    def types(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return infer_types(self)


# custom_vjp fields added after programs were first stored: left out of the JSON at their
# defaults, so that those programs keep their content hashes.
_LATER_DEFAULTS = {"spelling": "defvjp", "residual_tree": "tuple", "perturbed_branch": False}


def _drop_later_defaults(x):
    """A custom_vjp block's later fields are left out of its JSON at their defaults."""
    if isinstance(x, dict):
        if x.get("kind") == "custom_vjp":
            x = {k: v for k, v in x.items() if not (k in _LATER_DEFAULTS and v == _LATER_DEFAULTS[k])}
        return {k: _drop_later_defaults(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_drop_later_defaults(v) for v in x]
    return x


# ---------------------------------------------------------------------------------
class ProgramError(ValueError):
    """A program that fails validation. `field` is a path such as body[2].args[0]."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def walk(body, depth=0, path="body", ctx=None):
    """Yield (stmt, depth, path, ctx) for every statement, recursively.
    depth counts enclosing checkpoint regions; ctx is 'main', 'fwd', 'bwd', 'primal' or 'jvp'."""
    ctx = ctx or "main"
    for i, s in enumerate(body):
        p = f"{path}[{i}]"
        yield s, depth, p, ctx
        if isinstance(s, Checkpoint):
            yield from walk(s.body, depth + 1, p + ".body", ctx)
        elif isinstance(s, CustomVJP):
            yield from walk(s.fwd, depth, p + ".fwd", "fwd")
            yield from walk(s.bwd, depth, p + ".bwd", "bwd")
        elif isinstance(s, CustomJVP):
            yield from walk(s.body, depth, p + ".body", "primal")
            yield from walk(s.jvp, depth, p + ".jvp", "jvp")


def _infer(op: Op, arg_types, path, nondiff) -> tuple[tuple[int, ...], str]:
    try:
        shape = O.infer(op.op, [t[0] for t in arg_types], op.params, nondiff)
    except O.ParamError as e:
        raise ProgramError(f"{path}.{e.field}", e.reason) from None
    dtypes = {t[1] for t in arg_types}
    if len(dtypes) > 1:
        raise ProgramError(f"{path}.args", f"mixed dtypes {sorted(dtypes)}")
    return shape, arg_types[0][1]


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

    def check_body(body, scope: set[str], path: str, depth: int, nondiff: list[float] | None, in_fwd=False):
        if depth > limits.max_depth:
            raise ProgramError(path, f"nesting depth {depth} exceeds the limit {limits.max_depth}")
        scope = set(scope)
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
                if s.perturbed_branch and not s.symbolic_zeros:
                    raise ProgramError(f"{p}.perturbed_branch", "needs symbolic_zeros (fwd sees perturbed flags "
                                                                "only then)")
                if s.residual_tree != "tuple" and s.spelling.startswith("custom_gradient"):
                    raise ProgramError(f"{p}.residual_tree", f"{s.spelling} passes no residuals (its bwd closes "
                                                             "over them)")
                if s.spelling != "defvjp" and (s.symbolic_zeros or s.optimize_remat or s.nondiff):
                    raise ProgramError(f"{p}.spelling", f"{s.spelling} has no symbolic_zeros, optimize_remat "
                                                        "or nondiff arguments")
                inner = check_body(s.fwd, set(s.args), f"{p}.fwd", depth, list(s.nondiff), in_fwd=True)
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
                if len(s.jvp_results) != len(s.results):
                    raise ProgramError(f"{p}.jvp_results", f"need one tangent per result ({len(s.results)})")
                for k, (t, r) in enumerate(zip(s.jvp_results, s.results)):
                    if t not in jinner:
                        raise ProgramError(f"{p}.jvp_results[{k}]", f"{t!r} is not defined in jvp")
                    if types[t] != types[r]:
                        raise ProgramError(f"{p}.jvp_results[{k}]",
                                           f"tangent type {types[t]} differs from result type {types[r]}")
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


def node_index(prog: Program) -> dict[str, NodeInfo]:
    """Every primal value id -> where it is defined (derivative-rule values excluded)."""
    out = {i.id: NodeInfo(i.id, f"inputs[{k}]", "input", None, 0, "main") for k, i in enumerate(prog.inputs)}
    for s, depth, path, ctx in walk(prog.body):
        if isinstance(s, Op) and ctx not in DERIVATIVE_CTX:
            out[s.out] = NodeInfo(s.out, path, s.op, checkpoint_name_of(s), depth, ctx)
    return out


def primal_ops(prog: Program) -> dict[str, Op]:
    """Value id -> the op defining it, for every op outside custom_vjp bwd rules."""
    return {s.out: s for s, _, _, ctx in walk(prog.body) if isinstance(s, Op) and ctx not in DERIVATIVE_CTX}


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


class Interpreter:
    """Evaluates a program statement by statement; subclasses say what an op, a region and a
    custom_vjp block are (one framework each). `record`: a dict that receives every op value."""
    record: dict | None = None

    def op(self, s: Op, args: list, nondiff):
        raise NotImplementedError

    def region(self, s: Checkpoint, path: str):
        """A callable taking the region's args and returning its results."""
        raise NotImplementedError

    def block(self, s: CustomVJP, path: str, args: list) -> list:
        raise NotImplementedError

    def region_fn(self, s: Checkpoint, path: str):
        """The region's body as a function of its args (no checkpoint)."""
        def fn(*args):
            e = self.body(s.body, dict(zip(s.args, args)), None, path + ".body")
            return tuple(e[r] for r in s.results)
        return fn

    def jvp_block(self, s: "CustomJVP", path: str, args: list) -> list:
        """A custom_jvp block (default: its primal body inline)."""
        e = self.body(s.body, dict(zip(s.args, args)), None, path + ".body")
        return [e[r] for r in s.results]

    def inline(self, s: CustomVJP, path: str, args: list) -> list:
        """A custom_vjp block's primal: its fwd run inline."""
        e = self.body(s.fwd, dict(zip(s.args, args)), s.nondiff, path + ".fwd")
        return [e[r] for r in s.results]

    def outputs(self, const: dict, diff_ids: list[str], diff_values) -> list:
        """The program's outputs from its constant and differentiated inputs."""
        env = dict(const)
        env.update(zip(diff_ids, diff_values))
        self.body(self.prog.body, env)
        return [env[o] for o in self.prog.outputs]

    def body(self, body, env: dict, nondiff=None, path="body"):
        for i, s in enumerate(body):
            p = f"{path}[{i}]"
            if isinstance(s, Op):
                env[s.out] = self.op(s, [env[a] for a in s.args], nondiff)
                if self.record is not None:
                    self.record[s.out] = env[s.out]
            elif isinstance(s, Checkpoint):
                env.update(zip(s.results, self.region(s, p)(*[env[a] for a in s.args])))
            elif isinstance(s, CustomJVP):
                env.update(zip(s.results, self.jvp_block(s, p, [env[a] for a in s.args])))
            else:
                env.update(zip(s.results, self.block(s, p, [env[a] for a in s.args])))
        return env
