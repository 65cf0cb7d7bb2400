"""JAX pipelines: the float64 no-remat reference, the same-dtype no-remat baseline, and
jax.checkpoint under remat2 / remat3 / remat3+custom_vjp3, eager and jit.

Only this module (and the repro emitter) imports jax. x64 is on in every JAX process;
every dtype in a program is explicit.
"""
from __future__ import annotations

import copy
import functools
import os
import re
import sys
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("JAX_ENABLE_X64", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402

try:
    from jax.ad_checkpoint import checkpoint_name_fwd  # noqa: E402
except ImportError:   # jax < 0.11 (a matrix cell): oracles/expectations.json declares names_fwd unsupported there
    checkpoint_name_fwd = None

from conformance.ir.batching import record_examples  # noqa: E402
from conformance.ir.interpreter import Interpreter, loss_outputs, output_cotangents  # noqa: E402
from conformance.ir.nodes import Checkpoint, Cond, CustomJVP, CustomVJP, Jit, Op, Scan, primal_ops
from conformance.ir.observation import CustomRuleLog, Observation, ReportedResidual  # noqa: E402
from conformance.ir.ops import CAST_OP, EFFECT_OP, dropout_mask  # noqa: E402
from conformance.ir.program import Program  # noqa: E402
from conformance.ir.residuals import canonicalise  # noqa: E402
from conformance.pipelines import registry  # noqa: E402
from conformance.pipelines.base import Pipeline, error_info, timed  # noqa: E402
from conformance.pipelines.jax import eager_cache, prelude, xla_cache
from conformance.pipelines.jax import table as jax_table  # noqa: E402
from conformance.pipelines.tables import compile_table, helpers, unlowered  # noqa: E402

jax.config.update("jax_enable_x64", True)
# JAX's internal frames kept in tracebacks (the messages are the same): a bare AssertionError is told apart by the
# frame that raised it (pipelines.base.raise_site)
jax.config.update("jax_traceback_filtering", "off")


def _cpu_devices():
    """Several CPU devices where the run asks (registry.CPU_DEVICES_ENV, set before JAX starts), for shard_map."""
    want = int(os.environ.get(registry.CPU_DEVICES_ENV, "0") or 0)
    if want > 1:
        try:
            jax.config.update("jax_num_cpu_devices", want)
        except Exception:   # the backend already started (an in-process caller): the pipeline says so  # noqa: BLE001
            pass


_cpu_devices()

# The XLA compile cache (conformance.pipelines.jax.xla_cache): the machine's, kept between campaigns.
# Pipelines that differ only in JAX flags (remat2, remat3, custom_vjp3) compile the same HLO for the
# same primitive or program; jax_remat3 is part of the in-memory jit key, so each flag setting would
# compile it again, where the disk cache compiles it once, and a campaign finds what earlier ones
# compiled (`run --framework-defaults` turns it off).
_CACHE_DIR = xla_cache.cache_dir()
if _CACHE_DIR and hasattr(jax.config, "jax_compilation_cache_dir"):   # (jax 0.4.23 onwards)
    os.makedirs(_CACHE_DIR, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", _CACHE_DIR)
    # (the last two came with jax 0.4.26 and 0.4.30: an older release keeps its own thresholds and no LRU)
    for _k, _v in (("jax_persistent_cache_min_compile_time_secs", 0), ("jax_persistent_cache_min_entry_size_bytes", 0),
                   ("jax_compilation_cache_max_size", -1)):   # -1: no LRU eviction: xla_cache.trim bounds it
        if hasattr(jax.config, _k):
            jax.config.update(_k, _v)


# Eager primitives compiled once for every remat flag setting (eager_cache; off in the matrix's
# framework-defaults cell).
eager_cache.share()

# XLA's backend code generation without LLVM's optimisation passes (JAX's own jax_disable_most_optimizations:
# backend optimisation level 0, LLVM's expensive passes off). Every HLO pass still runs, so what XLA does with a
# region (its optimization barriers, CSE, its own rematerialization) is unchanged; compiling a program's eager
# primitives and jits takes about a fifth less, and campaigns mostly compile. Every pipeline of a process runs
# under it alike; repro scripts and the framework-defaults cell run XLA as configured.
if not eager_cache.framework_defaults() and "jax_disable_most_optimizations" in jax.config.values:
    jax.config.update("jax_disable_most_optimizations", True)

ALL_FLAGS = ("jax_remat3", "jax_custom_vjp3", "jax_custom_jvp3")


def flags_supported() -> dict[str, bool]:
    return {f: hasattr(jax.config, f) for f in ALL_FLAGS}


@contextmanager
def jax_flags(flags: dict[str, bool]):
    """Set JAX config flags for one run and restore them afterwards, whatever happens."""
    old = {k: getattr(jax.config, k) for k in flags}
    try:
        for k, v in flags.items():
            jax.config.update(k, v)
        yield
    finally:
        for k, v in old.items():
            jax.config.update(k, v)


# dt(name): the dtype a template's dtype name stands for (the repro's dt maps every dtype to
# float64 in its float64 runs; here Lowering.op gives a cast float64 itself in those)
NAMESPACE: dict = {"jax": jax, "jnp": jnp, "lax": jax.lax, "cp": jax.checkpoint_policies,
                   "checkpoint_name": checkpoint_name, "checkpoint_name_fwd": checkpoint_name_fwd,
                   "dt": lambda name: name}
NAMESPACE.update(helpers(prelude), dropout_mask=dropout_mask)   # what the templates call
OPS = compile_table(jax_table.OPS, NAMESPACE)


def jax_policy(p):
    """The JAX policy object for an IR policy, from the JAX table."""
    return eval(jax_table.policy_source(p), NAMESPACE)   # noqa: S307 - the harness's own table


class Lowering(Interpreter):
    """Interprets a program with jax.numpy.

    remat: apply checkpoint regions (else run their bodies inline).
    custom: use jax.custom_vjp for blocks (else run fwd inline: plain primal semantics).
    record: when a dict, every op's value is stored there (concrete evaluation only).
    """

    def __init__(self, prog: Program, remat: bool, custom: bool = True, record: dict | None = None,
                 cast_f64: bool = False):
        self.prog, self.remat, self.custom, self.record = prog, remat, custom, record
        self.cast_f64 = cast_f64
        self.logs: dict[str, CustomRuleLog] = {}

    def op(self, s: Op, args: list, nondiff):
        if s.op == EFFECT_OP:
            if self.record is not None:   # a recording reads values: its callback runs only in the pipelines' runs
                return args[0]
            prelude.EFFECT_SITE[0] = s.out   # (its callback counts its runs under this statement: prelude.effect)
        if self.cast_f64 and s.op == CAST_OP:   # the float64 evaluation keeps every value float64
            return OPS[s.op](args, {**s.params, "dtype": "float64"}, nondiff)
        return OPS[s.op](args, s.params, nondiff)

    def stack(self, xs):
        return jnp.stack(xs)

    def stop_gradient(self, x):
        return jax.lax.stop_gradient(x)

    def scan(self, s: Scan, path: str, args: list) -> list:
        """jax.lax.scan (a recording evaluation loops in Python, to keep each iteration's values)."""
        if self.record is not None:
            return super().scan(s, path, args)
        init, xs, consts = s.split_args()
        n_c, n_x = len(init), len(xs)
        env0 = dict(zip(consts, args[n_c + n_x:]))

        if s.spelling == "while_loop":   # no gradient flows into a while_loop
            env0 = {k: jax.lax.stop_gradient(v) for k, v in env0.items()}

        def step(carry, x):
            env = dict(env0)
            env.update(zip(s.carry, carry))
            env.update(zip(s.xs, x))
            env = self.body(s.body, env, None, path + ".body")
            return tuple(env[c] for c in s.carry_out), tuple(env[y] for y in s.ys)
        init, xs = tuple(args[:n_c]), tuple(args[n_c:n_c + n_x])
        if s.spelling == "fori_loop":
            return list(jax.lax.fori_loop(0, s.length, lambda i, c: step(c, ())[0], init, unroll=s.unroll))
        if s.spelling == "while_loop":
            init = tuple(jax.lax.stop_gradient(a) for a in init)
            return list(jax.lax.while_loop(lambda ic: ic[0] < s.length, lambda ic: (ic[0] + 1, step(ic[1], ())[0]),
                                           (0, init))[1])
        if s.spelling == "vmap":
            return list(jax.vmap(lambda *x: step((), x)[1])(*xs))
        carry, ys = jax.lax.scan(step, init, xs, length=s.length, unroll=s.unroll)
        return list(carry) + list(ys)

    def branch(self, pred, n: int) -> int:
        return int(prelude.branch_index(pred, n))

    def cond(self, s: Cond, path: str, args: list) -> list:
        """lax.cond (two branches) or lax.switch (a recording evaluation branches in Python, or under jax.jit
        records every branch: `_recorded_switch`)."""
        if self.record is not None:
            if isinstance(args[0], jax.core.Tracer):
                return self._recorded_switch(s, path, args)
            return super().cond(s, path, args)

        def fn(k):
            def branch(*ops):
                e = self.body(s.branches[k], dict(zip(s.args[1:], ops)), None, f"{path}.branches[{k}]")
                return tuple(e[r] for r in s.branch_results[k])
            return branch
        index = prelude.branch_index(args[0], len(s.branches))
        if len(s.branches) == 2:
            return list(jax.lax.cond(index == 1, fn(1), fn(0), *args[1:]))
        return list(jax.lax.switch(index, [fn(k) for k in range(len(s.branches))], *args[1:]))

    def _recorded_switch(self, s: Cond, path: str, args: list) -> list:
        """A recording cond under jax.jit, on a traced predicate: lax.switch over branches that each return their
        results and every branch's recorded values (zeros where another branch's), each value with a flag saying
        it was recorded on the branch taken (`VALID` + id; `taken_values` keeps those values and drops the flags)."""
        outer, n = self.record, len(s.branches)

        def run(k, ops):
            self.record = {}
            try:
                e = self.body(s.branches[k], dict(zip(s.args[1:], ops)), None, f"{path}.branches[{k}]")
                return tuple(e[r] for r in s.branch_results[k]), self.record
            finally:
                self.record = outer
        recorded = [jax.eval_shape(lambda *ops, k=k: run(k, ops)[1], *args[1:]) for k in range(n)]
        ids = [[i for i in rec if not i.startswith(VALID)] for rec in recorded]

        def branch(k):
            def fn(*ops):
                res, rec = run(k, ops)
                values, valid = {}, {}
                for j in range(n):
                    for i in ids[j]:
                        values[i] = rec[i] if j == k else jnp.zeros(recorded[j][i].shape, recorded[j][i].dtype)
                        valid[i] = jnp.asarray(rec.get(VALID + i, True)) if j == k else jnp.asarray(False)
                return res, values, valid
            return fn
        index = prelude.branch_index(args[0], n)
        res, values, valid = jax.lax.switch(index, [branch(k) for k in range(n)], *args[1:])
        outer.update(values)
        outer.update((VALID + i, v) for i, v in valid.items())
        return list(res)

    def jit(self, s: Jit, path: str):
        """jax.jit of the sub-function (a recording evaluation runs it inline)."""
        fn = self.region_fn(s, path)
        return fn if self.record is not None else jax.jit(fn)

    def region(self, s: Checkpoint, path: str):
        fn = self.region_fn(s, path)
        if s.state != "none":
            return self.stateful_region(s, fn)
        if not self.remat:
            return fn
        spelled, call, read = self.spelled_region(s, fn)
        ck = self.checkpointed(s, spelled)
        return lambda *args: read(call(ck, args))

    @staticmethod
    def checkpointed(s: Checkpoint, f):
        """jax.checkpoint of a region's function with the region's policy and options."""
        return jax.checkpoint(f, policy=jax_policy(s.policy), **jax_table.checkpoint_options(s))

    def stateful_region(self, s: Checkpoint, fn):
        """A region closing over a scalar jax.new_ref made before it (Checkpoint.state), with or
        without checkpoint; the ref's value read after it."""
        dtype = "float64" if self.cast_f64 else self.prog.types()[s.results[0]][1]

        def run(*args):
            ref = jax.new_ref(jnp.zeros((), dtype))
            f = prelude.with_state(s.state, ref)(fn)
            if self.remat:
                f = self.checkpointed(s, f)
            return prelude.read_state(f(*args), ref)
        return run

    def block(self, s: CustomVJP, path: str, args: list) -> list:
        if not self.custom:
            return self.inline(s, path, args)
        if s.tree != "flat":   # one tuple or dict in, one out
            return list(from_tree(s, s.results, self.custom_vjp(s, path)(*s.nondiff, as_tree(s, s.args, args))))
        return self.custom_vjp(s, path)(*s.nondiff, *args)

    def jvp_block(self, s: CustomJVP, path: str, args: list) -> list:
        if not self.custom:
            outs = super().jvp_block(s, path, args)
            if self.record is not None:
                self._record_rule_factors(s, path, args)
            return outs
        if s.tree != "flat":
            return list(from_tree(s, s.results, self.custom_jvp(s, path)(as_tree(s, s.args, args))))
        return self.custom_jvp(s, path)(*args)

    def _record_rule_factors(self, s: CustomJVP, path: str, args: list) -> None:
        """Record the values of a custom_jvp rule's statements that need no tangent (step(x) in relu's rule): what
        linearizing the rule may save, which can equal a region value (the residual oracles then see both)."""
        env = self.body(s.body, dict(zip(s.args, args)), None, path + ".body")
        known, free = set(env), []
        for st in s.jvp:
            if isinstance(st, Op) and all(a in known for a in st.args):
                free.append(st)
                known.add(st.out)
        self.body(free, env, None, path + ".jvp")

    def custom_jvp(self, s: CustomJVP, path: str):
        """jax.custom_jvp: the primal body, and a rule that runs it again and then the tangent
        statements. Its log counts primal runs (primal_traces) and rule runs (fwd_traces)."""
        log = self.logs.setdefault(path, CustomRuleLog())

        def primal(*args):
            log.primal_traces += 1
            e = self.body(s.body, dict(zip(s.args, args)), None, path + ".body")
            return tuple(e[r] for r in s.results)

        def rule(primals, tangents):
            log.fwd_traces += 1
            e = self.body(s.body, dict(zip(s.args, primals)), None, path + ".body")
            outs = tuple(e[r] for r in s.results)
            e.update(zip(s.tangents, tangents))
            e = self.body(s.jvp, e, None, path + ".jvp")
            return outs, tuple(e[t] for t in s.jvp_results)

        if s.tree != "flat":   # the function takes one tuple or dict, and returns one
            primal, rule = _tree_jvp(s, primal, rule)
        f = jax.custom_jvp(primal)
        f.defjvp(rule)
        return f

    def custom_vjp(self, s: CustomVJP, path: str):
        nnd = len(s.nondiff)
        log = self.logs.setdefault(path, CustomRuleLog())
        tree = s.residual_tree
        pack = lambda res: prelude.pack_residuals(tree, res)          # noqa: E731
        unpack = lambda res: prelude.unpack_residuals(tree, res)      # noqa: E731

        def run_fwd(nondiff, arrs):
            e = self.body(s.fwd, dict(zip(s.args, arrs)), nondiff, path + ".fwd")
            return e

        def primal(*args):
            log.primal_traces += 1
            e = run_fwd(args[:nnd], args[nnd:])
            return tuple(e[r] for r in s.results)

        def fwd(*args):
            log.fwd_traces += 1
            arrs = list(args[nnd:])
            if s.symbolic_zeros:
                flags = [bool(a.perturbed) for a in arrs]
                if flags not in log.perturbed:
                    log.perturbed.append(flags)
                arrs = [a.value for a in arrs]
            e = run_fwd(args[:nnd], arrs)
            res = pack(tuple(e[r] for r in s.residuals))
            if s.perturbed_branch:   # the perturbed args, as the residual pytree's structure
                res = prelude.mark_perturbed(res, flags)
            return tuple(e[r] for r in s.results), res

        def bwd(*args):
            log.bwd_calls += 1
            nondiff, res, cts = args[:nnd], args[nnd], args[nnd + 1]
            types = {k: (shp, "float64" if self.cast_f64 else dt) for k, (shp, dt) in self.prog.types().items()}
            cts = list(cts)
            if s.symbolic_zeros:
                zs = [isinstance(c, jax.custom_derivatives.SymbolicZero) for c in cts]
                if zs not in log.symbolic_zero_cts:
                    log.symbolic_zero_cts.append(zs)
                cts = [jnp.zeros(types[r][0], types[r][1]) if z else c for c, z, r in zip(cts, zs, s.results)]
            keep = None
            if s.perturbed_branch:
                res, keep = prelude.read_perturbed(res, len(s.args))
            e = dict(zip(s.residuals, unpack(res)))
            e.update(zip(s.cts, cts))
            e = self.body(s.bwd, e, nondiff, path + ".bwd")
            outs = []
            for r, a in zip(s.bwd_results, s.args):
                shp, dt = types[a]
                # a zero cotangent is None, as users write it; custom_gradient's vjp returns arrays
                outs.append(e[r] if r is not None else None if s.spelling in NONE_ZEROS else jnp.zeros(shp, dt))
            if s.bwd_branch and outs[0] is not None:   # (PyTorch: a Python if on the cotangent's sum)
                outs[0] = jnp.where(jnp.sum(cts[0]) < 0, outs[0] * 2, outs[0])
            if keep is not None:   # the branch: nothing for an arg fwd saw unperturbed
                outs = [o if k else None for o, k in zip(outs, keep)]
            return tuple(outs)

        run_spelled = run_fwd   # the fwd statements on the args as the rule takes them
        if s.tree != "flat":   # fwd and primal take one tuple or dict; bwd returns one
            primal, fwd, bwd, run_spelled = _tree_vjp(s, primal, fwd, bwd, run_fwd)

        def outs_of(e):  # the results, as the rule returns them
            return (
                tuple(e[r] for r in s.results) if s.tree == "flat" else as_tree(s, s.results, [e[r] for r in s.results])
            )

        spelling = s.spelling
        if not self.remat and spelling in REMAT_SPELLINGS:
            # outside jax.remat a rematerialisation rule defines the same VJP as running rem
            # right after fwd (custom_vjp.defremat's docstring): no-remat references use that
            spelling = REMAT_SPELLINGS[spelling]
        if spelling == "custom_gradient":
            def spelled(*args):
                as_primal = _called_as_primal()
                outs, res = fwd(*args)
                if as_primal:
                    log.fwd_traces, log.primal_traces = log.fwd_traces - 1, log.primal_traces + 1
                return outs, lambda g: bwd(res, g)
            return jax.custom_gradient(spelled)   # (residual_tree is "tuple" here)
        if spelling == "custom_gradient_remat":
            def spelled(*args):
                if _called_as_primal():
                    log.primal_traces += 1
                else:
                    log.fwd_traces += 1
                e = run_spelled((), args)

                def rem(*args2):
                    log.rem_traces += 1
                    e2 = run_spelled((), args2)
                    res = pack(tuple(e2[r] for r in s.residuals))
                    return outs_of(e2), lambda g: bwd(res, g)
                return outs_of(e), rem
            return jax.custom_gradient(spelled, remat=True)
        if spelling == "defremat":
            def fwd_nothing(*args):   # saves nothing: rem recomputes the residuals from the args
                log.fwd_traces += 1
                e = run_spelled((), args)
                return outs_of(e), ()

            def rem(_, *args):
                log.rem_traces += 1
                e = run_spelled((), args)
                return outs_of(e), pack(tuple(e[r] for r in s.residuals))
            f = jax.custom_vjp(primal)
            f.defremat(fwd_nothing, rem, bwd)
            return f
        f = jax.custom_vjp(primal, nondiff_argnums=tuple(range(nnd)))
        kw = {}
        if s.symbolic_zeros:
            kw["symbolic_zeros"] = True
        if s.optimize_remat:
            kw["optimize_remat"] = True
        f.defvjp(fwd, bwd, **kw)
        return f


def as_tree(s, keys, vals):
    return prelude.as_tree(s.tree, keys, vals)


def from_tree(s, keys, t):
    return prelude.from_tree(s.tree, keys, t)


def _tree_vjp(s: CustomVJP, primal, fwd, bwd, run_fwd):
    """A custom_vjp's positional rules as rules of one pytree (the prelude's tree_rules); fwd
    statements run on the args of one pytree."""
    def run_fwd_t(nondiff, arrs):
        return run_fwd(nondiff, from_tree(s, s.args, arrs[0]))
    return (*prelude.tree_rules(s.tree, s.args, s.results, len(s.nondiff), primal, fwd, bwd), run_fwd_t)


def _tree_jvp(s: CustomJVP, primal, rule):
    return prelude.tree_jvp(s.tree, s.args, s.results, primal, rule)


def _called_as_primal() -> bool:
    """Whether jax.custom_gradient called the user's function as its primal function (`wrapped_fun`, the custom_vjp
    it defines, in every release since 0.4) rather than as its fwd rule: one function runs as both, and each run is
    counted as what it ran for (a primal trace, a fwd trace), as a custom_vjp's two functions are."""
    return sys._getframe(2).f_code.co_name == "wrapped_fun"


# Spellings whose bwd rule says a zero cotangent with None.
NONE_ZEROS = ("defvjp", "defremat")
# A spelling with a rematerialisation rule -> the spelling of the same VJP outside jax.remat.
REMAT_SPELLINGS = {"defremat": "defvjp", "custom_gradient_remat": "custom_gradient"}


def _tolist(x) -> Any:
    return np.asarray(x).astype(np.float64).tolist()


def _device(device: str):
    kind = {"cpu": "cpu", "cuda": "gpu"}[device]
    return jax.devices(kind)[0]


class JaxBase(Pipeline):
    """A JAX pipeline; its registry entry (spec) says remat, f64, jit and the remat variant."""

    def versions(self) -> dict[str, str]:
        import jaxlib
        return {"jax": jax.__version__, "jaxlib": jaxlib.__version__, "numpy": np.__version__}

    def devices(self) -> list[str]:
        out = ["cpu"]
        try:
            if jax.devices("gpu"):
                out.append("cuda")
        except RuntimeError:
            pass
        return out

    def namespace(self) -> dict:
        return {"jax": jax, "lax": jax.lax, "jnp": jnp}

    def flags(self) -> dict[str, bool]:
        sup = flags_supported()
        return {k: v for k, v in self.spec.flags.items() if sup[k]}

    # ---------------------------------------------------------------------------
    def run(self, program: Program, inputs: dict[str, np.ndarray], device: str = "cpu") -> Observation:
        obs = Observation(pipeline=self.name, device=device, versions=self.versions(), flags=self.flags())
        ok, why = self.available()
        missing = unlowered(program, jax_table.OPS)
        if not ok or missing:
            obs.unsupported = why or f"no JAX lowering for ops {missing}"
            return obs
        if (self.spec.shard_map or self.spec.sharded) and len(jax.devices("cpu")) < registry.SHARD_MAP_DEVICES:
            n = registry.SHARD_MAP_DEVICES
            what = "shard_map" if self.spec.shard_map else "sharding"
            obs.unsupported = (f"{what} needs {n} CPU devices, this process has {len(jax.devices('cpu'))}: set "
                               f"{registry.CPU_DEVICES_ENV}={n} before JAX starts (a campaign naming it does)")
            return obs
        lacks = self.cannot_express(program)
        if lacks:
            obs.unsupported = lacks
            return obs
        with jax_flags(self.flags()), jax.default_device(_device(device)):
            self._run(program, inputs, obs)
        xla_cache.ran(_CACHE_DIR)
        return obs

    def _arrays(self, program: Program, inputs):
        out = {}
        for i in program.inputs:
            dt = "float64" if self.spec.f64 else i.dtype
            out[i.id] = _array(inputs[i.id], dt)
        return out

    def _run(self, program: Program, inputs, obs: Observation):
        t = obs.timings
        self._inputs = inputs
        arrays = self._arrays(program, inputs)
        diff_ids = [i.id for i in program.inputs if i.diff]
        const = {i.id: arrays[i.id] for i in program.inputs if not i.diff}
        low = Lowering(program, remat=self.spec.remat, cast_f64=self.spec.f64)

        loss_fn, value_and_grad, hvp_fn = _differentiated(low, const, diff_ids, program, self._wrap())

        def fwd(*d):
            loss, vjp_fn, outs = jax.vjp(loss_fn, *d, has_aux=True)
            return loss, outs, vjp_fn

        def bwd(vjp_fn):
            return vjp_fn(jnp.ones((), jnp.float64))

        d = [self._placed(arrays[i]) for i in diff_ids]
        stage = "lowering"
        prelude.EFFECT_RUNS.clear()
        prelude.EFFECT_SITES.clear()
        try:
            if self.traced():
                # One compile: forward and backward in one jitted function (as jax.jit(jax.grad(f))
                # is used), its outputs also carrying the pullback's residual leaves and what the
                # pipeline records beside them (`_recording`).
                rec, recorded_env = self._recording(program, arrays, diff_ids) or (None, {})

                def fwd_bwd(recorded_env, *d):
                    recorded = rec(recorded_env, d) if rec is not None else None
                    loss, outs, vjp_fn = fwd(*d)
                    if value_and_grad is not None:
                        (loss, outs), grads = value_and_grad(*d)
                    else:
                        grads = bwd(vjp_fn)
                    return loss, outs, _ref_values(vjp_fn), grads, recorded
                with timed(t, "lowering"):
                    logs = copy.deepcopy(low.logs)
                    try:
                        compiled = jax.jit(fwd_bwd).lower(recorded_env, *d).compile()
                    except Exception:  # noqa: BLE001 - without the recording, the run's own error (if any)
                        if rec is None:
                            raise
                        rec, recorded_env, low.logs = None, {}, logs
                        compiled = jax.jit(fwd_bwd).lower(recorded_env, *d).compile()
                stage = "forward"
                with timed(t, "forward"):
                    loss, outs, vjp_fn, grads, recorded = compiled(recorded_env, *d)
                    jax.block_until_ready(grads)
                if recorded is not None:
                    self._recorded(program, recorded)
            else:
                stage = "forward"
                with timed(t, "forward"):
                    loss, outs, vjp_fn = fwd(*d)
                stage = "backward"
                with timed(t, "backward"):
                    if value_and_grad is not None:
                        (loss, outs), grads = value_and_grad(*d)
                    else:
                        grads = bwd(vjp_fn)
                    jax.block_until_ready(grads)
            obs.loss = float(loss)
            obs.outputs = [_tolist(o) for o in outs]
            obs.grads = {i: _tolist(g) for i, g in zip(diff_ids, grads)}
            kinds = _effect_kinds(program)
            if kinds:   # the runs of forward and backward only (0: none ran)
                jax.effects_barrier()
                obs.effects = {k: prelude.EFFECT_RUNS.get(k, 0) for k in kinds}
                obs.effect_sites = {i: prelude.EFFECT_SITES.get(i, 0) for i in _effect_sites(program)}
            if not self.spec.f64:
                with timed(t, "residuals"):
                    leaves = [x for x in jax.tree.leaves(_ref_values(vjp_fn)) if hasattr(x, "shape")]
                    obs.residuals = self._canonical(program, leaves)
                    if self.spec.residual_report:
                        obs.saved_arrays = [(int(np.size(x)), str(x.dtype)) for x in leaves]
            if self.spec.residual_report:
                with timed(t, "residual_report"):
                    self._report(program, const, diff_ids, d, obs)
            if program.diff.order == 2:
                stage = "second_order"

                g2 = hvp_fn
                if self.traced():
                    g2 = jax.jit(g2)
                with timed(t, "second_order"):
                    grads2 = g2(*d)
                    jax.block_until_ready(grads2)
                obs.grads2 = {i: _tolist(g) for i, g in zip(diff_ids, grads2)}
        except Exception as e:  # the observation records it; oracles judge  # noqa: BLE001
            obs.error = error_info(e, stage)
        obs.custom_rules = {k: v for k, v in low.logs.items()}

    def _wrap(self):
        """How the program's function of (constants, *differentiated inputs) is placed: inside jax.shard_map over
        the CPU devices, everything replicated (shard_map pipelines), or as it is."""
        if not self.spec.shard_map:
            return None
        from jax.sharding import PartitionSpec
        mesh = _cpu_mesh()
        return lambda f: jax.shard_map(f, mesh=mesh, in_specs=PartitionSpec(), out_specs=PartitionSpec())

    def _placed(self, x):
        """An input as the pipeline places it: with a NamedSharding over the CPU devices (sharded pipelines: its
        leading axis split where it divides evenly, else replicated), or as it is."""
        if not self.spec.sharded:
            return x
        from jax.sharding import NamedSharding, PartitionSpec
        split = x.ndim >= 1 and x.shape[0] % registry.SHARD_MAP_DEVICES == 0
        return jax.device_put(x, NamedSharding(_cpu_mesh(), PartitionSpec("devices") if split else PartitionSpec()))

    def traced(self) -> bool:
        """Whether the run is one jax.jit of forward and backward (else eager)."""
        return self.spec.jit

    def _recording(self, program: Program, arrays: dict, diff_ids: list[str]):
        """What the traced run also computes in its one jit: (f(env, differentiated inputs), env) with env the
        further arguments f needs (None: nothing); f's outputs go to `_recorded`."""
        return None

    def _recorded(self, program: Program, recorded) -> None:
        pass

    def _report(self, program: Program, const, diff_ids, d, obs: Observation):
        """JAX's own residual report of the loss this run differentiates (traced afresh with its
        own lowering, so that the custom-rule logs stay this run's)."""
        loss_fn = _differentiated(Lowering(program, remat=self.spec.remat, cast_f64=self.spec.f64), const, diff_ids,
                                  program, self._wrap())[0]
        try:
            rows = saved_residuals(lambda *x: loss_fn(*x)[0], *d)
        except Exception as e:   # the diagnostic itself failed: the oracle judges it  # noqa: BLE001
            obs.residual_report_error = f"{type(e).__name__}: {str(e)[:2000]}"
            return
        obs.residual_report = [reported(aval, text) for aval, text in rows]

    def _canonical(self, program: Program, leaves):
        values = node_values(program, self._inputs)
        return canonicalise([np.asarray(x) for x in leaves], values, program.analysis().index,
                            memory=[_memory_kind(x) for x in leaves])


def _array(x, dtype):
    """An input as a JAX array of `dtype`, converted by NumPy and placed without a compile (jnp.asarray of an
    array compiles an identity per shape and dtype: an XLA compile that tests nothing)."""
    return jax.device_put(np.asarray(x, dtype=dtype))


def _loss_fn(low: Lowering, diff_ids: list[str], program: Program):
    """The scalar loss a run differentiates, of the constant inputs `c` and the differentiated
    ones (float64 sum of every output but the auxiliary ones, each times its seeded cotangent
    where the program says so), with all outputs as aux."""
    cts, n = output_cotangents(program), loss_outputs(program)

    def loss_fn(c, *d):
        outs = low.outputs(c, diff_ids, d)
        if cts is not None:
            return sum(jnp.sum(o * jnp.asarray(c, o.dtype)).astype(jnp.float64) for o, c in zip(outs, cts)), outs
        return sum(jnp.sum(o).astype(jnp.float64) for o in outs[:n]), outs
    return loss_fn


@functools.lru_cache(maxsize=None)
def _cpu_mesh():
    """The mesh of the shard_map and sharded pipelines: SHARD_MAP_DEVICES CPU devices on one Auto axis, made once."""
    return jax.make_mesh((registry.SHARD_MAP_DEVICES,), ("devices",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=jax.devices("cpu")[:registry.SHARD_MAP_DEVICES])


def _differentiated(low: Lowering, const: dict, diff_ids: list[str], program: Program, wrap=None):
    """(the loss with all outputs as aux, whose vjp gives the residuals; the per-example value_and_grad that gives
    the gradients of a per-example program, else None: the gradients are that vjp's pullback; H @ ones).

    Auxiliary outputs: the gradients are the pullback of that one vjp, which is what
    value_and_grad(has_aux=True), as a training step spells it, runs (jax/_src/api.py value_and_grad:
    `vjp(f_partial, *dyn_args, has_aux=has_aux)`, then the pullback of one): no second forward. Per-example
    programs: the loss is the sum of the examples' losses (jax.vmap over the batched inputs),
    and the gradients are per example, jax.vmap of value_and_grad (shared inputs broadcast). `wrap`, where
    given, wraps the function of (constants, *differentiated inputs) that computes the loss and outputs."""
    ex = _loss_fn(low, diff_ids, program)
    if wrap is not None:
        ex = wrap(ex)
    argn = tuple(range(1, len(diff_ids) + 1))
    mode = program.diff.mode
    if not program.diff.batch:
        loss_fn = functools.partial(ex, const)
        return loss_fn, None, lambda *d: prelude.hvp(mode, lambda *x: loss_fn(*x)[0], *d)
    batched = {i.id for i in program.inputs if i.batched}
    axes = ({k: 0 if k in batched else None for k in const}, *[0 if i in batched else None for i in diff_ids])

    def loss_fn(*d):   # the batch's loss; outputs per example
        losses, outs = jax.vmap(ex, in_axes=axes)(const, *d)
        return jnp.sum(losses), outs

    def per_example(*d):   # jax.vmap of value_and_grad: one gradient per example
        (losses, outs), grads = jax.vmap(jax.value_and_grad(ex, argnums=argn, has_aux=True), in_axes=axes)(const, *d)
        return (jnp.sum(losses), outs), grads

    def hvp_fn(*d):   # H @ ones per example
        return jax.vmap(lambda c, *x: prelude.hvp(mode, lambda *y: ex(c, *y)[0], *x), in_axes=axes)(const, *d)
    return loss_fn, per_example, hvp_fn


_NAMED = re.compile(r"^named '(.*)' from ")


def saved_residuals(f, *args):
    """JAX's residual report: (aval, text) per saved value (a private API; public from
    jax.ad_checkpoint.print_saved_residuals)."""
    from jax._src.ad_checkpoint import saved_residuals as report
    return report(f, *args)


def reported(aval, text: str) -> ReportedResidual:
    m = _NAMED.match(text)
    return ReportedResidual(shape=list(aval.shape), dtype=str(aval.dtype), source=text, name=m.group(1) if m else None)


def _memory_kind(x) -> str | None:
    try:
        return x.sharding.memory_kind
    except Exception:  # noqa: BLE001
        return None


_NODE_VALUES: dict = {}


def _ref_values(tree):
    """A pullback's residuals as a jitted function may return them: a mutable array reference the
    pullback closes over (a region's state) is read (its value is what the backward reads)."""
    ref = getattr(jax, "Ref", None)
    if ref is None:
        return tree
    return jax.tree.map(lambda x: x[...] if isinstance(x, ref) else x, tree, is_leaf=lambda x: isinstance(x, ref))


def node_values(program: Program, inputs: dict[str, np.ndarray], cast_f64: bool = False,
                traced: bool = False) -> dict[str, np.ndarray]:
    """Every primal value of the program, evaluated concretely without remat (`traced`: by one
    jax.jit of the recording evaluation, eagerly where that cannot trace). The pipelines of one
    program share it: the last program's values are kept (keyed by program, inputs and dtype); a traced
    ref:f64 run leaves both its float64 values and the program's own dtypes (JaxReference._recorded)."""
    key = _node_values_key(program, inputs, cast_f64, traced)
    hit = _NODE_VALUES.get(key)
    if hit is None:
        hit = _keep_node_values(key, _node_values(program, inputs, cast_f64, traced))
    return hit


def _node_values_key(program: Program, inputs: dict[str, np.ndarray], cast_f64: bool, traced: bool) -> tuple:
    return (program.content_hash(), cast_f64, traced,
            tuple((k, v.dtype.str, v.shape, np.asarray(v).tobytes()) for k, v in sorted(inputs.items())))


def _keep_node_values(key: tuple, values: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if len(_NODE_VALUES) >= 4:
        _NODE_VALUES.clear()
    _NODE_VALUES[key] = values
    return values


VALID = "\0taken:"   # a recording under jit: the flag of a value recorded in a cond's branch (taken or not)


def taken_values(rec: dict) -> dict[str, np.ndarray]:
    """A recording's values as NumPy arrays, those recorded in a branch not taken dropped with every flag."""
    out = {k: np.asarray(v) for k, v in rec.items() if not k.startswith(VALID)}
    for k, v in rec.items():
        if k.startswith(VALID) and not bool(v):
            out.pop(k[len(VALID):], None)
    return out


def _evaluate(program: Program, env: dict, cast_f64: bool) -> dict:
    """The recording evaluation: every value of the program (inputs included) from the inputs `env`."""
    rec = dict(env)
    Lowering(program, remat=False, custom=False, record=rec, cast_f64=cast_f64).body(program.body, dict(env))
    return rec


def _node_values(program: Program, inputs: dict[str, np.ndarray], cast_f64: bool,
                 traced: bool) -> dict[str, np.ndarray]:
    evaluate = functools.partial(_evaluate, program, cast_f64=cast_f64)

    def record(inputs):   # one example's values
        env = {i.id: _array(inputs[i.id], "float64" if cast_f64 else i.dtype) for i in program.inputs}
        rec = None
        if traced:
            try:
                rec = jax.jit(evaluate)(env)
            except Exception:  # a value-dependent branch (or anything else that cannot trace): eagerly  # noqa: BLE001
                rec = None
        return taken_values(rec if rec is not None else evaluate(env))
    return record_examples(program, inputs, record)


class JaxReference(JaxBase):
    """ref:f64: float64, no checkpoint at all, custom rules kept. Records every node's value.

    What it computes is a reference, not what is tested: it runs under jax.jit (one compile where
    eager dispatch compiles each op), its values recorded by one jitted evaluation too (eagerly
    where the program branches on a value: a recording cond takes its branch in Python). Eager
    under framework defaults (eager_cache.framework_defaults)."""

    def traced(self) -> bool:
        return registry.jitted(self.name)

    def _run(self, program, inputs, obs):
        super()._run(program, inputs, obs)
        if obs.error is None:
            obs.values = {k: v.tolist() for k, v in node_values(program, inputs, cast_f64=True,
                                                                 traced=self.traced()).items()}

    def _recording(self, program, arrays, diff_ids):
        """The node values, recorded in the jit of value and gradient (one compile, not two; a recording runs no
        callback of the program's effects: Lowering.op); apart (node_values) where that fails. Both
        recordings: float64 (this pipeline's values) and in the program's own dtypes (what the other JAX pipelines
        canonicalise their residuals against; the same recording on a float64 program), so that the first eager
        pipeline does not record them op by op (an XLA compile for each primitive a loop, branch or example
        runs on a shape of its own)."""
        own = None if _all_float64(program) else {i.id: _array(self._inputs[i.id], i.dtype) for i in program.inputs}

        def rec(env, d):
            f64 = record_examples(program, {**env["const"], **dict(zip(diff_ids, d))},
                                  lambda e: _evaluate(program, e, cast_f64=True))
            return {"f64": f64, "own": None if env["own"] is None else
                    record_examples(program, env["own"], lambda e: _evaluate(program, e, cast_f64=False))}
        return rec, {"const": {k: v for k, v in arrays.items() if k not in diff_ids}, "own": own}

    def _recorded(self, program, recorded):
        f64 = taken_values(recorded["f64"])
        _keep_node_values(_node_values_key(program, self._inputs, cast_f64=True, traced=True), f64)
        own = f64 if recorded["own"] is None else taken_values(recorded["own"])
        _keep_node_values(_node_values_key(program, self._inputs, cast_f64=False, traced=False), own)


def _effect_kinds(program: Program) -> list[str]:
    """The kinds of effect the program's statements have (features `effect:<kind>`), sorted."""
    return sorted(f.split(":", 1)[1] for f in program.features() if f.startswith("effect:"))


def _effect_sites(program: Program) -> list[str]:
    """The effect statements of the program's primal code (their outputs' ids), in order."""
    return [i for i, s in primal_ops(program).items() if s.op == EFFECT_OP]


def _all_float64(program: Program) -> bool:
    return all(dt == "float64" for _, dt in program.types().values())


class JaxNoRemat(JaxBase):
    """jax:none: the program's own dtypes, no checkpoint: the tight same-dtype baseline."""


class JaxRemat(JaxBase):
    """jax.checkpoint under one of the remat variants, eager or jit."""
