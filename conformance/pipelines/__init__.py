"""Pipeline registry. Frameworks are imported lazily, only when a pipeline of theirs is used:
one registry line per pipeline, one class per pipeline (in the framework's own module)."""
from __future__ import annotations

import importlib

from conformance.pipelines.base import Pipeline

# name -> (module, class, constructor kwargs)
REGISTRY: dict[str, tuple[str, str, dict]] = {
    "ref:f64": ("conformance.pipelines.jax_pipelines", "JaxReference", {}),
    "jax:none": ("conformance.pipelines.jax_pipelines", "JaxNoRemat", {}),
    "jax:remat2": ("conformance.pipelines.jax_pipelines", "JaxRemat", {"variant": "remat2"}),
    "jax:remat2:jit": ("conformance.pipelines.jax_pipelines", "JaxRemat", {"variant": "remat2", "jit": True}),
    "jax:remat3": ("conformance.pipelines.jax_pipelines", "JaxRemat", {"variant": "remat3"}),
    "jax:remat3:jit": ("conformance.pipelines.jax_pipelines", "JaxRemat", {"variant": "remat3", "jit": True}),
    "jax:remat3+cvjp3": ("conformance.pipelines.jax_pipelines", "JaxRemat", {"variant": "remat3+cvjp3"}),
    "jax:remat3+cvjp3:jit": ("conformance.pipelines.jax_pipelines", "JaxRemat", {"variant": "remat3+cvjp3", "jit": True}),
    # torch
    "torch:none": ("conformance.pipelines.torch_pipelines", "TorchNoRemat", {}),
    "torch:eager-sac": ("conformance.pipelines.torch_pipelines", "TorchSAC", {}),
    "torch:eager-sac:prefer": ("conformance.pipelines.torch_pipelines", "TorchSAC", {"prefer": True}),
    "torch:compile-aot_eager": ("conformance.pipelines.torch_pipelines", "TorchSAC", {"compile": "aot_eager"}),
    "torch:compile-aot_eager:prefer": ("conformance.pipelines.torch_pipelines", "TorchSAC", {"compile": "aot_eager", "prefer": True}),
    "torch:compile-aot_eager+default-partitioner": ("conformance.pipelines.torch_pipelines", "TorchSAC", {"compile": "aot_eager", "partitioner": "default"}),
    "torch:compile-aot_eager+default-partitioner:prefer": ("conformance.pipelines.torch_pipelines", "TorchSAC", {"compile": "aot_eager", "partitioner": "default", "prefer": True}),
    "torch:compile-inductor": ("conformance.pipelines.torch_pipelines", "TorchSAC", {"compile": "inductor"}),
    "torch:compile-inductor:prefer": ("conformance.pipelines.torch_pipelines", "TorchSAC", {"compile": "inductor", "prefer": True}),
}

# Added automatically to every run: the value reference, the same-dtype no-remat
# reference, and the residual/error reference.
REFERENCES = ("ref:f64", "jax:none", "jax:remat2")
# Added to runs that include PyTorch pipelines: the same-dtype baseline and the eager SAC
# reference that compiled PyTorch is compared with.
TORCH_REFERENCES = ("torch:none", "torch:eager-sac")
DEFAULT_PIPELINES = ("jax:remat2:jit", "jax:remat3", "jax:remat3:jit", "jax:remat3+cvjp3", "jax:remat3+cvjp3:jit")

_extra: dict[str, Pipeline] = {}   # test-only pipelines (mutants, fault injection)


class UnknownPipeline(ValueError):
    pass


def register_instance(p: Pipeline) -> None:
    """Register a ready pipeline object (used by the harness's own tests for mutants)."""
    _extra[p.name] = p


def known_names() -> list[str]:
    return list(REGISTRY) + list(_extra)


_cache: dict[str, Pipeline] = {}


def get(name: str) -> Pipeline:
    if name in _extra:
        return _extra[name]
    if name in _cache:
        return _cache[name]
    if name not in REGISTRY:
        raise UnknownPipeline(f"unknown pipeline {name!r}; known: {', '.join(known_names())}")
    mod, cls, kw = REGISTRY[name]
    p = getattr(importlib.import_module(mod), cls)(name=name, **kw)
    _cache[name] = p
    return p
