"""A Deep500-style region timer that works on its own, in any framework.

``Timer`` measures named regions of a training loop (``Epoch``, ``Batch``, ``Forward``, ...) with
``start(key)``/``end(key)`` or ``with timer.region(key):``. Regions nest and overlap freely, and a
key may be re-entered while it is open (each key keeps its own LIFO stack of open starts).
Durations are aggregated per key into a bounded-memory ``Stat``, so memory does not grow with the
number of regions.

NOTE [ CUDA event batching ]
GPU work is asynchronous: a CPU clock around ``loss.backward()`` measures the launch, not the
work. The ``cuda`` backend records a ``torch.cuda.Event`` on the current stream at ``start`` and
another at ``end``, and keeps the pair pending. Synchronising at every ``end`` would stall the
CPU's run-ahead and distort the very loop being measured, so pending pairs are resolved in
batches: once more than ``resolve_every`` are pending, one pass resolves the pairs whose events
``query()`` as done, which never blocks. Pairs still in flight wait for the next pass (which comes
after another ``resolve_every`` ends, so a GPU that lags far behind costs no per-step scan) or
for ``flush()``/``stats()``, which synchronise on them. Resolved events are reused.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pipeprof.stats import Stat

if TYPE_CHECKING:
    from rich.table import Table

EPOCH = "Epoch"
BATCH = "Batch"
FORWARD = "Forward"
BACKWARD = "Backward"
COMM = "Comm"
IO = "IO"
OTHER = "Other"
#: The Deep500 region keys; any other non-empty string works as a key too.
DEFAULT_KEYS = (EPOCH, BATCH, FORWARD, BACKWARD, COMM, IO, OTHER)

Backend = Literal["cpu", "cuda", "auto"]
#: Called as ``sink(key, start_ns, duration_ns)`` when a region's duration becomes known.
Sink = Callable[[str, int, int], None]

_FIELDS = ("count", "total_ms", "mean_ms", "median_ms", "p95_ms", "min_ms", "max_ms", "std_ms")
_HEADER = ["region", *(f.replace("_ms", " ms") for f in _FIELDS)]
_CUDA_ADVICE = (
    "Timer(backend='cuda') needs PyTorch built with CUDA and a visible GPU: "
    "`pip install torch` (a CUDA build), or use Timer(backend='cpu')."
)


class Event(Protocol):
    """What the ``cuda`` backend needs of an event; ``torch.cuda.Event`` has it."""

    def record(self) -> None: ...
    def query(self) -> bool: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end_event: Any) -> float: ...  # milliseconds


class _Region:
    """Context manager for ``Timer.region``; stateless, so one per key is cached and reused."""

    __slots__ = ("key", "timer")

    def __init__(self, timer: Timer, key: str) -> None:
        self.timer = timer
        self.key = key

    def __enter__(self) -> None:
        self.timer.start(self.key)

    def __exit__(self, *exc: object) -> None:
        self.timer.end(self.key)  # runs on exceptions too; returning None lets them propagate


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"region key must be a str such as 'Forward', not {type(key).__name__}")
    if not key:
        raise ValueError("region key must be a non-empty string such as 'Forward'")
    return key


def _cuda_event_factory() -> Callable[[], Event]:
    try:
        import torch
    except ImportError as exc:
        raise RuntimeError(_CUDA_ADVICE) from exc
    if not torch.cuda.is_available():
        raise RuntimeError(_CUDA_ADVICE)
    return functools.partial(torch.cuda.Event, enable_timing=True)


def _resolve_backend(backend: str) -> str:
    if backend == "auto":
        torch = sys.modules.get("torch")  # never import torch just to decide
        return "cuda" if torch is not None and torch.cuda.is_available() else "cpu"
    if backend not in ("cpu", "cuda"):
        raise ValueError(f"backend must be 'cpu', 'cuda' or 'auto', not {backend!r}")
    return backend


class Timer:
    """Named region timer with per-key statistics in milliseconds.

    ``backend``: ``"cpu"`` times with ``clock`` (``time.perf_counter_ns``, integer nanoseconds);
    ``"cuda"`` times GPU work with CUDA events (see NOTE [ CUDA event batching ]);
    ``"auto"`` picks ``cuda`` when torch is already imported and sees a GPU, else ``cpu``.
    ``event_factory`` makes the ``cuda`` backend's events (default
    ``torch.cuda.Event(enable_timing=True)``). ``sink(key, start_ns, duration_ns)`` is called for
    every region when its duration is known; ``start_ns`` is ``clock()`` at ``start``.

    Statistics: count, total, min, mean, max and std are exact; median and p95 come from a
    log-linear histogram and are within about 3% of the exact values. Regions still open are
    not counted. Not thread-safe: use one Timer per thread.
    """

    __slots__ = (
        "_clock",
        "_cuda",
        "_factory",
        "_free",
        "_next_resolve",
        "_open",
        "_open_ev",
        "_order",
        "_pending",
        "_regions",
        "_resolve_every",
        "_sink",
        "_stats",
        "backend",
    )

    def __init__(
        self,
        backend: Backend = "cpu",
        *,
        clock: Callable[[], int] = time.perf_counter_ns,
        sink: Sink | None = None,
        resolve_every: int = 64,
        event_factory: Callable[[], Event] | None = None,
    ) -> None:
        if resolve_every < 0:
            raise ValueError(f"resolve_every must be >= 0, not {resolve_every}")
        #: The backend in use, ``"cpu"`` or ``"cuda"`` (``"auto"`` resolved).
        self.backend = _resolve_backend(backend)
        self._cuda = self.backend == "cuda"
        if self._cuda and event_factory is None:
            event_factory = _cuda_event_factory()
        self._factory = event_factory
        self._clock = clock
        self._sink = sink
        self._resolve_every = resolve_every
        self._open: dict[str, list[int]] = {}  # key -> stack of clock() at start, ns
        self._open_ev: dict[str, list[Event]] = {}  # key -> stack of start events (cuda)
        self._stats: dict[str, Stat] = {}
        self._order: list[str] = []  # keys in first-seen order
        self._regions: dict[str, _Region] = {}
        self._pending: list[tuple[str, int, Event, Event]] = []  # (key, start_ns, start, end)
        self._free: list[Event] = []  # resolved events, recorded again by later regions
        self._next_resolve = resolve_every

    def start(self, key: str) -> None:
        """Open a region named ``key``; it closes at the matching ``end(key)`` (LIFO per key)."""
        try:
            stack = self._open[key]
        except (KeyError, TypeError):
            stack = self._new_key(key)
        if self._cuda:
            free = self._free
            event = free.pop() if free else self._make_event()
            stack.append(self._clock())
            event.record()
            self._open_ev[key].append(event)
        else:
            stack.append(self._clock())

    def end(self, key: str) -> None:
        """Close the innermost open region named ``key``; ``ValueError`` if none is open."""
        if self._cuda:
            self._end_cuda(key)
            return
        now = self._clock()
        try:
            start_ns = self._open[key].pop()
        except (KeyError, IndexError, TypeError):
            raise self._unmatched(key) from None
        duration = now - start_ns
        self._stats[key].add(duration)
        sink = self._sink
        if sink is not None:
            sink(key, start_ns, duration)

    def region(self, key: str) -> _Region:
        """``with timer.region(key):`` times the block, closing it even if the block raises."""
        try:
            return self._regions[key]
        except (KeyError, TypeError):
            region = self._regions[_check_key(key)] = _Region(self, key)
            return region

    def flush(self) -> None:
        """Wait for the GPU to finish every pending region and record it (no-op on ``cpu``)."""
        pending = self._pending
        for _key, _start_ns, start, end in pending:
            start.synchronize()
            end.synchronize()
        self._pending = []
        self._next_resolve = self._resolve_every
        for item in pending:
            self._record_pair(item)

    def stats(self) -> dict[str, dict[str, float]]:
        """Per-key statistics of closed regions, after ``flush()``.

        Each value has ``count`` and ``total_ms``, ``min_ms``, ``mean_ms``, ``median_ms``,
        ``p95_ms``, ``max_ms``, ``std_ms`` in milliseconds (``std_ms`` is NaN below two regions).
        Keys appear in the order they were first started; keys with no closed region are left out.
        """
        self.flush()
        out: dict[str, dict[str, float]] = {}
        for key in self._order:
            s = self._stats[key]
            if s.count:
                out[key] = {
                    "count": s.count,
                    "total_ms": s.total_ns / 1e6,
                    "min_ms": s.min_ns / 1e6,
                    "mean_ms": s.mean_ns / 1e6,
                    "median_ms": s.percentile_ns(50) / 1e6,
                    "p95_ms": s.percentile_ns(95) / 1e6,
                    "max_ms": s.max_ns / 1e6,
                    "std_ms": s.std_ns / 1e6,
                }
        return out

    def keys(self) -> tuple[str, ...]:
        """Every key started since construction or the last ``reset()``, first-seen order."""
        return tuple(self._order)

    def reset(self) -> None:
        """Forget all statistics, open regions and pending GPU regions."""
        self._open.clear()
        self._open_ev.clear()
        self._stats.clear()
        self._order.clear()
        self._pending = []
        self._next_resolve = self._resolve_every

    def summary(self) -> str:
        """The statistics as a plain-text table, times in milliseconds."""
        rows = [_HEADER, *self._rows()]
        if len(rows) == 1:
            return "(no regions recorded)"
        widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
        lines = [
            "  ".join(
                [row[0].ljust(widths[0])]
                + [c.rjust(w) for c, w in zip(row[1:], widths[1:], strict=True)]
            )
            for row in rows
        ]
        return "\n".join(lines)

    def __rich__(self) -> Table:
        from rich.table import Table

        table = Table(title="pipeprof regions")
        for name in _HEADER:
            table.add_column(name, justify="left" if name == "region" else "right")
        for row in self._rows():
            table.add_row(*row)
        return table

    def _rows(self) -> list[list[str]]:
        rows = []
        for key, st in self.stats().items():
            ms = (f"{st[f]:.3f}" for f in _FIELDS[1:])
            rows.append([key, str(int(st["count"])), *ms])
        return rows

    def _new_key(self, key: object) -> list[int]:
        name = _check_key(key)
        stack: list[int] = []
        self._open[name] = stack
        self._open_ev[name] = []
        self._stats[name] = Stat()
        self._order.append(name)
        return stack

    def _unmatched(self, key: object) -> ValueError:
        _check_key(key)  # a non-str key gets its own TypeError
        open_keys = sorted(k for k, v in self._open.items() if v)
        return ValueError(
            f"Timer.end({key!r}) has no matching start({key!r}); "
            f"open regions: {open_keys or 'none'}. Call start({key!r}) first."
        )

    def _make_event(self) -> Event:
        assert self._factory is not None  # set in __init__ whenever the backend is cuda
        return self._factory()

    def _end_cuda(self, key: str) -> None:
        try:
            start = self._open_ev[key].pop()
        except (KeyError, IndexError, TypeError):
            raise self._unmatched(key) from None
        start_ns = self._open[key].pop()
        free = self._free
        end = free.pop() if free else self._make_event()
        end.record()
        pending = self._pending
        pending.append((key, start_ns, start, end))
        if len(pending) > self._next_resolve:
            self._resolve_ready()

    def _resolve_ready(self) -> None:
        """Record the pending pairs the GPU has finished, without blocking."""
        waiting = []
        for item in self._pending:
            if item[3].query() and item[2].query():
                self._record_pair(item)
            else:
                waiting.append(item)
        self._pending = waiting
        self._next_resolve = len(waiting) + self._resolve_every

    def _record_pair(self, item: tuple[str, int, Event, Event]) -> None:
        key, start_ns, start, end = item
        duration = round(start.elapsed_time(end) * 1e6)  # milliseconds -> nanoseconds
        self._free += (start, end)
        self._stats[key].add(duration)
        if self._sink is not None:
            self._sink(key, start_ns, duration)
