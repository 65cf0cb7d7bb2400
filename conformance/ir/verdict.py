"""Verdicts and the one vocabulary of checks, statuses, stages and symptoms.

A verdict is what an oracle concludes about one (program, pipeline, reference, check).
Everything that names a check, a stage or a crash/timeout symptom takes it from here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class CheckSpec:
    """One check, declared once. `pairwise`: it compares two pipelines' own records (saved
    residuals, custom-rule logs), so a shrink step runs only those two; `sentence`: what the
    finding means, for repros and issue texts ({P} the pipeline, {R} its reference); `title`: the
    behaviour's one-line title ({pipeline}, {reference}, {label}: the verdict's error type, {value}:
    what a gradient verdict compared);
    `expected`: what the reference says ({who}: its authority, {reference}, {pipeline});
    `evidence`: what a repro prints to show it; `grid`: summary.md's grid has a column for it."""
    name: str
    pairwise: bool
    sentence: str
    title: str
    expected: str
    evidence: str
    grid: bool = True


# Triage order: silent wrong gradients first, then silently ignored policies and residual
# differences, then custom-rule observations, JAX's own residual report disagreeing with what
# was saved, how often custom rules were traced, error behaviour, crashes, timeouts.
CHECK_SPECS = (
    CheckSpec("gradient", False,
              "{P} computes outputs/gradients that differ from {R} beyond the tolerance "
              "(rematerialization must never change values).",
              "{pipeline}: {value} differ from {reference}",
              "Expected ({who}): the same values as `{reference}` within the tolerance.",
              "both sides' outputs and gradients, and which differ beyond the tolerance"),
    CheckSpec("residuals", True,
              "{P} and {R} claim the same checkpoint policy but save different residuals.",
              "{pipeline}: saves other residuals than {reference} under the same policy",
              "Expected ({who}): the same saved residuals as `{reference}`.",
              "each side's saved residuals (shape, dtype, name), the framework's own listing"),
    CheckSpec("custom_rule", True,
              "The custom_vjp rules see different perturbed flags / symbolic-zero cotangents under {P} "
              "than under {R}.",
              "{pipeline}: custom rule receives other {label} than under {reference}",
              "Expected ({who}): the custom rules see and run the same under `{pipeline}`.",
              "what each rule received on each side (perturbed flags, zero cotangents, whether fwd ran)"),
    CheckSpec("residual_report", False,
              "JAX's residual report (print_saved_residuals) under {P} disagrees with what its vjp "
              "closure saves.",
              "{pipeline}: the residual report disagrees with what the vjp closure saves ({label})",
              "Expected ({who}): the report lists what the vjp closure saves.",
              "print_saved_residuals and the arrays the vjp closure holds"),
    CheckSpec("trace_count", True,
              "The custom rules are traced or called a different number of times under {P} than under {R}.",
              "{pipeline}: custom rules traced or called a different number of times ({label})",
              "Expected ({who}): the custom rules run as often under `{pipeline}` as under `{reference}`.",
              "counters in each rule (primal, fwd, bwd) on each side"),
    CheckSpec("effect_count", True,
              "The program's effects (jax.debug.callback, io_callback) run a different number of times under "
              "{P} than under {R}.",
              "{pipeline}: effects run a different number of times than under {reference} ({label})",
              "Expected ({who}): each effect runs as often under `{pipeline}` as under `{reference}`, and never "
              "less often than without checkpoint.",
              "how often the callbacks of each effect kind ran on each side (forward and backward)"),
    CheckSpec("error", False,
              "{P} raises an error where nothing should raise.",
              "{pipeline}: raises {label}",
              "Expected ({who}): the same error behaviour as `{reference}`.",
              "the exception each side raises, or that it raises none"),
    CheckSpec("crash", False, "{P} crashes the process.", "{pipeline}: crashes the process ({label})",
              "Expected ({who}): the process survives.", "the signal or exit status", grid=False),
    CheckSpec("timeout", False, "{P} does not finish (timeout).", "{pipeline}: does not finish (timeout)",
              "Expected ({who}): the run finishes.", "the time it ran before it was stopped", grid=False),
)
CHECK: dict[str, CheckSpec] = {c.name: c for c in CHECK_SPECS}
CHECKS = tuple(CHECK)
CHECK_RANK: dict[str, int] = {c: i for i, c in enumerate(CHECKS)}
PAIRWISE_CHECKS = tuple(c.name for c in CHECK_SPECS if c.pairwise)
STATUSES = ("pass", "fail", "expected", "unsupported", "skipped")
# Where a pipeline run failed, in the order a run goes through them.
STAGES = ("setup", "validation", "lowering", "forward", "backward", "second_order")
# Error types the isolated executor reports for a worker that died or hung.
CRASH_PREFIX = "crash:"      # crash:SIGSEGV, crash:SIGABRT, crash:exit-1, crash:oom, ...
CRASH_OOM = CRASH_PREFIX + "oom"
TIMEOUT = "timeout"
# Verdict references that are not pipelines.
# "vjp": the pipeline's own vjp closure (what it really saved), for the residual-report check.
# "device:cpu": the same pipeline on the CPU, for a run on a device (`remat-conformance devices`).
DEVICE_REFERENCE = "device:cpu"
NON_PIPELINE_REFERENCES = ("expectations", "policy", "vjp", DEVICE_REFERENCE)
# Residual symptoms (a residual verdict's error_type).
# saved_bytes_grew: a lower activation_memory_budget made the partitioner save more bytes.
RESIDUAL_SYMPTOMS = ("missing", "extra", "named", "other", "saved_against_policy", "view_layout", "saved_bytes_grew")
# Residual-report symptoms: it lists other shapes/dtypes or another count than the closure holds
# ("count"), or prints a name that no saved value of that class carries ("names"); when the
# report itself raises, the exception's type.
REPORT_SYMPTOMS = ("count", "names")

Check = Literal[CHECKS]
Status = Literal[STATUSES]
Stage = Literal[STAGES]


def crash_type(what: str) -> str:
    return CRASH_PREFIX + what


def symptom_check(error_type: str) -> str | None:
    """The check an isolated-run error type belongs to: crash, timeout, or None (an ordinary error)."""
    if error_type == TIMEOUT:
        return "timeout"
    return "crash" if error_type.startswith(CRASH_PREFIX) else None


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


# A root's class: a framework bug, a documented (intended) difference, a question upstream must
# decide, or a limit of this harness (kept as a test of it). Rules suggest one (conformance.engine.roots);
# a person confirms it in the corpus entry.
TRIAGE_CLASSES = ("bug", "documented", "question", "harness")
TriageClass = Literal[TRIAGE_CLASSES]


class Triage(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True)
    class_: TriageClass = Field(alias="class")
    reason: str
    links: list[str] = Field(default_factory=list)
    confirmed: bool = False          # False: suggested by the rules, not yet read by a person
