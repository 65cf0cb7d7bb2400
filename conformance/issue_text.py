"""An upstream-ready issue text per finding (`issue.md`), written for a bug or a question only:
the behaviour's title, one sentence of what is expected (and which reference says so) and one of
what happens, what the reference is and why it is the reference, versions and flags, the variants
the harness saw (pipelines, labels, policies, with counts), its class, and the short standalone
repro inline (conformance.repro.short), all under 80 lines. A documented behaviour or a harness
limit gets a one-line reason instead.

Also the words every output shares (summary.md, the report, recheck): the class order (bugs
first), a finding's title, its class with the reason, and its variants with counts."""
from __future__ import annotations

import json
import re

from conformance import pipelines as registry
from conformance.findings import VARIANT_DIMENSIONS, Seen, Triage
from conformance.loading import corpus_entry_stem
from conformance.verdict import DEVICE_REFERENCE

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


def title(f) -> str:
    """One line naming the behaviour (no harness jargon beyond the pipeline's name)."""
    d = f.detail
    if f.check == "error":
        if isinstance(d.get("expected"), dict):
            return f"{f.pipeline}: does not raise the documented error (/{d['expected'].get('regex', '')}/)"
        return f"{f.pipeline}: raises {_err(d, 100)}"
    if f.check == "gradient":
        return f"{f.pipeline}: {d.get('value', 'values')} differ from {f.reference}"
    if f.check == "residuals":
        if f.reference == "policy":
            return f"{f.pipeline}: saves values its checkpoint policy says to recompute"
        what = {"missing": "saves fewer residuals than", "extra": "saves more residuals than",
                "named": "saves other named residuals than"}.get(f.error_type, "saves other residuals than")
        return f"{f.pipeline}: {what} {f.reference} under the same policy"
    if f.check == "custom_rule":
        return f"{f.pipeline}: custom rule receives other {f.error_type.replace('+', ', ')} than under {f.reference}"
    if f.check == "trace_count":
        return f"{f.pipeline}: custom rules traced or called a different number of times ({f.error_type})"
    return f"{f.pipeline}: {f.check} ({f.error_type or 'no error type'})"


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
        return (f"Expected ({who}): the same saved residuals: {d.get('reference_saved', '?')}.",
                f"Actual: {d.get('saved', '?')}" + (f" (missing named {d['missing_named']})" if d.get("missing_named") else "")
                + (f" (extra named {d['extra_named']})" if d.get("extra_named") else "") + ".")
    if isinstance(d.get("blocks"), dict):   # custom_rule, trace_count: per custom-rule block, per observation
        parts = [f"in `{b}`, {k}: {json.dumps(v.get('got'))} where `{f.reference}` gives {json.dumps(v.get('reference'))}"
                 for b, obs in sorted(d["blocks"].items()) if isinstance(obs, dict)
                 for k, v in sorted(obs.items()) if isinstance(v, dict)]
        if parts:
            return (f"Expected ({who}): the custom rules see and run the same under `{f.pipeline}`.",
                    "Actual: " + "; ".join(parts)[:600] + ".")
    return (f"Expected ({who}): the same observations as under `{f.reference}`.",
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
    from conformance.roots import suggest_triage
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
    from conformance.roots import default_title
    if f.title and f.title != default_title(f) and not _PLACEHOLDER.match(f.title):
        return f.title
    return title(f)


def variants_of(f) -> dict[str, dict[str, Seen]]:
    """The finding's variants by dimension; a finding written before variants were counted has
    its own program's, counted as often as the finding."""
    if f.variants:
        return f.variants
    from conformance.roots import finding_variants
    out: dict[str, dict[str, Seen]] = {}
    for dim, values in finding_variants(f).items():
        for v in values:
            out.setdefault(dim, {})[v] = Seen(count=max(f.count, 1), first_seen=f.first_seen)
    return out


def root_variants(findings) -> dict[str, dict[str, Seen]]:
    """The variants of a corpus root: those of each of its programs' findings, counts added."""
    from conformance.roots import merge_variants
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
    mode = _compare_mode(pipe, ref)
    if mode == "eager":
        return (f"it runs the same program eagerly, and compiling it (`{pipe}`) must not change what its "
                "checkpoint policy decides nor the values")
    if mode == "budget":
        return f"it runs the same program under a higher activation memory budget, and a lower one must not save more"
    if mode == "cross":
        return "it runs the same program in the other framework: the values and the named residuals must agree"
    if mode == "values":
        return "it runs the same program with the same semantics: the values must agree"
    return (f"it runs the same program through the same API and policy, and `{pipe}` is another "
            "implementation of that API that claims the same semantics")


def _reference_subject(ref: str) -> str:
    return f"`{ref}`" if ref in registry.known_names() else authority(ref)


# -- the issue text ------------------------------------------------------------------------------
# What a run recorded beside the framework settings (graph counts, policy calls, cache paths):
# observations, not settings a maintainer sets.
_NOT_SETTINGS = {"custom_rules_observable", "inductor_cache_dir", "graph_breaks", "graphs"}


def _is_setting(k: str, v) -> bool:
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


def short_repro_or_reason(prog, inputs, f) -> tuple[str | None, str]:
    """(the short repro's source, "") or (None, why there is none). Imported here: a harness
    without conformance.repro.short writes the text with its fallback."""
    try:
        from conformance.repro.short import short_repro
    except ImportError:
        return None, "this harness has no short repro"
    from conformance.repro.plan import ReproError
    try:
        return short_repro(prog, inputs, f), ""
    except ReproError as e:
        return None, str(e)
    except ImportError as e:   # a framework's short form not in this harness
        return None, f"this harness has no short repro for {f.pipeline} ({e})"
    except Exception as e:  # noqa: BLE001 - an issue text still says what it can
        return None, f"the short repro failed ({type(e).__name__}: {e})"


def _squeeze(src: str) -> list[str]:
    """The script's lines, runs of blank lines read as one (the same program, fewer lines)."""
    out: list[str] = []
    for line in src.rstrip().splitlines():
        if line.strip() or (out and out[-1].strip()):
            out.append(line.rstrip())
    return out


def issue_markdown(prog, inputs, f, cells: list[str] | None = None, *, reference_why: str = "",
                   variants: dict | None = None, entry: str | None = None, root: str | None = None,
                   programs: int | None = None) -> str:
    """The issue text of finding `f` (its program `prog` and `inputs`): under 80 lines.
    `reference_why`: a corpus root's own words for why its reference is the reference;
    `variants`: the root's variants (default: the finding's); `entry`: the corpus file a
    maintainer's harness reads (default: the campaign's corpus entry of the finding); `root` and
    `programs`: the corpus root's slug and how many programs it holds."""
    exp, act = expected_actual(f)
    fw = registry.framework_of(f.pipeline)
    fw = fw if fw in registry.FRAMEWORKS else "jax"
    entry = entry or f"corpus/{corpus_entry_stem(f.check, f.pipeline, f.program_hash)}.json"
    t = triage_of(f)
    vs = ", ".join(f"{k} {v}" for k, v in sorted(f.versions.items()))
    flags = ", ".join(f"{k}={v}" for k, v in sorted(f.flags.items()) if _is_setting(k, v)) or "defaults"
    seen = f"{f.count} program(s)" + (f", {first_seen_text(f)}" if f.first_seen else "")
    if root is not None:
        seen = (f"{programs or 1} program(s) in the regression-corpus root `{root}`"
                + (f"; the one below {first_seen_text(f)} that found it" if f.first_seen else ""))
    if cells:
        seen += "; matrix cells: " + "; ".join(c or "(single cell)" for c in cells)
    why = (reference_why or why_reference(f)).strip().rstrip(".")
    lines = [
        f"# {behaviour_title(f)}", "",
        exp, act, "",
        f"- Why {_reference_subject(f.reference)} is the reference: {why}.",
        f"- Versions: {vs or 'unknown'}; device: {f.device}; flags: {flags}",
        f"- Variants seen: {variants_text(variants if variants is not None else variants_of(f))}",
        f"- Seen: {seen}",
        f"- Class: {triage_text(t)}",
        f"- Harness: `remat-conformance repro {entry}` (signature `{f.signature}`)", "",
    ]
    src, why_not = short_repro_or_reason(prog, inputs, f)
    if src is not None:
        body = _squeeze(src)
        head = f"## Repro ({fw} and numpy only; exit status 1 while the behaviour reproduces, 0 once fixed)"
        if len(lines) + len(body) + 4 <= MAX_ISSUE_LINES:
            return "\n".join(lines + [head, "", "```python", *body, "```"]) + "\n"
        why_not = f"the short repro is {len(body)} lines, too long to inline"
    lines += ["## Repro", "",
              f"No short repro inline: {why_not}.",
              f"The harness's generic standalone script ({fw} and numpy only; exit status 1 while the "
              f"behaviour reproduces): `remat-conformance repro {entry} --full`."]
    return "\n".join(lines) + "\n"


def issue_text_or_reason(f, cells: list[str] | None = None, *, reference_why: str = "", variants: dict | None = None,
                         entry: str | None = None, root: str | None = None, programs: int | None = None) -> str:
    """What `issue.md` holds for a finding as a campaign holds it (program and encoded inputs): its
    issue text for a bug or a question; for a documented behaviour or a harness limit, one line
    saying why there is none (wants_issue tells a caller that would rather not write it). A text
    failure never costs the campaign its corpus entry: the reason is written instead."""
    from conformance.findings import decode_inputs
    from conformance.ir import Program
    if not wants_issue(f):
        return no_issue_reason(f)
    try:
        return issue_markdown(Program.model_validate(f.program), decode_inputs(f.inputs) if f.inputs else None,
                              f, cells, reference_why=reference_why, variants=variants, entry=entry, root=root,
                              programs=programs)
    except Exception as e:  # noqa: BLE001 - a report text, never a reason to lose a finding
        return f"# {f.signature}\n\nThe issue text could not be written: {type(e).__name__}: {e}\n"


def corpus_issue_text(path) -> str:
    """The issue text of a regression-corpus file: a root's representative, with the root's title,
    class, reference_why and the variants of all its programs; a plain entry's finding."""
    import os
    from pathlib import Path
    from conformance.loading import load_corpus_root
    root, variants = load_corpus_root(str(path))
    f = variants[0][3]
    if f is None:
        raise ValueError(f"{path}: a bare program has no issue text")
    name = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else Path(path).name
    if root is None:
        return issue_text_or_reason(f, entry=name)
    return issue_text_or_reason(f, reference_why=root.reference_why, variants=root_variants(v[3] for v in variants),
                                entry=name, root=root.root, programs=len(variants))
