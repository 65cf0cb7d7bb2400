"""Per-example programs (diff.batch B > 0): the shape of a batched input's value, one
example's inputs, example b's value ids (`v@b`, the batch outermost) and the recording of every
example's values. With B = 0 each helper is the plain program's.

Program layer: imports the IR only.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from conformance.ir.nodes import ITER_SEP, Input, base_id, defined_ids, scan_lengths

if TYPE_CHECKING:   # (the Program model reads this module)
    from conformance.ir.program import Program


def value_shape(prog: "Program", i: Input) -> tuple[int, ...]:
    """The shape of an input's value: one example's shape, or (batch, *shape) when batched."""
    return (prog.diff.batch, *i.shape) if i.batched and prog.diff.batch else tuple(i.shape)


def example_inputs(prog: "Program", inputs: dict, b: int) -> dict:
    """Example b's inputs of a per-example program: each batched input's slice b."""
    batched = {i.id for i in prog.inputs if i.batched}
    return {k: (v[b] if k in batched else v) for k, v in inputs.items()}


def batch_id(i: str, b: int) -> str:
    """Example b's value of `i` (`v` -> `v@b`, `v@k` -> `v@b@k`): the batch is the outermost loop."""
    base = base_id(i)
    return f"{base}{ITER_SEP}{b}{i[len(base):]}"


def record_examples(prog: "Program", inputs: dict, record) -> dict:
    """record(inputs) -> {value id: value} for one example; a per-example program's values of
    each example, keyed by batch_id."""
    if not prog.diff.batch:
        return record(inputs)
    out = {}
    for b in range(prog.diff.batch):
        out.update({batch_id(k, b): v for k, v in record(example_inputs(prog, inputs, b)).items()})
    return out


def value_lengths(prog: "Program") -> dict[str, list[int]]:
    """Id of every value that has one value per iteration -> the lengths of the loops around
    it, outermost first: the batch of a per-example program (around every value), then scans."""
    scans = scan_lengths(prog.body)
    if not prog.diff.batch:
        return scans
    ids = {i.id for i in prog.inputs} | defined_ids(prog.body) | set(scans)
    return {i: [prog.diff.batch] + scans.get(i, []) for i in ids}
