"""Cheap Hypothesis draws shared by the generators. Strategies are built once and reused:
building and validating a new strategy object for every draw was most of the generator's cost."""
from __future__ import annotations

import threading

from hypothesis import strategies as st


def _without_local_constants() -> None:
    """Hypothesis mixes into its draws constants it mines from every project module the process
    has imported so far (hypothesis.internal.conjecture.providers), so one seed gave different
    programs in a fresh process and in one that had run other code first (a campaign, its resume
    and its shards must generate the same programs). The generator uses none: the pool of local
    constants stays empty. (A private hook: on a Hypothesis without it nothing changes.)"""
    try:
        from hypothesis.internal.conjecture import providers
    except ImportError:   # pragma: no cover - another Hypothesis layout
        return
    if hasattr(providers, "_get_local_constants") and hasattr(providers, "Constants"):
        empty = providers.Constants()
        providers._get_local_constants = lambda: empty
        cache = getattr(providers, "CONSTANTS_CACHE", None)
        if cache is not None:
            cache.cache.clear()


_without_local_constants()
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
