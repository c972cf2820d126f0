"""The sampler thread shared by all samplers: a named daemon that samples to a deadline.

What it records is a series (pipeprof.core.series; see NOTE [ Sample intervals ] there).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

DEFAULT_CAPACITY = 36_000  # samples kept in the ring: one hour at 10 Hz
MIB = float(1 << 20)  # "MB" in pipeprof's sampler output is MiB, as nvidia-smi shows it
Clock = Callable[[], int]


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
        self.cpu_ns = 0  # the sampler thread's own CPU time so far: pipeprof's cost
        self.first_ns = 0  # of which starting up: priming and the first sample (once a run)

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
        try:
            if not self.prime():
                return
            deadline = (self.primed_ns or 0) + self.period_ns
            while not self._stop_event.wait(max(0.0, (deadline - self._clock()) / 1e9)):
                deadline = self.tick(deadline)
                self.cpu_ns = time.thread_time_ns() - cpu0
                self.first_ns = self.first_ns or self.cpu_ns
        except Exception:  # the thread must never raise into the user's program
            self.errors += 1
        finally:
            self.close()
            self.cpu_ns = time.thread_time_ns() - cpu0
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
