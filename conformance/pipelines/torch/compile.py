"""torch.compile backends that record what the partitioner saves: aot_eager with the min-cut or
the default partitioner, and inductor's min-cut partitioner, plus scoped settings."""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any

from torch._inductor.custom_graph_pass import CustomPartitionerFn


# ---- compile-time recording partitioners -----------------------------------------------------
def _concrete(d) -> int | None:
    """A dim as an int: its value, or a symbolic dim's hint (dynamic shapes); None without one."""
    if isinstance(d, int):
        return d
    hint = getattr(getattr(d, "node", None), "hint", None)
    return int(hint) if hint is not None else None


def _saved_desc(fw, n_user) -> list:
    outs = fw.graph.find_nodes(op="output")[0].args[0][n_user:]
    out = []
    for o in outs:   # [node name, shape, bytes] (a symbolic int: no shape, no bytes); plain ints only
        v = o.meta.get("val") if hasattr(o, "meta") else None
        shaped = hasattr(v, "shape") and hasattr(v, "element_size")
        shape = [_concrete(d) for d in v.shape] if shaped else None
        known = shape is not None and None not in shape
        out.append([getattr(o, "name", str(o)), shape,
                    int(math.prod(shape)) * int(v.element_size()) if known else None])
    return out


def recording_aot_backend(partition: str, rec: dict):
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
    base = {"min_cut": min_cut_rematerialization_partition, "default": default_partition}[partition]

    def part(joint_gm, joint_inputs, *, num_fwd_outputs, **kw):
        fw, bw = base(joint_gm, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)
        rec.setdefault("partitioner_saved", []).append(_saved_desc(fw, num_fwd_outputs))
        return fw, bw

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs,
                                     fw_compiler=lambda g, e: make_boxed_func(g),
                                     bw_compiler=lambda g, e: make_boxed_func(g),
                                     partition_fn=part)
    return backend


class RecordingPartitioner(CustomPartitionerFn):
    """Inductor's min-cut partitioner, recording which forward nodes it saves. Module level
    (picklable) so that inductor's FX-graph cache still works; the autograd cache, which
    would skip the partitioner, is off during runs."""

    def __init__(self, rec: dict | None = None):
        self.rec = rec if rec is not None else {}

    def __call__(self, gm, joint_inputs, **kwargs):
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        fw, bw = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        self.rec.setdefault("partitioner_saved", []).append(_saved_desc(fw, kwargs["num_fwd_outputs"]))
        return fw, bw

    def uuid(self):
        return "remat-conformance-recording-min-cut-v1"

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.rec = {}


def inductor_partitioner(rec: dict):
    return RecordingPartitioner(rec)


@contextmanager
def torch_settings(settings: list[tuple[Any, str, Any]]):
    """Set (module, attribute, value) for one run and restore them afterwards."""
    old = [(m, k, getattr(m, k)) for m, k, _ in settings]
    try:
        for m, k, v in settings:
            setattr(m, k, v)
        yield
    finally:
        for m, k, v in old:
            setattr(m, k, v)


