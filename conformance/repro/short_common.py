"""What the short repros of both frameworks share: literals, prelude selection, the header."""
from __future__ import annotations

import ast
import json
import re
import textwrap

import numpy as np

from conformance.ir import releases
from conformance.ir.nodes import Checkpoint, Cond, CustomJVP, CustomVJP, Jit, Op, Scan, walk
from conformance.ir.ops import EFFECT_OP
from conformance.ir.releases import CANNOT_RUN
from conformance.repro.plan import ReproError
from conformance.repro.script import doc_text


def float_text(v: float, dtype: str) -> str:
    """The shortest decimal that reads back as exactly this value of the dtype."""
    if dtype in ("float32", "bfloat16", "float16"):
        s = str(np.float32(v))
        if _exact(s, v):
            return s
    return repr(float(v))


def _exact(s: str, v: float) -> bool:
    try:
        return float(np.float32(float(s))) == float(np.float32(v))
    except ValueError:
        return False


def array_text(a: np.ndarray, dtype: str) -> str:
    """A nested list literal of an input's values, exact in its dtype."""
    def rec(x):
        if isinstance(x, list):
            return "[" + ", ".join(rec(y) for y in x) + "]"
        return float_text(x, dtype)
    return rec(np.asarray(a).astype(np.float64).tolist())


def used_helpers(prelude: str, code: str) -> str:
    """The prelude's top-level functions and classes the code uses (transitively), and the top-level
    values (`NAME = ...`) they read, in prelude order."""
    tree = ast.parse(prelude)
    defs = {n.name: ast.get_source_segment(prelude, n) for n in tree.body
            if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    values = {n.targets[0].id: ast.get_source_segment(prelude, n) for n in tree.body
              if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)}
    want, text = set(), code
    while True:
        new = {k for k in defs if k not in want and re.search(rf"\b{k}\(", text)}
        if not new:
            break
        want |= new
        text = "\n".join(defs[k] for k in want)
    used = [k for k in values if re.search(rf"\b{k}\b", text)]
    return "\n\n\n".join([values[k] for k in used] + [_strip_doc(defs[k]) for k in defs if k in want])


def _strip_doc(src: str) -> str:
    """A helper without its docstring (the short repro explains in comments)."""
    return re.sub(r'^((?:def|class) [^\n]*\n)    """.*?"""\n', r"\1", src, count=1, flags=re.S)


def header(finding, sentence: str) -> str:
    """Comment lines: what the finding is, what the script checks, the exit status."""
    key = f"[{finding.check}] {finding.pipeline} vs {finding.reference}" + (
        f" ({finding.error_type})" if finding.error_type else "")
    lines = [f"Short reproducer of {key}, program {finding.program_hash}."] + textwrap.wrap(sentence, 94)
    vs = ", ".join(f"{k} {v}" for k, v in sorted(finding.versions.items()) if k in ("jax", "jaxlib", "torch"))
    if vs:
        lines.append(f"Seen with {vs}.")
    lines.append(f"Exit status: 1 while the behaviour reproduces, 0 once it is fixed, {CANNOT_RUN} where this release "
                 "cannot run the check (an API it lacks, a failure before the check).")
    return "#!/usr/bin/env python3\n" + "\n".join("# " + doc_text(x) for x in lines)


def needs_finding(finding):
    if finding is None:
        raise ReproError("a short repro reproduces a finding; a bare program has none (use --full)")


def code_lines(src: str) -> int:
    """Non-blank, non-comment lines."""
    return sum(1 for line in src.splitlines() if line.strip() and not line.strip().startswith("#"))


def literal(v) -> str:
    return json.dumps(v)


def _referenced(prog) -> set[str]:
    refs = set(prog.outputs)
    for s, _, _, _ in walk(prog.body):
        refs |= set(s.args)
        if isinstance(s, (Checkpoint, Jit)):
            refs |= set(s.results)
        elif isinstance(s, CustomVJP):
            refs |= set(s.results) | set(s.residuals) | {r for r in s.bwd_results if r} | set(s.non_differentiable)
        elif isinstance(s, CustomJVP):
            refs |= set(s.results) | set(s.jvp_results)
        elif isinstance(s, Scan):
            refs |= set(s.carry_out) | set(s.ys) | set(s.results)
        elif isinstance(s, Cond):
            refs |= {r for rs in s.branch_results for r in rs} | set(s.results)
        elif not isinstance(s, Op):
            raise ReproError(f"unknown statement {type(s).__name__}")
    return refs


def _prune(stmts: list, refs: set[str]) -> bool:
    changed = False
    keep = []
    for s in stmts:
        if isinstance(s, Op) and s.out not in refs and s.op != EFFECT_OP:   # (an effect runs, read or not)
            changed = True
            continue
        for fld in ("body", "fwd", "bwd", "jvp"):
            if isinstance(getattr(s, fld, None), list):
                changed |= _prune(getattr(s, fld), refs)
        for b in getattr(s, "branches", None) or []:
            changed |= _prune(b, refs)
        keep.append(s)
    stmts[:] = keep
    return changed


def dead_code_removed(prog, check: str):
    """The program without ops whose values nothing reads (the shrinker keeps some to keep the
    finding's features; the behaviour does not need them: the test of every corpus entry's
    short repro says so), but for an error: tracing runs an op nothing reads, and it may be what
    raises (a torch.func.grad in a compiled checkpoint region, its value unread)."""
    if check == "error":
        return prog
    p = prog.model_copy(deep=True)
    while _prune(p.body, _referenced(p)):
        pass
    return p


def _primary(node) -> bool:
    return isinstance(node, (ast.Call, ast.Name, ast.Attribute, ast.Subscript, ast.Constant))


def fold_returns(src: str, width: int = 88) -> str:
    """Inline each temporary read once, later in the same block (`b = g * c` then `return (b,)`
    becomes `return (g * c,)`), parenthesised unless it binds tighter than anything or is the
    whole right-hand side; lines stay within `width`."""
    lines = src.split("\n")
    changed = True
    while changed:
        changed = False
        for i, line in enumerate(lines):
            m = re.match(r"^(\s*)(\w+) = ([^#]+?)(\s+#.*)?$", line)
            if not m or m.group(4):
                continue
            ind, x, expr = m.group(1), m.group(2), m.group(3)
            uses = [j for j, other in enumerate(lines) if re.search(rf"\b{x}\b", other)]
            if len(uses) != 2 or uses[0] != i or len(re.findall(rf"\b{x}\b", lines[uses[1]])) != 1:
                continue
            j = uses[1]
            if any(len(lines[k]) - len(lines[k].lstrip()) < len(ind) for k in range(i + 1, j + 1) if lines[k].strip()):
                continue   # the use is in another block
            if not lines[j].startswith(ind) or lines[j][len(ind)] == " " or lines[j].lstrip().startswith(("def ", "@")):
                continue
            try:
                e = ast.parse(expr, mode="eval").body
            except SyntaxError:
                continue
            whole = re.match(rf"^\s*(return|[\w, ()]+ =) {x}$", lines[j]) or re.match(
                rf"^\s*return \((?:[^()]*, )?{x}(,|\)$)", lines[j])
            text = expr if (whole or _primary(e)) else f"({expr})"
            new = re.sub(rf"\b{x}\b", lambda _: text, lines[j], count=1)
            if len(new) > width:
                continue
            lines[j] = new
            del lines[i]
            changed = True
            break
    return "\n".join(lines)


def error_sentence(finding, reference) -> str:
    """What an error finding says, for the header."""
    exp = finding.detail.get("expected")
    if isinstance(exp, dict):
        return (f"{finding.pipeline} must raise an error matching /{exp.get('regex', '')}/ "
                f"({finding.expectation or 'the expectations data'}) but raises nothing.")
    got = finding.detail.get("got") or {}
    where = f" during {got['stage']}" if got.get("stage") else ""
    return (f"{finding.pipeline} raises {finding.error_type}{where}" +
            (f", where {reference} does not." if reference else "."))


class ShortDialect:
    """What the short emitters add to a dialect's emitter (mixed in before it): dtypes written as the
    framework's own (`MODULE.float32`; float64 for every float where the script runs in float64),
    zeros of a value's type, one value bare and several as a tuple."""
    MODULE = ""            # "jnp", "torch"
    ZEROS_DTYPE = "{}"     # how the zeros call takes its dtype
    f64 = False

    def dtype(self, name: str) -> str:
        return (
            f"{self.MODULE}.float64" if self.f64 and name.startswith(("float", "bfloat")) else f"{self.MODULE}.{name}"
        )

    def op_text(self, op, args, params, nondiff):
        src = super().op_text(op, args, params, nondiff)
        return re.sub(r"dt\('(\w+)'\)", lambda m: self.dtype(m.group(1)), src)

    def zeros(self, vid):
        shp, dtype = self.types[vid]
        return f"{self.MODULE}.zeros({tuple(shp)!r}, {self.ZEROS_DTYPE.format(self.dtype(dtype))})"

    @staticmethod
    def seq(xs):   # one value bare, several as a tuple
        return xs[0] if len(xs) == 1 else "(" + ", ".join(xs) + ")"


def release_guard(src: str, framework: str) -> str:
    """The script with its release guard: any exception outside the check exits CANNOT_RUN (installed before
    the imports, which may name what a release lacks; an unknown flag turned on raises there too), and where the
    check catches exceptions (an error finding), each API the script uses is probed first: its absence raised
    inside the check (an unknown keyword, say) must not read as the behaviour gone."""
    lines = [x for x in src.split("\n") if x != "import sys"]   # (the hook's line imports it)
    first = next(i for i, x in enumerate(lines) if x.startswith(("import ", "from ")))
    last = max(i for i, x in enumerate(lines) if x.startswith(("import ", "from ")))
    hook = ["import os, sys",
            f"sys.excepthook = lambda *e: (sys.__excepthook__(*e), sys.stdout.flush(), os._exit({CANNOT_RUN}))"
            f"   # {CANNOT_RUN}: cannot run here"]
    names = [n for n in releases.used_by(src, framework) if not n.startswith("jax_")] if "except Exception" in src \
        else []
    probes = []
    if names:
        items = [f"({n + ' (first in ' + releases.APIS[n].since + ')'!r}, {releases.APIS[n].probe})" for n in names]
        probes = ["LACKS = [api for api, has in [" + ", ".join(items) + "] if not has]",
                  f"if LACKS: sys.exit(print('CANNOT RUN: {framework}', {framework}.__version__, 'lacks', LACKS) "
                  f"or {CANNOT_RUN})"]
    imports = lines[first:last + 1] + (["import inspect"] if "inspect." in "".join(probes) else [])
    return "\n".join(lines[:first] + hook + imports + ([""] + probes if probes else []) + lines[last + 1:])
