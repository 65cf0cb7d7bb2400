"""Isolated execution: pipelines run in supervised worker processes (spawn context).

protocol: what supervisor and worker share (JSON messages, input encoding, plugin loading);
worker: the code that runs inside a worker process; supervisor: `IsolatedExecutor`, which
starts, watches, kills and replaces workers (its module docstring says what it guarantees).

Layering: this package sits above pipelines and runner. It may import conformance.ir,
conformance.ir.observation, conformance.pipelines, conformance.engine.runner, numpy and the stdlib;
never oracles, generators, campaign, cli, report or repro.
"""
from __future__ import annotations

from conformance.engine.isolation.protocol import (
                                                   PLUGINS_ENV,
                                                   ProtocolError,
                                                   decode_inputs,
                                                   encode_inputs,
                                                   load_plugins,
                                                   looks_oom,
)
from conformance.engine.isolation.supervisor import DEFAULT_MEMORY_LIMIT, MEMORY_ENV, IsolatedExecutor

__all__ = ["DEFAULT_MEMORY_LIMIT", "IsolatedExecutor", "MEMORY_ENV", "PLUGINS_ENV", "ProtocolError",
           "decode_inputs", "encode_inputs", "load_plugins", "looks_oom"]
