"""The JAX lowering table: op -> jax.numpy source, policy kind -> jax.checkpoint_policies
source, and the primitives an `ops` policy saves. Plain data (no jax import): the JAX
pipelines compile it, the repro emitter pastes it.

Names the templates may use: jax, jnp, lax, cp (jax.checkpoint_policies), checkpoint_name,
and PRELUDE's helpers.
"""
from __future__ import annotations

import inspect
from pathlib import Path

from conformance.ir.ops import dropout_mask
from conformance.ir.policy import KINDS
from conformance.pipelines.tables import Lowering, helpers_source, op_source

L = Lowering
OPS: dict[str, Lowering] = {
    "sin": L("jnp.sin({x})", ("sin",)),
    "cos": L("jnp.cos({x})", ("cos",)),
    "tanh": L("jnp.tanh({x})", ("tanh",)),
    "exp": L("jnp.exp({x})", ("exp",)),
    "sigmoid": L("jax.nn.sigmoid({x})", ("logistic",)),
    "square": L("jnp.square({x})", ("square", "integer_pow")),
    "neg": L("-{x}", ("neg",)),
    "scale": L("{x} * jnp.asarray({c}, {x}.dtype)", ("mul",)),
    "nondiff_scale": L("{x} * jnp.asarray({nondiff}, {x}.dtype)", ("mul",)),
    "add": L("{x} + {y}", ("add",)),
    "sub": L("{x} - {y}", ("sub",)),
    "mul": L("{x} * {y}", ("mul",)),
    "matmul": L("jnp.matmul({x}, {y})", ("dot_general",)),
    "sum": L("jnp.sum({x}, axis={axis})", ("reduce_sum",)),
    "mean": L("jnp.mean({x}, axis={axis})", ("reduce_sum", "div")),
    "transpose": L("jnp.transpose({x}, {perm})", ("transpose",)),
    "reshape": L("jnp.reshape({x}, {shape})", ("reshape",)),
    "broadcast": L("jnp.broadcast_to({x}, {shape})", ("broadcast_in_dim",)),
    "name": L("checkpoint_name({x}, {name})", ("name",)),
    "name_fwd": L("checkpoint_name_fwd({x}, {name})", ("name",)),
    "relu": L("jax.nn.relu({x})", ("custom_jvp_call", "max")),
    "step": L("({x} > 0).astype({x}.dtype)", ("gt", "convert_element_type")),
    "slice": L("lax.slice_in_dim({x}, {start}, {stop}, axis={axis})", ("slice",)),
    "pad": L("jnp.pad({x}, [(({before}, {after}) if i == {axis} else (0, 0)) for i in range({x}.ndim)])", ("pad",)),
    "conv1d": L("lax.conv_general_dilated({x}, {y}, (1,), 'VALID')", ("conv_general_dilated",)),
    "cast": L("{x}.astype(dt({dtype}))", ("convert_element_type",)),
    "dropout": L("{x} * jnp.asarray(dropout_mask({x}.shape, {p}, {seed}), {x}.dtype)", ("mul",)),
    "matrix_t": L("{x}.T", ("transpose",)),
    "select": L("lax.index_in_dim({x}, {index}, {axis}, keepdims=False)", ("slice", "squeeze")),
    # in-place ops are functional in JAX (the IR's consumed first arg makes the meanings agree)
    "add_": L("{x} + {y}", ("add",)),
    "mul_": L("{x} * {y}", ("mul",)),
    "relu_": L("jax.nn.relu({x})", ("custom_jvp_call", "max")),
    "effect": L("effect({x}, {kind})", ("debug_callback", "io_callback")),
    # multi-output and data-dependent ops (conformance.ir.ops.selection): the same values in jax.numpy
    "var_mean": L("jnp.var({x}, axis={axis}) + jnp.mean({x}, axis={axis})",
                  no_primitive="reduce_sum, sub, square, div and add (sum's, sub's, square's ops): an `ops` policy "
                               "naming var_mean saves nothing of its own here"),
    "topk": L("jnp.moveaxis(lax.top_k(jnp.moveaxis({x}, {axis}, -1), {k})[0], -1, {axis})", ("top_k",)),
    "max_dim": L("jnp.max({x}, axis={axis})", ("reduce_max",)),
    "sort": L("jnp.sort({x}, axis={axis})", ("sort",)),
    "masked_sum": L("jnp.sum(jnp.where({x} > 0, {x}, jnp.zeros_like({x})))",
                    no_primitive="gt, select_n and reduce_sum (step's and sum's): an `ops` policy naming masked_sum "
                                 "saves nothing of its own here"),
    "scale_by_max": L("{x} * lax.stop_gradient(jnp.max({x}))", ("mul",)),
    "grad_of_sin": L("jax.grad(lambda y: jnp.sum(jnp.sin(y)))({x})", ("cos",)),
    "functional_scale": L("{x} * jnp.asarray({c}, {x}.dtype)", ("mul",)),
}

# Policy kind -> source; {names}-like fields are the policy's lists, {a}/{b} sub-policies,
# {prims} the JAX primitives of an `ops` policy's op kinds.
POLICIES: dict[str, str] = {
    "everything": "cp.everything_saveable",
    "nothing": "cp.nothing_saveable",
    "dots": "cp.dots_saveable",
    "dots_no_batch": "cp.dots_with_no_batch_dims_saveable",
    "save_only_names": "cp.save_only_these_names(*{names})",
    "save_any_names_but_these": "cp.save_any_names_but_these(*{names})",
    "save_anything_except_names": "cp.save_anything_except_these_names(*{names})",
    "both": "cp.save_from_both_policies({a}, {b})",
    "offload_dots_no_batch": "cp.offload_dot_with_no_batch_dims('device', 'pinned_host')",
    "save_and_offload_names": ("cp.save_and_offload_only_these_names(names_which_can_be_saved={saved}, "
                               "names_which_can_be_offloaded={offloaded}, offload_src='device', "
                               "offload_dst='pinned_host')"),
    "ops": "save_prims({prims})",
    "min_elements": "save_min_elements({elements})",
    "dot_params": "save_unbatched_dots()",
    "no_policy": "None",
    "offload_ops": "offload_prims({prims})",
}

PRELUDE = inspect.getsource(dropout_mask) + "\n" + helpers_source(Path(__file__).with_name("prelude.py"))


def policy_source(p) -> str:
    """A policy as JAX source."""
    fields = {}
    for f in KINDS[p.kind].fields:
        v = getattr(p, f)
        fields[f] = policy_source(v) if f in ("a", "b") else repr(v) if f == "elements" else repr(list(v))
    if "ops" in KINDS[p.kind].fields:
        fields["prims"] = repr(sorted({pr for o in p.ops for pr in OPS[o].policy_ops}))
    return POLICIES[p.kind].format(**fields)


def checkpoint_options(s) -> dict:
    """jax.checkpoint's keyword arguments for a region's options beside its policy: prevent_cse
    (a bool, or one per argument), and how its static flag is declared (ir.nodes.STATIC_SPELLINGS;
    the flag is passed after the args, or by keyword as `flag`)."""
    out: dict = {"prevent_cse": tuple(s.prevent_cse_args) if s.prevent_cse_args else s.prevent_cse}
    if s.static_flag:
        n = 1 if s.tree != "flat" else len(s.args)   # the flag's index
        out.update({"argnums": {"static_argnums": (n,)}, "negative_argnums": {"static_argnums": (-1,)},
                    "argnames": {"static_argnames": ("flag",)},
                    "missing_argnum": {"static_argnums": (n + 1,)}}[s.static_by])
    return out


def checkpoint_options_source(s, plain: bool = False) -> str:
    """The options as source (", k=v" each); `plain`: leaving out prevent_cse=True."""
    return "".join(f", {k}={v!r}" for k, v in checkpoint_options(s).items()
                   if not (plain and k == "prevent_cse" and v is True))


def op_text(op: str, args: list[str], params: dict, nondiff: str | None) -> str:
    return op_source(OPS, op, args, params, nondiff)
