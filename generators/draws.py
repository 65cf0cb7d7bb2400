"""Cheap Hypothesis draws shared by the generators. Strategies are built once and reused:
building and validating a new strategy object for every draw was most of the generator's cost."""
from __future__ import annotations

import threading

from hypothesis import strategies as st

BOOL = st.booleans()
_INTS: dict[tuple[int, int], st.SearchStrategy] = {}
_PERMS: dict[int, st.SearchStrategy] = {}


def ints(lo: int, hi: int) -> st.SearchStrategy:
    s = _INTS.get((lo, hi))
    if s is None:
        s = _INTS[(lo, hi)] = st.integers(lo, hi)
    return s


def perms(n: int) -> st.SearchStrategy:
    s = _PERMS.get(n)
    if s is None:
        s = _PERMS[n] = st.permutations(list(range(n)))
    return s


def draw_int(draw, lo: int, hi: int, label: str) -> int:
    return draw(ints(lo, hi), label=label)


_TLS = threading.local()


def _span_body(draw):
    fn = _TLS.pending
    _TLS.pending = None
    return fn(draw)


_SPAN = st.composite(_span_body)()   # one strategy object: draws group their choices into a span


def span(draw, fn, label: str):
    """Run fn(draw) inside one Hypothesis span (so the shrinker can replace or delete it whole)."""
    _TLS.pending = fn
    return draw(_SPAN, label=label)


def flag(draw, p: tuple[int, int], label: str) -> bool:
    """A biased coin, on with probability p[0]/p[1]; its simplest (shrink-target) choice is off."""
    if p == (1, 2):
        return draw(BOOL, label=label)
    return draw_int(draw, 0, p[1] - 1, label) >= p[1] - p[0]
