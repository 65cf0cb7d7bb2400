"""A campaign's options (Options) and the option value converters the commands share: finite,
bounded numbers only."""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Callable

from conformance.pipelines.registry import FAMILY_SHARES
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


def swarm_dimension(s):
    """--require DIMENSION: a swarm dimension of the generator (generators.swarm)."""
    dims = swarm_dimensions()
    if s not in dims:
        raise argparse.ArgumentTypeError(f"must be a swarm dimension, one of {', '.join(dims)}; got {s!r}")
    return s


def share(s):
    """--share FAMILY=FRACTION: a known pipeline family, a fraction in (0, 1]."""
    fam, sep, val = s.partition("=")
    if not sep or fam not in FAMILY_SHARES:
        raise argparse.ArgumentTypeError(f"must be FAMILY=FRACTION with FAMILY one of {', '.join(FAMILY_SHARES)}, "
                                         f"got {s!r}")
    try:
        v = float(val)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{fam}: fraction must be a number, got {val!r}") from None
    if not math.isfinite(v) or not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{fam}: fraction must be in (0, 1], got {val!r}")
    return (fam, v)


@dataclass
class Options:
    pipelines: list[str]
    budget: float = 240.0
    max_examples: int = 1000         # program slots of the whole campaign (all shards together)
    seed: int = 0
    device: str = "cpu"
    shrink_seconds: float = 60.0
    shrink_steps: int = SHRINK_STEPS
    round_size: int = 40
    max_shrinks_per_key: int = 3
    generator: Config = field(default_factory=Config)
    jobs: int = 1
    shard: tuple[int, int] = (0, 1)
    shares: dict[str, float] = field(default_factory=dict)
    # How jobs > 1 build their executors: {"isolate": bool, "timeout": s, "memory_limit": bytes|None}
    executor: dict = field(default_factory=lambda: {"isolate": True})
    expectations_path: str | None = None
    # Stop early once this returns True for the findings so far (tests use it).
    stop_when: Callable[[list], bool] | None = None

    def rounds(self) -> int:
        return -(-self.max_examples // self.round_size)
