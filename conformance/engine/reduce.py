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

from conformance.ir.nodes import (
    BODY_FIELDS,
    BOUND_ID_FIELDS,
    ID_LISTS_FIELDS,
    LATER_OPTIONS,
    OPTIONS_NEEDING,
    READ_ID_FIELDS,
    Op,
    ProgramError,
)
from conformance.ir.ops import NAME_OPS, OPS, SCALE_OP, SIMPLEST_OP
from conformance.ir.policy import KINDS
from conformance.ir.program import Program, load_program
from generators.irgrad import jvp_ops, residuals_of, scale_result, vjp_ops

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
                if k in READ_ID_FIELDS + BOUND_ID_FIELDS:
                    out.update(a for a in v if isinstance(a, str))
                elif k in BODY_FIELDS:
                    stack.extend(v)
                elif k == "branches" or k in ID_LISTS_FIELDS:   # lists of lists
                    for b in v:
                        (stack.extend if k == "branches" else out.update)(b)
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
        if s["kind"] in ("checkpoint", "jit"):   # the results nothing reads go, and what only they needed
            res = [r for r in s["results"] if r in live]
            s = {**s, "results": res, "body": _dce(s["body"], set(res))}
        elif s["kind"] == "custom_vjp":
            s = {**s, "fwd": _dce(s["fwd"], set(s["results"]) | set(s["residuals"])),
                 "bwd": _dce(s["bwd"], {b for b in s["bwd_results"] if b})}
        elif s["kind"] == "cond":   # each branch keeps what its results need
            s = {**s, "branches": [_dce(b, set(rs)) for b, rs in zip(s["branches"], s["branch_results"])]}
        elif s["kind"] == "scan":   # the stacked outputs nothing reads go (the carries stay)
            nc = len(s["carry"])
            keep = [j for j, r in enumerate(s["results"][nc:]) if r in live]
            ys = [s["ys"][j] for j in keep]
            s = {**s, "ys": ys, "results": s["results"][:nc] + [s["results"][nc + j] for j in keep],
                 "body": _dce(s["body"], set(s["carry_out"]) | set(ys))}
        kept.append(s)
        live |= _refs(s)
    return kept[::-1]


def _statements(body: list, path=()) -> Iterator[tuple[tuple, dict]]:
    """(path, statement) for every statement of the primal code: regions' bodies, custom_vjp fwd
    rules and custom_jvp bodies included (never a bwd or jvp rule)."""
    for i, s in enumerate(body):
        yield path + (i,), s
        for key in {"checkpoint": ("body",), "custom_vjp": ("fwd",), "custom_jvp": ("body",),
                    "scan": ("body",), "jit": ("body",)}.get(s["kind"], ()):
            yield from _statements(s[key], path + (i, key))
        for j, b in enumerate(s["branches"] if s["kind"] == "cond" else []):
            yield from _statements(b, path + (i, "branches", j))


def _regions(body: list, kinds=("checkpoint",)) -> Iterator[tuple[tuple, dict]]:
    return ((p, s) for p, s in _statements(body) if s["kind"] in kinds)


_ID_LISTS = READ_ID_FIELDS + ("outputs",)   # (a program's outputs read values too)


def _substitute(x, old: str, new: str):
    """`x` with every reference to value `old` read as `new`."""
    if isinstance(x, dict):
        return {k: ([new if a == old else a for a in v] if k in _ID_LISTS else
                    [[new if a == old else a for a in rs] for rs in v] if k in ID_LISTS_FIELDS else
                    _substitute(v, old, new))
                for k, v in x.items()}
    if isinstance(x, list):
        return [_substitute(v, old, new) for v in x]
    return x


def _at(obj: dict, path: tuple) -> dict:
    x = obj["body"]
    for p in path:
        x = x[p]
    return x


# -- custom rules re-derived after a rewrite of the primal code they differentiate ----------

_RULES = {"custom_vjp": ("bwd", "bwd_results"), "custom_jvp": ("jvp", "jvp_results")}   # rule, results


def _all_ids(obj: dict) -> set[str]:
    ids = {i["id"] for i in obj["inputs"]}
    for s in obj["body"]:
        ids |= _refs(s)
    stack = list(obj["body"])
    while stack:   # op outputs and rule-local ids
        x = stack.pop()
        if isinstance(x, dict):
            if x.get("kind") == "op":
                ids.add(x["out"])
            ids.update(a for a in x.get("tangents", []) + x.get("cts", []) + x.get("carry", []) + x.get("xs", [])
                       if isinstance(a, str))
            for k in ("body", "fwd", "bwd", "jvp"):
                stack.extend(x.get(k, []))
            for b in x.get("branches", []) if x.get("kind") == "cond" else []:
                stack.extend(b)
    return ids


def _scaled(rule: list, results: list) -> tuple[int, float] | None:
    """(index, factor) of the result a deliberately non-standard rule scales, if one."""
    for s in rule:
        if s["kind"] == "op" and s["op"] == SCALE_OP and s["out"] in results:
            return results.index(s["out"]), s["params"]["c"]
    return None


def _rederive(body: list, types: dict, fresh) -> list:
    """`body` with every custom rule in it derived again from its primal code (as the generator
    derives it: true derivative, the same result scaled when the rule scaled one). Raises
    ValueError where a rule is not made of plain ops."""
    out = []
    for s in body:
        if s["kind"] in ("checkpoint", "scan", "jit"):
            s = {**s, "body": _rederive(s["body"], types, fresh)}
        elif s["kind"] == "cond":
            s = {**s, "branches": [_rederive(b, types, fresh) for b in s["branches"]]}
        elif s["kind"] == "custom_jvp":
            ops = [Op.model_validate(x) for x in s["body"]]   # ValueError: not plain ops
            jvp, tan = jvp_ops(ops, types, s["args"], s["tangents"], fresh)
            res = [tan[r] for r in s["results"]]
            if (sc := _scaled(s["jvp"], s["jvp_results"])) is not None:
                jvp, res = scale_result(jvp, res, *sc, fresh)
            s = {**s, "jvp": [o.model_dump(mode="json") for o in jvp], "jvp_results": res}
        elif s["kind"] == "custom_vjp":
            fwd = _rederive(s["fwd"], types, fresh)
            flat = [Op.model_validate(x) for t in fwd for x in (t["body"] if t["kind"] == "custom_jvp" else [t])]
            bwd, argct, used = vjp_ops(flat, types, s["results"], s["cts"], s["args"], fresh)
            res = [argct.get(a) for a in s["args"]]
            if (sc := _scaled(s["bwd"], s["bwd_results"])) is not None:
                bwd, res = scale_result(bwd, res, *sc, fresh)
            s = {**s, "fwd": fwd, "bwd": [o.model_dump(mode="json") for o in bwd], "bwd_results": res,
                 "residuals": residuals_of(used, s["args"], flat)}
        out.append(s)
    return out


def _in_rule(obj: dict, path: tuple) -> bool:
    """Whether the statement at `path` is inside a custom rule's primal code."""
    x = obj["body"]
    for p in path[:-1]:
        x = x[p]
        if isinstance(x, dict) and x.get("kind") in _RULES:
            return True
    return False


def _fresh_ids(obj: dict):
    """A maker of value ids (r0, r1, ...) that `obj` does not use yet."""
    taken = _all_ids(obj)
    n = [0]

    def fresh():
        while f"r{n[0]}" in taken:
            n[0] += 1
        taken.add(f"r{n[0]}")
        return f"r{n[0]}"
    return fresh


def _rederived(obj: dict, types: dict) -> dict | None:
    """`obj` with every rule derived again from its primal code (the primal values keep their
    `types`); None where a rule cannot be."""
    try:
        return {**obj, "body": _rederive(obj["body"], types, _fresh_ids(obj))}
    except (ValueError, KeyError):
        return None


def _rederive_all(obj: dict, types: dict, path: tuple) -> dict | None:
    """`obj` after a rewrite of the statement at `path`: when that is inside a custom rule's
    primal code, every rule derived again (_rederived); otherwise `obj` as it is."""
    return _rederived(obj, types) if _in_rule(obj, path) else obj


def _simpler_ops(obj: dict, types: dict) -> Iterator[dict]:
    """One unary op of a custom rule's primal code, of an unchanged type, replaced by
    SIMPLEST_OP, the rules that differentiate it derived again (a residual the old op's
    derivative read goes with it). Plain code keeps its ops: they are what policies decide on."""
    for path, s in _statements(obj["body"]):
        if (
            s["kind"] != "op"
            or not _in_rule(obj, path)
            or s["op"] == SIMPLEST_OP
            or s["op"] in NAME_OPS
            or len(s["args"]) != 1
            or OPS[s["op"]].arity != 1
            or types.get(s["out"]) != types.get(s["args"][0])
        ):
            continue
        o = copy.deepcopy(obj)
        _at(o, path).update(op=SIMPLEST_OP, params={})
        if (r := _rederive_all(o, types, path)) is not None:
            yield r


def _unscaled(obj: dict) -> Iterator[dict]:
    """One deliberately non-standard rule made standard: its scale statement dropped."""
    for path, s in _statements(obj["body"]):
        if s["kind"] not in _RULES:
            continue
        rule, results = _RULES[s["kind"]]
        sc = _scaled(s[rule], s[results])
        if sc is None:
            continue
        o = copy.deepcopy(obj)
        blk = _at(o, path)
        op = next(x for x in blk[rule] if x["kind"] == "op" and x["out"] == blk[results][sc[0]])
        blk[rule].remove(op)
        blk[results][sc[0]] = op["args"][0]
        yield o


def _scans_simplified(obj: dict, types: dict) -> Iterator[dict]:
    """One scan of one iteration over no sequence inlined (its body on the initial carry, each
    stacked output a broadcast of its one value); one such scan of more iterations cut to one."""
    for path, s in _statements(obj["body"]):
        if s["kind"] != "scan" or s["xs"]:
            continue
        if s["length"] > 1:
            o = copy.deepcopy(obj)
            _at(o, path).update(length=1, unroll=1)
            yield o
            continue
        nc = len(s["carry"])
        body = copy.deepcopy(s["body"])
        for c, a in zip(s["carry"], s["args"][:nc]):
            body = _substitute(body, c, a)
        for y, r in zip(s["ys"], s["results"][nc:]):
            body.append({"kind": "op", "op": "broadcast", "args": [_carried(y, s)], "out": r,
                         "params": {"shape": [1] + list(types[y][0])}})
        o = copy.deepcopy(obj)
        _at(o, path[:-1])[path[-1]:path[-1] + 1] = body
        for r, c in zip(s["results"][:nc], s["carry_out"]):
            o = _substitute(o, r, _carried(c, s))
        yield o


def _results_dropped(obj: dict, types: dict) -> Iterator[dict | None]:
    """One result of a custom_vjp block dropped (with its cotangent, and the fwd code only it
    needed), the rules derived again from the primal code; a result something reads fails to load."""
    for path, s in _statements(obj["body"]):
        if s["kind"] != "custom_vjp" or len(s["results"]) < 2:
            continue
        for r in dict.fromkeys(s["results"]):   # (a value returned twice: both copies)
            keep = [k for k, x in enumerate(s["results"]) if x != r]
            if not keep:
                continue
            results = [s["results"][k] for k in keep]
            o = copy.deepcopy(obj)
            _at(o, path).update(results=results, cts=[s["cts"][k] for k in keep],
                                fwd=_dce(copy.deepcopy(s["fwd"]), set(results)))
            yield _rederived(o, types)   # (None: candidates' emit skips it)


def _carried(i: str, s: dict) -> str:
    """An id of a one-iteration scan's body as its inlined body names it (a carry: its initial value)."""
    nc = len(s["carry"])
    return dict(zip(s["carry"], s["args"][:nc])).get(i, i)


def _plain_options(obj: dict) -> Iterator[dict]:
    """One statement's option, or the diff's, set to its plain value (ir.LATER_OPTIONS: a rule's
    pytree or spelling, a region's static flag, auxiliary outputs, seeded cotangents...)."""
    for key, plain in LATER_OPTIONS["diff"].items():
        if obj["diff"].get(key, plain) != plain:
            o = {**obj, "diff": {**obj["diff"], key: plain}}
            if key == "batch":   # no longer per example: no input holds examples
                o["inputs"] = [{**i, "batched": False} for i in obj["inputs"]]
            yield o
    # the simplest differentiation: first-order reverse mode, or reverse over reverse
    diff = {**obj["diff"]}
    for plain in ({"order": 1, "mode": "reverse"}, {"order": 2, "mode": "reverse"}):
        if any(diff.get(k, v) != v for k, v in plain.items()) and plain["order"] <= diff.get("order", 1):
            yield {**obj, "diff": {**diff, **plain}}
    for k, i in enumerate(obj["inputs"]):   # an input differentiated after all
        if not i.get("diff", True):
            yield {**obj, "inputs": [{**x, "diff": True} if j == k else x for j, x in enumerate(obj["inputs"])]}
    batched = [k for k, i in enumerate(obj["inputs"]) if i.get("batched")]
    for k in batched if len(batched) > 1 else []:   # one input shared instead of per example
        yield {**obj, "inputs": [{**i, "batched": False} if j == k else i for j, i in enumerate(obj["inputs"])]}
    for path, s in _statements(obj["body"]):
        later = LATER_OPTIONS.get(s["kind"], {})
        for key, plain in later.items():
            if s.get(key, plain) != plain:
                o = copy.deepcopy(obj)
                _at(o, path).update({key: plain, **{k: later[k] for k in OPTIONS_NEEDING.get(key, ())}})
                yield o


def _fit_regions(obj: dict) -> dict:
    """A rewrite that made a region (or jitted sub-function) read one value twice (an op bypassed:
    its readers read its argument) passes it once; a per-argument prevent_cse keeps the first
    occurrence's bool."""
    for _, s in _statements(obj["body"]):
        if s["kind"] not in ("checkpoint", "jit"):
            continue
        keep = [k for k, a in enumerate(s["args"]) if a not in s["args"][:k]]
        if len(keep) == len(s["args"]):
            continue
        if len(s.get("prevent_cse_args") or []) == len(s["args"]):
            s["prevent_cse_args"] = [s["prevent_cse_args"][k] for k in keep]
        s["args"] = [s["args"][k] for k in keep]
    return obj


def candidates(prog: Program) -> Iterator[Program]:
    """Rewrites of `prog`, simplest first: dead statements removed; one program output dropped
    (and what only it needed); one region or jitted sub-function inlined; one custom rule's block inlined; one
    result of a custom_vjp block dropped (a result nothing reads, with its cotangent); one op
    bypassed (a checkpoint name, or an op one of whose arguments has its type); one scan cut to
    one iteration, or inlined when it has one; one cond replaced by one of its branches; one unary op of
    a custom rule replaced by the simplest one; one non-standard rule made standard; one option
    of a statement or of the diff set to its plain value (first-order reverse mode; an input
    differentiated); one region's policy replaced by the
    simplest kind. Rules whose primal code changed are derived
    again from it, as the generator derives them."""
    obj = prog.to_json_obj()
    seen = {prog.content_hash()}

    def emit(o):
        if o is None:
            return None
        try:
            p = load_program(_fit_regions(o))
        except ProgramError:
            return None
        if p.content_hash() in seen or p.size() > prog.size() or not p.body:
            return None
        seen.add(p.content_hash())
        return p

    outs = obj["outputs"]
    for o in [{**obj, "body": _dce(obj["body"], set(outs))}] + [
            {**obj, "outputs": [x for x in outs if x != drop], "body": _dce(obj["body"], set(outs) - {drop})}
            for drop in outs if len(outs) > 1]:
        if (p := emit(o)) is not None:
            yield p
    for path, region in _regions(obj["body"], ("checkpoint", "jit")):   # a region (or jit) inlined: its body
        o = copy.deepcopy(obj)
        _at(o, path[:-1])[path[-1]:path[-1] + 1] = region["body"]
        if (p := emit(o)) is not None:
            yield p
    types = prog.types()
    for o in _scans_simplified(obj, types):
        if (p := emit(o)) is not None:
            yield p
    for path, s in _statements(obj["body"]):   # a cond replaced by one of its branches
        if s["kind"] == "cond":
            for b, rs in zip(s["branches"], s["branch_results"]):
                o = copy.deepcopy(obj)
                _at(o, path[:-1])[path[-1]:path[-1] + 1] = copy.deepcopy(b)
                for r, src in zip(s["results"], rs):
                    o = _substitute(o, r, src)
                if (p := emit(o)) is not None:
                    yield p
    for path, s in _statements(obj["body"]):   # a custom rule's block inlined: its primal code
        if s["kind"] in _RULES:
            o = copy.deepcopy(obj)
            _at(o, path[:-1])[path[-1]:path[-1] + 1] = s["fwd" if s["kind"] == "custom_vjp" else "body"]
            if (p := emit(_rederive_all(o, types, path))) is not None:
                yield p
    for path, s in _statements(obj["body"]):   # an op bypassed: its readers read an argument of its type
        if s["kind"] != "op":
            continue
        for a in dict.fromkeys(s["args"]):
            if s["op"] not in NAME_OPS and types.get(a) != types.get(s["out"]):
                continue
            o = copy.deepcopy(obj)
            del _at(o, path[:-1])[path[-1]]
            if (p := emit(_rederive_all(_substitute(o, s["out"], a), types, path))) is not None:
                yield p
    for o in _results_dropped(obj, types):
        if (p := emit(o)) is not None:
            yield p
    for o in _simpler_ops(obj, types):
        if (p := emit(o)) is not None:
            yield p
    for o in _unscaled(obj):
        if (p := emit(o)) is not None:
            yield p
    for o in _plain_options(obj):
        if (p := emit(o)) is not None:
            yield p
    for path, region in _regions(obj["body"]):
        if region["policy"] == SIMPLEST_POLICY:
            continue
        o = copy.deepcopy(obj)
        _at(o, path)["policy"] = dict(SIMPLEST_POLICY)
        if (p := emit(o)) is not None:
            yield p
