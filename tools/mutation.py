"""Mutation score of the oracles and of the campaign's signature/dedup code (`make mutation`).

Runs mutmut (pinned in requirements-mutation.lock, configured under [tool.mutmut] in
pyproject.toml) on a fresh copy of the sources in mutants/, over the mutants of SCOPE only,
with the fast hand-built-observation tests the config names (no framework runs). Then reads
mutmut's per-file results, prints the score (killed / total, percent) and every surviving
mutant with file:line, its diff and, where one was recorded in JUDGED, the judgement that it
is equivalent or not worth killing; writes reports/mutation/summary.md. Exits 0 once a score
was computed (--fail-under makes a low score an error); non-zero when mutmut could not run.

Counting: a mutant is killed when a test failed on it (mutmut's `killed`, and `timeout`: the
tests did not finish); every other outcome of a mutant in SCOPE (`survived`, `no tests`: no
selected test calls its function, `suspicious`) is a survivor and counts against the score.
Mutants mutmut generated outside SCOPE (the rest of conformance/engine/search.py) are not run and
not counted. mutmut mutates code inside functions and methods only: module-level constants
(TOLERANCES, INCIDENTAL_FEATURES, ...) are not mutated (tests/test_oracle_units.py checks
them directly).

    python tools/mutation.py [--max-children 2] [--keep] [--report-only] [--fail-under PCT]
"""
from __future__ import annotations

import argparse
import ast
import fnmatch
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "reports" / "mutation"

# Mutant-name patterns (mutmut: <module>.x_<function>__mutmut_<n>, <module>.xǁ<Class>ǁ<method>__mutmut_<n>).
# The oracles whole; of findings.py the signature and the features a finding is deduplicated
# on; of search.py the functions that decide whether two findings are one behaviour.
SCOPE = (
    "oracles.*",
    "conformance.ir.residuals.*",
    "conformance.engine.findings.x_signature_features__mutmut_*",
    "conformance.engine.findings.x_signature__mutmut_*",
    "conformance.engine.findings.x_error_root__mutmut_*",
    "conformance.engine.findings.x_what_differed__mutmut_*",
    "conformance.engine.findings.x_detail_digest__mutmut_*",
    "conformance.engine.findings.x_residuals_digest__mutmut_*",
    "conformance.engine.findings.xǁFindingǁcore_features__mutmut_*",
    "conformance.engine.findings.xǁFindingǁkey__mutmut_*",
    "conformance.engine.roots.x_pipeline_family__mutmut_*",
    "conformance.engine.roots.x_is_variant_feature__mutmut_*",
    "conformance.engine.roots.x_root_features__mutmut_*",
    "conformance.engine.roots.x_family_key__mutmut_*",
    "conformance.engine.roots.x_residual_direction__mutmut_*",
    "conformance.engine.roots.x_evidence_root__mutmut_*",
    "conformance.engine.roots.x_root_key__mutmut_*",
    "conformance.engine.roots.x__same_label__mutmut_*",
    "conformance.engine.roots.x_nested_roots__mutmut_*",
    "conformance.engine.search.x_same_behaviour__mutmut_*",
    "conformance.engine.search.x_merge_finding__mutmut_*",
    "conformance.engine.search.x_known_finding__mutmut_*",
    "conformance.engine.search.xǁSearcherǁknown__mutmut_*",
)

KILLED = {"killed", "timeout"}

# Survivors judged by reading them: tools/mutation_judged.py (tests/test_mutation_judgements.py keeps
# each rule in step with the code it names).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from mutation_judged import EQUIVALENT, JUDGED  # noqa: E402


def judgement_of(fn: str, removed: str, added: str, above: str) -> tuple[str, str] | None:
    for r in JUDGED:
        if (r["fn"], r["line"], r["added"]) == (fn, removed, added) and r.get("after", "") in above:
            return r["judgement"], r["why"]
    return None


def mutant_status() -> dict[str, str]:
    from mutmut.stats import status_by_exit_code
    out = {}
    for meta in sorted((REPO / "mutants").rglob("*.py.meta")):
        for name, code in json.loads(meta.read_text())["exit_code_by_key"].items():
            if any(fnmatch.fnmatchcase(name, p) for p in SCOPE):
                out[name] = status_by_exit_code[code]
    return out


def _function_of(name: str) -> tuple[str, str, str | None, str]:
    """(source path, function, class or None, display name) of a mutant name."""
    mangled = name.partition("__mutmut_")[0]
    module, _, fn = mangled.rpartition(".")
    path = module.replace(".", "/") + ".py"
    if fn.startswith("xǁ"):
        _, cls, meth = fn.split("ǁ")
        return path, meth, cls, f"{cls}.{meth}"
    return path, fn[2:], None, fn[2:]


@functools.cache
def _def_line(path: str, func: str, cls: str | None) -> int | None:
    """Line of `def func` (of class `cls`) in the source as it is now."""
    tree = ast.parse((REPO / path).read_text())
    body = tree.body
    if cls is not None:
        c = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        body = c.body if c else []
    f = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == func), None)
    return f.lineno if f else None


def describe(name: str) -> dict:
    """A survivor: where it is, its diff, and the mutated line before/after."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    path, func, cls, display = _function_of(name)
    try:
        diff = get_diff_for_mutant(name, path=path)
    except Exception as e:   # noqa: BLE001 - a report line, not a crash
        diff = f"(no diff: {e})"
    lines = diff.splitlines()
    removed = next((ln[1:].strip() for ln in lines[2:] if ln.startswith("-")), "")
    added = next((ln[1:].strip() for ln in lines[2:] if ln.startswith("+")), "")
    first = next((k for k, ln in enumerate(lines) if k >= 2 and ln.startswith(("-", "+"))), None)
    above = next((lines[k][1:].strip() for k in range(first - 1, 1, -1)
                  if lines[k].startswith(" ") and lines[k].strip()), "") if first else ""
    line = None
    d = _def_line(path, func, cls)
    m = next((re.match(r"@@ -(\d+)", ln) for ln in lines if ln.startswith("@@")), None)
    if d is not None and m:
        # diff line numbers count from the function's first line (its decorators, if any)
        rel, start = int(m.group(1)), None
        body = lines[lines.index(m.string) + 1:]
        for k, ln in enumerate(body):
            if ln.startswith(("-", "+")):
                start = rel + k - sum(1 for x in body[:k] if x.startswith("+"))
                break
        orig = _orig_source(name, path)
        def_offset = next((k for k, ln in enumerate(orig) if ln.lstrip().startswith(("def ", "async def "))), 0)
        if start is not None:
            line = d - def_offset + start - 1
    judgement = judgement_of(f"{path}:{display}", removed, added, above)
    return {"name": name, "path": path, "function": display, "line": line, "diff": diff,
            "removed": removed, "added": added, "judgement": judgement}


def _orig_source(name: str, path: str) -> list[str]:
    """The function as mutmut diffs it (decorators first), read once per function."""
    return _orig_source_of(name.partition("__mutmut_")[0], name, path)


@functools.cache
def _orig_source_of(_mangled: str, name: str, path: str) -> list[str]:
    import libcst as cst
    from mutmut.mutation.diff_apply import read_functions_from_index
    fns = read_functions_from_index(name, path)
    return cst.Module([fns[0]]).code.strip().split("\n") if fns else []


def run_mutmut(max_children: int, log: Path) -> int:
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *SCOPE]
    print(f"== mutmut run --max-children {max_children} <{len(SCOPE)} SCOPE patterns>  "
          f"(log: {log.relative_to(REPO)})", flush=True)
    env = {**os.environ, "HYPOTHESIS_PROFILE": os.environ.get("HYPOTHESIS_PROFILE", "ci")}
    with open(log, "w") as f:
        p = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=env)
        last = ""
        while p.poll() is None:
            time.sleep(1)
            now = _progress(log)
            if now and now != last and int(time.monotonic()) % 30 == 0:
                print("   " + now, flush=True)
                last = now
    return p.returncode


def _progress(log: Path) -> str:
    """mutmut's latest progress line (it redraws one line with carriage returns)."""
    try:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 400))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in re.split(r"[\r\n]", tail) if re.search(r"\d+/\d+", ln)]
    return lines[-1].lstrip("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏ ") if lines else ""


def report(status: dict[str, str], seconds: float | None) -> tuple[str, float]:
    counts = Counter(status.values())
    total = len(status)
    killed = sum(counts[s] for s in KILLED)
    pct = 100.0 * killed / total if total else 0.0
    survivors = [describe(n) for n, s in sorted(status.items(), key=lambda kv: _sort_key(kv[0])) if s not in KILLED]
    for s in survivors:
        s["status"] = status[s["name"]]
    judged = Counter(s["judgement"][0] if s["judgement"] else "unjudged" for s in survivors)
    per_file = Counter()
    per_file_killed = Counter()
    for n, s in status.items():
        f = _function_of(n)[0]
        per_file[f] += 1
        per_file_killed[f] += s in KILLED
    out = ["# Mutation score", ""]
    out.append(f"**{killed} / {total} mutants killed ({pct:.1f}%)**"
               + (f", in {seconds / 60:.1f} min" if seconds is not None else "") + ".")
    out.append("")
    out.append("Outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + ".")
    out.append(f"Survivors: {len(survivors)} ("
               + ", ".join(f"{v} {k}" for k, v in sorted(judged.items())) + ").")
    if total:
        eq = judged[EQUIVALENT]
        out.append(f"Killed among the non-equivalent: {killed} / {total - eq} "
                   f"({100.0 * killed / max(1, total - eq):.1f}%).")
    out += ["", "| file | killed | total | % |", "| --- | --- | --- | --- |"]
    for f in sorted(per_file):
        out.append(f"| {f} | {per_file_killed[f]} | {per_file[f]} | {100.0 * per_file_killed[f] / per_file[f]:.0f}% |")
    out += ["", "## Surviving mutants", ""]
    for s in survivors:
        where = f"{s['path']}:{s['line'] or '?'}"
        j = s["judgement"]
        verdict = f"{j[0]}: {j[1]}" if j else "unjudged"
        out.append(f"### {where} `{s['function']}` ({s['status']}) — {verdict}")
        out.append(f"`{s['name']}`")
        out += ["", "```diff", s["diff"], "```", ""]
    return "\n".join(out) + "\n", pct


def _sort_key(name: str):
    path, _, _, fn = _function_of(name)
    return (path, fn, int(name.rpartition("__mutmut_")[2] or 0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-children", type=int, default=2, help="mutant workers (default 2)")
    ap.add_argument(
        "--keep",
        action="store_true",
        help="reuse mutants/ from an earlier run (default: delete it and start fresh; "
        "every mutant in SCOPE is run again either way)",
    )
    ap.add_argument("--report-only", action="store_true", help="report the results in mutants/ without running")
    ap.add_argument("--fail-under", type=float, default=None, help="exit 1 when the score is below this percent")
    a = ap.parse_args(argv)
    os.chdir(REPO)   # mutmut reads pyproject.toml and mutants/ from the working directory
    OUT.mkdir(parents=True, exist_ok=True)
    seconds = None
    if not a.report_only:
        if not a.keep:
            shutil.rmtree(REPO / "mutants", ignore_errors=True)
        t0 = time.monotonic()
        rc = run_mutmut(a.max_children, OUT / "mutmut.log")
        seconds = time.monotonic() - t0
        if rc != 0:
            tail = (OUT / "mutmut.log").read_text(errors="replace").replace("\r", "\n").splitlines()[-40:]
            print("\n".join(tail))
            print(f"mutmut failed (exit {rc}); see {OUT / 'mutmut.log'}", file=sys.stderr)
            return rc
    status = mutant_status()
    if not status:
        print("no mutant results in mutants/ (run without --report-only)", file=sys.stderr)
        return 2
    md, pct = report(status, seconds)
    (OUT / "summary.md").write_text(md)
    print(md)
    print(f"== written {OUT.relative_to(REPO) / 'summary.md'}")
    if a.fail_under is not None and pct < a.fail_under:
        print(f"mutation score {pct:.1f}% is under {a.fail_under}%", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
