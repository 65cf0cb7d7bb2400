"""The Program model (inputs, body, outputs, how it is differentiated), its JSON form and
loading: parse, type-check (conformance.ir.typecheck) and name the field at fault. A program's
features and types are read here (conformance.ir.features, .typecheck), its value index too.
"""
from __future__ import annotations

import hashlib
import json
from functools import cached_property
from typing import Any, Literal

from pydantic import Field, ValidationError

from conformance.ir.batching import value_lengths
from conformance.ir.features import compute_features
from conformance.ir.nodes import (
    _M,
    DERIVATIVE_CTX,
    SCHEMA_VERSION,
    Diff,
    Input,
    Limits,
    NodeInfo,
    Op,
    ProgramError,
    Scan,
    Stmt,
    checkpoint_name_of,
    drop_later_defaults,
    iteration_ids,
    live_values,
    region_context,
    walk,
)
from conformance.ir.policy import POLICY_KINDS
from conformance.ir.typecheck import infer_types


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
        return drop_later_defaults(self.model_dump(mode="json", exclude_defaults=False))

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

    # --- what is derived from it: computed once per program (Analysis), read by the oracles ------
    def analysis(self) -> "Analysis":
        a = self.__dict__.get(_ANALYSIS)   # (not a field: equality, dumps and hashes ignore it)
        if a is None:
            a = self.__dict__[_ANALYSIS] = Analysis(self)
        return a

    def features(self) -> frozenset[str]:
        return self.analysis().features

    def types(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return dict(self.analysis().types)

    def __copy__(self):
        return _fresh(super().__copy__())

    def __deepcopy__(self, memo=None):   # a copy may be changed in place: it analyses itself again
        return _fresh(super().__deepcopy__(memo))


_ANALYSIS = "analysis_cache"


def _fresh(p: Program) -> Program:
    p.__dict__.pop(_ANALYSIS, None)
    return p


class Analysis:
    """A program's types, features, live values, region contexts and value index, each computed
    on first use and kept: search, judge, oracles and pipelines read one program many times.
    Programs are not changed in place once built (a copy analyses itself afresh)."""

    def __init__(self, prog: Program):
        self._prog = prog

    @cached_property
    def types(self) -> dict[str, tuple[tuple[int, ...], str]]:
        return infer_types(self._prog)

    @cached_property
    def features(self) -> frozenset[str]:
        return frozenset(compute_features(self._prog))

    @cached_property
    def live(self) -> frozenset[str]:
        return frozenset(live_values(self._prog))

    @cached_property
    def contexts(self) -> tuple[dict[str, list], frozenset[str]]:
        policies, exempt = region_context(self._prog)
        return policies, frozenset(exempt)

    @cached_property
    def index(self) -> dict[str, NodeInfo]:
        return node_index(self._prog)


def validate(prog: Program, limits: Limits | None = None) -> Program:
    infer_types(prog, limits)
    return prog


_TAGS = {"op", "checkpoint", "custom_vjp", "custom_jvp", "scan", "jit", "cond"}


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


MAX_JSON_NESTING = 200   # far beyond any program within Limits.max_depth


def _nesting(obj: Any) -> int:
    """How deep lists and dicts nest in a JSON object (iteratively: no recursion limit)."""
    deepest, stack = 0, [(obj, 1)]
    while stack:
        x, d = stack.pop()
        if isinstance(x, (list, dict)):
            deepest = max(deepest, d)
            if d > MAX_JSON_NESTING:
                return d
            stack.extend((v, d + 1) for v in (x.values() if isinstance(x, dict) else x))
    return deepest


def load_program(obj: Any, limits: Limits | None = None) -> Program:
    """Parse and validate a program from a JSON object. Raises ProgramError naming the field."""
    if not isinstance(obj, dict):
        raise ProgramError("<root>", f"a program must be a JSON object, got {type(obj).__name__}")
    if _nesting(obj) > MAX_JSON_NESTING:   # before pydantic, whose error messages repr what they reject
        raise ProgramError("<root>", f"nesting too deep (over {MAX_JSON_NESTING} levels)")
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


def node_index(prog: Program) -> dict[str, NodeInfo]:
    """Every primal value id -> where it is defined (derivative-rule values excluded); a value
    inside a scan body (or of a per-example program) also under each of its iteration ids
    (`v@0`, `v@1`, ...)."""
    out = {i.id: NodeInfo(i.id, f"inputs[{k}]", "input", None, 0, "main") for k, i in enumerate(prog.inputs)}
    for s, depth, path, ctx in walk(prog.body):
        if isinstance(s, Op) and ctx not in DERIVATIVE_CTX:
            out[s.out] = NodeInfo(s.out, path, s.op, checkpoint_name_of(s), depth, ctx)
        elif isinstance(s, Scan):
            for k, i in enumerate(s.carry + s.xs):
                out[i] = NodeInfo(i, f"{path}.{'carry' if k < len(s.carry) else 'xs'}", "input", None, depth, ctx)
    for i, lengths in value_lengths(prog).items():
        if i in out:
            for x in iteration_ids(i, lengths):
                out[x] = NodeInfo(x, out[i].path, out[i].op, out[i].name, out[i].region_depth, out[i].ctx)
    return out
