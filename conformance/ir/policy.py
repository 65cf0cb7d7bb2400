"""Checkpoint policies: each kind declared once, with its one documented meaning.

Each policy answers, for one value produced inside a region, "save", "recompute" or
"offload" (saved, in host memory): `decide`. That is the meaning every oracle uses; the
PyTorch policy_fn is a thin adapter over it (aten op -> IR op kind, name, batched), and
the JAX side has one translation table (conformance/pipelines/jax/table.py) to
jax.checkpoint_policies members. Op facts (which ops are dots) come from the op table.

| kind                         | jax.checkpoint_policies member                 |
|------------------------------|------------------------------------------------|
| everything                   | everything_saveable                            |
| nothing                      | nothing_saveable                               |
| dots                         | dots_saveable (= checkpoint_dots)              |
| dots_no_batch                | dots_with_no_batch_dims_saveable               |
| save_only_names              | save_only_these_names(*names)                  |
| save_any_names_but_these     | save_any_names_but_these(*names)               |
| save_anything_except_names   | save_anything_except_these_names(*names)       |
| both                         | save_from_both_policies(a, b)                  |
| offload_dots_no_batch        | offload_dot_with_no_batch_dims(src, dst)       |
| save_and_offload_names       | save_and_offload_only_these_names(...)         |
| ops                          | custom callable: save outputs of these op kinds|
|                              | (and of those sharing their primitive)         |
| offload_ops                  | custom callable: offload (Offloadable) outputs |
|                              | of these op kinds to the host                  |
| min_elements                 | custom callable over avals: save outputs of ops|
|                              | whose first input has >= N elements            |
| dot_params                   | custom callable over params: save dot_general  |
|                              | outputs whose dimension_numbers have no batch  |
| no_policy                    | policy=None (PyTorch: checkpoint without SAC)  |

Program layer: imports the op table and pydantic only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from conformance.ir.ops import NAME_OPS, OPS, POLICY_ALIKE


class _P(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Everything(_P):
    kind: Literal["everything"] = "everything"


class Nothing(_P):
    kind: Literal["nothing"] = "nothing"


class Dots(_P):
    kind: Literal["dots"] = "dots"


class DotsNoBatch(_P):
    kind: Literal["dots_no_batch"] = "dots_no_batch"


class SaveOnlyNames(_P):
    kind: Literal["save_only_names"] = "save_only_names"
    names: list[str]


class SaveAnyNamesButThese(_P):
    kind: Literal["save_any_names_but_these"] = "save_any_names_but_these"
    names: list[str]


class SaveAnythingExceptNames(_P):
    kind: Literal["save_anything_except_names"] = "save_anything_except_names"
    names: list[str]


class Both(_P):
    kind: Literal["both"] = "both"
    a: "Policy"
    b: "Policy"


class OffloadDotsNoBatch(_P):
    kind: Literal["offload_dots_no_batch"] = "offload_dots_no_batch"


class SaveAndOffloadNames(_P):
    kind: Literal["save_and_offload_names"] = "save_and_offload_names"
    saved: list[str]
    offloaded: list[str]


class Ops(_P):
    """Custom predicate over op kinds: save outputs of these IR ops."""
    kind: Literal["ops"] = "ops"
    ops: list[str]

    @field_validator("ops")
    @classmethod
    def _known(cls, v):
        unknown = [o for o in v if o not in OPS]
        if unknown:
            raise ValueError(f"unknown ops {unknown}; known: {sorted(OPS)}")
        return v


class OffloadOps(Ops):
    """Custom predicate over op kinds: offload the outputs of these IR ops to host memory (any op
    kind: PyTorch MUST_CPU_OFFLOAD, JAX Offloadable), recompute the rest."""
    kind: Literal["offload_ops"] = "offload_ops"


class MinElements(_P):
    """Custom predicate over the avals a policy is given: save the outputs of every op (a name
    included) whose first input has at least `elements` elements."""
    kind: Literal["min_elements"] = "min_elements"
    elements: int = Field(ge=1, le=1 << 20)


class NoPolicy(_P):
    """No policy at all: jax.checkpoint(policy=None), torch.utils.checkpoint without a selective
    context. Documented to save nothing but the region's inputs (nothing_saveable's meaning),
    through each framework's own no-policy path."""
    kind: Literal["no_policy"] = "no_policy"


class DotParams(_P):
    """Custom predicate over the params a policy is given, as users write one: save the outputs
    of matrix products whose dimension numbers name no batch dimension (the meaning of
    dots_no_batch, decided by the callable itself)."""
    kind: Literal["dot_params"] = "dot_params"


Policy = Annotated[
    Union[Everything, Nothing, Dots, DotsNoBatch, SaveOnlyNames, SaveAnyNamesButThese,
          SaveAnythingExceptNames, Both, OffloadDotsNoBatch, SaveAndOffloadNames, Ops, MinElements, DotParams,
          NoPolicy, OffloadOps],
    Field(discriminator="kind"),
]
Both.model_rebuild()


def _is_dot(op, batched):
    d = OPS.get(op)
    return d is not None and d.dot


def _is_dot_no_batch(op, batched):
    d = OPS.get(op)
    return d is not None and d.dot_no_batch and not batched


def _alike(op) -> set:
    """An op kind and those no framework's policy tells apart from it (ops.POLICY_ALIKE)."""
    return {op} | {o for g in POLICY_ALIKE if op in g for o in g}


def _either(a: str, b: str) -> str:
    return "save" if "save" in (a, b) else "offload" if "offload" in (a, b) else "recompute"


@dataclass(frozen=True)
class KindDecl:
    """One policy kind. `fields` says how the generator fills it: () a plain kind, ('names',),
    ('saved', 'offloaded'), ('ops',), ('elements',) or ('a', 'b') for two sub-policies.
    `region_only`: a kind that is no policy object (policy=None), never part of both(a, b)."""
    model: type
    decide: Callable      # (p, op, name, batched, elements) -> 'save' | 'recompute' | 'offload'
    fields: tuple[str, ...] = ()
    offloads: bool = False
    region_only: bool = False
    # decides on shapes (a dot's batch dimensions, an input's element count): under jax.vmap
    # (per-example programs) JAX's policy sees the batched shapes where PyTorch's per-example
    # loop sees one example's
    on_shapes: bool = False
    # what the kind reads to decide, as a residual difference's cause names it (names, dots, everything,
    # everything_but_names, custom, nothing); `both` is read as the sub-policy that decided (deciding_rule)
    rule: str = "custom"
    needs: tuple[str, ...] = ()   # the release APIs its spellings use (conformance.ir.releases); what offloading
                                  # needs is the feature `offloading`'s (a policy can be of an offloading kind and
                                  # offload nothing)
    # the field that lists what an offloading kind offloads: empty, the policy only saves and recomputes
    offload_field: str | None = None

    @property
    def kind(self) -> str:
        return self.model.model_fields["kind"].default


KINDS: dict[str, KindDecl] = {}


def _kind(model, decide, fields=(), offloads=False, region_only=False, on_shapes=False, rule="custom", needs=(),
          offload_field=None):
    k = KindDecl(model, decide, fields, offloads, region_only, on_shapes, rule, tuple(needs), offload_field)
    KINDS[k.kind] = k


# Declaration order is the generator's order (the first is the simplest).
_kind(Nothing, lambda p, op, name, b, n: "recompute", rule="nothing")
_kind(SaveOnlyNames, lambda p, op, name, b, n: "save" if name is not None and name in p.names else "recompute",
      ("names",), rule="names")
_kind(Everything, lambda p, op, name, b, n: "save", rule="everything")
_kind(Dots, lambda p, op, name, b, n: "save" if _is_dot(op, b) else "recompute", rule="dots")
_kind(DotsNoBatch, lambda p, op, name, b, n: "save" if _is_dot_no_batch(op, b) else "recompute", on_shapes=True,
      rule="dots")
_kind(SaveAnyNamesButThese,
      lambda p, op, name, b, n: "save" if name is not None and name not in p.names else "recompute", ("names",),
      rule="names", needs=("checkpoint_policies.save_any_names_but_these",))
_kind(SaveAnythingExceptNames,
      lambda p, op, name, b, n: "recompute" if name is not None and name in p.names else "save", ("names",),
      rule="everything_but_names", needs=("checkpoint_policies.save_anything_except_these_names",))
_kind(Ops, lambda p, op, name, b, n: "save" if _alike(op) & set(p.ops) else "recompute", ("ops",), rule="custom")
_kind(OffloadDotsNoBatch, lambda p, op, name, b, n: "offload" if _is_dot_no_batch(op, b) else "recompute",
      offloads=True, on_shapes=True, rule="dots", needs=("checkpoint_policies.offload_dot_with_no_batch_dims",))
_kind(SaveAndOffloadNames, lambda p, op, name, b, n: (
    "save" if name is not None and name in p.saved else
    "offload" if name is not None and name in p.offloaded else "recompute"), ("saved", "offloaded"), offloads=True,
    rule="names", needs=("checkpoint_policies.save_and_offload_only_these_names",), offload_field="offloaded")
_kind(MinElements, lambda p, op, name, b, n: "save" if n is not None and n >= p.elements else "recompute",
      ("elements",), on_shapes=True, rule="custom")
_kind(Both, lambda p, op, name, b, n: _either(decide(p.a, op, name, b, n), decide(p.b, op, name, b, n)), ("a", "b"),
      rule="both", needs=("checkpoint_policies.save_from_both_policies",))
_kind(DotParams, lambda p, op, name, b, n: "save" if _is_dot_no_batch(op, b) else "recompute", on_shapes=True,
      rule="dots")
_kind(NoPolicy, lambda p, op, name, b, n: "recompute", region_only=True, rule="nothing")
_kind(OffloadOps, lambda p, op, name, b, n: "offload" if _alike(op) & set(p.ops) else "recompute", ("ops",),
      offloads=True, rule="custom", offload_field="ops")

POLICY_KINDS = tuple(KINDS)


def decide(p, op: str | None, name: str | None, batched: bool = False, elements: int | None = None) -> str:
    """The documented meaning: 'save', 'offload' or 'recompute' for a value produced by op kind
    `op` (None: an op the IR does not know), with checkpoint name `name` for name ops, whose
    first input has `elements` elements (None: unknown)."""
    k = KINDS.get(p.kind)
    if k is None:
        raise ValueError(f"unknown policy kind {p.kind!r}")
    return k.decide(p, op, name, batched, elements)


def deciding_rule(p, op: str | None, name: str | None, batched: bool = False, elements: int | None = None) -> str:
    """What a policy read to decide on a value (KindDecl.rule): for save_from_both_policies, the rule of the
    sub-policy whose decision stands (the one that saves, else the first)."""
    if combines(p):
        d = decide(p, op, name, batched, elements)
        sub = p.a if decide(p.a, op, name, batched, elements) == d else p.b
        return deciding_rule(sub, op, name, batched, elements)
    return KINDS[p.kind].rule


def thresholds(p) -> list[int]:
    """The element counts at which a policy's decisions can change (min_elements), sorted."""
    out = {p.elements} if p.kind == "min_elements" else set()
    for q in parts(p):
        out |= set(thresholds(q))
    return sorted(out)


def class_elements(c: int, bounds: list[int]) -> int | None:
    """An element count of size class c (its lower bound; None for class 0 with no bounds)."""
    return bounds[c - 1] if c else (0 if bounds else None)


def decisions(p, ops, names=(None,)):
    """The policy's decision on each op of `ops` (None: any other op) under each name of `names`, in every size
    class its thresholds tell apart, batched or not."""
    bounds = thresholds(p)
    return (decide(p, op, name, batched, class_elements(c, bounds))
            for c in range(len(bounds) + 1) for batched in (False, True) for op in ops for name in names)


def saves_unnamed(p) -> bool:
    """Whether the policy can save (or offload) the output of an op that is neither a name nor a
    dot: then a framework may keep its own derivative factor of a value (JAX: cos(x) for sin(x))
    instead of the value itself."""
    return any(d != "recompute" for d in decisions(
        p, [None, *(o for o, d in OPS.items() if o not in NAME_OPS and not d.dot)]))


def saves_everything(p) -> bool:
    """Whether a policy saves the output of every op, a name's included, whatever its size or batching
    (everything_saveable, and what means the same: save_from_both_policies(q, everything_saveable),
    save_anything_except_these_names([]) ...): a region under it keeps what the program keeps without it."""
    return all(d == "save" for d in decisions(p, [None, *OPS], [None, "_any", *policy_names(p)]))


def policy_names(p) -> list[str]:
    """Every checkpoint name a policy mentions."""
    out: list[str] = []
    for f in KINDS[p.kind].fields:
        v = getattr(p, f)
        if f in ("a", "b"):
            out += policy_names(v)
        elif f not in ("ops", "elements"):
            out += list(v)
    return out


def decides_on_shapes(p) -> bool:
    """Whether a policy (or a part of it) decides on shapes, which jax.vmap changes."""
    return KINDS[p.kind].on_shapes or any(map(decides_on_shapes, parts(p)))


def judged_by_meaning(policies, per_example: bool) -> bool:
    """Whether a value under these enclosing policies is judged by their documented meaning: not
    in a per-example program under a policy that decides on shapes (jax.vmap changes the shapes
    JAX's policy sees, PyTorch's loop sees one example's)."""
    return not (per_example and any(map(decides_on_shapes, policies)))


def combines(p) -> bool:
    """A policy made of two sub-policies (save_from_both_policies)."""
    return "a" in KINDS[p.kind].fields


def parts(p) -> list:
    """A combining policy's sub-policies (both(a, b)); none for another kind."""
    return [getattr(p, f) for f in KINDS[p.kind].fields if f in ("a", "b")]


def offloads(p) -> bool:
    """A policy of an offloading kind, or made of one (what JAX's save_from_both_policies refuses: such a policy
    returns an offload decision, not a bool, even where it offloads nothing)."""
    return KINDS[p.kind].offloads or any(map(offloads, parts(p)))


def moves_to_host(p) -> bool:
    """A policy that can offload a value (to host memory): an offloading kind with something to offload, or made of
    one. What needs a release's CPU offload (feature `offloading`); save_and_offload_only_these_names with no
    offloaded names only saves and recomputes, on any release that has the function."""
    k = KINDS[p.kind]
    own = k.offloads and (k.offload_field is None or bool(getattr(p, k.offload_field)))
    return own or any(map(moves_to_host, parts(p)))
