"""`remat-conformance repro`: standalone Python scripts that reproduce one finding.

The default is the short repro (conformance.repro.short: the program as plain framework code,
the evidence printed with the framework's own tools, exit 1 while it reproduces); the generic
script below is `repro --full`.

A script imports only the framework (jax or torch), numpy and the standard library. It
builds the shrunk program as straight-line code from the same lowering tables the
pipelines compile (checkpoint regions as functions passed to `jax.checkpoint` /
`torch.utils.checkpoint.checkpoint` with a SAC policy, custom_vjp blocks as
`jax.custom_vjp` / `torch.autograd.Function`), embeds the exact inputs, runs the finding's
pipeline and its reference with their registry settings, prints both sides and performs
the same check as the harness's oracle. Exit status: 0 conforms (fixed), 1 reproduces,
3 inconclusive.

Layout: plan (which pipelines to run and which check), emit (the program's source, one
emitter per dialect: emit_jax, emit_torch, and pseudo-code for reports), script (the
template rendered), command (the CLI). The package imports no framework, so a report can
embed scripts for both; it never imports the CLI.
"""
from conformance.repro.emit import pseudo_code
from conformance.repro.plan import ReproError, frameworks_for
from conformance.repro.script import generate
from conformance.repro.short import short_repro

__all__ = ["ReproError", "frameworks_for", "generate", "pseudo_code", "short_repro"]
