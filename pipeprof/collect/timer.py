"""A Deep500-style region timer that works on its own, in any framework.

``Timer`` measures named regions of a training loop (``Epoch``, ``Batch``, ``Forward``, ...) with
``start(key)``/``end(key)`` or ``with timer.region(key):``. Regions nest and overlap freely, and a
key may be re-entered while it is open (each key keeps its own LIFO stack of open starts).
Durations are aggregated per key into a bounded-memory ``Stat``, so memory does not grow with the
number of regions.

NOTE [ CUDA event batching ]
A CPU clock around GPU work measures the launch, not the work. The ``cuda`` backend records a
``torch.cuda.Event`` on the current stream at ``start`` and another at ``end`` and keeps the pair
pending: synchronising at every ``end`` would stall the CPU's run-ahead and distort the loop being
measured. Once more than ``resolve_every`` pairs are pending, one pass records those whose events
``query()`` as done, which never blocks; the rest wait for the next pass (after another
``resolve_every`` ends, so a lagging GPU costs no per-step scan) or for ``flush()``/``stats()``,
which synchronise on them. Resolved events are recorded again by later regions.
"""

from __future__ import annotations

import functools
import operator
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pipeprof.core.stats import Stat, bucket_of

if TYPE_CHECKING:
    from rich.table import Table

#: The Deep500 region keys; any other non-empty string works as a key too.
DEFAULT_KEYS = ("Epoch", "Batch", "Forward", "Backward", "Comm", "IO", "Other")
EPOCH, BATCH, FORWARD, BACKWARD, COMM, IO, OTHER = DEFAULT_KEYS

Backend = Literal["cpu", "cuda", "auto"]
#: Called as ``sink(key, start_ns, duration_ns)`` when a region's duration becomes known.
Sink = Callable[[str, int, int], None]

_FIELDS = ("count", "total_ms", "mean_ms", "median_ms", "p95_ms", "min_ms", "max_ms", "std_ms")
_HEADER = ["region", *(f.replace("_ms", " ms") for f in _FIELDS)]
_FOLD_EVERY = 256  # durations buffered per key before folding: bounds memory, amortises the fold
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


class _Key:
    """One key's state: open starts (LIFO), durations not yet folded, and their ``Stat``."""

    __slots__ = ("buf", "events", "name", "stack", "stat")

    def __init__(self, name: str) -> None:
        self.name = name
        self.stack: list[int] = []  # clock() at each open start, ns
        self.events: list[Event | None] = []  # the open starts' events (cuda; None: CPU clock)
        self.buf: list[int] = []  # durations in ns, folded into ``stat`` in batches
        self.stat = Stat()

    def fold(self) -> None:
        """Fold ``buf`` into ``stat``: as ``Stat.add`` of each, at a third of the cost."""
        buf = self.buf
        if not buf:
            return
        low = min(buf)
        per = buf if low >= 0 else [d if d > 0 else 0 for d in buf]  # Stat.add clamps at 0
        part = {
            "count": len(buf),
            "total_ns": sum(buf),
            "min_ns": max(low, 0),
            "max_ns": max(per),
            "sum_sq": float(sum(map(operator.mul, per, per))),
            "hist": Counter(map(bucket_of, per)),
        }
        self.stat.merge(Stat.from_dict(part))
        buf.clear()


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


def _no_events() -> Event:
    raise AssertionError("the cpu backend records no events")


def resolve_backend(backend: str) -> str:
    """``"cpu"`` or ``"cuda"``: what a Timer made with ``backend`` uses at first (NOTE [ Auto
    backend ]: ``"auto"`` may turn to ``"cuda"`` later)."""
    if backend == "auto":
        return "cuda" if cuda_in_use() else "cpu"
    if backend not in ("cpu", "cuda"):
        raise ValueError(f"backend must be 'cpu', 'cuda' or 'auto', not {backend!r}")
    return backend


# NOTE [ Auto backend ]
# ``"auto"`` times with CUDA events once this process has initialised CUDA itself (the model or a
# batch went to the GPU), never before: recording an event would create a CUDA context (hundreds
# of MB of GPU memory, and a context on GPU 0 for every rank of a CPU-only torchrun job), which
# the user's code can see (``torch.cuda.is_initialized()``), and a CPU-only loop on a machine
# with a GPU would have its steps bracketed by events on an idle GPU. Until then the timer runs
# on the CPU clock and checks at each region's start (``poll_cuda``; the Profiler also checks at
# each step); where torch sees no GPU at all, it stops checking. A region open when the timer
# turns to CUDA ends on the CPU clock (the GPU had run nothing of the user's before it).


def cuda_in_use() -> bool:
    """Whether torch is imported and this process has initialised CUDA (never imports torch
    or initialises CUDA to find out)."""
    torch = sys.modules.get("torch")
    return torch is not None and bool(torch.cuda.is_initialized())


_UNSEEN = object()  # an auto Timer made before torch was imported


def _cuda_possible() -> bool:
    """False once torch is imported and sees no GPU: ``auto`` can stop checking."""
    torch = sys.modules.get("torch")
    return torch is None or bool(torch.cuda.is_available())


class Timer:
    """Named region timer with per-key statistics in milliseconds.

    Statistics: count, total, min, mean, max and std are exact; median and p95 come from a
    log-linear histogram and are within about 3% of the exact values. Regions still open are
    not counted. Memory is bounded per key, whatever the number of regions. Not thread-safe:
    use one Timer per thread.

    Args:
        backend: ``"cpu"`` times with ``clock``; ``"cuda"`` times GPU work with CUDA events
            (see NOTE [ CUDA event batching ]); ``"auto"`` uses ``cuda`` once this process has
            initialised CUDA, ``cpu`` until then (NOTE [ Auto backend ]).
        clock: the CPU clock, in integer nanoseconds (default ``time.perf_counter_ns``).
        sink: called as ``sink(key, start_ns, duration_ns)`` for every region when its
            duration is known; ``start_ns`` is ``clock()`` at ``start``. None: none.
        resolve_every: on the ``cuda`` backend, how many regions may wait for the GPU before
            a pass records those it has finished, without blocking (NOTE [ CUDA event
            batching ]); 0 or more.
        event_factory: makes the ``cuda`` backend's events; None:
            ``torch.cuda.Event(enable_timing=True)``.
        host_sink: on the ``cuda`` backend, called as ``sink`` is at each ``end``, with the CPU
            clock's duration (what the loop's thread spent in the region: a step's split is of
            that time); None: none.
        on_cuda: called as ``on_cuda(timer)`` when an ``"auto"`` timer turns to CUDA events;
            None: none.

    Raises:
        ValueError: ``backend`` is not ``"cpu"``, ``"cuda"`` or ``"auto"``, or
            ``resolve_every`` is negative.
        RuntimeError: ``"cuda"`` without ``event_factory`` where torch is not installed with
            CUDA or sees no GPU.
    """

    __slots__ = (
        "_auto",
        "_clock",
        "_cuda",
        "_event_factory",
        "_factory",
        "_free",
        "_host_sink",
        "_keys",
        "_next_resolve",
        "_on_cuda",
        "_pending",
        "_regions",
        "_resolve_every",
        "_sink",
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
        host_sink: Sink | None = None,
        on_cuda: Callable[[Timer], None] | None = None,
    ) -> None:
        if resolve_every < 0:
            raise ValueError(f"resolve_every must be >= 0, not {resolve_every}")
        #: The backend in use, ``"cpu"`` or ``"cuda"`` (``"auto"`` resolved: NOTE [ Auto backend ]).
        self.backend = resolve_backend(backend)
        self._cuda = self.backend == "cuda"
        # auto and not yet CUDA: _UNSEEN until torch is imported, then whether it sees a GPU
        self._auto: object = False
        if backend == "auto" and not self._cuda:
            self._auto = _cuda_possible() if "torch" in sys.modules else _UNSEEN
        self._event_factory = event_factory
        self._on_cuda = on_cuda
        self._factory = _no_events
        if self._cuda:
            self._factory = event_factory or _cuda_event_factory()
        self._clock = clock
        self._sink = sink
        self._host_sink = host_sink
        self._resolve_every = resolve_every
        self._keys: dict[str, _Key] = {}  # in first-seen order
        self._regions: dict[str, _Region] = {}
        self._pending: list[tuple[_Key, int, Event, Event]] = []  # (key, start_ns, start, end)
        self._free: list[Event] = []  # resolved events, recorded again by later regions
        self._next_resolve = resolve_every

    def start(self, key: str) -> None:
        """Open a region named ``key``; it closes at the matching ``end(key)`` (LIFO per key).

        Args:
            key: the region's name: ``"Forward"``, any non-empty string.

        Raises:
            TypeError: ``key`` is not a str.
            ValueError: ``key`` is empty.
        """
        try:
            k = self._keys[key]
        except (KeyError, TypeError):
            k = self._keys[_check_key(key)] = _Key(key)
        if self._cuda or (self._auto and self.poll_cuda()):
            event = self._free.pop() if self._free else self._factory()
            k.stack.append(self._clock())
            event.record()
            k.events.append(event)
        else:
            k.stack.append(self._clock())

    def poll_cuda(self) -> bool:
        """Whether the timer uses CUDA events: an ``auto`` timer turns to them here once the
        process has initialised CUDA (NOTE [ Auto backend ])."""
        if self._cuda:
            return True
        if not self._auto:
            return False
        if not cuda_in_use():
            if self._auto is _UNSEEN and "torch" in sys.modules:  # asked once torch is there
                self._auto = _cuda_possible()
            return False
        self._factory = self._event_factory or _cuda_event_factory()
        self.backend, self._cuda, self._auto = "cuda", True, False
        for k in self._keys.values():  # open regions end on the CPU clock
            k.events[:0] = [None] * (len(k.stack) - len(k.events))
        if self._on_cuda is not None:
            self._on_cuda(self)
        return True

    def set_sinks(self, sink: Sink | None, host_sink: Sink | None = None) -> None:
        """Where closed regions go from now on.

        Args:
            sink: called as ``sink(key, start_ns, duration_ns)`` for every region when its
                duration is known; None: none.
            host_sink: on the ``cuda`` backend, called the same way at each ``end`` with the
                CPU clock's duration; None: none.
        """
        self._sink, self._host_sink = sink, host_sink

    def end(self, key: str) -> None:
        """Close the innermost open region named ``key``.

        Args:
            key: the name given to ``start``.

        Raises:
            ValueError: no region named ``key`` is open.
            TypeError: ``key`` is not a str.
        """
        if self._cuda:
            self._end_cuda(key)
            return
        now = self._clock()
        try:
            k = self._keys[key]
            start_ns = k.stack.pop()
        except (KeyError, IndexError, TypeError):
            raise self._unmatched(key) from None
        duration = now - start_ns
        buf = k.buf
        buf.append(duration)
        if len(buf) >= _FOLD_EVERY:
            k.fold()
        sink = self._sink
        if sink is not None:
            sink(key, start_ns, duration)

    def region(self, key: str) -> _Region:
        """``with timer.region(key):`` times the block, closing it even if the block raises.

        Args:
            key: the region's name: ``"Forward"``, any non-empty string.

        Returns:
            A reusable context manager (one per key) that calls ``start(key)`` and
            ``end(key)``.

        Raises:
            TypeError: ``key`` is not a str.
            ValueError: ``key`` is empty.
        """
        try:
            return self._regions[key]
        except (KeyError, TypeError):
            region = self._regions[_check_key(key)] = _Region(self, key)
            return region

    def flush(self) -> None:
        """Wait for the GPU to finish every pending region and record it (no-op on ``cpu``)."""
        pending = self._pending
        for _k, _start_ns, start, end in pending:
            start.synchronize()
            end.synchronize()
        self._pending = []
        self._next_resolve = self._resolve_every
        for item in pending:
            self._record_pair(item)

    def stats(self) -> dict[str, dict[str, float]]:
        """Per-key statistics of closed regions, after ``flush()``.

        Each value has ``count`` and ``total_ms``, ``mean_ms``, ``median_ms``, ``p95_ms``,
        ``min_ms``, ``max_ms``, ``std_ms`` in milliseconds (``std_ms`` is NaN below two regions).
        Keys appear in the order they were first started; keys with no closed region are left out.
        """
        self.flush()
        out: dict[str, dict[str, float]] = {}
        for key, k in self._keys.items():
            k.fold()
            s = k.stat
            if s.count:
                out[key] = {
                    "count": s.count,
                    "total_ms": s.total_ns / 1e6,
                    "mean_ms": s.mean_ns / 1e6,
                    "median_ms": s.percentile_ns(50) / 1e6,
                    "p95_ms": s.percentile_ns(95) / 1e6,
                    "min_ms": s.min_ns / 1e6,
                    "max_ms": s.max_ns / 1e6,
                    "std_ms": s.std_ns / 1e6,
                }
        return out

    def keys(self) -> tuple[str, ...]:
        """Every key started since construction or the last ``reset()``, first-seen order."""
        return tuple(self._keys)

    def reset(self) -> None:
        """Forget all statistics, open regions and pending GPU regions."""
        self._keys.clear()
        self._pending = []
        self._next_resolve = self._resolve_every

    def summary(self) -> str:
        """The statistics as a plain-text table, times in milliseconds."""
        rows = [_HEADER, *self._rows()]
        if len(rows) == 1:
            return "(no regions recorded)"
        widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
        line = "  ".join([f"{{:<{widths[0]}}}", *(f"{{:>{w}}}" for w in widths[1:])])
        return "\n".join(line.format(*row) for row in rows)

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

    def _unmatched(self, key: object) -> ValueError:
        _check_key(key)  # a non-str key gets its own TypeError
        open_keys = [name for name, k in self._keys.items() if k.stack]
        return ValueError(
            f"Timer.end({key!r}) has no matching start({key!r}); "
            f"open regions: {open_keys or 'none'}. Call start({key!r}) first."
        )

    def _end_cuda(self, key: str) -> None:
        try:
            k = self._keys[key]
            start = k.events.pop()
        except (KeyError, IndexError, TypeError):
            raise self._unmatched(key) from None
        start_ns = k.stack.pop()  # both stacks before anything that may raise
        if start is None:  # opened before the timer turned to CUDA: the CPU clock's
            self._end_host(k, start_ns)
            return
        end = self._free.pop() if self._free else self._factory()
        end.record()
        self._pending.append((k, start_ns, start, end))
        if self._host_sink is not None:
            self._host_sink(key, start_ns, self._clock() - start_ns)
        if len(self._pending) > self._next_resolve:
            self._resolve_ready()

    def _end_host(self, k: _Key, start_ns: int) -> None:
        duration = self._clock() - start_ns
        k.buf.append(duration)
        if len(k.buf) >= _FOLD_EVERY:
            k.fold()
        for sink in (self._sink, self._host_sink):
            if sink is not None:
                sink(k.name, start_ns, duration)

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

    def _record_pair(self, item: tuple[_Key, int, Event, Event]) -> None:
        k, start_ns, start, end = item
        duration = round(start.elapsed_time(end) * 1e6)  # milliseconds -> nanoseconds
        self._free += (start, end)
        k.buf.append(duration)
        if len(k.buf) >= _FOLD_EVERY:
            k.fold()
        if self._sink is not None:
            self._sink(k.name, start_ns, duration)
