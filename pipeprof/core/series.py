"""Sampled series: the n/a sentinel, time-weighted means and means over spans of time.

NOTE [ Sample intervals ]
A sampler primes its source at ``t_begin`` and then samples at ``t_1 < t_2 < ...``, one period
apart. Utilisation-like values (CPU %, GPU utilisation from ``nvmlDeviceGetSamples``, disk MB/s)
describe the interval *before* their timestamp, ``(t_{i-1}, t_i]``, so the running aggregates weight
each value by that interval (the first by ``t_1 - t_begin``). Means are therefore exact averages
over the sampled time, whatever the jitter, and they cover the whole run even after the ring of
raw samples has wrapped. Timestamps are ``time.perf_counter_ns()``, the clock the rest of pipeprof
uses, so samples line up with training steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal


class NaType:
    """The value of a metric that could not be read: "n/a", never 0.

    There is one instance, ``NA``. It is falsy, prints as ``n/a`` and becomes ``null`` in JSON
    (``to_dict()`` output already holds ``None``; for raw values use ``json_default``).
    """

    _instance: NaType | None = None

    def __new__(cls) -> NaType:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "n/a"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return "n/a"

    def __bool__(self) -> bool:
        return False

    def __reduce__(self) -> str:
        return "NA"  # unpickles to the module-level singleton


NA = NaType()
Value = float | NaType  # one reading of a metric; NA when it could not be read


def json_default(obj: object) -> None:
    """``json.dumps(..., default=json_default)`` hook: ``NA`` becomes ``null``."""
    if obj is NA:
        return None
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def none_if_na(value: Value | None) -> float | None:
    """``NA`` (and ``None``) → ``None``; a number → ``float``. For JSON output."""
    return None if value is None or isinstance(value, NaType) else float(value)


class TimeWeighted:
    """Running time-weighted mean, max and (optionally) 1 %-bin histogram of one series.

    Each value is weighted by the time since the previous ``add`` (see NOTE [ Sample intervals ]);
    ``NA`` values advance the time but add no weight, so unknown time is excluded, not counted 0.
    """

    __slots__ = ("_hist", "_last_t", "_sum", "count", "max", "weight_ns")

    def __init__(self, hist: bool = False) -> None:
        self._last_t: int | None = None
        self._sum = 0.0
        self._hist: list[int] | None = [0] * 101 if hist else None
        self.weight_ns = 0
        self.count = 0
        self.max: float | None = None

    def begin(self, t_ns: int) -> None:
        """Start the first interval at ``t_ns`` (the sampler's priming time)."""
        self._last_t = t_ns

    def add(self, t_ns: int, value: Value | None) -> None:
        """Record ``value`` for the interval ending at ``t_ns`` (ns)."""
        last, self._last_t = self._last_t, t_ns
        if value is None or isinstance(value, NaType):
            return
        self.count += 1
        self.max = value if self.max is None else max(self.max, value)
        if last is None or t_ns <= last:
            return
        weight = t_ns - last
        self.weight_ns += weight
        self._sum += value * weight
        if self._hist is not None:
            self._hist[min(100, max(0, round(value)))] += weight

    @property
    def mean(self) -> float | None:
        """Time-weighted mean, or None when no value covered any time."""
        return self._sum / self.weight_ns if self.weight_ns else None

    def percentile(self, q: float) -> float | None:
        """Time-weighted ``q``-th percentile (0-100) to the nearest 1 % bin; needs ``hist=True``."""
        if self._hist is None or not self.weight_ns:
            return None
        target, seen = self.weight_ns * q / 100.0, 0
        for value, weight in enumerate(self._hist):
            seen += weight
            if weight and seen >= target:
                return float(value)
        return 100.0


def _merge_spans(spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def mean_over_spans(
    t_ns: Sequence[int],
    values: Sequence[Value | None],
    spans: Sequence[tuple[int, int]],
    hold: Literal["forward", "backward"] = "forward",
) -> float | None:
    """Time-weighted mean of a sampled series over ``spans`` of ``(start_ns, end_ns)``.

    With ``hold="forward"`` sample ``i`` holds on ``[t_i, t_{i+1})``; with ``"backward"`` it covers
    ``(t_{i-1}, t_i]``, which is what interval values such as utilisation describe (NOTE
    [ Sample intervals ]). The series covers ``[t_0, t_last]`` only; n/a (``NA``/None) samples and
    time outside the series are left out. Overlapping spans are merged first. Returns None when
    no known value overlaps any span.
    """
    offset = 0 if hold == "forward" else 1
    intervals = [(t_ns[i], t_ns[i + 1], values[i + offset]) for i in range(len(t_ns) - 1)]
    total = weight = 0.0
    first = 0
    for start, end in _merge_spans(spans):
        while first < len(intervals) and intervals[first][1] <= start:
            first += 1
        k = first
        while k < len(intervals) and intervals[k][0] < end:
            lo, hi, value = intervals[k]
            k += 1
            if value is None or isinstance(value, NaType):
                continue
            overlap = min(hi, end) - max(lo, start)
            total += value * overlap
            weight += overlap
    return total / weight if weight else None
