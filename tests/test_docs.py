"""The documentation is kept true by tests: README.md is short, the generated reference pages are what the code
declares, the site builds strictly, and every shell or Python example either runs (pytest-codeblocks collects
README.md and docs/ as tests: `testpaths` and `--codeblocks` in pyproject.toml) or says visibly why it cannot."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pytest_codeblocks.main import extract_from_file

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
RUNNABLE = ("sh", "bash", "python")
SKIP = re.compile(r'^pytest\.mark\.skip\(reason="([^"]+)"\)$')


def _docs_tool():
    spec = importlib.util.spec_from_file_location("docs_tool", ROOT / "tools" / "docs.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_is_short():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move detail to docs/"


def test_generated_reference_pages_match_the_code():
    tool = _docs_tool()
    assert tool.stale() == [], "run `make docs` (python tools/docs.py)"
    # the pages say what the declarations say: every pipeline, feature and expectation has its row or section
    from conformance.ir.features import known_features
    from conformance.pipelines.registry import SPECS
    pipelines, features = tool.pipelines_page(), tool.features_page()
    assert all(f"| `{name}` |" in pipelines for name in SPECS)
    assert all(f"| `{k}` |" in features for k in known_features() if ":" not in k)   # (families: `op:<op>`)
    assert "## `remat-conformance bisect`" in tool.cli_page() and "--budget BUDGET" in tool.cli_page()
    # and a stale page is seen as stale
    page = tool.REFERENCE / "features.md"
    text = page.read_text()
    try:
        page.write_text(text.replace("| `checkpoint` |", "| `checkpoint-renamed` |"))
        assert tool.stale() == ["features.md"]
    finally:
        page.write_text(text)


def test_every_spec_field_is_documented():
    """The pipeline reference's settings table reads each Spec field's declaring comment: none may lack one."""
    docs = _docs_tool().spec_fields()
    from dataclasses import fields

    from conformance.pipelines.registry import Spec
    undocumented = [f.name for f in fields(Spec) if not docs.get(f.name)]
    assert undocumented == [], f"Spec fields without a comment: {undocumented}"


def test_the_site_builds_strictly_without_a_warning(tmp_path):
    r = subprocess.run([str(Path(sys.executable).with_name("mkdocs")), "build", "--strict", "-d", str(tmp_path / "s")],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                       timeout=300)
    said = [x for x in (r.stdout + r.stderr).splitlines() if x.strip() and not x.startswith("INFO")]
    assert r.returncode == 0 and said == [], said
    assert (tmp_path / "s" / "reference" / "cli.html").exists()


def test_a_page_left_out_of_the_navigation_fails_the_build(tmp_path):
    """The strictness the site relies on: an orphan page (or a broken link) is a warning, and --strict fails."""
    import shutil
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "docs" / "orphan.md").write_text("# Orphan\n\n[nowhere](missing.md)\n")
    r = subprocess.run([str(Path(sys.executable).with_name("mkdocs")), "build", "--strict"], cwd=tmp_path,
                       capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}, timeout=300)
    assert r.returncode != 0 and "orphan.md" in r.stdout + r.stderr


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_runs_or_says_visibly_why_not(page):
    """Every fenced block declares its language; a shell or Python example is run by pytest-codeblocks unless it
    is marked skip with a reason, and then the reader sees that reason: the line `*Not run in the tests: REASON.*`
    stands between the mark and the block."""
    lines = page.read_text().splitlines()
    fences = [i for i, x in enumerate(lines) if x.lstrip().startswith("```")]
    openers = fences[0::2]
    for i in openers:
        assert lines[i].strip() != "```", f"{page.name}:{i + 1}: a fenced block without a language"
    for block in extract_from_file(page):
        if block.syntax not in RUNNABLE:
            continue
        for mark in block.marks:
            m = SKIP.match(mark)
            assert m, f"{page.name}:{block.lineno}: mark {mark!r}: only skip(reason=\"...\") is allowed"
            between = "\n".join(lines[max(0, block.lineno - 5):block.lineno - 1])
            assert f"*Not run in the tests: {m.group(1)}.*" in between, \
                f"{page.name}:{block.lineno}: the skip's reason is not shown to the reader"
