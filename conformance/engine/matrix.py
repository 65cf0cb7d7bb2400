"""The nightly matrix as data (matrix.toml): cells of framework versions, device and pipelines,
each run in shards. `matrix plan` prints the cells (and GitHub Actions' `include` JSON),
`matrix run CELL --shard I/N` builds the cell's environment once (a cached virtual environment
under .cells/) and runs one shard into a run directory, `matrix nightly` runs every cell and shard
on this machine, rechecks every finding on every cell and writes one merged report."""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.version import Version

from conformance.engine import environments
from conformance.errors import UsageError
from conformance.ir import releases
from conformance.pipelines import registry

ROOT = Path(__file__).resolve().parents[2]
MATRIX_FILE = ROOT / "matrix.toml"
CELLS_DIR = ROOT / ".cells"
CORPUS = ROOT / "tests" / "regressions"   # the regression corpus: known behaviours, rechecked on every cell
FIELDS = {"name": str, "python": str, "base": str, "packages": list, "pipelines": list, "device": str,
          "profile": str, "budget": (int, float), "shards": int, "seed": int, "runner": str, "mode": str,
          "framework_defaults": bool, "history": int}
# Fields a cell may leave out, and their value then.
OPTIONAL = {"framework_defaults": False, "history": 0}
MODES = ("campaign", "devices")   # devices: the CPU-vs-device oracle (`remat-conformance devices`)
BASES = ("project", "lock")
PROFILES = ("dev", "ci", "nightly")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.\-]*)==([A-Za-z0-9_.+\-]+)$")
PYTHON = re.compile(r"^(>=)?3\.(\d+)$")


@dataclass
class Cell:
    name: str
    python: str
    base: str
    packages: list[str]
    pipelines: list[str]
    device: str
    profile: str
    budget: float
    shards: int
    seed: int
    runner: str
    mode: str
    framework_defaults: bool = False   # JAX as configured (the run's --framework-defaults)
    history: int = 0                   # expands into one cell per framework and past release (its `release`)
    overrides: dict[str, str] = field(default_factory=dict)   # package name -> version, from `packages`
    release: tuple[str, int] | None = None   # (framework, k): the k-th release before the pinned one, in its own
                                             # environment (conformance.engine.environments)


def _check(where: str, key: str, value, kind) -> None:
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise UsageError(f"{where}.{key}: must be a {names}, got {value!r}")


def load_matrix(path: Path = MATRIX_FILE) -> list[Cell]:
    """The cells of a matrix file; every problem a UsageError naming the file and the field."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"{path}: {e.strerror}") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: invalid TOML: {e}") from None
    unknown = set(data) - {"defaults", "cell"}
    if unknown:
        raise UsageError(f"{path}: unknown table(s) {sorted(unknown)}; known: defaults, cell")
    defaults = data.get("defaults", {})
    cells, names = [], set()
    for k, raw in enumerate(data.get("cell", [])):
        where = f"{path.name}: cell[{k}]"
        merged = {**defaults, **raw}
        for key in merged:
            if key not in FIELDS:
                raise UsageError(f"{where}.{key}: unknown field; known: {', '.join(FIELDS)}")
        merged = {**OPTIONAL, **merged}
        for key, kind in FIELDS.items():
            if key not in merged:
                raise UsageError(f"{where}.{key}: missing (set it in the cell or in [defaults])")
            _check(where, key, merged[key], kind)
        name = merged["name"]
        where = f"{path.name}: cell {name!r}"
        if not NAME.match(name) or name in names:
            raise UsageError(f"{where}.name: must match {NAME.pattern} and be unique")
        names.add(name)
        if not PYTHON.match(merged["python"]):
            raise UsageError(f"{where}.python: must be 3.N or >=3.N, got {merged['python']!r}")
        if merged["base"] not in BASES:
            raise UsageError(f"{where}.base: must be one of {', '.join(BASES)}, got {merged['base']!r}")
        overrides = {}
        for i, req in enumerate(merged["packages"]):
            m = REQUIREMENT.match(req) if isinstance(req, str) else None
            if not m:
                raise UsageError(f"{where}.packages[{i}]: must be NAME==VERSION, got {req!r}")
            overrides[m.group(1).lower()] = m.group(2)
        for i, p in enumerate(merged["pipelines"]):
            if p not in registry.known_names():
                raise UsageError(f"{where}.pipelines[{i}]: unknown pipeline {p!r}; see `remat-conformance pipelines`")
        if merged["device"] not in ("cpu", "cuda"):
            raise UsageError(f"{where}.device: must be cpu or cuda, got {merged['device']!r}")
        if merged["mode"] not in MODES or (merged["mode"] == "devices" and merged["device"] == "cpu"):
            raise UsageError(f"{where}.mode: one of {', '.join(MODES)} (devices compares a cuda cell with the cpu)")
        if merged["profile"] not in PROFILES:
            raise UsageError(f"{where}.profile: must be one of {', '.join(PROFILES)}")
        if not (merged["budget"] > 0 and 1 <= merged["shards"] <= 64 and 0 <= merged["seed"] < 2 ** 32):
            raise UsageError(f"{where}: budget must be > 0, shards in 1..64, seed in [0, 2**32)")
        if not 0 <= merged["history"] <= 8 or (merged["history"] and (merged["packages"] or merged["mode"] != "campaign"
                                                                      or merged["device"] != "cpu")):
            raise UsageError(f"{where}.history: 0 to 8 past releases per framework, in a cpu campaign cell without "
                             f"packages")
        if merged["base"] == "project" and not _same_python(merged["python"]):
            raise UsageError(f"{where}.base: 'project' overlays the project's environment (Python "
                             f"{sys.version_info.major}.{sys.version_info.minor}); python {merged['python']!r} "
                             f"needs base = 'lock'")
        cell = Cell(**{k: merged[k] for k in FIELDS}, overrides=overrides)
        cells += [cell] if not cell.history else [
            replace(cell, name=f"{name}-{fw}-{k}", history=0, release=(fw, k))
            for fw in releases.FRAMEWORKS for k in range(1, cell.history + 1)]
    if not cells:
        raise UsageError(f"{path}: no [[cell]] tables")
    return cells


def _same_python(spec: str) -> bool:
    m = PYTHON.match(spec)
    minor = int(m.group(2))
    return sys.version_info.minor >= minor if m.group(1) else sys.version_info.minor == minor


def cell_named(cells: list[Cell], name: str) -> Cell:
    for c in cells:
        if c.name == name:
            return c
    raise UsageError(f"CELL: unknown cell {name!r}; the matrix has {', '.join(c.name for c in cells)}")


def plan(cells: list[Cell]) -> list[dict]:
    """One entry per (cell, shard): the GitHub Actions matrix `include` list."""
    return [{"cell": c.name, "shard": i, "shards": c.shards, "device": c.device, "runner": c.runner}
            for c in cells for i in range(c.shards)]


# -- environments -------------------------------------------------------------------------------
def find_python(spec: str) -> str:
    """An interpreter that runs and matches `spec` (3.N exactly, or >=3.N): PATH, then pyenv."""
    m = PYTHON.match(spec)
    minor, at_least = int(m.group(2)), bool(m.group(1))
    cands = [shutil.which(f"python3.{minor}")] + ([shutil.which(f"python3.{n}") for n in range(minor + 1, 16)]
                                                 if at_least else [])
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if root.is_dir():
        cands += [str(p / "bin" / "python3") for p in sorted(root.iterdir()) if p.name.startswith("3.")]
    for c in filter(None, cands):
        try:
            v = subprocess.run([c, "-c", "import sys; print(sys.version_info.minor)"], capture_output=True,
                               text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if v.returncode == 0 and v.stdout.strip().isdigit():
            got = int(v.stdout.strip())
            if got == minor or (at_least and got > minor):
                return c
    raise UsageError(f"python {spec!r}: no such interpreter found on PATH or in pyenv ({root})")


def lock_requirements(overrides: dict[str, str]) -> list[str]:
    """requirements.lock with the cell's pins replacing those of the same names."""
    return ([f"{k}=={v}" for k, v in environments.lock_pins().items() if k not in overrides]
            + [f"{k}=={v}" for k, v in sorted(overrides.items())])


def project_python() -> str:
    return str(ROOT / ".venv" / "bin" / "python") if (ROOT / ".venv" / "bin" / "python").exists() else sys.executable


def past_release(framework: str, k: int) -> str:
    """The k-th release of a framework before the pinned one (requirements.lock)."""
    pinned = Version(environments.lock_pins()[framework])
    older = [r for r in environments.release_list(framework) if Version(r) < pinned]
    if len(older) < k:
        raise UsageError(f"{framework}: no {k}-th release before the pinned {pinned}")
    return older[-k]


def env_python(cell: Cell, log=print) -> str:
    """The interpreter of the cell's environment, built once (rebuilt when its definition changes)."""
    if cell.release:   # a history cell: the release's own environment
        fw, k = cell.release
        return environments.ensure(environments.Pins(**{fw: past_release(fw, k)}), log=log).python
    if cell.base == "project" and not cell.overrides:
        return project_python()
    d = CELLS_DIR / cell.name
    reqs = (
        lock_requirements(cell.overrides)
        if cell.base == "lock"
        else [f"{k}=={v}" for k, v in sorted(cell.overrides.items())]
    )
    stamp = hashlib.sha256(json.dumps([cell.python, cell.base, reqs]).encode()).hexdigest()[:16]
    py = d / "bin" / "python"
    if (d / ".stamp").exists() and (d / ".stamp").read_text() == stamp and py.exists():
        return str(py)
    interp = project_python() if cell.base == "project" else find_python(cell.python)
    what = ' '.join(reqs) if cell.base == 'project' else 'requirements.lock + ' + ' '.join(cell.packages)
    log(f"== cell {cell.name}: building {d} ({cell.base}: {what})")
    shutil.rmtree(d, ignore_errors=True)
    _sh([interp, "-m", "venv", str(d)], cell)
    if cell.base == "project":   # the overlay: the cell's packages first, the project's environment after them
        base_site = subprocess.run([interp, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip()
        site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        Path(site, "_remat_conformance_base.pth").write_text(base_site + "\n")
    _sh([str(py), "-m", "pip", "install", "-q", *reqs], cell)
    (d / ".stamp").write_text(stamp)
    return str(py)


def _sh(cmd: list[str], cell: Cell) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        raise UsageError(f"cell {cell.name!r}: environment build failed ({' '.join(cmd[:4])} ...):\n{r.stderr[-2000:]}")


def cuda_available(py: str) -> bool:
    code = (
        "import importlib.util as u, sys\nok = False\n"
        "if u.find_spec('torch'):\n import torch; ok = torch.cuda.is_available()\n"
        "if not ok and u.find_spec('jax'):\n import jax\n try: ok = bool(jax.devices('gpu'))\n except Exception: pass\n"
        "sys.exit(0 if ok else 1)"
    )
    return subprocess.run([py, "-c", code], capture_output=True).returncode == 0


# -- running ------------------------------------------------------------------------------------
def shard_dir(out: Path, cell: Cell, i: int) -> Path:
    return out / cell.name / f"shard-{i}"


def cell_env(cell: Cell) -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
            "HYPOTHESIS_PROFILE": cell.profile}


def run_shard(cell: Cell, i: int, out: Path, py: str, budget: float | None = None, jobs: int | None = None,
              resume: bool = False, log=print, corpus: Path = CORPUS) -> int:
    """One shard of a cell's campaign into out/<cell>/shard-<i>; its exit status (0, or 1 with findings)."""
    d = shard_dir(out, cell, i)
    if cell.mode == "devices":   # the same programs on the cpu and the device; shard i draws from seed + i
        what = f"the device comparison (cpu vs {cell.device})"
        cmd = [py, "-m", "conformance.cli", "devices", "--pipelines", ",".join(cell.pipelines), "--device", cell.device,
               "--seed", str(cell.seed + i), "--budget", f"{budget or cell.budget:g}", "--max-examples", "100000",
               "--out", str(d), "--overwrite"]
    else:
        what = "the campaign"
        cmd = [py, "-m", "conformance.cli", "run", "--pipelines", ",".join(cell.pipelines), "--device", cell.device,
               "--seed", str(cell.seed), "--shard", f"{i}/{cell.shards}", "--budget", f"{budget or cell.budget:g}",
               "--known", str(corpus), "--out", str(d), "--quiet",
               *(["--framework-defaults"] if cell.framework_defaults else []),
               *(["--jobs", str(jobs)] if jobs else []), *(["--resume"] if resume and d.exists() else ["--overwrite"])]
    log(f"== cell {cell.name} shard {i}/{cell.shards}: {' '.join(cmd[1:])}")
    r = subprocess.run(cmd, env=cell_env(cell), cwd=ROOT)
    if r.returncode not in (0, 1):
        raise UsageError(f"cell {cell.name!r} shard {i}: {what} failed (exit {r.returncode}); its run directory {d} "
                         f"is kept (`matrix run {cell.name} --shard {i}/{cell.shards} --resume`)")
    return r.returncode


def gather_corpus(run_dirs: list[Path], dest: Path, corpus: Path) -> int:
    """Every finding of the given runs and the regression corpus, one entry per name, in dest."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    n = 0
    for src in [corpus, *(d / "corpus" for d in run_dirs)]:
        for p in sorted(src.glob("*.json")):
            if p.name != "status.json" and not (dest / p.name).exists():
                shutil.copyfile(p, dest / p.name)
                n += 1
    if (corpus / "status.json").exists():
        shutil.copyfile(corpus / "status.json", dest / "status.json")
    return n


def recheck_cell(cell: Cell, corpus: Path, out: Path, py: str, log=print) -> Path:
    f = out / cell.name / "recheck.json"
    log(f"== cell {cell.name}: rechecking {corpus} on its versions")
    r = subprocess.run([py, "-m", "conformance.cli", "recheck", str(corpus), "--out", str(f),
                        "--device", cell.device], env=cell_env(cell), cwd=ROOT, capture_output=True, text=True)
    if r.returncode not in (0, 1) or not f.exists():
        raise UsageError(f"cell {cell.name!r}: recheck failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    log(r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "")
    return f


def nightly(cells: list[Cell], out: Path, budget: float | None, baseline: list[str], jobs: int | None,
            log=print, corpus: Path = None) -> dict:
    """Every cell and shard, then every finding rechecked on every cell, then one report."""
    t0, corpus = time.monotonic(), corpus or CORPUS
    if not baseline and (out / "report" / "report.json").exists():   # last night's report is the baseline
        shutil.rmtree(out / "previous-report", ignore_errors=True)
        (out / "report").rename(out / "previous-report")
        baseline = [str(out / "previous-report")]
    ran, skipped = [], {}
    for c in cells:   # a cell that cannot be built or run is reported; the others go on
        try:
            py = env_python(c, log)
            if c.device == "cuda" and not cuda_available(py):
                skipped[c.name] = "needs a CUDA device; none here"
                log(f"== cell {c.name}: skipped ({skipped[c.name]})")
                continue
            for i in range(c.shards):
                run_shard(c, i, out, py, budget, jobs, log=log, corpus=corpus)
        except UsageError as e:
            skipped[c.name] = f"failed: {str(e)[:2000]}"
            log(f"== cell {c.name}: {skipped[c.name]}")
            continue
        ran.append((c, py))
    dirs = [str(shard_dir(out, c, i)) for c, _ in ran for i in range(c.shards)]
    if not dirs:
        raise UsageError("matrix nightly: no cell ran: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()))
    gather_corpus([Path(d) for d in dirs], out / "corpus-all", corpus)
    rechecks = []
    for c, py in ran:
        try:
            rechecks.append(recheck_cell(c, out / "corpus-all", out, py, log))
        except UsageError as e:
            skipped[f"{c.name} recheck"] = f"failed: {str(e)[:2000]}"
            log(f"== cell {c.name}: {skipped[c.name + ' recheck']}")
    cmd = [sys.executable, "-m", "conformance.cli", "report", *dirs, "--out", str(out / "report"),
           *[a for b in baseline for a in ("--baseline", b)],
           *[a for f in rechecks for a in ("--recheck", str(f))]]
    r = subprocess.run(cmd, cwd=ROOT)
    summary = {"cells": [c.name for c, _ in ran], "skipped": skipped, "shards": len(dirs), "baseline": baseline,
               "seconds": round(time.monotonic() - t0, 1), "report": str(out / "report"), "report_exit": r.returncode}
    (out / "nightly.json").write_text(json.dumps(summary, indent=1))
    return summary


