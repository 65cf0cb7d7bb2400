"""Queries over the whole op table (core ops and views): result dtypes, the generator's op
families, shape inference with parameter checks, source templates."""
from __future__ import annotations

from typing import Any

from conformance.ir.ops import views  # noqa: F401  (registers the views and in-place ops)
from conformance.ir.ops.core import OPS, OpDecl, ParamError
from conformance.ir.ops.selection import DATA_DEPENDENT, FUNC_TRANSFORMS, MULTI_OUTPUT

# Families a program draws from only where its campaign opts in (the swarm dimension of the same name)
OPT_IN_FAMILIES = (MULTI_OUTPUT, DATA_DEPENDENT, FUNC_TRANSFORMS)


def result_dtype(op: str, params: dict, arg_dtype: str) -> str:
    """The dtype of an op's output whose first input has `arg_dtype`."""
    d = OPS[op]
    return d.out_dtype(params) if d.out_dtype else arg_dtype


def _generated(d: OpDecl, in_rule: bool, nondiff: bool) -> bool:
    return (d.gen is not None and (not d.in_rules_only or (in_rule and nondiff)) and (not d.in_fwd_only or in_rule)
            and (not in_rule or d.vjp is not None))


def generated_families(in_rule: bool, nondiff: bool = False, opt_in=()) -> list[str]:
    """Generator families in declaration order (the first is the simplest). In a custom rule
    (`in_rule`) only ops with a derivative; in-rule-only ops where the block has nondiff args;
    OPT_IN_FAMILIES only those named in `opt_in`."""
    out = []
    for d in OPS.values():
        if d.family in OPT_IN_FAMILIES and d.family not in opt_in:
            continue
        if _generated(d, in_rule, nondiff) and d.family not in out:
            out.append(d.family)
    return out


def family_ops(family: str, in_rule: bool, nondiff: bool = False) -> list[str]:
    return [d.name for d in OPS.values() if d.family == family and _generated(d, in_rule, nondiff)]


def infer(op: str, shapes: list[tuple], params: dict, nondiff: list[float]) -> tuple:
    """Output shape of one op, validating arity and params; raises ParamError."""
    d = OPS.get(op)
    if d is None:
        raise ParamError("op", f"unknown op {op!r}; known: {sorted(OPS)}")
    if len(shapes) != d.arity:
        raise ParamError("args", f"{op} takes {d.arity} args, got {len(shapes)}")
    extra, missing = set(params) - set(d.params), set(d.params) - set(params)
    if extra:
        raise ParamError("params", f"unexpected params {sorted(extra)} for {op}")
    if missing:
        raise ParamError("params", f"missing params {sorted(missing)} for {op}")
    return tuple(d.infer([tuple(s) for s in shapes], params, nondiff))


def fill(template: str, args: list[str], params: dict[str, str], nondiff: str | None = None) -> str:
    """A source template with its placeholders filled: {x}, {y} are the args, {<param>} the
    params' source text, {nondiff} the selected nondiff value."""
    names = dict(zip(("x", "y"), args))
    return template.format(**names, **params, nondiff=nondiff or "")


def pseudo(op: str, args: list[str], params: dict[str, Any]) -> str:
    d = OPS[op]
    if d.pseudo:
        return fill(d.pseudo, args, {k: repr(v) for k, v in params.items()})
    kw = ", ".join(f"{k}={v!r}" for k, v in params.items())
    return f"{op}({', '.join(args)}{', ' + kw if kw else ''})"
