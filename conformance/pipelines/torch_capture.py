"""PyTorch residual capture: the tensors saved for backward during the forward and read back by
the backward, seen by `torch.autograd.graph.saved_tensors_hooks` (which also sees what a
compiled graph's CompiledFunction saves), deduplicated by memory."""
from __future__ import annotations

from contextlib import contextmanager

import torch


def memory_kind(t: torch.Tensor, device: str) -> str:
    """Memory kind of a saved tensor, in JAX's words: on the run's device, or on the host."""
    if t.device.type == device:
        return "device"
    return "pinned_host" if t.is_pinned() else "unpinned_host"


# ---- residual capture -----------------------------------------------------------------------
class SavedRecorder:
    """saved_tensors_hooks recording every tensor saved for backward while `active` and
    which of them the backward pass reads back. Deduplicated by memory (storage, offset,
    element count, dtype): a view of a saved tensor is the same residual.

    Eager autograd has no dead-code elimination: a computation that does not reach the loss
    still saves its inputs. Residuals are therefore the tensors saved during the forward
    *and read by the backward* (what JAX's vjp closure and a compiled partition hold);
    saved-but-never-read tensors are reported separately (`unread`).

    The hooks hand back the tensor itself (reads are matched by memory, as saves are): a pack
    hook that returns another object changes what selective activation checkpointing does
    (respect_saved_tensors_hooks=True routes its cached tensors through the hooks; with a
    non-tensor handle it skipped its check that a cached tensor was not mutated in place, so
    eager SAC's RuntimeError on dropout under a saving policy went unseen)."""

    def __init__(self):
        self._copy: list[torch.Tensor] = []
        self._alive: list[torch.Tensor] = []
        self._index: dict = {}
        self.read: set[int] = set()
        self.active = False
        self.packs = 0

    @staticmethod
    def _key(t):
        try:
            return (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel(), t.dtype, t.device)
        except Exception:
            return ("id", id(t))

    def pack(self, t):
        if not self.active:
            return t
        self.packs += 1
        key = self._key(t)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self._copy)
            self._copy.append(t.detach().clone())
            # kept alive while recording, so that its memory is not reused by a later forward
            # (per-example loops) and mistaken for this residual
            self._alive.append(t)
        return t

    def unpack(self, t):
        i = self._index.get(self._key(t)) if isinstance(t, torch.Tensor) else None
        if i is not None:
            self.read.add(i)
        return t

    @property
    def saved(self) -> list[torch.Tensor]:
        return [c for i, c in enumerate(self._copy) if i in self.read]

    @property
    def unread(self) -> list[torch.Tensor]:
        return [c for i, c in enumerate(self._copy) if i not in self.read]

    @contextmanager
    def recording(self):
        self.active = True
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield
        finally:
            self.active = False


