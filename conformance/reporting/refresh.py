"""Each finding's `issue.md` brought up to date with its results directory: a campaign writes it when
it first shrinks the finding (one program, that program's variants); at the end of the campaign
(`run`, a resumed one included) and whenever `report` reads the directory, it is rewritten with the
programs, the variants and the first-seen time that directory's summary.md shows for the finding.

One source of truth: the counts come from conformance.reporting.build.merge_findings over that one
directory, the aggregation summary.md and the report are built from, never counted again here. A
directory's issue texts say what that directory saw (a report over several shards still shows
each shard's issue text with that shard's counts, whatever else the report merged), so rewriting
them is idempotent. Each rewrite is atomic (conformance.engine.store.write_issue_text: a
temporary file, then os.replace); an unchanged text is left alone."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from conformance.engine.describe import wants_issue
from conformance.engine.loading import corpus_entry_stem
from conformance.engine.store import CORPUS, issue_path, write_issue_text
from conformance.files import InputRefused, read_text
from conformance.reporting.build import merge_findings
from conformance.reporting.inputs import RunData
from conformance.reporting.issue_text import NOT_WRITTEN, REPRO_HEAD, issue_text_or_reason


def keep_repro(text: str, before: str | None) -> str:
    """`text`, or where it has no short repro inline and the text it replaces had one (a report run where
    the finding's pipeline or framework is not installed, or a plugin's pipeline not loaded), its head
    (the counts, variants, first-seen time) with the old repro: a refresh never loses a repro."""
    if (before is None or "```python\n" in text or "```python\n" not in before
            or REPRO_HEAD not in text or REPRO_HEAD not in before):
        return text
    return text[:text.index(REPRO_HEAD)] + before[before.index(REPRO_HEAD):]


@dataclass
class Refreshed:
    written: list[Path] = field(default_factory=list)     # issue texts rewritten (or, with create, written)
    unchanged: list[Path] = field(default_factory=list)   # already up to date: not rewritten
    warnings: list[str] = field(default_factory=list)     # what could not be written, and why


def refresh_issue_texts(run: RunData, *, create: bool = False) -> Refreshed:
    """Rewrite the issue text of each finding of run directory `run.dir` that has one, from the same
    merged findings its summary.md shows (programs, variants, first-seen time). Only a finding whose
    corpus entry is in that directory's corpus/ is written; with `create` (the campaign, which owns
    its directory) a missing issue text of a bug or a question is written too, without it (`report`,
    which only reads what it is given) only an existing one is rewritten. A text that cannot be
    written (a read-only directory) is a warning, never a lost report."""
    out = Refreshed()
    started = run.info.started if run.info is not None else None
    for m in merge_findings([run]):
        f = m.finding
        if not wants_issue(f):
            continue
        stem = corpus_entry_stem(f.check, f.pipeline, f.program_hash)
        p = issue_path(run.dir, stem)
        if not (run.dir / CORPUS / f"{stem}.json").is_file():
            continue   # a tracked root's variant, or an entry this directory does not hold
        there = p.exists() or p.is_symlink()
        if not there and not create:
            continue
        if there and (p.is_symlink() or not p.is_file()):
            out.warnings.append(f"{p}: not a regular file: its issue text is left alone")
            continue
        text = issue_text_or_reason(f, started=started)
        try:
            before = read_text(p) if there else None
        except InputRefused:
            before = None   # an unreadable old text is replaced
        if before is not None and text.startswith(f"# {f.signature}\n\n{NOT_WRITTEN}"):
            out.warnings.append(f"{p}: issue text not refreshed: {text.split(NOT_WRITTEN, 1)[1].strip()}")
            continue
        text = keep_repro(text, before)
        if text == before:
            out.unchanged.append(p)
            continue
        try:
            out.written.append(write_issue_text(run.dir, stem, text))
        except OSError as e:
            out.warnings.append(f"{p}: issue text not refreshed: {e.strerror or e}")
    return out
