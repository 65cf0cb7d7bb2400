"""Option value converters shared by the commands: finite, bounded numbers only."""
from __future__ import annotations

import argparse
import math

# Hypothesis shrink steps of a new behaviour before the IR reductions (conformance.search).
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
    from generators.swarm import swarm_dimensions
    dims = swarm_dimensions()
    if s not in dims:
        raise argparse.ArgumentTypeError(f"must be a swarm dimension, one of {', '.join(dims)}; got {s!r}")
    return s


def share(s):
    """--share FAMILY=FRACTION: a known pipeline family, a fraction in (0, 1]."""
    from conformance.pipelines import FAMILY_SHARES
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
