"""Root behaviours: what a finding's minimal program needs to fail, apart from its variants.

A root is keyed on the check, the pipeline family, the reference family, the features the shrunk
program cannot lose (what the reductions left, less the variant dimensions below) and, for an
error, its error root (findings.error_root). Everything else describes one difference of one
check and is a variant of the root, listed inside it with counts:
  pipelines  twins of one family: eager and `:jit`; remat3, remat3+cvjp3, remat3+cjvp3;
             `:prefer`; compile backends and partitioners;
  labels     residual symptoms (missing / extra / other / named), trace counters, custom-rule
             fields (perturbed / fwd_ran / symbolic_zero_cts), an error's type;
  policies   the policy kinds a failing program used;
  features   dtypes, op families (matmul, nonsmooth, cast...) and spellings (a rule's static
             arguments, a residual that is an argument...) the program happened to have.
Rules suggest a class for a new root (`suggest_triage`); a person confirms it in the corpus.
"""
from __future__ import annotations

import re

from conformance.engine.findings import VARIANT_DIMENSIONS, Finding, Seen, error_root, signature_features
from conformance.ir.program import Program
from conformance.ir.verdict import Triage
from conformance.pipelines import registry
from conformance.pipelines.registry import CompareMode
from oracles.residual_causes import as_compared, as_judged_by_policy, core, effect_causes, rule_causes
from oracles.residual_causes import causes as cause_names

DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})
# Op families: which op shows a behaviour is a variant of it when the minimal program fails
# with another op alike (a dead matmul or sin in a custom_vjp fwd).
OP_FAMILIES = frozenset({"matmul", "batch_matmul", "conv", "nonsmooth", "cast", "slicing", "layout", "reduction",
                         "view"})
# How a construct is spelled rather than what it does: a rule's static arguments, a residual that
# is an argument or a result, a result nothing reads, seeded cotangents, pytrees. Variants of a
# root, like the op families; a lax.switch is a cond of three branches.
SPELLINGS = frozenset(
    {
        "custom_gradient",
        "nondiff_args",
        "residual_is_arg",
        "residual_is_result",
        "unused_result",
        "seeded_cotangents",
        "region_pytree",
        "rule_pytree",
        "residual_pytree",
        "static_argnums",
    }
)
SAME_AS = {"switch": "cond"}
# What a policy does, beside its kind (a variant, as the kind is): it can move values to host memory.
POLICY_TRAITS = frozenset({"offloading"})
# References that stand for "the values without remat": one family.
VALUE_FAMILY = "values"
_VALUE_REFERENCES = ("ref:f64", "jax:none", "torch:none")
_JAX_VARIANT = re.compile(r"^jax:(remat\d)(\+c(?:vj|jv)p\d)?(:jit)?$")
_TORCH_COMPILE = re.compile(r"^torch:compile-(aot_eager\+default-partitioner|aot_eager|inductor)")


def pipeline_family(name: str) -> str:
    """The family a pipeline's twins share: jax:remat3 for remat3, remat3+cvjp3 and their :jit
    forms; torch:compile for each backend and partitioner (options kept: torch:compile:budget-0);
    :prefer dropped; the no-remat references are one value family. Verdict references that are
    not pipelines (expectations, policy, vjp, device:cpu) are their own family."""
    if name in _VALUE_REFERENCES:
        return VALUE_FAMILY
    m = _JAX_VARIANT.match(name)
    if m:
        return f"jax:{m.group(1)}"
    name = name.replace(":prefer", "")
    return _TORCH_COMPILE.sub("torch:compile", name)


def option_free(name: str) -> str:
    """A pipeline's name without its options (torch:export-strict:reentrant -> torch:export-strict)."""
    return ":".join(name.split(":")[:2])


def raise_family(name: str) -> str:
    """The pipelines one raise is one root under: a family, its options folded (the same KeyError under
    torch:export-strict and torch:export-strict:reentrant is one root, in root_key as under --known)."""
    return pipeline_family(option_free(name))


def rule_variant(name: str) -> str:
    """The custom-rule implementation a pipeline runs its rules with (jax: +cvjp3, +cjvp3, or the default one):
    a rule check's root seen under one does not stand for another's (the twins of one family run other code)."""
    m = _JAX_VARIANT.match(name)
    return (m.group(2) or "") if m else ""


def is_variant_feature(feature: str) -> bool:
    return (feature.startswith("policy:") or feature in POLICY_TRAITS or feature in DTYPES or feature in OP_FAMILIES
            or feature in SPELLINGS
            or feature.startswith("op:"))


def root_label(check: str, label: str | None) -> str:
    """A verdict's label as a root reads it: a wrong gradient is one label whichever reference showed it
    ("cross_value", against another pipeline, is "-", against the baselines: family_key's one reference family)."""
    label = label or "-"
    return "-" if check == "gradient" and label == "cross_value" else label


def read_as_root(features) -> set[str]:
    """A program's features with each spelling also read as the construct it spells (SAME_AS: a switch is a
    cond), to compare with a root's features (root_features)."""
    return set(features) | {SAME_AS[f] for f in features if f in SAME_AS}


def root_features(features) -> list[str]:
    """The features a root is keyed on: the signature's, less the variant dimensions, spellings of
    one construct read as one."""
    return sorted({SAME_AS.get(f, f) for f in signature_features(features) if not is_variant_feature(f)})


def family_key(check: str, pipeline: str, reference: str) -> tuple[str, str, str]:
    """A wrong gradient is wrong whichever reference showed it (the float64 value reference, the
    no-remat baseline, the eager pipeline a compiled one is compared with): one reference family."""
    return check, pipeline_family(pipeline), VALUE_FAMILY if check == "gradient" else pipeline_family(reference)


DIRECTIONS = ("saves less", "saves more")   # a residual difference's root where no value tells its cause


def residual_direction(check: str, pipeline: str, reference: str, detail: dict) -> str | None:
    """How a rival's saved residuals depart from a reference that claims the same semantics (the
    whole saved set compared: CompareMode.SAME): it lacks something the reference saves
    (recomputes more), or only saves more. That direction is the root of a residual difference:
    the constructs it shows through (a scan, a cond, a custom rule, a name) are its variants, as
    the policy kinds are. None: another check or comparison, or no saved set told apart."""
    if check != "residuals" or not any(m is CompareMode.SAME for _, m in registry.comparisons(pipeline, {reference})):
        return None
    less, more = DIRECTIONS
    if detail.get("missing_named") or detail.get("missing_other"):
        return less
    if detail.get("extra_named") or detail.get("extra_other"):
        return more
    b, rb = detail.get("bytes"), detail.get("reference_bytes")
    if isinstance(b, int) and isinstance(rb, int) and b != rb:
        return more if b > rb else less
    return None


CAUSE_SEP = " + "


# Checks whose oracle names the causes of a difference (oracles.residual_causes), and the function naming them (each
# read with the program, the verdict's detail and the pipeline judged).
CAUSED_CHECKS = {"residuals": cause_names, "effect_count": effect_causes, "custom_rule": rule_causes}


def residual_causes(check: str, detail: dict) -> list[str]:
    """The causes a residual, effect-count or custom-rule verdict's detail names (oracles.residual_causes, read by
    the oracle); [] for another check or a difference no value tells apart."""
    if check not in CAUSED_CHECKS or not isinstance(detail, dict):
        return []
    return [c for c in detail.get("causes") or [] if isinstance(c, str)]


def with_causes(f: Finding) -> Finding:
    """A residual finding's causes read again from its program and detail, as the oracle names them today: a corpus
    entry recorded before the causes or before a cause got a name of its own (a view's output, once an op's) is
    matched on what a campaign now reports (its recorded causes are kept where nothing can be read)."""
    if f.check in CAUSED_CHECKS:
        try:
            prog = Program.model_validate(f.program)
        except ValueError:
            return f
        fresh = CAUSED_CHECKS[f.check](prog, f.detail, f.pipeline)
        if fresh or "causes" not in f.detail:
            f.detail = {**f.detail, "causes": fresh}
    return f


# Checks whose verdict may be a raise: an error, and JAX's residual report (saved_residuals raising for the program).
RAISING_CHECKS = frozenset({"error", "residual_report"})


def evidence_root(check: str, pipeline: str, reference: str, detail: dict) -> str | None:
    """What a verdict's own evidence says its root is, where it says one: the raise of an error or of a residual
    report (findings.error_root); the causes of a residual difference (each value's decision, as its core names
    it, CAUSE_SEP between them), else its direction (residual_direction)."""
    if check in RAISING_CHECKS:   # (a residual report that raised: what it raised, as an error)
        return error_root(detail)
    causes = residual_causes(check, detail)
    if causes:
        return CAUSE_SEP.join(sorted(set(map(core, causes))))
    return residual_direction(check, pipeline, reference, detail)


def _held(findings: list[Finding], key: tuple) -> dict[str, Finding]:
    """The core of each cause a finding of `key`'s family holds (oracles.residual_causes.core: a cause shown at
    second order or on a dead value is the cause its shrunk program shows), and the first finding holding it."""
    fam = family_key(*key[:3])
    held: dict[str, Finding] = {}
    mine = [(f, residual_causes(f.check, f.detail)) for f in findings
            if family_key(f.check, f.pipeline, f.reference) == fam]
    # (a finding showing fewer causes first: one showing a cause alone stands for it, not one beside another's cause)
    for f, causes in sorted(mine, key=lambda fc: len(fc[1])):
        for c in causes:
            held.setdefault(core(c), f)
    for f in findings:   # a finding whose program fails this family's key too (its reproduces): its causes, as
        # that key names them (a pipeline recomputing what a reference saves recomputes what its policy saves; the
        # reference, where the key is the reference's policy check: departs_from_policy)
        ks = [k for k in f.reproduces if len(k) >= 3 and family_key(*k[:3]) == fam]
        if not ks:
            continue
        for c in residual_causes(f.check, f.detail):
            if fam[2] == "policy":
                rival = family_key(f.check, f.pipeline, f.reference)[1]
                c = as_judged_by_policy(c, by_the_reference=not any(_rival_side(k[0], k[1], rival) for k in ks))
            elif f.reference == "policy":   # a departure a difference of this family showed (merged into f): the
                # rival's where f's pipeline is of the rival's family, else the reference's (or a twin's of it)
                c = as_compared(c, by_the_reference=not _rival_side(f.check, f.pipeline, fam[1]))
            held.setdefault(core(c), f)
    return held


def departure_keys(check: str, key: tuple, causes: list[str], failures) -> list[list[str]]:
    """The policy checks of a pairwise residual difference's two pipelines (`key`, with these `causes`) that the
    same program fails on every one of its values (`failures`: its judgement's failing verdicts): the pipeline
    that departs from its policy there, whose departure the difference shows (one cause, one finding)."""
    if check not in CAUSED_CHECKS or key[2] == "policy" or not causes:
        return []
    out = []
    for v in failures:
        if v.check == check and v.reference == "policy" and v.pipeline in key[1:3]:
            theirs = set(map(core, residual_causes(v.check, v.detail)))
            if {core(as_judged_by_policy(c, v.pipeline == key[2])) for c in causes} <= theirs:
                out.append(list(v.key()))
    return out


def _rival_side(check: str, pipeline: str, rival_family: str) -> bool:
    """Whether the policy check of `pipeline` is a pairwise difference's rival's (of `rival_family`), else its
    reference's (or a twin's of it): which of the two departs."""
    return family_key(check, pipeline, "policy")[1] == rival_family


def departs_from_policy(a: Finding, b: Finding) -> bool:
    """Whether pairwise residual difference `b` is policy finding `a`'s departure: b's program fails a policy check
    that a's program fails too (a's family, or a sibling among its reproduces: eager SAC's with user hooks fails
    where eager SAC's does), departure_keys, in b's reproduces, and a holds each of b's causes as that check names
    them."""
    if a.reference != "policy" or b.reference == "policy":
        return False
    fams = {family_key(*k[:3]) for k in [list(a.key())] + a.reproduces if len(k) >= 3 and k[2] == "policy"}
    ks = [k for k in b.reproduces if len(k) >= 3 and k[2] == "policy" and family_key(*k[:3]) in fams]
    if not ks:
        return False
    rival = family_key(b.check, b.pipeline, b.reference)[1]
    by_ref = not any(_rival_side(k[0], k[1], rival) for k in ks)
    held = set(map(core, residual_causes(a.check, a.detail)))
    return {core(as_judged_by_policy(c, by_ref)) for c in residual_causes(b.check, b.detail)} <= held


def covering_finding(findings: list[Finding], key: tuple, causes: list[str]) -> Finding | None:
    """The finding a residual difference with these causes is counted under: every cause is one of a finding
    of its family (pipeline twins, one reference family), and the finding holding its first cause stands
    for it. None while any cause is new: a new cause is never swallowed by a known direction."""
    held = _held(findings, key)
    if not causes or any(core(c) not in held for c in causes):
        return None
    return held[core(sorted(causes)[0])]


def new_causes(findings: list[Finding], key: tuple, causes: list[str]) -> list[str]:
    """The causes of a residual difference that no finding of its family holds yet, sorted."""
    held = _held(findings, key)
    return sorted(c for c in causes if core(c) not in held)


# Checks whose label names what of a custom rule moved (a trace counter, a rule field): part of the root,
# with the constructs the program cannot lose (a fwd traced twice in a cond is not a bwd called twice there).
RULE_CHECKS = frozenset({"trace_count", "custom_rule"})
# Checks whose label is part of the root: a rule check's, and which effect ran more or fewer times (effect_count).
LABELLED_CHECKS = RULE_CHECKS | {"effect_count"}


def root_key(f: Finding) -> str:
    """The root behaviour a shrunk finding stands for. An error that raised keys on what it raised
    (one raise reached through another policy or program is one root), a residual difference
    between pipelines of one semantics on its direction (residual_direction); a missing error, and
    every other check, on the features its shrunk program cannot lose."""
    asked = expectation_root(f.check, f.pipeline, f.reference, f.error_type, f.expectation, f.detail)
    if asked is not None:   # an error the expectations ask for that did not come: the expectation that asked
        return asked
    check, pfam, rfam = family_key(f.check, f.pipeline, f.reference)
    raised = evidence_root(f.check, f.pipeline, f.reference, f.detail)
    what = raised if raised is not None else "+".join(root_features(f.features))
    if f.check == "error" and raised is None:   # an error where none was expected, of no raise evidence
        what = f"{f.error_type or 'none'}:{what}"
    elif f.check == "error":   # the same raise under an option of the pipeline is one root (as --known reads it)
        pfam = raise_family(f.pipeline)
    elif f.check in LABELLED_CHECKS and raised is None:   # what moved (a rule's count or field, an effect), and where
        what = f"{f.error_type or '-'}:{what}"
    return f"{check}|{pfam}|{rfam}|{what}"


def expectation_root(check: str, pipeline: str, reference: str, error_type: str | None, expectation: str | None,
                     detail: dict) -> str | None:
    """The root a verdict names before any shrink, where its features do not enter it: an error the
    expectations asked for that did not come (root_key keys it on the expectation that asked)."""
    if check != "error" or not expectation or evidence_root(check, pipeline, reference, detail) is not None:
        return None
    fam = family_key(check, pipeline, reference)
    return f"{fam[0]}|{fam[1]}|{fam[2]}|{error_type or 'none'}:expectation {expectation}"


def _same_label(check: str, a: str, b: str) -> bool:
    """Labels of one shrunk behaviour: equal, or (trace_count) naming a counter in common."""
    if (a or "-") == (b or "-"):
        return True
    return check == "trace_count" and bool(set((a or "").split("+")) & set((b or "").split("+")))


# Options of a custom rule that the reductions cannot turn off without rewriting the rule: two
# shrunk programs of one family and label that differ only by these are one root.
RULE_OPTIONS = frozenset({"symbolic_zeros", "optimize_remat", "nondiff_input", "bwd_none", "once_differentiable",
                          "perturbed_branch"})


def nested_roots(f: Finding, g: Finding) -> bool:
    """Two shrunk programs whose root features differ only by rule options, with the same label in
    one family (one has all of the other's and options besides, or each has an option the other
    lacks): one root, whose options the reductions could not turn off are variants."""
    if family_key(f.check, f.pipeline, f.reference) != family_key(g.check, g.pipeline, g.reference):
        return False
    if f.check == "error" or not _same_label(f.check, f.error_type, g.error_type):
        return False
    a, b = set(root_features(f.features)), set(root_features(g.features))
    return a - RULE_OPTIONS == b - RULE_OPTIONS


def labels_seen(f: Finding) -> set[str]:
    return {f.error_type or "-"} | set(f.variants.get("labels", {}))


def pipelines_seen(f: Finding) -> set[str]:
    return set(f.behaviour_pipelines()) | set(f.variants.get("pipelines", {}))


def variant_values(pipelines, label: str, features) -> dict[str, list[str]]:
    """One program's values of each variant dimension."""
    feats = set(features)
    return {"pipelines": list(dict.fromkeys(pipelines)), "labels": [label or "-"],
            "policies": sorted(f.removeprefix("policy:") for f in feats if f.startswith("policy:")),
            "constructs": root_features(feats),
            "features": sorted(f for f in feats if is_variant_feature(f) and not f.startswith(("policy:", "op:")))}


def record_variant(f: Finding, values: dict[str, list[str]], when: float | None, count: int = 1) -> None:
    """Count one program's variant values under finding `f` (the first time each was seen kept)."""
    for dim in VARIANT_DIMENSIONS:
        seen = f.variants.setdefault(dim, {})
        for v in values.get(dim, []):
            s = seen.setdefault(v, Seen(first_seen=when))
            s.count += count
            if s.first_seen is None or (when is not None and when < s.first_seen):
                s.first_seen = when


def finding_variants(f: Finding) -> dict[str, list[str]]:
    return variant_values(f.behaviour_pipelines(), f.error_type, f.features)


def merge_variants(into: Finding, other: Finding) -> None:
    """Fold `other`'s variants (its own, and those it recorded) into `into`."""
    for dim, seen in other.variants.items():
        mine = into.variants.setdefault(dim, {})
        for v, s in seen.items():
            m = mine.setdefault(v, Seen(first_seen=s.first_seen))
            m.count += s.count
            if s.first_seen is not None and (m.first_seen is None or s.first_seen < m.first_seen):
                m.first_seen = s.first_seen
    if not other.variants:
        record_variant(into, finding_variants(other), other.first_seen, max(other.count, 1))


# -- triage ------------------------------------------------------------------------------------
# Opt-in implementations and options: a residual or trace difference there is for upstream to
# decide (a question), not a bug of a documented behaviour.
OPT_IN = re.compile(r"^jax:remat3|\+c(?:vj|jv)p3|^torch:.*:(budget|stateful|checks-off|dynamic|graph-break)")
# Exception types no user should see: the framework's internals failed.
INTERNAL_ERRORS = frozenset({"StoreException", "AssertionError", "KeyError", "IndexError", "AttributeError",
                             "TypeError", "UnboundLocalError", "InternalTorchDynamoError", "BackendCompilerFailed",
                             "RecursionError", "SystemError", "XlaRuntimeError"})
_INTERNAL_MESSAGE = re.compile(r"_src|internal|please report|this is a bug|should not happen|unreachable", re.I)


def suggest_triage(f: Finding) -> Triage:
    """A class suggested by rules (unconfirmed): a wrong or non-finite gradient, a crash, an
    internal exception type or a message naming internals: bug; an expected error that did not
    come, and a residual or trace difference under an opt-in flag: question; a residual or rule
    difference of a default pipeline: bug."""
    def t(cls: str, why: str) -> Triage:
        return Triage(class_=cls, reason=f"suggested: {why}")
    if f.check in ("gradient", "crash", "timeout"):
        return t("bug", {"gradient": "remat changed a gradient", "crash": "the process crashed",
                         "timeout": "the run hung"}[f.check])
    if f.check == "error":
        got = f.detail.get("got") if isinstance(f.detail.get("got"), dict) else None
        if got is None:
            return t("question", "an error the expectations ask for was not raised")
        if got.get("type") in INTERNAL_ERRORS or _INTERNAL_MESSAGE.search(str(got.get("message", ""))):
            return t("bug", f"an internal error ({got.get('type')}) where no error is expected")
        return t("question", f"{got.get('type')} where the expectations ask for none: documented or not?")
    if OPT_IN.search(f.pipeline):
        return t("question", f"a {f.check} difference under an opt-in implementation ({pipeline_family(f.pipeline)})")
    return t("bug", f"a {f.check} difference of a default pipeline ({f.pipeline} vs {f.reference})")


def default_title(f: Finding) -> str:
    """A title until a person writes one: the check, the families and what the root needs."""
    check, pfam, rfam = family_key(f.check, f.pipeline, f.reference)
    if f.check == "error":
        raised = (f.detail.get("got") or {}).get("type") if isinstance(f.detail.get("got"), dict) else None
        what = f"raises {raised}" if raised else "does not raise the expected error"
    else:
        what = f"{f.check} differ from {rfam}"
    feats = root_features(f.features)
    return f"{pfam} {what}" + (f" ({', '.join(feats)})" if feats else "")


def stamp(f: Finding) -> Finding:
    """Give a new finding its causes (a residual difference), root key, its own variants, a title and a
    suggested class."""
    with_causes(f)
    f.root = root_key(f)
    if not f.variants:
        record_variant(f, finding_variants(f), f.first_seen, max(f.count, 1))
    if not f.title:
        f.title = default_title(f)
    if f.triage is None:
        f.triage = suggest_triage(f)
    return f
