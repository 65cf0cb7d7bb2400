"""The JAX pipelines (remat2 / remat3 / custom_vjp3, eager and jit), their lowering table and the
per-campaign XLA compile cache. Imports jax, conformance.ir and conformance.pipelines."""
