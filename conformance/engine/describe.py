"""A finding in words, as every output says it (summary.md, the report, recheck, issue.md): the
class order (bugs first), a finding's title and triage class with its reason, what is expected and
what happens, which reference says so and why, its variants with counts, and whether it wants an
upstream issue text (conformance.reporting.issue_text writes that text)."""
from __future__ import annotations

import json
import re

from conformance.engine.findings import VARIANT_DIMENSIONS, Seen
from conformance.engine.roots import default_title, finding_variants, merge_variants, suggest_triage
from conformance.ir.verdict import CHECK, DEVICE_REFERENCE, Triage
from conformance.pipelines import registry

# Which reference says what is expected, by the finding's reference (a pipeline's role or a verdict
# reference): the words a maintainer reads.
_AUTHORITY = {
    "policy": "the checkpoint policy's documented meaning",
    "expectations": "the harness's expectations data (oracles/expectations.json)",
    DEVICE_REFERENCE: "the same pipeline on the CPU",
}


def authority(reference: str) -> str:
    if reference in _AUTHORITY:
        return _AUTHORITY[reference]
    role = registry.role_of(reference) if reference in registry.known_names() else ""
    if reference == registry.value_reference():
        return f"`{reference}`, the same program in float64 without rematerialization"
    if role == registry.BASELINE:
        return f"`{reference}`, the same program without rematerialization (the no-remat gradient)"
    return f"`{reference}`, which claims the same semantics"


def _err(detail: dict, limit: int = 300) -> str:
    got = detail.get("got") if isinstance(detail.get("got"), dict) else {}
    msg = (got.get("message") or "").strip().splitlines()
    first = msg[0] if msg else ""
    first = first if len(first) <= limit else first[:limit - 3].rstrip() + "..."
    return f"{got.get('type', 'an error')}: {first}" if first else got.get("type", "an error")


_RULE_WORDS = {"names": "names policy", "dots": "dots policy", "everything": "save-everything policy",
               "everything_but_names": "save-anything-except-names policy", "custom": "custom policy",
               "nothing": "save-nothing policy"}
_DECISION_WORDS = {"save": "saves", "offload": "offloads", "recompute": "recomputes"}
_CAUSE = re.compile(r"^(?P<head>.*?) \[(?P<chain>[^\]]*)\](?P<tail>.*)$")


def cause_text(cause: str) -> str:
    """A residual difference's cause (oracles.residual_causes) as a sentence's predicate: "recomputes a value
    named in a custom_vjp fwd that its names policy saves"."""
    m = _CAUSE.match(cause)
    if m is None:
        return cause
    head, chain, tail = m.group("head"), m.group("chain"), m.group("tail")
    for verb in ("saves", "recomputes"):
        if head.startswith(f"{verb} against its policy "):
            head = f"{verb} " + head.removeprefix(f"{verb} against its policy ")
    if chain == "boundary":   # (a loop's carry or slice outside every region)
        return f"{head} (outside every checkpoint region){tail}"
    steps = _steps(chain)
    outer = "; ".join(f"the outer {words} it" for words in steps[:-1])
    return f"{head} that its {steps[-1]}" + (f" ({outer})" if outer else "") + tail


def _steps(chain: str) -> list[str]:
    """Each policy of a cause's chain (`names:save > nothing:recompute`) in words, outermost first: "names policy
    saves"."""
    return [f"{_RULE_WORDS.get(r, r)} {_DECISION_WORDS.get(d, d)}"
            for r, d in (x.split(":", 1) for x in chain.split(" > "))]


def residual_title(f, causes: list[str]) -> str:
    """A residual difference named by its first cause, and what the reference does with that value."""
    first = causes[0]
    more = f" (and {len(causes) - 1} more cause{'s' * (len(causes) > 2)})" if len(causes) > 1 else ""
    if f.reference == "policy":
        return f"{f.pipeline} {cause_text(first)}{more}"
    against = (f", which {f.reference} saves" if first.startswith("recomputes ")
               else f", which {f.reference} does not save")
    return f"{f.pipeline} {cause_text(first)}{against}{more}"


def effect_or_rule_title(f, causes: list[str]) -> str:
    """An effect count or custom rule difference named by its first cause: "jax:remat3: callback runs more in a
    region (its custom policy saves it) than under jax:remat2"."""
    first = causes[0]
    more = f" (and {len(causes) - 1} more cause{'s' * (len(causes) > 2)})" if len(causes) > 1 else ""
    m = _CAUSE.match(first)
    if m is not None and m.group("chain") != "boundary":
        steps = _steps(m.group("chain"))
        said = "; ".join(f"{'the outer' if k < len(steps) - 1 else 'its'} {words} it" for k, words in enumerate(steps))
        first = f"{m.group('head')} ({said}){m.group('tail')}"
    return f"{f.pipeline}: {first}, against {f.reference}{more}"


def title(f) -> str:
    """One line naming the behaviour (no harness jargon beyond the pipeline's name)."""
    d = f.detail
    if f.check == "residuals" and d.get("causes"):
        return residual_title(f, list(d["causes"]))
    if f.check in ("effect_count", "custom_rule") and d.get("causes"):
        return effect_or_rule_title(f, list(d["causes"]))
    if f.check == "error":
        if isinstance(d.get("expected"), dict):
            return f"{f.pipeline}: does not raise the documented error (/{d['expected'].get('regex', '')}/)"
        return f"{f.pipeline}: raises {_err(d, 100)}"
    if f.check == "residuals":
        if f.reference == "policy":
            return f"{f.pipeline}: saves values its checkpoint policy says to recompute"
        what = {"missing": "saves fewer residuals than", "extra": "saves more residuals than",
                "named": "saves other named residuals than"}.get(f.error_type, "saves other residuals than")
        return f"{f.pipeline}: {what} {f.reference} under the same policy"
    return CHECK[f.check].title.format(pipeline=f.pipeline, reference=f.reference, value=d.get("value", "values"),
                                       label=(f.error_type or "no error type").replace("+", ", "))


def expected_actual(f) -> tuple[str, str]:
    d = f.detail
    who = authority(f.reference)
    if f.check == "error":
        if isinstance(d.get("expected"), dict):
            e = d["expected"]
            return (f"Expected ({who}): an error of type /{e.get('type')}/ matching /{e.get('regex')}/.",
                    "Actual: " + (f"raises {_err(d)}." if d.get("got") else "no error is raised."))
        others = ", ".join(f"`{p}`" for p in d.get("status_differs_from", [])) or "the reference"
        return (f"Expected: no error, as {others} runs the same program.", f"Actual: raises {_err(d)}.")
    if f.check == "gradient":
        return (f"Expected ({who}): the same {d.get('value', 'values')} within rtol {d.get('rtol')}, "
                f"atol {d.get('atol')} (rematerialization must not change values).",
                f"Actual: {d.get('got')} where the reference gives {d.get('want')} "
                f"(max abs error {d.get('max_abs_err')}).")
    if f.check == "residuals":
        if f.reference == "policy":
            return (f"Expected ({who}): values the policy marks for recomputation are not saved.",
                    f"Actual: saved {d.get('saved') or d.get('extra') or d}.")
        return (
            f"Expected ({who}): the same saved residuals: {d.get('reference_saved', '?')}.",
            f"Actual: {d.get('saved', '?')}"
            + (f" (missing named {d['missing_named']})" if d.get("missing_named") else "")
            + (f" (extra named {d['extra_named']})" if d.get("extra_named") else "")
            + ".",
        )
    if isinstance(d.get("blocks"), dict):  # custom_rule, trace_count: per custom-rule block, per observation
        parts = [
            f"in `{b}`, {k}: {json.dumps(v.get('got'))} where `{f.reference}` gives {json.dumps(v.get('reference'))}"
            for b, obs in sorted(d["blocks"].items())
            if isinstance(obs, dict)
            for k, v in sorted(obs.items())
            if isinstance(v, dict)
        ]
        if parts:
            return (f"Expected ({who}): the custom rules see and run the same under `{f.pipeline}`.",
                    "Actual: " + "; ".join(parts)[:600] + ".")
    return (CHECK[f.check].expected.format(who=who, reference=f.reference, pipeline=f.pipeline),
            f"Actual: {json.dumps(d, sort_keys=True, default=str)[:400]}.")


# -- classes, titles and variants: what summary.md, the report and recheck show alike ------------
# Bugs first, then what upstream must decide, then what is documented, then the harness's limits.
CLASS_ORDER = ("bug", "question", "documented", "harness")
CLASS_HEADINGS = {"bug": "Bugs", "question": "Questions for upstream", "documented": "Documented behaviours",
                  "harness": "Harness limits"}
# The classes an issue text is written for: a bug to report, a question to ask.
ISSUE_CLASSES = ("bug", "question")
MAX_ISSUE_LINES = 79     # an issue text is under 80 lines
_SUGGESTED = "suggested: "


def triage_of(f) -> Triage:
    """The finding's class: a person's (the corpus), or the one the rules suggest."""
    if f.triage is not None:
        return f.triage
    return suggest_triage(f)


def class_rank(f) -> int:
    c = triage_of(f).class_
    return CLASS_ORDER.index(c) if c in CLASS_ORDER else len(CLASS_ORDER)


def class_label(t: Triage) -> str:
    """`bug`, or `bug (suggested)` where no person has confirmed it."""
    return t.class_ if t.confirmed else f"{t.class_} (suggested)"


def triage_reason(t: Triage) -> str:
    return t.reason[len(_SUGGESTED):] if t.reason.startswith(_SUGGESTED) else t.reason


def triage_text(t: Triage) -> str:
    """`bug (suggested): why`, with the links a person cited."""
    links = f" (see {', '.join(t.links)})" if t.links else ""
    return f"{class_label(t)}: {triage_reason(t)}{links}"


def triage_json(t: Triage) -> dict:
    return {"class": t.class_, "reason": t.reason, "links": list(t.links), "confirmed": t.confirmed}


# What roots.default_title writes (a finding folded into another keeps the other's, so it need
# not be this finding's own): "<family> raises T", "<family> does not raise the expected error",
# "<family> <check> differ from <family>", each with the root's features in parentheses.
_PLACEHOLDER = re.compile(r"^\S+ (raises \S+|does not raise the expected error|\w+ differ from \S+)( \(.*\))?$")


def behaviour_title(f) -> str:
    """The title a person wrote for the root, else a sentence naming what the representative
    program shows (roots.default_title, the rules' placeholder, reads less well)."""
    if f.title and f.title != default_title(f) and not _PLACEHOLDER.match(f.title):
        return f.title
    return title(f)


def variants_of(f) -> dict[str, dict[str, Seen]]:
    """The finding's variants by dimension; a finding written before variants were counted has
    its own program's, counted as often as the finding."""
    if f.variants:
        return f.variants
    out: dict[str, dict[str, Seen]] = {}
    for dim, values in finding_variants(f).items():
        for v in values:
            out.setdefault(dim, {})[v] = Seen(count=max(f.count, 1), first_seen=f.first_seen)
    return out


def root_variants(findings) -> dict[str, dict[str, Seen]]:
    """The variants of a corpus root: those of each of its programs' findings, counts added."""
    findings = list(findings)
    if not findings:
        return {}
    acc = findings[0].model_copy(update={"variants": {}})
    for g in findings:
        merge_variants(acc, g.model_copy(update={"variants": variants_of(g)}))
    return acc.variants


def _ordered(seen: dict[str, Seen]) -> list[tuple[str, Seen]]:
    far = float("inf")
    return sorted(seen.items(), key=lambda kv: (-kv[1].count, kv[1].first_seen if kv[1].first_seen is not None
                                                else far, kv[0]))


def variants_text(variants: dict[str, dict[str, Seen]], dims=VARIANT_DIMENSIONS, limit: int = 8) -> str:
    """`pipelines: jax:remat3 x4, jax:remat3:jit x2; labels: other x5, extra x1; policies: ...`:
    each dimension's values, most seen first (no label, "-", is left out)."""
    parts = []
    for dim in dims:
        items = [(v, s) for v, s in _ordered(variants.get(dim) or {}) if v != "-"]
        if not items:
            continue
        shown = [f"{v} x{s.count}" for v, s in items[:limit]]
        if len(items) > limit:
            shown.append(f"{len(items) - limit} more")
        parts.append(f"{dim}: {', '.join(shown)}")
    return "; ".join(parts) or "none recorded"


def variants_json(variants: dict[str, dict[str, Seen]]) -> dict[str, list[dict]]:
    """{dimension: [{value, count, first_seen}]}, most seen first (report.json)."""
    return {dim: [{"value": v, "count": s.count, "first_seen": s.first_seen} for v, s in _ordered(seen)]
            for dim, seen in variants.items() if seen}


def first_seen_text(f) -> str:
    if f.first_seen is None:
        return ""
    return f"first seen {float(f.first_seen):.0f} s into the campaign"


def by_class(items, triage=triage_of) -> list[tuple[str, list]]:
    """[(class, items of it)] in CLASS_ORDER, empty classes left out; items keep their order."""
    groups: dict[str, list] = {}
    for x in items:
        groups.setdefault(triage(x).class_, []).append(x)
    order = list(CLASS_ORDER) + sorted(c for c in groups if c not in CLASS_ORDER)
    return [(c, groups[c]) for c in order if c in groups]


# -- the reference: what it is and why it is the reference ----------------------------------------
def _compare_mode(pipeline: str, reference: str) -> str | None:
    try:
        spec = registry.spec(pipeline)
    except Exception:  # noqa: BLE001 - a name from another harness version
        return None
    return next((c.mode for c in spec.compare if reference in c.refs), None)


def why_reference(f) -> str:
    """Why the finding's reference says what is expected (a corpus root's `reference_why`, where
    a person wrote one, says it better)."""
    ref, pipe = f.reference, f.pipeline
    if ref == "policy":
        return ("a checkpoint policy names what may be saved for the backward pass; a value it marks "
                "for recomputation must not be saved")
    if ref == "expectations":
        return ("it records each error a pipeline documents it raises (or must not raise), each entry "
                "citing the documentation or the upstream discussion it rests on")
    if ref == "vjp":
        return "it is what the vjp closure really saved, which a residual report must describe"
    if ref == DEVICE_REFERENCE:
        return "a device changes speed, not values nor what is saved"
    role = registry.role_of(ref) if ref in registry.known_names() else None
    if role == registry.VALUE:
        return ("rematerialization trades memory for recomputation and must not change values: the "
                "float64 result without it is what every pipeline is held to, within its dtype's tolerance")
    if role == registry.BASELINE:
        return "checkpointing changes what is saved and recomputed, never the values computed"
    return WHY_COMPARED[_compare_mode(pipe, ref) or registry.CompareMode.SAME].format(pipe=pipe)


# Why a reference compared in each mode is the reference (tests: every mode has a sentence).
WHY_COMPARED = {
    registry.CompareMode.EAGER: ("it runs the same program eagerly, and compiling it (`{pipe}`) must not change "
                                 "what its checkpoint policy decides nor the values"),
    registry.CompareMode.BUDGET: ("it runs the same program under a higher activation memory budget, and a lower "
                                  "one must not save more"),
    registry.CompareMode.CROSS: ("it runs the same program in the other framework: the values and the named "
                                 "residuals must agree"),
    registry.CompareMode.VALUES: "it runs the same program with the same semantics: the values must agree",
    registry.CompareMode.SAME: ("it runs the same program through the same API and policy, and `{pipe}` is another "
                                "implementation of that API that claims the same semantics"),
}


def reference_subject(ref: str) -> str:
    return f"`{ref}`" if ref in registry.known_names() else authority(ref)


# -- the issue text ------------------------------------------------------------------------------
# What a run recorded beside the framework settings (graph counts, policy calls, cache paths):
# observations, not settings a maintainer sets.
_NOT_SETTINGS = {"custom_rules_observable", "inductor_cache_dir", "graph_breaks", "graphs"}


def is_setting(k: str, v) -> bool:
    return isinstance(v, (bool, str)) and k not in _NOT_SETTINGS and not k.startswith("policy_")


def wants_issue(f) -> bool:
    """Whether an issue text is written for the finding: a bug or a question, not a documented
    behaviour nor a limit of this harness."""
    return triage_of(f).class_ in ISSUE_CLASSES


def no_issue_reason(f) -> str:
    """The one line written instead of an issue text (a documented behaviour, a harness limit)."""
    t = triage_of(f)
    what = {"documented": "a documented behaviour", "harness": "a limit of this harness"}.get(t.class_, t.class_)
    return (f"No issue text: {what}{'' if t.confirmed else ' (suggested)'}: \"{behaviour_title(f)}\": "
            f"{triage_reason(t)}{' (see ' + ', '.join(t.links) + ')' if t.links else ''}\n")
