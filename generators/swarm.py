"""Swarm testing (Groce et al., ISSTA 2012) for the program generator: the generator's Config,
and the features each program may use (`draw_swarm`), each on with its own probability, so
that no feature crowds out the rest. "Off" is a flag's simplest choice, so shrinking turns
features off; the Config's switches win over the swarm.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import strategies as st

from conformance.ir import ops as O
from conformance.ir.features import FEATURE_FOCUS
from conformance.ir.policy import KINDS
from generators.draws import draw_int, flag

LOOP_SPELLINGS = ("scan", "fori_loop", "while_loop", "vmap")   # how a scan is spelled (first: lax.scan)


@dataclass
class Config:
    """What the generator may produce. Profiles and pipelines narrow it; a feature switched off
    here is off in every program, whatever the swarm draws."""
    max_stmts: int = 6        # a program draws at most 2 * max_stmts ops and region/block openings
    max_depth: int = 3  # regions nested at most this deep
    dtypes: tuple[str, ...] = (
        "float32",
        "float64",
        "bfloat16",
        "float16",
    )  # inputs' dtypes (the first: the plain one), casts' targets
    custom_vjp: bool = True
    custom_jvp: bool = True
    checkpoint: bool = True
    second_order: bool = True
    offload_policies: bool = True
    max_inputs: int = 6
    scan: bool = True         # lax.scan (PyTorch: a Python loop), its bodies holding regions and names
    loop_spellings: tuple[str, ...] = LOOP_SPELLINGS   # scan spellings allowed (the first is the plain one)
    nested_jit: bool = True   # jax.jit-ted sub-functions (PyTorch: inline), inside and around regions
    cond: bool = True         # lax.cond / lax.switch on a non-differentiated input (PyTorch: a Python if)
    swarm: bool = True        # False: every feature the config allows is available to every program
    require: tuple[str, ...] = ()   # swarm dimensions on in every program (where the config allows them)
    exclude: tuple[str, ...] = ()   # swarm dimensions off in every program
    focus: tuple[str, ...] = ()     # features (FOCUS) that half of the programs aim at, one each
    lacks: tuple[str, ...] = ()     # features the installed releases cannot express: no program has them


# custom_vjp spellings (the first is the plain one); the swarm's rule_spellings turns the others on


# ---- swarm --------------------------------------------------------------------------------------
def op_families() -> list[str]:
    """The op families a program may draw from, declaration order (the first is the plain one).
    Families of ops allowed only inside custom rules with nondiff args are not swarmed on
    their own: the `nondiff_args` dimension decides whether they occur."""
    return O.generated_families(False)


# (dimension, probability that a program has it on). Policy kinds and op families are added
# from the declarations (each on with probability 1/2), so that new kinds and families are
# swarmed without a change here.
_HALF = (1, 2)
# The composition round's dimensions (COMPOSITIONS), each in a quarter of the programs: drawn by default, at half
# the usual rate (a default make run measured them at half or more of the programs' JAX time: effects record
# eagerly, state and multi-output ops trace more)
_QUARTER = (1, 4)
_FEATURE_FLAGS = (
    ("checkpoint", (7, 8)), ("nesting", _HALF), ("prevent_cse", _HALF),
    ("custom_vjp", _HALF), ("symbolic_zeros", _HALF), ("optimize_remat", _HALF), ("nondiff_args", _HALF),
    ("nonstandard_rules", _HALF), ("unused_results", _HALF),
    ("extra_inputs", _HALF), ("nondiff_inputs", _HALF), ("dead_values", _HALF), ("second_order", (1, 6)),
    ("custom_jvp", _HALF),
)
# Dimensions added later are drawn after every other one, so that the earlier dimensions keep
# their places in the choice sequence (the shrinker's moves depend on them).
_LATE_FLAGS = (("rule_spellings", _HALF), ("residual_trees", _HALF), ("perturbed_branch", _HALF),
               ("scan", _HALF), ("scan_xs", _HALF), ("scan_unroll", _HALF), ("diff_modes", (3, 4)),
               ("nested_jit", _HALF), ("loop_spellings", _HALF), ("cond", _HALF), ("cond_switch", _HALF),
               ("seeded_cotangents", _HALF), ("region_options", _HALF), ("aux_outputs", _HALF),
               ("rule_trees", _HALF), ("per_example", (1, 4)), ("function_options", _HALF),
               ("checkpoint_in_rules", _HALF), ("sequential_regions", (1, 4)), ("mutable_state", _QUARTER),
               ("effects", _QUARTER), (O.MULTI_OUTPUT, _QUARTER), (O.DATA_DEPENDENT, _QUARTER),
               ("non_tensor_outputs", _QUARTER), (O.FUNC_TRANSFORMS, _QUARTER))
# The composition round's dimensions (a region's mutable state, effects, multi-output, data-dependent and
# functional-transform op families, a region's non-tensor outputs): drawn by default like every other
# dimension; with the swarm off (every feature on) still drawn, not forced into every program.
COMPOSITIONS = ("mutable_state", "effects", O.MULTI_OUTPUT, O.DATA_DEPENDENT, "non_tensor_outputs", O.FUNC_TRANSFORMS)
SCAN_LENGTHS = (2, 3, 1, 4)   # the first is the shrink target: a loop that iterates


def swarm_dimensions() -> list[str]:
    """The names of every swarm dimension (besides the dtype). The first policy kind and the
    first op family are the plain forms, always available; every other one is a dimension."""
    return ([n for n, _ in _FEATURE_FLAGS] + [f"policy:{k}" for k in list(KINDS)[1:]]
            + [f"family:{f}" for f in op_families()[1:]] + [n for n, _ in _LATE_FLAGS])


def _allowed(cfg: Config) -> dict[str, bool]:
    """Which dimensions the config allows at all."""
    a = {n: True for n in swarm_dimensions()}
    if not cfg.checkpoint or cfg.max_depth < 1:
        a["checkpoint"] = False
    if not a["checkpoint"] or cfg.max_depth < 2:
        a["nesting"] = False
    a["prevent_cse"] &= a["checkpoint"]
    a["region_options"] &= a["checkpoint"]
    a["checkpoint_in_rules"] &= a["checkpoint"] and cfg.custom_vjp
    a["sequential_regions"] &= a["checkpoint"] and cfg.max_stmts >= 4
    for n in COMPOSITIONS:   # (each composes with a checkpoint region)
        a[n] &= a["checkpoint"]
    for n in cfg.exclude:
        a[n] = False
    if not cfg.custom_vjp:
        for n in ("custom_vjp", "symbolic_zeros", "optimize_remat", "nondiff_args", "rule_spellings", "residual_trees",
                  "perturbed_branch", "function_options"):
            a[n] = False
    if not cfg.custom_jvp:
        a["custom_jvp"] = False
    if not cfg.custom_vjp and not cfg.custom_jvp:
        a["nonstandard_rules"] = a["unused_results"] = a["rule_trees"] = False
    if not cfg.second_order:
        a["second_order"] = a["diff_modes"] = False
    if cfg.max_inputs < 2:
        a["extra_inputs"] = a["scan_xs"] = False
    if not cfg.scan:
        a["scan"] = False
    if not cfg.cond or cfg.max_inputs < 2:   # a cond's predicate is an input of its own
        a["cond"] = False
    if not a["cond"]:
        a["cond_switch"] = False
    if not cfg.nested_jit or not a["checkpoint"]:   # a sub-function opens where a region would
        a["nested_jit"] = False
    if not a["scan"] or len(cfg.loop_spellings) < 2:
        a["loop_spellings"] = False
    if not a["scan"]:
        a["scan_xs"] = a["scan_unroll"] = False
    for k, decl in list(KINDS.items())[1:]:
        if (decl.offloads and not cfg.offload_policies) or not a["checkpoint"]:
            a[f"policy:{k}"] = False
    return a


@dataclass
class Swarm:
    """One program's features: `on[name]` for every swarm dimension, and its dtype."""
    on: dict[str, bool]
    dtype: str

    def __getitem__(self, name: str) -> bool:
        return self.on.get(name, False)


def draw_swarm(draw, cfg: Config) -> Swarm:
    allowed = _allowed(cfg)
    probs = dict(_FEATURE_FLAGS + _LATE_FLAGS)
    on = {}
    for n in swarm_dimensions():
        if not allowed[n]:
            on[n] = False
        elif n in cfg.require:
            on[n] = True
        elif not cfg.swarm and n not in COMPOSITIONS:
            on[n] = n not in ("dead_values",)
        else:
            on[n] = flag(draw, probs.get(n, _HALF), f"swarm:{n}")
    if on["second_order"] and not cfg.swarm and "second_order" not in cfg.require:
        on["second_order"] = flag(draw, probs["second_order"], "swarm:second_order")
    dtype = cfg.dtypes[0] if len(cfg.dtypes) == 1 else cfg.dtypes[draw_int(draw, 0, len(cfg.dtypes) - 1, "dtype")]
    return Swarm(on, dtype)


def swarms(cfg: Config | None = None) -> st.SearchStrategy:
    """Strategy for one program's swarm choices (for tests and docs)."""
    return st.composite(lambda draw: draw_swarm(draw, cfg or Config()))()


# ---- focus: constructs a campaign aims to generate in every run ----------------------------------
# feature -> the swarm dimensions a program needs on to have it, as each feature declares it
# (conformance.ir.features.FEATURES). A campaign round focuses on the features earlier rounds did not
# generate (conformance.engine.search.Coverage): half of its programs each aim at one of them, with
# these dimensions on, drawing until one has it (at most FOCUS_TRIES). Policy kinds and dtypes are
# added from their declarations.
FOCUS: dict[str, tuple[str, ...]] = {
    **FEATURE_FOCUS,
    **{f"policy:{k}": ("checkpoint",) + ((f"policy:{k}",) if i else ()) for i, k in enumerate(KINDS)},
}
FOCUS_TRIES = 40


def focus_features(cfg: Config) -> list[str]:
    """The FOCUS features (and dtypes) this config can generate, declaration order."""
    allowed = _allowed(cfg)
    return [f for f, dims in FOCUS.items() if all(allowed[d] for d in dims)] + list(cfg.dtypes)


def focused(cfg: Config, feature: str) -> Config:
    """The config of a program that aims at `feature`: its dimensions on (a dtype: the only one)."""
    if feature in cfg.dtypes:
        return replace(cfg, dtypes=(feature,), focus=())
    return replace(cfg, require=tuple(dict.fromkeys(cfg.require + FOCUS[feature])), focus=())
