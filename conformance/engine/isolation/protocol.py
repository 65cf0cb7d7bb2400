"""What supervisor and worker share: constants, JSON message encoding, input encoding,
OOM detection and plugin loading.

Test-only pipelines: a spawned worker knows only the registry's pipelines. Modules named in
`plugins` (or in the environment variable REMAT_CONFORMANCE_PLUGINS, comma-separated) are
imported in the worker, and by `load_plugins()` in the supervisor, before anything runs; they
register their pipelines on import (`pipelines.register_instance`).
"""
from __future__ import annotations

import base64
import importlib
import json
import os
from typing import Any, Sequence

import numpy as np

from conformance.ir.batching import value_shape
from conformance.ir.dtypes import DTYPES, np_dtype

PLUGINS_ENV = "REMAT_CONFORMANCE_PLUGINS"
# Error text that means the pipeline ran out of memory (Python, XLA, torch, C++).
OOM_MARKERS = ("MemoryError", "RESOURCE_EXHAUSTED", "std::bad_alloc", "Cannot allocate memory",
               "OutOfMemoryError", "out of memory", "Out of memory")


class ProtocolError(RuntimeError):
    pass


def load_plugins(modules: Sequence[str] | None = None) -> list[str]:
    """Import plugin modules (default: $REMAT_CONFORMANCE_PLUGINS). Returns their names."""
    if modules is None:
        modules = [m.strip() for m in os.environ.get(PLUGINS_ENV, "").split(",") if m.strip()]
    for m in modules:
        importlib.import_module(m)
    return list(modules)


def encode_inputs(inputs: dict[str, np.ndarray]) -> dict[str, dict]:
    out = {}
    for k, v in inputs.items():
        a = np.asarray(v)   # tobytes() is C order whatever the layout (ascontiguousarray would make 0-d 1-d)
        out[k] = {"dtype": str(a.dtype), "shape": list(a.shape), "data": base64.b64encode(a.tobytes()).decode()}
    return out


def decode_inputs(obj: Any, program) -> dict[str, np.ndarray]:
    """Inputs from their JSON form, checked against the program's inputs (ValueError if wrong)."""
    if not isinstance(obj, dict):
        raise ValueError("inputs: must be an object")
    types = {i.id: i for i in program.inputs}
    if set(obj) != set(types):
        raise ValueError(f"inputs: ids {sorted(obj)} do not match the program's {sorted(types)}")
    out = {}
    for k, d in obj.items():
        shape = list(value_shape(program, types[k]))
        if (not isinstance(d, dict) or d.get("dtype") not in DTYPES
                or d.get("shape") != shape or not isinstance(d.get("data"), str)):
            raise ValueError(f"inputs.{k}: not a float array of the program's shape {shape}")
        raw = base64.b64decode(d["data"], validate=True)
        a = np.frombuffer(raw, dtype=np_dtype(d["dtype"]))
        if a.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"inputs.{k}: {a.size} elements, expected shape {shape}")
        out[k] = a.reshape(shape).copy()
    return out


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def _dumps(obj) -> bytes:
    return json.dumps(obj, default=_json_default, separators=(",", ":")).encode()


def looks_oom(text: str) -> bool:
    return any(m in text for m in OOM_MARKERS)
