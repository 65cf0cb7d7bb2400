"""The short repro (the default of `remat-conformance repro`): the finding's program as plain
framework code (functions, jax.checkpoint / torch.utils.checkpoint with its policy, the custom
rules as jax.custom_vjp / torch.autograd.Function), its exact inputs, the finding's pipeline
and its reference side by side with the framework's own evidence (print_saved_residuals, a
saved_tensors_hooks listing, a counter in the rule, the exception, both gradients), then the
verdict: exit 1 while the behaviour reproduces, 0 once it is fixed, 3 where the release cannot run it.
It imports only the framework and numpy. The generic script (conformance.repro.script) is `repro --full`."""
from __future__ import annotations

from conformance.pipelines import registry
from conformance.repro import short_jax, short_torch
from conformance.repro.plan import ReproError
from conformance.repro.short_common import code_lines, release_guard
from generators.programs import input_values

__all__ = ["short_repro", "code_lines", "ReproError"]


def short_repro(prog, inputs, finding, framework: str | None = None) -> str:
    """The short reproducer's source for a finding (ReproError where it has no short form)."""
    if finding is None:
        raise ReproError("a short repro reproduces a finding; a bare program has none (use --full)")
    own = registry.framework_of(finding.pipeline)
    fw = framework or own
    if fw not in registry.FRAMEWORKS:
        raise ReproError(f"--framework: must be one of {', '.join(registry.FRAMEWORKS)}, got {fw!r}")
    if fw != own:
        raise ReproError(f"the finding is about {finding.pipeline}; a short repro runs the finding's own "
                         f"framework ({own}); the {fw} counterpart is `repro --full --framework {fw}`")
    if inputs is None:
        inputs = input_values(prog, 0)
    return release_guard((short_jax if fw == "jax" else short_torch).script(prog, inputs, finding), fw)
