"""The XLA compile cache of campaigns: where it is, and how big it may grow.

JAX's persistent compilation cache keys an executable by XLA's own cache key (the HLO, compile
options, backend, XLA's flags and jaxlib's version), so it is the same executable whoever compiled
it, and whenever: using it changes no result, only how often XLA compiles. `remat-conformance run`
keeps one directory per machine, `xla/` under the project's cache folder (conformance.files.
cache_root), shared by every campaign and its worker processes and kept between them: a campaign
finds compiled what earlier ones compiled, above all a campaign run again (`make run`'s seed is
fixed; the test suite's campaigns are seeded), far less one of another seed (eager JAX compiles one
executable per primitive, shape, dtype and parameters, mostly combinations of one program's own).
REMAT_CONFORMANCE_COMPILE_CACHE names another directory, `fresh` (a temporary directory of the
campaign's own, removed when it ends: a cold campaign, as `make bench` measures one) or `off`.
JAX's own size bound is not used (its eviction scans the directory on every write); `trim` removes
the least recently used entries when the directory outgrows REMAT_CONFORMANCE_COMPILE_CACHE_MB. A
killed campaign's fresh directory is removed by the next campaign.

Imports no framework.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

from conformance.files import cache_root

ENV = "REMAT_CONFORMANCE_COMPILE_CACHE"
LIMIT_ENV = "REMAT_CONFORMANCE_COMPILE_CACHE_MB"
DEFAULT_LIMIT_MB = 2048
KEEP = 0.75        # a trim keeps the most recently used entries up to this fraction of the limit
TRIM_EVERY = 200   # pipeline runs between two looks at the directory's size
FRESH = "fresh"


def cache_dir() -> str | None:
    """The directory this process's JAX pipelines use: the one the environment names, else the machine's
    (`machine_dir`); None when the environment says "off" (or "fresh" outside a campaign)."""
    v = os.environ.get(ENV)
    if v is None:
        return str(machine_dir())
    return None if v.lower() in ("", "off", "0", "none", FRESH) else v


def machine_dir() -> Path:
    """The directory every campaign and process shares when the environment names none."""
    return cache_root() / "xla"


@contextmanager
def campaign_cache():
    """The campaign's cache directory (created), set in the environment so that its worker processes
    share it: the machine's, the one the environment names, a fresh one removed afterwards, or None (off)."""
    chosen = os.environ.get(ENV)
    if chosen is not None and chosen.lower() == FRESH:
        with fresh_cache() as d:
            yield d
        return
    d = cache_dir()
    if d:
        os.makedirs(d, exist_ok=True)
    with _set(d or "off"):
        yield d


@contextmanager
def fresh_cache():
    """A fresh cache directory of the campaign's own (set in the environment), removed afterwards: a cold
    campaign. A killed campaign's is removed by the next (`remove_orphans`)."""
    remove_orphans()
    fresh = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
    try:
        with _set(fresh):
            yield fresh
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


@contextmanager
def _set(value: str):
    """The environment naming `value` meanwhile, then as it was."""
    chosen = os.environ.get(ENV)
    os.environ[ENV] = value
    try:
        yield
    finally:
        if chosen is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = chosen


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


def trim(d: str, limit_mb: float | None = None) -> bool:
    """When the directory holds more than the limit, remove its least recently used entries (last read or
    written: atime or mtime, whichever is later) until it holds at most KEEP of the limit; True if it did.
    Another process reading an entry meanwhile finds it missing (or cut short) and compiles: JAX treats a
    bad entry as a miss."""
    limit = float(os.environ.get(LIMIT_ENV, DEFAULT_LIMIT_MB)) if limit_mb is None else limit_mb
    entries = []
    with os.scandir(d) as it:
        for e in it:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:   # removed by another process meanwhile
                continue
            entries.append((max(st.st_atime, st.st_mtime), st.st_size, e.path))
    total = sum(size for _, size, _ in entries)
    if total <= limit * 2 ** 20:
        return False
    keep = KEEP * limit * 2 ** 20
    for _, size, path in sorted(entries):
        if total <= keep:
            break
        try:
            os.unlink(path)
        except OSError:
            pass
        total -= size
    return True
