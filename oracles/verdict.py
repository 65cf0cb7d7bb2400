"""Verdicts: what an oracle concludes about one (program, pipeline, reference, check)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Check = Literal["gradient", "residuals", "custom_rule", "error", "crash", "timeout"]
Status = Literal["pass", "fail", "expected", "unsupported", "skipped"]

# Triage order: silent wrong gradients first, then silently ignored policies and residual
# differences, then custom-rule observations, error behaviour, crashes, timeouts.
CHECK_RANK: dict[str, int] = {"gradient": 0, "residuals": 1, "custom_rule": 2, "error": 3, "crash": 4, "timeout": 5}


class Verdict(BaseModel):
    model_config = ConfigDict(extra="forbid")
    check: Check
    pipeline: str
    reference: str            # a pipeline name, "policy" or "expectations"
    status: Status
    error_type: str | None = None
    detail: dict[str, Any] = Field(default_factory=dict)
    expectation: str | None = None   # id of the expectation entry that matched, if any

    def key(self) -> tuple[str, str, str, str]:
        """What shrinking preserves: (check, pipeline, reference, error type)."""
        return (self.check, self.pipeline, self.reference, self.error_type or "")

    @property
    def unexpected(self) -> bool:
        return self.status == "fail"
