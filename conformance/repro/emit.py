"""The program as source: the dialect-independent emitter and the pseudo-code dialect.

An emitter lowers the IR to straight-line source: ops through its dialect's lowering
table, regions and custom_vjp blocks through its own `region` and `block`. Identifiers
are derived from value ids when they are safe, `v_<k>` otherwise.
"""
from __future__ import annotations

import json
import keyword
import re

from conformance.ir import ops as O
from conformance.ir.nodes import ITER_SEP, Checkpoint, Cond, CustomJVP, CustomVJP, Jit, Op, Scan, walk
from conformance.ir.program import Program
from conformance.pipelines.jax import table as jax_table

_GENERATED = re.compile(
    r"^(region|block|Block|ctx|policy|nd|ct|decisions|step|carry|xs|ys|y|it|scan_env|jit|branch|cond_env|vals|static|out)_?\d+$"
)
_RESERVED = {
    "jax",
    "jnp",
    "lax",
    "cp",
    "np",
    "torch",
    "A",
    "partial",
    "checkpoint",
    "log",
    "dt",
    "program",
    "loss_fn",
    "run",
    "tag",
    "TAG_PACKET",
    "KINDS_OF",
    "CONST",
    "INPUTS",
    "DIFF",
    "sys",
    "re",
    "os",
    "env",
    "inputs",
    "sac_policy",
    "save_prims",
    "checkpoint_name",
    "checkpoint_name_fwd",
    "itertools",
    "Counter",
    "faulthandler",
    "LOG",
    "NAMES",
    "REMAT",
    "F64",
    "PREFER",
    "OPTS",
    "COMPILED",
    "backend_fn",
    "SETTINGS",
    "all_values",
    "main",
    "res",
    "cts",
    "ctx",
    "torch_checkpoint",
    "CheckpointPolicy",
    "create_selective_checkpoint_contexts",
    "compiled",
    "Saved",
    "identify",
    "VALUE_REF",
    "perturbed",
    "keep",
    "spelled",
    "rem",
    "primal",
    "fwd",
    "bwd",
    "f",
    "rule",
}


def _prelude_names() -> set[str]:
    """The functions the dialects' preludes define (a value id must not shadow them)."""
    from conformance.pipelines.torch import table as torch_table
    return {m.group(1) for src in (jax_table.PRELUDE, torch_table.PRELUDE)
            for m in re.finditer(r"^def (\w+)\(", src, re.M)}


_RESERVED |= _prelude_names()


def identifiers(prog: Program) -> dict[str, str]:
    ids = [i.id for i in prog.inputs]
    for s, _, _, _ in walk(prog.body):
        if isinstance(s, Op):
            ids.append(s.out)
        elif isinstance(s, CustomVJP):
            ids += list(s.cts)
        elif isinstance(s, CustomJVP):
            ids += list(s.tangents)
        elif isinstance(s, Scan):
            ids += list(s.carry) + list(s.xs) + list(s.results)
        elif isinstance(s, Cond):
            ids += list(s.results)
    out, used = {}, set()
    for k, i in enumerate(ids):
        n = i if (i.isidentifier() and i.isascii() and not keyword.iskeyword(i) and i not in _RESERVED
                  and not _GENERATED.match(i) and not i.startswith("_")) else f"v_{k}"
        while n in used:
            n += "_"
        used.add(n)
        out[i] = n
    return out


class Emitter:
    """Source for one dialect. Subclasses: op_text, region, block, jvp_block, zeros, value_input."""

    def __init__(self, prog: Program):
        self.prog = prog
        self.n = identifiers(prog)
        self.types = prog.types()
        self.defs: list[str] = []
        self.counter = 0

    def next_id(self) -> int:
        self.counter += 1
        return self.counter

    @staticmethod
    def tuple_(xs: list[str]) -> str:
        return "(" + ", ".join(xs) + ("," if len(xs) == 1 else "") + ")"

    def op_text(self, op: str, args: list[str], params: dict, nondiff: str | None) -> str:
        raise NotImplementedError

    def block_names(self, s: CustomVJP):
        """(nondiff params, args, results, residuals, cotangents, nondiff literals) of a block."""
        return ([f"nd{i}" for i in range(len(s.nondiff))], [self.n[a] for a in s.args],
                [self.n[r] for r in s.results], [self.n[r] for r in s.residuals], [self.n[c] for c in s.cts],
                [repr(float(v)) for v in s.nondiff])

    def op(self, s: Op, nd: list[str] | None, literal_nondiff=None) -> str:
        nondiff = None
        if O.ND_INDEX in s.params and O.OPS[s.op].in_rules_only:
            ix = s.params[O.ND_INDEX]
            nondiff = repr(float(literal_nondiff[ix])) if literal_nondiff is not None else nd[ix]
        return self.op_text(s.op, [self.n[a] for a in s.args], s.params, nondiff)

    def body(self, stmts, ind: str, path: str, nd: list[str] | None) -> list[str]:
        lines = []
        for i, s in enumerate(stmts):
            p = f"{path}[{i}]"
            if isinstance(s, Op):
                lines.append(f"{ind}{self.n[s.out]} = {self.op(s, nd)}")
            elif isinstance(s, Checkpoint):
                lines += self.region(s, p, ind, nd)
            elif isinstance(s, CustomVJP):
                lines += self.block(s, p, ind)
            elif isinstance(s, CustomJVP):
                lines += self.jvp_block(s, p, ind)
            elif isinstance(s, Scan):
                lines += self.scan(s, p, ind, nd)
            elif isinstance(s, Jit):
                lines += self.jit(s, p, ind, nd)
            elif isinstance(s, Cond):
                lines += self.cond(s, p, ind, nd)
        return lines

    def cond(self, s: Cond, path: str, ind: str, nd) -> list[str]:
        """A cond: one function per branch, defined where it is called, then the dialect's call."""
        k = self.next_id()
        ops = [self.n[a] for a in s.args[1:]]
        lines, fns = [], []
        for j, b in enumerate(s.branches):
            fns.append(f"branch_{k}_{j}")
            lines.append(f"{ind}def {fns[-1]}({', '.join(ops)}):   # {path}.branches[{j}]")
            lines += self.body(b, ind + "    ", f"{path}.branches[{j}]", nd)
            lines.append(f"{ind}    return {self.tuple_([self.n[r] for r in s.branch_results[j]])}")
        index = f"branch_index({self.n[s.args[0]]}, {len(s.branches)})"
        return lines + [f"{ind}{self.tuple_([self.n[r] for r in s.results])} = {self.cond_call(index, fns, ops)}"]

    def cond_call(self, index: str, fns: list[str], ops: list[str]) -> str:
        """Calling the branch the index picks (default: Python indexing, on a concrete index)."""
        return f"[{', '.join(fns)}][{index}]({', '.join(ops)})"

    NON_TENSOR_OUTPUTS: tuple = (None, 3)   # what a region with extras returns after its results (the interpreter's)

    def region_spelling(self, s: Checkpoint, k: int):
        """How a region's function is spelled (its static flag, its pytree): (parameters, prologue
        lines unpacking them, the return expression, the call's arguments, and the lines reading
        the call's result `out` into the results)."""
        args, res = [self.n[a] for a in s.args], [self.n[r] for r in s.results]
        vals = f"vals_{k}"
        params = [vals] if s.tree != "flat" else list(args)
        pro = (
            [f"    {self.tuple_(args)} = {vals}"]
            if s.tree == "tuple"
            else [f"    {self.tuple_(args)} = {self.tuple_([f'{vals}[{a!r}]' for a in s.args])}"]
            if s.tree == "dict"
            else []
        )
        call = ([self.tuple_(args)] if s.tree == "tuple" else
                ["{" + ", ".join(f"{a!r}: {self.n[a]}" for a in s.args) + "}"] if s.tree == "dict" else list(args))
        if s.static_flag:   # a static argument the function branches on (static_argnums in JAX)
            value = "[True]" if s.static_value == "unhashable" else "True"
            name = "flag" if s.static_by == "argnames" else f"static_{k}"   # passed by keyword, or last
            params.append(f"{name}=None" if name == "flag" else name)
            test = (f"{name} is not True" if value == "True" else
                    f"not (isinstance({name}, list) and len({name}) == 1 and {name}[0] is True)")
            pro = [f"    if {test}:", f"        raise ValueError('the static flag must be {value}')"] + pro
            call.append(f"flag={value}" if name == "flag" else value)
        ret = (
            ("{" + ", ".join(f"{r!r}: {self.n[r]}" for r in s.results) + "}") if s.tree == "dict" else self.tuple_(res)
        )
        read = self.tuple_([f"out_{k}[{r!r}]" for r in s.results]) if s.tree == "dict" else f"out_{k}"
        if s.extras:   # non-tensor values returned after the results, dropped by the caller
            ret = f"({', '.join(res)}, {', '.join(map(repr, self.NON_TENSOR_OUTPUTS))})"
            read = f"out_{k}[:{len(res)}]"
        return params, pro, ret, call, read

    def jit(self, s: Jit, path: str, ind: str, nd) -> list[str]:
        """A jitted sub-function: defined where it is called, called through the dialect's jit_fn."""
        fn = f"jit_{self.next_id()}"
        args, res = [self.n[a] for a in s.args], self.tuple_([self.n[r] for r in s.results])
        lines = [f"{ind}def {fn}({', '.join(args)}):   # the jitted sub-function {path}"]
        lines += self.body(s.body, ind + "    ", path + ".body", nd) + [f"{ind}    return {res}"]
        call = f"{self.jit_fn}({fn})" if self.jit_fn else fn
        return lines + [f"{ind}{res} = {call}({', '.join(args)})"]

    jit_fn = ""   # how the dialect jits a sub-function ("": it runs inline)

    def scan(self, s: Scan, path: str, ind: str, nd) -> list[str]:
        """A scan: its body as a step function (carry, x) -> (new carry, y), then the dialect's loop."""
        k = self.next_id()
        step = f"step_{k}"
        _, _, consts = s.split_args()
        # a while_loop reads every closed-over value under stop_gradient: bound as parameters
        # whose defaults are the stopped values
        stopped = "".join(f", {self.n[a]}={self.stop_fn.format(self.n[a])}" for a in consts) if (
            s.spelling == "while_loop") else ""
        lines = [f"{ind}def {step}(carry_{k}, xs_{k}{stopped}):   # the body of the {s.spelling} {path}",
                 f"{ind}    {self.tuple_([self.n[c] for c in s.carry])} = carry_{k}"]
        if s.xs:
            lines.append(f"{ind}    {self.tuple_([self.n[x] for x in s.xs])} = xs_{k}")
        lines += self.body(s.body, ind + "    ", path + ".body", nd)
        lines.append(f"{ind}    return {self.tuple_([self.n[c] for c in s.carry_out])}, "
                     f"{self.tuple_([self.n[y] for y in s.ys])}")
        init, xs, _ = s.split_args()
        nc = len(s.carry)
        return lines + self.scan_loop(k, step, s, ind, [self.n[a] for a in init], [self.n[a] for a in xs],
                                      [self.n[r] for r in s.results[:nc]], [self.n[r] for r in s.results[nc:]])

    def scan_loop(self, k: int, step: str, s: Scan, ind: str, init, xs, carry_res, ys_res) -> list[str]:
        """The loop calling `step` (default: a Python loop stacking ys with stack_fn)."""
        c, ys, it = f"carry_{k}", f"ys_{k}", f"it_{k}"
        if s.spelling == "while_loop":
            init = [self.stop_fn.format(a) for a in init]
        out = [f"{ind}{c}, {ys} = {self.tuple_(init)}, []",
               f"{ind}for {it} in range({s.length}):",
               f"{ind}    {c}, y_{k} = {step}({c}, {self.tuple_([f'{x}[{it}]' for x in xs])})",
               f"{ind}    {ys}.append(y_{k})"]
        if carry_res:
            out.append(f"{ind}{self.tuple_(carry_res)} = {c}")
        for j, r in enumerate(ys_res):
            out.append(f"{ind}{r} = {self.stack_fn}([y_{k}[{j}] for y_{k} in {ys}])")
        return out

    stack_fn = "stack"
    stop_fn = "stop_gradient({})"

    def jvp_block(self, s: CustomJVP, path: str, ind: str) -> list[str]:
        raise NotImplementedError(f"{type(self).__name__}: no custom_jvp")

    def program(self) -> tuple[str, str]:
        """(definitions, the body of `program(*diff_inputs)`)."""
        lines = [f"    {self.n[i.id]} = CONST[{json.dumps(i.id)}]   # not differentiated"
                 for i in self.prog.inputs if not i.diff]
        lines += self.body(self.prog.body, "    ", "body", None)
        lines.append(f"    return [{', '.join(self.n[o] for o in self.prog.outputs)}]")
        return "\n\n".join(d.rstrip() + "\n" for d in self.defs), "\n".join(lines)

    def values(self) -> str:
        """Flattened primal: every op outside bwd rules, nondiff constants inlined."""
        lines = [f"    {self.n[i.id]} = {self.value_input(json.dumps(i.id))}" for i in self.prog.inputs]
        keys = [i.id for i in self.prog.inputs]

        iters: list[str] = []   # the dicts of scans' per-iteration values

        def visit(stmts, literal, ind, rec):
            for s in stmts:
                if isinstance(s, Op):
                    lines.append(f"{ind}{self.n[s.out]} = {self.op(s, None, literal)}")
                    rec(s.out)
                elif isinstance(s, (Checkpoint, Jit)):
                    visit(s.body, literal, ind, rec)
                elif isinstance(s, CustomVJP):
                    visit(s.fwd, list(s.nondiff), ind, rec)
                elif isinstance(s, CustomJVP):
                    visit(s.body, literal, ind, rec)
                elif isinstance(s, Scan):
                    scan(s, literal, ind, rec)
                elif isinstance(s, Cond):
                    cond(s, literal, ind, rec)

        def cond(s: Cond, literal, ind, outer_rec):
            # only the branch taken runs: its values go to a dict of their own
            k = self.next_id()
            env = f"cond_env_{k}"
            lines.append(f"{ind}{env} = {{}}")
            for j, b in enumerate(s.branches):
                head = "if" if j == 0 else "elif"
                lines.append(f"{ind}{head} int(branch_index({self.n[s.args[0]]}, {len(s.branches)})) == {j}:")
                inner = ind + "    "
                visit(b, literal, inner, lambda i: lines.append(f"{inner}{env}[{json.dumps(i)}] = {self.n[i]}"))
                lines.append(f"{inner}{self.tuple_([self.n[r] for r in s.results])} = "
                             f"{self.tuple_([self.n[r] for r in s.branch_results[j]])}")
            for r in s.results:
                outer_rec(r)
            iters.append(env)

        def scan(s: Scan, literal, ind, outer_rec):
            # iteration it's values as `<id>@<it>`, as the harness's recording evaluation names them
            k = self.next_id()
            env, it = f"scan_env_{k}", f"it_{k}"
            init, xs, _ = s.split_args()
            nc = len(s.carry)
            lines.append(f"{ind}{env} = {{}}")
            lines.append(f"{ind}{self.tuple_([self.n[c] for c in s.carry])} = {self.tuple_([self.n[a] for a in init])}")
            lines.append(f"{ind}ys_{k} = []")
            lines.append(f"{ind}for {it} in range({s.length}):")
            inner = ind + "    "
            for x, a in zip(s.xs, xs):
                lines.append(f"{inner}{self.n[x]} = {self.n[a]}[{it}]")
            rec = lambda i: lines.append(f"{inner}{env}[{json.dumps(i + ITER_SEP)} + str({it})] = {self.n[i]}")  # noqa: E731
            for i in s.carry + s.xs:
                rec(i)
            visit(s.body, literal, inner, rec)
            lines.append(f"{inner}ys_{k}.append({self.tuple_([self.n[y] for y in s.ys])})")
            lines.append(f"{inner}{self.tuple_([self.n[c] for c in s.carry])} = "
                         f"{self.tuple_([self.n[c] for c in s.carry_out])}")
            if nc:
                lines.append(f"{ind}{self.tuple_([self.n[r] for r in s.results[:nc]])} = "
                             f"{self.tuple_([self.n[c] for c in s.carry])}")
            for j, r in enumerate(s.results[nc:]):
                lines.append(f"{ind}{self.n[r]} = {self.stack_fn}([y_{k}[{j}] for y_{k} in ys_{k}])")
            for r in s.results:
                outer_rec(r)
            iters.append(env)
        visit(self.prog.body, None, "    ", keys.append)
        lines.append("    env = {" + ", ".join([f"{json.dumps(k)}: {self.n[k]}" for k in keys]
                                           + [f"**{e}" for e in iters]) + "}")
        return "\n".join(lines)

    def value_input(self, key: str) -> str:
        return f"inputs[{key}]"


def policy_text(p) -> str:
    """A policy as JAX spells it (pseudo-code and comments)."""
    return jax_table.policy_source(p).replace("cp.", "")


class PseudoEmitter(Emitter):
    """Readable pseudo-Python for reports."""

    def op_text(self, op, args, params, nondiff):
        return O.pseudo(op, args, params)

    jit_fn = "jit"

    def cond_call(self, index, fns, ops):
        return f"switch({index}, [{', '.join(fns)}], {', '.join(ops)})"

    def scan_loop(self, k, step, s, ind, init, xs, carry_res, ys_res):
        opts = f", unroll={s.unroll}" if s.unroll != 1 else ""
        if s.spelling == "vmap":
            return [f"{ind}{self.tuple_(ys_res)} = vmap({step}, xs={self.tuple_(xs)})"]
        if s.spelling != "scan":
            return [f"{ind}{self.tuple_(carry_res)} = {s.spelling}({step}, init={self.tuple_(init)}, "
                    f"length={s.length}{opts})"]
        return [f"{ind}{self.tuple_(carry_res)}, {self.tuple_(ys_res)} = scan({step}, init={self.tuple_(init)}, "
                f"xs={self.tuple_(xs)}, length={s.length}{opts})"]

    def region(self, s, path, ind, nd):
        head = f"{ind}with checkpoint(policy={policy_text(s.policy)}" + (
            jax_table.checkpoint_options_source(s, plain=True)) + (
            f", state={s.state!r}" if s.state != "none" else "") + (
            f", args_as={s.tree!r}" if s.tree != "flat" else "") + f"):   # {path}"
        return [head] + self.body(s.body, ind + "    ", path + ".body", nd) + [
            f"{ind}    export {', '.join(self.n[r] for r in s.results)}"]

    def block(self, s, path, ind):
        nd, args, results, resid, cts, ndv = self.block_names(s)
        opts = [f"{o}=True" for o in ("symbolic_zeros", "optimize_remat") if getattr(s, o)]
        opts += [f"spelling={s.spelling!r}"] if s.spelling != "defvjp" else []
        opts += [f"residuals_as={s.residual_tree!r}"] if s.residual_tree != "tuple" else []
        opts += ["bwd_branches_on_perturbed=True"] if s.perturbed_branch else []
        opts += [f"args_as={s.tree!r}"] if s.tree != "flat" else []
        opts += [f"nondiff=[{', '.join(ndv)}]"] if ndv else []
        out = [f"{ind}with custom_vjp({', '.join(opts)}):   # {path}", f"{ind}    def fwd({', '.join(args)}):"]
        out += self.body(s.fwd, ind + "        ", path + ".fwd", nd)
        out += [f"{ind}        return {self.tuple_(results)}, residuals={self.tuple_(resid)}",
                f"{ind}    def bwd(residuals={self.tuple_(resid)}, cotangents={self.tuple_(cts)}):"]
        out += self.body(s.bwd, ind + "        ", path + ".bwd", nd)
        out += [f"{ind}        return {self.tuple_([self.n[r] if r else 'zeros' for r in s.bwd_results])}",
                f"{ind}    export {', '.join(results)}"]
        return out

    def jvp_block(self, s, path, ind):
        args, results = [self.n[a] for a in s.args], [self.n[r] for r in s.results]
        out = [
            f"{ind}with custom_jvp({'args_as=' + repr(s.tree) if s.tree != 'flat' else ''}):   # {path}",
            f"{ind}    def primal({', '.join(args)}):",
        ]
        out += self.body(s.body, ind + "        ", path + ".body", None)
        out += [
            f"{ind}        return {self.tuple_(results)}",
            f"{ind}    def jvp(primals={self.tuple_(args)}, tangents={self.tuple_([self.n[t] for t in s.tangents])}):",
            f"{ind}        {self.tuple_(results)} = primal({', '.join(args)})",
        ]
        out += self.body(s.jvp, ind + "        ", path + ".jvp", None)
        out += [f"{ind}        return {self.tuple_(results)}, {self.tuple_([self.n[t] for t in s.jvp_results])}",
                f"{ind}    export {', '.join(results)}"]
        return out


SECOND_ORDER_TEXT = {
    "reverse": "grad of sum(grad of sum(outputs))",
    "fwd_over_rev": "jvp of grad of sum(outputs) along ones (forward over reverse: H @ ones)",
    "rev_over_fwd": "grad of (jvp of sum(outputs) along ones) (reverse over forward: H @ ones)",
    "linearize": "jax.linearize of grad of sum(outputs), applied to ones (H @ ones)",
}


def pseudo_code(program) -> str:
    """The program as readable pseudo-Python (for reports)."""
    prog = program if isinstance(program, Program) else Program.model_validate(program)
    e = PseudoEmitter(prog)
    sig = ", ".join(f"{e.n[i.id]}: {i.dtype}{list(i.shape)}" + ("" if i.diff else " (no grad)")
                    + (" (one example)" if i.batched else "") for i in prog.inputs)
    lines = [f"def f({sig}):"] + e.body(prog.body, "    ", "body", None)
    lines.append(f"    return {', '.join(e.n[o] for o in prog.outputs)}")
    tail = SECOND_ORDER_TEXT[prog.diff.mode] if prog.diff.order == 2 else (
        "grad of sum(outputs * seeded cotangents)" if prog.diff.cotangents == "seeded" else "grad of sum(outputs)")
    if prog.diff.aux:
        tail = tail.replace("outputs", f"outputs[:{len(prog.outputs) - prog.diff.aux}]") + (
            f"; the last {prog.diff.aux} returned as aux (value_and_grad(has_aux=True))")
    if prog.diff.batch:
        tail = (f"per example, over {prog.diff.batch} examples (vmap of value_and_grad; batched: "
                f"{', '.join(e.n[i.id] for i in prog.inputs if i.batched)}; the others shared): {tail}")
    return "\n".join(lines) + f"\n# differentiated: {tail} w.r.t. " + ", ".join(e.n[i.id] for i in prog.diff_inputs())
