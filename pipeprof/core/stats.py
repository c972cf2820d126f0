"""Bounded-memory duration statistics: count, sum, min, max and a log-linear histogram.

NOTE [ Histogram buckets ]
Durations are integers in nanoseconds. A value below 32 ns has its own bucket; above that, a
bucket keeps the value's top five bits (16 sub-buckets per power of two), so a bucket spans at
most 1/16 of its lower bound. Reporting the bucket's midpoint puts a percentile within about 3%
of the exact one. Memory grows with the spread of the durations (at most a few hundred
buckets), never with their number, which keeps a session flat over millions of events.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

_SUB_BITS = 5  # keep the top five bits of a value: 16 sub-buckets per power of two


def bucket_of(ns: int) -> int:
    """Index of the histogram bucket that holds ``ns`` (a non-negative integer)."""
    bits = ns.bit_length()
    if bits <= _SUB_BITS:
        return ns
    shift = bits - _SUB_BITS
    return (shift << 4) + (ns >> shift)


def bucket_bounds(index: int) -> tuple[int, int]:
    """The half-open range ``[low, high)`` of nanoseconds that bucket ``index`` covers."""
    if index < 32:
        return index, index + 1
    shift = (index >> 4) - 1  # bucket_of packs (shift << 4) + top, with 16 <= top < 32
    top = index - (shift << 4)
    return top << shift, (top + 1) << shift


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - numpy comes with torch and tensorflow
        return None
    return numpy


class Stat:
    """Running statistics of one stream of durations, in nanoseconds.

    ``add(ns, n)`` records one observation that covered ``n`` items (a batch of ``n`` samples
    timed as one call): the histogram and min/max see the per-item duration ``ns / n``, the
    count grows by ``n``. Mergeable and JSON-serialisable through ``to_dict``/``from_dict``.
    """

    __slots__ = ("count", "hist", "max_ns", "min_ns", "sum_sq", "total_ns")

    def __init__(self) -> None:
        self.count = 0
        self.total_ns = 0
        self.min_ns = 0
        self.max_ns = 0
        self.sum_sq = 0.0  # of per-item nanoseconds, for the standard deviation
        self.hist: dict[int, int] = {}

    def add(self, ns: int, n: int = 1) -> None:
        per = ns // n if n > 1 else ns
        if per < 0:
            per = 0
        if self.count == 0 or per < self.min_ns:
            self.min_ns = per
        if per > self.max_ns:
            self.max_ns = per
        self.count += n
        self.total_ns += ns
        self.sum_sq += float(per) * per * n
        bits = per.bit_length()  # bucket_of, inlined: this is a hot path
        b = per if bits <= _SUB_BITS else ((bits - _SUB_BITS) << 4) + (per >> (bits - _SUB_BITS))
        self.hist[b] = self.hist.get(b, 0) + n

    def merge(self, other: Stat) -> None:
        if other.count == 0:
            return
        if self.count == 0 or other.min_ns < self.min_ns:
            self.min_ns = other.min_ns
        self.max_ns = max(self.max_ns, other.max_ns)
        self.count += other.count
        self.total_ns += other.total_ns
        self.sum_sq += other.sum_sq
        for b, c in other.hist.items():
            self.hist[b] = self.hist.get(b, 0) + c

    @property
    def mean_ns(self) -> float:
        return self.total_ns / self.count if self.count else math.nan

    @property
    def std_ns(self) -> float:
        if self.count < 2:
            return math.nan
        mean = self.total_ns / self.count
        var = max(0.0, self.sum_sq / self.count - mean * mean)
        return math.sqrt(var * self.count / (self.count - 1))

    def percentile_ns(self, q: float) -> float:
        """The ``q``-th percentile (0-100) of per-item durations; NaN when empty."""
        if self.count == 0:
            return math.nan
        rank = max(1, math.ceil(q / 100.0 * self.count))
        seen = 0
        for b in sorted(self.hist):
            seen += self.hist[b]
            if seen >= rank:
                low, high = bucket_bounds(b)
                mid = (low + high - 1) / 2.0
                return min(max(mid, self.min_ns), self.max_ns)
        return float(self.max_ns)

    def to_dict(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "total_ns": self.total_ns,
            "min_ns": self.min_ns,
            "max_ns": self.max_ns,
            "sum_sq": self.sum_sq,
            "hist": {str(b): c for b, c in self.hist.items()},
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Stat:
        s = cls()
        s.count = int(data.get("count", 0))
        s.total_ns = int(data.get("total_ns", 0))
        s.min_ns = int(data.get("min_ns", 0))
        s.max_ns = int(data.get("max_ns", 0))
        s.sum_sq = float(data.get("sum_sq", 0.0))
        s.hist = {int(b): int(c) for b, c in data.get("hist", {}).items()}
        return s

    @classmethod
    def of_many(cls, durations_ns: Sequence[int], items: Sequence[int] | None = None) -> Stat:
        """A Stat of many observations at once (vectorised with NumPy when it is installed).
        ``durations_ns`` and ``items`` are sequences of ints: lists, or ``array('q')``s, which
        NumPy reads without a copy."""
        if not len(durations_ns):
            return cls()
        # NumPy's fixed cost per call (about 40 µs here) is worth it from about 64 values
        np = _numpy() if len(durations_ns) > 64 else None
        if np is None:
            s = cls()
            for d, n in zip(durations_ns, items or [1] * len(durations_ns)):
                s.add(d, n)
            return s
        da = np.asarray(durations_ns, dtype=np.int64)
        na = np.asarray(items, dtype=np.int64) if items is not None else np.ones_like(da)
        per = np.maximum(da // np.maximum(na, 1), 0)
        s = cls()
        s.count = int(na.sum())
        s.total_ns = int(da.sum())
        s.min_ns = int(per.min())
        s.max_ns = int(per.max())
        s.sum_sq = float((per.astype(np.float64) ** 2 * na).sum())
        bits = np.frexp(per.astype(np.float64))[1]  # == int.bit_length below 2**53
        shift = np.maximum(bits - _SUB_BITS, 0)
        idx = np.where(bits <= _SUB_BITS, per, (shift << 4) + (per >> shift))
        counts = np.bincount(idx, weights=na)
        nz = np.nonzero(counts)[0]
        s.hist = {int(b): int(counts[b]) for b in nz}
        return s

    @classmethod
    def of(cls, values_ns: Iterable[int]) -> Stat:
        s = cls()
        for v in values_ns:
            s.add(int(v))
        return s


def _ms(ns: float) -> float | None:
    return None if math.isnan(ns) else round(ns / 1e6, 6)


class Figures(TypedDict):
    """A Stat as report figures (``figures``): seconds in all, milliseconds a call."""

    total_s: float
    count: int
    mean_ms: float | None
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    min_ms: float | None
    max_ms: float | None
    std_ms: float | None  # None below two calls


def figures(stat: Stat) -> Figures:
    """A Stat as report figures: ``total_s`` in seconds, per-call figures in milliseconds
    (``mean_ms``, ``p50_ms``, ``p95_ms``, ``p99_ms``, ``min_ms``, ``max_ms``, ``std_ms``); None
    where there is nothing to show (no calls; ``std_ms`` below two calls)."""
    some = stat.count > 0
    return {
        "total_s": round(stat.total_ns / 1e9, 9),
        "count": stat.count,
        "mean_ms": _ms(stat.mean_ns),
        "p50_ms": _ms(stat.percentile_ns(50)),
        "p95_ms": _ms(stat.percentile_ns(95)),
        "p99_ms": _ms(stat.percentile_ns(99)),
        "min_ms": _ms(float(stat.min_ns)) if some else None,
        "max_ms": _ms(float(stat.max_ns)) if some else None,
        "std_ms": _ms(stat.std_ns),
    }
