"""What the generator holds while it reads the item stream: values in scope (`Val`) and the
open regions, blocks, scans and conds (`Frame`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Val:
    id: str
    shape: tuple
    dtype: str
    mag: float


class Frame:
    """An open (then closed) region or block while the item stream is read."""
    __slots__ = ("kind", "parent", "depth", "items", "policy_choice", "prevent_cse", "nondiff",
                 "symbolic_zeros", "optimize_remat", "nonstandard", "extra_result", "in_cvjp", "spelling",
                 "residual_tree", "perturbed_branch", "in_scan", "in_cond", "scan", "static_flag", "tree", "fn_opts",
                 "static_by", "static_value", "cse_mask", "state", "extras")

    def __init__(self, kind, parent, depth):
        self.kind, self.parent, self.depth = kind, parent, depth
        self.items: list = []          # Op | Frame
        # inside a custom rule (a custom_vjp fwd or a custom_jvp body): ops with derivatives only
        self.in_cvjp = kind in ("custom_vjp", "custom_jvp") or (parent is not None and parent.in_cvjp)
        self.nondiff: list[float] = [] if parent is None else list(parent.nondiff)
        self.in_scan = kind == "scan" or (parent is not None and parent.in_scan)
        self.in_cond = kind == "cond" or (parent is not None and parent.in_cond)   # (conds do not nest)
        self.scan: dict | None = None   # a scan's carry, xs, length, unroll; at its close its outputs


def chain(f: Frame | None) -> set:
    """A frame and the frames around it."""
    out = set()
    while f is not None:
        out.add(f)
        f = f.parent
    return out
