"""torch.compile backends that record what the partitioner saves: aot_eager with the min-cut or
the default partitioner, and inductor's min-cut partitioner, plus scoped settings."""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any

import torch

try:
    from torch._inductor.custom_graph_pass import CustomPartitionerFn
except ImportError:   # torch < 2.9: the inductor pipelines are unavailable there (releases: custom_partitioner_fn)
    CustomPartitionerFn = object


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


def _must_save(joint_gm) -> set[str]:
    """The joint graph's tensor-valued nodes a region's policy marked MUST_SAVE (read before the partitioner runs:
    what the policy asked, not what the partitioner made of it; a region's node: ac_graph_id; a multi-output node is
    saved by its items)."""
    policy = getattr(torch.utils.checkpoint, "CheckpointPolicy", None)   # (torch 2.5 onwards: before, no SAC)
    if policy is None:
        return set()
    return {n.name for n in joint_gm.graph.nodes if n.meta.get("recompute") == policy.MUST_SAVE
            and "ac_graph_id" in n.meta and isinstance(n.meta.get("val"), torch.Tensor)}


def _recomputed(must_save: set[str], bw) -> list[list[str]]:
    """[name, aten op] of each MUST_SAVE node the backward graph computes again (the partitioner keeps a joint
    node's name in the graph it moves it to; a saved one is a placeholder there)."""
    return [[n.name, str(getattr(n.target, "overloadpacket", n.target))] for n in bw.graph.nodes
            if n.op == "call_function" and n.name in must_save]


def _note_recomputed(rec: dict, bw, must_save: set[str]) -> set[str]:
    """Records what the backward recomputes against the policy; returns the recomputed nodes' names."""
    again = _recomputed(must_save, bw)
    rec.setdefault("recomputed_must_save", []).extend(again)
    return {name for name, _ in again}


def _value_recording(g, names: set[str], rec: dict):
    """The backward graph run node by node, keeping the value of each recomputed MUST_SAVE node (only when there
    is one: what a partitioner recomputed against the policy, as values the oracle can name)."""
    class Recording(torch.fx.Interpreter):
        def run_node(self, n):
            out = super().run_node(n)
            if n.name in names and isinstance(out, torch.Tensor):
                rec.setdefault("recomputed_values", []).append(out.detach().clone())
            return out
    return lambda *args: Recording(g).run(*args)


def recording_aot_backend(partition: str, rec: dict):
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition
    base = {"min_cut": min_cut_rematerialization_partition, "default": default_partition}[partition]

    def part(joint_gm, joint_inputs, *, num_fwd_outputs, **kw):
        must_save = _must_save(joint_gm)
        fw, bw = base(joint_gm, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kw)
        rec.setdefault("partitioner_saved", []).append(_saved_desc(fw, num_fwd_outputs))
        again = _note_recomputed(rec, bw, must_save)
        if again:   # for the backward compiler: the first pending set its graph computes (aot_autograd hands it a
            rec.setdefault("_pending", []).append(again)   # copy of the partitioner's backward graph)
        return fw, bw

    def bw_compiler(g, example_inputs):
        computed = {n.name for n in g.graph.nodes if n.op == "call_function"}
        pending = rec.get("_pending", [])
        names = next((p for p in pending if p <= computed), None)
        if names:
            pending.remove(names)
        return make_boxed_func(_value_recording(g, names, rec) if names else g)

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs,
                                     fw_compiler=lambda g, e: make_boxed_func(g),
                                     bw_compiler=bw_compiler, partition_fn=part)
    return backend


class RecordingPartitioner(CustomPartitionerFn):
    """Inductor's min-cut partitioner, recording which forward nodes it saves. Module level
    (picklable) so that inductor's FX-graph cache still works; the autograd cache, which
    would skip the partitioner, is off during runs."""

    def __init__(self, rec: dict | None = None):
        self.rec = rec if rec is not None else {}

    def __call__(self, gm, joint_inputs, **kwargs):
        from torch._functorch.partitioners import min_cut_rematerialization_partition
        must_save = _must_save(gm)
        fw, bw = min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        self.rec.setdefault("partitioner_saved", []).append(_saved_desc(fw, kwargs["num_fwd_outputs"]))
        _note_recomputed(self.rec, bw, must_save)   # (inductor compiles the backward: ops only, no values)
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
    """Set (module, attribute, value) for one run and restore them afterwards; a setting the release does not have
    (recompile_limit before torch 2.7, ...) is left out: that release runs with its own defaults."""
    settings = [(m, k, v) for m, k, v in settings if hasattr(m, k)]
    old = [(m, k, getattr(m, k)) for m, k, _ in settings]
    try:
        for m, k, v in settings:
            setattr(m, k, v)
        yield
    finally:
        for m, k, v in old:
            setattr(m, k, v)


