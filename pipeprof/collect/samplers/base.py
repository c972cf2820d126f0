"""The sampler thread shared by all samplers: a named daemon that samples to a deadline.

What it records is a series (pipeprof.core.series; see NOTE [ Sample intervals ] there).

NOTE [ The program's collections on a sampler thread ]
A sampler thread allocates (its first sample imports psutil), so now and then a garbage
collection that the program's own allocations have made due runs on it. A full collection of a
heap that torch's import has filled takes 100-200 ms, and all of it was counted as pipeprof's
cost: on the README's demo the report said 8 % where its own work was 2 %. The collections of
the older generations (1 and 2: the program's long-lived objects) that run on a sampler thread
are timed there, while it runs (a ``gc.callbacks`` hook, only on that thread), and left out of
its ``cpu_ns`` (``gc_ns``); a young collection, mostly of the sampler's own objects, stays in.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

DEFAULT_CAPACITY = 36_000  # samples kept in the ring: one hour at 10 Hz
MIB = float(1 << 20)  # "MB" in pipeprof's sampler output is MiB, as nvidia-smi shows it
Clock = Callable[[], int]


_GC_LOCK = threading.Lock()
_GC_THREADS: dict[int, list[int]] = {}  # a running sampler's thread -> [older collections' ns,
# the thread's CPU clock when the one in progress started] (NOTE above)


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    entry = _GC_THREADS.get(threading.get_ident())
    if entry is None or info.get("generation", 0) < 1:
        return
    if phase == "start":
        entry[1] = time.thread_time_ns()
    elif entry[1]:
        entry[0] += time.thread_time_ns() - entry[1]
        entry[1] = 0


def _watch_gc(on: bool) -> list[int]:
    """This thread's older collections timed (``on``) or no longer; the entry counting them."""
    ident = threading.get_ident()
    with _GC_LOCK:
        if on:
            entry = _GC_THREADS[ident] = [0, 0]
            if _on_gc not in gc.callbacks:
                gc.callbacks.append(_on_gc)
            return entry
        entry = _GC_THREADS.pop(ident, [0, 0])
        if not _GC_THREADS and _on_gc in gc.callbacks:
            gc.callbacks.remove(_on_gc)
        return entry


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
    (``deadline += period``) on a lock that ``stop()`` releases, so ``stop()`` is immediate; it
    records its own lateness and never raises: a sample that fails is counted in ``errors`` and
    skipped. Samples are kept in a ring of ``capacity`` entries; aggregates cover the whole run.
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
        # held until stop(): the thread sleeps to its deadlines in acquire(timeout=...), one C
        # call, where Event.wait would run threading.Condition's Python on every wake-up
        self._wake = threading.Lock()
        self._wake.acquire()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # guards aggregates and the ring against to_dict()
        self.lateness = Lateness()
        self.errors = 0  # samples that raised and were skipped
        self.primed_ns: int | None = None
        self.cpu_ns = 0  # the sampler thread's own CPU time so far: pipeprof's cost
        self.first_ns = 0  # of which starting up: priming and the first sample (once a run)
        self.gc_ns = 0  # the program's collections that ran on the thread, not in cpu_ns (NOTE)

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
        cpu0 = time.thread_time_ns()
        collections = _watch_gc(True)
        try:
            if not self.prime():
                return
            deadline = (self.primed_ns or 0) + self.period_ns
            wake = self._wake
            while not wake.acquire(timeout=max(0.0, (deadline - self._clock()) / 1e9)):
                deadline = self.tick(deadline)
                self._count(cpu0, collections)
        except Exception:  # the thread must never raise into the user's program
            self.errors += 1
        finally:
            self.close()
            _watch_gc(False)
            self._count(cpu0, collections)

    def _count(self, cpu0: int, collections: list[int]) -> None:
        """The thread's CPU so far, less the program's collections that ran on it."""
        self.gc_ns = collections[0]
        self.cpu_ns = max(0, time.thread_time_ns() - cpu0 - self.gc_ns)
        self.first_ns = self.first_ns or self.cpu_ns

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
        if not self._stop_event.is_set():
            self._stop_event.set()
            try:
                self._wake.release()
            except RuntimeError:  # released by a stop() in another thread meanwhile
                pass
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
