"""A campaign's options, declared once (Options: the parser's flags and defaults, run.json, resume,
workers), and the option value converters the commands share: finite, bounded numbers only."""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Annotated, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from conformance.ir.features import FEATURE_FOCUS, lacking_features
from conformance.pipelines.registry import FAMILY_SHARES, SPECS
from generators.programs import Config
from generators.swarm import swarm_dimensions

# Hypothesis shrink steps of a new behaviour before the IR reductions (conformance.engine.search).
SHRINK_STEPS = 10


def positive(kind, name):
    def conv(s):
        try:
            v = kind(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a {kind.__name__}, got {s!r}") from None
        if not math.isfinite(v) or v <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be > 0 (and finite), got {s!r}")
        if kind is int and v > 10 ** 9:
            raise argparse.ArgumentTypeError(f"{name} must be at most 10**9, got {s!r}")
        return v
    return conv


def seed(s):
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {s!r}") from None
    if v < 0 or v >= 2 ** 32:
        raise argparse.ArgumentTypeError(f"must be >= 0 (and below 2**32), got {s!r}")
    return v


def shard(s):
    """--shard I/N with 0 <= I < N."""
    try:
        i, n = (int(x) for x in s.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be I/N (shard I of N, e.g. 0/4), got {s!r}") from None
    if not (n >= 1 and 0 <= i < n and n <= 10 ** 6):
        raise argparse.ArgumentTypeError(f"must be I/N with 0 <= I < N, got {s!r}")
    return (i, n)


def _shareable() -> list[str]:
    return list(FAMILY_SHARES) + [n for n, sp in SPECS.items() if sp.share is not None]


def swarm_dimension(s):
    """--require DIMENSION: a swarm dimension of the generator (generators.swarm)."""
    dims = swarm_dimensions()
    if s not in dims:
        raise argparse.ArgumentTypeError(f"must be a swarm dimension, one of {', '.join(dims)}; got {s!r}")
    return s


def share(s):
    """--share FAMILY=FRACTION or PIPELINE=FRACTION: a known pipeline family, or a pipeline with a
    declared share (registry.Share); a fraction in (0, 1]."""
    fam, sep, val = s.partition("=")
    if not sep or fam not in _shareable():
        raise argparse.ArgumentTypeError(f"must be FAMILY=FRACTION or PIPELINE=FRACTION, one of "
                                         f"{', '.join(_shareable())}; got {s!r}")
    try:
        v = float(val)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{fam}: fraction must be a number, got {val!r}") from None
    if not math.isfinite(v) or not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{fam}: fraction must be in (0, 1], got {val!r}")
    return (fam, v)


# -- the run options, declared once ---------------------------------------------------------------
@dataclass(frozen=True)
class Flag:
    """How an Options field appears on `remat-conformance run`'s command line. `record`: written to
    run.json (and read back by the report); `resume`: a resumed run must be given the same value."""
    help: str = ""
    type: Callable | None = None
    metavar: str | None = None
    repeat: bool = False        # the flag may be given several times (a list)
    switch: bool = False        # a store_true flag
    negatable: bool = False     # --x / --no-x
    choices: tuple | None = None
    record: bool = True
    resume: bool = False
    flag: str | None = None     # the flag's name where it is not --<field-name>
    unset: bool = False         # the parser's default is None: the command decides (e.g. --jobs: the cores)


_seed, _shard = seed, shard   # (inside Options the names are its fields)


def _flag(name: str) -> Flag | None:
    return next((m for m in Options.model_fields[name].metadata if isinstance(m, Flag)), None)


class Options(BaseModel):
    """Every option of a campaign and of `remat-conformance run`, declared once: the parser takes
    flags, defaults and help from here (`add_run_flags`), run.json records the fields marked
    `record` (`recorded`) and is read back and validated by this model (`from_record`), a resumed
    run is checked against the fields marked `resume` (`resume_conflicts`), and workers receive
    `model_dump` (jobs > 1). Fields without a Flag are for callers (tests, tools)."""
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True)

    pipelines: Annotated[list[str], Flag(
        "comma-separated exact pipeline names (see `pipelines`); the references are added", type=str,
        resume=True, unset=True)] = Field(default_factory=list)
    budget: Annotated[float, Flag("wall-clock seconds, shrinking included", positive(float, "--budget"))] = 240.0
    max_examples: Annotated[int, Flag("program slots of the whole campaign (all shards together)",
                                      positive(int, "--max-examples"))] = 100000
    seed: Annotated[int, Flag("the campaign's seed", _seed, resume=True)] = 0
    device: Annotated[Literal["cpu", "cuda"], Flag("where the pipelines run", choices=("cpu", "cuda"),
                                                   resume=True)] = "cpu"
    shrink_seconds: Annotated[float, Flag("seconds one shrink may take", positive(float, "--shrink-seconds"))] = 45.0
    shrink_steps: Annotated[int, Flag(
        f"Hypothesis shrink steps of a new behaviour before the IR reductions (default {SHRINK_STEPS})",
        positive(int, "--shrink-steps"))] = SHRINK_STEPS
    max_stmts: Annotated[int, Flag("generator: a program draws at most 2 x N ops and region/block openings",
                                   positive(int, "--max-stmts"), resume=True)] = 6
    require: Annotated[list[str], Flag(
        "generator: a swarm dimension on in every program (repeatable), e.g. --require scan --require cond; "
        "the rest are drawn as usual", swarm_dimension, "DIMENSION", repeat=True, resume=True)] = \
        Field(default_factory=list)
    exclude: Annotated[list[str], Flag(
        "generator: a swarm dimension off in every program (repeatable), e.g. --exclude effects; every other is "
        "drawn as usual", swarm_dimension, "DIMENSION", repeat=True, resume=True)] = Field(default_factory=list)
    jobs: Annotated[int, Flag("searching worker processes (default: the machine's cores)",
                              positive(int, "--jobs"), unset=True)] = 1
    shard: Annotated[tuple[int, int], Flag(
        "check only shard I of N (0 <= I < N): N machines running shards 0..N-1 check disjoint programs whose "
        "union is the unsharded campaign", _shard, "I/N", resume=True)] = (0, 1)
    shares: Annotated[dict[str, float], Flag(
        "time share of a pipeline family (" + ", ".join(f"{k}={v:g}" for k, v in FAMILY_SHARES.items())
        + " by default), or the fraction of the programs a pipeline with a declared share runs on ("
        + ", ".join(f"{k}={v.share.fraction:g}" for k, v in SPECS.items() if v.share) + "); repeatable",
        share, "NAME=FRACTION", repeat=True, flag="--share")] = \
        Field(default_factory=dict)
    share_by: Annotated[Literal["time", "programs"], Flag(
        "what a family's share measures: its pipelines' seconds (time), or the programs it ran on "
        "(programs: the same programs for one seed however loaded the machine)", choices=("time", "programs"),
        resume=True)] = "time"
    explore: Annotated[bool | None, Flag(
        "run the pipelines outside the core set on an adaptive share of the time, more for those that find "
        "new behaviours (default: on without --pipelines, off when --pipelines names the rivals; off without "
        "--pipelines: the core set only)",
        negatable=True, resume=True)] = None
    round_size: Annotated[int, Flag("programs per seeded round", positive(int, "--round-size"), resume=True)] = 40
    max_shrinks_per_key: Annotated[int, Flag("shrinks of one key (check, pipeline, reference, error type) at most",
                                             positive(int, "--max-shrinks-per-key"))] = 3
    framework_defaults: Annotated[bool, Flag(
        "run JAX exactly as configured: eager primitives compiled per remat flag setting (no shared eager "
        "cache), the float64 reference eager, no XLA compile cache, XLA's own optimisation level (the matrix's "
        "framework-defaults cell)",
        switch=True, resume=True)] = False
    isolate: Annotated[bool | None, Flag("run pipelines in supervised worker processes (default on)",
                                         negatable=True, record=False)] = None
    timeout: Annotated[float, Flag("per-pipeline timeout in seconds for one program (isolated runs)",
                                   positive(float, "--timeout"), record=False)] = 60.0
    memory_limit: int | str | None = "default"   # each isolated worker's (the CLI derives it from jobs)
    expectations: Annotated[str | None, Flag("expectations JSON (default: the packaged file)")] = None
    # the command's own flags: where and how a run writes (not campaign settings)
    out: Annotated[str, Flag("the run directory", record=False)] = "reports/latest"
    overwrite: Annotated[bool, Flag("replace the contents of a non-empty --out", switch=True, record=False)] = False
    resume: Annotated[bool, Flag("continue an interrupted campaign in --out", switch=True, record=False)] = False
    strict: Annotated[bool, Flag("exit 1 when there are new findings (unexpected, not --known)", switch=True,
                                 record=False)] = False
    known: Annotated[list[str], Flag(
        "a regression corpus (directory of corpus entries, or one entry) whose behaviours are known: programs "
        "failing their way are counted, not shrunk or reported as new; repeatable", metavar="CORPUS", repeat=True,
        record=False)] = Field(default_factory=list)
    quiet: Annotated[bool, Flag("no progress line", switch=True, record=False)] = False
    generator: Config | None = Field(default=None, exclude=True)   # a whole generator config (tests)
    stop_when: Callable[[list], bool] | None = Field(default=None, exclude=True)   # stop early (tests)

    @field_validator("shares", mode="before")
    @classmethod
    def _pairs(cls, v):   # --share gives (family, fraction) pairs
        return dict(v) if isinstance(v, list) else v

    @field_validator("require", "exclude")
    @classmethod
    def _canonical(cls, v):   # the dimensions on (off) in every program: a set, recorded sorted
        return sorted(set(v))

    @property
    def config(self) -> Config:
        """The generator's configuration: `generator` where a caller gave one, else the flags'."""
        if self.generator:
            return self.generator
        lacks = sorted(lacking_features({SPECS[n].framework for n in self.pipelines if n in SPECS}))
        # a swarm dimension every feature of which the releases lack is off
        dims = {f for f in lacks if f in swarm_dimensions()} | {
            d for d in {d for f in lacks for d in FEATURE_FOCUS.get(f, ())}
            if all(f in lacks for f, focus in FEATURE_FOCUS.items() if d in focus)}
        return Config(max_stmts=self.max_stmts, require=tuple(self.require),
                      exclude=tuple(sorted(set(self.exclude) | dims)), lacks=tuple(lacks))

    def rounds(self) -> int:
        return -(-self.max_examples // self.round_size)

    def recorded(self) -> dict:
        """run.json's options: the fields marked `record`."""
        d = self.model_dump(mode="json")
        return {k: d[k] for k in Options.model_fields if (f := _flag(k)) is not None and f.record}

    @classmethod
    def from_record(cls, options: dict, where: str) -> "Options":
        """A run.json's options, validated (a run written before an option existed had its default);
        ValueError names the file and the field."""
        known = {k: v for k, v in options.items() if k in cls.model_fields}
        try:
            return cls.model_validate(known)
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"{where}: options.{'.'.join(map(str, err['loc']))}: {err['msg']}") from None

    def resume_conflicts(self, previous: "Options") -> list[str]:
        """The fields marked `resume` whose value differs from the interrupted run's."""
        return [k for k in Options.model_fields if (f := _flag(k)) and f.resume
                and getattr(previous, k) != getattr(self, k)]


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """`run`'s flags, from the Options fields that have a Flag."""
    for name, info in Options.model_fields.items():
        f = _flag(name)
        if f is None:
            continue
        flag = f.flag or "--" + name.replace("_", "-")
        default = info.get_default(call_default_factory=True)
        if f.switch:
            parser.add_argument(flag, dest=name, action="store_true", help=f.help)
        elif f.negatable:
            parser.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=default, help=f.help)
        else:
            kw = {"type": f.type} if f.type else {}
            if f.choices:
                kw["choices"] = list(f.choices)
            if f.metavar:
                kw["metavar"] = f.metavar
            if f.repeat:
                kw["action"] = "append"
            parser.add_argument(flag, dest=name, default=None if f.unset else ([] if f.repeat else default),
                                help=f.help, **kw)


def options_from_args(args, **overrides) -> Options:
    """The Options a parsed `run` command line gives (each flagged field; `overrides` win)."""
    values = {k: getattr(args, k) for k in Options.model_fields if _flag(k) is not None and hasattr(args, k)}
    return Options(**{**values, **overrides})


class RecordedOptions(Options):
    """A run.json's options as the report reads them: the same fields, others kept (later versions)."""
    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)
