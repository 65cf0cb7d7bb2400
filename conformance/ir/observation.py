"""Observation: what one pipeline saw when it ran one program. Pipelines fill it; oracles read it."""
from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer

from conformance.ir.verdict import Stage


class ErrorInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: str
    message: str
    stage: Stage
    # where a message too short to tell errors apart (a bare AssertionError) was raised: the framework's
    # innermost frame and the framework frame that called it, `package/path.py:function, called from
    # package/path.py:function` (pipelines.base.raise_site; absent otherwise, and from the dump)
    where: str | None = None

    @model_serializer(mode="wrap")
    def _without_empty_where(self, handler):
        out = handler(self)
        if isinstance(out, dict) and out.get("where") is None:
            out.pop("where", None)
        return out

    @field_validator("message")
    @classmethod
    def _no_addresses(cls, v: str) -> str:
        """Object addresses (`<... object at 0x7f...>`) differ between processes: left out, so that one
        error reads the same in every run."""
        return re.sub(r" at 0x[0-9a-fA-F]+", " at 0x…", v)


class Residual(BaseModel):
    """One saved value. `cls` is the sorted list of program value ids whose values it equals
    (modulo layout), empty when it matches none; `exact`, those it equals in its own shape, element
    for element (no axis permutation, no reshape). `names` are checkpoint names in the class."""
    model_config = ConfigDict(extra="forbid")
    cls: list[str]
    names: list[str] = Field(default_factory=list)
    shape: list[int]
    dtype: str
    bytes: int
    memory: str | None = None   # memory kind where known (device, pinned_host)
    copies: int = 1             # how many saved arrays held this value
    exact: list[str] = Field(default_factory=list)

    def describe(self) -> str:
        """One line: value class, checkpoint names, dtype and shape (v1/v2['a']:float32[3, 4])."""
        return ("/".join(self.cls) or "?") + (f"{self.names}" if self.names else "") + f":{self.dtype}{self.shape}"


def residual_digest(residuals: list[Residual]) -> dict:
    """What findings keep of a saved-residual set: each residual described, and the total bytes."""
    return {"saved": [r.describe() for r in residuals], "saved_bytes": sum(r.bytes for r in residuals)}


class CustomRuleLog(BaseModel):
    """What one custom_vjp block's rules saw, keyed in Observation by the block's path."""
    model_config = ConfigDict(extra="forbid")
    perturbed: list[list[bool]] = Field(default_factory=list)          # distinct flag tuples seen by fwd
    symbolic_zero_cts: list[list[bool]] = Field(default_factory=list)  # distinct is-zero tuples seen by bwd
    # PyTorch (eager): what a rule with set_materialize_grads(False) received per cotangent,
    # "none", "zero" (a tensor of zeros, materialised by autograd) or "value"; distinct tuples
    ct_kinds: list[list[str]] = Field(default_factory=list)
    fwd_traces: int = 0      # how often the fwd rule ran (traced or called)
    bwd_calls: int = 0       # how often the bwd rule ran
    primal_traces: int = 0   # how often the primal function ran
    rem_traces: int = 0      # how often a rematerialisation rule (defremat, custom_gradient remat) ran


class ReportedResidual(BaseModel):
    """One line of JAX's own residual report (jax._src.ad_checkpoint.saved_residuals)."""
    model_config = ConfigDict(extra="forbid")
    shape: list[int]
    dtype: str
    source: str                 # the report's text ("named 'a' from ...", "output of sin from ...")
    name: str | None = None     # the checkpoint name it prints, if any


class Observation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    pipeline: str
    device: str = "cpu"
    outputs: list[Any] | None = None          # nested lists (float), one per program output
    loss: float | None = None
    grads: dict[str, Any] | None = None       # input id -> nested list
    grads2: dict[str, Any] | None = None      # second order, when asked
    residuals: list[Residual] | None = None
    # values a policy asked to save that the pipeline recomputes instead (eager SAC: what its cache holds as
    # to recompute); None where not observed
    recomputed_against_policy: list[Residual] | None = None
    values: dict[str, Any] | None = None      # every node's value (the reference records them)
    custom_rules: dict[str, CustomRuleLog] = Field(default_factory=dict)
    # effect kind -> how often the program's effects of that kind ran during the differentiation
    # (forward and backward, not the second order); None: no effect in the program
    effects: dict[str, int] | None = None
    # the same per effect statement (its output's id), where the pipeline tells them apart (JAX's)
    effect_sites: dict[str, int] | None = None
    residual_report: list[ReportedResidual] | None = None   # JAX's report of the same function
    # (element count, dtype) of each saved array as saved (a scan's stacked residual is one array
    # here, one residual per iteration in `residuals`); recorded where the report is
    saved_arrays: list[tuple[int, str]] | None = None
    residual_report_error: str | None = None                # "Type: message" when the report raised
    error: ErrorInfo | None = None
    unsupported: str | None = None            # pipeline declares the program out of scope
    versions: dict[str, str] = Field(default_factory=dict)
    flags: dict[str, Any] = Field(default_factory=dict)
    timings: dict[str, float] = Field(default_factory=dict)

    def ok(self) -> bool:
        return self.error is None and self.unsupported is None
