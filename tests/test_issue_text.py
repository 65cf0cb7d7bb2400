"""The upstream issue text (`issue.md`): written for a bug or a question only, under 80 lines,
titled by the behaviour, with the short repro inline, the versions, the variants with counts and
what the reference is and why; a documented behaviour or a harness limit gets one line saying why
there is none."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conformance.engine.describe import MAX_ISSUE_LINES, behaviour_title, variants_text, wants_issue
from conformance.engine.findings import CorpusEntry, Finding, Seen
from conformance.engine.loading import load_corpus_root
from conformance.ir.verdict import Triage
from conformance.reporting.issue_text import corpus_issue_text, issue_text_or_reason
from conformance.repro.plan import ReproError
from tests.corpus_files import variant_path

ROOT = Path(__file__).resolve().parents[1]
REG = ROOT / "tests" / "regressions"
ENTRY = variant_path("residuals-jax_remat3-a9721056")   # a root's program as a plain corpus entry
VARIANTS = {"pipelines": {"jax:remat3": Seen(count=4, first_seen=3.0), "jax:remat3:jit": Seen(count=2, first_seen=9.0)},
            "labels": {"other": Seen(count=5), "extra": Seen(count=1)},
            "policies": {"nothing": Seen(count=3, first_seen=2.0), "dots": Seen(count=3, first_seen=1.0)}}


def _finding(path=ENTRY) -> Finding:
    return CorpusEntry.model_validate(json.loads(path.read_text())).finding


def _root(tmp_path, cls: str, entries=(ENTRY, variant_path("residuals-jax_remat3-f055f5d8")), why: str = "") -> Path:
    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from corpus_root import make_root, write_root
    finally:
        sys.path.remove(str(ROOT / "tools"))
    d = tmp_path / "corpus"
    d.mkdir(exist_ok=True)
    obj = make_root(f"remat3-{cls}", f"remat3 saves other residuals than remat2 ({cls})", cls, f"why {cls}",
                    ["https://example.org/doc"] if cls == "documented" else [], list(entries), why)
    return write_root(d, f"remat3-{cls}", obj, list(entries), remove=False)


def _corpus_files():
    return [p for p in sorted(REG.glob("*.json")) if p.name != "status.json"]


@pytest.mark.parametrize("path", _corpus_files(), ids=lambda p: p.stem)
def test_every_corpus_entry_has_a_short_issue_text_a_maintainer_can_paste(path):
    """Every corpus file (a root: its representative, with the root's title, reference_why and the
    variants of all its programs; a plain entry: its finding) gives an issue text under 80 lines,
    or, for a documented behaviour or a harness limit, one line saying why there is none."""
    root, variants = load_corpus_root(str(path))
    f = variants[0][3]
    t = corpus_issue_text(path)
    lines = t.splitlines()
    assert len(lines) < 80, (path.name, len(lines))
    if not wants_issue(f):
        assert len(lines) == 1 and lines[0].startswith("No issue text: "), t
        return
    assert lines[0] == f"# {behaviour_title(f)}", (path.name, lines[0])
    if root is not None:
        assert lines[0] == f"# {root.title}"
        if root.reference_why:
            assert root.reference_why.strip().rstrip(".") in t
    assert next(x for x in lines if x.startswith("Expected")) and next(x for x in lines if x.startswith("Actual: "))
    for part in ("- Versions: ", "- Variants seen: pipelines: ", " is the reference: ", "- Class: "):
        assert part in t, (path.name, part)
    assert "could not be written" not in t and "the short repro failed" not in t
    if "```python\n" in t:
        src = t.split("```python\n", 1)[1].split("\n```", 1)[0]
        compile(src, path.name, "exec")   # the inline repro is Python that runs as pasted
        assert "import conformance" not in src and "from conformance" not in src
    else:
        assert "No short repro inline: " in t and "--full" in t, t


def test_the_issue_text_is_titled_by_the_behaviour_and_shows_the_variants_with_counts():
    f = _finding().model_copy(update={"title": "remat3 drops a named residual", "variants": VARIANTS,
                                      "triage": Triage(class_="bug", reason="a person read it", confirmed=True)})
    t = issue_text_or_reason(f)
    lines = t.splitlines()
    assert lines[0] == "# remat3 drops a named residual" and len(lines) < MAX_ISSUE_LINES + 1
    assert ("- Variants seen: pipelines: jax:remat3 x4, jax:remat3:jit x2; labels: other x5, extra x1; "
            "policies: dots x3, nothing x3") in t
    assert "- Class: bug: a person read it" in t
    assert "- Why `jax:remat2` is the reference: it runs the same program through the same API and policy" in t
    assert "- Versions: jax 0.12.0.1, jaxlib 0.12.0.1" in t
    # a title the rules made up (roots.default_title) reads less well than the sentence of the program
    from conformance.engine.roots import default_title
    g = _finding()
    assert behaviour_title(g.model_copy(update={"title": default_title(g)})).startswith("jax:remat3: saves fewer")
    # also another finding's placeholder, kept where a smaller program folded into it
    other = "jax:remat3 trace_count differ from jax:remat2 (custom_vjp, symbolic_zeros)"
    assert behaviour_title(g.model_copy(update={"title": other})).startswith("jax:remat3: saves fewer")


def test_variants_text_orders_by_count_then_first_seen_and_leaves_out_no_label():
    assert variants_text(VARIANTS) == ("pipelines: jax:remat3 x4, jax:remat3:jit x2; labels: other x5, extra x1; "
                                       "policies: dots x3, nothing x3")
    assert variants_text({"labels": {"-": Seen(count=2), "extra": Seen(count=1)}, "features": {}}) == "labels: extra x1"
    assert variants_text({"labels": {"-": Seen(count=2)}}) == "none recorded"
    many = {"pipelines": {f"p{k}": Seen(count=1) for k in range(10)}}
    assert variants_text(many, limit=3) == "pipelines: p0 x1, p1 x1, p2 x1, 7 more"


@pytest.mark.parametrize("cls", ["documented", "harness"])
def test_no_issue_text_for_a_documented_behaviour_or_a_harness_limit(tmp_path, cls):
    f = _finding().model_copy(update={"triage": Triage(class_=cls, reason=f"why {cls}", confirmed=True)})
    assert not wants_issue(f)
    t = issue_text_or_reason(f)
    what = {"documented": "a documented behaviour", "harness": "a limit of this harness"}[cls]
    assert t == f"No issue text: {what}: \"{behaviour_title(f)}\": why {cls}\n"
    # a corpus root of that class: the same one line, with the links it cites
    root = _root(tmp_path, cls)
    t = corpus_issue_text(root)
    assert t.startswith(f"No issue text: {what}: \"remat3 saves other residuals than remat2 ({cls})\": why {cls}")
    assert t.count("\n") == 1 and "```" not in t
    assert ("(see https://example.org/doc)" in t) == (cls == "documented")


def test_a_corpus_roots_issue_text_has_its_title_reference_why_and_all_its_variants(tmp_path):
    why = "remat2 is the implementation jax.checkpoint has shipped for years; remat3 replaces it"
    root = _root(tmp_path, "bug", why=why)
    t = corpus_issue_text(root)
    lines = t.splitlines()
    assert lines[0] == "# remat3 saves other residuals than remat2 (bug)" and len(lines) < 80
    assert f"is the reference: {why}." in t
    # both programs' labels (missing, extra), each counted
    assert "labels: " in t and "missing x1" in t and "extra x1" in t, t
    assert "- Class: bug: why bug" in t
    assert "- Seen: 2 program(s) in the regression-corpus root `remat3-bug`" in t


def test_a_long_or_missing_short_repro_keeps_the_text_under_80_lines(monkeypatch):
    import conformance.repro.short as short
    f = _finding()
    monkeypatch.setattr(short, "short_repro", lambda *a, **k: "\n".join(f"x{k} = {k}" for k in range(200)))
    t = issue_text_or_reason(f)
    assert len(t.splitlines()) < 80 and "the short repro is 200 lines, too long to inline" in t and "```" not in t
    assert "remat-conformance repro corpus/residuals-jax_remat3-a9721056.json --full" in t
    def no_short_form(*a, **k):
        raise ReproError("no short form for this program")
    monkeypatch.setattr(short, "short_repro", no_short_form)
    t = issue_text_or_reason(f)
    assert len(t.splitlines()) < 80 and "No short repro inline: no short form for this program" in t


def test_a_short_repro_that_fits_is_inlined(monkeypatch):
    import conformance.repro.short as short
    src = "import jax\n\n\n\nprint('REPRODUCES')\nraise SystemExit(1)\n"
    monkeypatch.setattr(short, "short_repro", lambda *a, **k: src)
    t = issue_text_or_reason(_finding())
    block = t.split("```python\n", 1)[1].split("\n```", 1)[0]
    assert block == "import jax\n\nprint('REPRODUCES')\nraise SystemExit(1)"   # blank runs read as one
    assert ("## Repro (jax and numpy only; exit status 1 while the behaviour reproduces, 0 once fixed, 3 where the "
            "release cannot run it)") in t
