"""The sampler thread, the n/a sentinel and time-weighted aggregation shared by all samplers.

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

import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, Literal

DEFAULT_CAPACITY = 36_000  # samples kept in the ring: one hour at 10 Hz
MIB = float(1 << 20)  # "MB" in pipeprof's sampler output is MiB, as nvidia-smi shows it
Clock = Callable[[], int]


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


class Lateness:
    """How late the sampler thread woke for each deadline, in nanoseconds."""

    __slots__ = ("count", "max_ns", "missed", "total_ns")

    def __init__(self) -> None:
        self.count = 0
        self.total_ns = 0
        self.max_ns = 0
        self.missed = 0  # deadlines skipped because a sample overran a whole period

    def add(self, late_ns: int) -> None:
        late_ns = max(0, late_ns)
        self.count += 1
        self.total_ns += late_ns
        self.max_ns = max(self.max_ns, late_ns)

    def to_dict(self) -> dict[str, float | int]:
        """``count`` samples, ``mean_ms``/``max_ms`` lateness, ``missed`` deadlines."""
        mean = self.total_ns / self.count if self.count else 0.0
        return {
            "count": self.count,
            "mean_ms": mean / 1e6,
            "max_ms": self.max_ns / 1e6,
            "missed": self.missed,
        }


class Sampler:
    """A named daemon thread in the main process that samples at ``hz`` until ``stop()``.

    Subclasses implement ``_prime`` (open the source; return False to give up), ``_sample`` (one
    reading at ``now_ns``), ``_close`` and ``to_dict``. The thread sleeps to a deadline
    (``deadline += period``) on an Event, so ``stop()`` is immediate; it records its own lateness
    and never raises: a sample that fails is counted in ``errors`` and skipped. Samples are kept in
    a ring of ``capacity`` entries; aggregates cover the whole run.
    """

    thread_name = "pipeprof-sampler"

    def __init__(
        self,
        hz: float = 10.0,
        *,
        capacity: int = DEFAULT_CAPACITY,
        clock: Clock = time.perf_counter_ns,
    ) -> None:
        if not hz > 0:
            raise ValueError(f"hz must be positive, got {hz!r}")
        self.hz = float(hz)
        self.period_ns = max(1, round(1e9 / hz))
        self.capacity = capacity
        self._clock = clock
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards aggregates and the ring against to_dict()
        self.lateness = Lateness()
        self.errors = 0  # samples that raised and were skipped
        self.primed_ns: int | None = None

    # ---- source hooks (subclasses) ------------------------------------------------------

    def _prime(self, now_ns: int) -> bool:
        return True

    def _sample(self, now_ns: int) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        return None

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    # ---- driving by hand (the thread does this; tests and one-shot users may too) --------

    def prime(self, now_ns: int | None = None) -> bool:
        """Open the source and start the first interval; False means nothing will be sampled."""
        now = self._clock() if now_ns is None else now_ns
        self.primed_ns = now
        return self._prime(now)

    def sample(self, now_ns: int | None = None) -> None:
        """Sample now (or at ``now_ns``); a failure is counted in ``errors``, never raised."""
        now = self._clock() if now_ns is None else now_ns
        try:
            with self._lock:
                self._sample(now)
        except Exception:
            self.errors += 1

    def close(self) -> None:
        """Release the source (e.g. ``nvmlShutdown``). Never raises."""
        try:
            self._close()
        except Exception:
            self.errors += 1

    def tick(self, deadline_ns: int) -> int:
        """Sample for ``deadline_ns``, record lateness, return the next deadline (skips overrun)."""
        now = self._clock()
        self.lateness.add(now - deadline_ns)
        self.sample(now)
        deadline_ns += self.period_ns
        after = self._clock()
        if after > deadline_ns:  # the sample overran a period: skip deadlines instead of bursting
            skipped = (after - deadline_ns) // self.period_ns + 1
            self.lateness.missed += skipped
            deadline_ns += skipped * self.period_ns
        return deadline_ns

    # ---- the thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            if not self.prime():
                return
            deadline = (self.primed_ns or 0) + self.period_ns
            while not self._stop_event.wait(max(0.0, (deadline - self._clock()) / 1e9)):
                deadline = self.tick(deadline)
        except Exception:  # the thread must never raise into the user's program
            self.errors += 1
        finally:
            self.close()

    def _refusal(self) -> str | None:
        """Why this sampler must not run here (None: it may)."""
        return None

    def start(self) -> Sampler:
        """Start the sampler thread (a no-op if it is running or refuses to run here)."""
        if self._thread is not None:
            if self._thread.is_alive() or not self._stop_event.is_set():
                return self
            raise RuntimeError(f"{type(self).__name__} was stopped; make a new one to sample again")
        if self._refusal() is not None:
            return self
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop and join the thread. Idempotent; safe (a no-op) if never started."""
        if self._thread is None:
            return
        self._stop_event.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    def is_alive(self) -> bool:
        """True while the sampler thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> Sampler:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


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
