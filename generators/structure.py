"""The item stream's structure beyond regions and custom rules: scans (fori/while loops and vmaps
are their spellings) and conds. A scan's body sees its slice and carry; at its close its body
values leave the scope and its final carry and stacked outputs enter it. A cond's first branch is
drawn; the others are derived from it (its ids renamed, its elementwise nonlinear ops of plain
code replaced), so that branches differ and share types.

Mixed into the generator (generators.programs._Gen), whose state these methods read.
"""
from __future__ import annotations

from conformance.ir import ops as O
from conformance.ir.nodes import (
    BOUND_ID_FIELDS,
    ID_LISTS_FIELDS,
    READ_ID_FIELDS,
    Cond,
    CustomJVP,
    CustomVJP,
    Input,
    Op,
    Scan,
    free_vars,
    walk,
)
from conformance.ir.program import Program as _P
from generators.draws import BOOL, draw_int
from generators.frames import Frame, Val, chain
from generators.swarm import SCAN_LENGTHS

# A cond's other branches: its first branch with each elementwise nonlinear op of the primal code
# replaced by one of these (branch k by the k-th), so that branches differ and share types.
BRANCH_OPS = (O.SIMPLEST_OP, O.FALLBACK_OP)


class Structure:
    """Scans and conds of the item stream (a mixin of the generator)."""

    def _open_scan(self, g: Frame):
        """A scan's choices: its length, unroll, whether it scans over a stacked input (a new
        input, e.g. per-layer weights), and its carry's initial value. The body sees the slice,
        then the carry (the newest value: the body's ops chain from it)."""
        sw, draw = self.sw, self.draw
        length = SCAN_LENGTHS[draw_int(draw, 0, len(SCAN_LENGTHS) - 1, "scan_length")]
        unroll = length if sw["scan_unroll"] and draw(BOOL, label="scan_unroll") else 1
        with_xs = sw["scan_xs"] and draw(BOOL, label="scan_xs")
        spellings = self.cfg.loop_spellings
        spelling = spellings[draw_int(draw, 0, len(spellings) - 1, "loop_spelling")] if (
            sw["loop_spellings"]) else spellings[0]
        init = self.operand()
        self.read.add(init.id)
        room = len(init.shape) < 3 and len(self.inputs) < self.cfg.max_inputs
        if spelling == "vmap" and not room:
            spelling = "scan"   # a vmap needs a stacked input
        if spelling in ("fori_loop", "while_loop"):
            with_xs = False   # carries only
        if spelling == "vmap":
            with_xs, unroll = True, 1
        xs = []
        if with_xs and room:
            seq = self._input((length,) + tuple(init.shape), dtype=init.dtype)
            w = Val(self.fresh("w"), init.shape, seq.dtype, seq.mag)
            self.types[w.id] = (w.shape, w.dtype)
            self.scope.append(w)
            xs.append((seq, w))
        c = None
        if spelling != "vmap":   # a vmap carries nothing: its body chains from the slice
            c = Val(self.fresh("c"), init.shape, init.dtype, init.mag)
            self.types[c.id] = (c.shape, c.dtype)
            self.scope.append(c)
        g.scan = {"length": length, "unroll": unroll, "init": init, "carry": c, "xs": xs, "spelling": spelling}

    def _predicate(self) -> str | None:
        """A cond's predicate: the first input that is not differentiated, or a new one (None
        where there is none and no room for one)."""
        for i in self.inputs:
            if not i.diff:
                return i.id
        return "new" if len(self.inputs) < self.cfg.max_inputs else None

    def _open_cond(self, g: Frame):
        n = 3 if self.sw["cond_switch"] and self.draw(BOOL, label="switch") else 2
        shape = self._shape()   # (drawn whether or not a new input takes it)
        pred = self._predicate()
        if pred == "new":
            pred = f"x{len(self.inputs)}"
            self.inputs.append(Input(id=pred, shape=list(shape), dtype=self.dtype, diff=False))
            self.types[pred] = (tuple(shape), self.dtype)
        g.scan = {"pred": pred, "branches": n}

    def _close(self, f: Frame):
        """Leave frame f; a scan's body values leave the scope, its final carry and stacked
        outputs enter it."""
        self.frame = f.parent
        if f.kind == "cond":
            return self._close_cond(f)
        if f.kind != "scan":
            return
        sc = f.scan
        c = sc["carry"]
        inner = {w.id for _, w in sc["xs"]} | ({c.id} if c else set())
        body = [v for v in self.scope if v.id in inner or (v.id in self.home and f in chain(self.home[v.id]))]
        self.scope = [v for v in self.scope if v not in body]
        defined = [v for v in body if v.id not in inner]
        res = []
        sc["carry_out"] = None
        if c is not None:
            same = [v for v in defined if (v.shape, v.dtype) == (c.shape, c.dtype)]
            out = same[-1] if same else c
            grow = out.mag / max(c.mag, 1e-6)
            if out is not c and c.mag * grow ** sc["length"] > O.MAX_MAG:
                out = c   # a carry compounding past the magnitude bound: the body leaves it as it is
            sc["carry_out"] = out.id
            res.append(Val(self.fresh("s"), c.shape, c.dtype, max(c.mag, out.mag * (grow if out is not c else 1.0))))
        ys = [defined[-1]] if defined and len(defined[-1].shape) < 3 else []
        if sc["spelling"] in ("fori_loop", "while_loop"):
            ys = []
        elif sc["spelling"] == "vmap" and not ys:
            ys = [sc["xs"][0][1]]   # the slice itself when the body's newest value has rank 3
        sc["ys"] = [y.id for y in ys]
        res += [Val(self.fresh("s"), (sc["length"],) + tuple(y.shape), y.dtype, y.mag) for y in ys]
        for r in res:
            self.types[r.id] = (r.shape, r.dtype)
            self.home[r.id] = f.parent
            self.scope.append(r)
        sc["results"] = [r.id for r in res]

    def _close_cond(self, f: Frame):
        """A cond's branch values leave the scope; its result (the first branch's newest value) enters."""
        body = [v for v in self.scope if v.id in self.home and f in chain(self.home[v.id])]
        self.scope = [v for v in self.scope if v not in body]
        src = body[-1]
        r = Val(self.fresh("s"), src.shape, src.dtype, src.mag)
        self.types[r.id] = (r.shape, r.dtype)
        self.home[r.id] = f.parent
        self.scope.append(r)
        f.scan.update(source=src.id, result=r.id)

    def _cond(self, it: Frame, inner) -> Cond:
        """The cond of a frame: its first branch as generated, the others derived from it."""
        c = it.scan
        ops = free_vars(inner)
        first = [x.model_dump(mode="json") for x in inner]
        branches, results = [inner], [[c["source"]]]
        for k in range(1, c["branches"]):
            b, rename = _other_branch(first, BRANCH_OPS[k - 1], f"_{c['result']}b{k}")
            branches.append(b)
            results.append([rename.get(c["source"], c["source"])])
        return Cond(args=[c["pred"]] + ops, branches=branches, branch_results=results, results=[c["result"]])

    @staticmethod
    def _scan(it: Frame, inner) -> Scan:
        sc = it.scan
        carry, xs = ([sc["carry"].id] if sc["carry"] else []), [w.id for _, w in sc["xs"]]
        consts = [a for a in free_vars(inner) if a not in carry + xs]
        init = [sc["init"].id] if carry else []
        return Scan(args=init + [q.id for q, _ in sc["xs"]] + consts, carry=carry, xs=xs, body=inner,
                    carry_out=[sc["carry_out"]] if carry else [], ys=sc["ys"], results=sc["results"],
                    length=sc["length"], unroll=sc["unroll"], spelling=sc["spelling"])



_ID_FIELDS = READ_ID_FIELDS + BOUND_ID_FIELDS


def _other_branch(first: list, op: str, suffix: str) -> tuple[list, dict]:
    """A copy of a cond's first branch (as JSON) with every id it defines renamed (+suffix) and
    every elementwise nonlinear op of its plain code (outside custom rules, whose rules are
    derived from theirs) replaced by `op`. Returns (statements, the renaming)."""
    stmts = _P.model_validate({"inputs": [], "body": first, "outputs": []}).body
    defined = set()
    for s, _, _, ctx in walk(stmts):
        defined.update([s.out] if isinstance(s, Op) else list(s.results))
        defined.update(
            getattr(s, "cts", []) + getattr(s, "tangents", []) + getattr(s, "carry", []) + getattr(s, "xs", [])
        )
    rename = {i: i + suffix for i in defined}
    plain = {s.out for s, _, _, ctx in walk(stmts) if isinstance(s, Op) and ctx == "main" and _in_plain(stmts, s)}

    def visit(x):
        if isinstance(x, list):
            return [visit(v) for v in x]
        if not isinstance(x, dict):
            return x
        out = {}
        for k, v in x.items():
            if k in _ID_FIELDS or k == "out":
                out[k] = rename.get(v, v) if isinstance(v, str) else [rename.get(a, a) if isinstance(a, str) else a
                                                                     for a in v]
            elif k in ID_LISTS_FIELDS:
                out[k] = [[rename.get(a, a) for a in rs] for rs in v]
            else:
                out[k] = visit(v)
        if x.get("kind") == "op" and x["out"] in plain and O.OPS[x["op"]].tangent == "diagonal":
            out.update(op=op, params={})
        return out
    return [visit(s) for s in first], rename


def _in_plain(stmts, target) -> bool:
    """Whether an op stands in plain code: outside every custom rule (its fwd, body and rules)."""
    def visit(body, plain):
        for s in body:
            if s is target:
                return plain
            inner = [(b, plain and not isinstance(s, (CustomVJP, CustomJVP)))
                     for b in ([s.fwd, s.bwd] if isinstance(s, CustomVJP) else [s.body, s.jvp]
                               if isinstance(s, CustomJVP) else s.branches if isinstance(s, Cond)
                               else [s.body] if not isinstance(s, Op) else [])]
            for b, p in inner:
                r = visit(b, p)
                if r is not None:
                    return r
        return None
    return bool(visit(stmts, True))
