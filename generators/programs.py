"""Hypothesis strategies for programs, policies and inputs. Every draw is type-directed, so any
choice sequence builds a valid program.

Swarm testing (Groce et al., ISSTA 2012): each program first draws which features it may use
(`draw_swarm`, generators/swarm.py: regions, nesting, prevent_cse, custom_vjp, symbolic zeros,
optimize_remat, nondiff args, rule variants, unused results, extra inputs, dead values, second
order and its modes, scans and their spellings, conds, jitted sub-functions, each policy kind after
the first, each op family after the first, the dtype). "Off" is a flag's simplest choice, so
shrinking turns features off; the Config's switches win over the swarm.

Shrinking: a program is one flat item stream (each item after a "continue?" choice): an op, a
region, custom_vjp, jit, scan or cond opening (generators/structure.py: scans and conds), or a
close of the innermost open one. Every item draws the same
number of choices whatever came before, operands count back from the newest value, values stay
visible after their region, and results/args/outputs/bwd rules are derived after the stream
is read, so deleting an item leaves later choices meaning what they meant.
"""
from __future__ import annotations

import numpy as np
from hypothesis import reject
from hypothesis import strategies as st

from conformance.ir import ops as O
from conformance.ir.batching import value_shape
from conformance.ir.nodes import (
    DIFF_MODES,
    STATE_KINDS,
    STATIC_SPELLINGS,
    Checkpoint,
    CustomJVP,
    CustomVJP,
    Diff,
    Input,
    Jit,
    Op,
    free_vars,
)
from conformance.ir.policy import KINDS, NoPolicy
from conformance.ir.program import Program, validate
from generators.draws import BOOL, draw_int, flag, perms, span
from generators.frames import Frame, Val, chain
from generators.irgrad import jvp_ops, residuals_of, scale_result, vjp_ops
from generators.policies import MAX_OPERAND_BACK, NAME_POOL, draw_policy_plan, make_policy
from generators.structure import Structure
from generators.swarm import FOCUS_TRIES, Config, Swarm, draw_swarm, focused, op_families, swarm_dimensions, swarms  # noqa: F401

# Dimensions come from a small vocabulary (the first choice, the shrink target, is not 1, so
# that shrunk programs do not all broadcast size-1 axes); eager JAX compiles one kernel per
# (primitive, shape, dtype, params), so few distinct shapes make warm programs run fast.
DIMS, RARE_DIMS = (2, 3), (1, 4)     # a dimension is one of DIMS 4 times in 5
RANKS = (1, 2, 0, 3)
NONDIFF_VALUES = (2.0, 0.5)
SEQUENTIAL_OPS = ("sin", "tanh", "neg")   # bounded unary ops of a checkpoint_sequential tail


SPELLINGS = ("defvjp", "custom_gradient", "custom_gradient_remat", "defremat")
RESIDUAL_TREES = ("tuple", "dict", "nested")   # the pytree custom_vjp residuals travel in
RULE_TREES = ("flat", "tuple", "dict")   # how a custom rule takes its args and returns its results


# ---- the generator ------------------------------------------------------------------------------
class _NoInput(Exception):
    """An op hint asked for a new input beyond Config.max_inputs."""


# Item kinds, the value of one draw: the simplest (0) is a plain op. A kind that is not
# available where it is drawn becomes an op (a region where the swarm or the depth forbids
# one, a block where the swarm does) or a close (a block inside a block).
_ITEM_OP, _ITEM_REGION, _ITEM_CVJP, _ITEM_CLOSE, _ITEM_SCAN, _ITEM_COND = range(6)
# At top level ops and regions are twice as likely as blocks (and closes, which do nothing
# there); inside a region the second region choice is an op, so that nested regions do not cut
# bodies into single ops.
# A scan or cond where the swarm has none (or inside a custom rule; a scan inside another scan)
# is an op.
_ITEM_OF = (_ITEM_OP, _ITEM_REGION, _ITEM_CVJP, _ITEM_CLOSE, _ITEM_REGION, _ITEM_OP, _ITEM_SCAN, _ITEM_COND)
_ITEM_OF_NESTED = (_ITEM_OP, _ITEM_REGION, _ITEM_CVJP, _ITEM_CLOSE, _ITEM_OP, _ITEM_OP, _ITEM_SCAN, _ITEM_COND)
class _Gen(Structure):
    """Reads the item stream (the Chooser that the op table's generator hints draw with), then
    derives the program."""

    def __init__(self, draw, cfg: Config):
        self.raw_draw = draw
        self.k = 0
        self.cfg = cfg
        self.sw = draw_swarm(draw, cfg)
        self.dtype = self.sw.dtype
        self.inputs: list[Input] = []
        self.types: dict[str, tuple] = {}
        self.scope: list[Val] = []
        self.nondiff: list[float] = []
        self.home: dict[str, Frame] = {}     # value id -> frame that defines it
        self.producer: dict[str, Op] = {}    # value id -> the op that computes it
        self.read: set[str] = set()          # value ids some op (or a scan's initial carry) has read
        self.cjvp_frames: dict[int, tuple] = {}   # id(CustomJVP) -> (its frame, the ids its body defines)
        self.n = 0
        on = self.sw
        first = list(KINDS)[0]
        self.kinds = [k for k in KINDS if k == first or on[f"policy:{k}"]]
        base = op_families()[0]
        opt_in = [f for f in O.OPT_IN_FAMILIES if on[f]]   # (their dimension on: the family drawn like any other)
        self.families = {ctx: [f for f in fams if f == base or on.on.get(f"family:{f}", True)] or fams[:1]
                         for ctx, fams in (((False, False), O.generated_families(False, opt_in=opt_in)),
                                           ((True, False), O.generated_families(True, False)),
                                           ((True, True), O.generated_families(True, True)))}

    def draw(self, strategy, label: str):
        # Each draw gets a span label of its own. Hypothesis follows every new example with up
        # to five mutations of it that copy a span over another span of the same label; here
        # those would be near-copies of one program with the same swarm choices (and often the
        # same program: two operand indices that both pick the newest value). With no two
        # spans alike, every example is a fresh draw.
        self.k += 1
        return self.raw_draw(strategy, label=f"{label}#{self.k}")

    def _span_item(self) -> int:
        self.k += 1
        return span(self.raw_draw, self._item, f"stmt#{self.k}")

    def fresh(self, prefix="v") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    # -- the Chooser the op table's generator hints draw with ----------------------------
    # Every call draws its choice even where there is only one option (a trivial choice, which
    # the shrinker skips), so that how many choices an item reads depends on its own values
    # only, not on shapes or contexts that an earlier deletion can change.
    def int(self, lo, hi, label):
        if label == "dim":
            return self._dim(lo, hi)
        return draw_int(self.draw, lo, max(lo, hi), label)

    def _dim(self, lo=1, hi=O.GEN_MAX_DIM):
        common = [d for d in DIMS if lo <= d <= hi]
        rare = [d for d in RARE_DIMS if lo <= d <= hi]
        if not common and not rare:
            return draw_int(self.draw, lo, max(lo, hi), "dim")
        k = draw_int(self.draw, 0, 2 * len(common) - (not rare), "dim")
        if k < 2 * len(common):
            return common[k % len(common)]
        return rare[draw_int(self.draw, 0, len(rare) - 1, "rare_dim")]

    def choice(self, seq, label):
        seq = list(seq)
        return seq[draw_int(self.draw, 0, len(seq) - 1, label)]

    def perm(self, n, label):
        return list(self.draw(perms(n), label=label))

    def operand(self, pred=None):
        """A value in scope satisfying pred, counted back from the newest. The simplest choice
        continues the chain from the newest value (x -> sin -> name -> cos), so that named
        values inside regions are read by later ops, as in real models; otherwise an index
        reaches up to MAX_OPERAND_BACK values further back (deleting earlier statements shifts
        what an index reaches, never makes it invalid)."""
        c = self.scope if pred is None else [v for v in self.scope if pred(v)]
        if not c:
            return None
        # A choice however many candidates there are (a trivial one where there is one), so
        # that deleting an earlier statement never shifts the choices that follow.
        if len(c) == 1:
            draw_int(self.draw, 0, 0, "operand_back")
            return c[0]
        if not self.draw(BOOL, label="operand_back"):
            return c[-1]
        return c[-2 - draw_int(self.draw, 0, min(len(c) - 1, MAX_OPERAND_BACK) - 1, "operand")]

    def consumable(self, v) -> bool:
        """Whether an in-place op may mutate v (conformance.ir.typecheck's rule, and more): an op's
        output in the open frame that nothing has read, no view, and kept by no backward (its
        producer's derivative does not read it), outside custom rules and conds."""
        f, op = self.frame, self.producer.get(v.id)
        if op is None or self.home.get(v.id) is not f or v.id in self.read or f.in_cvjp or f.in_cond:
            return False
        d = O.OPS[op.op]
        return not (d.view or d.keeps_output or op.op == O.CAST_OP)

    def fresh_value(self, x: Val) -> Val:
        """A new value an in-place op may consume: the simplest op of x, in the open frame."""
        return self._op(O.SIMPLEST_OP, [x], x.mag, {})

    def new_input(self, shape, dtype=None):
        if len(self.inputs) >= self.cfg.max_inputs:
            raise _NoInput
        v = self._input(tuple(shape), dtype=dtype)
        self.scope.append(v)
        return v

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes values may have (a cast's targets)."""
        return self.cfg.dtypes

    def checkpoint_name(self):
        return NAME_POOL[draw_int(self.draw, 0, len(NAME_POOL) - 1, "name")]

    # -- inputs --------------------------------------------------------------------------
    def _input(self, shape, batched=False, dtype=None) -> Val:
        i, dtype = f"x{len(self.inputs)}", dtype or self.dtype
        diff = True
        if self.inputs and self.sw["nondiff_inputs"]:
            diff = not self.draw(BOOL, label="input_nondiff")
        self.inputs.append(Input(id=i, shape=list(shape), dtype=dtype, diff=diff, batched=batched))
        self.types[i] = (tuple(shape), dtype)
        return Val(i, tuple(shape), dtype, 1.0)

    def _shape(self):
        r = RANKS[draw_int(self.draw, 0, len(RANKS) - 1, "rank")]
        return tuple(self._dim() for _ in range(r))

    # -- ops -----------------------------------------------------------------------------
    def _op(self, kind, args: list[Val], mag, params) -> Val:
        o = self.fresh()
        shape = O.infer(kind, [a.shape for a in args], params, self.nondiff)
        dtype = O.result_dtype(kind, params, args[0].dtype)
        self.types[o] = (tuple(shape), dtype)
        op = Op(op=kind, args=[a.id for a in args], params=params, out=o)
        self.frame.items.append(op)
        self.home[o], self.producer[o] = self.frame, op
        self.read.update(op.args)
        if O.OPS[kind].inplace:   # consumed: nothing after reads it
            self.scope = [v for v in self.scope if v.id != args[0].id]
        v = Val(o, tuple(shape), dtype, mag)
        self.scope.append(v)
        return v

    def _gen_op(self, simplest=False):
        """One op, by the op table: a family, an op of it, an operand, then the op's own hint
        draws the rest. `simplest`: what the simplest choices give (first op of the first
        family, on the newest value), without drawing them."""
        f = self.frame
        self.nondiff = f.nondiff
        ctx = (f.in_cvjp, bool(f.nondiff) and f.in_cvjp)
        if simplest:
            kind, x = O.family_ops(self.families[ctx][0], *ctx)[0], self.scope[-1]
        else:
            kind = self.choice(O.family_ops(self.choice(self.families[ctx], "op_family"), *ctx), "op")
            x = self.operand()
        try:
            plan = O.OPS[kind].gen(self, x)
        except _NoInput:
            plan = None
        if plan is None or plan[3] > O.MAX_MAG:
            return self._op(O.FALLBACK_OP, [x], 1.0, {})
        other, args, params, mag = plan
        return self._op(other or kind, args, mag, params)

    # -- the item stream -----------------------------------------------------------------
    def _item(self, _):
        f, draw = self.frame, self.draw
        k = (_ITEM_OF if f.depth == 0 else _ITEM_OF_NESTED)[draw_int(draw, 0, len(_ITEM_OF) - 1, "item")]
        # (a region inside a jitted sub-function outside every region is no nested region)
        # (a region in a custom rule only right inside a custom_vjp's fwd: a checkpoint in a Function's forward)
        in_rule_ok = not f.in_cvjp or (f.kind == "custom_vjp" and self.sw["checkpoint_in_rules"])
        if k == _ITEM_REGION and not (self.sw["checkpoint"] and in_rule_ok and f.depth < self.cfg.max_depth
                                      and (self.sw["nesting"] or not any(g.kind == "checkpoint" for g in chain(f)))):
            k = _ITEM_OP
        if k == _ITEM_SCAN and not (self.sw["scan"] and not f.in_cvjp and not f.in_scan):
            k = _ITEM_OP
        if k == _ITEM_COND and not (self.sw["cond"] and not f.in_cvjp and not f.in_cond
                                    and self._predicate() is not None):
            k = _ITEM_OP
        block = "custom_vjp"
        if k == _ITEM_CVJP and f.kind == "custom_vjp" and self.sw["custom_jvp"]:
            block = "custom_jvp"   # a custom_jvp inside a custom_vjp fwd rule
        elif k == _ITEM_CVJP and f.in_cvjp:   # blocks do not nest otherwise: closes this one (rules stay short)
            k = _ITEM_CLOSE
        elif k == _ITEM_CVJP:
            on_vjp, on_jvp = self.sw["custom_vjp"], self.sw["custom_jvp"]
            if not (on_vjp or on_jvp):
                k = _ITEM_OP
            elif on_vjp and on_jvp:   # both kinds on: a choice (the first, a custom_vjp)
                block = "custom_jvp" if draw(BOOL, label="block_is_custom_jvp") else "custom_vjp"
            else:
                block = "custom_jvp" if on_jvp else "custom_vjp"
        if k == _ITEM_OP:
            self._gen_op()
            if self.sw["effects"] and draw(BOOL, label="effect"):
                self._effect()
            return 1
        if k == _ITEM_CLOSE:
            # Closing nothing (at top level) or an empty region or block does nothing: when
            # the shrinker deletes an opening, its close is harmless and draws nothing.
            if f.parent is not None and f.items:
                self._close(f)
            return 0
        kind = {_ITEM_REGION: "checkpoint", _ITEM_SCAN: "scan", _ITEM_COND: "cond"}.get(k, block)
        if k == _ITEM_REGION and self.sw["nested_jit"] and not f.in_cvjp and draw(BOOL, label="region_is_jit"):
            kind = "jit"   # a jax.jit-ted sub-function where a region would open
        g = Frame(kind, f, f.depth + (k == _ITEM_REGION))
        if kind == "checkpoint":
            self._open_region(g)
        elif k == _ITEM_SCAN:
            self._open_scan(g)
        elif k == _ITEM_COND:
            self._open_cond(g)
        elif kind == "custom_vjp":
            self._open_cvjp(g)
        elif kind == "custom_jvp":
            self._open_cjvp(g)
        f.items.append(g)
        self.frame = g
        return 1

    def _effect(self):
        """An effect on the newest value (opt-in dimension `effects`): per example (a vmap) and in
        a loop (it may be spelled as a vmap) only an unordered debug callback (JAX batches no
        ordered effect, and no io_callback inside a cond)."""
        kinds = list(O.EFFECT_KINDS[:1] if self.sw["per_example"] or self.frame.in_scan else O.EFFECT_KINDS)
        x = self.scope[-1]
        self._op(O.EFFECT_OP, [x], x.mag, {"kind": kinds[draw_int(self.draw, 0, len(kinds) - 1, "effect_kind")]})

    def _open_region(self, g: Frame):
        draw = self.draw
        # the policy's choices belong to this item; it is built with the body, so that an
        # `ops` policy can name the region's own ops
        g.policy_choice = draw_policy_plan(draw, self.kinds)
        g.prevent_cse = not (self.sw["prevent_cse"] and draw(BOOL, label="prevent_cse_false"))
        # prevent_cse per argument: a bit mask (cycled over the args) of a flat region's tuple
        g.cse_mask = None
        if self.sw["prevent_cse"] and draw(BOOL, label="prevent_cse_tuple"):
            g.cse_mask = draw_int(draw, 0, 7, "prevent_cse_mask")
        g.static_flag, g.tree, g.static_by, g.static_value, g.state = False, "flat", "argnums", "bool", "none"
        if self.sw["mutable_state"] and not self.sw["per_example"] and draw(BOOL, label="region_state"):
            # mutable state the region closes over (a jax.new_ref): a flat region, no static flag
            g.state = STATE_KINDS[draw_int(draw, 1, len(STATE_KINDS) - 1, "state_kind")]
        elif self.sw["region_options"]:   # jax.checkpoint's static arguments, a pytree of args
            g.static_flag = draw(BOOL, label="static_flag")
            g.tree = ("flat", "tuple", "dict")[draw_int(draw, 0, 2, "region_tree")]
            if g.static_flag:
                g.static_by = STATIC_SPELLINGS[draw_int(draw, 0, len(STATIC_SPELLINGS) - 1, "static_by")]
                g.static_value = ("bool", "unhashable")[draw_int(draw, 0, 1, "static_value")]
        # (opt-in: non-tensor values returned after the results, by a flat or tuple region without state)
        g.extras = (self.sw["non_tensor_outputs"] and g.state == "none" and g.tree != "dict"
                    and draw(BOOL, label="region_extras"))

    def _open_cvjp(self, g: Frame):
        sw, draw = self.sw, self.draw
        # A block option the swarm turns on is on in every block of the program, except
        # optimize_remat: with symbolic_zeros it is documented as unsupported (every pipeline
        # must raise NotImplementedError), and a program where every block raises checks
        # nothing else.
        g.spelling = (
            SPELLINGS[draw_int(draw, 0, len(SPELLINGS) - 1, "spelling")] if sw["rule_spellings"] else SPELLINGS[0]
        )
        plain = g.spelling == SPELLINGS[0]   # the other spellings have none of the options below
        g.residual_tree = RESIDUAL_TREES[0]
        if sw["residual_trees"] and not g.spelling.startswith("custom_gradient"):
            g.residual_tree = RESIDUAL_TREES[draw_int(draw, 0, len(RESIDUAL_TREES) - 1, "residual_tree")]
        if sw["nondiff_args"] and plain:
            g.nondiff = [NONDIFF_VALUES[draw_int(draw, 0, len(NONDIFF_VALUES) - 1, "nondiff_value")]]
        g.symbolic_zeros = sw["symbolic_zeros"] and plain
        g.perturbed_branch = g.symbolic_zeros and sw["perturbed_branch"]
        g.optimize_remat = sw["optimize_remat"] and plain and draw(BOOL, label="optimize_remat")
        g.nonstandard = draw_int(draw, 0, 7, "nonstandard_arg") if sw["nonstandard_rules"] else None
        g.extra_result = sw["unused_results"]
        g.tree = self._rule_tree()
        # autograd.Function options: which result (if any) is non-differentiable, once_differentiable, a
        # data-dependent branch in bwd
        g.fn_opts = (draw_int(draw, 0, 2, "non_differentiable"), draw(BOOL, label="once_differentiable"),
                     draw(BOOL, label="bwd_branch")) if sw["function_options"] and plain else (0, False, False)

    def _rule_tree(self) -> str:
        """How a custom rule takes its args and returns its results: positionally, or as one
        tuple or dict (the rule_trees dimension)."""
        return RULE_TREES[draw_int(self.draw, 0, len(RULE_TREES) - 1, "rule_tree")] if self.sw["rule_trees"] else "flat"

    def _open_cjvp(self, g: Frame):
        g.nondiff, g.symbolic_zeros, g.optimize_remat = [], False, False
        g.nonstandard = draw_int(self.draw, 0, 7, "nonstandard_result") if self.sw["nonstandard_rules"] else None
        g.extra_result = self.sw["unused_results"]
        g.tree = self._rule_tree()

    def stream(self):
        draw = self.draw
        top = self.frame = Frame("top", None, 0)
        # per-example programs: x0 holds the examples; the first inputs may too, the later ones (a
        # matmul's weights, a cond's predicate) are shared
        per_example = self.sw["per_example"]
        x0 = self._input(self._shape(), batched=per_example)
        self.scope.append(x0)
        if self.sw["extra_inputs"]:
            n = 0
            while n < 2 and len(self.inputs) < self.cfg.max_inputs and draw(BOOL, label="more_inputs"):
                same = not draw(BOOL, label="input_shape_differs")
                batched = per_example and draw(BOOL, label="input_batched")
                self.scope.append(self._input(x0.shape if same else self._shape(), batched))
                n += 1
        budget = 2 * max(1, self.cfg.max_stmts)
        used = self._span_item()   # a program has at least one item
        # Past the budget, "continue?" is still drawn (and more likely to stop) but reads no item:
        # the stream always ends with a stop, so that deleting an item never runs out of choices.
        while draw_int(draw, 0, 9 if used < budget else 1, "more") != 0:
            if used < budget:
                used += self._span_item()
        while True:   # close what is still open; an empty region or block gets the simplest op
            if not self.frame.items:
                self._gen_op(simplest=True)
            if self.frame is top:
                break
            self._close(self.frame)
        extra_out = None
        if self.sw["dead_values"] and draw(BOOL, label="extra_output"):
            extra_out = draw_int(draw, 0, MAX_OPERAND_BACK - 1, "extra_output_back")
        return top, extra_out

    # -- deriving the program ------------------------------------------------------------
    def program(self) -> Program:
        top, extra_out = self.stream()
        values = [v for v in self.scope if v.id in self.home]
        readers: dict[str, list[Frame]] = {}   # value id -> the frames of the statements reading it

        def note_reads(f):
            for it in f.items:
                if isinstance(it, Op):
                    for a in it.args:
                        readers.setdefault(a, []).append(f)
                else:
                    if it.kind == "cond":   # the cond reads its result's source in its first branch
                        readers.setdefault(it.scan["source"], []).append(it)
                    if it.kind == "scan":   # the scan reads its initial carry; its body, what it carries out
                        if it.scan["carry"] is not None:
                            readers.setdefault(it.scan["init"].id, []).append(f)
                        for a in ([it.scan["carry_out"]] if it.scan["carry"] else []) + it.scan["ys"]:
                            readers.setdefault(a, []).append(it)
                    note_reads(it)
        note_reads(top)
        if self.sw["dead_values"]:   # the newest value (and maybe one more): the rest may be dead
            outs = [values[-1].id]
            if extra_out is not None and len(values) > 1:
                outs.append(values[-2 - extra_out % (len(values) - 1)].id)
        else:   # every value nothing reads is an output: no dead code
            outs = [v.id for v in values if v.id not in readers]
        for o in outs:
            readers.setdefault(o, []).append(top)
        # The regions and blocks each value must leave (be a result of): those around its
        # definition that some reader is outside of.
        leaves: dict[str, set[int]] = {}
        for vid, f in self.home.items():   # scan bodies' values included (they left the scope)
            home = chain(f)
            leaves[vid] = {id(g) for r in readers.get(vid, ()) for g in home - chain(r)}
        body = self._build(top, leaves)
        if self.sw["sequential_regions"] and self.sw["policy:no_policy"]:
            self._sequential_tail(body, outs)
        diff = Diff(order=2 if self.sw["second_order"] else 1)
        if self.sw["second_order"] and self.sw["diff_modes"]:   # how H @ ones is computed (first: reverse)
            diff.mode = DIFF_MODES[draw_int(self.draw, 0, len(DIFF_MODES) - 1, "diff_mode")]
        if self.sw["seeded_cotangents"] and not self.sw["second_order"]:
            diff.cotangents = "seeded"
        if self.sw["per_example"]:   # per-example gradients over 2 or 3 examples
            diff.batch = (2, 3)[draw_int(self.draw, 0, 1, "batch")]
        if self.sw["aux_outputs"] and len(outs) > 1:   # the last outputs returned as aux, not differentiated
            diff.aux = 1 + draw_int(self.draw, 0, min(2, len(outs) - 1) - 1, "aux_outputs")
        return Program(inputs=self.inputs, body=body, outputs=outs, diff=diff)

    def _build(self, f: Frame, leaves) -> list:
        body = []
        for it in f.items:
            if isinstance(it, Op):
                body.append(it)
                continue
            inner = self._build(it, leaves)
            if not inner:
                continue
            defined = [r for s in inner for r in ([s.out] if isinstance(s, Op) else s.results)]
            results = [d for d in defined if id(it) in leaves.get(d, ())]
            if it.kind == "scan":
                body.append(self._scan(it, inner))
            elif it.kind == "jit":
                body.append(Jit(args=free_vars(inner), body=inner, results=results or [defined[-1]]))
            elif it.kind == "cond":
                body.append(self._cond(it, inner))
            elif it.kind == "checkpoint":
                results = results or [defined[-1]]
                args = free_vars(inner)
                cse = ([bool(it.cse_mask >> (k % 3) & 1) for k in range(len(args))]
                       if it.cse_mask is not None and it.tree == "flat" else [])
                body.append(Checkpoint(args=args, body=inner, results=results,
                                       policy=self._policy(it, inner), prevent_cse=it.prevent_cse,
                                       static_flag=it.static_flag, tree=it.tree, static_by=it.static_by,
                                       static_value=it.static_value, prevent_cse_args=cse,
                                       state=it.state if it.tree == "flat" else "none", extras=it.extras))
            elif it.kind == "custom_jvp":
                body.append(self._cjvp(it, inner, defined, results))
                self.cjvp_frames[id(body[-1])] = (it, defined)
            else:
                body.append(self._cvjp(it, inner, defined, results))
        return body

    def _sequential_tail(self, body: list, outs: list) -> None:
        """Regions without a policy chained on the first output, then an op reading the last one's
        result, which replaces that output (what torch's checkpoint_sequential spells)."""
        v = outs[0]
        # (one region: a tail of more would be a block the shrinker cannot take apart)
        for in_region in (True, False):
            op = SEQUENTIAL_OPS[draw_int(self.draw, 0, len(SEQUENTIAL_OPS) - 1, "sequential_op")]
            o = self.fresh()
            self.types[o] = self.types[v]
            s = Op(op=op, args=[v], out=o)
            body.append(Checkpoint(args=[v], body=[s], results=[o], policy=NoPolicy()) if in_region else s)
            v = o
        outs[0] = v

    def _policy(self, it: Frame, inner):
        return make_policy(it.policy_choice, [s.op for s in inner if isinstance(s, Op)])

    @staticmethod
    def _block_results(it: Frame, defined, results) -> list[str]:
        """A block's results: what is read outside it (else its last value), and with
        unused_results one value more that nothing reads."""
        if not results:
            results = [defined[-1]]
        if it.extra_result:
            extra = [d for d in defined if d not in results]
            if extra:
                results = sorted(results + extra[:1], key=defined.index)
        return results

    def _cjvp(self, it: Frame, body, defined, results) -> CustomJVP:
        return self._cjvp_rule(it, body, self._block_results(it, defined, results))

    def _cjvp_rule(self, it: Frame, body, results) -> CustomJVP:
        args = free_vars(body)
        tangents = [self.fresh("t") for _ in args]
        for t, a in zip(tangents, args):
            self.types[t] = self.types[a]
        jvp, tan = jvp_ops(body, self.types, args, tangents, lambda: self.fresh("j"))
        jvp_results = [tan[r] for r in results]
        # A deliberately non-standard but well-defined rule: scale one result's tangent.
        if it.nonstandard is not None:
            jvp, jvp_results = scale_result(jvp, jvp_results, it.nonstandard % len(results), 3.0,
                                            lambda: self.fresh("j"))
        return CustomJVP(args=args, body=body, results=results, tangents=tangents, jvp=jvp, jvp_results=jvp_results,
                         tree=it.tree)

    def _export(self, s: CustomJVP, used: set[str]) -> CustomJVP:
        """A custom_jvp of a custom_vjp fwd, with the values of its body that the bwd rule reads
        as results too (residuals are fwd values)."""
        extra = [o.out for o in s.body if o.out in used and o.out not in s.results]
        if not extra:
            return s
        it, defined = self.cjvp_frames[id(s)]
        return self._cjvp_rule(it, s.body, sorted(s.results + extra, key=defined.index))

    def _cvjp(self, it: Frame, fwd, defined, results) -> CustomVJP:
        results = self._block_results(it, defined, results)
        args = free_vars(fwd)
        cts = [self.fresh("g") for _ in results]
        for c, r in zip(cts, results):
            self.types[c] = self.types[r]
        # bwd is the derivative of the primal: a custom_jvp in fwd counts as its body
        flat = _flat_ops(fwd)
        bwd, argct, used = vjp_ops(flat, self.types, results, cts, args, lambda: self.fresh("b"))
        fwd = [self._export(s, used) if isinstance(s, CustomJVP) else s for s in fwd]
        bwd_results = [argct.get(a) for a in args]
        # A deliberately non-standard but well-defined rule: scale one arg's cotangent.
        if it.nonstandard is not None:
            bwd, bwd_results = scale_result(bwd, bwd_results, it.nonstandard % len(args), 3.0,
                                            lambda: self.fresh("b"))
        residuals = residuals_of(used, args, flat)
        for r in fwd:   # a region in fwd exports the residuals it defines (bwd reads them after it)
            if isinstance(r, Checkpoint):
                inner = [o.out for o in _flat_ops(r.body)]
                r.results = [o for o in inner if o in r.results or (o in residuals and o not in r.args)]
        nd_k, once, branch = it.fn_opts
        return CustomVJP(args=args, fwd=fwd, results=results, residuals=residuals, cts=cts, bwd=bwd,
                         bwd_results=bwd_results, nondiff=it.nondiff, symbolic_zeros=it.symbolic_zeros,
                         optimize_remat=it.optimize_remat, spelling=it.spelling, residual_tree=it.residual_tree,
                         perturbed_branch=it.perturbed_branch, tree=it.tree, once_differentiable=once,
                         bwd_branch=branch and bwd_results[0] is not None,
                         non_differentiable=[results[(nd_k - 1) % len(results)]] if nd_k and len(results) > 1 else [])


def _flat_ops(body) -> list:
    """The ops of a custom_vjp fwd rule, those of the custom_jvp blocks and regions in it included."""
    return [o for s in body for o in (_flat_ops(s.body) if isinstance(s, (CustomJVP, Checkpoint)) else [s])]


@st.composite
def programs(draw, cfg: Config | None = None) -> Program:
    cfg = cfg or Config()
    prog = validate(_Gen(draw, cfg).program())
    if cfg.lacks and not prog.features().isdisjoint(cfg.lacks):
        reject()   # a feature the installed release cannot express (its swarm dimension, where it is the only one,
        # is off: Options.config)
    return prog


def input_values(prog: Program, seed: int) -> dict[str, np.ndarray]:
    """Deterministic input values in [-1, 1] for a program, from a seed."""
    rng = np.random.default_rng(seed)
    return {i.id: rng.uniform(-1.0, 1.0, size=value_shape(prog, i)).astype(i.dtype) for i in prog.inputs}


@st.composite
def cases(draw, cfg: Config | None = None):
    """(program, input seed). With a focus (Config.focus), half of the programs aim at one of its
    features: drawn with its dimensions on until one has it (at most FOCUS_TRIES draws; the
    simplest choice, shrinking's target, is no focus)."""
    cfg = cfg or Config()
    if cfg.focus and flag(draw, (1, 2), "focus"):
        feature = cfg.focus[draw_int(draw, 0, len(cfg.focus) - 1, "focus_feature")]
        aimed = focused(cfg, feature)
        for _ in range(FOCUS_TRIES):
            prog = draw(programs(aimed))
            if feature in prog.features():
                break
    else:
        prog = draw(programs(cfg))
    seed = draw(st.integers(0, 2 ** 16), label="input_seed")
    return prog, seed
