"""PyTorch residual capture: the tensors saved for backward during the forward and read back by
the backward, seen by `torch.autograd.graph.saved_tensors_hooks` (which also sees what a
compiled graph's CompiledFunction saves), deduplicated by memory."""
from __future__ import annotations

import os
import sys
from contextlib import contextmanager

import torch
import torch.utils.checkpoint

_SAC_FILE = os.path.join("torch", "utils", "checkpoint.py")   # SAC's cache calls pack from its `wrap`


def memory_kind(t: torch.Tensor, device: str) -> str:
    """Memory kind of a saved tensor, in JAX's words: on the run's device, or on the host."""
    if t.device.type == device:
        return "device"
    return "pinned_host" if t.is_pinned() else "unpinned_host"


def _from_sac(caller) -> bool:
    """Whether a pack hook's caller is SAC's cache (its `wrap`), not autograd's save."""
    return caller.co_name == "wrap" and caller.co_filename.endswith(_SAC_FILE)


# ---- residual capture -----------------------------------------------------------------------
class SavedRecorder:
    """saved_tensors_hooks recording every tensor saved for backward while `active` and
    which of them the backward pass reads back. Deduplicated by memory (storage, offset,
    element count, dtype): a view of a saved tensor is the same residual.

    Eager autograd has no dead-code elimination: a computation that does not reach the loss
    still saves its inputs. Residuals are therefore the tensors saved during the forward
    *and read by the backward* (what JAX's vjp closure and a compiled partition hold);
    saved-but-never-read tensors are reported separately (`unread`).

    Unpack hands back the saved tensor itself (reads are matched by memory, as saves are), and
    each framework check stays as it is without hooks:
    - selective activation checkpointing (respect_saved_tensors_hooks=True routes its cached
      tensors through the hooks) checks that a cached tensor was not mutated by comparing the
      version of what pack returned: pack returns the tensor itself there (a handle object
      skipped that check: eager SAC's RuntimeError on dropout under a saving policy went unseen);
    - autograd does not check the version of a tensor saved through hooks (a tensor mutated in
      place after it was saved gave a wrong gradient instead of autograd's error): for autograd's
      saves pack returns a detached alias, one object per save, and unpack checks the version
      the tensor had when saved, raising autograd's error."""

    def __init__(self):
        self._copy: list[torch.Tensor] = []
        self._alive: list[torch.Tensor] = []
        self._index: dict = {}
        self.read: set[int] = set()
        self.active = False
        self.packs = 0
        self._saves: dict[int, tuple] = {}   # id(alias) -> (the saved tensor, its version when saved)

    @staticmethod
    def _key(t):
        try:
            return (t.untyped_storage().data_ptr(), t.storage_offset(), t.numel(), t.dtype, t.device)
        except Exception:  # noqa: BLE001
            return ("id", id(t))

    def pack(self, t):
        return self._pack(t, _from_sac(sys._getframe(1).f_code))

    def _pack(self, t, from_sac: bool):
        if not self.active:
            return t
        if from_sac:   # SAC's cache
            alias = t
        else:   # autograd's save
            alias = t.detach()
            self._saves[id(alias)] = (t, t._version)
            self._alive.append(alias)
        self.packs += 1
        key = self._key(t)
        i = self._index.get(key)
        if i is None:
            i = self._index[key] = len(self._copy)
            self._copy.append(t.detach().clone())
            # kept alive while recording, so that its memory is not reused by a later forward
            # (per-example loops) and mistaken for this residual
            self._alive.append(t)
        return alias

    def unpack(self, t):
        saved = self._saves.get(id(t))
        if saved is not None:
            t, version = saved
            if t._version != version:
                raise RuntimeError(
                    f"one of the variables needed for gradient computation has been modified by an inplace "
                    f"operation: [{t.type()} {list(t.shape)}] is at version {t._version}; expected version "
                    f"{version} instead (checked by the harness's saved-tensor hooks, as autograd checks without them)")
        i = self._index.get(self._key(t)) if isinstance(t, torch.Tensor) else None
        if i is not None:
            self.read.add(i)
        return t

    def user_pack(self, pack):
        """A pack hook that records, then hands the user's pack what it would have got: (the alias,
        the user's packed value). Not a tensor, so SAC's cache checks no version (as with user hooks)."""
        def packed(t):
            alias = self._pack(t, _from_sac(sys._getframe(1).f_code))
            return alias, pack(alias)
        return packed

    def user_unpack(self, unpack):
        """The unpack hook of user_pack: the user's unpacked tensor, after the version check and read
        record unpack makes of the saved tensor."""
        def unpacked(packed):
            alias, p = packed
            self.unpack(alias)
            return unpack(p)
        return unpacked

    @property
    def saved(self) -> list[torch.Tensor]:
        return [c for i, c in enumerate(self._copy) if i in self.read]

    @property
    def unread(self) -> list[torch.Tensor]:
        return [c for i, c in enumerate(self._copy) if i not in self.read]

    @contextmanager
    def recording(self, user=None):
        """Records while inside; `user`, a (pack, unpack) pair of the user's saved-tensor hooks the
        forward runs under: each saved tensor recorded, then packed by them."""
        self.active = True
        hooks = (self.pack, self.unpack) if user is None else (self.user_pack(user[0]), self.user_unpack(user[1]))
        try:
            with torch.autograd.graph.saved_tensors_hooks(*hooks):
                yield
        finally:
            self.active = False


