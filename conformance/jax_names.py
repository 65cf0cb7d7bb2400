"""JAX names as plain data (no jax import): the flags of each remat variant and the JAX
primitives of each IR op. Shared by the JAX pipelines and the repro emitter."""

# Variant -> the JAX flags it runs under. Every run sets all of them and restores them after.
VARIANT_FLAGS: dict[str, dict[str, bool]] = {
    "remat2": {"jax_remat3": False, "jax_custom_vjp3": False},
    "remat3": {"jax_remat3": True, "jax_custom_vjp3": False},
    "remat3+cvjp3": {"jax_remat3": True, "jax_custom_vjp3": True},
}

# IR op kind -> JAX primitive names (for the `ops` custom-predicate policy).
OP_PRIMS: dict[str, tuple[str, ...]] = {
    "sin": ("sin",), "cos": ("cos",), "tanh": ("tanh",), "exp": ("exp",),
    "sigmoid": ("logistic",), "square": ("square", "integer_pow"), "neg": ("neg",),
    "scale": ("mul",), "add": ("add",), "sub": ("sub",), "mul": ("mul",),
    "matmul": ("dot_general",), "sum": ("reduce_sum",), "mean": ("reduce_sum", "div"),
    "transpose": ("transpose",), "reshape": ("reshape",), "broadcast": ("broadcast_in_dim",),
    "name": ("name",),
}
