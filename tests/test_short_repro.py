"""The short repro (`remat-conformance repro ENTRY`, conformance.repro.short): for every corpus
program, the script runs standalone (its own process, a temporary directory, without the
project on the path) and exits 1 while the behaviour reproduces (see corpus_cases for the
expected status); over the corpus it stays short."""
from __future__ import annotations

import ast
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.repro.plan import ReproError
from conformance.repro.short import code_lines, short_repro

CORPUS = Path(__file__).parent / "regressions"
# (30 and 60 before the release guard: two lines (an exception outside the check exits 3, "cannot run here") and,
# where the check catches exceptions, two that probe the APIs the script uses; 33 and 62 before a custom_vjp under
# jax_custom_vjp3 was made under each run's flags: two lines, `def rules(flags):` and its `global`, in 24 of 145)
MEDIAN_LINES, MAX_LINES = 34, 64
ALLOWED_IMPORTS = {"jax", "torch", "numpy", "sys", "os", "inspect", "re", "functools", "collections"}
SLOW: set[str] = set()   # ids of cases whose script takes over 20 s (none at present: torch ones take ~6 s)


def corpus_cases():
    """(id, program, inputs, finding, expected exit status) for every program of the corpus:
    each root's variants (or a plain entry). A short repro exits 1 while the framework still does
    what the finding describes: 0 for a harness artifact (a root of class `harness`: plain code
    does not show it) and for a finding key or a root's variant ("root/variant") status.json lists
    as fixed (the behaviour is gone, or
    a constructed conforming guard); a root listed there as now *expected* (class documented, say)
    still reproduces in plain code: 1."""
    from conformance.engine.loading import corpus_fixed_keys, load_corpus_root
    fixed = corpus_fixed_keys(CORPUS)
    out = []
    for path in sorted(CORPUS.glob("*.json")):
        if path.name == "status.json":
            continue
        root, variants = load_corpus_root(str(path))
        harness = root is not None and root.triage is not None and root.triage.class_ == "harness"
        for name, prog, inputs, finding in variants:
            gone = harness or "|".join(finding.key()) in fixed or f"{path.stem}/{name}" in fixed
            out.append((f"{path.stem}/{name}", prog, inputs, finding, 0 if gone else 1))
    return out


CASES = corpus_cases()
_SOURCES: dict[str, str] = {}


def source(case) -> str:
    cid, prog, inputs, finding, _ = case
    if cid not in _SOURCES:
        _SOURCES[cid] = short_repro(prog, inputs, finding)
    return _SOURCES[cid]


def run_standalone(src: str, tmp_path: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    script = tmp_path / "repro.py"
    script.write_text(src)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSTARTUP")}
    return subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _param(case):
    marks = [pytest.mark.slow] if case[0] in SLOW else []
    return pytest.param(case, id=case[0], marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_short_repro_runs_standalone(case, tmp_path):
    cid, _, _, finding, want = case
    r = run_standalone(source(case), tmp_path)
    assert r.returncode == want, (f"{cid}: exit {r.returncode}, want {want}\n--- stdout\n{r.stdout[-3000:]}"
                                  f"\n--- stderr\n{r.stderr[-3000:]}")
    if want == 1:
        assert "REPRODUCES" in r.stderr, r.stderr[-2000:]
    assert r.stdout.strip(), f"{cid}: the script printed no evidence"


def test_short_repros_are_short():
    counts = {c[0]: code_lines(source(c)) for c in CASES}
    assert statistics.median(counts.values()) <= MEDIAN_LINES, sorted(counts.items(), key=lambda kv: kv[1])
    assert max(counts.values()) <= MAX_LINES, max(counts.items(), key=lambda kv: kv[1])


@pytest.mark.parametrize("case", [pytest.param(c, id=c[0]) for c in CASES])
def test_short_repro_imports_only_the_framework(case):
    src = source(case)
    tree = ast.parse(src)
    mods = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert mods <= ALLOWED_IMPORTS, mods - ALLOWED_IMPORTS
    assert "conformance" not in src.replace("remat-conformance", "") and "oracles" not in src
    assert src.startswith("#!/usr/bin/env python3\n")
    assert "print(" in src   # the evidence


def test_short_repro_refuses_what_it_cannot_write():
    _, prog, inputs, finding, _ = next(c for c in CASES if c[3].pipeline.startswith("jax:"))
    with pytest.raises(ReproError, match="bare program"):
        short_repro(prog, inputs, None)
    with pytest.raises(ReproError, match="--full"):
        short_repro(prog, inputs, finding, "torch")


def test_cli_repro_is_short_by_default_and_full_on_request(tmp_path):
    from conformance.cli.main import main as cli_main
    path = CORPUS / "remat3-no-zero-propagation.json"
    short, full = tmp_path / "short.py", tmp_path / "full.py"
    assert cli_main(["repro", str(path), "--out", str(short)]) == 0
    assert cli_main(["repro", str(path), "--full", "--out", str(full)]) == 0
    s, f = short.read_text(), full.read_text()
    assert code_lines(s) <= MAX_LINES < code_lines(f)
    assert "raise SystemExit(" in s and "def check_residuals" in f


def test_an_errors_short_repro_keeps_ops_nothing_reads():
    """Tracing runs an op whose value nothing reads, and it may be what raises (a torch.func.grad in a compiled
    region): an error's short repro keeps it; other checks' drop it."""
    from conformance.repro.short_common import dead_code_removed
    from tests.programs import op, prog, region
    p = prog([region(["x"], [op("sin", ["x"], "a"), op("cos", ["x"], "c")], ["c"], {"kind": "nothing"})])
    assert [s.op for s in dead_code_removed(p, "error").body[0].body] == ["sin", "cos"]
    assert [s.op for s in dead_code_removed(p, "gradient").body[0].body] == ["cos"]


def test_a_custom_vjp_under_custom_vjp3_is_made_under_each_runs_flags():
    """jax before 0.12 reads jax_custom_vjp3 where jax.custom_vjp (or jax.custom_gradient) is applied: a repro that
    applied it once at import, flags off, tested the old custom_vjp on every side there, and bisect called
    cvjp3-traces-primal-under-grad 'introduced in 0.12.0' (0.10.2 and 0.11.2 trace the primal too, rules made
    under the flag). Every repro with such a rule and a side under jax_custom_vjp3 applies it inside
    `rules(flags)`, after the flags, and each run calls it; the others have no `rules`."""
    def applies_a_rule(node):
        return any("custom_vjp" in ast.unparse(d) or "custom_gradient" in ast.unparse(d)
                   for d in getattr(node, "decorator_list", []))
    checked = 0
    for case in CASES:
        if not case[3].pipeline.startswith("jax:"):
            continue
        src = source(case)
        tree = ast.parse(src)
        top = tree.body
        has_rule = any(applies_a_rule(n) for n in ast.walk(tree))
        cvjp3 = re.search(r'"jax_custom_vjp3": True', src)
        assert not (cvjp3 and any(applies_a_rule(n) for n in top)), case[0]   # then never applied at import
        made = [n for n in top if isinstance(n, ast.FunctionDef) and n.name == "rules"]
        assert bool(made) == bool(has_rule and cvjp3), case[0]
        if made:
            flags_first = made[0].body[1]
            assert isinstance(made[0].body[0], ast.Global) and isinstance(flags_first, ast.For), case[0]
            assert all(not applies_a_rule(n) for n in made[0].body[:2]) and "rules(flags)" in src, case[0]
            checked += 1
    assert checked >= 20   # (24 at present)
