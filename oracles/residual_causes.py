"""The cause of a residual difference: for each value one pipeline saves and the other does not, the
decision behind it, read from what a residual verdict's detail already holds (the canonical classes
of both saved sets) and the program (what each class's value is, where a name was given, which
regions' policies decide on it, how the program is differentiated).

A cause is one short line, the same for every program whose difference has that cause:
    recomputes a value named in a custom_vjp fwd [names:save]
    saves a value outside every region the loss does not read
    saves against its policy an op's output [nothing:recompute], second order (fwd_over_rev)
  verb      recomputes (the reference saves it), saves (the reference does not), saves against its
            policy (a value every enclosing policy says to recompute), recomputes against its policy (a
            value the policy asked the pipeline to save)
  value     what the value is: a value named in plain code / in a custom_vjp fwd / in a custom_jvp
            function / by checkpoint_name_fwd, a custom_vjp residual (an optimize_remat one's is its own), a
            loop carry or slice, a program input, a cond branch's result, a dot's output, a view's output, an op's
            output, an unmatched value; "the loss does not read" where no cotangent reaches it (no differentiated
            output depends on it but through a piecewise-constant op) or only code no cotangent reaches needs its
            value, and an unmatched value "shaped as one the loss does not read" where such a value has its shape; an
            unmatched value recomputed "shaped as" the output of an op a policy keeps whose derivative reads values
            (sin's cos), that op's decision
  decision  each enclosing region's policy, outermost first: what it read to decide (KindDecl.rule: names,
            dots, everything, everything_but_names, custom, nothing) and its decision; a value outside every
            region (a program input, a region's argument made outside it) is one cause whatever it is, as no
            policy decides on it ("saves a value outside every region"), but for a loop's carry or slice
            (`[boundary]`: the scan's own)
  diff      the differentiation where it is not plain reverse mode (second order's mode, per example)
A class of equal values is described by the member a policy saves (else the most specific member): a
name tag whose producer a policy saves is that op's output, as the policy decided. Where a pipeline
recomputes a value, what it saves at a boundary instead (the region's input the recompute starts from)
is that cause's consequence, not a cause of its own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from conformance.ir.nodes import (
    DERIVATIVE_CTX,
    Checkpoint,
    Cond,
    CustomVJP,
    Op,
    Scan,
    base_id,
    checkpoint_name_of,
    children,
    input_elements,
    live_values,
    primal_ops,
    walk,
)
from conformance.ir.ops import EFFECT_OP, MULTI_OUTPUT, NAME_FWD_OP, NAME_OPS, OPS
from conformance.ir.policy import decide, deciding_rule
from conformance.ir.program import Program

RECOMPUTES, SAVES, AGAINST_POLICY = "recomputes", "saves", "saves against its policy"
RECOMPUTES_AGAINST_POLICY = "recomputes against its policy"
UNMATCHED = "an unmatched value"   # (a saved value no program value's class holds)
BOUNDARY = "a value outside every region"   # (no policy decides on it: an input, a region's argument made outside)
DEAD = " the loss does not read"   # (no cotangent reaches the value, or only code none reaches needs it)
DEAD_SHAPED = " shaped as one the loss does not read"   # (an unmatched value with a dead value's shape)
SHAPED_AS = " shaped as "   # (an unmatched value recomputed, read as the kept op's output whose shape it has)
# Ops whose derivative does not read the values they read (linear in them, or piecewise constant).
_VALUE_FREE_TANGENTS = frozenset({"linear", "identity", "zero"})
# Op families whose derivative reads none of their arguments' values, beside those tangents: dropout (its mask, fixed by
# its seed, times the cotangent)
_VALUE_FREE_FAMILIES = frozenset({"random"})


def _derivative_reads_arguments(op: str) -> bool:
    d = OPS[op]
    if d.inplace and op.removesuffix("_") in OPS:   # (an in-place op (add_) derives as its functional twin)
        d = OPS[op.removesuffix("_")]
    return d.tangent not in _VALUE_FREE_TANGENTS and d.family not in _VALUE_FREE_FAMILIES


LOOP = 2   # (the rank of a loop's carry or slice: a scan's own boundary, told apart from the regions')
# What a statement's body is, as an effect's cause names where it ran (a custom rule's by the context it opens).
_ENCLOSES = {"Checkpoint": "a region", "Scan": "a loop", "Cond": "a cond branch", "fwd": "a custom_vjp fwd",
             "primal": "a custom_jvp function"}
# An optimize_remat custom_vjp's fwd (JAX binds it as a primitive of its own, which remat2 does not run again in a
# region's recompute and remat3 does): an effect in it is named by that option, not by the policies around it
OPTIMIZE_REMAT_FWD = "a custom_vjp (optimize_remat) fwd"
BRANCH_INDEX = "a cond's branch index"   # (the integer a cond's predicate is lowered to: no program value)
NO_COTANGENT = " on a value no cotangent reaches"   # (an effect's value the loss does not read)
_DESCRIBED = re.compile(r"^(?P<cls>[^\[:]*?)(?P<names>\[.*?\])?:(?P<dtype>[A-Za-z0-9_]+)(?P<shape>\[[0-9, ]*\])$")
_INPUT = " (a program input)"   # (oracles.residuals: how an unnamed residual that is an input is told apart)


@dataclass(frozen=True)
class Saved:
    """One described residual (Residual.describe): its class ids, whether it is named, dtype and shape."""
    cls: tuple[str, ...]
    named: bool
    dtype: str
    shape: str

    @property
    def cls_text(self) -> str:
        return "/".join(self.cls)


def parse(described: str) -> Saved | None:
    m = _DESCRIBED.match(described.strip())
    if m is None:
        return None
    ids = tuple(i for i in m.group("cls").split("/") if i and i != "?")
    return Saved(ids, bool(m.group("names")), m.group("dtype"), m.group("shape"))


def _parsed(items) -> list[Saved]:
    return [s for s in (parse(x) for x in items or [] if isinstance(x, str)) if s is not None]


def _other_key(s: Saved, inputs: set[str]) -> str:
    return f"{s.dtype}{s.shape}" + (_INPUT if inputs & set(map(base_id, s.cls)) else "")


def _pick(wanted: list[str], side: list[Saved], other: list[Saved], key) -> list[Saved]:
    """For each wanted entry, one residual of `side` it describes, one whose class `other` lacks first."""
    others = {o.cls_text for o in other}
    pool = sorted(side, key=lambda s: s.cls_text in others)
    out = []
    for w in wanted:
        s = next((s for s in pool if key(s) == w), None)
        if s is not None:
            pool.remove(s)
            out.append(s)
    return out


def differing(detail: dict, inputs: set[str]) -> list[tuple[str, Saved]]:
    """(verb, residual) for each value a residual verdict's detail says differs."""
    if not isinstance(detail, dict):
        return []
    if "saved_against_policy" in detail:
        return [(AGAINST_POLICY, s) for s in _parsed(detail.get("saved_against_policy"))]
    if "recomputed_against_policy" in detail:
        return [(RECOMPUTES_AGAINST_POLICY, s) for s in _parsed(detail.get("recomputed_against_policy"))]
    saved, ref = _parsed(detail.get("saved")), _parsed(detail.get("reference_saved"))
    out = []
    for verb, side, other, named_key, other_key in ((RECOMPUTES, ref, saved, "missing_named", "missing_other"),
                                                    (SAVES, saved, ref, "extra_named", "extra_other")):
        named = [s for s in side if s.named]
        out += [(verb, s) for s in _pick(list(detail.get(named_key) or []), named, other, lambda s: s.cls_text)]
        unnamed = [s for s in side if not s.named]
        out += [(verb, s) for s in _pick(list(detail.get(other_key) or []), unnamed, other,
                                         lambda s: _other_key(s, inputs))]
    # (torch.compile against eager SAC: the classes it keeps that a policy saves and eager does not)
    out += [(SAVES, s) for s in _pick(list(detail.get("extra_saved") or []), saved, ref, lambda s: s.cls_text)]
    return out


# The kinds of op output a pipeline may treat apart, each a value of its own in a cause (an op's output otherwise):
#   names     a name tag, by where it was given (plain code, a custom_vjp fwd, a custom_jvp function)
#   name_fwd  checkpoint_name_fwd apart from the other names (JAX's own API; PyTorch has one kind of name, a tag op)
#   dots      a dot's output (JAX's dots policies decide on them by kind)
#   views     a view's output (PyTorch's partitioner may treat a view as free to recompute; under JAX it is an op)
#   residuals       a custom_vjp's residual (a rule's saved value)
#   optimize_remat  an optimize_remat custom_vjp's residual apart (JAX binds that rule as a primitive of its own)
_KINDS_JAX = frozenset({"names", "name_fwd", "dots", "residuals", "optimize_remat"})
_KINDS_TORCH = frozenset({"names", "dots", "views", "residuals"})
# eager SAC caches an op's outputs per op call on its policy's decision alone, whatever the op (a view, a dot, a name
# tag, an op in a custom rule's forward: torch.utils.checkpoint._CachingTorchDispatchMode): every op's output is one
# kind, its decision the cause
_KINDS_EAGER_SAC = frozenset()


def told_apart(pipeline: str) -> frozenset[str]:
    """The kinds of op output the pipeline judged may treat apart (every kind where none is named)."""
    if pipeline.startswith("jax:"):
        return _KINDS_JAX
    if pipeline.startswith("torch:eager-sac"):
        return _KINDS_EAGER_SAC
    return _KINDS_TORCH if pipeline.startswith("torch:") else _KINDS_TORCH | _KINDS_JAX


class _Program:
    """What the causes read of one program, computed once."""

    def __init__(self, prog: Program, pipeline: str = ""):
        self.prog = prog
        self.kinds = told_apart(pipeline)
        self.policies = prog.analysis().contexts[0]
        self.types = prog.types()
        self.ops = primal_ops(prog)
        self.inputs = {i.id for i in prog.inputs}
        self.where: dict[str, str] = {}     # value id -> carry, slice, branch
        self.residuals: dict[str, bool] = {}   # custom_vjp residual id -> its custom_vjp optimizes remat
        self.ctx: dict[str, str] = {}       # op output id -> the context it is computed in (main, fwd, primal)
        self.loop_policies: dict[str, list] = {}   # a loop's carry or slice id -> the regions' policies around it
        self.nesting: dict[int, tuple[str, ...]] = {}   # id(statement) -> what encloses it, outermost first
        self.effects = [st for st in self.ops.values() if st.op == EFFECT_OP]
        # what a cond in a region is lowered with beside program values (conformance.ir.nodes.branch_thresholds: the
        # thresholds its predicate's sum is compared with, of the predicate's dtype, and the integer branch index)
        self.thresholds: set[tuple[str, str]] = set()
        # (a multi-output op over a vector gives an integer scalar beside its value, a max's index: not the cond's)
        self.scalar_indices = any(OPS[st.op].family == MULTI_OUTPUT and not self.types[i][0]
                                  for i, st in self.ops.items())

        def visit(body, stack, ctx, nest=()):   # (one pass over the primal code; derivative rules hold no values)
            for st in body:
                self.nesting[id(st)] = nest
                if isinstance(st, Op):
                    self.ctx[st.out] = ctx
                elif isinstance(st, CustomVJP):
                    self.residuals.update(dict.fromkeys(st.residuals, st.optimize_remat))
                elif isinstance(st, Cond):
                    self.where.update({r: "branch" for rs in st.branch_results for r in rs})
                    if stack:
                        self.thresholds.add((self.types[st.args[0]][1], str([len(st.branches) - 1])))
                elif isinstance(st, Scan):
                    self.where.update({**{i: "carry" for i in st.carry}, **{i: "slice" for i in st.xs}})
                    self.loop_policies.update({i: stack for i in st.carry + st.xs})
                inner = stack + [st.policy] if isinstance(st, Checkpoint) else stack
                around = _ENCLOSES.get(type(st).__name__)
                for _, b, c in children(st):
                    if c not in DERIVATIVE_CTX:   # (a custom rule's body: the context it opens)
                        opens = _ENCLOSES[c] if c in _ENCLOSES else around
                        if c == "fwd" and getattr(st, "optimize_remat", False):
                            opens = OPTIMIZE_REMAT_FWD
                        visit(b, inner, c or ctx, nest + ((opens,) if opens else ()))
        visit(prog.body, [], "main")
        differentiated = prog.outputs[:len(prog.outputs) - prog.diff.aux] if prog.diff.aux else prog.outputs
        self.live = live_values(prog.model_copy(update={"outputs": list(differentiated)}), cotangent=True)
        # the values a backward needs, to read them or to recompute what it reads from them: by code a cotangent
        # reaches (live_need), by code none reaches (dead_need). `reads`: a statement's outputs and the values its
        # backward reads (an op whose derivative does not read its arguments, linear or piecewise constant, reads
        # none; a cond its predicate); `links`: values and what recomputing them needs (every statement's arguments; a
        # cond's and a loop's results, carries and slices link their body's values to their arguments: a loop or a
        # cond needs what its body needs)
        reads: list[tuple[set[str], set[str]]] = []
        links: list[tuple[set[str], set[str]]] = []
        for st, _, _, ctx in walk(prog.body):
            if ctx in DERIVATIVE_CTX:
                continue
            if isinstance(st, Op):
                links.append(({st.out}, set(st.args)))
                if _derivative_reads_arguments(st.op):
                    reads.append(links[-1])
            elif isinstance(st, CustomVJP):
                links.append((set(st.results), set(st.args)))
                reads.append(links[-1])
            elif isinstance(st, Cond):
                links.append((set(st.results), {st.args[0]}))
                reads.append(links[-1])
                links += [({r}, {rs[j] for rs in st.branch_results}) for j, r in enumerate(st.results)]
            elif isinstance(st, Scan):
                init, xs, _ = st.split_args()
                links += [({r}, {o}) for r, o in zip(st.results, st.carry_out + st.ys)]
                links += [({c}, {i, o}) for c, i, o in zip(st.carry, init, st.carry_out)]
                links += [({x}, {a}) for x, a in zip(st.xs, xs)]
        self.live_need, self.dead_need = set(), set()
        for outs, args in reads:
            (self.live_need if outs & self.live else self.dead_need).update(args)
        for need in (self.live_need, self.dead_need):
            changed = True
            while changed:
                changed = False
                for outs, args in links:
                    if need & outs and not args <= need:
                        need.update(args)
                        changed = True
        self.dead_shapes = {sh for i in self.types if i not in self.live and (i in self.ops or i in self.inputs)
                            for sh in self.shapes(i)}

    def shapes(self, i: str) -> set[str]:
        """The shapes a residual of value i may have, as described: its own, and per example (vmapped) that shape
        with the batch in front (the whole batch's residual)."""
        shape = list(self.types[i][0])
        b = self.prog.diff.batch
        return {str(shape)} | ({str([b] + shape)} if b else set())

    def value(self, i: str) -> tuple[int, str]:
        """(how specific, what the value is): a class is described by its most specific member."""
        s = self.ops.get(i)
        if s is not None and s.op in NAME_OPS and "names" in self.kinds:
            if s.op == NAME_FWD_OP and "name_fwd" in self.kinds:
                return 0, "a value named by checkpoint_name_fwd"
            where = {"fwd": "in a custom_vjp fwd", "primal": "in a custom_jvp function"}.get(self.ctx.get(i),
                                                                                            "in plain code")
            return 0, f"a value named {where}"
        if i in self.residuals and "residuals" in self.kinds:   # (optimize_remat binds the rule as a primitive of
            # its own under JAX: another decision)
            optimized = self.residuals[i] and "optimize_remat" in self.kinds
            return 1, "an optimize_remat custom_vjp residual" if optimized else "a custom_vjp residual"
        if self.where.get(i) in ("carry", "slice"):
            return LOOP, f"a loop {self.where[i]}"
        if i in self.inputs:
            return 3, "a program input"
        if self.where.get(i) == "branch" and not (s is not None and self.policies.get(i)):
            # (an op a region's policy decides on is that op's output, wherever its value flows next)
            return 4, "a cond branch's result"
        if s is not None and OPS[s.op].dot and "dots" in self.kinds:
            return 5, "a dot's output"
        if s is not None and OPS[s.op].view and "views" in self.kinds:
            return 5, "a view's output"
        return (6, "an op's output") if s is not None else (7, "a value")

    def decisions(self, i: str) -> list[tuple[str, str]]:
        """(rule, decision) of each enclosing policy, outermost first; [] where no policy governs."""
        s = self.ops.get(i)
        if s is None and self.loop_policies.get(i):   # a loop's carry or slice inside regions: what they decide
            return [(deciding_rule(p, None, None), decide(p, None, None)) for p in self.loop_policies[i]]
        if s is None or not self.policies.get(i):
            return []
        batched = OPS[s.op].batched([self.types[a][0] for a in s.args])
        n = input_elements(s, self.types)
        name = checkpoint_name_of(s)
        return [(deciding_rule(p, s.op, name, batched, n), decide(p, s.op, name, batched, n))
                for p in self.policies[i]]

    def cause(self, verb: str, s: Saved) -> str:
        ids = list(dict.fromkeys(map(base_id, s.cls)))
        # (a class of equal values across casts and layouts: the members of the saved value's dtype and shape are the
        # value saved, where any is; a transposed float64 copy only dead code reads is not the float16 input it equals)
        exact = [i for i in ids if i in self.types and self.types[i][1] == s.dtype and s.shape in self.shapes(i)]
        ids = exact or ids
        if not ids and self.branch_index(s):   # (no policy decides on the lowering's index: remat2 saves it)
            return f"{verb} {BRANCH_INDEX}{self.diff()}"
        if not ids:
            if verb == RECOMPUTES:   # what an op's derivative reads (sin's cos) of an op its policy keeps: that op's
                # (a dot's derivative reads its operands, program values: an op whose derivative reads a value
                # of its own, sin's cos, is what an unmatched value belongs to, where one has the shape)
                kept = sorted((OPS[st.op].dot or OPS[st.op].tangent == "bilinear", self.value(i)[0], i, ds)
                              for i, st in self.ops.items()
                              if s.shape in self.shapes(i)
                              and OPS[st.op].tangent not in _VALUE_FREE_TANGENTS
                              and (ds := self.decisions(i)) and ds[-1][1] in ("save", "offload"))
                if kept:
                    *_, i, ds = kept[0]
                    chain = " > ".join(f"{r}:{d}" for r, d in ds)
                    return f"{verb} {UNMATCHED}{SHAPED_AS}{self.value(i)[1]} [{chain}]{self.diff()}"
            shaped = DEAD_SHAPED if verb != RECOMPUTES and s.shape in self.dead_shapes else ""
            return f"{verb} {UNMATCHED}{shaped}{self.diff()}"

        def saved_by_policy(i):
            return (self.decisions(i) or [("", "")])[-1][1] in ("save", "offload")

        def boundary(i):
            return not self.decisions(i)
        # the member that explains the save: the one its policy saves (a recompute), the boundary value (a save)
        first, second = ((saved_by_policy, boundary) if verb in (RECOMPUTES, RECOMPUTES_AGAINST_POLICY)
                         else (boundary, saved_by_policy))
        i = min(ids, key=lambda i: (not first(i), not second(i), self.value(i)[0], i))
        dead = "" if self.read(ids) else DEAD
        chain = " > ".join(f"{r}:{d}" for r, d in self.decisions(i))
        rank, what = self.value(i)
        if not chain and rank != LOOP:   # no policy decides: whatever the value is, one decision (a region's argument)
            return f"{verb} {BOUNDARY}{dead}{self.diff()}"
        return f"{verb} {what}{dead} [{chain or 'boundary'}]{self.diff()}"

    def branch_index(self, s: Saved) -> bool:
        """Whether an unmatched value is the integer index a cond in a region is lowered with (where no op of the
        program gives an integer scalar beside its value, the index of a max over a vector)."""
        return (bool(self.thresholds) and not s.cls and s.shape == "[]" and s.dtype.startswith(("int", "uint"))
                and not self.scalar_indices)

    def branch_thresholds(self, s: Saved) -> bool:
        return not s.cls and (s.dtype, s.shape) in self.thresholds

    def read(self, ids: list[str]) -> bool:
        """Whether the loss reads a class of equal values: a cotangent reaches one, and it is not needed by code
        no cotangent reaches alone (a dot's output a dead tanh reads beside a select; the input it is recomputed
        from)."""
        return any(x in self.live for x in ids) and (any(x in self.live_need for x in ids)
                                                     or not any(x in self.dead_need for x in ids))

    def effect_cause(self, s: Op, ran: str) -> str:
        """How often an effect ran (`more` or `fewer` than the reference), where it is (what encloses it, innermost
        first, up to its innermost region), the decision of each region's policy on the value it reads (regions that
        all decide alike: the innermost's), and whether a cotangent reaches it; in an optimize_remat fwd, that option
        instead of the decision and the cotangent."""
        # (from the effect out to the innermost region, the region a recompute runs again, then the regions around it:
        # a loop, a branch or a rule around that region repeats or selects the whole)
        # (a custom_jvp function around it is not where it runs: differentiated, JAX runs the jvp rule, whose copy of
        # the effect runs as the function's would; a loop's callback reran per iteration with or without one)
        nest, region = tuple(n for n in self.nesting[id(s)] if n != _ENCLOSES["primal"]), _ENCLOSES["Checkpoint"]
        inner = max((k for k, n in enumerate(nest) if n == region), default=0)
        # (an effect passes its value on unchanged: the value it reads and its output are one value, described as a
        # residual's class is, by the member a policy saves; a region's argument is always kept)
        kept = [d for d in (self.decisions(s.out), self.decisions(s.args[0])) if d and d[-1][1] in ("save", "offload")]
        decided = (kept or [self.decisions(s.out)])[0]
        # (regions around the innermost one that each decide as it does, by the same rule, rerun what it reruns: the
        # count grows with them, the cause is the innermost's; regions deciding otherwise are a cause of their own)
        alike = len(decided) == nest.count(region) and len(set(decided)) == 1   # (every region's, one decision)
        by_option = OPTIMIZE_REMAT_FWD in nest[inner:]   # (the rule's option decides, whatever the policies, the
        # regions around it or the cotangent: remat2 runs that fwd once, remat3 again in each region's recompute)
        outer = 0 if alike or by_option else nest[:inner].count(region)
        decided = decided[-1:] if alike else decided
        where = " in ".join(list(reversed(nest[inner:])) + [region] * outer)
        chain = " > ".join(f"{r}:{d}" for r, d in decided) or ("boundary" * bool(where))
        dry = "" if s.out in self.live else NO_COTANGENT
        looped = _ENCLOSES["Scan"] in nest[inner + 1:]   # (a loop inside the innermost region)
        # (a policy keeping the value decides, cotangent or not: remat3 runs the callback of a value a custom policy
        # saves again, whether the loss reads it or not; and in a loop in the region, on a value read or not: plain JAX,
        # a nothing_saveable region's fori_loop calling back on a loop-invariant value, read or not, or on an unread
        # per-iteration one: remat2 2 runs, remat3 3)
        if dry and ran == "more" and (kept or looped):
            dry = ""
        elif dry and chain != "boundary":   # (no backward needs the value: a policy's recompute is moot)
            chain = ""
        kind = s.params["kind"]
        if by_option:   # (nor the effect's kind: a debug callback, ordered or not, runs as often there)
            chain, dry, kind = "", "", EFFECT_OP   # (the op itself, whatever its kind)
        return (f"{kind} runs {ran} {f'in {where}' if where else 'outside every region'}"
                f"{f' [{chain}]' if chain else ''}{dry}{self.diff()}")

    def rule_cause(self, st, field: str) -> str:
        """What of a custom rule differs (a field: symbolic_zero_cts, perturbed, fwd_ran...), the rule and its options,
        and where it is; a rule whose results no cotangent reaches is one cause wherever it is (the reference drops
        its backward before anything encloses it decides)."""
        options = [o for o in ("symbolic_zeros", "optimize_remat") if getattr(st, o, False)]
        rule = (f"a {type(st).__name__.lower().replace('custom', 'custom_')}"
                + (f" ({', '.join(options)})" if options else ""))
        if not any(r in self.live for r in st.results):
            return f"{field} differs for {rule} whose results no cotangent reaches{self.diff()}"
        where = " in ".join(reversed(self.nesting[id(st)]))
        return f"{field} differs for {rule} {f'in {where}' if where else 'outside every region'}{self.diff()}"

    def diff(self) -> str:
        d = self.prog.diff
        out = f", second order ({d.mode})" if d.order == 2 else ""
        return out + (", per example" if d.batch else "")


# A comparison's verb -> the policy check's for the same decision, where the rival departs and where the reference
# does (what the rival saves, the reference recomputes; what it recomputes, the reference saves).
_AS_JUDGED = {False: {RECOMPUTES: RECOMPUTES_AGAINST_POLICY, SAVES: AGAINST_POLICY},
              True: {SAVES: RECOMPUTES_AGAINST_POLICY, RECOMPUTES: AGAINST_POLICY}}


def _reworded(cause: str, verbs: dict[str, str]) -> str:
    """`cause` with its leading verb replaced by the one `verbs` maps it to (the longest verb first: `saves against
    its policy` is not `saves`)."""
    for verb in sorted(verbs, key=len, reverse=True):
        if cause.startswith(verb + " "):
            return verbs[verb] + cause[len(verb):]
    return cause


def as_judged_by_policy(cause: str, by_the_reference: bool = False) -> str:
    """A comparison's cause as the policy check names the same decision: a value a pipeline recomputes that its
    policy saves (a reference saves it) is recomputed against its policy; one it saves that its policy recomputes
    is saved against it. `by_the_reference`: as the reference's policy check names it (what the pipeline saves,
    the reference recomputes; what it recomputes, the reference saves)."""
    if cause.startswith((AGAINST_POLICY, RECOMPUTES_AGAINST_POLICY)):
        return cause
    return _reworded(cause, _AS_JUDGED[by_the_reference])


def as_compared(cause: str, by_the_reference: bool = False) -> str:
    """A policy check's cause as a comparison names it where the pipeline that departs from its policy is the
    rival (`by_the_reference`: the reference): as_judged_by_policy the other way."""
    return _reworded(cause, {v: k for k, v in _AS_JUDGED[by_the_reference].items()})


_QUALIFIERS = re.compile(r" the loss does not read(?= \[|,|$)|, second order \([a-z_]+\)|, per example")
_RULE = re.compile(r"(?<=[\[ ])[a-z_]+:(?=[a-z]+(?: >|\]))")


def core(cause: str) -> str:
    """A cause without its qualifiers (the differentiation) nor what each policy read to decide (`[custom:save]` is
    `[save]`: a value a policy saves and a pipeline recomputes is one decision departed from, whichever rule of the
    policy kind said save): what a shrink keeps and what a root keys on. Whether a smaller program still needs
    second order, its own cause then says. A value saved that the loss does not read is one cause whatever the
    value and its policy (no zero cotangent propagated: the reference drops it before any policy decides)."""
    verb = _verb(cause)
    if verb in (SAVES, AGAINST_POLICY) and (DEAD + " " in cause + " " or DEAD + "," in cause or DEAD_SHAPED in cause):
        return f"{verb} a value{DEAD}"
    if verb == RECOMPUTES and cause.startswith(f"{verb} {UNMATCHED}{SHAPED_AS}"):   # the kept op's decision
        cause = f"{verb} " + cause.removeprefix(f"{verb} {UNMATCHED}{SHAPED_AS}")
    return _RULE.sub("", _QUALIFIERS.sub("", cause))


def causes(program: Program, detail: dict, pipeline: str = "") -> list[str]:
    """The causes of a residual verdict's difference (sorted, each once); [] where the detail tells no value
    apart (a difference of bytes alone) or the program cannot be read. `pipeline`: the one judged (which kinds of op
    output it may treat apart, `told_apart`: a view's output is a kind of its own under torch.compile, an op's under
    JAX and eager SAC)."""
    try:
        p = _Program(program, pipeline)
        pairs = differing(detail, p.inputs)
        if any(verb == RECOMPUTES and p.branch_index(s) for verb, s in pairs):   # what recomputing the index needs
            pairs = [(verb, s) for verb, s in pairs if not (verb == SAVES and p.branch_thresholds(s))]
        found = {p.cause(verb, s) for verb, s in pairs}
    except (KeyError, IndexError, ValueError):
        return []
    if isinstance(detail, dict) and "recomputed_against_policy" in detail and not found:
        # (a compiled backward whose values are not read: inductor's) the aten ops it recomputed
        found = {f"{RECOMPUTES_AGAINST_POLICY} an {op} output [compiled backward]{p.diff()}"
                 for op in detail.get("aten_ops") or []}
    if any(c.startswith(RECOMPUTES + " ") for c in found):   # what a recompute needs saved is its consequence
        found = {c for c in found if not (c.startswith(SAVES + " ") and ("[boundary]" in c or BOUNDARY in c))}
    # an unmatched value beside a program value the same verb names is that decision's other output (a max's
    # indices, a linearization's residual), not a cause of its own; alone, it is one
    named = {_verb(c) for c in found if UNMATCHED not in c}
    return sorted(c for c in found if not (UNMATCHED in c and _verb(c) in named))


def effect_causes(program: Program, detail: dict, pipeline: str = "") -> list[str]:
    """The causes of an effect-count verdict's difference (sorted, each once): each effect statement that ran more or
    fewer times (the detail's `sites`, where the pipelines count per statement), else, for each kind that did, each
    effect of that kind a region, a loop or a custom rule encloses (where the counts can differ; every effect of the
    kind where none does), as `Program.effect_cause` names it. (`pipeline`: as `causes` takes it; unread here.)"""
    try:
        p = _Program(program)
        found = set()
        sites = detail.get("sites") or {}
        if sites:   # the statements whose effects ran another number of times (a pipeline that tells them apart)
            at = {s.out: s for s in p.effects}
            return sorted({p.effect_cause(at[i], "more" if d.get("got", 0) > d.get("reference", 0) else "fewer")
                           for i, d in sites.items() if i in at})
        for kind, d in sorted((detail.get("effects") or {}).items()):
            ran = "more" if d.get("got", 0) > d.get("reference", 0) else "fewer"
            mine = [s for s in p.effects if s.params.get("kind") == kind]
            for s in [s for s in mine if p.nesting[id(s)]] or mine:
                found.add(p.effect_cause(s, ran))
    except (KeyError, IndexError, ValueError, AttributeError):
        return []
    return sorted(found)


# (an effect's cause as `core` leaves it: no differentiation qualifiers)
_EFFECT_CAUSE = re.compile(r"^(?P<what>\S+ runs (?:more|fewer)) in (?P<where>.+?)"
                           rf"(?P<rest>(?: \[[^\]]*\])?(?:{re.escape(NO_COTANGENT)})?)$")


def narrows(cause: str, original: str) -> bool:
    """Whether an effect's cause is `original`'s with some of what encloses the effect inside its innermost region
    gone (a loop, a cond branch, a custom_vjp fwd): the same effect kind, direction and regions, the same decision
    of their policies on its value, in fewer constructs. A shrink that drops such a construct and keeps the
    difference shows the construct was not the cause: a named value's callback rerun in a loop in a cond branch
    reran without either. A region dropped, or another decision, is another cause."""
    a, b = _EFFECT_CAUSE.match(core(cause)), _EFFECT_CAUSE.match(core(original))
    if not (a and b) or (a["what"], a["rest"]) != (b["what"], b["rest"]):
        return False
    short, long = a["where"].split(" in "), b["where"].split(" in ")
    region = _ENCLOSES["Checkpoint"]
    if short == long or short.count(region) != long.count(region):
        return False
    it = iter(long)
    return all(any(e == x for x in it) for e in short)   # (a subsequence: the order of what is left kept)


def rule_causes(program: Program, detail: dict, pipeline: str = "") -> list[str]:
    """The causes of a custom-rule verdict's difference (sorted, each once): each block's field that differs, as
    `Program.rule_cause` names it. (`pipeline`: as `causes` takes it; unread here.)"""
    try:
        p = _Program(program)
        at = {path: st for st, _, path, _ in walk(program.body)}
        found = {p.rule_cause(at[path], field) for path, fields in sorted((detail.get("blocks") or {}).items())
                 for field in fields}
    except (KeyError, IndexError, ValueError, AttributeError):
        return []
    return sorted(found)


_VERBS = sorted((RECOMPUTES, SAVES, AGAINST_POLICY, RECOMPUTES_AGAINST_POLICY), key=len, reverse=True)


def _verb(cause: str) -> str:
    return next((v for v in _VERBS if cause.startswith(v + " ")), "")
