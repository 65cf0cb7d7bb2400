"""A new framework bug is a new finding (issue 45): each framework-side mutant (tests/framework_mutants.py: JAX or
PyTorch itself changed, as an upstream regression would) is run through `remat-conformance run` with the
regression corpus as known behaviours, as `make run` does; its behaviour must be reported as a new finding (no
tracked root of the same direction may swallow it), and the finding's short repro must show it: exit 1 with the
mutant applied to the framework, 0 without."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.framework_mutants import MUTANTS, env

ROOT = Path(__file__).resolve().parents[1]
CLI = Path(sys.executable).with_name("remat-conformance")


def _is_mutants(name: str, f: dict) -> bool:
    """The mutant's own finding: what the patch changes, as its cause names it."""
    causes = " ".join(f["detail"].get("causes") or [])
    if name == "remat3-drops-dots":   # remat3 recomputes a dot its policy saves (remat2 saves it)
        return (f["check"] == "residuals" and f["pipeline"].startswith("jax:remat3")
                and "recomputes a dot's output" in causes)
    if name == "remat3-traces-regions-twice":   # a rule in a region runs more often under remat3 than remat2
        return f["check"] == "trace_count" and f["pipeline"].startswith("jax:remat3")
    if name == "both-policies-ignore-the-second":   # remat2 saves less than the program without checkpoint
        return (f["check"] == "residuals" and f["reference"] == "policy" and f["pipeline"] == "jax:remat2"
                and f["error_type"] == "recomputed_against_policy")
    if name in ("sac-drops-first-save", "partitioner-ignores-must-save"):   # recomputes what is MUST_SAVE
        return (f["check"] == "residuals" and f["reference"] == "policy"
                and f["error_type"] == "recomputed_against_policy")
    raise AssertionError(name)


# The slow tier (make test-slow, nightly): the trace-count and torch.compile mutants; every `make test` runs the two
# residual ones (an eager SAC that drops a MUST_SAVE, a remat3 policy that stops saving dots).
SLOW = {"remat3-traces-regions-twice", "partitioner-ignores-must-save"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(MUTANTS)])
def test_a_framework_mutant_is_a_new_finding_under_known_and_its_short_repro_shows_it(name, tmp_path):
    _, rivals, require, exclude, options = MUTANTS[name]
    out = tmp_path / "run"
    cmd = [str(CLI), "run", "--pipelines", ",".join(rivals), "--known", str(ROOT / "tests" / "regressions"),
           "--seed", "3", "--budget", "240", "--max-examples", "80", "--max-stmts", "4", "--jobs", "1",
           "--no-isolate", "--quiet", "--out", str(out), *[a for d in require for a in ("--require", d)],
           *[a for d in exclude for a in ("--exclude", d)], *options]
    # (run from tmp_path: a partitioner that fails writes min_cut_failed_graph*.txt into its working directory)
    r = subprocess.run(cmd, cwd=tmp_path, env=env(name), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    findings = json.loads((out / "findings.json").read_text())
    mine = [f for f in findings if f["count"] >= 1 and _is_mutants(name, f)]   # (this run's; the corpus is listed too)
    assert mine, (f"{name}: no finding of its own in {r.stdout[-1500:]}",
                  [(f["signature"], f.get("tracked")) for f in findings])
    f = min(mine, key=lambda f: f.get("size") or 99)
    assert f.get("tracked") is None and f["count"] >= 1   # new, not counted under a tracked root
    entry = next((out / "corpus").glob(f"{f['check']}-{f['pipeline'].replace(':', '_')}-{f['program_hash'][:8]}"
                                       ".json"))
    script = tmp_path / "repro.py"
    w = subprocess.run([str(CLI), "repro", str(entry), "--out", str(script)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert w.returncode == 0 and script.exists(), w.stderr[-2000:]
    with_mutant = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env(name), capture_output=True,
                                 text=True, timeout=300)
    assert with_mutant.returncode == 1 and "REPRODUCES" in with_mutant.stderr + with_mutant.stdout, (
        with_mutant.stdout[-1500:], with_mutant.stderr[-1500:])
    without = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env(None), capture_output=True,
                             text=True, timeout=300)
    assert without.returncode == 0, (without.stdout[-1500:], without.stderr[-1500:])
