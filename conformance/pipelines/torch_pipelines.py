"""PyTorch pipelines: no-checkpoint baseline, eager selective activation checkpointing (SAC)
and SAC under torch.compile (aot_eager with the min-cut or the default partitioner, inductor),
each with MUST_* policies and a `:prefer` variant using PREFER_* hints.

Only this module (and the repro emitter) imports torch. Every dtype is explicit.

Lowering of the IR:
- `name` ops are a custom identity op `rc::tag(x, name)` (a clone, with a fake and an
  autograd rule passing the gradient through); SAC policy_fns see the name as args[1].
- checkpoint regions are `torch.utils.checkpoint.checkpoint(..., use_reentrant=False,
  context_fn=partial(create_selective_checkpoint_contexts, policy_fn),
  respect_saved_tensors_hooks=True)`, nested as the program nests them. `prevent_cse` has
  no PyTorch counterpart and is ignored.
- custom_vjp blocks are `torch.autograd.Function`s (forward runs fwd, saves the residuals
  with `ctx.save_for_backward`, backward runs bwd); `symbolic_zeros` is
  `ctx.set_materialize_grads(False)`: a None cotangent is logged as a symbolic zero and
  treated as zeros. nondiff args are plain python floats. `optimize_remat` is JAX-only and
  ignored. Custom-rule logs are only written in eager execution (dynamo rejects side
  effects in a traced backward); compiled runs log what ran eagerly (graph breaks).
  perturbed flags (ctx.needs_input_grad) are logged, as in JAX, only for symbolic_zeros
  blocks with some perturbed arg. For second order the residuals are computed by ordinary
  differentiated ops and passed into the Function, so double backward differentiates the
  bwd rule through them as JAX does (tensors a Function computes and saves itself are
  constants to double backward). Compiled pipelines declare second order unsupported.

Residuals: the tensors saved for backward during the forward *and read back by the
backward*, seen by `torch.autograd.graph.saved_tensors_hooks` (which also sees what a
compiled graph's CompiledFunction saves), deduplicated by memory (a view of a saved tensor
is the same residual), canonicalised against the program's node values evaluated by this
module without checkpoint in the program's dtype. Eager autograd has no dead-code
elimination, so tensors saved but never read are listed apart (`flags['saved_unread']`).
Compiled pipelines also record, at compile time, which forward-graph nodes the partitioner
chose to save (`flags['partitioner_saved']`), graph breaks and graph counts.

Offload policies map to CheckpointPolicy.{MUST,PREFER}_CPU_OFFLOAD (present in 2.14);
note that eager SAC recomputes such ops instead (only compile honours them).
"""
from __future__ import annotations

import functools
import os
from contextlib import contextmanager
from typing import Any

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                      os.path.join(os.path.expanduser("~"), ".cache", "remat-conformance", "inductor"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402
from torch._inductor.custom_graph_pass import CustomPartitionerFn  # noqa: E402
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts  # noqa: E402

from conformance.ir import Checkpoint, CustomVJP, Op, Program, node_index, walk  # noqa: E402
from conformance.observation import CustomRuleLog, ErrorInfo, Observation  # noqa: E402
from conformance.pipelines.base import Pipeline, timed  # noqa: E402
from conformance.residuals import canonicalise  # noqa: E402

DTYPES = {"float32": torch.float32, "float64": torch.float64}


# ---- the checkpoint_name analogue ---------------------------------------------------------
@torch.library.custom_op("rc::tag", mutates_args=())
def tag(x: torch.Tensor, name: str) -> torch.Tensor:
    return x.clone()


@tag.register_fake
def _tag_fake(x, name):
    return torch.empty_like(x)


tag.register_autograd(lambda ctx, g: (g, None), setup_context=lambda ctx, inputs, output: None)
TAG = torch.ops.rc.tag.default

# ---- policies -------------------------------------------------------------------------------
A = torch.ops.aten
DOTS = frozenset({A.mm, A.bmm, A.addmm, A.baddbmm, A.mv, A.dot})          # overload packets
DOTS_NO_BATCH = frozenset({A.mm, A.addmm, A.mv, A.dot})
# IR op kind -> aten overload packets (for the `ops` custom-predicate policy).
OP_ATEN: dict[str, frozenset] = {
    "sin": frozenset({A.sin}), "cos": frozenset({A.cos}), "tanh": frozenset({A.tanh}),
    "exp": frozenset({A.exp}), "sigmoid": frozenset({A.sigmoid}), "square": frozenset({A.pow, A.square}),
    "neg": frozenset({A.neg}), "scale": frozenset({A.mul}), "add": frozenset({A.add}),
    "sub": frozenset({A.sub}), "mul": frozenset({A.mul}), "matmul": DOTS,
    "sum": frozenset({A.sum}), "mean": frozenset({A.mean}), "transpose": frozenset({A.permute}),
    "reshape": frozenset({A.view, A._unsafe_view, A.reshape}), "broadcast": frozenset({A.expand}),
    "name": frozenset({torch.ops.rc.tag}),
}


def _packet(op):
    return getattr(op, "overloadpacket", op)


def torch_decide(p, op, args) -> str:
    """'save', 'offload' or 'recompute' for one OpOverload run inside a region under policy p."""
    k = p.kind
    pk = _packet(op)
    name = args[1] if op is TAG and len(args) > 1 else None
    if k == "everything":
        return "save"
    if k == "nothing":
        return "recompute"
    if k == "dots":
        return "save" if pk in DOTS else "recompute"
    if k == "dots_no_batch":
        return "save" if pk in DOTS_NO_BATCH else "recompute"
    if k == "offload_dots_no_batch":
        return "offload" if pk in DOTS_NO_BATCH else "recompute"
    if k == "save_only_names":
        return "save" if name is not None and name in p.names else "recompute"
    if k == "save_any_names_but_these":
        return "save" if name is not None and name not in p.names else "recompute"
    if k == "save_anything_except_names":
        return "recompute" if name is not None and name in p.names else "save"
    if k == "save_and_offload_names":
        if name is not None and name in p.saved:
            return "save"
        if name is not None and name in p.offloaded:
            return "offload"
        return "recompute"
    if k == "ops":
        return "save" if any(pk in OP_ATEN.get(o, ()) for o in p.ops) else "recompute"
    if k == "both":
        da, db = torch_decide(p.a, op, args), torch_decide(p.b, op, args)
        if "save" in (da, db):
            return "save"
        if "offload" in (da, db):
            return "offload"
        return "recompute"
    raise ValueError(f"unknown policy kind {k!r}")


def policy_fn(p, prefer: bool = False, calls: list | None = None):
    C = CheckpointPolicy
    table = ({"save": C.PREFER_SAVE, "recompute": C.PREFER_RECOMPUTE, "offload": C.PREFER_CPU_OFFLOAD}
             if prefer else
             {"save": C.MUST_SAVE, "recompute": C.MUST_RECOMPUTE, "offload": C.MUST_CPU_OFFLOAD})

    def fn(ctx, op, *args, **kwargs):
        d = torch_decide(p, op, args)
        if calls is not None and not torch.compiler.is_compiling():
            calls.append((str(op), bool(ctx.is_recompute), d))
        return table[d]
    return fn


# ---- ops --------------------------------------------------------------------------------------
def _op(s: Op, a: list, nondiff) -> torch.Tensor:
    o, p = s.op, s.params
    x = a[0]
    if o == "sin":
        return torch.sin(x)
    if o == "cos":
        return torch.cos(x)
    if o == "tanh":
        return torch.tanh(x)
    if o == "exp":
        return torch.exp(x)
    if o == "sigmoid":
        return torch.sigmoid(x)
    if o == "square":
        return torch.square(x)
    if o == "neg":
        return torch.neg(x)
    if o == "scale":
        return x * float(p["c"])
    if o == "nondiff_scale":
        return x * float(nondiff[p["index"]])
    if o == "add":
        return x + a[1]
    if o == "sub":
        return x - a[1]
    if o == "mul":
        return x * a[1]
    if o == "matmul":
        return torch.matmul(x, a[1])
    if o == "sum":
        return torch.sum(x) if p["axis"] is None else torch.sum(x, dim=p["axis"])
    if o == "mean":
        return torch.mean(x) if p["axis"] is None else torch.mean(x, dim=p["axis"])
    if o == "transpose":
        return torch.permute(x, p["perm"])
    if o == "reshape":
        return torch.reshape(x, p["shape"])
    if o == "broadcast":
        return torch.broadcast_to(x, p["shape"])
    if o == "name":
        return torch.ops.rc.tag(x, p["name"])
    raise ValueError(f"unknown op {o!r}")


class Lowering:
    """Interprets a program with torch.

    remat: apply checkpoint regions (else run their bodies inline).
    custom: use torch.autograd.Function for blocks (else run fwd inline: primal semantics).
    prefer: PREFER_* instead of MUST_* in policy_fns.
    record: when a dict, every op's value is stored there.
    """

    def __init__(self, prog: Program, remat: bool, custom: bool = True, prefer: bool = False,
                 record: dict | None = None, policy_calls: list | None = None, diff_residuals: bool = False):
        self.prog, self.remat, self.custom, self.prefer, self.record = prog, remat, custom, prefer, record
        self.diff_residuals = diff_residuals
        self.policy_calls = policy_calls
        self.logs: dict[str, CustomRuleLog] = {}
        self.types = prog.types()
        self._fns: dict[str, Any] = {}
        self._ctx_fns: dict[str, Any] = {}
        # Build autograd.Function classes and SAC context_fns before any tracing: dynamo
        # graph-breaks on type() and on context_fns that are closures created while tracing.
        for s, _, path, _ in walk(prog.body):
            if isinstance(s, CustomVJP) and custom:
                self.function(s, path)
            elif isinstance(s, Checkpoint) and remat:
                self._ctx_fns[path] = functools.partial(
                    create_selective_checkpoint_contexts, policy_fn(s.policy, prefer, policy_calls))

    def body(self, body, env: dict, nondiff=None, path="body"):
        for i, s in enumerate(body):
            p = f"{path}[{i}]"
            if isinstance(s, Op):
                env[s.out] = _op(s, [env[a] for a in s.args], nondiff)
                if self.record is not None:
                    self.record[s.out] = env[s.out]
            elif isinstance(s, Checkpoint):
                outs = self.region(s, p)(*[env[a] for a in s.args])
                env.update(zip(s.results, outs))
            elif isinstance(s, CustomVJP):
                if self.custom:
                    arrs = [env[a] for a in s.args]
                    res = []
                    if self.diff_residuals:
                        # Residuals computed by ordinary, differentiated ops and passed in:
                        # under double backward the bwd rule is then differentiated through
                        # them, as in JAX. (Tensors a Function computes and saves itself are
                        # constants to double backward.)
                        e = self.body(s.fwd, dict(zip(s.args, arrs)), s.nondiff, p + ".fwd")
                        res = [e[r] for r in s.residuals]
                    outs = self.function(s, p).apply(*s.nondiff, *arrs, *res)
                    if not isinstance(outs, tuple):
                        outs = (outs,)
                else:
                    e = dict(zip(s.args, [env[a] for a in s.args]))
                    self.body(s.fwd, e, s.nondiff, p + ".fwd")
                    outs = [e[r] for r in s.results]
                env.update(zip(s.results, outs))
        return env

    def region(self, s: Checkpoint, path: str):
        def fn(*args):
            e = self.body(s.body, dict(zip(s.args, args)), None, path + ".body")
            return tuple(e[r] for r in s.results)
        if not self.remat:
            return fn
        ctx_fn = self._ctx_fns[path]

        def ck(*args):
            return checkpoint(fn, *args, use_reentrant=False, context_fn=ctx_fn,
                              respect_saved_tensors_hooks=True)
        return ck

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
            if s.symbolic_zeros:
                ctx.set_materialize_grads(False)
            if low.diff_residuals:
                arrs, res_in = arrs[:nargs], arrs[nargs:]
            e = low.body(s.fwd, dict(zip(s.args, arrs)), list(nondiff), path + ".fwd")
            ctx.save_for_backward(*(res_in if low.diff_residuals else [e[r] for r in s.residuals]))
            ctx.nondiff = list(nondiff)
            outs = tuple(e[r] for r in s.results)
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
            extra = (None,) * len(s.residuals) if low.diff_residuals else ()
            return (None,) * nnd + tuple(outs) + extra

        cls = type(f"CustomVJP_{path.replace('[', '_').replace(']', '').replace('.', '_')}",
                   (torch.autograd.Function,),
                   {"forward": staticmethod(forward), "backward": staticmethod(backward)})
        self._fns[path] = cls
        return cls


def _memory(t: torch.Tensor, device: str) -> str:
    """Memory kind of a saved tensor, in JAX's words: on the run's device, or on the host."""
    if t.device.type == device:
        return "device"
    return "pinned_host" if t.is_pinned() else "unpinned_host"


def _tolist(x) -> Any:
    return x.detach().cpu().numpy().tolist()


def node_values(program: Program, inputs: dict[str, np.ndarray], device: str = "cpu") -> dict[str, np.ndarray]:
    """Every primal value of the program, evaluated by torch without checkpoint (program dtype)."""
    env = {i.id: torch.as_tensor(np.asarray(inputs[i.id], dtype=i.dtype), device=device) for i in program.inputs}
    rec = dict(env)
    with torch.no_grad():
        Lowering(program, remat=False, custom=False, record=rec).body(program.body, env)
    return {k: v.detach().cpu().numpy() for k, v in rec.items()}


# ---- residual capture -----------------------------------------------------------------------
class _Handle:
    """What a pack hook stores: the saved tensor itself (a view keeps its own layout) and
    the index of its memory-deduplicated record."""
    __slots__ = ("i", "t")

    def __init__(self, i: int, t: torch.Tensor):
        self.i, self.t = i, t


class SavedRecorder:
    """saved_tensors_hooks recording every tensor saved for backward while `active` and
    which of them the backward pass reads back. Deduplicated by memory (storage, offset,
    element count, dtype): a view of a saved tensor is the same residual.

    Eager autograd has no dead-code elimination: a computation that does not reach the loss
    still saves its inputs. Residuals are therefore the tensors saved during the forward
    *and read by the backward* (what JAX's vjp closure and a compiled partition hold);
    saved-but-never-read tensors are reported separately (`unread`)."""

    def __init__(self):
        self._copy: list[torch.Tensor] = []
        self._index: dict = {}
        self.read: set[int] = set()
        self.active = False
        self.packs = 0

    def pack(self, t):
        if not self.active:
            return t
        self.packs += 1
        try:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel(), t.dtype, t.device)
        except Exception:
            key = ("id", id(t))
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self._copy)
            self._copy.append(t.detach().clone())
        return _Handle(i, t)

    def unpack(self, h):
        if isinstance(h, _Handle):
            self.read.add(h.i)
            return h.t
        return h

    @property
    def saved(self) -> list[torch.Tensor]:
        return [c for i, c in enumerate(self._copy) if i in self.read]

    @property
    def unread(self) -> list[torch.Tensor]:
        return [c for i, c in enumerate(self._copy) if i not in self.read]

    @contextmanager
    def recording(self):
        self.active = True
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield
        finally:
            self.active = False


# ---- compile-time recording partitioners -----------------------------------------------------
def _saved_desc(fw, n_user) -> list:
    outs = fw.graph.find_nodes(op="output")[0].args[0][n_user:]
    out = []
    for o in outs:
        v = o.meta.get("val") if hasattr(o, "meta") else None
        out.append([getattr(o, "name", str(o)), list(v.shape) if hasattr(v, "shape") else None])
    return out


def recording_aot_backend(partition: str, rec: dict):
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
    base = {"min_cut": min_cut_rematerialization_partition, "default": default_partition}[partition]

    def part(joint_gm, joint_inputs, *, num_fwd_outputs, **kw):
        fw, bw = base(joint_gm, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)
        rec.setdefault("partitioner_saved", []).append(_saved_desc(fw, num_fwd_outputs))
        return fw, bw

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs,
                                     fw_compiler=lambda g, e: make_boxed_func(g),
                                     bw_compiler=lambda g, e: make_boxed_func(g),
                                     partition_fn=part)
    return backend


class RecordingPartitioner(CustomPartitionerFn):
    """Inductor's min-cut partitioner, recording which forward nodes it saves. Module level
    (picklable) so that inductor's FX-graph cache still works; the autograd cache, which
    would skip the partitioner, is off during runs."""

    def __init__(self, rec: dict | None = None):
        self.rec = rec if rec is not None else {}

    def __call__(self, gm, joint_inputs, **kwargs):
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        fw, bw = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        self.rec.setdefault("partitioner_saved", []).append(_saved_desc(fw, kwargs["num_fwd_outputs"]))
        return fw, bw

    def uuid(self):
        return "remat-conformance-recording-min-cut-v1"

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.rec = {}


def _inductor_partitioner(rec: dict):
    return RecordingPartitioner(rec)


@contextmanager
def torch_settings(settings: list[tuple[Any, str, Any]]):
    """Set (module, attribute, value) for one run and restore them afterwards."""
    old = [(m, k, getattr(m, k)) for m, k, _ in settings]
    try:
        for m, k, v in settings:
            setattr(m, k, v)
        yield
    finally:
        for m, k, v in old:
            setattr(m, k, v)


# ---- pipelines --------------------------------------------------------------------------------
class TorchBase(Pipeline):
    framework = "torch"
    remat = True
    prefer = False
    compile: str | None = None        # None (eager), "aot_eager", "inductor"
    partitioner = "min_cut"          # aot_eager only: "min_cut" or "default"

    def __init__(self, name: str, **kw):
        self.name = name
        for k, v in kw.items():
            setattr(self, k, v)

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "numpy": np.__version__}

    def devices(self) -> list[str]:
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

    def available(self) -> tuple[bool, str]:
        return True, ""

    def flags(self) -> dict[str, Any]:
        f: dict[str, Any] = {"remat": self.remat, "prefer": self.prefer, "compile": self.compile}
        if self.compile:
            f.update(partitioner="min_cut" if self.compile == "inductor" else self.partitioner,
                     fail_on_recompile_limit_hit=True, enable_autograd_cache=False,
                     inductor_cache_dir=os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
        return f

    def run(self, program: Program, inputs: dict[str, np.ndarray], device: str = "cpu") -> Observation:
        obs = Observation(pipeline=self.name, device=device, versions=self.versions(), flags=self.flags())
        if device not in self.devices():
            obs.unsupported = f"device {device!r} not available to torch {torch.__version__}"
            return obs
        torch.manual_seed(0)
        settings = [(torch._dynamo.config, "fail_on_recompile_limit_hit", True),
                    (functorch_config, "enable_autograd_cache", False)]
        if self.compile == "inductor":
            import torch._inductor.config as ic
            self._rec: dict = {}
            settings.append((ic, "custom_partitioner_fn", _inductor_partitioner(self._rec)))
        with torch_settings(settings):
            if self.compile:
                from torch._dynamo.utils import counters
                torch._dynamo.reset()
                counters.clear()
            try:
                self._run(program, inputs, obs, device)
            finally:
                if self.compile:
                    torch._dynamo.reset()
        return obs

    def _compiled(self, fn):
        if self.compile is None:
            return fn
        if self.compile == "aot_eager":
            self._rec = {}
            backend = recording_aot_backend(self.partitioner, self._rec)
        else:
            backend = "inductor"
        return torch.compile(fn, backend=backend, dynamic=False)

    def _capture(self, saved: list[torch.Tensor]) -> list[torch.Tensor]:
        """Hook for test-only mutants."""
        return saved

    def _run(self, program: Program, inputs, obs: Observation, device: str):
        t = obs.timings
        diff_ids = [i.id for i in program.inputs if i.diff]
        const = {i.id: torch.as_tensor(np.asarray(inputs[i.id], dtype=i.dtype), device=device)
                 for i in program.inputs if not i.diff}
        calls: list = []
        low = Lowering(program, remat=self.remat, prefer=self.prefer, policy_calls=calls)

        def make_loss(low):
            def loss_fn(*d):
                env = dict(const)
                env.update(zip(diff_ids, d))
                low.body(program.body, env)
                outs = [env[o] for o in program.outputs]
                loss = sum(torch.sum(o).to(torch.float64) for o in outs)
                return loss, outs
            return loss_fn
        loss_fn = make_loss(low)

        def leaves():
            return [torch.as_tensor(np.asarray(inputs[i], dtype=ty), device=device).requires_grad_(True)
                    for i, ty in ((i.id, i.dtype) for i in program.inputs if i.diff)]

        def grad(loss, d, create_graph=False):
            if not loss.requires_grad:
                return [torch.zeros_like(x) for x in d]
            return torch.autograd.grad(loss, d, allow_unused=True, materialize_grads=True,
                                       create_graph=create_graph)

        fn = self._compiled(loss_fn)
        rec = SavedRecorder()
        stage = "lowering" if self.compile else "forward"
        try:
            d = leaves()
            with timed(t, "forward"), rec.recording():
                loss, outs = fn(*d)
            stage = "backward"
            with timed(t, "backward"):
                grads = grad(loss, d)
            obs.loss = float(loss.detach().cpu())
            obs.outputs = [_tolist(o) for o in outs]
            obs.grads = {i: _tolist(g) for i, g in zip(diff_ids, grads)}
            with timed(t, "residuals"):
                saved = self._capture(rec.saved)
                values = node_values(program, inputs, device)
                index = node_index(program)
                obs.residuals = canonicalise([s.cpu().numpy() for s in saved], values, index,
                                             memory=[_memory(s, device) for s in saved])
                if rec.unread:   # saved for backward, never read (eager: no dead-code elimination)
                    obs.flags["saved_unread"] = [
                        ("/".join(r.cls) or "?") + f":{r.dtype}{r.shape}"
                        for r in canonicalise([s.cpu().numpy() for s in rec.unread], values, index)]
            if program.diff.order == 2:
                stage = "second_order"
                if self.compile:
                    obs.unsupported = ("aot_autograd does not support double backward "
                                       "(torch.compile); second-order programs are out of scope")
                else:
                    with timed(t, "second_order"):
                        d = leaves()
                        low2 = Lowering(program, remat=self.remat, prefer=self.prefer, diff_residuals=True)
                        loss2, _ = make_loss(low2)(*d)
                        gs = grad(loss2, d, create_graph=True)
                        l2 = sum(torch.sum(g).to(torch.float64) for g in gs)
                        g2 = grad(l2, d)
                    obs.grads2 = {i: _tolist(g) for i, g in zip(diff_ids, g2)}
        except Exception as e:  # the observation records it; oracles judge
            if stage == "lowering" and not type(e).__module__.startswith(("torch._dynamo", "torch._inductor")):
                stage = "forward"
            obs.error = ErrorInfo(type=type(e).__name__, message=str(e)[:4000], stage=stage)
        if self.compile:
            # Traced rules are not observable at run time: keep only logs of rules that ran
            # eagerly (after a graph break).
            obs.custom_rules = {k: v for k, v in low.logs.items() if v.fwd_traces or v.bwd_calls}
            obs.flags["custom_rules_observable"] = "eager parts only"
            obs.flags["partitioner_saved"] = getattr(self, "_rec", {}).get("partitioner_saved", [])
            from torch._dynamo.utils import counters
            obs.flags["graph_breaks"] = sum(counters["graph_break"].values())
            obs.flags["graphs"] = counters["stats"].get("unique_graphs", 0)
        else:
            obs.custom_rules = {k: v for k, v in low.logs.items()}
        obs.flags["saved_tensor_packs"] = rec.packs
        if self.remat and calls:
            obs.flags["policy_calls"] = len(calls)
            obs.flags["policy_recompute_calls"] = sum(1 for c in calls if c[1])


class TorchNoRemat(TorchBase):
    """torch:none: the program's own dtypes, no checkpoint, custom rules kept, eager."""
    reference = True
    remat = False


class TorchSAC(TorchBase):
    """Selective activation checkpointing, eager or under torch.compile."""
    remat = True
