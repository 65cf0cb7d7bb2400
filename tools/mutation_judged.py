"""Surviving mutants of `make mutation` (tools/mutation.py), judged by reading them.

A rule names the function ("path:function" or "path:Class.method"), its line as the code has it
(`line`, whitespace-stripped), the mutated line as the mutant has it (`added`) and, where that is
ambiguous, a piece of the line just above it (`after`). Keyed by the mutation itself, not by
mutmut's mutant number, which shifts whenever the function changes. A survivor no rule matches is
reported as "unjudged"; tests/test_mutation_judgements.py fails on a rule whose function or line
no longer exists (the code moved: judge the new survivors again).
"""
from __future__ import annotations

EQUIVALENT, NOT_WORTH = "equivalent", "not worth killing"
_FLOAT = ("differs only for non-float data (ints past int64, None); observations hold JSON floats written "
          "from float arrays, for which numpy's default dtype is float64 already")
_GOT = ("an error verdict's detail.got always has type and message: the defaults differ only for an "
        "error_regex on another check, which the expectations schema refuses")


def rule(fn: str, line: str, added: str, judgement: str, why: str, after: str = "") -> dict:
    return dict(fn=fn, line=line, added=added, judgement=judgement, why=why, after=after)


JUDGED: list[dict] = [
]
