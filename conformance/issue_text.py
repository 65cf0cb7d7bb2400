"""An upstream-ready issue text per finding (`issue.md`): a title that names the behaviour, one
sentence of what is expected (and which reference says so) and one of what happens, versions and
flags, the standalone repro inline, and how often and since when the harness saw it."""
from __future__ import annotations

import json

from conformance import pipelines as registry
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


# What a run recorded beside the framework settings (graph counts, policy calls, cache paths):
# observations, not settings a maintainer sets.
_NOT_SETTINGS = {"custom_rules_observable", "inductor_cache_dir", "graph_breaks", "graphs"}


def _is_setting(k: str, v) -> bool:
    return isinstance(v, (bool, str)) and k not in _NOT_SETTINGS and not k.startswith("policy_")


def issue_markdown(prog, inputs, f, cells: list[str] | None = None) -> str:
    """The issue text of finding `f` (its program `prog` and `inputs`)."""
    from conformance.repro.plan import ReproError, frameworks_for
    from conformance.repro.script import generate
    exp, act = expected_actual(f)
    fw = frameworks_for(f)[0]
    try:
        src = generate(prog, inputs, f, fw, None, filename="repro.py")
    except (ReproError, ValueError) as e:
        src = f"# no standalone repro: {e}"
    vs = ", ".join(f"{k} {v}" for k, v in sorted(f.versions.items()))
    flags = ", ".join(f"{k}={v}" for k, v in sorted(f.flags.items()) if _is_setting(k, v)) or "defaults"
    seen = f"{f.count} program(s) in the campaign that found it"
    if f.first_seen:
        seen += f", the first {float(f.first_seen):.0f} s into it"
    if cells:
        seen += "; matrix cells: " + "; ".join(c or "(single cell)" for c in cells)
    stem = corpus_entry_stem(f.check, f.pipeline, f.program_hash)
    siblings = ", ".join(f"`{k[1]}`" for k in f.reproduces if k[1] != f.pipeline)
    lines = [
        f"# {title(f)}", "",
        exp, act, "",
        f"- Versions: {vs or 'unknown'}; device: {f.device}",
        f"- Flags: {flags}",
        f"- Program features: {', '.join(f.features)}",
        *([f"- Also fails the same way on: {siblings}"] if siblings else []),
        f"- Seen: {seen}",
        f"- Harness signature: `{f.signature}` (corpus entry `{stem}.json`)", "",
        f"## Standalone repro ({fw}; exit status 1 while the behaviour reproduces)", "",
        "```python", src.rstrip(), "```", "",
    ]
    return "\n".join(lines)


def issue_text_or_reason(f, cells: list[str] | None = None) -> str:
    """The issue text of a finding as a campaign holds it (program and encoded inputs); a text
    failure never costs the campaign its corpus entry: the reason is written instead."""
    from conformance.findings import decode_inputs
    from conformance.ir import Program
    try:
        return issue_markdown(Program.model_validate(f.program), decode_inputs(f.inputs) if f.inputs else None,
                              f, cells)
    except Exception as e:  # noqa: BLE001 - a report text, never a reason to lose a finding
        return f"# {f.signature}\n\nThe issue text could not be written: {type(e).__name__}: {e}\n"
