"""Environments per framework release (`remat-conformance env jax==0.6.2 torch==2.5.1`), built with uv and cached
under the project's cache folder, reused by `bisect`, the matrix's history cells and `recheck`.

An environment holds the named framework releases, the numpy they support, the harness's own dependencies at the
lock's pins and the harness itself (a .pth to this checkout); a framework not named is not installed (its pipelines
are skipped there; a jax-only environment finds the pinned torch in the project environment, after its own
packages). PyTorch comes with the CUDA libraries its wheel needs: a PyPI wheel is a CUDA build that does not
import without them (measured for 2.2.2, 2.5.1 and 2.14.1: "libcublas.so.*[0-9] not found"), about 4-5 GB an
environment; jaxlib is the newest up to the jax release. At most MAX_ENVS environments and MAX_GB gigabytes are kept:
the least recently used goes first. uv's own cache (under the same folder unless UV_CACHE_DIR names another) counts
in the MAX_GB: it keeps every wheel ever installed (a torch release with its CUDA libraries is about 5 GB there), so
where the environments and it together are over the bound, it is emptied (the environments keep their files: uv
links them). A failed build is one line (which release, why)."""
from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from conformance.errors import UsageError
from conformance.files import CACHE_ENV, cache_root  # noqa: F401 - (envs.CACHE_ENV, envs.cache_root)
from conformance.ir import releases

ROOT = Path(__file__).resolve().parents[2]
MAX_ENVS_ENV = "REMAT_CONFORMANCE_MAX_ENVS"
MAX_ENVS = 8             # a jax environment is about 0.6 GB, a torch one 4-5 GB
MAX_GB_ENV = "REMAT_CONFORMANCE_ENVS_GB"
MAX_GB = 30.0            # the environments and uv's cache together, each file counted once
ROOM_MB = 5000           # the room one more environment needs (a torch one, the largest)
RELEASES_TTL = 24 * 3600  # seconds a cached release list is fresh
# The harness's own runtime dependencies (requirements.lock pins them); numpy and ml_dtypes follow the frameworks.
HARNESS_DEPS = ("pydantic", "hypothesis", "packaging", "rich", "jinja2", "matplotlib")
BUILD_TIMEOUT = 1800
# Releases whose wheels were built against numpy 1 (numpy 2 came with jaxlib 0.4.26 and torch 2.3)
NUMPY1_BEFORE = {"jax": Version("0.4.26"), "torch": Version("2.3.0")}


def envs_dir() -> Path:
    return cache_root() / "envs"


def max_gb() -> float:
    v = os.environ.get(MAX_GB_ENV, "")
    try:
        return float(v) if v else MAX_GB
    except ValueError:
        raise UsageError(f"{MAX_GB_ENV}: must be a number of gigabytes, got {v!r}") from None


def max_envs() -> int:
    v = os.environ.get(MAX_ENVS_ENV, "")
    if v and not v.isdigit():
        raise UsageError(f"{MAX_ENVS_ENV}: must be a whole number of environments, got {v!r}")
    return int(v) if v else MAX_ENVS


@dataclass(frozen=True)
class Pins:
    """Framework -> release (only `jax` and `torch`)."""
    jax: str | None = None
    torch: str | None = None

    @classmethod
    def parse(cls, specs: list[str], where: str = "RELEASE") -> "Pins":
        got: dict[str, str] = {}
        for s in specs:
            try:
                r = Requirement(s)
            except InvalidRequirement:
                r = None
            spec = list(r.specifier) if r else []
            if r is None or r.name.lower() not in releases.PACKAGES or len(spec) != 1 or spec[0].operator != "==":
                raise UsageError(f"{where}: {s!r}: give a framework release as jax==VERSION or torch==VERSION")
            name = r.name.lower()
            if name in got:
                raise UsageError(f"{where}: {name} given twice")
            v = releases.parse(spec[0].version)
            if v is None:
                raise UsageError(f"{where}: {s!r}: not a release number")
            if v < Version(releases.OLDEST[name]):
                raise UsageError(f"{where}: {s!r}: the oldest {name} release with wheels for Python 3.12 is "
                                 f"{releases.OLDEST[name]}")
            got[name] = spec[0].version
        if not got:
            raise UsageError(f"{where}: name at least one release (jax==VERSION, torch==VERSION)")
        return cls(**got)

    def items(self) -> list[tuple[str, str]]:
        return [(k, v) for k, v in (("jax", self.jax), ("torch", self.torch)) if v]

    @property
    def label(self) -> str:
        return " ".join(f"{k}=={v}" for k, v in self.items())

    @property
    def key(self) -> str:
        return "-".join(f"{k}-{v}" for k, v in self.items())


@dataclass(frozen=True)
class Env:
    pins: Pins
    path: Path

    @property
    def python(self) -> str:
        return str(self.path / "bin" / "python")


def _uv() -> str:
    for c in (Path(sys.executable).with_name("uv"), shutil.which("uv")):
        if c and Path(c).exists():
            return str(c)
    raise UsageError("uv not found: it is in requirements.lock (`make venv` installs it)")


def lock_pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line.strip())
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def requirements(pins: Pins) -> list[str]:
    """What an environment installs (torch's own dependencies come after it, without the CUDA ones)."""
    lock = lock_pins()
    reqs = [f"{d}=={lock[d]}" if d in lock else d for d in HARNESS_DEPS]
    numpy1 = any(releases.parse(v) < NUMPY1_BEFORE[k] for k, v in pins.items())
    reqs.append("numpy<2" if numpy1 else "numpy>=2")
    reqs.append("ml_dtypes")
    if pins.torch:
        reqs.append(f"torch=={pins.torch}")
    if pins.jax:   # the newest jaxlib up to it (some jax releases have none of their own: 0.4.37, 0.5.2)
        reqs += [f"jax=={pins.jax}", f"jaxlib<={pins.jax}"]
    elif pins.torch:   # the references are JAX pipelines: the pinned jax, or the newest the numpy allows
        lock = lock_pins()
        reqs += [f"jax<={lock['jax']}", f"jaxlib<={lock['jaxlib']}"]
    return reqs


def _touch(path: Path) -> None:
    (path / ".used").write_text(str(time.time()))


def uv_cache_dir() -> Path:
    """uv's cache for the builds: the project's own (bounded here), or the one UV_CACHE_DIR names (left alone)."""
    return Path(os.environ.get("UV_CACHE_DIR") or cache_root() / "uv")


def _run(cmd: list[str], pins: Pins, what: str, log) -> None:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT,
                           env={**os.environ, "UV_CACHE_DIR": str(uv_cache_dir())})
    except subprocess.TimeoutExpired:
        raise UsageError(f"env {pins.label}: {what} took over {BUILD_TIMEOUT} s") from None
    if r.returncode:
        lines = [x.strip() for x in (r.stderr or r.stdout).splitlines() if x.strip()]
        why = next((x for pat in (r"(?i)because|unsatisfiable|not found", r"(?i)error")
                    for x in lines if re.search(pat, x)), lines[-1] if lines else f"exit {r.returncode}")
        raise UsageError(f"env {pins.label}: {what} failed: {why[:400]}")


@contextlib.contextmanager
def _locked():
    """One builder or evicter at a time across processes (a campaign in one environment while a bisect builds)."""
    envs_dir().mkdir(parents=True, exist_ok=True)
    with open(envs_dir() / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def mark_running() -> None:
    """Called as the harness starts: where it runs from a cached environment, that environment is used now and in
    use while this process lives (eviction spares it)."""
    try:
        here = Path(sys.prefix).resolve()
        if here.parent == envs_dir().resolve() and (here / ".stamp").exists():
            _touch(here)
            (here / f".running-{os.getpid()}").touch()
    except OSError:
        pass


def _in_use(d: Path) -> bool:
    """Whether a live harness process runs from this environment (stale marks are removed)."""
    live = False
    for m in d.glob(".running-*"):
        try:
            os.kill(int(m.name.split("-", 1)[1]), 0)
            live = True
        except (ValueError, ProcessLookupError):
            m.unlink(missing_ok=True)
        except PermissionError:
            live = True
    return live


def ensure(pins: Pins, log=print) -> Env:
    """The environment of these releases, built once (a partial build is removed) and marked used."""
    with _locked():
        return _ensure(pins, log)


def _ensure(pins: Pins, log) -> Env:
    d = envs_dir() / pins.key
    beside = _beside(pins)
    stamp = hashlib.sha256(json.dumps([sys.version_info[:2], requirements(pins), beside]).encode()).hexdigest()[:16]
    env = Env(pins, d)
    if (d / ".stamp").exists() and (d / ".stamp").read_text() == stamp and Path(env.python).exists():
        _touch(d)
        return env
    _evict(keep=1, log=log)
    log(f"== env {pins.label}: building {d}")
    t0 = time.monotonic()
    shutil.rmtree(d, ignore_errors=True)
    d.parent.mkdir(parents=True, exist_ok=True)
    uv = _uv()
    base = getattr(sys, "_base_executable", sys.executable)
    try:
        _run([uv, "venv", "-q", "--python", base, str(d)], pins, "creating the virtual environment", log)
        _run([uv, "pip", "install", "-q", "--python", env.python, *requirements(pins)], pins,
             "installing " + " ".join(f"{k}=={v}" for k, v in pins.items()), log)
        site = subprocess.run([env.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        Path(site, "_remat_conformance.pth").write_text(str(ROOT) + "\n" + (beside + "\n" if beside else ""))
        check = subprocess.run([env.python, "-c", "import conformance.cli.main"], capture_output=True, text=True)
        if check.returncode:
            last = (check.stderr.strip().splitlines() or ["?"])[-1]
            raise UsageError(f"env {pins.label}: the harness does not import there: {last[:300]}")
    except BaseException:
        shutil.rmtree(d, ignore_errors=True)
        raise
    mb = size_mb(d)
    (d / "pins.json").write_text(json.dumps(dict(pins.items())))
    (d / ".size_mb").write_text(f"{mb:.0f}")
    (d / ".stamp").write_text(stamp)
    _touch(d)
    _bound_uv_cache(0, log)
    log(f"== env {pins.label}: built in {time.monotonic() - t0:.0f} s ({mb:.0f} MB)")
    return env


def _beside(pins: Pins) -> str:
    """Where a jax-only environment finds the pinned torch: the project environment's site-packages, after its own
    (its jax, jaxlib and numpy come first), when it runs the same Python; else nothing (torch pipelines skipped)."""
    return "" if pins.torch else _project_site_with_torch()


@functools.lru_cache(maxsize=None)
def _project_site_with_torch() -> str:
    """The project environment's site-packages where it holds torch and runs this Python (asked once)."""
    proj = ROOT / ".venv" / "bin" / "python"
    if not proj.exists():
        return ""
    r = subprocess.run([str(proj), "-c", "import sys, sysconfig; print(sysconfig.get_paths()['purelib'] "
                        "if sys.version_info[:2] == (%d, %d) else '')" % sys.version_info[:2]],
                       capture_output=True, text=True)
    site = r.stdout.strip() if r.returncode == 0 else ""
    return site if site and Path(site, "torch").is_dir() else ""


def size_mb(*dirs: Path) -> float:
    """The disk these folders take, a file linked from several places (uv links the cache's files) counted once."""
    seen, total = set(), 0
    for d in dirs:
        for p in d.rglob("*") if d.is_dir() else ():
            try:
                st = p.lstat()
            except OSError:
                continue
            if p.is_file() and not p.is_symlink() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total / 2 ** 20


def listing() -> list[dict]:
    """The cached environments, most recently used first."""
    out = []
    for d in envs_dir().glob("*") if envs_dir().is_dir() else []:
        if (d / "pins.json").exists():
            used = float((d / ".used").read_text()) if (d / ".used").exists() else 0.0
            out.append({"path": str(d), "pins": json.loads((d / "pins.json").read_text()), "used": used})
    return sorted(out, key=lambda e: -e["used"])


def evict(keep: int = 0, log=print) -> list[str]:
    """Remove the least recently used environments (and broken partial ones) so that `keep` more fit; one a live
    harness process runs from (a campaign there) stays, over the bounds if it must."""
    with _locked():
        return _evict(keep, log)


def _evict(keep: int, log) -> list[str]:
    removed = []
    if not envs_dir().is_dir():
        return removed
    for d in envs_dir().iterdir():
        if d.is_dir() and not (d / ".stamp").exists():
            shutil.rmtree(d, ignore_errors=True)
    envs = listing()
    sizes = {e["path"]: (float(p.read_text()) if (p := Path(e["path"]) / ".size_mb").exists() else 0.0) for e in envs}
    keep_n = max(0, max_envs() - keep)
    # the most recently used first: keep while within both bounds (room for `keep` more: a torch one's size each)
    total, kept = 0.0, 0
    for e in envs:
        total += sizes[e["path"]]
        if (kept < keep_n and total + keep * ROOM_MB <= max_gb() * 1024) or _in_use(Path(e["path"])):
            kept += 1
            continue
        shutil.rmtree(e["path"], ignore_errors=True)
        removed.append(e["path"])
        log(f"== env: removed the least recently used {e['path']}")
    _bound_uv_cache(keep, log)
    return removed


def _bound_uv_cache(keep: int, log) -> None:
    """Empty the project's uv cache where it and the environments are over the bound (room for `keep` more)."""
    cache = uv_cache_dir()
    if os.environ.get("UV_CACHE_DIR") or not cache.is_dir():
        return
    if size_mb(envs_dir(), cache) + keep * ROOM_MB > max_gb() * 1024:
        shutil.rmtree(cache, ignore_errors=True)
        log(f"== env: emptied uv's cache {cache} (the environments and it were over {max_gb():g} GB)")


# -- the releases of a framework ------------------------------------------------------------------------------
def release_list(framework: str, refresh: bool = False) -> list[str]:
    """Every final release of a framework from the oldest the harness supports, oldest first (the package
    registry's list, cached a day; the stale list where the registry cannot be reached)."""
    f = cache_root() / f"releases-{framework}.json"
    cached = json.loads(f.read_text()) if f.exists() else None
    oldest = Version(releases.OLDEST[framework])
    if cached and not refresh and time.time() - cached["at"] < RELEASES_TTL:
        return [r for r in cached["releases"] if Version(r) >= oldest]
    try:
        r = subprocess.run([sys.executable, "-m", "pip", "index", "versions", releases.PACKAGES[framework]],
                           capture_output=True, text=True, timeout=120)
        m = re.search(r"Available versions:\s*(.+)", r.stdout)
        if not m:
            raise OSError((r.stderr.strip().splitlines() or ["no versions listed"])[-1])
        got = [v.strip() for v in m.group(1).split(",")]
    except (OSError, subprocess.TimeoutExpired) as e:
        if cached:
            return [r for r in cached["releases"] if Version(r) >= oldest]
        raise UsageError(f"the {framework} releases: the package registry did not answer ({e})") from None
    vs = sorted({Version(v) for v in got if re.fullmatch(r"\d+(\.\d+)+", v)})
    out = [str(v) for v in vs if v >= oldest]
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps({"at": time.time(), "releases": out}))
    return out
