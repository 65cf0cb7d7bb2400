"""Issue texts refreshed: a finding's `issue.md` is written when the finding is first shrunk (one
program, its variants); at the end of the campaign (a resumed one: over all its pieces) and when
`report` reads the results directory it is rewritten with what that directory's summary.md shows
of the finding: its programs, its variants and its first-seen time (one aggregation,
conformance.reporting.build.merge_findings), atomically (a temporary file, then os.replace)."""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import conformance.engine.store as store_module
import conformance.reporting.refresh as refresh
import conformance.repro.short as short
from conformance.cli.main import main as cli_main
from conformance.engine.describe import variants_of, variants_text
from conformance.engine.findings import Finding
from conformance.engine.loading import corpus_entry_stem
from conformance.engine.search import merge_finding
from conformance.engine.store import KILL_IN_WRITE_ENV
from conformance.reporting.build import merge_findings
from conformance.reporting.inputs import load_run
from conformance.reporting.refresh import refresh_issue_texts
from conformance.repro.plan import ReproError

REPO = Path(__file__).resolve().parents[1]
# The smallest campaign with a finding seen in several programs: a test-only pipeline whose gradients are
# always wrong (tests/mutants.py, a plugin), 8 programs; shrinking bounded by steps, so the run is the same
# every time (and the same in pieces: a resumed run checks what an uninterrupted one does).
ARGS = ["--pipelines", "jax:mutant-perturb-gradient", "--budget", "120", "--max-examples", "8", "--max-stmts", "3",
        "--shrink-steps", "5", "--shrink-seconds", "600", "--seed", "3", "--quiet", "--no-isolate", "--jobs", "1"]
ENV = {**os.environ, "PYTHONPATH": str(REPO), "REMAT_CONFORMANCE_PLUGINS": "tests.mutants"}
SEEN = re.compile(r"^- Seen: (\d+) program\(s\), (first seen (\d+) s into the campaign \(campaign started (.+)\)"
                  r"|first seen: unknown)$", re.M)


def _run(out: Path, *extra, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance.cli", "run", "--out", str(out), *ARGS, *extra],
                          capture_output=True, text=True, timeout=300, env=env or ENV, cwd=REPO)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("campaign") / "out"
    r = _run(out)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def _issues(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((out / "corpus").glob("*.issue.md"))}


def _summary_rows(out: Path) -> dict[str, dict]:
    """summary.md's finding entries, by the issue text each links: programs, first seen, variants."""
    rows, block = {}, []
    for line in (out / "summary.md").read_text().splitlines() + [""]:
        if line.startswith("  - "):
            block.append(line)
            continue
        link = next((m for b in block for m in [re.search(r"issue text: \[corpus/([^\]]+)\]", b)] if m), None)
        if link:
            head = next(b for b in block if re.search(r", \d+ program\(s\)", b))
            first = re.search(r"; first seen (\d+) s into the campaign", head)
            rows[link.group(1)] = {
                "programs": int(re.search(r", (\d+) program\(s\)", head).group(1)),
                "first_seen": first.group(1) if first else None,
                "variants": next(b for b in block if b.startswith("  - variants: ")).removeprefix("  - variants: "),
            }
        block = []
    return rows


def _check_agrees_with_summary(out: Path) -> dict[str, int]:
    """Each issue text says what summary.md says of its finding; returns the programs per issue text."""
    issues, rows = _issues(out), _summary_rows(out)
    assert issues and set(issues) == set(rows), (sorted(issues), sorted(rows))
    started = json.loads((out / "run.json").read_text())["started"]
    merged = {f"{corpus_entry_stem(m.finding.check, m.finding.pipeline, m.finding.program_hash)}.issue.md": m.finding
              for m in merge_findings([load_run(out)])}
    counts = {}
    for name, text in issues.items():
        seen = SEEN.search(text)
        assert seen, text[:1500]
        row = rows[name]
        assert int(seen.group(1)) == row["programs"] == merged[name].count, (name, seen.group(0), row)
        assert seen.group(3) == row["first_seen"] and seen.group(4) == started, (seen.group(0), row)
        assert f"- Variants seen: {row['variants']}\n" in text, (row["variants"], text[:1500])
        assert row["variants"] == variants_text(variants_of(merged[name]))
        counts[name] = row["programs"]
    return counts


def test_at_the_end_of_a_campaign_each_issue_text_says_what_the_summary_says(campaign):
    """A finding seen in several programs: its issue text counts them all (the summary's count), lists the
    variants of all of them (the summary's variants line) and says when it was first seen."""
    counts = _check_agrees_with_summary(campaign)
    assert max(counts.values()) > 1, counts   # written at the first shrink, this said 1
    # the variants of every program, not the shrunk one's alone: pipelines counted as often as the finding
    name, n = max(counts.items(), key=lambda kv: kv[1])
    assert f"- Variants seen: pipelines: jax:mutant-perturb-gradient x{n};" in _issues(campaign)[name]
    # nothing half-written left behind
    assert not [p.name for p in (campaign / "corpus").iterdir() if ".tmp" in p.name]


def test_report_refreshes_the_issue_texts_of_the_results_directories_it_reads(campaign, tmp_path, capsys):
    a, b, base = tmp_path / "a", tmp_path / "b", tmp_path / "base"
    for d in (a, b, base):
        shutil.copytree(campaign, d)
    final = _issues(campaign)
    # issue texts as the campaign first wrote them (one program), and one of an older harness (no first-seen time)
    stale = {n: SEEN.sub("- Seen: 1 program(s)", t) for n, t in final.items()}
    for d in (a, b, base):
        for n, t in stale.items():
            (d / "corpus" / n).write_text(t)
    fs = json.loads((b / "findings.json").read_text())
    for f in fs:
        f.pop("first_seen", None)
    (b / "findings.json").write_text(json.dumps(fs))
    assert cli_main(["report", str(a), str(b), "--baseline", str(base), "--out", str(tmp_path / "rep"),
                     "--no-repro"]) == 0
    assert f"refreshed {len(final)} issue text(s) in {a}/corpus/" in capsys.readouterr().out
    # each directory's issue texts say what that directory's summary says (not the merged report's sums)
    assert _issues(a) == final
    for n, t in _issues(b).items():
        assert SEEN.search(t).group(0) == f"- Seen: {SEEN.search(final[n]).group(1)} program(s), first seen: unknown"
    assert _issues(base) == stale   # a baseline is read, not refreshed
    # a second report has nothing to rewrite
    assert cli_main(["report", str(a), "--out", str(tmp_path / "rep2"), "--no-repro"]) == 0
    assert "refreshed" not in capsys.readouterr().out


def test_report_writes_no_issue_text_where_a_directory_had_none(tmp_path):
    """`report` only rewrites the issue texts a results directory has: a tracked fixture directory (no issue
    texts) is left as it is, and the regression corpus is no results directory at all (refused)."""
    run = tmp_path / "run_a"
    shutil.copytree(REPO / "tests" / "fixtures" / "run_a", run)
    before = sorted(p.name for p in (run / "corpus").iterdir())
    assert cli_main(["report", str(run), "--out", str(tmp_path / "rep"), "--no-repro"]) == 0
    assert sorted(p.name for p in (run / "corpus").iterdir()) == before
    assert cli_main(["report", str(REPO / "tests" / "regressions"), "--out", str(tmp_path / "rep2")]) == 2


def test_the_refresh_rewrites_through_os_replace_and_a_kill_leaves_the_old_text(campaign, tmp_path, monkeypatch):
    run = tmp_path / "run"
    shutil.copytree(campaign, run)
    name, text = next(iter(_issues(run).items()))
    old = SEEN.sub("- Seen: 1 program(s)", text)
    (run / "corpus" / name).write_text(old)
    replaced = []
    real_replace = os.replace

    def killed(src, dst):   # the process dies after writing the temporary file, before it replaces the text
        replaced.append((Path(src).name, Path(dst)))
        raise KeyboardInterrupt
    monkeypatch.setattr(store_module.os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        refresh_issue_texts(load_run(run))
    assert replaced == [(f".{name}.tmp{os.getpid()}", run / "corpus" / name)]
    assert (run / "corpus" / name).read_text() == old   # the old text, whole
    assert not [p.name for p in (run / "corpus").iterdir() if ".tmp" in p.name]
    monkeypatch.setattr(store_module.os, "replace", lambda s, d: (replaced.append(Path(d)), real_replace(s, d)))
    done = refresh_issue_texts(load_run(run))
    assert done.written == [run / "corpus" / name] and replaced[-1] == run / "corpus" / name
    assert (run / "corpus" / name).read_text() == text


def test_a_resumed_campaigns_issue_texts_count_the_programs_of_all_its_pieces(campaign, tmp_path):
    """A piece killed (SIGKILL: no refresh) after the finding was recorded (its program, in the first piece)
    and before the next program's record was whole; the resumed piece checks the other programs. The final
    refresh counts the programs of both pieces: as many as the uninterrupted campaign's."""
    out = tmp_path / "out"
    # the store's 3rd record (after the failing program and its finding) is torn by a SIGKILL (a test hook)
    r = _run(out, env={**ENV, KILL_IN_WRITE_ENV: "3"})
    assert r.returncode == -signal.SIGKILL, r.stderr[-3000:]
    before = _issues(out)
    assert [SEEN.search(t).group(1) for t in before.values()] == ["1"], before   # as first written
    r = _run(out, "--resume")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((out / "run.json").read_text())["resumed"] == 1
    final = _check_agrees_with_summary(out)
    assert final == _check_agrees_with_summary(campaign) and max(final.values()) > 1, final


def _f(features, first_seen, count=1) -> Finding:
    return Finding(signature=f"gradient|p:a|jax:none||{'+'.join(features)}", check="gradient", pipeline="p:a",
                   reference="jax:none", features=list(features), program={}, program_hash="0" * 16,
                   first_seen=first_seen, count=count)


def test_a_smaller_program_of_a_behaviour_keeps_its_first_seen_time():
    """The behaviour was first seen when its first program was: a smaller one found later stands for it
    (its program, its signature) without moving that time, so an issue text says when it was first seen."""
    findings = [_f(("checkpoint", "scan"), 4.0)]
    kept, changed = merge_finding(findings, _f(("checkpoint",), 30.0))
    assert changed and findings == [kept] and kept.count == 2 and kept.first_seen == 4.0


def test_a_refresh_where_the_short_repro_cannot_be_made_keeps_the_one_the_campaign_inlined(campaign, tmp_path,
                                                                                           monkeypatch):
    """`report` on a machine without the finding's pipeline (or framework) cannot make its short repro: the
    issue text's head is refreshed, its inline repro kept; a text that cannot be made at all is left alone."""
    run = tmp_path / "run"
    shutil.copytree(campaign, run)
    name, text = next(iter(_issues(run).items()))
    assert "```python\n" in text
    (run / "corpus" / name).write_text(SEEN.sub("- Seen: 1 program(s)", text))

    def no_repro(*a, **k):
        raise ReproError("no such pipeline here")
    monkeypatch.setattr(short, "short_repro", no_repro)
    assert refresh_issue_texts(load_run(run)).written == [run / "corpus" / name]
    assert (run / "corpus" / name).read_text() == text
    stale = SEEN.sub("- Seen: 1 program(s)", text)
    (run / "corpus" / name).write_text(stale)
    monkeypatch.setattr(refresh, "issue_text_or_reason",
                        lambda f, **k: f"# {f.signature}\n\nThe issue text could not be written: ValueError: x\n")
    done = refresh_issue_texts(load_run(run))
    assert not done.written and "issue text not refreshed: ValueError: x" in done.warnings[0]
    assert (run / "corpus" / name).read_text() == stale
