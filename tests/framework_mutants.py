"""Framework-side mutants (test-only): each changes what JAX or PyTorch itself does, as a new upstream bug
would, so that the real pipelines, oracles, roots and `--known` must report it as new. Unlike the harness's
mutants (tests/mutants.py), which misreport an observation, these patch the framework in every process of a
run: `REMAT_FRAMEWORK_MUTANT=<name>` with tests/framework_mutants_site on PYTHONPATH applies one at
interpreter start (tests/framework_mutants_site/sitecustomize.py), in the campaign, its isolated workers and a
short repro's own process alike."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from conformance.ir.policy import KINDS
from generators.swarm import COMPOSITIONS

ENV = "REMAT_FRAMEWORK_MUTANT"
SITE = Path(__file__).with_name("framework_mutants_site")


def remat3_drops_dots():
    """jax_remat3 never saves a dot_general's output, whatever the policy says (remat2 and no policy
    unchanged): a policy that saves less for one kind of value."""
    from jax._src import ad_checkpoint as ac
    original = ac._remat3

    def _remat3(f, *, policy, **kw):
        if policy is not None:
            inner = policy

            def policy(prim, *avals, **params):
                return False if prim.name == "dot_general" else inner(prim, *avals, **params)
        return original(f, policy=policy, **kw)
    ac._remat3 = _remat3


def sac_drops_first_save():
    """Eager selective activation checkpointing recomputes the first op output of each checkpoint call that its
    policy marks MUST_SAVE (an off-by-one in its cache: the entry is dropped right after it is made); compiled
    SAC unchanged."""
    from torch.utils import checkpoint as ck
    original = ck._CachingTorchDispatchMode.__torch_dispatch__

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = original(self, func, types, args, kwargs)
        if func in ck.SAC_IGNORED_OPS or ck._is_compiling(func, args, kwargs) or getattr(self, "_dropped", False):
            return out
        key = ck._sac_storage_key(func, args)
        k = self.func_counter[key] - 1
        if self.storage[key].get(k) is not ck._RECOMPUTE:   # cached: the policy asked to save it
            self.storage[key][k] = ck._RECOMPUTE
            self._dropped = True
        return out
    ck._CachingTorchDispatchMode.__torch_dispatch__ = __torch_dispatch__


def remat3_traces_regions_twice():
    """jax_remat3 stages each checkpoint region twice (the first staging's results dropped): every rule in a
    region (a custom_vjp's function and fwd, a callback) runs twice under remat3, values and residuals unchanged."""
    from functools import wraps

    from jax._src import ad_checkpoint as ac
    original = ac._remat3

    def _remat3(f, **kw):
        staged = original(f, **kw)

        @wraps(f)
        def twice(*args, **kwargs):   # (a fresh function: JAX's trace cache would reuse the first staging)
            original(wraps(f)(lambda *a, **k: f(*a, **k)), **kw)(*args, **kwargs)
            return staged(*args, **kwargs)
        return twice
    ac._remat3 = _remat3


def partitioner_ignores_must_save():
    """torch.compile's min-cut partitioner reads every node a policy marks MUST_SAVE as PREFER_RECOMPUTE (a tag
    lost in a graph pass): its backward graph computes again what it finds cheap to; eager SAC unchanged."""
    import torch
    from torch._functorch import partitioners
    from torch.utils.checkpoint import CheckpointPolicy
    original = partitioners.min_cut_rematerialization_partition

    def min_cut_rematerialization_partition(joint_module, *args, **kwargs):
        for n in joint_module.graph.nodes:
            if n.meta.get("recompute") == CheckpointPolicy.MUST_SAVE and isinstance(n.meta.get("val"), torch.Tensor):
                n.meta["recompute"] = CheckpointPolicy.PREFER_RECOMPUTE
        return original(joint_module, *args, **kwargs)
    partitioners.min_cut_rematerialization_partition = min_cut_rematerialization_partition


def both_policies_ignore_the_second():
    """save_from_both_policies(p, q) decides as p alone, ignoring q (jax before 0.4.38 did so where p was an
    offloading policy: its Recompute decision is truthy): JAX's reference implementation, remat2, then recomputes
    what the combined policy saves; remat3 reads the same policy function, so the two still agree."""
    import jax
    from jax._src import ad_checkpoint as ac

    def save_from_both_policies(policy_1, policy_2):
        return lambda prim, *args, **params: policy_1(prim, *args, **params)
    ac.save_from_both_policies = save_from_both_policies
    jax.checkpoint_policies.save_from_both_policies = save_from_both_policies


def _other_policies(*kinds: str) -> list[str]:   # the policy dimensions but `kinds`' (regions: those or nothing)
    return [f"policy:{k}" for k in KINDS if k not in ("nothing", *kinds)]


# name -> (patch, the campaign that shows it: its rivals, the swarm dimensions it requires and those it leaves out,
# and any other options of its run)
MUTANTS = {
    # (regions save dots or nothing, no custom rules or compositions: the dots the mutant drops are in plain regions)
    "remat3-drops-dots": (remat3_drops_dots, ["jax:remat3"], ["checkpoint", "family:matmul", "policy:dots"],
                          [*COMPOSITIONS, "custom_vjp", "custom_jvp", *_other_policies("dots")],
                          ["--max-examples", "40"]),
    # (PyTorch runs none of the JAX-only compositions, nor custom_jvp: left out, not spent on unsupported programs;
    # regions save everything or nothing)
    "sac-drops-first-save": (sac_drops_first_save, ["torch:eager-sac"], ["checkpoint", "policy:everything"],
                             [*COMPOSITIONS, "custom_jvp", *_other_policies("everything")], ["--max-examples", "40"]),
    # (a custom_vjp in a region, no policy needed; first order: one trace count per rule)
    "remat3-traces-regions-twice": (remat3_traces_regions_twice, ["jax:remat3"], ["checkpoint", "custom_vjp"],
                                    [*COMPOSITIONS, "custom_jvp", "second_order"], ["--max-examples", "40"]),
    # (the compiled half: the same campaign shape on torch.compile's aot_eager backend, first order and one
    # example per program: aot_autograd runs no double backward, and the compiled family's share is a fifth; no
    # random ops: a dropout the mutant makes recomputable fails compilation, a finding of its own the campaign
    # would shrink first)
    "partitioner-ignores-must-save": (partitioner_ignores_must_save, ["torch:compile-aot_eager"],
                                      ["checkpoint", "policy:everything"],
                                      [*COMPOSITIONS, "custom_jvp", "second_order", "per_example", "family:random",
                                       *_other_policies("everything")],
                                      ["--share", "torch:compile=1", "--max-examples", "20"]),
    # (regions save both(p, q) of nothing and everything, or one of those; plain ops, first order: where the
    # no-checkpoint program is the reference of remat2's saving policies)
    "both-policies-ignore-the-second": (both_policies_ignore_the_second, ["jax:remat2"], ["checkpoint", "policy:both"],
                                        [*COMPOSITIONS, "custom_vjp", "custom_jvp", "second_order", "per_example",
                                         "diff_modes", "family:random", "nested_jit", "scan", "cond", "dead_values",
                                         *_other_policies("everything", "both")],
                                        ["--seed", "1", "--max-examples", "80"]),
}


def apply_from_env() -> None:
    name = os.environ.get(ENV, "")
    if name:
        if name not in MUTANTS:
            sys.exit(f"{ENV}: unknown framework mutant {name!r}; known: {', '.join(MUTANTS)}")
        MUTANTS[name][0]()


def env(name: str | None) -> dict[str, str]:
    """A process environment with framework mutant `name` applied (None: none)."""
    e = {k: v for k, v in os.environ.items() if k != ENV}
    if name:
        e[ENV] = name
        e["PYTHONPATH"] = os.pathsep.join([str(SITE), str(SITE.parent.parent)]
                                          + [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p])
    return e
