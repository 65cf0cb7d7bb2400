"""One eager executable per primitive, whichever remat flags are set.

JAX keys its eager primitive cache (dispatch.xla_primitive_callable, then the jit it returns) by
every config flag marked include_in_jit_key, jax_remat3, jax_custom_vjp3 and jax_custom_jvp3
among them. The eager pipelines of one program differ only in those flags, so each compiles the
same `sin` of the same shape again. The flags are read at only five places, all at trace time of
the user-facing API (jax.checkpoint, checkpoint_name, checkpoint_name_fwd, custom_vjp.__call__,
custom_jvp.__call__: `grep -n "remat3.value\\|custom_[jv]\\{2\\}p3.value" jax/_src`), never by
a lowering rule, so a first-order primitive (no jaxpr or function among its parameters) compiles
to the same executable under any of them. `share()` makes eager dispatch of such a primitive look
up, compile and run it under the flags all off: one executable for every flag setting. Higher-order
primitives (remat, custom rules, control flow) keep the flags they are called under.

Most eager ops are not primitives but jitted jax.numpy functions (`jnp.cos`, `x * y`). Under an
eager transformation (the linearize of `jax.vjp`, a vmap) JAX binds their `jit` primitive with a
transformed jaxpr, a new object each time; JAX keys its compiled `jit` calls by that object and
holds it weakly, so the same `cos` of the same shape compiles again in every program. `share()`
also maps such a jaxpr, when it is first-order (no jaxpr or function among its equations'
parameters, no constants, no effects, scalar literals only), to the first one of the same text,
types and parameters, held for the process, and calls it under the flags all off.

Off (JAX's own per-flag cache) when REMAT_CONFORMANCE_FRAMEWORK_DEFAULTS is set: the matrix's
framework-defaults cell runs so, so that a difference only a per-flag compile shows is still seen.

Imports jax only when `share()` runs.
"""
from __future__ import annotations

import os

DEFAULTS_ENV = "REMAT_CONFORMANCE_FRAMEWORK_DEFAULTS"
FLAGS = ("remat3", "custom_vjp3", "custom_jvp3")   # jax._src.config states of the remat variants
_installed: list = []


def framework_defaults() -> bool:
    """Whether this process runs JAX exactly as configured (no shared eager cache, eager references)."""
    return os.environ.get(DEFAULTS_ENV, "").lower() not in ("", "0", "off", "false", "no")


def share() -> bool:
    """Install the shared eager cache (once per process); False under framework defaults or where
    this JAX lacks the hook or a flag (an older release: its own cache is kept)."""
    if _installed:
        return _installed[0] is not None
    from jax._src import config, core, dispatch
    states = [getattr(config, f, None) for f in FLAGS]
    if framework_defaults() or not hasattr(dispatch, "xla_primitive_callable") or None in states:
        _installed.append(None)
        return False
    original = dispatch.xla_primitive_callable
    jaxpr_types = tuple(t for t in (core.Jaxpr, getattr(core, "ClosedJaxpr", None)) if t is not None)

    def higher_order(v) -> bool:
        if isinstance(v, (tuple, list)):
            return any(higher_order(x) for x in v)
        return isinstance(v, jaxpr_types) or callable(v)

    def flags_off(fn):
        def call(*args, **kwargs):
            prev = [s.swap_local(False) for s in states]
            try:
                return fn(*args, **kwargs)
            finally:
                for s, p in zip(states, prev):
                    s.set_local(p)
        return call

    lookup = flags_off(original)

    def shared(prim, **params):
        if any(higher_order(v) for v in params.values()):
            return original(prim, **params)
        return flags_off(lookup(prim, **params))

    dispatch.xla_primitive_callable = shared
    _share_jit(core, jaxpr_types, higher_order, flags_off)
    _installed.append(original)
    return True


CANONICAL_LIMIT = 50_000   # distinct first-order jaxprs held; beyond it the table starts again


def _share_jit(core, jaxpr_types, higher_order, flags_off) -> None:
    """Eager `jit` calls of first-order jaxprs: one canonical jaxpr per (text, types, parameters)."""
    import weakref

    import numpy as np
    from jax._src import pjit
    jit_p = getattr(pjit, "jit_p", None) or getattr(pjit, "pjit_p", None)
    if jit_p is None or getattr(jit_p.impl, "_remat_conformance_shared", False):
        return
    original = jit_p.impl
    original_flags_off = flags_off(original)
    canonical: dict = {}
    keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def first_order(closed) -> bool:
        if getattr(closed, "consts", None) or closed.effects:
            return False
        for eqn in closed.jaxpr.eqns:
            if eqn.effects or any(higher_order(v) for v in eqn.params.values()):
                return False
            if any(isinstance(v, core.Literal) and np.ndim(v.val) > 0 for v in eqn.invars):
                return False
        return True

    def key_of(closed, params):
        try:
            k = keys.get(closed)
        except TypeError:   # not weakly referable: no sharing
            return None
        if k is None:
            j = closed.jaxpr
            k = (str(j), tuple(v.aval for v in j.invars), tuple(getattr(v, "aval", None) for v in j.outvars)) \
                if first_order(closed) else ()
            keys[closed] = k
        if not k:
            return None
        return (k, tuple(sorted(params.items())))

    def shared(*args, jaxpr, **params):
        key = key_of(jaxpr, params)
        if key is not None:
            if len(canonical) >= CANONICAL_LIMIT:
                canonical.clear()
            try:
                same = canonical.setdefault(key, jaxpr)
            except TypeError:   # an unhashable parameter: JAX's own path
                key = None
        if key is None:
            return original(*args, jaxpr=jaxpr, **params)
        return original_flags_off(*args, jaxpr=same, **params)

    shared._remat_conformance_shared = True
    jit_p.def_impl(shared)
