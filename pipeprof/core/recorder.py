"""The per-process recorder behind every timed stage, and ``pipeprof.stage``.

Each process (the main one and every DataLoader worker) has one ``Recorder``. A stage is timed
with two reads of ``time.perf_counter_ns`` (CLOCK_MONOTONIC on Linux: one time base for all the
processes of a machine, so worker spans line up with the main loop in a trace) and lands in a
``Stat`` per stage path, plus a bounded ring of raw spans for traces.

NOTE [ Stage paths and self time ]
Built-in stages have absolute paths (``load``, ``transform``, ``collate``). A stage opened with
``pipeprof.stage(name)`` is relative: its path is the enclosing stage's path plus ``/name``, and
its time stays inside the parent's total (``load/decode`` is part of ``load``). An absolute stage
opened inside another (a dataset's ``__getitem__`` calling its transform) is *detached*: its time
is subtracted from the enclosing stage, so ``load`` is ``__getitem__`` minus the transform, as
DESIGN.md defines it.

NOTE [ Whose records ]
Profiling is on while at least one profile runs in the process (``begin``/``end`` count them),
and off again, with nothing kept, when the last one ends. Records go to a *sink*: while a profiled
iteration runs its pipeline on a thread (``enter``/``leave`` around its ``next()``), what that
thread records is that iteration's; anything else (the loop's own ``pipeprof.stage`` regions, a
dataset's helper threads, a worker process) goes to the process's shared sink, which the first
profile to begin drains. So concurrent profiles in two threads and a ``profile()`` nested in a
profiled loop each keep their own records. A frame remembers its sink when it opens.
"""

from __future__ import annotations

import os
import threading
import time
from array import array
from typing import Any

from pipeprof.core.stats import Stat

clock = time.perf_counter_ns


class _Stack(list):  # type: ignore[type-arg]
    """One thread's open frames ``[path, detached ns, start, stack, sink]``, and where that
    thread records now (``sink``; None: the shared one). A slot, not a thread-local attribute:
    the hot path reads it at the cost of an attribute."""

    __slots__ = ("sink",)

    def __init__(self) -> None:
        super().__init__()
        self.sink: dict[str, list[int]] | None = None


class _Stacks(threading.local):
    """Open frames, one stack per thread: a dataset may time work in its own thread pool."""

    def __init__(self) -> None:
        self.stack = _Stack()


class Recorder:
    """Timings of one process, kept raw until ``drain`` turns them into ``Stat``s.

    The hot path only appends ``start, self_ns, n`` to a per-path list (see NOTE [ Stage paths and
    self time ] for the stack of open frames); the aggregation runs once per batch, vectorised.
    ``enabled`` is False until a profile is active in this process; while disabled, stages cost
    one attribute read. ``track`` names the process in traces (``main``, ``worker0``).
    """

    def __init__(self) -> None:
        self.enabled = False
        self.active = 0  # profiles running in this process (NOTE [ Whose records ])
        self._lock = threading.Lock()
        self.track = "main"
        self.pid = os.getpid()
        self.raw: dict[str, list[int]] = {}
        self._stacks = _Stacks()
        self._main = self._stacks.stack  # the stack of the thread that runs the pipeline

    @property
    def stack(self) -> list[list[Any]]:
        """This thread's open frames."""
        return self._stacks.stack

    def reset(self, track: str) -> None:
        """Start afresh as ``track`` (a forked worker inherits its parent's recorder)."""
        self.track = track
        self.pid = os.getpid()
        self.active = 0
        self.raw = {}
        self._stacks = _Stacks()
        self._main = self._stacks.stack

    def begin(self) -> tuple[dict[str, list[int]], bool]:
        """A profile starts: profiling is on. Returns its own sink and whether it is the first
        profile running, which also takes the shared sink's records (NOTE [ Whose records ])."""
        with self._lock:
            first = self.active == 0
            if first:
                self.raw = {}  # nothing recorded before a profile ran belongs to it
            self.active += 1
            self.enabled = True
        return {}, first

    def end(self) -> None:
        """A profile ended; when it was the last one, profiling is off and nothing is kept."""
        with self._lock:
            self.active = max(0, self.active - 1)
            if not self.active:
                self.enabled = False
                self.raw = {}

    def enter(self, sink: dict[str, list[int]] | None) -> dict[str, list[int]] | None:
        """This thread records into ``sink`` until ``leave``; returns the sink it had."""
        stack = self._stacks.stack
        before, stack.sink = stack.sink, sink
        return before

    def leave(self, before: dict[str, list[int]] | None) -> None:
        self._stacks.stack.sink = before

    def open(self, path: str) -> list[Any]:
        stack = self._stacks.stack
        frame = [path, 0, 0, stack, stack.sink]
        stack.append(frame)
        frame[2] = clock()
        return frame

    def close(self, frame: list[Any], n: int = 1, detach: bool = False) -> int:
        """Close ``frame``; record its self time for ``n`` items; return its inclusive ns."""
        end = clock()
        stack = frame[3]  # the stack of the thread that opened it
        while stack and stack.pop() is not frame:  # frames left open by an exception
            pass
        start: int = frame[2]
        dur = end - start
        if detach and stack:
            stack[-1][1] += dur
        sink: dict[str, list[int]] = frame[4] if frame[4] is not None else self.raw
        raw = sink.get(frame[0])
        if raw is None:
            raw = sink.setdefault(frame[0], [])
        raw += (start, dur - frame[1], n)  # one call: threads never interleave a record
        return dur

    def discard(self, frame: list[Any]) -> None:
        """Drop an open frame without recording it."""
        stack = self._stacks.stack
        while stack and stack.pop() is not frame:
            pass

    def add(self, path: str, ns: int, n: int = 1, start: int = 0) -> None:
        """Record ``ns`` nanoseconds spent in ``path`` for ``n`` items, starting at ``start``."""
        sink = self.sink
        raw = sink.get(path)
        if raw is None:
            raw = sink.setdefault(path, [])
        raw += (start, ns, n)

    @property
    def sink(self) -> dict[str, list[int]]:
        """Where this thread records now (NOTE [ Whose records ])."""
        mine = self._stacks.stack.sink
        return mine if mine is not None else self.raw

    def child_path(self, name: str) -> str:
        """``name`` under the innermost open stage of this thread; in a helper thread with none
        open, under the pipeline thread's (a pool decoding in ``__getitems__``: ``load/decode``)."""
        stack = self._stacks.stack or self._main
        return f"{stack[-1][0]}/{name}" if stack else name

    @property
    def pending(self) -> bool:
        return bool(self.sink)

    def drain(self, sink: dict[str, list[int]] | None = None) -> dict[str, Any]:
        """Take what was recorded into ``sink`` (default: this thread's) since the last drain,
        packed for transport (see ``pack``)."""
        if sink is None:
            sink = self.sink
        if sink is self.raw:
            raw, self.raw = self.raw, {}
        else:
            raw = dict(sink)
            sink.clear()
        return pack(raw, self.track, self.pid)


def pack(raw: dict[str, list[int]], track: str, pid: int) -> dict[str, Any]:
    """Records as they travel (NOTE [ Deferred aggregation ] in core/session.py): per path the
    flat ``start, self_ns, n`` triples as int64 bytes, which pickle and unpickle as one copy.
    A worker pays a few tens of ns per record here; the aggregation into ``Stat``s happens later,
    in bulk, off the training loop's path."""
    packed: dict[str, bytes] = {}
    first: int | None = None
    events = 0
    for path, flat in raw.items():
        if not flat:
            continue
        packed[path] = array("q", flat).tobytes()
        lo = flat[0]  # a path's records close in the order they start (no stage nests itself)
        first = lo if first is None or lo < first else first
        events += len(flat) // 3
    return {"raw": packed, "track": track, "pid": pid, "first_ns": first, "events": events}


def aggregate(packed: list[bytes]) -> tuple[Stat, Any, Any]:
    """One path's packed records (several drains) as a Stat, its starts and its self times."""
    flat = array("q")
    for chunk in packed:
        flat.frombytes(chunk)
    starts, durs, ns = flat[0::3], flat[1::3], flat[2::3]
    return Stat.of_many(durs, ns), starts, durs


_recorder = Recorder()


def recorder() -> Recorder:
    """This process's recorder."""
    return _recorder


class stage:
    """Time a block of code as a pipeline stage, in any process, workers included.

    The stage's path is the enclosing stage's path plus ``/name``: inside a dataset's
    ``__getitem__`` ``stage("decode")`` becomes ``load/decode``; at the top level of the loop it is
    ``decode``. A name may itself contain ``/``. Outside a profile this costs next to nothing.
    """

    __slots__ = ("frame", "name")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name or name.startswith("/"):
            raise ValueError(f"pipeprof.stage() needs a non-empty relative name, got {name!r}")
        self.name = name
        self.frame: list[Any] | None = None

    def __enter__(self) -> None:
        rec = _recorder
        if rec.enabled:  # Recorder.open(Recorder.child_path(name)), inlined
            stack = rec._stacks.stack
            parent = stack or rec._main
            path = f"{parent[-1][0]}/{self.name}" if parent else self.name
            frame = self.frame = [path, 0, 0, stack, stack.sink]
            stack.append(frame)
            frame[2] = clock()

    def __exit__(self, *exc: object) -> None:
        if self.frame is not None:
            _recorder.close(self.frame)
            self.frame = None


def timed_call(path: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn(*args, **kwargs)`` as the absolute stage ``path``, detached from any enclosing
    stage (see NOTE [ Stage paths and self time ]). One positional argument: ``timed_call1``."""
    if not _recorder.enabled:
        return fn(*args, **kwargs)
    return timed_call1(path, _Call(fn, args, kwargs), None)


class _Call:
    __slots__ = ("args", "fn", "kwargs")

    def __init__(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs

    def __call__(self, _: Any) -> Any:
        return self.fn(*self.args, **self.kwargs)


def timed_call1(path: str, fn: Any, x: Any) -> Any:
    """``fn(x)`` timed as the absolute stage ``path``: the hot path of every transform, ``load``
    and ``collate`` (about 0.4 µs a region here, docs/overhead.md). A frame is ``[path, ns of
    detached children]``: all a nested stage reads or writes of its parent."""
    rec = _recorder
    if not rec.enabled:
        return fn(x)
    stack = rec._stacks.stack
    sink = stack.sink
    frame = [path, 0]
    stack.append(frame)
    start = clock()
    try:
        return fn(x)
    finally:
        dur = clock() - start
        if stack and stack[-1] is frame:
            stack.pop()
        else:  # frames an exception left open above this one
            _unwind(stack, frame)
        if stack:
            stack[-1][1] += dur
        if sink is None:
            sink = rec.raw
        raw = sink.get(path)
        if raw is None:
            raw = sink.setdefault(path, [])
        raw += (start, dur - frame[1], 1)


def stage_call1(name: str, fn: Any, x: Any) -> Any:
    """``fn(x)`` timed as the relative stage ``name`` (``load/read`` inside ``load``): what
    ``with pipeprof.stage(name)`` records, on the hot path of pipeprof's own split stages."""
    rec = _recorder
    if not rec.enabled:
        return fn(x)
    stack = rec._stacks.stack
    parent = stack or rec._main
    key = (parent[-1][0], name) if parent else ("", name)
    path = _CHILD.get(key)
    if path is None:
        path = _CHILD.setdefault(key, f"{key[0]}/{name}" if key[0] else name)
    sink = stack.sink
    frame = [path, 0]
    stack.append(frame)
    start = clock()
    try:
        return fn(x)
    finally:
        dur = clock() - start
        if stack and stack[-1] is frame:
            stack.pop()
        else:
            _unwind(stack, frame)
        if sink is None:
            sink = rec.raw
        raw = sink.get(path)
        if raw is None:
            raw = sink.setdefault(path, [])
        raw += (start, dur - frame[1], 1)


_CHILD: dict[tuple[str, str], str] = {}  # (parent path, name) -> child path


def _unwind(stack: list[Any], frame: list[Any]) -> None:
    """Pop the frames above ``frame`` (an exception skipped their close) and ``frame`` itself."""
    while stack and stack.pop() is not frame:
        pass


def measure_overhead(batches: int = 4, paths: int = 8, per_path: int = 32) -> float:
    """Nanoseconds one timed region costs in this process, all in (median of three runs).

    Mimics a worker: ``paths`` stages of ``per_path`` regions per batch (``timed_call1`` around a
    no-op, the call itself not counted), then the per-batch drain and the pickling that carries
    the records to the main process. Measured once per process (a few milliseconds) and kept:
    the machine does not change between profiles. Runs on this process's recorder, in a sink
    of its own, so it leaves nothing behind.
    """
    if _CALIBRATED:
        return _CALIBRATED[0]
    import pickle

    rec = _recorder
    names = [f"stage{i}" for i in range(paths)]
    n = batches * paths * per_path
    results = []
    was, rec.enabled = rec.enabled, True
    before = rec.enter({})
    try:
        for _ in range(3):
            t0 = clock()
            for _ in range(batches):
                for name in names:
                    for _ in range(per_path):
                        timed_call1(name, _noop, None)
                pickle.dumps(rec.drain(), protocol=pickle.HIGHEST_PROTOCOL)
            t1 = clock()
            for _ in range(n):  # the calls themselves are the user's
                _noop(None)
            results.append((2 * t1 - t0 - clock()) / n)
    finally:
        rec.leave(before)
        rec.enabled = was
    results.sort()
    _CALIBRATED.append(max(0.0, results[1]))
    return _CALIBRATED[0]


def _noop(x: Any) -> Any:
    return x


_CALIBRATED: list[float] = []
