"""The PyTorch helpers the lowering table's templates and the PyTorch pipelines call (cond branch
selection, second-order products, the selective-checkpoint policy_fn): a real module, linted and
imported by conformance.pipelines.torch.lowering. Repros paste the helpers' source
(conformance.pipelines.torch.table.PRELUDE reads this file, so the table imports no framework)."""
from __future__ import annotations

import torch
import torch.utils.checkpoint

CheckpointPolicy = getattr(torch.utils.checkpoint, "CheckpointPolicy", None)   # (torch 2.5 onwards: sac_policy's)


# --- helpers: repros paste the source from here on ---
def branch_index(pred, n):
    """The branch a cond on n branches takes: how many thresholds lie below the sum of its
    predicate (conformance.ir.nodes.branch_thresholds)."""
    total = torch.sum(pred)
    return int(sum(bool(total > -0.5 + (j + 1) / n) for j in range(n - 1)))


def var_plus_mean(x, dim):
    """torch.var_mean (one call, two outputs; population variance), both outputs used."""
    v, m = torch.var_mean(x, dim=dim, correction=0)
    return v + m


def second_order(mode, loss_fn, d, grad):
    """H @ ones for loss_fn(*d)[0] (second-order programs), computed as `mode` says."""
    import torch.autograd.forward_ad as fwAD
    if mode == "reverse":   # grad of the sum of grad (double backward)
        gs = grad(loss_fn(*d)[0], d, create_graph=True)
        return grad(sum(torch.sum(g).to(torch.float64) for g in gs), d)
    if mode == "fwd_over_rev":   # forward-mode AD (tangent ones) through the backward pass: jvp of grad
        with fwAD.dual_level():
            duals = [fwAD.make_dual(x, torch.ones_like(x)) for x in d]
            gs = grad(loss_fn(*duals)[0], duals, create_graph=True)
            tans = [fwAD.unpack_dual(g).tangent for g in gs]
            return [torch.zeros_like(g) if t is None else t for g, t in zip(gs, tans)]
    if mode == "rev_over_fwd":   # grad of a function built with forward-mode AD (the jvp of the loss)
        def jvp_of_loss(*x):
            with fwAD.dual_level():
                t = fwAD.unpack_dual(loss_fn(*[fwAD.make_dual(a, torch.ones_like(a)) for a in x])[0]).tangent
            return torch.zeros((), dtype=torch.float64) if t is None else t
        return grad(jvp_of_loss(*d), d)
    raise ValueError(mode)


def sac_policy(decisions, kinds_of, tag_packet, prefer=False, calls=None, state=None):
    """A SAC policy_fn: aten op -> IR op kinds (kinds_of), then the region's decisions. state
    "every_other": a stateful policy as people write them (torchtitan's "save every other mm"),
    made afresh for each checkpoint call, that saves only every other op the decisions save, by
    call order (the 1st, 3rd...), and recomputes the rest. (PyTorch from 2.13 calls a policy in the
    forward only: ctx.is_recompute is deprecated, always False; 2.5 to 2.12 call it again while
    recomputing, with ctx.is_recompute True: those calls are counted apart, so that the recompute
    makes the forward's decisions, as a correct stateful policy must.)"""
    P = CheckpointPolicy
    # (CPU offload came with torch 2.11: before it no program with an offloading policy runs here)
    table = ({"save": P.PREFER_SAVE, "recompute": P.PREFER_RECOMPUTE,
              "offload": getattr(P, "PREFER_CPU_OFFLOAD", None)} if prefer
             else {"save": P.MUST_SAVE, "recompute": P.MUST_RECOMPUTE, "offload": getattr(P, "MUST_CPU_OFFLOAD", None)})
    saves = []   # (every_other) the calls this policy decided to save, in order
    resaves = []   # (every_other) the same, while recomputing (PyTorch before 2.13)

    bounds = decisions["bounds"]

    def policy_fn(ctx, op, *args, **kwargs):
        packet = getattr(op, "overloadpacket", op)
        n = args[0].numel() if args and isinstance(args[0], torch.Tensor) else None
        c = 0 if n is None else sum(1 for t in bounds if n >= t)
        if packet is tag_packet:
            ds = [decisions[("name", args[1], c)]]
        else:
            ds = [decisions[k + (c,)] for k in kinds_of.get(packet, [(None, False)])]
        d = "save" if "save" in ds else "offload" if "offload" in ds else "recompute"
        if state == "every_other" and d == "save":
            seq = resaves if getattr(ctx, "is_recompute", False) else saves
            seq.append(str(op))
            d = "save" if len(seq) % 2 else "recompute"
        if calls is not None:   # (under torch.compile, the calls made while tracing)
            calls.append((str(op), bool(ctx.is_recompute), d, torch.compiler.is_compiling()))
        return table[d]
    return policy_fn


def user_hooks():
    """A user's own saved-tensor hooks as training code writes them (a compressed or offloaded copy):
    pack keeps a float64 copy and the dtype, unpack casts the copy back (exact for every float dtype)."""
    def pack(t):
        return t.dtype, t.detach().to(torch.float64, copy=True)

    def unpack(packed):
        return packed[1].to(packed[0])
    return pack, unpack


HOOKS_OFF = "saved-tensor hooks are disabled around this forward"   # disable_saved_tensors_hooks's message


def saved_tensor_hooks(kind):
    """The (pack, unpack) pair of a hooks kind: torch.autograd.graph.save_on_cpu's, or user_hooks()."""
    if kind == "save_on_cpu":
        h = torch.autograd.graph.save_on_cpu(pin_memory=False)
        return h.pack_hook, h.unpack_hook
    return user_hooks()


class Scale(torch.nn.Module):
    """x * c, c a buffer (torch.func.functional_call swaps in the caller's value; a buffer, not a parameter: strict
    export refuses making an nn.Parameter inside a checkpoint region)."""
    def __init__(self):
        super().__init__()
        self.register_buffer("c", torch.ones(()))

    def forward(self, x):
        return x * self.c


def scaled_by(x, c):
    """x * c by torch.func.functional_call of a Scale module with c swapped in for its buffer."""
    return torch.func.functional_call(Scale(), {"c": torch.tensor(c, dtype=x.dtype, device=x.device)}, (x,))


def func_grad(fn, const, diff):
    """(gradients, (loss, outputs)) of fn(*const, *diff) by torch.func.grad_and_value over the diff inputs."""
    def loss_of(*d):
        return fn(*const, *d)
    return torch.func.grad_and_value(loss_of, argnums=tuple(range(len(diff))), has_aux=True)(*diff)


class AsModule(torch.nn.Module):
    """A function as an nn.Module: `params` (name -> tensor) are its parameters, passed after the
    forward's positional inputs (torch.func.functional_call swaps in the caller's tensors)."""
    def __init__(self, fn, params=()):
        super().__init__()
        self.fn, self.names = fn, list(params)
        for name in self.names:
            self.register_parameter(name, torch.nn.Parameter(torch.zeros(1)))

    def forward(self, *inputs):
        return self.fn(*inputs, *[getattr(self, n) for n in self.names])


def exported(fn, args, strict):
    """fn exported by torch.export.export (strict or non-strict) on these example args: the
    exported program's module, run eagerly."""
    return torch.export.export(AsModule(fn), tuple(args), strict=strict).module()


def functional(fn, n_const):
    """fn called with its differentiated inputs (after the n_const constant ones) as the parameters
    of a module, through torch.func.functional_call."""
    def call(*a):
        params = {f"p{k}": x for k, x in enumerate(a[n_const:])}
        return torch.func.functional_call(AsModule(fn, params), params, tuple(a[:n_const]))
    return call
