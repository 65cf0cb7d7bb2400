"""The interpreter every lowering subclasses: a program evaluated statement by statement, each
framework saying what an op, a region, a custom rule, a scan, a cond and a jitted sub-function
are. Scans loop and conds branch in Python by default (what PyTorch runs, and what a recording
evaluation runs, recording each iteration's values as `<id>@<k>`).

Program layer: imports the IR only.
"""
from __future__ import annotations

import math

from conformance.ir.nodes import ITER_SEP, Checkpoint, Cond, CustomJVP, CustomVJP, Jit, Op, Scan, walk
from conformance.ir.program import Program


def seeded_cotangent(shape) -> list:
    """The cotangent an output of this shape receives under `cotangents: seeded` (row-major
    flat values in [0, 1], not all equal), as nested lists."""
    n = math.prod(shape)
    flat = [0.5 + 0.5 * math.cos(1.7 * k + 0.3) for k in range(n)]
    for d in reversed(shape[1:]):
        flat = [flat[i:i + d] for i in range(0, len(flat), d)]
    return flat if shape else flat[0]


def loss_outputs(prog: Program) -> int:
    """How many outputs (the first ones) the loss sums; the rest are auxiliary (has_aux)."""
    return len(prog.outputs) - prog.diff.aux


def output_cotangents(prog: Program) -> list | None:
    """The seeded cotangent of each output the loss sums (None: every one's is ones)."""
    if prog.diff.cotangents != "seeded":
        return None
    types = prog.types()
    return [seeded_cotangent(list(types[o][0])) for o in prog.outputs[:loss_outputs(prog)]]


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

    def branch(self, pred, n: int) -> int:
        """The branch a cond takes: `branch_index` of the predicate's sum, concretely."""
        raise NotImplementedError

    def cond(self, s: "Cond", path: str, args: list) -> list:
        """A cond as Python control flow on the concrete predicate (default: what PyTorch runs, and
        what a recording evaluation runs)."""
        k = self.branch(args[0], len(s.branches))
        e = self.body(s.branches[k], dict(zip(s.args[1:], args[1:])), None, f"{path}.branches[{k}]")
        return [e[r] for r in s.branch_results[k]]

    def jit(self, s: "Jit", path: str):
        """A callable taking the jitted sub-function's args (default: its body inline)."""
        return self.region_fn(s, path)

    def region_fn(self, s: Checkpoint, path: str):
        """The region's (or sub-function's) body as a function of its args (no checkpoint); in a
        custom_vjp fwd rule its ops see the rule's nondiff args."""
        nondiff = self.rule_nondiff(path)

        def fn(*args):
            e = self.body(s.body, dict(zip(s.args, args)), nondiff, path + ".body")
            return tuple(e[r] for r in s.results)
        return fn

    def rule_nondiff(self, path: str) -> list | None:
        """The nondiff args of the custom_vjp whose fwd rule holds the statement at `path` (None
        outside rules)."""
        table = self.__dict__.get("_rule_nondiff")
        if table is None:
            table = self._rule_nondiff = {}
            for b, _, bp, _ in walk(self.prog.body):
                if isinstance(b, CustomVJP):
                    table.update((sp, list(b.nondiff)) for _, _, sp, _ in walk(b.fwd, path=bp + ".fwd"))
        return table.get(path)

    # The non-tensor values a region with `extras` returns after its results (a framework's own: PyTorch adds a string)
    NON_TENSOR_OUTPUTS: tuple = (None, 3)

    def extras_intact(self, extras) -> bool:
        """Whether a region's non-tensor outputs came back as returned (JAX returns the int as an integer array:
        the None and the count are what it must keep)."""
        return len(extras) == len(self.NON_TENSOR_OUTPUTS) and extras[0] is None

    def spelled_region(self, s: Checkpoint, fn):
        """(the region's function as the program spells it, how to call it on the args, how to read
        its results): with a static flag argument it branches on (passed last, or by keyword as
        `flag`; True, or [True] where the region says unhashable), taking and returning one
        pytree (a tuple or a dict keyed by value id) where the region says so, and returning
        NON_TENSOR_OUTPUTS after its results where it has `extras` (read checks and drops them)."""
        extras = tuple(self.NON_TENSOR_OUTPUTS) if s.extras else ()
        intact = self.extras_intact
        flag_value = [True] if s.static_value == "unhashable" else True
        by_keyword = s.static_by == "argnames"

        def spelled(*a, **kw):
            if s.static_flag:
                if by_keyword:
                    flag = kw.pop("flag", None)
                else:
                    a, flag = a[:-1], a[-1]
                ok = flag is True if s.static_value == "bool" else (
                    isinstance(flag, list) and len(flag) == 1 and flag[0] is True)
                if not ok:   # a traced flag: the static argument was not made static (one message whatever the
                    # flag's spelling, True or [True]: one behaviour, one error root)
                    raise ValueError("the region's static flag must be True")
            if s.tree == "tuple":
                a = a[0]
            elif s.tree == "dict":
                a = [a[0][k] for k in s.args]
            out = fn(*a)
            return {r: v for r, v in zip(s.results, out)} if s.tree == "dict" else (*out, *extras)

        def call(f, args):
            packed = (
                [tuple(args)] if s.tree == "tuple" else [dict(zip(s.args, args))] if s.tree == "dict" else list(args)
            )
            if not s.static_flag:
                return f(*packed)
            return f(*packed, flag=flag_value) if by_keyword else f(*packed, flag_value)

        def read(out):
            if s.tree == "dict":
                return tuple(out[r] for r in s.results)
            if extras and not intact(tuple(out[len(s.results):])):
                raise ValueError(f"a region's non-tensor outputs came back as {tuple(out[len(s.results):])!r}, "
                                 f"returned as {extras!r}")
            return tuple(out[:len(s.results)])
        return spelled, call, read

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

    def stack(self, xs: list):
        """Per-iteration values stacked on a new leading axis."""
        raise NotImplementedError

    def stop_gradient(self, x):
        raise NotImplementedError

    def index(self, x, k: int):
        return x[k]

    def scan(self, s: "Scan", path: str, args: list) -> list:
        """A scan as a Python loop (default: what PyTorch runs, and what a recording evaluation
        runs, recording `<id>@<k>` for iteration k)."""
        init, xs, consts = s.split_args()
        n_c, n_x = len(init), len(xs)
        if s.spelling == "while_loop":   # no gradient flows into a while_loop
            args = [self.stop_gradient(a) for a in args]
        carry, seqs, env0 = args[:n_c], args[n_c:n_c + n_x], dict(zip(consts, args[n_c + n_x:]))
        outer, ys = self.record, []
        try:
            for k in range(s.length):
                env = dict(env0)
                env.update(zip(s.carry, carry))
                env.update(zip(s.xs, [self.index(x, k) for x in seqs]))
                if outer is not None:
                    self.record = {i: env[i] for i in s.carry + s.xs}
                env = self.body(s.body, env, None, path + ".body")
                if outer is not None:
                    outer.update({f"{i}{ITER_SEP}{k}": v for i, v in self.record.items()})
                carry = [env[c] for c in s.carry_out]
                ys.append([env[y] for y in s.ys])
        finally:   # (only where it was changed: an attribute set inside a traced region is a side effect torch
            # 2.6's export refuses, "Mutating a variable not in the current scope")
            if outer is not None:
                self.record = outer
        return list(carry) + [self.stack([y[j] for y in ys]) for j in range(len(s.ys))]

    def fused(self, body, i: int, env: dict, nondiff, path: str) -> int:
        """How many statements from body[i] on this interpreter ran at once (0: none; PyTorch's
        checkpoint_sequential spelling)."""
        return 0

    def body(self, body, env: dict, nondiff=None, path="body"):
        i = 0
        while i < len(body):
            ran = self.fused(body, i, env, nondiff, path)
            if ran:
                i += ran
                continue
            s, p = body[i], f"{path}[{i}]"
            i += 1
            if isinstance(s, Op):
                env[s.out] = self.op(s, [env[a] for a in s.args], nondiff)
                if self.record is not None:
                    self.record[s.out] = env[s.out]
            elif isinstance(s, Checkpoint):
                env.update(zip(s.results, self.region(s, p)(*[env[a] for a in s.args])))
            elif isinstance(s, CustomJVP):
                env.update(zip(s.results, self.jvp_block(s, p, [env[a] for a in s.args])))
            elif isinstance(s, Scan):
                env.update(zip(s.results, self.scan(s, p, [env[a] for a in s.args])))
                if self.record is not None:
                    self.record.update((r, env[r]) for r in s.results)
            elif isinstance(s, Jit):
                env.update(zip(s.results, self.jit(s, p)(*[env[a] for a in s.args])))
            elif isinstance(s, Cond):
                env.update(zip(s.results, self.cond(s, p, [env[a] for a in s.args])))
                if self.record is not None:
                    self.record.update((r, env[r]) for r in s.results)
            else:
                outs = self.block(s, p, [env[a] for a in s.args])
                env.update(zip(s.results, self.non_differentiable(s, outs)))
        return env

    def non_differentiable(self, s: CustomVJP, outs: list) -> list:
        """A block's results, those it marks non-differentiable under stop_gradient (PyTorch's
        Function marks them itself)."""
        if not s.non_differentiable:
            return outs
        return [self.stop_gradient(o) if r in s.non_differentiable else o for r, o in zip(s.results, outs)]
