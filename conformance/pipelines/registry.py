"""The pipeline registry: every pipeline declared once, as data.

An entry names the framework, the class that runs it (in the framework's own module,
imported lazily, so the rest loads without that framework), its variant settings (JAX
flags, jit, torch.compile backend and partitioner, PREFER_* hints), its role, and which
references it is compared with. The judge, campaign, CLI, repro and report read these
entries; nothing outside this module parses pipeline names.

Roles:
  value      the value reference (float64, no checkpoint, custom rules kept)
  baseline   a framework's same-dtype no-checkpoint run (the tight value check)
  reference  the residual, custom-rule and error reference (judged itself against the policy)
  rival      everything else: judged against the value references, the policy and `compare`

Importing this module loads no pipeline code and no framework (the oracles read it); the
pipeline modules of this package import the IR, the observation type and their own
framework, loaded lazily by `get`.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from conformance import __version__
from conformance.ir import releases

if TYPE_CHECKING:   # the registry is data: importing it loads no pipeline code
    from conformance.pipelines.base import Pipeline

VALUE, BASELINE, REFERENCE, RIVAL = "value", "baseline", "reference", "rival"
MODULES = {"jax": "conformance.pipelines.jax.pipelines", "torch": "conformance.pipelines.torch.pipelines"}
FRAMEWORKS = tuple(MODULES)
# JAX remat variant -> the flags it runs under. Every run sets all of them and restores them after.
JAX_VARIANT_FLAGS: dict[str, dict[str, bool]] = {
    "remat2": {"jax_remat3": False, "jax_custom_vjp3": False, "jax_custom_jvp3": False},
    "remat3": {"jax_remat3": True, "jax_custom_vjp3": False, "jax_custom_jvp3": False},
    "remat3+cvjp3": {"jax_remat3": True, "jax_custom_vjp3": True, "jax_custom_jvp3": False},
    "remat3+cjvp3": {"jax_remat3": True, "jax_custom_vjp3": False, "jax_custom_jvp3": True},
}
# Variants whose pipelines are in the default set (remat3+cjvp3 changes custom_jvp blocks only:
# a campaign over custom_jvp names it).
DEFAULT_VARIANTS = ("remat2", "remat3", "remat3+cvjp3")
# activation_memory_budget values below 1 that torch pipelines run (each its own pipeline).
MEMORY_BUDGETS = (0.5, 0.0)
# Spec's PyTorch checkpoint and compile options (on/off): recorded in a run's flags when on,
# carried by repro scripts.
TORCH_OPTIONS = ("reentrant", "checks_off", "compile_inside", "backward_twice", "dynamic", "graph_break",
                 "policy_state", "sequential", "hooks", "early_stop_off", "export", "functional_call", "func_vmap",
                 "allow_mutation", "func_grad")
# Saved-tensor hooks a pipeline runs its forward under (Spec.hooks): torch.autograd.graph.save_on_cpu; a
# user's own saved_tensors_hooks (pack: a float64 copy and the dtype, unpack: back), with
# respect_saved_tensors_hooks=True; the same hooks with respect_saved_tensors_hooks=False (SAC's cache
# bypasses them).
HOOK_KINDS = ("save_on_cpu", "user", "user_bypassed", "disabled")   # disabled: disable_saved_tensors_hooks
EXPORT_KINDS = ("strict", "nonstrict")
EXPORT_SHARES = (0.2, 0.3)   # the fraction of the programs each export pipeline of the default set runs on
# CPU devices a run needs (JAX's jax_num_cpu_devices, set before JAX starts: the campaign sets this variable for its
# processes when a pipeline needs more than one device).
CPU_DEVICES_ENV = "REMAT_CONFORMANCE_CPU_DEVICES"
SHARD_MAP_DEVICES = 2


class CompareMode(StrEnum):
    """How a rival is compared with a reference pipeline: a closed set (the judge dispatches on it
    by a table that names every mode; a misspelt mode fails when the registry is built)."""
    SAME = "same"       # same framework and semantics: all residuals, custom rules, trace counts
    EAGER = "eager"     # compiled against eager PyTorch: values, named residuals, what rules received
    CROSS = "cross"     # PyTorch against JAX: values, and the named residuals the policy decides
    VALUES = "values"   # values only (a checkpoint that honours no policy, against one that does)
    BUDGET = "budget"   # a lower activation_memory_budget than the reference's: must not save more bytes


@dataclass(frozen=True)
class Compare:
    """Compare a rival with the first of `refs` that ran, in `mode`."""
    refs: tuple[str, ...]
    mode: CompareMode

    def __post_init__(self):
        object.__setattr__(self, "mode", CompareMode(self.mode))   # ValueError names a misspelt mode


@dataclass(frozen=True)
class Share:
    """A pipeline whose verdicts mostly follow from a cheaper `sibling`'s runs on `fraction` of the
    programs while the sibling runs too (programs chosen by content hash: the same programs for
    every pipeline of one fraction, on any machine, on resume). `dtypes`: the share holds only on
    programs whose every value has one of these dtypes (elsewhere the pipeline runs on all).
    `why`: what the fraction is sized by (tools/information.py measures it)."""
    fraction: float
    sibling: str
    why: str
    dtypes: frozenset | None = None

    def __post_init__(self):
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"a share's fraction must be in (0, 1], got {self.fraction}")

    def holds_on(self, dtypes) -> bool:
        """Whether the share holds on a program whose values have these dtypes."""
        return self.dtypes is None or set(dtypes) <= self.dtypes


@dataclass(frozen=True)
class Spec:
    name: str                        # framework:settings, e.g. jax:remat3:jit
    framework: str                   # jax or torch (the value reference ref:f64 runs in JAX)
    cls: str                         # the class that runs it, in the framework's pipeline module
    role: str = RIVAL                # value, baseline, reference or rival (the module's docstring)
    remat: bool = True               # checkpoint regions as checkpoints (False: the no-checkpoint references)
    f64: bool = False                # every value in float64 (the value reference)
    jit: bool = False                # JAX: forward and backward under jax.jit (else eager)
    variant: str = "remat2"          # JAX: the remat variant (its flags)
    compile: str | None = None       # torch: the torch.compile backend
    partitioner: str = "min_cut"     # torch aot_eager: min_cut or default
    prefer: bool = False             # torch: PREFER_* instead of MUST_*
    reentrant: bool = False          # torch: use_reentrant=True (no policy: whole regions recomputed)
    checks_off: bool = False         # torch: determinism_check="none" (and debug=True without a policy)
    memory_budget: float = 1.0       # torch min-cut partitioner: functorch's activation_memory_budget
    compile_inside: bool = False     # torch: eager checkpoint of region functions compiled with `compile`
    backward_twice: bool = False     # torch: backward twice (retain_graph=True the first time); the second's gradients
    dynamic: bool = False            # torch.compile: every input dim of size >= 2 maybe_mark_dynamic (dynamic shapes)
    graph_break: bool = False        # torch.compile: a graph break at the start of every checkpoint region's function
    preserve_rng_state: bool = True  # torch checkpoint's preserve_rng_state (False: test-only mutants)
    policy_state: str = ""           # torch: "every_other", a stateful policy_fn per checkpoint call (sac_policy)
    sequential: bool = False         # torch: chained regions without a policy as checkpoint_sequential
    hooks: str = ""                  # torch: the forward under saved-tensor hooks (HOOK_KINDS)
    early_stop_off: bool = False     # torch: the forward under set_checkpoint_early_stop(False)
    export: str = ""                 # torch: torch.export.export (EXPORT_KINDS) of the program as a module, then
                                     # its .module() run and differentiated eagerly
    functional_call: bool = False    # torch: the differentiated inputs as a module's parameters, called through
                                     # torch.func.functional_call
    func_vmap: bool = False          # torch: vmap-spelled loops as torch.func.vmap (else Python loops)
    allow_mutation: bool = False     # torch: SAC's allow_cache_entry_mutation=True (its mutated-cache check off)
    func_grad: bool = False          # torch: gradients by torch.func.grad_and_value (else torch.autograd.grad)
    shard_map: bool = False          # JAX: the program inside jax.shard_map over SHARD_MAP_DEVICES CPU devices,
                                     # inputs and outputs replicated (each device runs it whole), differentiated outside
    sharded: bool = False            # JAX: jax.jit over inputs placed with NamedSharding on SHARD_MAP_DEVICES CPU
                                     # devices (a leading axis that divides evenly is split, the rest replicated)
    compare: tuple[Compare, ...] = ()   # the pipelines it is judged against, the first that ran, and how
    added_with: frozenset = field(default_factory=frozenset)   # added to runs with rivals of these frameworks
    default: bool = False            # in the default set of rivals
    # JAX: also record JAX's own residual report (saved_residuals) of the function it
    # differentiates, judged against the closure. Only traced (jit) runs: eager vjp shares one
    # buffer between equal concrete values (a name and its producer), which the report of the
    # traced function cannot know.
    residual_report: bool = False
    repro_default: bool = False      # the framework's pipeline for repros of bare programs
    share: Share | None = None       # runs on a fraction of the programs its sibling runs on

    def __post_init__(self):
        if self.hooks not in ("", *HOOK_KINDS):
            raise ValueError(f"{self.name}: hooks must be one of {HOOK_KINDS}, got {self.hooks!r}")
        if self.export not in ("", *EXPORT_KINDS):
            raise ValueError(f"{self.name}: export must be one of {EXPORT_KINDS}, got {self.export!r}")

    @property
    def flags(self) -> dict[str, bool]:
        return dict(JAX_VARIANT_FLAGS[self.variant]) if self.framework == "jax" else {}

    @property
    def needs(self) -> tuple[str, ...]:
        """The release APIs (conformance.ir.releases) the pipeline runs with, whatever the program."""
        if self.framework not in releases.PACKAGES:   # (a test-only pipeline)
            return ()
        if self.framework == "jax":
            return (tuple(f for f, on in self.flags.items() if on) + (("jax.shard_map",) if self.shard_map else ())
                    + (("jax.make_mesh(axis_types=)",) if self.shard_map or self.sharded else ()))
        out = []
        if self.remat and not self.reentrant:   # a policy is a selective-checkpoint context
            out.append("torch.utils.checkpoint.create_selective_checkpoint_contexts")
        if self.memory_budget < 1:
            out.append("torch._functorch.config.activation_memory_budget")
        if self.compile == "inductor":
            out.append("torch._inductor.config.custom_partitioner_fn")
        if self.export:
            out.append("torch.export.export(strict=)")
        if self.allow_mutation:
            out.append("create_selective_checkpoint_contexts(allow_cache_entry_mutation=)")
        return tuple(out)


# The `:jit` twins: no corpus root, and no root of two 30-minute default campaigns, was detected by
# a `:jit` pipeline alone: an eager default pipeline detects each too (tools/information.py,
# printed by `make bench`). A tenth of the programs (was a quarter): they cost a tenth of a default program each
# and a 240 s default campaign saw no behaviour of theirs that their eager siblings did not.
JIT_TWIN_SHARE = 0.1


def _jax_rivals():
    out = []
    for variant in JAX_VARIANT_FLAGS:
        for jit in (False, True):
            name = f"jax:{variant}" + (":jit" if jit else "")
            if name == "jax:remat2":
                continue
            refs = ("jax:remat2:jit", "jax:remat2") if jit and variant != "remat2" else ("jax:remat2",)
            share = Share(JIT_TWIN_SHARE, f"jax:{variant}",
                          "every root it detects, an eager default pipeline detects too") if jit else None
            out.append(Spec(name, "jax", "JaxRemat", variant=variant, jit=jit, compare=(Compare(refs, "same"),),
                            default=variant in DEFAULT_VARIANTS, repro_default=name == "jax:remat3",
                            residual_report=jit, share=share))
    # The program inside jax.shard_map (replicated over two CPU devices), jitted and differentiated outside it: the
    # shard_map's partial evaluation and transpose carry every region, name and custom rule. Values against the
    # same variant's jit run (or eager, where the jit twin did not run), JAX's residual report recorded.
    for variant in DEFAULT_VARIANTS:
        out.append(Spec(f"jax:{variant}:shard-map", "jax", "JaxRemat", variant=variant, jit=True, shard_map=True,
                        residual_report=True,
                        compare=(Compare((f"jax:{variant}:jit", f"jax:{variant}"), "values"),)))
    # jax.jit over inputs sharded with NamedSharding (a mesh of two CPU devices, leading axes split where they divide):
    # the partitioner carries every region, policy (names, dots, offload) and rule across the devices. Values against
    # the same variant's one-device jit run (or eager, where the jit twin did not run).
    for variant in DEFAULT_VARIANTS:
        out.append(Spec(f"jax:{variant}:sharded", "jax", "JaxRemat", variant=variant, jit=True, sharded=True,
                        compare=(Compare((f"jax:{variant}:jit", f"jax:{variant}"), "values"),)))
    return out


def _torch_rivals():
    out = []
    cross = Compare(("jax:remat2",), "cross")
    for prefer in (False, True):
        sfx = ":prefer" if prefer else ""
        eager = Compare(("torch:eager-sac" + sfx,), "eager")
        out.append(Spec("torch:eager-sac" + sfx, "torch", "TorchSAC", prefer=prefer, compare=(cross,),
                        added_with=frozenset() if prefer else frozenset({"torch"}), repro_default=not prefer,
                        default=not prefer))
        for backend, part, label in (("aot_eager", "min_cut", "aot_eager"),
                                     ("aot_eager", "default", "aot_eager+default-partitioner"),
                                     ("inductor", "min_cut", "inductor")):
            out.append(Spec(f"torch:compile-{label}{sfx}", "torch", "TorchSAC", compile=backend, partitioner=part,
                            prefer=prefer, compare=(eager, cross), default=label == "aot_eager" and not prefer))
    # Checkpoint options and compile knobs (MUST_* policies), each against eager SAC: the
    # reentrant implementation (values only: it takes no policy), the determinism check off
    # (changes nothing: all residuals and rules alike), the min-cut partitioner under
    # lower activation memory budgets (each also against the next higher budget: saved bytes
    # must not grow as the budget falls), and checkpoint of region functions compiled one by one.
    eager = Compare(("torch:eager-sac",), "eager")
    out.append(Spec("torch:eager-reentrant", "torch", "TorchSAC", reentrant=True,
                    compare=(Compare(("torch:eager-sac",), "values"),)))
    out.append(Spec("torch:compile-aot_eager:reentrant", "torch", "TorchSAC", compile="aot_eager", reentrant=True,
                    compare=(Compare(("torch:eager-reentrant",), "values"),)))
    out.append(Spec("torch:eager-sequential", "torch", "TorchSAC", sequential=True,
                    compare=(Compare(("torch:eager-sac",), "same"),)))
    out.append(Spec("torch:eager-sac:checks-off", "torch", "TorchSAC", checks_off=True,
                    compare=(Compare(("torch:eager-sac",), "same"),)))
    higher = "torch:compile-aot_eager"
    for budget in MEMORY_BUDGETS:
        name = f"torch:compile-aot_eager:budget-{budget:g}"
        out.append(Spec(name, "torch", "TorchSAC", compile="aot_eager", memory_budget=budget,
                        compare=(eager, Compare((higher,), "budget"))))
        higher = name
    out.append(Spec("torch:checkpoint-of-compiled", "torch", "TorchSAC", compile="aot_eager", compile_inside=True,
                    compare=(eager,)))
    # Backward twice (retain_graph=True, then again): the second gradients against eager SAC's one
    # backward (values only for eager: its custom rules run twice).
    out.append(Spec("torch:eager-sac:backward-twice", "torch", "TorchSAC", backward_twice=True,
                    compare=(Compare(("torch:eager-sac",), "values"),)))
    out.append(Spec("torch:compile-aot_eager:backward-twice", "torch", "TorchSAC", compile="aot_eager",
                    backward_twice=True, compare=(eager,)))
    # A stateful policy (saves every other op its decisions save, by call order), eager against its
    # stateless sibling's values, compiled against eager (the same decisions if the compiler calls
    # the policy once per op, in order).
    out.append(Spec("torch:eager-sac:stateful", "torch", "TorchSAC", policy_state="every_other",
                    compare=(Compare(("torch:eager-sac",), "values"),)))
    out.append(Spec("torch:compile-aot_eager:stateful", "torch", "TorchSAC", compile="aot_eager",
                    policy_state="every_other", compare=(Compare(("torch:eager-sac:stateful",), "eager"),)))
    # Dynamic shapes, and a graph break inside every region, under aot_eager.
    out.append(Spec("torch:compile-aot_eager:dynamic", "torch", "TorchSAC", compile="aot_eager", dynamic=True,
                    compare=(eager,)))
    out.append(Spec("torch:compile-aot_eager:graph-break", "torch", "TorchSAC", compile="aot_eager", graph_break=True,
                    compare=(eager,)))
    # Training-loop compositions: the forward under saved-tensor hooks (torch.autograd.graph.save_on_cpu, a user's
    # own hooks honoured or bypassed by SAC's cache), eager and compiled; under set_checkpoint_early_stop(False);
    # the program exported (torch.export, strict and non-strict) and its exported module differentiated; the
    # differentiated inputs as parameters through torch.func.functional_call; vmap-spelled loops as torch.func.vmap.
    same = Compare(("torch:eager-sac",), "same")
    values = Compare(("torch:eager-sac",), "values")
    out.append(Spec("torch:eager-sac:save-on-cpu", "torch", "TorchSAC", hooks="save_on_cpu", compare=(same,)))
    # The forward under disable_saved_tensors_hooks: non-reentrant checkpoint packs through saved-tensor hooks and must
    # raise the message it was given (entry torch-checkpoint-needs-saved-tensor-hooks); reentrant checkpoint uses none
    # and must run (values; nothing records residuals there).
    out.append(Spec("torch:eager-sac:hooks-disabled", "torch", "TorchSAC", hooks="disabled", compare=(values,)))
    out.append(Spec("torch:eager-reentrant:hooks-disabled", "torch", "TorchSAC", reentrant=True, hooks="disabled",
                    compare=(values,)))
    # In the default set: the user's hooks (as cheap as eager SAC), and both exports on a share of the programs (strict
    # export costs about 150 ms a program, non-strict about 30; their roots recur on many programs).
    out.append(Spec("torch:eager-sac:user-hooks", "torch", "TorchSAC", hooks="user", compare=(same,), default=True))
    out.append(Spec("torch:eager-sac:user-hooks-bypassed", "torch", "TorchSAC", hooks="user_bypassed",
                    compare=(values,)))
    out.append(Spec("torch:compile-aot_eager:user-hooks", "torch", "TorchSAC", compile="aot_eager", hooks="user",
                    compare=(Compare(("torch:eager-sac:user-hooks",), "eager"),)))
    # (values: with early stop on, an outer region's cache entries that an inner region recomputes are never read,
    # with it off they are; the same tensors are held either way, so the read-back residuals differ by design)
    out.append(Spec("torch:eager-sac:early-stop-off", "torch", "TorchSAC", early_stop_off=True, compare=(values,)))
    for kind, fraction in zip(EXPORT_KINDS, EXPORT_SHARES):
        out.append(Spec(f"torch:export-{kind}", "torch", "TorchSAC", export=kind, compare=(values,), default=True,
                        share=Share(fraction, "torch:eager-sac", "an export costs more than eager SAC; its roots "
                                    "(tests/regressions/torch-export-*) recur on many programs")))
    for kind in EXPORT_KINDS:   # reentrant checkpoint (an autograd.Function) exported, then differentiated
        out.append(Spec(f"torch:export-{kind}:reentrant", "torch", "TorchSAC", export=kind, reentrant=True,
                        compare=(Compare(("torch:eager-reentrant",), "values"),)))
    out.append(Spec("torch:eager-sac:functional-call", "torch", "TorchSAC", functional_call=True, compare=(same,)))
    out.append(Spec("torch:eager-sac:func-vmap", "torch", "TorchSAC", func_vmap=True, compare=(values,)))
    # torch.func.grad around the program: it refuses the saved-tensor hooks non-reentrant checkpoint packs through
    # (entry torch-func-grad-refuses-checkpoint); without a region it must agree with the baselines.
    out.append(Spec("torch:eager-sac:func-grad", "torch", "TorchSAC", func_grad=True, compare=(values,)))
    # SAC's allow_cache_entry_mutation=True: where eager SAC raises on a mutated cached tensor it runs (values against
    # the baselines; a wrong value where the check would have fired is documented: entry torch-sac-allow-mutation).
    out.append(Spec("torch:eager-sac:allow-mutation", "torch", "TorchSAC", allow_mutation=True, compare=(values,)))
    return out


_ALL = frozenset(FRAMEWORKS)
SPECS: dict[str, Spec] = {s.name: s for s in [
    Spec("ref:f64", "jax", "JaxReference", role=VALUE, remat=False, f64=True, added_with=_ALL),
    # On a program whose every value is float64, jax:none computes what ref:f64 computes (the
    # judge then takes ref:f64 as the tight baseline): it runs on a share of those programs.
    Spec("jax:none", "jax", "JaxNoRemat", role=BASELINE, remat=False, added_with=_ALL,
         share=Share(0.2, "ref:f64", "on float64-only programs ref:f64 computes the same values",
                     dtypes=frozenset({"float64"}))),
    Spec("jax:remat2", "jax", "JaxRemat", role=REFERENCE, added_with=_ALL),
    *_jax_rivals(),
    Spec("torch:none", "torch", "TorchNoRemat", role=BASELINE, remat=False, added_with=frozenset({"torch"})),
    *_torch_rivals(),
]}

# Added automatically to every run.
REFERENCES = tuple(n for n, s in SPECS.items() if s.added_with == _ALL)
# The core set (Spec.default): run on every program of a default campaign, at their families' shares.
CORE_PIPELINES = tuple(n for n, s in SPECS.items() if s.default)
# The default campaign: every registered rival. Those outside the core set explore: each runs on an adaptive
# share of the time (engine.search.Shares), which grows with the new findings it shows.
DEFAULT_PIPELINES = tuple(n for n, s in SPECS.items() if s.role == RIVAL)
EXPLORERS = tuple(n for n in DEFAULT_PIPELINES if n not in CORE_PIPELINES)

_extra: dict[str, "Pipeline"] = {}   # test-only pipelines (mutants, fault injection)
_extra_specs: dict[str, Spec] = {}
_extra_makers: dict = {}           # name -> make(spec): test-only pipelines built on first use
_cache: dict[str, "Pipeline"] = {}


class UnknownPipeline(ValueError):
    pass


def derive(like: str, name: str, **changes) -> Spec:
    """A spec for a test-only pipeline that takes its settings, role and comparisons from `like`."""
    return replace(spec(like), name=name, added_with=frozenset(), default=False, repro_default=False, **changes)


def register_instance(p: "Pipeline") -> None:
    """Register a ready pipeline object (the harness's own tests: mutants, fault injection)."""
    _extra[p.name] = p
    _extra_specs[p.name] = p.spec


def register_lazy(s: Spec, make) -> None:
    """Register a test-only pipeline built by `make(spec)` on first use (its framework is then
    imported only by a run that uses it)."""
    _extra_specs[s.name] = s
    _extra_makers[s.name] = make


def known_names() -> list[str]:
    return list(SPECS) + [n for n in _extra_specs if n not in SPECS]


def _lookup(name: str) -> Spec | None:
    return SPECS.get(name) or _extra_specs.get(name)


def spec(name: str) -> Spec:
    s = _lookup(name)
    if s is None:
        raise UnknownPipeline(f"unknown pipeline {name!r}; known: {', '.join(known_names())}")
    return s


def framework_of(name: str) -> str:
    """The framework a pipeline runs on; for a name from another harness version, its prefix."""
    s = _lookup(name)
    return s.framework if s else name.split(":", 1)[0]


def value_reference() -> str:
    return next(n for n, s in SPECS.items() if s.role == VALUE)


def jitted(name: str) -> bool:
    """Whether the pipeline runs forward and backward in one jax.jit: its spec's `jit`, and the JAX value reference
    too, outside framework defaults (one compile where eager dispatch compiles each op; pipelines.jax.eager_cache).
    A repro runs each side as the campaign did."""
    s = spec(name)
    if s.jit:
        return True
    from conformance.pipelines.jax.eager_cache import framework_defaults
    return s.role == VALUE and s.framework == "jax" and not framework_defaults()


def baseline(framework: str) -> str | None:
    """The framework's same-dtype no-checkpoint pipeline."""
    return next((n for n, s in SPECS.items() if s.role == BASELINE and s.framework == framework), None)


def baseline_of(name: str) -> str | None:
    return baseline(framework_of(name))


def role_of(name: str) -> str | None:
    s = _lookup(name)
    return s.role if s else None


def runs_in(name: str, framework: str) -> bool:
    """Whether a repro script of `framework` can run the pipeline: its own, or the value
    reference (a float64 no-checkpoint run exists in every framework)."""
    return framework_of(name) == framework or role_of(name) == VALUE


def residual_reference(framework: str) -> str | None:
    return next((n for n, s in SPECS.items() if s.role == REFERENCE and s.framework == framework), None)


def same_mode(a: str, b: str) -> bool:
    """Whether two pipelines execute alike (both eager, both jit, or compiled with one backend)."""
    sa, sb = _lookup(a), _lookup(b)
    return bool(sa and sb and (sa.jit, sa.compile) == (sb.jit, sb.compile))


def records_report(name: str) -> bool:
    """Whether the pipeline records JAX's residual report (the residual_report check)."""
    s = _lookup(name)
    return bool(s and s.residual_report)


def is_reference(name: str) -> bool:
    """Value references and baselines: never judged themselves."""
    s = SPECS.get(name)
    return s is not None and s.role in (VALUE, BASELINE)


def repro_default(framework: str) -> str:
    return next(n for n, s in SPECS.items() if s.repro_default and s.framework == framework)


def comparisons(name: str, present) -> list[tuple[str, CompareMode]]:
    """(reference, mode) pairs a pipeline is compared with, given the pipelines that ran."""
    s = _lookup(name)
    out = []
    for c in (s.compare if s else ()):
        ref = next((r for r in c.refs if r in present), None)
        if ref is not None and ref != name:
            out.append((ref, c.mode))
    return out


def unavailable(name: str) -> str | None:
    """Why the installed releases cannot run a pipeline (its framework absent, an API it runs with lacking), or
    None; read from the packages' metadata, no framework imported."""
    s = spec(name)
    if s.framework not in releases.PACKAGES:   # (a test-only pipeline)
        return None
    if releases.installed(s.framework) is None:
        return f"{s.framework} is not installed (pip install 'remat-conformance[{s.framework}]')"
    lack = releases.lacking(s.needs)
    return releases.why(lack) if lack else None


def run_set(rivals: list[str]) -> list[str]:
    """The pipelines a run needs: the references its rivals' frameworks bring, the references
    the rivals are compared with, then the rivals."""
    fws = {framework_of(r) for r in rivals} | {"jax"}
    names = [n for n, s in SPECS.items() if s.added_with & fws]
    for r in rivals:
        for c in spec(r).compare:
            names.append(c.refs[-1])
    return list(dict.fromkeys(names + list(rivals)))


def cpu_devices_needed(names) -> int:
    """The CPU devices a run of these pipelines needs (1 unless one runs under shard_map)."""
    return max([SHARD_MAP_DEVICES if (s := _lookup(n)) is not None and (s.shard_map or s.sharded) else 1
                for n in names] + [1])


def shared_pipelines(names) -> dict[str, Share]:
    """The pipelines of `names` that run on a share of the programs (their sibling among `names`)."""
    return {n: s.share for n in names if (s := _lookup(n)) is not None and s.share is not None
            and s.share.sibling in names}


def on_share(name: str, program_hash: str, dtypes, present, fraction: float | None = None) -> bool:
    """Whether a pipeline runs on a program: always, unless it has a share (`fraction` overrides its
    declared one), its sibling is in `present` and the program's `dtypes` are within the share's;
    then when the program's content hash falls within the fraction."""
    s = _lookup(name)
    sh = s.share if s else None
    if sh is None or sh.sibling not in present or not sh.holds_on(dtypes):
        return True
    return int(program_hash[:8], 16) < (sh.fraction if fraction is None else fraction) * 16 ** 8


def get(name: str) -> "Pipeline":
    if name in _extra:
        return _extra[name]
    if name in _extra_makers:
        _extra[name] = _extra_makers.pop(name)(_extra_specs[name])
        return _extra[name]
    if name in _cache:
        return _cache[name]
    s = spec(name)
    p = getattr(importlib.import_module(MODULES[s.framework]), s.cls)(s)
    _cache[name] = p
    return p


# Cost families: pipelines of one family cost alike per program (eager dispatch, one XLA
# compile, torch.compile graphs). A campaign gives each family a share of its time (see
# conformance.engine.search.Shares); a family over its share skips programs until it is back under.
# torch:compile: a fifth (was 0.4, which it did not reach: about a quarter of a default program's time went to
# torch.compile, on nine programs in ten); its default-set roots (tests/regressions/torch-compile-*) need programs
# of rare constructs, which the share's coverage rule (a program with a least-covered feature) still gives it.
FAMILY_SHARES = {"jax:eager": 1.0, "jax:jit": 1.0, "torch:eager": 1.0, "torch:compile": 0.2}


def family_of(name: str) -> str:
    s = spec(name)
    return f"{s.framework}:{'compile' if s.compile else 'jit' if s.jit else 'eager'}"


def warm_up_of(name: str) -> str:
    """What a pipeline's first run in a process warms up, shared by every pipeline of the same answer: its torch.compile
    backend (inductor's first compile is its imports and the C++ toolchain: tens of seconds), torch.export, JAX's
    devices of a mesh, else its family."""
    s = spec(name)
    if s.compile:
        return f"{s.framework}:compile:{s.compile}"
    if s.export:
        return f"{s.framework}:export"
    if s.shard_map or s.sharded:
        return f"{s.framework}:mesh"
    return family_of(name)


def versions_of(names) -> dict[str, str]:
    """The harness's, Python's and each named pipeline's framework versions (a run records them)."""
    out = {"remat-conformance": __version__, "python": sys.version.split()[0]}
    for n in names:
        out.update(get(n).versions())
    return out
