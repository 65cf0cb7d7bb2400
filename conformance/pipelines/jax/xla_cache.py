"""The XLA compile cache of a campaign: where it is, and how big it may grow.

JAX's persistent compilation cache keys an executable by XLA's own cache key (the HLO, compile
options, backend and flags), so it is the same executable whoever compiled it: using it changes
no result, only how often XLA compiles. `remat-conformance run` gives each campaign a fresh
directory (`campaign_cache`), shared by its worker processes and removed when it ends;
REMAT_CONFORMANCE_COMPILE_CACHE names another one (shared by every campaign that names it) or
turns it "off". JAX's own size bound is not used (its eviction scans the directory on every
write); `trim` empties the directory when it outgrows REMAT_CONFORMANCE_COMPILE_CACHE_MB. A
killed campaign leaves its directory behind; the next campaign removes it.

Imports nothing of the project and no framework.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager

ENV = "REMAT_CONFORMANCE_COMPILE_CACHE"
LIMIT_ENV = "REMAT_CONFORMANCE_COMPILE_CACHE_MB"
DEFAULT_LIMIT_MB = 2048
TRIM_EVERY = 200   # pipeline runs between two looks at the directory's size


def cache_dir() -> str | None:
    """The directory the environment names; None when unset or "off"."""
    v = os.environ.get(ENV, "")
    return None if v.lower() in ("", "off", "0", "none") else v


@contextmanager
def campaign_cache():
    """A fresh cache directory for one campaign (set in the environment, so that its worker
    processes share it), removed afterwards; the environment's choice when it makes one."""
    if ENV in os.environ:
        yield cache_dir()
        return
    remove_orphans()
    d = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
    os.environ[ENV] = d
    try:
        yield d
    finally:
        os.environ.pop(ENV, None)
        shutil.rmtree(d, ignore_errors=True)


PREFIX = "remat-conformance-xla-"   # + the campaign's pid + "-"


def remove_orphans(tmp: str | None = None) -> list[str]:
    """Remove the cache directories of campaigns that were killed (their pid is gone)."""
    tmp = tmp or tempfile.gettempdir()
    gone = []
    for name in os.listdir(tmp):
        pid = name[len(PREFIX):].split("-", 1)[0]
        if not (name.startswith(PREFIX) and pid.isdigit()) or _alive(int(pid)):
            continue
        shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
        gone.append(name)
    return gone


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # another user's live process
        return True
    return True


_runs = 0


def ran(d: str | None) -> None:
    """Count one pipeline run of this process; every TRIM_EVERY runs, `trim` the cache."""
    global _runs
    _runs += 1
    if d and _runs % TRIM_EVERY == 0:
        trim(d)


def size_bytes(d: str) -> int:
    total = 0
    with os.scandir(d) as it:
        for e in it:
            try:
                total += e.stat(follow_symlinks=False).st_size
            except OSError:   # removed by another worker meanwhile
                pass
    return total


def trim(d: str, limit_mb: float | None = None) -> bool:
    """Empty the directory when it holds more than the limit; True if it did. Another process
    reading an entry meanwhile finds it missing (or cut short) and compiles: JAX treats a bad
    entry as a miss."""
    limit = float(os.environ.get(LIMIT_ENV, DEFAULT_LIMIT_MB)) if limit_mb is None else limit_mb
    if size_bytes(d) <= limit * 2 ** 20:
        return False
    with os.scandir(d) as it:
        for e in it:
            try:
                os.unlink(e.path)
            except OSError:
                pass
    return True
