"""Framework-neutral checkpoint policy vocabulary.

Each policy answers, for one value produced inside a region, "save" or "recompute"
(or "offload": saved, but in host memory). Op kinds are the IR's op names; a name
op (`name`) carries its checkpoint name. Pipelines translate a policy to
jax.checkpoint_policies members or to PyTorch SAC policy_fns.

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
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field


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


Policy = Annotated[
    Union[Everything, Nothing, Dots, DotsNoBatch, SaveOnlyNames, SaveAnyNamesButThese,
          SaveAnythingExceptNames, Both, OffloadDotsNoBatch, SaveAndOffloadNames, Ops],
    Field(discriminator="kind"),
]
Both.model_rebuild()

POLICY_KINDS = ("everything", "nothing", "dots", "dots_no_batch", "save_only_names",
                "save_any_names_but_these", "save_anything_except_names", "both",
                "offload_dots_no_batch", "save_and_offload_names", "ops")


def policy_names(p) -> list[str]:
    if p.kind in ("save_only_names", "save_any_names_but_these", "save_anything_except_names"):
        return list(p.names)
    if p.kind == "save_and_offload_names":
        return list(p.saved) + list(p.offloaded)
    if p.kind == "both":
        return policy_names(p.a) + policy_names(p.b)
    return []


def decide(p, op: str, name: str | None, batch_dot: bool = False) -> str:
    """Documented meaning: 'save', 'offload' or 'recompute' for a value produced by `op`
    (with checkpoint name `name` when op == 'name')."""
    k = p.kind
    is_dot = op == "matmul"
    if k == "everything":
        return "save"
    if k == "nothing":
        return "recompute"
    if k == "dots":
        return "save" if is_dot else "recompute"
    if k == "dots_no_batch":
        return "save" if is_dot and not batch_dot else "recompute"
    if k == "offload_dots_no_batch":
        return "offload" if is_dot and not batch_dot else "recompute"
    if k == "save_only_names":
        return "save" if name is not None and name in p.names else "recompute"
    if k == "save_any_names_but_these":
        return "save" if name is not None and name not in p.names else "recompute"
    if k == "save_anything_except_names":
        return "recompute" if name is not None and name in p.names else "save"
    if k == "save_and_offload_names":
        if name is not None and name in p.saved:
            return "save"
        if name is not None and name in p.offloaded:
            return "offload"
        return "recompute"
    if k == "ops":
        return "save" if op in p.ops else "recompute"
    if k == "both":
        da, db = decide(p.a, op, name, batch_dot), decide(p.b, op, name, batch_dot)
        if "save" in (da, db):
            return "save"
        if "offload" in (da, db):
            return "offload"
        return "recompute"
    raise ValueError(f"unknown policy kind {k!r}")
