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
class _Handle:
    """What a pack hook stores: the saved tensor itself (a view keeps its own layout) and
    the index of its memory-deduplicated record."""
    __slots__ = ("i", "t")

    def __init__(self, i: int, t: torch.Tensor):
        self.i, self.t = i, t


class SavedRecorder:
    """saved_tensors_hooks recording every tensor saved for backward while `active` and
    which of them the backward pass reads back. Deduplicated by memory (storage, offset,
    element count, dtype): a view of a saved tensor is the same residual.

    Eager autograd has no dead-code elimination: a computation that does not reach the loss
    still saves its inputs. Residuals are therefore the tensors saved during the forward
    *and read by the backward* (what JAX's vjp closure and a compiled partition hold);
    saved-but-never-read tensors are reported separately (`unread`)."""

    def __init__(self):
        self._copy: list[torch.Tensor] = []
        self._alive: list[torch.Tensor] = []
        self._index: dict = {}
        self.read: set[int] = set()
        self.active = False
        self.packs = 0

    def pack(self, t):
        if not self.active:
            return t
        self.packs += 1
        try:
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel(), t.dtype, t.device)
        except Exception:
            key = ("id", id(t))
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self._copy)
            self._copy.append(t.detach().clone())
            # kept alive while recording, so that its memory is not reused by a later forward
            # (per-example loops) and mistaken for this residual
            self._alive.append(t)
        return _Handle(i, t)

    def unpack(self, h):
        if isinstance(h, _Handle):
            self.read.add(h.i)
            return h.t
        return h

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


