"""One declaration per concept: every declared op has a lowering in each framework's table
(or is declared unsupported there in the expectations data), every policy kind a JAX
translation; names appear in few files; no source file is over 600 lines; the reporting
and repro layers never import the CLI."""
import re
from pathlib import Path

import pytest

from conformance.ir.ops import NAME_OP, NAME_OPS, OPS
from conformance.ir.policy import KINDS, POLICY_KINDS
from conformance.pipelines import registry
from conformance.pipelines.jax import table as jax_table
from conformance.pipelines.tables import Lowering, missing_lowerings
from conformance.pipelines.torch import table as torch_table
from oracles.expectations import Entry, Expectations

ROOT = Path(__file__).resolve().parents[1]
TABLES = {"jax": jax_table.OPS, "torch": torch_table.OPS}
PIPELINES = {fw: [n for n in registry.SPECS if registry.framework_of(n) == fw] for fw in TABLES}
SOURCES = sorted(p for d in ("conformance", "generators", "oracles") for p in (ROOT / d).rglob("*")
                 if p.suffix in (".py", ".j2"))


def test_every_op_is_lowered_or_declared_unsupported():
    assert missing_lowerings(TABLES, Expectations.load(), PIPELINES) == []
    for fw, table in TABLES.items():
        assert set(table) <= set(OPS), f"{fw} lowers undeclared ops {set(table) - set(OPS)}"
        for op, low in table.items():
            assert low.policy_ops or low.no_primitive, f"{fw}: {op} says nothing of what a policy sees"


def test_a_missing_lowering_is_caught_unless_declared():
    table = dict(torch_table.OPS)
    del table["sin"]
    assert missing_lowerings({"torch": table}, Expectations.load(), PIPELINES) == ["torch: sin"]
    known = Expectations.load().entries   # (the declared ones: effects are JAX's only)
    declared = Expectations(known + [Entry(id="no-sin", pipelines=["torch:*"], features=["op:sin"],
                                           unsupported={"reason": "test"})])
    assert missing_lowerings({"torch": table}, declared, PIPELINES) == []
    partial = Expectations(known + [Entry(id="no-sin", pipelines=["torch:eager-sac"], features=["op:sin"],
                                          unsupported={"reason": "test"})])
    assert missing_lowerings({"torch": table}, partial, PIPELINES) == ["torch: sin"]


def test_a_pipeline_refuses_a_program_it_cannot_lower(monkeypatch):
    from conformance.pipelines.jax import pipelines as jax_pipelines
    from tests.programs import op, prog
    monkeypatch.setattr(jax_table, "OPS", {k: v for k, v in jax_table.OPS.items() if k != "cos"})
    obs = registry.get("jax:remat3").run(prog([op("cos", ["x"], "y")]), {"x": __import__("numpy").ones(3)})
    assert obs.unsupported and "cos" in obs.unsupported and obs.grads is None
    assert jax_pipelines.OPS["cos"]   # the compiled table itself is untouched


def test_every_policy_kind_has_a_jax_translation():
    assert set(jax_table.POLICIES) == set(KINDS) == set(POLICY_KINDS)


def _files_naming(word: str) -> list[str]:
    pat = re.compile(r"""["']%s["']""" % re.escape(word))
    return [str(p.relative_to(ROOT)) for p in SOURCES if pat.search(p.read_text())]


# The name op's string is also the key of its own param ("name"), so it is left out.
@pytest.mark.parametrize("op", [o for o in OPS if o != NAME_OP])
def test_an_op_is_named_in_at_most_four_files(op):
    assert len(_files_naming(op)) <= 4, _files_naming(op)


@pytest.mark.parametrize("kind", POLICY_KINDS)
def test_a_policy_kind_is_named_in_at_most_four_files(kind):
    assert len(_files_naming(kind)) <= 4, _files_naming(kind)


@pytest.mark.parametrize("name", registry.REFERENCES)
def test_a_reference_pipeline_is_named_in_at_most_three_files(name):
    assert len(_files_naming(name)) <= 3, _files_naming(name)


def test_lowering_templates_fill_every_placeholder():
    for fw, table in TABLES.items():
        for op, low in table.items():
            d = OPS[op]
            holes = set(re.findall(r"{(\w+)}", low.expr))
            allowed = set("xy"[:d.arity]) | set(d.params) | {"nondiff"}
            assert holes <= allowed, (fw, op, holes - allowed)
            assert isinstance(low, Lowering)


@pytest.mark.parametrize("table", ["jax", "torch"])
def test_ops_sharing_a_policy_primitive_are_declared_alike(table):
    # an `ops` policy decides on primitives: IR ops that lower to one are alike in its meaning
    from collections import defaultdict

    from conformance.ir.ops import POLICY_ALIKE
    from conformance.pipelines.jax import table as jax_table
    from conformance.pipelines.torch import table as torch_table
    by = defaultdict(set)
    for op, low in {"jax": jax_table.OPS, "torch": torch_table.OPS}[table].items():
        for prim in low.policy_ops:
            by[prim].add(op)
    groups = [ops for ops in by.values() if len(ops) > 1 and not ops <= set(NAME_OPS)]
    assert groups
    for ops in groups:
        assert any(ops <= set(g) for g in POLICY_ALIKE), ops
    # and the policy's meaning follows: naming one saves the others
    from conformance.ir.policy import Ops, decide
    for g in POLICY_ALIKE:
        assert all(decide(Ops(ops=[g[0]]), o, None) == "save" for o in g)
    assert decide(Ops(ops=["mul"]), "sin", None) == "recompute"
