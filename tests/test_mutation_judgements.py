"""The judged survivors of `make mutation` (tools/mutation_judged.py) stay in step with the code: each
rule names a function that exists and a line that function still has, and says why."""
import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from mutation_judged import EQUIVALENT, JUDGED, NOT_WORTH  # noqa: E402


def function_lines(fn: str) -> list[str] | None:
    """The stripped source lines of "path:function" or "path:Class.method"; None if it does not exist."""
    path, _, name = fn.partition(":")
    p = ROOT / path
    if not p.is_file():
        return None
    src = p.read_text()
    body = ast.parse(src).body
    *cls, func = name.split(".")
    for c in cls:
        body = next((n.body for n in body if isinstance(n, ast.ClassDef) and n.name == c), [])
    node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == func), None)
    if node is None:
        return None
    return [ln.strip() for ln in src.splitlines()[node.lineno - 1:node.end_lineno]]


@pytest.mark.parametrize("r", JUDGED, ids=lambda r: f"{r['fn']}:{r['added'][:40]}")
def test_a_judged_survivor_names_code_that_exists(r):
    lines = function_lines(r["fn"])
    assert lines is not None, f"{r['fn']} no longer exists: drop the rule, judge its new survivors"
    assert r["line"] in lines, f"{r['fn']} no longer has the line {r['line']!r}: judge its survivors again"
    assert r["added"] != r["line"] and r["judgement"] in (EQUIVALENT, NOT_WORTH) and len(r["why"]) > 20


def test_the_check_fails_on_a_rule_for_code_that_is_gone():
    assert function_lines("oracles/residuals.py:_outside_factors") is None   # renamed since its rules were written
    assert function_lines("oracles/nowhere.py:f") is None
    lines = function_lines("oracles/judge.py:judge")
    assert lines and lines[0].startswith("def judge(")
    assert function_lines("conformance/engine/findings.py:Finding.key") == [
        "def key(self) -> tuple[str, str, str, str]:",
        "return (self.check, self.pipeline, self.reference, self.error_type)"]
