"""PyTorch lowering of the IR: the torch table compiled, the checkpoint_name analogue, the SAC
policy adapter, and the interpreter (regions as torch.utils.checkpoint with a SAC context,
custom_vjp blocks as torch.autograd.Function). Only the torch modules import torch.

- `name` ops are a custom identity op `rc::tag(x, name)` (a clone, with a fake and an
  autograd rule passing the gradient through); SAC policy_fns see the name as args[1].
- checkpoint regions are `torch.utils.checkpoint.checkpoint(..., use_reentrant=False,
  context_fn=partial(create_selective_checkpoint_contexts, policy_fn),
  respect_saved_tensors_hooks=True)`, nested as the program nests them; a region with no
  policy (kind `no_policy`) is plain `checkpoint(..., use_reentrant=False)`. `prevent_cse` has
  no PyTorch counterpart and is ignored.
- scans (and fori/while loops, vmaps) are Python loops over the body (what dynamo unrolls),
  their ys stacked; a while_loop's inputs detached; conds are Python `if`s on the predicate.
- custom_vjp blocks are `torch.autograd.Function`s (forward runs fwd, saves the residuals
  with `ctx.save_for_backward`, backward runs bwd); `symbolic_zeros` is
  `ctx.set_materialize_grads(False)`: a None cotangent is logged as a symbolic zero and
  treated as zeros. nondiff args are plain python floats. `optimize_remat` is JAX-only and
  ignored. Custom-rule logs are only written in eager execution (dynamo rejects side
  effects in a traced backward). perturbed flags (ctx.needs_input_grad) are logged, as in
  JAX, only for symbolic_zeros blocks with some perturbed arg.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

import numpy as np
import torch
import torch._dynamo  # noqa: F401  (graph_break)
from torch.utils.checkpoint import checkpoint

from conformance.ir.batching import record_examples
from conformance.ir.dtypes import DTYPES as FLOAT_DTYPES
from conformance.ir.dtypes import np_dtype
from conformance.ir.features import sequential_runs
from conformance.ir.interpreter import Interpreter
from conformance.ir.nodes import Checkpoint, CustomVJP, Op, walk
from conformance.ir.observation import CustomRuleLog
from conformance.ir.program import Program
from conformance.pipelines.tables import compile_table, helpers
from conformance.pipelines.torch import prelude
from conformance.pipelines.torch import table as torch_table

# Selective checkpointing's API (torch 2.5 onwards): None before it, where only the pipelines that take no policy run
# (the reentrant ones; conformance.ir.releases gates the rest)
CheckpointPolicy = getattr(torch.utils.checkpoint, "CheckpointPolicy", None)
create_selective_checkpoint_contexts = getattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts", None)

# Newer torch routes SAC's cached tensors through saved-tensor hooks when asked (residual capture
# sees them); older releases (2.13) take no such argument, and their SAC cache is out of the hooks' sight.
SAC_THROUGH_HOOKS = "respect_saved_tensors_hooks" in inspect.signature(checkpoint).parameters

DTYPES = {name: getattr(torch, name) for name in FLOAT_DTYPES}   # (conformance.ir.dtypes)


def tensor(a, dtype: str, device: str = "cpu") -> torch.Tensor:
    """A numpy array (or nested lists) as a torch tensor of a declared dtype (torch cannot read
    ml_dtypes.bfloat16 arrays: through float32, which holds every bfloat16 value exactly)."""
    a = np.asarray(a, dtype=np_dtype(dtype))
    if dtype == "bfloat16":
        return torch.as_tensor(a.astype(np.float32), device=device).to(torch.bfloat16)
    return torch.as_tensor(a, device=device)


def numpy_of(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array of its dtype (bfloat16: ml_dtypes.bfloat16)."""
    t = t.detach().cpu()
    if t.dtype == torch.bfloat16:
        return t.float().numpy().astype(np_dtype("bfloat16"))
    return t.numpy()


# ---- the checkpoint_name analogue ---------------------------------------------------------
@torch.library.custom_op("rc::tag", mutates_args=(), schema="(Tensor x, str name) -> Tensor")   # (torch 2.4 cannot
def tag(x: torch.Tensor, name: str) -> torch.Tensor:   # read this module's string annotations: the schema is given)
    return x.clone()


@tag.register_fake
def _tag_fake(x, name):
    return torch.empty_like(x)


tag.register_autograd(lambda ctx, g: (g, None), setup_context=lambda ctx, inputs, output: None)
TAG = torch.ops.rc.tag.default

A = torch.ops.aten
# dt(name): the torch dtype a template's dtype name stands for (the repro's dt also maps every
# dtype to float64 in its float64 run; PyTorch pipelines run in the program's dtypes)
def dt(name: str) -> torch.dtype:   # (a Python function: torch 2.6's export cannot trace dict.__getitem__)
    return DTYPES[name]


NAMESPACE: dict = {"torch": torch, "A": A, "tag": torch.ops.rc.tag, "CheckpointPolicy": CheckpointPolicy, "dt": dt}
NAMESPACE.update(helpers(prelude))   # what the templates call
OPS = compile_table(torch_table.OPS, NAMESPACE)
KINDS_OF: dict = eval(torch_table.kinds_of_source(), NAMESPACE)   # noqa: S307
TAG_PACKET = eval(torch_table.TAG_PACKET, NAMESPACE)   # noqa: S307


# How regions are checkpointed, beyond the policy (the pipeline registry's torch settings):
# use_reentrant=True (takes no policy: every region is recomputed whole); determinism_check="none",
# with debug=True where checkpoint accepts it (a region without a policy: debug=True raises
# ValueError beside a custom context_fn); a torch.compile backend for each region's function (None: eager);
# a graph break at the start of each region's function (under torch.compile); preserve_rng_state
# (False: a recompute draws new random numbers; test-only mutants).
CHECKPOINT_OPTIONS = {"reentrant": False, "checks_off": False, "compile_inside": None, "graph_break": False,
                      "preserve_rng_state": True, "materialize_grads": False, "policy_state": "", "sequential": False,
                      "respect_hooks": True, "func_vmap": False, "allow_mutation": False}
# (materialize_grads: symbolic_zeros rules get zero tensors instead of None; test-only mutants)
# policy_state: "" (one stateless policy_fn per region), "every_other" (sac_policy's stateful policy)
# sequential: regions without a policy chained on one value, then an op, run as checkpoint_sequential
# respect_hooks: respect_saved_tensors_hooks (False: SAC's cache bypasses the user's saved-tensor hooks)
# func_vmap: vmap-spelled loops as torch.func.vmap of the body (else a Python loop over the examples)
# allow_mutation: SAC contexts made with allow_cache_entry_mutation=True


def policy_fn(p, names: list[str], prefer: bool = False, calls: list | None = None, state: str | None = None):
    """The SAC policy_fn of a region with policy p, for a program with these checkpoint names."""
    return prelude.sac_policy(torch_table.region_decisions(p, names), KINDS_OF, TAG_PACKET, prefer, calls, state)


def context_fn(p, names: list[str], prefer: bool = False, calls: list | None = None, state: str | None = None,
               allow_mutation: bool = False, sac_log: list | None = None):
    """A region's SAC context_fn: one policy_fn for every call, or a stateful one made afresh for each
    checkpoint call (its state counts that call's policy calls); `allow_mutation`, SAC's
    allow_cache_entry_mutation (its check that a cached tensor was not mutated, off). With `sac_log` (eager
    runs), each checkpoint call's caching mode is logged beside what its policy asked (logged_contexts)."""
    kw = {"allow_cache_entry_mutation": True} if allow_mutation else {}
    if sac_log is not None:
        return lambda: logged_contexts(policy_fn(p, names, prefer, calls, state), sac_log, **kw)
    if state:
        return lambda: create_selective_checkpoint_contexts(policy_fn(p, names, prefer, calls, state), **kw)
    return functools.partial(create_selective_checkpoint_contexts, policy_fn(p, names, prefer, calls), **kw)


# What a policy asks SAC to keep for the backward: save, or (documented: "saved during the forward pass, offloaded to
# CPU, and reloaded") CPU offload, where this torch has it
SAVING = tuple(getattr(CheckpointPolicy, k) for k in ("MUST_SAVE", "PREFER_SAVE", "MUST_CPU_OFFLOAD",
                                                     "PREFER_CPU_OFFLOAD") if hasattr(CheckpointPolicy, k))
_SAC_RECOMPUTE = getattr(torch.utils.checkpoint, "_RECOMPUTE", None)   # SAC's mark of a call it recomputes
SAC_CACHE_READABLE = _SAC_RECOMPUTE is not None   # (a torch without it: what SAC recomputed is not observed)


def logged_contexts(fn, sac_log: list, **kw):
    """SAC's contexts for one checkpoint call, logged as (its caching mode, its recompute mode, [(op, the output
    of each call its policy asked to save, else None)]): what SAC cached is in the caching mode's storage, what
    its recompute ran in the other mode's call counts (unhonoured_saves)."""
    asked: list = []

    def logged(ctx, op, *args, **kwargs):
        d = fn(ctx, op, *args, **kwargs)
        asked.append((op, ctx.op_output if d in SAVING else None))
        return d
    caching, cached = create_selective_checkpoint_contexts(logged, **kw)
    sac_log.append((caching, cached, asked))
    return caching, cached


def unhonoured_saves(sac_log: list) -> list[tuple[str, Any]]:
    """(aten op, output) of every op call a policy asked SAC to save that SAC recomputed: its cache holds the
    call (the k-th of its op is its storage's k-th entry) as to recompute, and the backward's recompute reached
    it (ran that op more than k times). Read after the backward."""
    out = []
    for caching, cached, asked in sac_log if _SAC_RECOMPUTE is not None else []:
        seen: dict = {}
        store = getattr(caching, "storage", None)   # (another torch's layout: nothing read)
        ran = getattr(cached, "func_counter", None)
        for op, output in asked:
            k = seen[op] = seen.get(op, -1) + 1
            if output is None or not isinstance(store, dict) or not isinstance(ran, dict):
                continue
            calls = store.get(op)
            if isinstance(calls, dict) and calls.get(k) is _SAC_RECOMPUTE and ran.get(op, 0) > k:
                out.append((str(getattr(op, "overloadpacket", op)), output))
    sac_log.clear()
    return out


class Lowering(Interpreter):
    """Interprets a program with torch.

    remat: apply checkpoint regions (else run their bodies inline).
    custom: use torch.autograd.Function for blocks (else run fwd inline: primal semantics).
    prefer: PREFER_* instead of MUST_* in policy_fns.
    record: when a dict, every op's value is stored there.
    """
    NON_TENSOR_OUTPUTS = (None, 3, "tag")   # (a region with extras: PyTorch returns any Python value)

    def extras_intact(self, extras) -> bool:
        return tuple(extras) == self.NON_TENSOR_OUTPUTS

    def __init__(self, prog: Program, remat: bool, custom: bool = True, prefer: bool = False,
                 record: dict | None = None, policy_calls: list | None = None, diff_residuals: bool = False,
                 options: dict | None = None, sac_log: list | None = None):
        self.prog, self.remat, self.custom, self.prefer, self.record = prog, remat, custom, prefer, record
        # checkpoint options (CHECKPOINT_OPTIONS' keys): reentrant, checks_off, compile_inside
        self.options = {**CHECKPOINT_OPTIONS, **(options or {})}
        self._compiled_regions: dict[str, Any] = {}
        self._runs = sequential_runs(prog) if self.options["sequential"] else {}   # (checkpoint_sequential)
        self.diff_residuals = diff_residuals
        self.policy_calls = policy_calls
        self.logs: dict[str, CustomRuleLog] = {}
        self.types = prog.types()
        self._fns: dict[str, Any] = {}
        self._ctx_fns: dict[str, Any] = {}
        names = torch_table.program_names(prog)
        # Build autograd.Function classes and SAC context_fns before any tracing: dynamo
        # graph-breaks on type() and on context_fns that are closures created while tracing.
        for s, _, path, _ in walk(prog.body):
            if isinstance(s, CustomVJP) and custom:
                self.function(s, path)
            elif isinstance(s, Checkpoint) and remat and not self.options["reentrant"]:   # (reentrant: no policy)
                self._ctx_fns[path] = context_fn(s.policy, names, prefer, policy_calls, self.options["policy_state"],
                                                 self.options["allow_mutation"], sac_log)

    def op(self, s: Op, args: list, nondiff):
        return OPS[s.op](args, s.params, nondiff)

    def stack(self, xs):
        return torch.stack(xs)

    def stop_gradient(self, x):
        return x.detach()

    def fused(self, body, i: int, env: dict, nondiff, path: str) -> int:
        """(sequential) A run of top-level regions without a policy chained on one value, then an op
        reading the last one's result (features.sequential_runs), as checkpoint_sequential over one
        function per region and the op: every segment but the last (the op) checkpointed."""
        if not (self.options["sequential"] and self.remat and path == "body"):
            return 0
        end = self._runs.get(i)
        if end is None:
            return 0
        fns = [(lambda v, f=self.region_fn(r, f"{path}[{k}]"): f(v)[0]) for k, r in enumerate(body[i:end], i)]
        op = body[end]
        fns.append(lambda v: self.op(op, [v], nondiff))
        env[op.out] = torch.utils.checkpoint.checkpoint_sequential(fns, len(fns), env[body[i].args[0]],
                                                                   use_reentrant=False)
        return end - i + 1

    def non_differentiable(self, s: CustomVJP, outs: list) -> list:
        return outs if self.custom else super().non_differentiable(s, outs)   # (the Function marks them)

    def branch(self, pred, n: int) -> int:
        return prelude.branch_index(pred, n)

    def block(self, s: CustomVJP, path: str, args: list) -> list:
        if not self.custom:
            return self.inline(s, path, args)
        res = []
        if self.diff_residuals:
            # Residuals computed by ordinary, differentiated ops and passed in: under double
            # backward the bwd rule is then differentiated through them, as in JAX. (Tensors a
            # Function computes and saves itself are constants to double backward.)
            e = self.body(s.fwd, dict(zip(s.args, args)), s.nondiff, path + ".fwd")
            res = [e[r] for r in s.residuals]
        outs = self.function(s, path).apply(*s.nondiff, *args, *res)
        return outs if isinstance(outs, tuple) else (outs,)

    def region(self, s: Checkpoint, path: str):
        fn = self.region_fn(s, path)
        if not self.remat:
            return fn
        ctx_fn = self._ctx_fns.get(path)
        spelled, call, read = self.spelled_region(s, fn)   # a static flag is a plain Python argument
        opts = self.options
        if opts["graph_break"]:
            body_fn = spelled

            def spelled(*a, **k):
                torch._dynamo.graph_break()
                return body_fn(*a, **k)
        if opts["compile_inside"]:   # one compiled function per region, built on its first run
            if path not in self._compiled_regions:
                self._compiled_regions[path] = torch.compile(spelled, backend=opts["compile_inside"], dynamic=False)
            spelled = self._compiled_regions[path]
        rng = {} if opts["preserve_rng_state"] else {"preserve_rng_state": False}
        if opts["reentrant"]:   # the reentrant implementation takes no policy
            return lambda *args: read(call(lambda *a, **k: checkpoint(spelled, *a, use_reentrant=True, **rng, **k),
                                           args))
        kw = {"determinism_check": "none", **rng} if opts["checks_off"] else dict(rng)
        if s.policy.kind == "no_policy":   # no policy: checkpoint's own (non-selective) path
            kw.update({"debug": True} if opts["checks_off"] else {})   # (debug rejects a custom context_fn)
            return lambda *args: read(call(lambda *a, **k: checkpoint(spelled, *a, use_reentrant=False, **kw, **k),
                                           args))

        def ck(*a, **k):
            return checkpoint(spelled, *a, use_reentrant=False, context_fn=ctx_fn,
                              **({"respect_saved_tensors_hooks": opts["respect_hooks"]} if SAC_THROUGH_HOOKS else {}),
                              **kw, **k)
        return lambda *args: read(call(ck, args))

    def scan(self, s, path: str, args: list) -> list:
        """A vmap-spelled loop as torch.func.vmap of its body over the xs' leading axis (func_vmap),
        every other loop (and any loop while values are recorded) a Python loop."""
        if not (self.options["func_vmap"] and s.spelling == "vmap" and self.record is None):
            return super().scan(s, path, args)
        _, xs, consts = s.split_args()
        seqs, env0 = args[:len(xs)], dict(zip(consts, args[len(xs):]))

        def one(*slices):
            env = self.body(s.body, {**env0, **dict(zip(s.xs, slices))}, None, path + ".body")
            return tuple(env[y] for y in s.ys)
        return list(torch.func.vmap(one)(*seqs))

    def function(self, s: CustomVJP, path: str):
        if path in self._fns:
            return self._fns[path]
        nnd = len(s.nondiff)
        nargs = len(s.args)
        log = self.logs.setdefault(path, CustomRuleLog())
        low = self
        types = self.types

        def forward(ctx, *args):
            nondiff, arrs = args[:nnd], args[nnd:]
            if not torch.compiler.is_compiling():
                log.fwd_traces += 1
                flags = [bool(b) for b in ctx.needs_input_grad[nnd:nnd + nargs]]
                # JAX calls a custom_vjp fwd rule (and logs perturbed flags) only when some
                # arg is perturbed; torch always runs forward: log the same cases.
                if s.symbolic_zeros and any(flags):
                    if flags not in log.perturbed:
                        log.perturbed.append(flags)
            if s.symbolic_zeros and not low.options["materialize_grads"]:
                ctx.set_materialize_grads(False)
            if low.diff_residuals:
                arrs, res_in = arrs[:nargs], arrs[nargs:]
            e = low.body(s.fwd, dict(zip(s.args, arrs)), list(nondiff), path + ".fwd")
            ctx.save_for_backward(*(res_in if low.diff_residuals else [e[r] for r in s.residuals]))
            ctx.nondiff = list(nondiff)
            outs = tuple(e[r] for r in s.results)
            if s.non_differentiable:
                ctx.mark_non_differentiable(*[e[r] for r in s.non_differentiable])
            return outs if len(outs) > 1 else outs[0]

        def backward(ctx, *cts):
            res = ctx.saved_tensors
            cts = list(cts)
            dev = res[0].device if res else next((c.device for c in cts if c is not None), None)
            if s.symbolic_zeros:
                zs = [c is None for c in cts]
                if not torch.compiler.is_compiling():
                    log.bwd_calls += 1
                    if zs not in log.symbolic_zero_cts:
                        log.symbolic_zero_cts.append(zs)
                    kinds = ["none" if c is None else "value" if bool(torch.any(c != 0)) else "zero" for c in cts]
                    if kinds not in log.ct_kinds:
                        log.ct_kinds.append(kinds)
                cts = [torch.zeros(types[r][0], dtype=DTYPES[types[r][1]], device=dev) if c is None else c
                       for c, r in zip(cts, s.results)]
            elif not torch.compiler.is_compiling():
                log.bwd_calls += 1
            e = dict(zip(s.residuals, res))
            e.update(zip(s.cts, cts))
            e = low.body(s.bwd, e, ctx.nondiff, path + ".bwd")
            outs = []
            for r, a in zip(s.bwd_results, s.args):
                shp, dt = types[a]
                outs.append(torch.zeros(shp, dtype=DTYPES[dt], device=dev) if r is None else e[r])
            if s.bwd_branch and bool(torch.sum(cts[0]) < 0):   # a data-dependent Python branch
                outs[0] = outs[0] * 2
            extra = (None,) * len(s.residuals) if low.diff_residuals else ()
            return (None,) * nnd + tuple(outs) + extra

        if s.once_differentiable:
            backward = torch.autograd.function.once_differentiable(backward)
        cls = type(f"CustomVJP_{path.replace('[', '_').replace(']', '').replace('.', '_')}",
                   (torch.autograd.Function,),
                   {"forward": staticmethod(forward), "backward": staticmethod(backward)})
        self._fns[path] = cls
        return cls


def node_values(program: Program, inputs: dict[str, np.ndarray], device: str = "cpu") -> dict[str, np.ndarray]:
    """Every primal value of the program, evaluated by torch without checkpoint (program dtype)."""
    torch.manual_seed(0)   # random ops draw what the pipelines' runs draw (each seeds 0 first)

    def record(inputs):   # one example's values
        env = {i.id: tensor(inputs[i.id], i.dtype, device) for i in program.inputs}
        rec = dict(env)
        with torch.no_grad():
            Lowering(program, remat=False, custom=False, record=rec).body(program.body, env)
        return {k: numpy_of(v) for k, v in rec.items()}
    return record_examples(program, inputs, record)


