"""Option value converters shared by the commands: finite, bounded numbers only."""
from __future__ import annotations

import argparse
import math


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
