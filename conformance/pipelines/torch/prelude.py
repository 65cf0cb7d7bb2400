"""The PyTorch helpers the lowering table's templates and the PyTorch pipelines call (cond branch
selection, second-order products, the selective-checkpoint policy_fn): a real module, linted and
imported by conformance.pipelines.torch.lowering. Repros paste the helpers' source
(conformance.pipelines.torch.table.PRELUDE reads this file, so the table imports no framework)."""
from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy


# --- helpers: repros paste the source from here on ---
def branch_index(pred, n):
    """The branch a cond on n branches takes: how many thresholds lie below the sum of its
    predicate (conformance.ir.nodes.branch_thresholds)."""
    total = torch.sum(pred)
    return int(sum(bool(total > -0.5 + (j + 1) / n) for j in range(n - 1)))


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
    call order (the 1st, 3rd...), and recomputes the rest. (PyTorch 2.14 calls a policy in the
    forward only: ctx.is_recompute is deprecated, always False.)"""
    P = CheckpointPolicy
    table = ({"save": P.PREFER_SAVE, "recompute": P.PREFER_RECOMPUTE, "offload": P.PREFER_CPU_OFFLOAD} if prefer
             else {"save": P.MUST_SAVE, "recompute": P.MUST_RECOMPUTE, "offload": P.MUST_CPU_OFFLOAD})
    saves = []   # (every_other) the calls this policy decided to save, in order

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
            saves.append(str(op))
            d = "save" if len(saves) % 2 else "recompute"
        if calls is not None:   # (under torch.compile, the calls made while tracing)
            calls.append((str(op), bool(ctx.is_recompute), d, torch.compiler.is_compiling()))
        return table[d]
    return policy_fn
