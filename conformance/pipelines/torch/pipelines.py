"""PyTorch pipelines: no-checkpoint baseline, eager selective activation checkpointing (SAC)
and SAC under torch.compile (aot_eager with the min-cut or the default partitioner, inductor),
each with MUST_* policies and a `:prefer` variant using PREFER_* hints. The lowering is in
torch_lowering, residual capture in torch_capture, the recording backends in torch_compile.

Residuals: saved for backward and read back (torch_capture), canonicalised against the
program's node values evaluated without checkpoint in the program's dtype. Eager autograd
has no dead-code elimination, so tensors saved but never read are listed apart
(`flags['saved_unread']`). Compiled pipelines also record which forward-graph nodes the
partitioner chose to save (`flags['partitioner_saved']`), graph breaks and graph counts.
For second order the residuals are computed by ordinary differentiated ops and passed into
the Function, so double backward differentiates the bwd rule through them as JAX does.
Compiled pipelines declare second order unsupported.

Offload policies map to CheckpointPolicy.{MUST,PREFER}_CPU_OFFLOAD (present in 2.14);
note that eager SAC recomputes such ops instead (only compile honours them).
"""
from __future__ import annotations

import contextlib
import os
from typing import Any

from conformance.files import cache_root

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch._dynamo  # noqa: E402
import torch._functorch.config as functorch_config  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensor  # noqa: E402
from torch._subclasses.functional_tensor import FunctionalTensor  # noqa: E402

from conformance.ir.batching import example_inputs  # noqa: E402
from conformance.ir.interpreter import loss_outputs, output_cotangents  # noqa: E402
from conformance.ir.nodes import Checkpoint, CustomVJP, Op, Scan, walk  # noqa: E402
from conformance.ir.observation import ErrorInfo, Observation  # noqa: E402
from conformance.ir.ops import DATA_DEPENDENT  # noqa: E402
from conformance.ir.ops import OPS as OP_DECLS  # noqa: E402
from conformance.ir.program import Program  # noqa: E402
from conformance.ir.residuals import canonicalise  # noqa: E402
from conformance.pipelines.base import Pipeline, error_info, timed  # noqa: E402
from conformance.pipelines.registry import TORCH_OPTIONS
from conformance.pipelines.tables import unlowered  # noqa: E402
from conformance.pipelines.torch import prelude
from conformance.pipelines.torch import table as torch_table  # noqa: E402
from conformance.pipelines.torch.capture import SavedRecorder, memory_kind  # noqa: E402
from conformance.pipelines.torch.compile import inductor_partitioner, recording_aot_backend, torch_settings  # noqa: E402
from conformance.pipelines.torch.lowering import (  # noqa: E402
    SAC_CACHE_READABLE,
    SAC_THROUGH_HOOKS,
    Lowering,
    node_values,
    numpy_of,
    tensor,
    unhonoured_saves,
)


def _tolist(x) -> Any:
    return numpy_of(x).astype(np.float64).tolist()


# ---- pipelines --------------------------------------------------------------------------------
# The reason, also in the expectations data (entry torch-no-custom-jvp).
NO_CUSTOM_JVP = ("PyTorch has no custom_jvp: an autograd.Function's jvp rule serves forward-mode AD only, "
                 "never the reverse mode these programs are differentiated in")
# (entry torch-no-region-state)
NO_REGION_STATE = ("a region's mutable state is a jax.new_ref; its PyTorch counterpart (an in-place update of a "
                   "tensor the checkpointed function closes over) is not lowered: a harness limit")
# (entry torch-no-linearize)
NO_LINEARIZE = ("jax.linearize has no PyTorch counterpart that runs under checkpoint: torch.func.linearize, like "
                "every torch.func transform, rejects the saved tensor hooks torch.utils.checkpoint uses")
# (entry torch-reentrant-first-order)
NO_REENTRANT_GRAD = ("use_reentrant=True checkpoint is incompatible with torch.autograd.grad and with double backward "
                     "(torch.utils.checkpoint's documentation): second-order programs are out of its scope")
# (entry torch-once-differentiable-first-order)
ONCE_DIFFERENTIABLE = ("a backward decorated @once_differentiable is documented to support first-order gradients only: "
                       "its outputs have no graph to differentiate again")
# A harness limit, not PyTorch's (no expectation entry): under torch.compile, a checkpoint region in a
# Function's forward as the harness's interpreter runs it makes dynamo raise "An intermediate tensor
# ... created inside a higher-order op subgraph aliases an input or output" (gate seed 4343: a
# broadcast residual), which the same program's straight-line repro script does not.
CHECKPOINT_IN_FUNCTION_COMPILED = (
    "a checkpoint region in a custom rule's forward is not run under torch.compile: "
    "the harness's interpreted lowering trips a dynamo aliasing check that straight-line "
    "code does not (eager pipelines run it)"
)
# (entry torch-export-autograd-function)
EXPORT_NO_CUSTOM_RULES = (
    "torch.export captures the forward's tensor computation only: an autograd.Function's backward is not part of the "
    "exported program (non-strict export differentiates its forward instead, strict export's outputs have no "
    "gradient): custom rules are out of the export pipelines' scope")
# (entry torch-export-data-dependent-control-flow)
EXPORT_NO_PYTHON_BRANCHES = ("torch.export does not trace data-dependent Python control flow (a cond is a Python if on "
                             "a tensor here, a backward branch too); it documents torch.cond for it")
# (no expectation entry: the program's features do not say what a vmap body holds)
VMAP_BODY_UNSUPPORTED = ("torch.func.vmap of a body with an autograd.Function (it needs setup_context and a vmap "
                         "rule: \"Extending torch.func with autograd.Function\"), a random op (vmap's "
                         "randomness=\"error\"), a data-dependent op (vmap rejects .item() and boolean-mask "
                         "indexing) or a checkpoint region (its backward raises \"your tensor may have "
                         "escaped\": pytorch/pytorch#165880, open)")
# (no expectation entry: the harness's autograd.Functions are written the classic way, forward(ctx, ...))
FUNC_GRAD_NO_FUNCTION = ("torch.func.grad of an autograd.Function needs setup_context (\"Extending torch.func with "
                         "autograd.Function\"); the harness writes custom rules, and the autograd of its "
                         "checkpoint_name analogue, as forward(ctx, ...)")
HOOKS_LEFT_DISABLED = torch_table.HOOKS_LEFT_DISABLED
HOOKS_LEFT_DISABLED_WHY = "after this run saved-tensor hooks stay disabled in the process: every later checkpoint "\
                          "raises"
# What a forward that returns a FakeTensor for real inputs raises (a tracing mode left behind)
FAKE_OUTPUT = "the forward returned a FakeTensor for real inputs (a tracing mode was left active)"
# (entries torch-no-forward-ad-names, torch-no-forward-ad-custom-vjp)
NO_FORWARD_AD = ("forward-mode AD needs a jvp rule: the harness's checkpoint_name analogue (a torch.library custom "
                 "op) and its custom_vjp blocks (autograd.Function with a backward only) have none")


# Options that change how the first-order forward is called (not run again for second order).
OWN_FORWARD = ("hooks", "early_stop_off", "export", "functional_call", "func_vmap", "func_grad")
RECOMPILE_LIMIT = 64   # dynamo's, per code object (default 8)


class TorchBase(Pipeline):
    """A PyTorch pipeline; its registry entry (spec) says remat, prefer, the compile backend
    (None: eager) and, for aot_eager, the partitioner."""

    @property
    def remat(self) -> bool:
        return self.spec.remat

    @property
    def prefer(self) -> bool:
        return self.spec.prefer

    @property
    def compile(self) -> str | None:
        return self.spec.compile

    @property
    def partitioner(self) -> str:
        return self.spec.partitioner

    def namespace(self) -> dict:
        return {"torch": torch}

    def versions(self) -> dict[str, str]:
        return {"torch": torch.__version__, "numpy": np.__version__}

    def devices(self) -> list[str]:
        return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])

    def available(self) -> tuple[bool, str]:
        return True, ""

    def flags(self) -> dict[str, Any]:
        f: dict[str, Any] = {"remat": self.remat, "prefer": self.prefer, "compile": self.compile}
        sp = self.spec
        f.update({k: getattr(sp, k) for k in TORCH_OPTIONS if getattr(sp, k)})
        if not sp.preserve_rng_state:
            f["preserve_rng_state"] = False
        if self.compile:
            f.update(partitioner="min_cut" if self.compile == "inductor" else self.partitioner,
                     fail_on_recompile_limit_hit=True, recompile_limit=RECOMPILE_LIMIT, enable_autograd_cache=False,
                     inductor_cache_dir=os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
            if sp.memory_budget != 1.0:
                f["activation_memory_budget"] = sp.memory_budget
        return f

    def run(self, program: Program, inputs: dict[str, np.ndarray], device: str = "cpu") -> Observation:
        obs = Observation(pipeline=self.name, device=device, versions=self.versions(), flags=self.flags())
        if device not in self.devices():
            obs.unsupported = f"device {device!r} not available to torch {torch.__version__}"
            return obs
        missing = unlowered(program, torch_table.OPS)
        if missing:
            obs.unsupported = f"no PyTorch lowering for ops {missing}"
            return obs
        ok, why = self.available()
        lacks = why if not ok else self.cannot_express(program)
        if lacks:
            obs.unsupported = lacks
            return obs
        feats = program.features()
        if "custom_jvp" in feats:
            obs.unsupported = NO_CUSTOM_JVP
            return obs
        if "linearize" in feats:
            obs.unsupported = NO_LINEARIZE
            return obs
        if "region_state" in feats:
            obs.unsupported = NO_REGION_STATE
            return obs
        if "forward_ad" in feats and ("names" in feats or "custom_vjp" in feats):
            obs.unsupported = NO_FORWARD_AD
            return obs
        if "checkpoint_in_custom_vjp" in feats and self.compile:
            obs.unsupported = CHECKPOINT_IN_FUNCTION_COMPILED
            return obs
        if "once_differentiable" in feats and program.diff.order == 2:
            obs.unsupported = ONCE_DIFFERENTIABLE
            return obs
        if self.spec.export and "custom_vjp" in feats:
            obs.unsupported = EXPORT_NO_CUSTOM_RULES
            return obs
        if self.spec.export and feats & {"cond", "switch"}:
            obs.unsupported = EXPORT_NO_PYTHON_BRANCHES
            return obs
        if self.spec.func_vmap and _vmap_body_has(program, lambda s: isinstance(s, (CustomVJP, Checkpoint)) or (
                isinstance(s, Op) and OP_DECLS[s.op].family in ("random", DATA_DEPENDENT))):
            obs.unsupported = VMAP_BODY_UNSUPPORTED
            return obs
        if self.spec.func_grad and feats & {"custom_vjp", "names"}:
            obs.unsupported = FUNC_GRAD_NO_FUNCTION
            return obs
        if self.spec.reentrant and program.diff.order == 2:
            obs.unsupported = NO_REENTRANT_GRAD
            return obs
        torch.manual_seed(0)
        # The harness's lowering is an interpreter loop over statements: dynamo recompiles its resume
        # functions after each graph break (a cond's Python if), which straight-line code (the
        # repro) does not; the limit is raised so that only a program's own recompiles can hit it
        # (a 10-statement program with a cond hit the default 8 here, not in its repro).
        settings = [(torch._dynamo.config, "fail_on_recompile_limit_hit", True),
                    (torch._dynamo.config, "recompile_limit", RECOMPILE_LIMIT),
                    (torch._dynamo.config, "accumulated_recompile_limit", 16 * RECOMPILE_LIMIT),
                    (functorch_config, "enable_autograd_cache", False),
                    (functorch_config, "activation_memory_budget", self.spec.memory_budget)]
        if self.compile == "inductor":
            import torch._inductor.config as ic
            self._rec: dict = {}
            settings.append((ic, "custom_partitioner_fn", inductor_partitioner(self._rec)))
            # random ops draw from eager's generator (inductor's own RNG draws other numbers)
            settings.append((ic, "fallback_random", True))
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
        if not torch._C._autograd._saved_tensors_hooks_is_enabled():
            # A run that leaves saved-tensor hooks disabled breaks every later checkpoint in the process: reported as
            # this run's error, and undone so that the next program is judged on its own.
            torch._C._autograd._saved_tensors_hooks_enable()
            obs.error = ErrorInfo(type=HOOKS_LEFT_DISABLED, message=HOOKS_LEFT_DISABLED_WHY + (
                f" (it raised {obs.error.type} first)" if obs.error else ""),
                stage=obs.error.stage if obs.error else "forward")
        return obs

    def _backend(self):
        if self.compile == "aot_eager":
            self._rec = {}
            return recording_aot_backend(self.partitioner, self._rec)
        return "inductor"

    def _compiled(self, fn):
        if self.compile is None or self.spec.compile_inside:
            return fn
        # dynamic: None honours the inputs' maybe_mark_dynamic marks (False would ignore them)
        return torch.compile(fn, backend=self._backend(), dynamic=None if self.spec.dynamic else False)

    def _capture(self, saved: list[torch.Tensor]) -> list[torch.Tensor]:
        """Hook for test-only mutants."""
        return saved

    def _options(self) -> dict:
        """The lowering's checkpoint options (torch_lowering.CHECKPOINT_OPTIONS), from the spec."""
        sp = self.spec
        return {
            "reentrant": sp.reentrant,
            "checks_off": sp.checks_off,
            "graph_break": sp.graph_break,
            "preserve_rng_state": sp.preserve_rng_state,
            "policy_state": sp.policy_state,
            "sequential": sp.sequential,
            "respect_hooks": sp.hooks != "user_bypassed",
            "func_vmap": sp.func_vmap,
            "allow_mutation": sp.allow_mutation,
            "compile_inside": self._backend() if sp.compile_inside else None,
        }

    def _run(self, program: Program, inputs, obs: Observation, device: str):
        t = obs.timings
        diff_ids = [i.id for i in program.inputs if i.diff]
        const_ids = [i.id for i in program.inputs if not i.diff]
        dtypes = {i.id: i.dtype for i in program.inputs}
        calls: list = []
        sp = self.spec
        # eager SAC: each checkpoint call's cache beside what its policy asked to save (item: MUST_SAVE honoured)
        sac_log = [] if (SAC_CACHE_READABLE and self.remat
                         and not (self.compile or sp.export or sp.reentrant or sp.compile_inside)) else None
        unhonoured: list = []
        low = Lowering(program, remat=self.remat, prefer=self.prefer, policy_calls=calls, options=self._options(),
                       sac_log=sac_log)

        cts, n_loss = output_cotangents(program), loss_outputs(program)   # the rest: auxiliary outputs

        def make_loss(low):
            def loss_fn(*a):   # the constant inputs, then the differentiated ones
                outs = low.outputs(dict(zip(const_ids, a[:len(const_ids)])), diff_ids, a[len(const_ids):])
                if cts is not None:   # each output's seeded cotangent
                    return sum(torch.sum(o * torch.tensor(c, dtype=o.dtype, device=o.device)).to(torch.float64)
                               for o, c in zip(outs, cts)), outs
                # auxiliary outputs detached, as JAX's has_aux leaves them undifferentiated (else a compiled graph
                # saves residuals for them that eager autograd, never asked for their backward, does not read)
                return sum(torch.sum(o).to(torch.float64) for o in outs[:n_loss]), [
                    *outs[:n_loss], *[o.detach() for o in outs[n_loss:]]]
            return loss_fn
        loss_fn = make_loss(low)

        def tensors(x, ids, leaf):
            out = [tensor(x[i], dtypes[i], device) for i in ids]
            if sp.dynamic:   # dynamic shapes: each dim of size >= 2 (size 1 always specialises)
                for v in out:
                    for k, n in enumerate(v.shape):
                        if n >= 2:
                            torch._dynamo.maybe_mark_dynamic(v, k)
            return [v.requires_grad_(True) for v in out] if leaf else out

        def grad(loss, d, create_graph=False):
            if not loss.requires_grad:
                return [torch.zeros_like(x) for x in d]
            if sp.reentrant:   # reentrant checkpoint rejects torch.autograd.grad: .backward(), then .grad
                loss.backward()
                return [torch.zeros_like(x) if x.grad is None else x.grad for x in d]
            if sp.backward_twice and not create_graph:   # the first backward keeps the graph for the second
                torch.autograd.grad(loss, d, allow_unused=True, materialize_grads=True, retain_graph=True)
            return torch.autograd.grad(loss, d, allow_unused=True, materialize_grads=True,
                                       create_graph=create_graph)

        # Per-example programs: each example differentiated on its own, in a Python loop
        # (torch.func.vmap of torch.func.grad rejects the saved tensor hooks checkpoint uses).
        examples = [inputs] if not program.diff.batch else [
            example_inputs(program, inputs, b) for b in range(program.diff.batch)]
        per_example = (lambda xs: torch.stack(list(xs))) if program.diff.batch else (lambda xs: list(xs)[0])
        fn = self._compiled(loss_fn)
        if sp.functional_call:
            fn = prelude.functional(fn, len(const_ids))
        # (a torch.func transform inside the program, without the user's hooks: the forward runs without the capture)
        no_capture = "func_transform_op" in program.features() and not (sp.hooks and sp.hooks != "disabled")
        hooks = prelude.saved_tensor_hooks(sp.hooks) if sp.hooks and sp.hooks != "disabled" else None
        rec = SavedRecorder()
        stage = "lowering" if self.compile or sp.export else "forward"
        try:
            runs = []
            for k, x in enumerate(examples):
                c, d = tensors(x, const_ids, False), tensors(x, diff_ids, True)
                if sp.export and k == 0:   # exported once, on the first example's inputs
                    stage = "lowering"
                    with timed(t, "export"):
                        fn = prelude.exported(loss_fn, [*c, *d], strict=sp.export == "strict")
                stage = "lowering" if self.compile else "forward"
                if sp.func_grad:   # forward and backward in one call; torch.func refuses saved-tensor hooks
                    with timed(t, "forward"):
                        grads, (loss, outs) = prelude.func_grad(fn, c, d)
                    runs.append((loss, outs, grads))
                    continue
                # (hooks disabled: no saved-tensor hooks may be installed, the capture's neither; a torch.func
                # transform in the program refuses any hooks around it: the capture stays out of its way)
                with (timed(t, "forward"), torch.autograd.graph.disable_saved_tensors_hooks(prelude.HOOKS_OFF)
                      if sp.hooks == "disabled" else contextlib.nullcontext() if no_capture else rec.recording(hooks),
                      torch.utils.checkpoint.set_checkpoint_early_stop(not sp.early_stop_off)):
                    loss, outs = fn(*c, *d)
                if any(isinstance(v, FakeTensor) for v in (loss, *outs)):
                    raise RuntimeError(FAKE_OUTPUT)
                stage = "backward"
                with timed(t, "backward"):
                    grads = grad(loss, d)
                if sac_log is not None:   # what SAC cached, and what its recompute ran
                    unhonoured += unhonoured_saves(sac_log)
                runs.append((loss, outs, grads))
            obs.loss = float(sum(r[0].detach().cpu() for r in runs))
            obs.outputs = [_tolist(per_example(r[1][k] for r in runs)) for k in range(len(program.outputs))]
            obs.grads = {i: _tolist(per_example(r[2][k] for r in runs)) for k, i in enumerate(diff_ids)}
            with timed(t, "residuals"):
                saved = self._capture(rec.saved)
                values = node_values(program, inputs, device)
                index = program.analysis().index
                # (torch 2.4's compile of a reentrant checkpoint runs the capture's hooks while it traces: the
                # tensors they see are tracing-time ones, not what the compiled run saved)
                traced = [s for s in saved if isinstance(s, (FakeTensor, FunctionalTensor))]
                obs.residuals = None if traced else canonicalise(
                    [numpy_of(s) for s in saved], values, index, memory=[memory_kind(s, device) for s in saved])
                if traced:
                    obs.flags["residuals_unobserved"] = ("the capture's saved-tensor hooks ran while torch.compile "
                                                         "traced: they saw tracing-time tensors")
                selective = self.remat and any(f.startswith("policy:") for f in program.features())
                if sp.func_grad or no_capture:
                    obs.residuals = None
                    obs.flags["residuals_unobserved"] = "torch.func.grad: the capture's saved-tensor hooks cannot run"
                if sp.hooks == "disabled":
                    obs.residuals = None
                    obs.flags["residuals_unobserved"] = "disable_saved_tensors_hooks: the capture's hooks cannot run"
                if sp.hooks == "user_bypassed" and selective:
                    obs.residuals = None   # SAC's cache bypasses the hooks the capture is part of: not observed
                    obs.flags["residuals_unobserved"] = "respect_saved_tensors_hooks=False: SAC's cache bypasses hooks"
                if not SAC_THROUGH_HOOKS and self.remat and any(f.startswith("policy:") for f in program.features()):
                    obs.residuals = None  # this torch's SAC cache is out of the hooks' sight: not observed
                    obs.flags["residuals_unobserved"] = (
                        f"torch {torch.__version__}: SAC's cache bypasses saved-tensor hooks"
                    )
                if sac_log is not None and obs.residuals is not None:   # asked to save, recomputed by SAC
                    outs_ = [o for _, out in unhonoured for o in (out if isinstance(out, (tuple, list)) else [out])
                             if isinstance(o, torch.Tensor)]
                    obs.recomputed_against_policy = canonicalise([numpy_of(o) for o in outs_], values, index)
                    if unhonoured:
                        obs.flags["recomputed_ops"] = sorted({op for op, _ in unhonoured})
                crec = getattr(self, "_rec", {}) if self.compile else {}
                if crec.get("recomputed_must_save") and obs.residuals is not None:   # a partitioner's recompute
                    # of a MUST_SAVE node (its values where the backward ran node by node: aot_eager; inductor
                    # compiles the backward, so only its ops are known)
                    obs.recomputed_against_policy = canonicalise(
                        [numpy_of(v) for v in crec.get("recomputed_values", [])], values, index)
                    obs.flags["recomputed_ops"] = sorted({op for _, op in crec["recomputed_must_save"]})
                if rec.unread and not traced:   # saved for backward, never read (eager: no dead-code elimination)
                    obs.flags["saved_unread"] = [
                        r.describe() for r in canonicalise([numpy_of(s) for s in rec.unread], values, index)]
            if program.diff.order == 2:
                stage = "second_order"
                if any(getattr(sp, k) for k in OWN_FORWARD):
                    obs.flags["second_order"] = "not run: this pipeline's option applies to the first-order run only"
                elif self.compile:
                    obs.unsupported = ("aot_autograd does not support double backward "
                                       "(torch.compile); second-order programs are out of scope")
                else:
                    with timed(t, "second_order"):
                        low2 = Lowering(program, remat=self.remat, prefer=self.prefer, diff_residuals=True)
                        loss2 = make_loss(low2)
                        g2s = []
                        for x in examples:
                            c = tensors(x, const_ids, False)
                            g2s.append(prelude.second_order(program.diff.mode, lambda *d: loss2(*c, *d),
                                                                 tensors(x, diff_ids, True), grad))
                    obs.grads2 = {i: _tolist(per_example(g[k] for g in g2s)) for k, i in enumerate(diff_ids)}
        except Exception as e:  # the observation records it; oracles judge  # noqa: BLE001
            if stage == "lowering" and not sp.export and not type(e).__module__.startswith(
                    ("torch._dynamo", "torch._inductor")):
                stage = "forward"
            obs.error = error_info(e, stage)
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
        if self.remat and calls:   # how often the policies ran (eagerly; while tracing), and what they decided
            obs.flags["policy_calls"] = sum(1 for c in calls if not c[3])
            obs.flags["policy_recompute_calls"] = sum(1 for c in calls if c[1])
            obs.flags["policy_trace_calls"] = sum(1 for c in calls if c[3])
            obs.flags["policy_decisions"] = {
                d: sum(1 for c in calls if c[2] == d) for d in sorted({c[2] for c in calls})
            }
            obs.flags["policy_ops"] = sorted({f"{c[0]}={c[2]}" for c in calls})   # each aten op and its decision


def _vmap_body_has(program: Program, pred) -> bool:
    """Whether a statement inside a vmap-spelled loop's body satisfies pred."""
    return any(isinstance(s, Scan) and s.spelling == "vmap" and any(pred(b) for b, _, _, _ in walk(s.body))
               for s, _, _, _ in walk(program.body))


class TorchNoRemat(TorchBase):
    """torch:none: the program's own dtypes, no checkpoint, custom rules kept, eager."""


class TorchSAC(TorchBase):
    """Selective activation checkpointing, eager or under torch.compile."""
