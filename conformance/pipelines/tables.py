"""Lowering tables: one source template per op and framework, shared by a pipeline (which
compiles it) and the repro emitter (which pastes it). Imports no framework.

A template is a Python expression over the framework's names; `{x}`, `{y}` stand for the
op's args, `{<param>}` for its params and `{nondiff}` for the selected nondiff value
(conformance.ir.ops.fill).
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from conformance.ir.nodes import Op, walk
from conformance.ir.ops import ND_INDEX, OPS, fill


@dataclass(frozen=True)
class Lowering:
    expr: str                      # the template
    policy_ops: tuple[str, ...] = ()   # what a policy sees of it (JAX primitive names, aten packets)
    batched_ops: tuple[str, ...] = ()  # ...when it is the batched form (aten.bmm for matmul)
    no_primitive: str = ""             # why policy_ops is empty: a composite of other ops' primitives


def op_source(table: dict[str, Lowering], op: str, args: list[str], params: dict, nondiff: str | None) -> str:
    """The op as source: args are identifiers, params literals (repr of plain JSON data)."""
    return fill(table[op].expr, args, {k: repr(v) for k, v in params.items()}, nondiff)


def compile_table(table: dict[str, Lowering], namespace: dict) -> dict:
    """op -> callable(args, params, nondiff) evaluating the template in `namespace`."""
    out = {}
    for op, low in table.items():
        params = {k: f"p[{k!r}]" for k in OPS[op].params}
        src = fill(low.expr, [f"a[{i}]" for i in range(OPS[op].arity)], params, f"nd[p[{ND_INDEX!r}]]")
        out[op] = eval(f"lambda a, p, nd: {src}", namespace)   # noqa: S307 - the harness's own table
    return out


def unlowered(program, table: dict[str, Lowering]) -> list[str]:
    """Ops the program uses that this table cannot lower."""
    return sorted({s.op for s, _, _, _ in walk(program.body) if isinstance(s, Op) and s.op not in table})


def missing_lowerings(
    tables: dict[str, dict[str, Lowering]], expectations, pipelines: dict[str, list[str]]
) -> list[str]:
    """'<framework>: <op>' for every declared op a framework's table lacks that the expectations
    data does not declare unsupported there: an `unsupported` entry whose features include
    op:<op> and whose pipeline globs cover every pipeline of that framework."""
    out = []
    for fw, table in tables.items():
        for op in OPS:
            if op in table:
                continue
            entries = [e for e in expectations.entries if e.unsupported and f"op:{op}" in e.features]
            if not all(any(fnmatch.fnmatchcase(n, g) for e in entries for g in e.pipelines) for n in pipelines[fw]):
                out.append(f"{fw}: {op}")
    return out


HELPERS_MARK = "# --- helpers: repros paste the source from here on ---\n"


def helpers_source(path) -> str:
    """A framework prelude module's helpers as source text (what follows HELPERS_MARK), read from
    the file so that the table that pastes it imports no framework."""
    text = path.read_text()
    return text[text.index(HELPERS_MARK) + len(HELPERS_MARK):]


def helpers(module) -> dict:
    """A prelude module's helper functions by name (the namespace a table's templates run in)."""
    return {k: v for k, v in vars(module).items() if callable(v) and getattr(v, "__module__", None) == module.__name__}
