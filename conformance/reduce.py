"""Reductions of a shrunk program: deterministic IR rewrites tried after Hypothesis's shrink.

Hypothesis shrinks choice sequences, and stops at its step budget; what it leaves often holds
a statement nothing needs or a policy kind that is not the behaviour's. Each candidate here is
one rewrite of the whole program (smaller, or the same size with the simplest policy kind);
the campaign keeps one when the finding's verdict still fails on it, and tries again from
there. Candidates are valid programs (checked with `validate`), simplest rewrites first.
"""
from __future__ import annotations

import copy
from typing import Iterator

from conformance.ir import Program, ProgramError, load_program
from conformance.ops import NAME_OPS
from conformance.policy import KINDS

SIMPLEST_POLICY = {"kind": next(iter(KINDS))}


def _refs(stmt: dict) -> set[str]:
    """Every value id a statement reads or defines, at any depth (an over-approximation of
    what it reads: keeping too much is safe)."""
    out: set[str] = set()
    stack = [stmt]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            for k, v in x.items():
                if k in ("args", "results", "residuals", "cts", "bwd_results", "tangents", "jvp_results"):
                    out.update(a for a in v if isinstance(a, str))
                elif k in ("body", "fwd", "bwd", "jvp"):
                    stack.extend(v)
    return out


def _defines(stmt: dict) -> list[str]:
    return [stmt["out"]] if stmt["kind"] == "op" else list(stmt["results"])


def _dce(body: list, live: set[str]) -> list:
    """The statements of `body` some of whose values `live` (the values read after it) needs,
    each inner body reduced the same way."""
    kept: list = []
    live = set(live)
    for s in reversed(body):
        if not any(d in live for d in _defines(s)):
            continue
        if s["kind"] == "checkpoint":   # the results nothing reads go, and what only they needed
            res = [r for r in s["results"] if r in live]
            s = {**s, "results": res, "body": _dce(s["body"], set(res))}
        elif s["kind"] == "custom_vjp":
            s = {**s, "fwd": _dce(s["fwd"], set(s["results"]) | set(s["residuals"])),
                 "bwd": _dce(s["bwd"], {b for b in s["bwd_results"] if b})}
        kept.append(s)
        live |= _refs(s)
    return kept[::-1]


def _statements(body: list, path=()) -> Iterator[tuple[tuple, dict]]:
    """(path, statement) for every statement of the primal code: regions' bodies, custom_vjp fwd
    rules and custom_jvp bodies included (never a bwd or jvp rule)."""
    for i, s in enumerate(body):
        yield path + (i,), s
        for key in {"checkpoint": ("body",), "custom_vjp": ("fwd",), "custom_jvp": ("body",)}.get(s["kind"], ()):
            yield from _statements(s[key], path + (i, key))


def _regions(body: list) -> Iterator[tuple[tuple, dict]]:
    return ((p, s) for p, s in _statements(body) if s["kind"] == "checkpoint")


_ID_LISTS = ("args", "results", "residuals", "bwd_results", "jvp_results", "outputs")


def _substitute(x, old: str, new: str):
    """`x` with every reference to value `old` read as `new`."""
    if isinstance(x, dict):
        return {k: ([new if a == old else a for a in v] if k in _ID_LISTS else _substitute(v, old, new))
                for k, v in x.items()}
    if isinstance(x, list):
        return [_substitute(v, old, new) for v in x]
    return x


def _at(obj: dict, path: tuple) -> dict:
    x = obj["body"]
    for p in path:
        x = x[p]
    return x


def candidates(prog: Program) -> Iterator[Program]:
    """Rewrites of `prog`, simplest first: dead statements removed; one program output dropped
    (and what only it needed); one region inlined; one checkpoint name dropped; one region's
    policy replaced by the simplest kind."""
    obj = prog.to_json_obj()
    seen = {prog.content_hash()}

    def emit(o):
        try:
            p = load_program(o)
        except ProgramError:
            return None
        if p.content_hash() in seen or p.size() > prog.size():
            return None
        seen.add(p.content_hash())
        return p

    outs = obj["outputs"]
    for o in [{**obj, "body": _dce(obj["body"], set(outs))}] + [
            {**obj, "outputs": [x for x in outs if x != drop], "body": _dce(obj["body"], set(outs) - {drop})}
            for drop in outs if len(outs) > 1]:
        if (p := emit(o)) is not None:
            yield p
    for path, region in _regions(obj["body"]):   # a region inlined: its body in its place
        o = copy.deepcopy(obj)
        _at(o, path[:-1])[path[-1]:path[-1] + 1] = region["body"]
        if (p := emit(o)) is not None:
            yield p
    for path, s in _statements(obj["body"]):   # a name dropped: its readers read what it names
        if s["kind"] == "op" and s["op"] in NAME_OPS:
            o = copy.deepcopy(obj)
            del _at(o, path[:-1])[path[-1]]
            if (p := emit(_substitute(o, s["out"], s["args"][0]))) is not None:
                yield p
    for path, region in _regions(obj["body"]):
        if region["policy"] == SIMPLEST_POLICY:
            continue
        o = copy.deepcopy(obj)
        _at(o, path)["policy"] = dict(SIMPLEST_POLICY)
        if (p := emit(o)) is not None:
            yield p
