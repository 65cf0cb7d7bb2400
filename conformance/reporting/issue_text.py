"""An upstream-ready issue text per finding (`issue.md`), written for a bug or a question only:
the behaviour's title, one sentence of what is expected (and which reference says so) and one of
what happens, what the reference is and why it is the reference, versions and flags, the variants
the harness saw (pipelines, labels, policies, with counts), its class, and the short standalone
repro inline (conformance.repro.short), all under 80 lines. A documented behaviour or a harness
limit gets a one-line reason instead. The words it shares with every output are
conformance.engine.describe's."""
from __future__ import annotations

from pathlib import Path

from conformance.engine.describe import (
    MAX_ISSUE_LINES,
    behaviour_title,
    expected_actual,
    first_seen_text,
    is_setting,
    no_issue_reason,
    reference_subject,
    root_variants,
    triage_of,
    triage_text,
    variants_of,
    variants_text,
    wants_issue,
    why_reference,
)
from conformance.engine.findings import decode_inputs
from conformance.engine.loading import corpus_entry_stem, load_corpus_root
from conformance.ir.program import Program
from conformance.ir.releases import CANNOT_RUN
from conformance.pipelines import registry
from conformance.repro import short
from conformance.repro.plan import ReproError

REPRO_HEAD = "\n## Repro"   # where an issue text's repro section starts
NOT_WRITTEN = "The issue text could not be written: "


def short_repro_or_reason(prog, inputs, f) -> tuple[str | None, str]:
    """(the short repro's source, "") or (None, why there is none)."""
    try:
        return short.short_repro(prog, inputs, f), ""
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
                   programs: int | None = None, releases=None, started: str | None = None) -> str:
    """The issue text of finding `f` (its program `prog` and `inputs`): under 80 lines.
    `reference_why`: a corpus root's own words for why its reference is the reference;
    `variants`: the root's variants (default: the finding's); `entry`: the corpus file a
    maintainer's harness reads (default: the campaign's corpus entry of the finding); `root` and
    `programs`: the corpus root's slug and how many programs it holds; `releases`: its bisection (ReleaseRange);
    `started`: when its campaign started (run.json), said beside the first-seen time."""
    exp, act = expected_actual(f)
    fw = registry.framework_of(f.pipeline)
    fw = fw if fw in registry.FRAMEWORKS else "jax"
    entry = entry or f"corpus/{corpus_entry_stem(f.check, f.pipeline, f.program_hash)}.json"
    t = triage_of(f)
    vs = ", ".join(f"{k} {v}" for k, v in sorted(f.versions.items()))
    flags = ", ".join(f"{k}={v}" for k, v in sorted(f.flags.items()) if is_setting(k, v)) or "defaults"
    seen = f"{f.count} program(s), " + (f"{first_seen_text(f)}" + (f" (campaign started {started})" if started else "")
                                       if f.first_seen is not None else "first seen: unknown")
    if root is not None:
        seen = (f"{programs or 1} program(s) in the regression-corpus root `{root}`"
                + (f"; the one below {first_seen_text(f)} that found it" if f.first_seen is not None else ""))
    if cells:
        seen += "; matrix cells: " + "; ".join(c or "(single cell)" for c in cells)
    why = (reference_why or why_reference(f)).strip().rstrip(".")
    lines = [
        f"# {behaviour_title(f)}", "",
        exp, act, "",
        f"- Why {reference_subject(f.reference)} is the reference: {why}.",
        f"- Versions: {vs or 'unknown'}; device: {f.device}; flags: {flags}",
        f"- Variants seen: {variants_text(variants if variants is not None else variants_of(f))}",
        f"- Seen: {seen}",
        "- Releases: " + (releases.sentence() if releases
                          else f"not bisected yet (`remat-conformance bisect {entry}`)"),
        f"- Class: {triage_text(t)}",
        f"- Harness: `remat-conformance repro {entry}` (signature `{f.signature}`)", "",
    ]
    src, why_not = short_repro_or_reason(prog, inputs, f)
    if src is not None:
        body = _squeeze(src)
        head = (f"## Repro ({fw} and numpy only; exit status 1 while the behaviour reproduces, 0 once fixed, "
                f"{CANNOT_RUN} where the release cannot run it)")
        if len(lines) + len(body) + 4 <= MAX_ISSUE_LINES:
            return "\n".join(lines + [head, "", "```python", *body, "```"]) + "\n"
        why_not = f"the short repro is {len(body)} lines, too long to inline"
    lines += ["## Repro", "",
              f"No short repro inline: {why_not}.",
              f"The harness's generic standalone script ({fw} and numpy only; exit status 1 while the "
              f"behaviour reproduces): `remat-conformance repro {entry} --full`."]
    return "\n".join(lines) + "\n"


def issue_text_or_reason(f, cells: list[str] | None = None, *, reference_why: str = "", variants: dict | None = None,
                         entry: str | None = None, root: str | None = None, programs: int | None = None,
                         releases=None, started: str | None = None) -> str:
    """What `issue.md` holds for a finding as a campaign holds it (program and encoded inputs): its
    issue text for a bug or a question; for a documented behaviour or a harness limit, one line
    saying why there is none (wants_issue tells a caller that would rather not write it). A text
    failure never costs the campaign its corpus entry: the reason is written instead."""
    if not wants_issue(f):
        return no_issue_reason(f)
    try:
        return issue_markdown(Program.model_validate(f.program), decode_inputs(f.inputs) if f.inputs else None,
                              f, cells, reference_why=reference_why, variants=variants, entry=entry, root=root,
                              programs=programs, releases=releases, started=started)
    except Exception as e:  # noqa: BLE001 - a report text, never a reason to lose a finding
        return f"# {f.signature}\n\n{NOT_WRITTEN}{type(e).__name__}: {e}\n"


def corpus_issue_text(path) -> str:
    """The issue text of a regression-corpus file: a root's representative, with the root's title,
    class, reference_why and the variants of all its programs; a plain entry's finding."""
    import os
    root, variants = load_corpus_root(str(path))
    f = variants[0][3]
    if f is None:
        raise ValueError(f"{path}: a bare program has no issue text")
    name = os.path.relpath(path) if not os.path.relpath(path).startswith("..") else Path(path).name
    if root is None:
        return issue_text_or_reason(f, entry=name)
    return issue_text_or_reason(f, reference_why=root.reference_why, variants=root_variants(v[3] for v in variants),
                                entry=name, root=root.root, programs=len(variants), releases=root.releases)
