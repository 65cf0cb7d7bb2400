"""The PyTorch lowering table: op -> torch source, and the aten overload packets a SAC
policy_fn sees for it. Plain data (no torch import): the PyTorch pipelines compile it, the
repro emitter pastes it.

Names the templates may use: torch, A (torch.ops.aten), tag (the checkpoint_name analogue,
a custom identity op carrying the name), and PRELUDE's helpers.
"""
from __future__ import annotations

from pathlib import Path

from conformance.ir.nodes import is_name, walk
from conformance.ir.ops import NAME_OP, NAME_OPS
from conformance.ir.policy import class_elements, decide, thresholds
from conformance.pipelines.tables import Lowering, helpers_source, op_source

L = Lowering
OPS: dict[str, Lowering] = {
    "sin": L("torch.sin({x})", ("A.sin",)),
    "cos": L("torch.cos({x})", ("A.cos",)),
    "tanh": L("torch.tanh({x})", ("A.tanh",)),
    "exp": L("torch.exp({x})", ("A.exp",)),
    "sigmoid": L("torch.sigmoid({x})", ("A.sigmoid",)),
    "square": L("torch.square({x})", ("A.pow", "A.square")),
    "neg": L("torch.neg({x})", ("A.neg",)),
    "scale": L("{x} * float({c})", ("A.mul",)),
    "nondiff_scale": L("{x} * float({nondiff})", ("A.mul",)),
    "add": L("{x} + {y}", ("A.add",)),
    "sub": L("{x} - {y}", ("A.sub",)),
    "mul": L("{x} * {y}", ("A.mul",)),
    "matmul": L("torch.matmul({x}, {y})", ("A.mm", "A.addmm", "A.mv", "A.dot"), ("A.bmm", "A.baddbmm")),
    "sum": L("torch.sum({x}, dim={axis})", ("A.sum",)),
    "mean": L("torch.mean({x}, dim={axis})", ("A.mean",)),
    "transpose": L("torch.permute({x}, {perm})", ("A.permute",)),
    "reshape": L("torch.reshape({x}, {shape})", ("A.view", "A._unsafe_view", "A.reshape")),
    "broadcast": L("torch.broadcast_to({x}, {shape})", ("A.expand",)),
    "name": L("tag({x}, {name})", ("torch.ops.rc.tag",)),
    "name_fwd": L("tag({x}, {name})", ("torch.ops.rc.tag",)),   # PyTorch has one kind of name
    "relu": L("torch.relu({x})", ("A.relu",)),
    "step": L("({x} > 0).to({x}.dtype)", ("A.gt", "A._to_copy")),
    "slice": L("torch.narrow({x}, {axis}, {start}, {stop} - {start})", ("A.slice", "A.narrow")),
    "pad": L("torch.nn.functional.pad({x}, [0, 0] * ({x}.dim() - 1 - {axis}) + [{before}, {after}])",
             ("A.constant_pad_nd",)),
    "conv1d": L("torch.nn.functional.conv1d({x}, {y})", ("A.convolution", "A.conv1d")),
    "cast": L("{x}.to(dt({dtype}))", ("A._to_copy",)),
    # (from the global generator; on CPU dropout runs as empty_like, bernoulli_, div_ and mul)
    "dropout": L("torch.nn.functional.dropout({x}, {p}, training=True)",
                 ("A.native_dropout", "A.dropout", "A.bernoulli_", "A.bernoulli", "A.empty_like", "A.div_", "A.mul")),
    "matrix_t": L("{x}.t()", ("A.t",)),
    "select": L("torch.select({x}, {axis}, {index})", ("A.select",)),
    "add_": L("{x}.add_({y})", ("A.add_",)),
    "mul_": L("{x}.mul_({y})", ("A.mul_",)),
    "relu_": L("torch.relu_({x})", ("A.relu_",)),
    # multi-output ops (a policy sees one call, values and indices) and data-dependent ops
    "var_mean": L("var_plus_mean({x}, {axis})", ("A.var_mean",)),
    "topk": L("torch.topk({x}, {k}, dim={axis}).values", ("A.topk",)),
    "max_dim": L("torch.max({x}, dim={axis}).values", ("A.max",)),
    "sort": L("torch.sort({x}, dim={axis}).values", ("A.sort",)),
    # (the gt, sum and max inside them follow step's, sum's and max_dim's policy, as in JAX)
    "masked_sum": L("{x}[{x} > 0].sum()", ("A.index",)),
    "scale_by_max": L("{x} * {x}.max().item()", ("A.mul",)),
    "grad_of_sin": L("torch.func.grad(lambda y: torch.sin(y).sum())({x})", ("A.cos",)),
    "functional_scale": L("scaled_by({x}, {c})", ("A.mul",)),
}

# The SAC policy_fn: a thin adapter over the one policy meaning (conformance.ir.policy.decide),
# whose decisions for a region are precomputed into a table (`decisions`, from
# region_decisions) keyed by (IR op kind, batched, size class) and (name op, checkpoint name,
# size class). The size class says between which of the policy's element-count thresholds
# (decisions["bounds"], min_elements policies) the op's first input falls; 0 without any.
# Second-order modes PyTorch runs under checkpoint (each gives H @ ones, as in JAX): jax.linearize
# has no counterpart there (torch.func transforms reject the saved tensor hooks checkpoint uses).
SECOND_ORDER_MODES = ("reverse", "fwd_over_rev", "rev_over_fwd")

PRELUDE = helpers_source(Path(__file__).with_name("prelude.py"))
# The error type of a run after which saved-tensor hooks stay disabled (every later checkpoint in the process raises)
HOOKS_LEFT_DISABLED = "SavedTensorHooksLeftDisabled"


def kinds_of() -> dict[str, list[tuple[str, bool]]]:
    """aten overload packet -> [(IR op kind, batched)], from the table."""
    by: dict[str, list] = {}
    for op, low in OPS.items():
        if op in NAME_OPS:
            continue
        for pk in low.policy_ops:
            by.setdefault(pk, []).append((op, False))
        for pk in low.batched_ops:
            by.setdefault(pk, []).append((op, True))
    return by


def kinds_of_source() -> str:
    """Source of kinds_of()'s dict."""
    return "{" + ", ".join(f"{pk}: {v!r}" for pk, v in kinds_of().items()) + "}"


TAG_PACKET = OPS[NAME_OP].policy_ops[0]


def region_decisions(policy, names: list[str]) -> dict:
    """Every decision a region's policy_fn can need: per (op kind, batched) and size class,
    the unknown op (None, False), and per checkpoint name of the program; "bounds": the
    policy's element-count thresholds that delimit the size classes."""
    bounds = thresholds(policy)
    out: dict = {"bounds": bounds}
    for c in range(len(bounds) + 1):
        n = class_elements(c, bounds)
        out[(None, False, c)] = decide(policy, None, None, False, n)
        for op, low in OPS.items():
            if op in NAME_OPS:
                continue
            for batched in ([False, True] if low.batched_ops else [False]):
                out[(op, batched, c)] = decide(policy, op, None, batched, n)
        for nm in names:
            out[("name", nm, c)] = decide(policy, NAME_OP, nm, False, n)
    return out


def program_names(prog) -> list[str]:
    return sorted({s.params["name"] for s, _, _, _ in walk(prog.body) if is_name(s)})


def op_text(op: str, args: list[str], params: dict, nondiff: str | None) -> str:
    return op_source(OPS, op, args, params, nondiff)

