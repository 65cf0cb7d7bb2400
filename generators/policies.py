"""Hypothesis strategies for framework-neutral checkpoint policies, one branch per policy kind
declared in `conformance.ir.policy.KINDS`."""
from __future__ import annotations

from hypothesis import strategies as st

from conformance.ir import ops as O
from conformance.ir.policy import KINDS
from generators.draws import BOOL, draw_int

NAME_POOL = ("a", "b", "c")
MAX_OPERAND_BACK = 7      # operands: how far back from the newest value an index reaches
ELEMENT_THRESHOLDS = (2, 4, 8, 16)   # min_elements policies: the first is the simplest


def policy_ops() -> list[str]:
    """Op kinds an `ops` policy may name: every op the generator emits outside custom rules (the
    opt-in families' last, so that the others keep their indices)."""
    return [o for f in O.generated_families(False, opt_in=O.OPT_IN_FAMILIES) for o in O.family_ops(f, False)]


def _draw_names(draw, names, label, min_one=True) -> list[str]:
    picked = [n for n in names if draw(BOOL, label=label)]
    return picked or ([names[0]] if min_one else [])


def draw_policy_plan(draw, kinds: list[str], names=NAME_POOL, depth=0) -> tuple:
    """A policy plan: (kind, fields) of one of `kinds` (declaration order; the first is the
    simplest). An `ops` field holds op indices, resolved by `make_policy` once the region's
    body is known, so that the policy names the region's own ops first."""
    combining = [k for k in kinds if "a" in KINDS[k].fields]
    usable = [k for k in kinds if depth == 0 or (k not in combining and not KINDS[k].region_only)]
    if not usable:
        usable = [next(k for k in KINDS if "a" not in KINDS[k].fields)]
    k = usable[0] if len(usable) == 1 else usable[draw_int(draw, 0, len(usable) - 1, "policy_kind")]
    kw = {}
    for f in KINDS[k].fields:
        if f in ("names", "saved"):
            kw[f] = _draw_names(draw, names, f)
        elif f == "offloaded":
            kw[f] = [n for n in _draw_names(draw, names, f, min_one=False) if n not in kw.get("saved", [])]
        elif f == "ops":
            picked = [draw_int(draw, 0, MAX_OPERAND_BACK, "policy_op")]
            while len(picked) < 3 and draw(BOOL, label="policy_op_more"):
                picked.append(draw_int(draw, 0, MAX_OPERAND_BACK, "policy_op"))
            kw[f] = picked
        elif f == "elements":   # thresholds within the generator's small shapes (1-64 elements)
            kw[f] = ELEMENT_THRESHOLDS[draw_int(draw, 0, len(ELEMENT_THRESHOLDS) - 1, "policy_elements")]
        elif f in ("a", "b"):
            kw[f] = draw_policy_plan(draw, kinds, names, depth + 1)
    return k, kw


def make_policy(plan: tuple, ops_first=()):
    k, kw = plan
    out = {}
    for f, v in kw.items():
        if f == "ops":
            cand = list(dict.fromkeys([o for o in ops_first if o in _POLICY_OPS] + _POLICY_OPS))
            out[f] = list(dict.fromkeys(cand[min(i, len(cand) - 1)] for i in v))
        elif f in ("a", "b"):
            out[f] = make_policy(v, ops_first)
        else:
            out[f] = v
    return KINDS[k].model(**out)


_POLICY_OPS = policy_ops()


def policies(names=NAME_POOL, allow_offload=True, depth=0, kinds=None):
    """Strategy for framework-neutral policies, one branch per declared policy kind."""
    ks = [k for k in (kinds or KINDS) if allow_offload or not KINDS[k].offloads]
    return st.composite(lambda draw: make_policy(draw_policy_plan(draw, ks, tuple(names), depth)))()
