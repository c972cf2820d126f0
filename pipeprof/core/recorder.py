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
is subtracted from every enclosing stage up to and including the innermost absolute one, so
``load`` is ``__getitem__`` minus the transform, as the stage tree defines it (docs/usage.md),
even when the transform runs inside a ``pipeprof.stage`` of ``__getitem__``.

There is no stack of open stages. Each thread has a ``_State``: the innermost open stage's path
(for relative children's paths), where it records (``sink``) and ``detached``, a running total
of the ns spent in detached stages. A stage notes ``detached`` when it opens (``d0``); at its
close the growth since, ``detached - d0``, is the time of the detached stages inside it, so its
self time is ``dur - (detached - d0)``. An absolute stage then sets ``detached = d0 + dur``: its
own duration replaces whatever was detached inside it (those stages are in it), so an enclosing
stage subtracts each directly nested absolute stage once, and siblings add up. A relative stage
leaves ``detached`` as it is: what was detached inside it is detached from its parents too.
When nothing is left open on the thread the total restarts at 0 (small ints are cheaper).
Each close sets the thread's state from what its own open saved (the path; for an absolute stage,
``d0 + dur``), so a close that an exception skipped leaves no trace in later records.

A thread with nothing open (a dataset's helper thread) names relative stages under the pipeline
thread's innermost stage (``_main``: the thread that made or reset the recorder). Time spent in
one thread is never subtracted from a stage of another.

A record is ``start, self_ns`` under its path; a record of ``n`` items at once (a batched fetch,
``__getitems__``) goes under ``(path, n)``, its self time covering the ``n`` items.

Beside the timings a sink may hold, under the key ``COUNTS``, a dict of aggregates a collector
keeps per process (``counts(sink)``: h5py reads by dataset, collect/hdf5.py). They travel with
the timings (``pack`` hands them over as ``payload["counts"]``) and are summed by the Session
(``merge_counts`` in core/session.py), so they stay bounded and belong to the same iteration.

NOTE [ Whose records ]
Profiling is on while at least one profile runs in the process (``begin``/``end`` count them),
and off again, with nothing kept, when the last one ends. Records go to a *sink*: while a profiled
iteration runs its pipeline on a thread (``enter``/``leave`` around its ``next()``), what that
thread records is that iteration's; anything else (the loop's own ``pipeprof.stage`` regions, a
dataset's helper threads, a worker process) goes to the process's shared sink (``raw``, one dict
for the recorder's life: drains and resets empty it in place), which the first profile to begin
drains. So concurrent profiles in two threads and a ``profile()`` nested in a profiled loop each
keep their own records. A stage records into the sink its thread had when it opened.
"""

from __future__ import annotations

import functools
import importlib
import os
import struct
import sys
import threading
import time
import types
from array import array
from typing import Any, cast

from pipeprof.core.stats import Stat

clock = time.perf_counter_ns
COUNTS = "\x00counts"  # the key of a collector's aggregates in a sink (see the module's doc)


def counts(sink: dict[Any, list[int]]) -> dict[str, Any]:
    """The aggregates kept in ``sink`` beside its timings (created empty on first use)."""
    found = sink.get(COUNTS)
    if found is None:
        found = sink[COUNTS] = cast("list[int]", {})
    return cast("dict[str, Any]", found)


class _State:
    """One thread's place among the stages (NOTE [ Stage paths and self time ]): the innermost
    open stage's path (None: none open), the ns spent in detached stages so far, and where the
    thread records now (NOTE [ Whose records ])."""

    __slots__ = ("detached", "path", "sink")

    def __init__(self, sink: dict[Any, list[int]]) -> None:
        self.detached = 0
        self.path: str | None = None
        self.sink = sink


class _Local(threading.local):
    """A ``_State`` per thread: a dataset may time work in its own thread pool. A slotted object
    behind one thread-local read: the hot path reads and writes its fields at slot cost."""

    def __init__(self, sink: dict[Any, list[int]]) -> None:
        self.st = _State(sink)


class Recorder:
    """Timings of one process, kept raw until ``drain`` packs them for the session.

    The hot path only appends ``start, self_ns`` to a per-path list (NOTE [ Stage paths and self
    time ]); the aggregation into ``Stat``s runs later, in bulk, in the main process.
    ``enabled`` is False until a profile is active in this process; while disabled, stages cost
    one attribute read. ``track`` names the process in traces (``main``, ``worker0``).
    """

    def __init__(self) -> None:
        self.enabled = False
        self.active = 0  # profiles running in this process (NOTE [ Whose records ])
        self._lock = threading.Lock()
        self.track = "main"
        self.pid = os.getpid()
        self.raw: dict[Any, list[int]] = {}  # the shared sink
        self._local = _Local(self.raw)
        self._main = self._local.st  # the state of the thread that runs the pipeline
        self.ranges: Any = None  # NVTX, while on (NOTE [ NVTX ranges ] in collect/ranges.py)

    @property
    def innermost(self) -> str | None:
        """The path of this thread's innermost open stage; None when none is open."""
        return self._local.st.path

    def reset(self, track: str) -> None:
        """Start afresh as ``track`` (a forked worker inherits its parent's recorder)."""
        self.track = track
        self.pid = os.getpid()
        self.active = 0
        self.raw.clear()
        self._local = _Local(self.raw)
        self._main = self._local.st

    def begin(self) -> tuple[dict[Any, list[int]], bool]:
        """A profile starts: profiling is on. Returns its own sink and whether it is the first
        profile running, which also takes the shared sink's records (NOTE [ Whose records ])."""
        with self._lock:
            first = self.active == 0
            if first:
                self.raw.clear()  # nothing recorded before a profile ran belongs to it
            self.active += 1
            self.enabled = True
        return {}, first

    def end(self) -> None:
        """A profile ended; when it was the last one, profiling is off and nothing is kept."""
        with self._lock:
            self.active = max(0, self.active - 1)
            if not self.active:
                self.enabled = False
                self.raw.clear()

    def enter(self, sink: dict[Any, list[int]] | None) -> dict[Any, list[int]]:
        """This thread records into ``sink`` (None: the shared one) until ``leave``; returns the
        sink it had."""
        st = self._local.st
        before, st.sink = st.sink, self.raw if sink is None else sink
        return before

    def leave(self, before: dict[Any, list[int]]) -> None:
        self._local.st.sink = before

    def open(self, path: str) -> list[Any]:
        """Open the stage ``path``; ``close`` (or ``discard``) the frame this returns."""
        st = self._local.st
        frame = [path, 0, st, st.path, st.detached, st.sink]
        st.path = path
        frame[1] = clock()
        return frame

    def close(self, frame: list[Any], n: int = 1, detach: bool = False) -> int:
        """Close ``frame``; record its self time for ``n`` items; return its inclusive ns.
        ``detach``: an absolute stage (NOTE [ Stage paths and self time ])."""
        end = clock()
        path, start, st, prev, d0, sink = frame
        dur: int = end - start
        st.path = prev
        own = dur + d0 - st.detached
        if prev is None:
            st.detached = 0
        elif detach:
            st.detached = d0 + dur
        key = path if n == 1 else (path, n)
        try:
            raw = sink[key]
        except KeyError:
            raw = sink[key] = []
        raw += (start, own)  # one call: threads never interleave a record
        return dur

    def discard(self, frame: list[Any]) -> None:
        """Drop an open frame without recording it (what was detached inside it stays so)."""
        st, prev = frame[2], frame[3]
        st.path = prev
        if prev is None:
            st.detached = 0

    def add(self, path: str, ns: int, n: int = 1, start: int = 0) -> None:
        """Record ``ns`` nanoseconds spent in ``path`` for ``n`` items, starting at ``start``."""
        sink = self.sink
        key = path if n == 1 else (path, n)
        sink.setdefault(key, []).extend((start, ns))

    @property
    def sink(self) -> dict[Any, list[int]]:
        """Where this thread records now (NOTE [ Whose records ])."""
        return self._local.st.sink

    def child_path(self, name: str) -> str:
        """``name`` under the innermost open stage of this thread; in a helper thread with none
        open, under the pipeline thread's (a pool decoding in ``__getitems__``: ``load/decode``)."""
        parent = self._local.st.path
        if parent is None:
            parent = self._main.path
        return name if parent is None else f"{parent}/{name}"

    def drain(self, sink: dict[Any, list[int]] | None = None) -> dict[str, Any]:
        """Take what was recorded into ``sink`` (default: this thread's) since the last drain,
        packed for transport (see ``pack``); ``events`` is 0 when there was nothing."""
        return pack(self.sink if sink is None else sink, self.track, self.pid)


# int64 count -> its Struct. Native ``n`` (ssize_t) where it is 8 bytes: the same bytes as ``q``,
# but it converts a two-digit int (any clock reading) in a third of the time.
_INT64 = "n" if struct.calcsize("n") == 8 else "q"
_STRUCTS: dict[int, struct.Struct] = {}


def pack(sink: dict[Any, list[int]], track: str, pid: int) -> dict[str, Any]:
    """Take the records out of ``sink`` as they travel (NOTE [ Deferred aggregation ] in
    core/session.py): per key the flat ``start, self_ns`` pairs as int64 bytes, which pickle and
    unpickle as one copy. A worker pays a few tens of ns per record here; the aggregation into
    ``Stat``s happens later, in bulk, off the training loop's path.

    Each list is swapped for an empty one, so the keys stay (a recording thread finds its list
    at the cost of a dict read) and the sink dict is the same object (states hold it)."""
    packed: dict[Any, bytes] = {}
    first: int | None = None
    events = 0
    extra = cast("dict[str, Any] | None", sink.pop(COUNTS, None))  # travels as it is
    for key, flat in list(sink.items()):
        if not flat:
            continue
        sink[key] = []
        flat = flat[:]  # a helper thread that found the old list may still append to it
        k = len(flat)
        s = _STRUCTS.get(k)
        if s is None:
            if len(_STRUCTS) >= 256:
                _STRUCTS.clear()
            s = _STRUCTS[k] = struct.Struct(f"{k}{_INT64}")
        packed[key] = s.pack(*flat)
        lo = flat[0]  # one thread's records of a key close in the order they start
        first = lo if first is None or lo < first else first
        events += k
    out = {"raw": packed, "track": track, "pid": pid, "first_ns": first, "events": events // 2}
    if extra:
        out["counts"] = extra
    return out


def aggregate(packed: list[tuple[bytes, int]]) -> tuple[Stat, Any, Any]:
    """One path's packed records (several drains, each chunk with its items per record) as a
    Stat, its starts and its self times."""
    flat = array("q")
    items = None
    for chunk, n in packed:
        if n != 1 and items is None:
            items = array("q", [1]) * (len(flat) // 2)
        flat.frombytes(chunk)
        if items is not None:
            items += array("q", [n]) * (len(chunk) // 16)
    starts, durs = flat[0::2], flat[1::2]
    return Stat.of_many(durs, items), starts, durs


_recorder = Recorder()
_ONE: Any = object()  # timed_call1 called with no positional argument for ``fn``


def recorder() -> Recorder:
    """This process's recorder."""
    return _recorder


class stage:
    """Time a block of code as a pipeline stage, in any process, workers included.

    The stage's path is the enclosing stage's path plus ``/name``: inside a dataset's
    ``__getitem__`` ``stage("decode")`` becomes ``load/decode``; at the top level of the loop it is
    ``decode``. Outside a profile this costs next to nothing.

    As a decorator, ``@pipeprof.stage("decode")``, every call of the function is the stage: a
    call with one positional argument goes from C straight into the timed region, 0.50 µs all
    in against a ``with`` block's 0.79 here (``benchmarks/region_cost.py``,
    docs/validation/overhead.md).

    Args:
        name: the stage's name, relative to the enclosing stage's path: non-empty and not
            starting with ``/``; it may itself contain ``/``.

    Raises:
        ValueError: ``name`` is not a non-empty string, or starts with ``/``.
        TypeError: ``@pipeprof.stage(name)`` decorates something that is not callable.
    """

    __slots__ = ("d0", "name", "path", "prev", "sink", "st", "start")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str) or not name or name[0] == "/":
            raise ValueError(f"pipeprof.stage() needs a non-empty relative name, got {name!r}")
        self.name = name
        self.st: _State | None = None

    def __enter__(self) -> None:
        rec = _recorder
        if rec.enabled:  # Recorder.open(Recorder.child_path(name)), inlined
            self.st = st = rec._local.st
            self.prev = prev = st.path
            key = (prev if prev is not None else rec._main.path, self.name)
            try:
                path = _CHILD[key]
            except KeyError:
                path = _child(key)
            self.path = st.path = path
            self.d0 = st.detached
            self.sink = st.sink
            # NVTX: open path rec
            self.start = clock()

    def __exit__(self, typ: object, exc: object, tb: object) -> None:
        st = self.st
        if st is not None:  # Recorder.close, inlined
            dur = clock() - self.start
            # NVTX: close
            self.st = None
            prev = st.path = self.prev
            own = dur + self.d0 - st.detached
            if prev is None:
                st.detached = 0
            sink = self.sink
            try:
                raw = sink[self.path]
            except KeyError:
                raw = sink[self.path] = []
            raw += (self.start, own)

    def __call__(self, fn: Any) -> Any:
        if not callable(fn):
            raise TypeError(f"@pipeprof.stage({self.name!r}) decorates a callable, got {fn!r}")
        return _StageFn(self.name, fn)


class _StageFn(functools.partial):  # type: ignore[type-arg]
    """``fn`` decorated with ``@stage(name)``: a ``functools.partial`` of ``stage_call1``, so a
    call runs no Python frame of its own before the timed region (and NVTX ranges, which swap
    ``stage_call1``'s code, cover it). Binds as a method (``__get__``)
    and pickles by name where it is what its module holds, as the function it replaces would
    (spawned workers find it there)."""

    def __new__(cls, name: str, fn: Any) -> _StageFn:
        self = super().__new__(cls, stage_call1, name, fn)
        functools.update_wrapper(self, fn)
        return self

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else types.MethodType(self, obj)

    def __reduce__(self) -> Any:
        module = getattr(self, "__module__", None) or ""
        qualname = getattr(self, "__qualname__", None) or ""
        target: Any = sys.modules.get(module)
        for part in qualname.split("."):
            target = getattr(target, part, None)
        if target is self:  # by name, as a function is
            return (_from_module, (module, qualname))
        return (_StageFn, self.args)

    def __repr__(self) -> str:
        name, fn = self.args
        return f"<stage {name!r} of {fn!r}>"


def _from_module(module: str, qualname: str) -> Any:
    target: Any = importlib.import_module(module)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


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


def timed_call1(path: str, fn: Any, x: Any = _ONE, /, *args: Any, **kwargs: Any) -> Any:
    """``fn(x)`` timed as the absolute stage ``path``: the hot path of every transform, ``load``
    and ``collate`` (about 0.4 µs a region here, docs/validation/overhead.md). ``Recorder.open`` and
    ``close(detach=True)``, inlined (NOTE [ Stage paths and self time ]). Any other call
    (``Timed``'s: ``transform(image=img)``) goes to ``timed_call``."""
    if args or kwargs or x is _ONE:
        return timed_call(path, fn, *(() if x is _ONE else (x,)), *args, **kwargs)
    rec = _recorder
    if not rec.enabled:
        return fn(x)
    st = rec._local.st
    sink = st.sink
    prev = st.path
    d0 = st.detached
    st.path = path
    # NVTX: open path rec
    start = clock()
    try:
        return fn(x)
    finally:
        d0 += clock() - start
        # NVTX: close
        st.path = prev
        own = d0 - st.detached
        st.detached = d0 if prev is not None else 0
        try:
            raw = sink[path]
        except KeyError:
            raw = sink[path] = []
        raw += (start, own)


# timed_call1's code as it is here: collect/ranges.py swaps timed_call1's code for one that also
# emits an NVTX range (made from this one's source: the "# NVTX:" lines), and the probe must not
# put a range of its own on the user's timeline
_probe_call1 = types.FunctionType(timed_call1.__code__, timed_call1.__globals__, "_probe_call1")


def stage_call1(name: str, fn: Any, x: Any = _ONE, /, *a: Any, **k: Any) -> Any:
    """``fn(x)`` timed as the relative stage ``name`` (``load/read`` inside ``load``): what
    ``with pipeprof.stage(name)`` records, on the hot path of pipeprof's own split stages and
    of ``@pipeprof.stage(name)`` (a method, or more arguments: ``fn(x, *a, **k)``). The path
    it made last for ``name`` is kept with its parent (``_LAST``): called again under the same
    stage, it skips the look-up."""
    rec = _recorder
    if not rec.enabled:
        if a or k or x is _ONE:
            return fn(*a, **k) if x is _ONE else fn(x, *a, **k)
        return fn(x)
    st = rec._local.st
    sink = st.sink
    prev = st.path
    parent = prev if prev is not None else rec._main.path
    seen, path = _LAST.get(name, _UNSEEN)  # one read: another thread may set it meanwhile
    if seen is not parent:
        try:
            path = _CHILD[parent, name]
        except KeyError:
            path = _child((parent, name))
        _LAST[name] = (parent, path)
    d0 = st.detached
    st.path = path
    # NVTX: open path rec
    start = clock()
    try:
        if a or k or x is _ONE:
            return fn(*a, **k) if x is _ONE else fn(x, *a, **k)
        return fn(x)
    finally:
        dur = clock() - start
        # NVTX: close
        st.path = prev
        own = dur + d0 - st.detached
        if prev is None:
            st.detached = 0
        try:
            raw = sink[path]
        except KeyError:
            raw = sink[path] = []
        raw += (start, own)


_CHILD: dict[tuple[str | None, str], str] = {}  # (parent path, name) -> child path
_LAST: dict[str, tuple[Any, str]] = {}  # name -> (parent path, child path), the last made
_UNSEEN = (object(), "")  # ``_LAST``'s default: a parent no path is


def _child(key: tuple[str | None, str]) -> str:
    parent, name = key
    return _CHILD.setdefault(key, name if parent is None else f"{parent}/{name}")


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


# NOTE [ Unprofiled batches ] in collect/torch/loader.py: a DataLoader's stages are timed in one
# batch in this many unless the user says otherwise (``stage_every``)
STAGE_EVERY = 8
PROBE = "\x00probe"  # the path of the in-situ probe's region (its record is dropped at once)
PROBE_CAP_NS = 50_000  # a probe that took longer was preempted: it says nothing of the region


def probe(x: Any) -> tuple[int, int]:
    """NOTE [ In-situ region cost ]
    ``measure_overhead`` times regions back to back, with warm caches: about 0.45 µs here. Between
    a worker's transforms a region costs more (0.2-2.5 µs, docs/validation/overhead.md), because the
    image work in between evicts what it touches. So each batch, where its regions run (after its
    samples' last transform, before ``collate``), a worker times one empty region from outside: the
    ns it returns are the region's open, close and record, net of the outer clock read and the empty
    call (``probe_base``, measured hot once per process). Its record is dropped; the report
    multiplies the median of these (``Session.probe``, ``overhead.in_situ_ns``) by the regions
    counted.

    That is the region's own work. Its other cost lands in the user's code: the lines the region
    brought in evicted the user's, which the user's next instructions fetch again. No probe can
    time that from inside, so a second empty region runs right after the first, warm, and the
    report counts the difference, what the cold caches cost the region, once more as displaced
    from the code around it (``overhead.displaced_ns``), for the regions that follow real work
    (``cold_share``, analyze/stages.py). With it the report states 0.6-1.1 of what a region costs
    measured side by side (benchmarks/region_insitu.py, docs/validation/overhead.md), where the cold
    probe alone stated 0.5-0.8; regions back to back, as the probe's two are, displace next to
    nothing.

    Returns ``(cold, warm)`` ns; ``(0, 0)`` when profiling is off."""
    rec = _recorder
    if not rec.enabled:
        return 0, 0
    sink = rec._local.st.sink
    raw = sink.get(PROBE)
    if raw is None:
        raw = sink[PROBE] = []
    base = probe_base()
    t0 = clock()
    _probe_call1(PROBE, _noop, x)
    t1 = clock()
    _probe_call1(PROBE, _noop, x)
    t2 = clock()
    raw.clear()  # kept in place: an empty list is skipped by ``pack`` and found hot next time
    return max(0, t1 - t0 - base), max(0, t2 - t1 - base)


def probe_base() -> int:
    """ns of one clock read and one empty call, hot: the part of a probe that is not the region
    (median of five runs of 200), measured once per process. A DataLoader's workers are handed
    the training process's (``WorkerInit`` in collect/torch/loader.py): measured in each worker,
    it cost about 1 ms a worker start, every epoch whose workers start afresh."""
    if _PROBE_BASE:
        return _PROBE_BASE[0]
    runs = []
    for _ in range(5):
        t0 = clock()
        for _ in range(200):
            clock()
            _noop(None)
        t1 = clock()
        for _ in range(200):
            pass
        runs.append((2 * t1 - t0 - clock()) // 200)
    runs.sort()
    _PROBE_BASE[:] = [max(0, runs[2])]
    return _PROBE_BASE[0]


def set_probe_base(ns: int) -> None:
    """Take ``ns`` as this process's ``probe_base()`` (a worker, from the training process)."""
    _PROBE_BASE[:] = [ns]


_PROBE_BASE: list[int] = []


_CALIBRATED: list[float] = []
