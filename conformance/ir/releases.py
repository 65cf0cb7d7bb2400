"""What each framework release has: every API the harness (and its short repros) use that a release may lack,
declared once with the first release that has it (and the first without it, where one was removed).

An API is named where it is used: a program feature (ir.features FEATURES), a policy kind (ir.policy KINDS) and a
pipeline (pipelines.registry Spec.needs) list the APIs they need. From these:
- a campaign generates no program with a feature the installed release lacks, and skips (and lists) a pipeline
  whose API it lacks (`lacking`, read from the installed packages' metadata, no framework imported);
- a pipeline calls a program it cannot express on this release unsupported, by the API's `probe` evaluated
  against the imported framework (`probe_lacking`);
- a short repro checks the probes of the APIs its source uses (`used_by`) before it runs and exits with
  CANNOT_RUN where one is missing, so `bisect` tells "cannot run here" from "fixed";
- `bisect` skips the releases before an API the repro needs.
The probes are checked against the declared releases on the installed release (tests/test_releases.py).

Program layer: no framework import.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata

from packaging.version import InvalidVersion, Version

# A short repro's exit status where it cannot check the behaviour on this release (an API it lacks, or any
# failure before the check); 1 reproduces, 0 fixed.
CANNOT_RUN = 3
# The first release of each framework with wheels for the Python the harness runs on (3.12), the oldest `env`
# and `bisect` try (jaxlib 0.4.17 has no Python 3.12 wheel on PyPI: 0.4.18 is the first).
OLDEST = {"jax": "0.4.18", "torch": "2.2.0"}
PACKAGES = {"jax": "jax", "torch": "torch"}
FRAMEWORKS = tuple(PACKAGES)


@dataclass(frozen=True)
class API:
    framework: str
    since: str                # the first release that has it
    probe: str                # a Python expression over the framework's modules (jax, lax, torch, inspect ...):
                              # true where the imported release has it
    uses: str                 # a regular expression that finds a use of it in a script's source
    until: str | None = None  # the first release without it (removed), if any

    def in_release(self, version: str | Version) -> bool:
        v = parse(version)
        return v is not None and v >= Version(self.since) and (self.until is None or v < Version(self.until))


def _sig(fn: str, kw: str) -> str:
    return f"{kw!r} in inspect.signature({fn}).parameters"


def _at_least(framework: str, version: str) -> str:
    """A probe that reads the release number (where no attribute tells the behaviour apart)."""
    want = tuple(int(x) for x in version.split("."))
    return (f"tuple(int(x) for x in {framework}.__version__.split('+')[0].split('.')[:{len(want)}] "
            f"if x.isdigit()) >= {want}")


def _jax_flag(flag: str) -> API:
    # a flag is needed where a script turns it on; off, it is what a release without it does
    return API("jax", {"jax_remat3": "0.10.2", "jax_custom_vjp3": "0.9.1", "jax_custom_jvp3": "0.11.1"}[flag],
               f"hasattr(jax.config, {flag!r})", rf"[\"']{flag}[\"']\s*:\s*True")


APIS: dict[str, API] = {
    # -- JAX --
    "jax.checkpoint(static_argnames=)": API("jax", "0.10.2", _sig("jax.checkpoint", "static_argnames"),
                                             r"static_argnames="),
    "jax_remat3": _jax_flag("jax_remat3"),
    "jax_custom_vjp3": _jax_flag("jax_custom_vjp3"),
    "jax_custom_jvp3": _jax_flag("jax_custom_jvp3"),
    "jax.ad_checkpoint.checkpoint_name_fwd": API("jax", "0.11.2",
                                                 "hasattr(__import__('jax.ad_checkpoint', fromlist=['_']), "
                                                 "'checkpoint_name_fwd')",
                                                 r"\bcheckpoint_name_fwd\b"),
    # a jax.new_ref a checkpoint region closes over (jax.new_ref came with 0.7.2; before 0.10.0 partial eval of
    # `checkpoint` raises NotImplementedError "Effects not supported" on its reads and writes, by design)
    "jax.new_ref": API("jax", "0.10.0", "hasattr(jax, 'new_ref') and " + _at_least("jax", "0.10.0"),
                       r"\bjax\.new_ref\("),
    "custom_vjp.defremat": API("jax", "0.12.0", "hasattr(jax.custom_vjp(lambda x: x), 'defremat')",
                               r"\.defremat\("),
    "jax.custom_gradient(remat=)": API("jax", "0.12.0", _sig("jax.custom_gradient", "remat"),
                                       r"custom_gradient\([^)]*remat="),
    "defvjp(optimize_remat=)": API("jax", "0.4.33", _sig("jax.custom_vjp(lambda x: x).defvjp", "optimize_remat"),
                                   r"optimize_remat=True"),
    "defvjp(symbolic_zeros=)": API("jax", "0.4.18", _sig("jax.custom_vjp(lambda x: x).defvjp", "symbolic_zeros"),
                                   r"symbolic_zeros=True"),
    "jax.shard_map": API("jax", "0.6.1", "hasattr(jax, 'shard_map')", r"\bjax\.shard_map\("),
    "jax.make_mesh(axis_types=)": API("jax", "0.5.3", "hasattr(jax, 'make_mesh') and "
                                      + _sig("jax.make_mesh", "axis_types"), r"axis_types="),
    # the harness's io_callback (on a stop_gradient value) under jax.grad raises before 0.4.38, ordered (probed) or
    # not ("IO callbacks do not support JVP", seen on 0.4.30)
    "io_callback(ordered=True) under jax.grad": API("jax", "0.4.38", _at_least("jax", "0.4.38"), r"\bio_callback\("),
    "jax.tree": API("jax", "0.4.25", "hasattr(jax, 'tree')", r"\bjax\.tree\."),
    # offloading to pinned_host on the CPU under jax.grad (eager; under jit from 0.4.33): the policies exist earlier
    # (0.4.25) but raise on the CPU; no attribute tells, the release does
    "checkpoint offload to pinned_host on the CPU": API("jax", "0.7.1", _at_least("jax", "0.7.1"), r"pinned_host"),
    "checkpoint_policies.save_from_both_policies": API(
        "jax", "0.4.18", "hasattr(jax.checkpoint_policies, 'save_from_both_policies')", r"save_from_both_policies"),
    "checkpoint_policies.save_any_names_but_these": API(
        "jax", "0.4.18", "hasattr(jax.checkpoint_policies, 'save_any_names_but_these')", r"save_any_names_but_these"),
    "checkpoint_policies.save_anything_except_these_names": API(
        "jax", "0.4.18", "hasattr(jax.checkpoint_policies, 'save_anything_except_these_names')",
        r"save_anything_except_these_names"),
    "checkpoint_policies.save_and_offload_only_these_names": API(
        "jax", "0.4.25", "hasattr(jax.checkpoint_policies, 'save_and_offload_only_these_names')",
        r"save_and_offload_only_these_names"),
    "checkpoint_policies.offload_dot_with_no_batch_dims": API(
        "jax", "0.4.25", "hasattr(jax.checkpoint_policies, 'offload_dot_with_no_batch_dims')",
        r"offload_dot_with_no_batch_dims"),
    # -- PyTorch --
    "torch.utils.checkpoint.create_selective_checkpoint_contexts": API(
        "torch", "2.5.0", "hasattr(torch.utils.checkpoint, 'create_selective_checkpoint_contexts')",
        r"\bcreate_selective_checkpoint_contexts\b"),
    "create_selective_checkpoint_contexts(allow_cache_entry_mutation=)": API(
        "torch", "2.5.0", _sig("torch.utils.checkpoint.create_selective_checkpoint_contexts",
                               "allow_cache_entry_mutation"), r"allow_cache_entry_mutation="),
    "CheckpointPolicy.MUST_CPU_OFFLOAD": API(
        "torch", "2.11.0", "hasattr(getattr(torch.utils.checkpoint, 'CheckpointPolicy', None), 'MUST_CPU_OFFLOAD')",
        r"_CPU_OFFLOAD\b"),
    "torch._functorch.config.activation_memory_budget": API(
        "torch", "2.4.0", "hasattr(__import__('torch._functorch.config', fromlist=['_']), 'activation_memory_budget')",
        r"activation_memory_budget"),
    "torch.export.export(strict=)": API("torch", "2.3.0", "hasattr(torch, 'export') and "
                                        + _sig("torch.export.export", "strict"), r"torch\.export\.export\("),
    # inductor's partitioner as a setting: the harness records what inductor's min-cut saves through it
    "torch._inductor.config.custom_partitioner_fn": API(
        "torch", "2.9.0", "hasattr(__import__('torch._inductor.config', fromlist=['_']), 'custom_partitioner_fn')",
        r"custom_partitioner_fn"),
    "torch.library.custom_op": API("torch", "2.4.0", "hasattr(torch.library, 'custom_op')",
                                   r"torch\.library\.custom_op\b"),
    "torch.autograd.grad(materialize_grads=)": API("torch", "2.1.0", _sig("torch.autograd.grad", "materialize_grads"),
                                                   r"materialize_grads="),
}


def parse(version: str | Version | None) -> Version | None:
    """A release's version without its local part (2.14.1+cu130 -> 2.14.1); None where unreadable."""
    if isinstance(version, Version):
        return version
    try:
        return Version(str(version).split("+")[0]) if version else None
    except InvalidVersion:
        return None


@lru_cache(maxsize=None)
def installed(framework: str) -> str | None:
    """The installed release of a framework (its package metadata; nothing imported), None if absent."""
    try:
        return metadata.version(PACKAGES[framework])
    except metadata.PackageNotFoundError:
        return None


def lacking(names, versions: dict[str, str] | None = None) -> list[str]:
    """Of these APIs, those the given releases (default: the installed ones) lack; an absent framework lacks all of
    its APIs."""
    out = []
    for n in names:
        api = APIS[n]
        v = (versions or {}).get(api.framework) if versions is not None else installed(api.framework)
        if v is None or not api.in_release(v):
            out.append(n)
    return out


def why(names, versions: dict[str, str] | None = None) -> str:
    """'jax 0.8.0 lacks jax.new_ref (first in 0.7.1), ...' for APIs a release lacks."""
    parts = []
    for n in names:
        api = APIS[n]
        v = (versions or {}).get(api.framework) if versions is not None else installed(api.framework)
        first = f"first in {api.since}" + (f", removed in {api.until}" if api.until else "")
        parts.append(f"{api.framework} {v or '(not installed)'} lacks {n} ({first})")
    return "; ".join(parts)


def probe_lacking(names, namespace: dict) -> list[str]:
    """Of these APIs, those whose probe fails in a namespace holding the imported framework."""
    out = []
    for n in names:
        try:
            ok = bool(eval(APIS[n].probe, {"inspect": __import__("inspect"), **namespace}))   # noqa: S307 - own table
        except Exception:   # noqa: BLE001 - a probe that cannot run: the release lacks what it reads
            ok = False
        if not ok:
            out.append(n)
    return out


def used_by(source: str, framework: str) -> list[str]:
    """The APIs of a framework a script's source uses."""
    return [n for n, a in APIS.items() if a.framework == framework and re.search(a.uses, source)]


def oldest_with(names) -> dict[str, Version]:
    """Per framework, the first release that has every one of these APIs."""
    out: dict[str, Version] = {}
    for n in names:
        a = APIS[n]
        out[a.framework] = max(out.get(a.framework, Version(OLDEST[a.framework])), Version(a.since))
    return out
