"""The layers (README "Layout") are kept by contracts, not by a line cap: ruff and import-linter
(both configured in pyproject.toml) pass, no project module takes part in an import cycle, and no
function imports a project module, except the modules that import an optional framework (the
JAX and PyTorch pipeline packages, loaded by the registry on first use)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("conformance", "generators", "oracles")
# Imported lazily on purpose: each imports jax or torch, which a run without that framework lacks.
FRAMEWORK_MODULES = ("conformance.pipelines.jax", "conformance.pipelines.torch")


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


MODULES = _modules()


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for n in node.body:
                lines.update(range(n.lineno, n.end_lineno + 1))
    return lines


def _imports(name: str, path: Path):
    """(imported project module, line, at module level?) for each import of a project module."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    top = {id(n) for n in tree.body} | {id(n) for s in tree.body if isinstance(s, (ast.If, ast.Try))
                                         for n in ast.walk(s) if isinstance(n, (ast.Import, ast.ImportFrom))}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.lineno in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                base = ".".join(pkg[:len(pkg) - node.level + 1] + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for t in targets:
            if t in MODULES:
                yield t, node.lineno, id(node) in top


def test_ruff_passes():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_import_linter_contracts_are_kept():
    exe = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and "0 broken" in r.stdout, r.stdout[-4000:] + r.stderr[-2000:]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, cycles, n = {}, {}, [], set(), [], [0]

    def visit(v):   # Tarjan's strongly connected components
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_among_project_modules():
    graph = {m: {t for t, _, _ in _imports(m, p) if t != m} for m, p in MODULES.items()}
    # a package's __init__ importing its own submodules is how Python loads them, not a cycle
    for m in graph:
        graph[m] = {t for t in graph[m] if not (t.startswith(m + ".") and MODULES[m].name == "__init__.py")}
    assert not _cycles(graph), _cycles(graph)


def test_no_function_imports_a_project_module_except_a_framework_one():
    lazy = [f"{p.relative_to(ROOT)}:{line} imports {t}" for m, p in MODULES.items()
            for t, line, at_top in _imports(m, p)
            if not at_top and not t.startswith(FRAMEWORK_MODULES)]
    assert not lazy, "\n".join(lazy)


def test_the_checks_above_can_fail(tmp_path):
    """The cycle and lazy-import finders see what they are meant to see."""
    a = tmp_path / "a.py"
    a.write_text("from conformance.ir import nodes\n\ndef f():\n    from conformance.engine import store\n"
                 "if True:\n    from conformance.ir import policy\n")
    got = list(_imports("x", a))
    assert ("conformance.ir.nodes", 1, True) in got and ("conformance.engine.store", 4, False) in got
    assert ("conformance.ir.policy", 6, True) in got
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
