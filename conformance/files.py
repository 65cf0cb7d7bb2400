"""Reading input files without trusting them: regular files only (no FIFOs, devices or
directories, symlink loops named as such), and a size limit enforced while reading, never
taken from st_size."""
from __future__ import annotations

import os
import stat
from pathlib import Path

MiB = 1024 * 1024
LIMIT = 64 * MiB   # the default bound for any one input file
CACHE_ENV = "REMAT_CONFORMANCE_CACHE"


def cache_root() -> Path:
    """The project's cache folder (release environments, compile caches): REMAT_CONFORMANCE_CACHE, else
    ~/.cache/remat-conformance."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "remat-conformance")


class InputRefused(ValueError):
    """An input file that cannot be read as one: the message names the path and the reason."""


def read_bounded(path: str | Path, limit: int = LIMIT) -> bytes:
    p = str(path)
    try:
        st = os.stat(p)
    except OSError as e:
        raise InputRefused(f"{p}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise InputRefused(f"{p}: is a directory, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise InputRefused(f"{p}: not a regular file (a FIFO, socket or device is refused)")
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise InputRefused(f"{p}: {e.strerror or e}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):   # replaced between stat and open
            raise InputRefused(f"{p}: not a regular file")
        chunks, n = [], 0
        while True:
            b = os.read(fd, min(MiB, limit + 1 - n))
            if not b:
                break
            chunks.append(b)
            n += len(b)
            if n > limit:
                raise InputRefused(f"{p}: larger than the limit of {limit} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str | Path, limit: int = LIMIT) -> str:
    data = read_bounded(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise InputRefused(f"{path}: not UTF-8 text") from None
