"""The Session: everything a profile measured, as plain saveable data.

A Session is the only contract between collection (collectors, samplers) and output (analysis,
renderers). It holds aggregates whose size grows with the number of stages and workers, never
with the number of batches, plus bounded rings of raw spans and recent batches for traces.
``save``/``load`` round-trip it as JSON; ``from_dict`` fills defaults for keys an older file lacks.

NOTE [ Deferred aggregation ]
A worker's records reach the main process with each batch, packed as bytes (``recorder.pack``):
unpickling them inside the loop's ``next()`` is one copy, and ``merge`` only queues them. They are
folded into ``stages`` and ``events`` in bulk, vectorised, by ``settle``: when a report or a file is
made (``to_dict``, ``analyze``), when a profile stops (``settle_counted``), and, in long runs, on a
short-lived background thread once ``SETTLE_EVENTS`` records are pending, a chunk at a time so the
loop's thread never waits long for the GIL. Not at the end of each pass over a loader: a fold has a
fixed cost (NumPy, per stage and process: about 0.8 ms an epoch on the JPEG pipeline of
docs/validation/overhead.md, for a few thousand records), which one fold at the end pays once.
Their spans stay packed until something reads ``spans`` through ``settled()`` (a report, a file,
a trace). The rest of a batch's bookkeeping (its wait into ``wait``, ``starved`` and
``handover``, its worker's busy time, pipeprof's costs) is queued too (``defer``) and run, in
order, at the end of each pass over a loader, when the session settles, and by the loop's thread
every ``DEFER_LIMIT`` batches: a pass's batches done in one loop cost about 5 µs each, where
each alone, between two waits for a worker, cost three to four times that
(docs/validation/overhead.md).
The loop's thread's batches on the short path (collect/torch/loader.py) are queued a row of up
to BATCH_ROWS at a time and added with NumPy (``defer_batch``): one tuple each on the way.
Read ``stages`` and ``spans`` through ``settled()``, and the rest once a pass is over or the
session settled. The folds' CPU time (at a pass's end, at a profile's stop, on the settling
thread) is pipeprof's own cost and lands in ``costs["settle_ns"]``.
"""

from __future__ import annotations

import errno
import json
import os
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import islice, repeat
from pathlib import Path
from typing import Any, Literal

from pipeprof.core.recorder import aggregate
from pipeprof.core.stats import Stat

SCHEMA_VERSION = 1
SPAN_LIMIT = 200_000  # raw spans kept for traces (about 10 MB); aggregates are exact regardless
# The latest spans a snapshot of a running loop keeps (``Session.save(spans=)``): what bounds its
# cost whatever the run's length (NOTE [ Snapshots ] in profiler.py)
SNAPSHOT_SPANS = 5_000  # and of the batch and step rings' records
BATCH_LIMIT = 10_000  # recent per-batch records kept
STEP_RING = 10_000  # recent loop steps kept for timelines
SETTLE_EVENTS = 65_536  # pending records that start a background settle (about 1.5 MB)
SETTLE_CHUNK = 8_192  # records folded between two releases of the GIL
BATCH_ROWS = 256  # short-path batches queued as one (``defer_batch``)
DEFER_LIMIT = 1_024  # batches' bookkeeping queued (``defer``) before the loop's thread runs it
# Per-step figures of a training loop (NOTE [ Step attribution ] in collect/loop.py), in ns
STEP_PARTS = (
    "wait", "starved", "handover", "transfer", "user_transfer", "compute", "comm", "overhead",
    "step",
)  # fmt: skip

Mode = Literal["loader", "loop"]
Framework = Literal["torch", "tf"]


IDS_KEPT = 1024  # NOTE [ Sample fingerprints ] in core/batch.py: fingerprints kept a worker
WORKER_KEYS = (
    "pid", "busy_ns", "batches", "samples", "cpu_ns", "gc_ns", "gc_full", "gc_faults", "shards",
    "first_shard_ns", "first_ready_ns",
)  # fmt: skip


@dataclass
class WorkerRecord:
    """What one worker process (or the main process, when there are no workers) produced."""

    pid: int = 0
    busy_ns: int = 0
    batches: int = 0
    samples: int = 0
    cpu_ns: int = 0  # the process's CPU time for its batches (0: not measured)
    # its full garbage collections, their time and page faults (NOTE [ A full collection after
    # fork ] in collect/torch/loader.py)
    gc_ns: int = 0
    gc_full: int = 0
    gc_faults: int = 0
    # the WebDataset shards it opened (NOTE [ Shards a worker opened ] in collect/torch/dataset.py)
    shards: int = 0
    first_shard_ns: int = 0  # when it opened its first (clock(); 0: none)
    first_ready_ns: int = 0  # when its first batch was ready (clock(); 0: not known)
    # its first samples' fingerprints, in order (NOTE [ Sample fingerprints ] in core/batch.py):
    # an iterable dataset's, FINGERPRINT_PARTS a sample, IDS_KEPT at most
    ids: list[int] = field(default_factory=list)
    # its sketch of the indices it read (NOTE [ Index sketches ] in core/batch.py), as last shipped
    sketch: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {k: getattr(self, k) for k in WORKER_KEYS}
        if self.ids:
            d["ids"] = list(self.ids)
        if self.sketch:
            d["sketch"] = list(self.sketch)
        return d


def _parts() -> dict[str, Stat]:
    return {k: Stat() for k in STEP_PARTS}


@dataclass
class LoopRecord:
    """A training loop's steps (``Profiler.wrap``, Keras ``fit()``): the first steps of each
    epoch (start-up) and the steady steps kept apart, as Stats per part of ``STEP_PARTS``."""

    steps: int = 0
    epochs: int = 0
    startup_ns: int | None = None  # wait for the first batch of the run
    first: dict[str, Stat] = field(default_factory=_parts)
    steady: dict[str, Stat] = field(default_factory=_parts)
    gpu_compute: Stat = field(default_factory=Stat)  # CUDA-event time of compute phases
    regions: dict[str, Stat] = field(default_factory=dict)
    # the same regions by the CPU clock, where their figures are CUDA events' (the split's time)
    host_regions: dict[str, Stat] = field(default_factory=dict)
    replay: dict[str, Any] | None = None  # compute-only baseline (Profiler.replay, Keras)
    # recent steps: [t_request_ns, wait_ns, transfer_ns, compute_ns, first_of_epoch]
    step_ring: deque[list[int]] = field(default_factory=lambda: deque(maxlen=STEP_RING))

    def to_dict(self, ring: int | None = None) -> dict[str, Any]:
        """``ring``: only the step ring's latest that many records (a snapshot)."""
        steps = self.step_ring if ring is None else _latest(self.step_ring, ring)
        return {
            "steps": self.steps,
            "epochs": self.epochs,
            "startup_ns": self.startup_ns,
            "first": {k: v.to_dict() for k, v in self.first.items()},
            "steady": {k: v.to_dict() for k, v in self.steady.items()},
            "gpu_compute": self.gpu_compute.to_dict(),
            "regions": {k: v.to_dict() for k, v in self.regions.items()},
            "host_regions": {k: v.to_dict() for k, v in self.host_regions.items()},
            "replay": self.replay,
            "step_ring": [list(r) for r in steps],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "loop") -> LoopRecord:
        """Also reads files from before this class, whose Stats were tagged ``{"__stat__": ..}``.
        Raises ``ValueError`` naming the part (``where``) that is not what a session holds."""
        _need(isinstance(data, dict), where, "an object", data)

        def stat(key: str) -> Stat:
            return _stat(_untag(data.get(key) or {}), f"{where}.{key}")

        def stats(key: str) -> dict[str, Stat]:
            d = _get(data, key, where, _is_dict_or_none, "an object", None) or {}
            return {k: _stat(_untag(v), f"{where}.{key}.{k}") for k, v in d.items()}

        rec = cls(
            steps=_get(data, "steps", where, _is_int, _INT, 0),
            epochs=_get(data, "epochs", where, _is_int, _INT, 0),
            startup_ns=_get(data, "startup_ns", where, _is_int_or_none, _INT_OR_NULL, None),
            first={**_parts(), **stats("first")},
            steady={**_parts(), **stats("steady")},
            gpu_compute=stat("gpu_compute"),
            regions=stats("regions"),
            host_regions=stats("host_regions"),
            replay=_get(data, "replay", where, _is_dict_or_none, "an object or null", None),
        )
        rows = _get(data, "step_ring", where, _is_list, "a list", [])
        shape = "[t_request_ns, wait_ns, transfer_ns, compute_ns, first_of_epoch]"
        rec.step_ring.extend(list(r) for r in _rows(rows, f"{where}.step_ring", _STEP_ROW, shape))
        return rec


@dataclass
class Session:
    """Raw measurements of one profile. Times are ``time.perf_counter_ns`` nanoseconds.

    A Session is made by the collectors (``Profiler``, ``pipeprof run``) or read back
    (``Session.load``, ``from_dict``), not by hand; ``analyze`` turns it into a report. Its
    fields, each a constructor argument:

    Args:
        framework: ``"torch"`` or ``"tf"``.
        mode: ``"loader"`` (a pipeline alone) or ``"loop"`` (a training loop).
        meta: facts of the run (the loader's settings, the sampler, ranks, findings' inputs).
        started_at: the wall clock at ``start_ns``, epoch seconds.
        start_ns: the profile's start.
        end_ns: its end.
        stages: each stage's timings by track (``"main"``, ``"worker0"``...) and path.
        workers: each process's record (pid, batches, CPU, memory, shards), by track.
        first_batch_ns: from ``iter()`` to the first batch (the start-up).
        first_ready_ns: when the first batch reached the consumer (the steady window's start).
        first_samples: that batch's samples.
        last_ready_ns: when the last batch did (the steady window's end).
        wait: the consumer's waits in ``next()`` after the first batch.
        starved: the part of each wait before the batch was ready.
        handover: the part after it was ready.
        batch_bytes: bytes a batch, every few batches.
        probe: the in-situ cost of a timed region, once a batch.
        probe_warm: the same, warm, right after it.
        batches: batches delivered.
        samples: samples delivered.
        loop: a training loop's steps (loop mode).
        batch_ring: the latest batches: (index, track, ready, wait, samples, busy).
        spans: the latest timed regions: (track, path, start, duration).
        events: timed regions recorded in all processes.
        overhead_ns: one timed region's cost in the main process.
        costs: pipeprof's own measured cost, ns, by where it was spent.
        gpu: NVML's sampled series, or None.
        host: the host sampler's series, or None.
        notes: what the report should say about the profile itself.
        interrupted: the profile ended on an exception or Ctrl-C.
        h5: h5py reads by dataset, summed over every process.
        fetch: HTTP requests by host, summed over every process.
        tokens: token batches' padding counts, summed.
    """

    framework: Framework = "torch"
    mode: Mode = "loader"
    meta: dict[str, Any] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)  # wall-clock epoch seconds
    start_ns: int = 0
    end_ns: int = 0
    # stage stats per track ("main", "worker0", ...) and path
    stages: dict[str, dict[str, Stat]] = field(default_factory=dict)
    workers: dict[str, WorkerRecord] = field(default_factory=dict)
    # the consumer's side: time blocked in next(), batch by batch
    first_batch_ns: int | None = None  # from iter() to the first batch (start-up)
    # the steady window: from the first batch's arrival to the last one's (not to the end of the
    # profile: the last next() of an epoch also shuts the workers down)
    first_ready_ns: int | None = None
    first_samples: int = 0
    last_ready_ns: int = 0
    wait: Stat = field(default_factory=Stat)  # waits after the first batch
    # ... split (NOTE [ Wait, split ] in collect/torch/loader.py): the batch was not ready yet /
    # it was ready and being handed over; with no split known, all of the wait is starved
    starved: Stat = field(default_factory=Stat)
    handover: Stat = field(default_factory=Stat)
    batch_bytes: Stat = field(default_factory=Stat)  # bytes per batch, every few batches
    probe: Stat = field(default_factory=Stat)  # NOTE [ In-situ region cost ]: one per batch
    probe_warm: Stat = field(default_factory=Stat)  # ... and the warm one right after it
    batches: int = 0
    samples: int = 0
    loop: LoopRecord | None = None  # a training loop's steps (loop mode)
    batch_ring: deque[tuple[int, str, int, int, int, int]] = field(
        default_factory=lambda: deque(maxlen=BATCH_LIMIT)
    )  # (index, track, ready_ns, wait_ns, samples, busy_ns)
    spans: deque[tuple[str, str, int, int]] = field(
        default_factory=lambda: deque(maxlen=SPAN_LIMIT)
    )  # (track, path, start_ns, duration_ns)
    events: int = 0  # timed regions recorded, all processes
    overhead_ns: float = 0.0  # measured cost of one timed region in the main process
    # pipeprof's own measured cost, ns by where it was spent (see analyze/stages.overhead)
    costs: dict[str, int] = field(default_factory=dict)
    gpu: dict[str, Any] | None = None
    host: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    # h5py reads by dataset ("file:/name"), summed over every process (collect/hdf5.py):
    # {"layout": {...}, counters..., "extent_sum": [...]}; see ``merge_counts``
    h5: dict[str, dict[str, Any]] = field(default_factory=dict)
    # HTTP requests by host ("host:port"), summed over every process (collect/fetch.py)
    fetch: dict[str, dict[str, Any]] = field(default_factory=dict)
    # token batches' attention masks, summed (collect/torch/loader.py: _count_padding):
    # {"batches", "real", "total"}; empty where no batch held one
    tokens: dict[str, int] = field(default_factory=dict)
    _pending: deque[dict[str, Any]] = field(default_factory=deque, repr=False, compare=False)
    # records queued (written by the thread that merges) and folded (under ``_lock``): two
    # counters, each with one writer, so no update is lost between the threads
    _queued: int = field(default=0, repr=False, compare=False)
    _folded: int = field(default=0, repr=False, compare=False)
    _lock: Any = field(default_factory=threading.RLock, repr=False, compare=False)
    # guards ``events`` and ``costs``, which the loop's thread and the settling thread both add to
    # (never held for long: the loop's thread must not wait on a fold)
    _counts: Any = field(default_factory=threading.Lock, repr=False, compare=False)
    _settler: threading.Thread | None = field(default=None, repr=False, compare=False)
    _span_chunks: deque[list[tuple[str, str, Any, Any]]] = field(
        default_factory=deque, repr=False, compare=False
    )  # folded, not yet tuples: per fold, [(track, path, starts, durations)...]
    _span_count: int = field(default=0, repr=False, compare=False)
    _deferred: deque[tuple[Callable[..., Any], tuple[Any, ...]]] = field(
        default_factory=deque, repr=False, compare=False
    )  # bookkeeping to run, in order, when the session settles (``defer``)
    # short-path batches not queued yet (``defer_batch``), and the thread that adds them
    _rows: list[tuple[int, int, int, str]] = field(default_factory=list, repr=False, compare=False)
    _rows_thread: int = field(default=0, repr=False, compare=False)

    # ---- collection ---------------------------------------------------------------------

    def merge(self, payload: dict[str, Any]) -> None:
        """Queue a recorder drain (``Recorder.drain``) for ``settle`` (NOTE [ Deferred
        aggregation ]): what the training loop's thread pays per batch is this append.

        Args:
            payload: one recorder drain (``pack``'s: its records, track, pid and counts).
        """
        extra = payload.get("counts")
        if extra and "h5" in extra and self.loop is not None and self.loop.epochs > 1:
            payload["later_epoch"] = True  # h5py reads after the first epoch (analyze/hdf5.py)
        self._pending.append(payload)
        self._queued += payload["events"]
        if self._queued - self._folded >= SETTLE_EVENTS and self._settler is None:
            self._settler = threading.Thread(
                target=self._settle_behind, name="pipeprof-settle", daemon=True
            )
            self._settler.start()

    def defer(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` later, in order with the others deferred, when the session settles:
        a batch's bookkeeping (NOTE [ Deferred aggregation ]). The loop's thread runs what is
        queued itself every ``DEFER_LIMIT`` calls, at once, unless a fold holds the session.

        Args:
            fn: the bookkeeping to run.
            *args: its arguments.
        """
        if self._rows:  # the batches before this one first
            self._seal()
        self._deferred.append((fn, args))
        if len(self._deferred) >= DEFER_LIMIT:
            self.run_deferred(block=False)

    def defer_batch(self, t0: int, t1: int, samples: int, span: str) -> None:
        """``defer(add_batch, t0, t1, samples, None, span)`` for a batch of the loop's thread
        whose wait is all starved and that is not a pass's first (NOTE [ The short path ] in
        collect/torch/loader.py): kept in a row with the next ones like it, which is queued
        whole and added in bulk (``_add_batches``). Only the thread that adds them seals a row
        (``_seal``): before anything else is deferred, every BATCH_ROWS batches, and when it runs
        what is deferred.

        Args:
            t0: when ``next()`` began to wait (``clock()`` ns).
            t1: when the batch came.
            samples: its samples.
            span: the name its wait has in traces.
        """
        rows = self._rows
        if not rows:
            self._rows_thread = threading.get_ident()
        rows.append((t0, t1, samples, span))
        if len(rows) >= BATCH_ROWS:
            self._seal()

    def _seal(self) -> None:
        rows, self._rows = self._rows, []
        self.defer(self._add_batches, rows)

    def _add_batches(self, rows: list[tuple[int, int, int, str]]) -> None:
        """``add_batch`` of each row, in bulk (``defer_batch``)."""
        t0s, t1s, ns, spans = zip(*rows)
        waits = [b - a for a, b in zip(t0s, t1s)]
        wait = Stat.of_many(waits)
        self.wait.merge(wait)
        self.starved.merge(wait)  # all of it: not known
        self.handover.merge(Stat.of_many([0] * len(waits)))
        self.spans.extend(zip(repeat("main"), spans, t0s, waits))
        first = self.batches
        self.batch_ring.extend(
            (first + i, "main", t1, w, n, 0) for i, (t1, w, n) in enumerate(zip(t1s, waits, ns))
        )
        if self.first_ready_ns is None:
            self.first_ready_ns, self.first_samples = t1s[0], ns[0]
        self.last_ready_ns = t1s[-1]
        self.batches += len(rows)
        self.samples += sum(ns)

    def run_deferred(self, block: bool = True) -> None:
        """Run what ``defer`` queued (a loader's pass runs its own at its end); with ``block``
        False, not if a fold holds the session now.

        Args:
            block: wait for a fold that holds the session (False: leave the queue for later).
        """
        if self._rows and threading.get_ident() == self._rows_thread:
            self._seal()
        if not self._lock.acquire(blocking=block):
            return
        try:
            while self._deferred:
                fn, args = self._deferred.popleft()
                fn(*args)
        finally:
            self._lock.release()

    @property
    def pending_events(self) -> int:
        """Records queued and not folded in yet."""
        return self._queued - self._folded

    def settle(self, chunk: int | None = None) -> None:
        """Fold the queued drains into ``stages`` and ``events`` (their spans wait, packed, for
        ``settled``); with ``chunk``, about that many records at a time, letting other threads
        run in between.

        Args:
            chunk: about how many records a fold takes at a time; None: all at once.
        """
        self.run_deferred()
        while self._pending:
            with self._lock:
                taken: list[dict[str, Any]] = []
                n = 0
                while self._pending and (chunk is None or n < chunk):
                    payload = self._pending.popleft()
                    taken.append(payload)
                    n += payload["events"]
                self._folded += n
                self._fold(taken)
            if chunk is not None:
                time.sleep(0)  # the loop's thread may want the GIL

    def _fold(self, payloads: list[dict[str, Any]]) -> None:
        by_path: dict[tuple[str, str], list[tuple[bytes, int]]] = defaultdict(list)
        for payload in payloads:
            track = payload["track"]
            for key, packed in payload["raw"].items():  # key: a path, or (path, items each)
                path, n = (key, 1) if isinstance(key, str) else key
                by_path[track, path].append((packed, n))
        with self._counts:
            self.events += sum(payload["events"] for payload in payloads)
        for payload in payloads:
            extra = payload.get("counts")
            if extra and "fetch" in extra:
                merge_counts(self.fetch, extra["fetch"])
            if extra and "tokens" in extra:
                merge_counts(self.tokens, extra["tokens"])
            if extra and "h5" in extra:
                merge_counts(self.h5, extra["h5"])
                if payload.get("later_epoch"):  # cold vs warm: later epochs' reads apart
                    merge_counts(self.h5, {name: {"later": {"reads": e.get("reads", 0),
                                                            "read_ns": e.get("read_ns", 0)}}
                                           for name, e in extra["h5"].items()})  # fmt: skip
        fold: list[tuple[str, str, Any, Any]] = []
        for (track, path), packed in by_path.items():
            stat, starts, durs = aggregate(packed)
            mine = self.stages.setdefault(track, {})
            have = mine.get(path)
            if have is None:
                mine[path] = stat
            else:
                have.merge(stat)
            fold.append((track, path, starts, durs))
            self._span_count += len(durs)
        self._span_chunks.append(fold)
        # whole folds (one time window, every path) older than the ring could keep: dropped
        limit = self.spans.maxlen or 0
        while limit and len(self._span_chunks) > 1:
            oldest = sum(len(c[3]) for c in self._span_chunks[0])
            if self._span_count - oldest < limit:
                break
            self._span_count -= oldest
            self._span_chunks.popleft()

    def settle_counted(self, chunk: int | None = None) -> None:
        """``settle``, its CPU counted as pipeprof's own (``costs["settle_ns"]``; CPU: waiting for
        a background fold is not a cost twice): where a profile stops, and on the settling
        thread.

        Args:
            chunk: as ``settle``'s.
        """
        t0 = time.thread_time_ns()
        try:
            self.settle(chunk)
        finally:
            self.add_cost("settle_ns", time.thread_time_ns() - t0)

    def _settle_behind(self) -> None:
        try:
            self.settle_counted(chunk=SETTLE_CHUNK)
        finally:
            self._settler = None

    def settled(self) -> Any:
        """``with session.settled():`` everything queued is folded in (spans too), and no
        background settle changes ``stages`` or ``spans`` while the block reads them."""
        self.settle()
        with self._lock:
            if self._span_chunks:  # raw spans become tuples only when something reads them
                spans = list(self.spans)
                for fold in self._span_chunks:
                    for track, path, starts, durs in fold:
                        spans.extend(zip(repeat(track), repeat(path), starts, durs))
                spans.sort(key=_start)  # the ring keeps the latest, whoever recorded them
                self.spans.clear()
                self.spans.extend(spans)
                self._span_chunks.clear()
                self._span_count = 0
        return self._lock

    def add_cost(self, where: str, ns: int) -> None:
        """pipeprof's own cost, measured, in ``costs``: ``main_ns`` (bookkeeping inside
        ``next()``), ``pack_ns``, ``settle_ns``, ``sampler_ns`` (of which ``sampler_first_ns``:
        the samplers' start), ``setup_ns``.

        Args:
            where: the cost's key (``main_ns``...).
            ns: nanoseconds to add.
        """
        self.add_costs(((where, ns),))

    def add_costs(self, costs: Iterable[tuple[str, int]]) -> None:
        """Several of ``add_cost`` at once (one lock: this runs per batch).

        Args:
            costs: ``(where, ns)`` pairs.
        """
        with self._counts:
            have = self.costs
            for where, ns in costs:
                have[where] = have.get(where, 0) + ns

    def add(self, track: str, path: str, ns: int, n: int = 1) -> None:
        """Record one timing measured outside a recorder (the pin-memory thread, say).

        Args:
            track: the process or thread it was measured in (``"main"``, ``"worker0"``...).
            path: the stage's path.
            ns: its time.
            n: the items that time covers.
        """
        stat = self.stages.setdefault(track, {}).get(path)
        if stat is None:
            stat = self.stages[track][path] = Stat()
        stat.add(ns, n)
        with self._counts:
            self.events += 1

    def add_batch(
        self,
        t0: int,
        t1: int,
        samples: int,
        t_iter: int | None = None,
        span: str | None = None,
        track: str = "main",
        busy_ns: int = 0,
        starved_ns: int | None = None,
    ) -> None:
        """The consumer got a batch of ``samples``, blocked in ``next()`` from ``t0`` to ``t1``,
        ``starved_ns`` of it before the batch was ready (None: not known, all of it); with
        ``t_iter`` (when ``iter()`` was called) it is the first batch: start-up, not wait.

        Args:
            t0: when ``next()`` began to wait (``clock()`` ns).
            t1: when the batch came.
            samples: its samples.
            t_iter: the pass's ``iter()`` for its first batch (its wait is the start-up);
                None for the others.
            span: the name its wait has in traces.
            track: the process that made it.
            busy_ns: how long that process worked on it (kept in ``batch_ring``).
            starved_ns: the part of the wait before it was ready; None: not known.
        """
        if t_iter is not None:
            self.first_batch_ns = t1 - t_iter
        else:
            wait = t1 - t0
            starved = wait if starved_ns is None else starved_ns
            self.wait.add(wait)
            self.starved.add(starved)
            self.handover.add(wait - starved)
            if wait - starved > 0:
                self.spans.append(("main", "wait/hand-over", t1 - wait + starved, wait - starved))
        if span is not None:
            self.spans.append(("main", span, t0, t1 - t0))
        self.batch_ring.append((self.batches, track, t1, t1 - t0, samples, busy_ns))
        if self.first_ready_ns is None:  # ``arrived``, inline: this runs once per batch
            self.first_ready_ns, self.first_samples = t1, samples
        self.last_ready_ns = t1
        self.batches += 1
        self.samples += samples

    def arrived(self, t_ns: int, samples: int) -> None:
        """A batch of ``samples`` reached the consumer at ``t_ns`` (the steady window's ends).

        Args:
            t_ns: when it arrived (``clock()`` ns).
            samples: its samples.
        """
        if self.first_ready_ns is None:
            self.first_ready_ns, self.first_samples = t_ns, samples
        self.last_ready_ns = t_ns

    def worker(self, track: str, pid: int) -> WorkerRecord:
        """The record of the process ``track``, made at its first mention.

        Args:
            track: ``"main"``, ``"worker0"``...
            pid: its process id (a restarted worker's replaces the one before).

        Returns:
            The record, kept in ``workers``.
        """
        rec = self.workers.get(track)
        if rec is None:
            rec = self.workers[track] = WorkerRecord(pid=pid)
        rec.pid = pid
        return rec

    @property
    def wall_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)

    # ---- persistence --------------------------------------------------------------------

    def to_dict(self, spans: int | None = None) -> dict[str, Any]:
        """The session as plain data; ``spans``: a snapshot (NOTE [ Snapshots ] in
        profiler.py), with only the latest that many spans and of the rings' records, read
        without folding the rest.

        Args:
            spans: keep only the latest that many spans (a snapshot); None: all, folded.

        Returns:
            Plain data (JSON types), which ``from_dict`` reads back.
        """
        if spans is None:
            with self.settled():
                return self._to_dict()
        self.settle()
        with self._lock:
            return self._to_dict(self._latest_spans(spans), spans)

    def _latest_spans(self, n: int) -> list[tuple[str, str, int, int]]:
        """The latest ``n`` spans, from the newest folds back and the ring's end, leaving both
        as they are: what a snapshot reads costs O(n), however many spans the run holds."""
        picked: list[tuple[str, str, int, int]] = []
        for fold in reversed(self._span_chunks):
            for track, path, starts, durs in fold:
                picked.extend(zip(repeat(track), repeat(path), starts, durs))
            if len(picked) >= n:
                break
        picked.extend(_latest(self.spans, n))
        picked.sort(key=_start)
        return picked[-n:]

    def _to_dict(self, kept: Any = None, rings: int | None = None) -> dict[str, Any]:
        """``kept``: the spans to write (all: None); ``rings``: the rings' latest records only."""
        batches = self.batch_ring if rings is None else _latest(self.batch_ring, rings)
        return {
            "schema_version": SCHEMA_VERSION,
            "framework": self.framework,
            "mode": self.mode,
            "meta": self.meta,
            "started_at": self.started_at,
            "start_ns": self.start_ns,
            "end_ns": self.end_ns,
            "stages": {t: {p: s.to_dict() for p, s in st.items()} for t, st in self.stages.items()},
            "workers": {t: w.to_dict() for t, w in self.workers.items()},
            "first_batch_ns": self.first_batch_ns,
            "first_ready_ns": self.first_ready_ns,
            "first_samples": self.first_samples,
            "last_ready_ns": self.last_ready_ns,
            "wait": self.wait.to_dict(),
            "starved": self.starved.to_dict(),
            "handover": self.handover.to_dict(),
            "batch_bytes": self.batch_bytes.to_dict(),
            "probe": self.probe.to_dict(),
            "probe_warm": self.probe_warm.to_dict(),
            "batches": self.batches,
            "samples": self.samples,
            "loop": self.loop.to_dict(rings) if self.loop is not None else {},
            "batch_ring": [list(b) for b in batches],
            "spans": [list(s) for s in (self.spans if kept is None else kept)],
            "events": self.events,
            "overhead_ns": self.overhead_ns,
            "costs": dict(self.costs),
            "gpu": self.gpu,
            "host": self.host,
            "notes": self.notes,
            "interrupted": self.interrupted,
            "h5": self.h5,
            "fetch": self.fetch,
            "tokens": self.tokens,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Session:
        """The session ``to_dict`` gave. Keys this pipeprof does not know are ignored (a later
        version may add some); a missing key takes its default. Raises ``ValueError`` for a newer
        schema version, and one naming the part (``session.wait``, say) that is malformed."""
        _need(isinstance(data, dict), "session", "an object", data)
        version: Any = data.get("schema_version")
        if not (_is_int(version) and version >= 1):
            raise _Malformed(
                f"session.schema_version should be a whole number of 1 or more (this pipeprof "
                f"writes {SCHEMA_VERSION}), not {_shown(version)}"
            )
        if version > SCHEMA_VERSION:
            raise ValueError(
                f"this session has schema version {version}; this pipeprof reads up to "
                f"{SCHEMA_VERSION}: upgrade pipeprof (pip install -U pipeprof)"
            )
        try:
            return cls._from_dict(data)
        except _Malformed:
            raise
        except (TypeError, ValueError, KeyError, AttributeError, IndexError, OverflowError) as e:
            raise _Malformed(f"session could not be read ({type(e).__name__}: {e})") from e

    @classmethod
    def _from_dict(cls, data: dict[str, Any]) -> Session:
        def get(key: str, check: Any, what: str, default: Any) -> Any:
            return _get(data, key, "session", check, what, default)

        loop = get("loop", _is_dict_or_none, "an object or null", None)
        s = cls(
            framework=get("framework", lambda v: v in ("torch", "tf"), '"torch" or "tf"', "torch"),
            mode=get("mode", lambda v: v in ("loader", "loop"), '"loader" or "loop"', "loader"),
            meta=get("meta", _is_dict, "an object", {}),
            started_at=get("started_at", _is_number, "a number", 0.0),
            start_ns=get("start_ns", _is_int, _INT, 0),
            end_ns=get("end_ns", _is_int, _INT, 0),
            first_batch_ns=get("first_batch_ns", _is_int_or_none, _INT_OR_NULL, None),
            first_ready_ns=get("first_ready_ns", _is_int_or_none, _INT_OR_NULL, None),
            first_samples=get("first_samples", _is_int, _INT, 0),
            last_ready_ns=get("last_ready_ns", _is_int, _INT, 0),
            wait=_stat(data.get("wait", {}), "session.wait"),
            starved=_stat(data.get("starved", {}), "session.starved"),
            handover=_stat(data.get("handover", {}), "session.handover"),
            batch_bytes=_stat(data.get("batch_bytes", {}), "session.batch_bytes"),
            probe=_stat(data.get("probe", {}), "session.probe"),
            probe_warm=_stat(data.get("probe_warm", {}), "session.probe_warm"),
            batches=get("batches", _is_int, _INT, 0),
            samples=get("samples", _is_int, _INT, 0),
            loop=LoopRecord.from_dict(loop, "session.loop") if loop else None,
            events=get("events", _is_int, _INT, 0),
            overhead_ns=get("overhead_ns", _is_number, "a number", 0.0),
            costs=dict(get("costs", _is_int_values, "an object of whole numbers", {})),
            gpu=get("gpu", _is_dict_or_none, "an object or null", None),
            host=get("host", _is_dict_or_none, "an object or null", None),
            notes=list(get("notes", _is_strings, "a list of strings", [])),
            interrupted=get("interrupted", lambda v: isinstance(v, bool), "true or false", False),
            h5=get("h5", _is_dict_of_dicts, "an object of objects", {}),
            fetch=get("fetch", _is_dict_of_dicts, "an object of objects", {}),
            tokens=dict(get("tokens", _is_int_values, "an object of whole numbers", {})),
        )
        stages = get("stages", _is_dict, "an object", {})
        for track, paths in stages.items():
            _need(isinstance(paths, dict), f"session.stages.{track}", "an object", paths)
            s.stages[track] = {p: _stat(d, f"session.stages.{track}.{p}") for p, d in paths.items()}
        for track, w in get("workers", _is_dict, "an object", {}).items():
            s.workers[track] = _worker(w, f"session.workers.{track}")
        ring = get("batch_ring", _is_list, "a list", [])
        shape = "[index, track, ready_ns, wait_ns, samples, busy_ns]"
        rows = _rows(ring, "session.batch_ring", _BATCH_ROW, shape)
        s.batch_ring.extend(tuple(r) for r in rows)  # type: ignore[misc]
        spans = get("spans", _is_list, "a list", [])
        rows = _rows(spans, "session.spans", _SPAN_ROW, "[track, path, start_ns, duration_ns]")
        s.spans.extend(tuple(r) for r in rows)  # type: ignore[misc]
        return s

    def save(self, path: str | os.PathLike[str], spans: int | None = None,
             note: str | None = None) -> Path:  # fmt: skip
        """Write the session as JSON (atomically: a crash never leaves half a file); ``spans``:
        only the latest that many spans; ``note``: one more note, in the file only.

        Args:
            path: the file to write.
            spans: as ``to_dict``'s.
            note: one more note, written to the file only.

        Returns:
            The path written.
        """
        data = self.to_dict(spans)
        if note:
            data["notes"] = [*data["notes"], note]
        return write_atomic(path, json.dumps({"session": data}))


def merge_counts(into: dict[str, Any], add: dict[str, Any]) -> None:
    """Fold the aggregates ``add`` into ``into``, key by key: numbers add, lists of numbers add
    element by element, dicts merge the same way, except ``layout``: facts that do not change
    (a dataset's chunk shape), kept as first seen. ``add`` is not changed."""
    for key, value in add.items():
        have = into.get(key)
        if have is None:
            into[key] = _copied(value)
        elif key == "layout":
            continue
        elif isinstance(value, dict) and isinstance(have, dict):
            merge_counts(have, value)
        elif isinstance(value, list) and isinstance(have, list) and len(value) == len(have):
            into[key] = [a + b for a, b in zip(have, value)]
        elif _is_number(value) and _is_number(have):
            into[key] = have + value


def _copied(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    return list(value) if isinstance(value, list) else value


def _latest(ring: deque[Any], n: int) -> list[Any]:
    """The last ``n`` records of ``ring``, in order (O(n), from its end)."""
    return list(islice(reversed(ring), n))[::-1]


def _start(span: tuple[str, str, int, int]) -> int:
    return span[2]


@contextmanager
def naming(path: str) -> Iterator[None]:
    """An OSError in the block that writes ``path`` names it (a failed write() names no file, a
    failed atomic save its temporary file)."""
    try:
        yield
    except OSError as exc:
        why = f"cannot be written ({exc.strerror or exc}); choose another path"
        raise OSError(exc.errno, why, path) from exc  # PermissionError etc. by errno


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file: a crash never leaves half a file.
    An OSError names ``path`` (not the temporary file)."""
    target = Path(path)
    tmp = target.with_name(target.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    except OSError as exc:
        if tmp.parent.is_dir():
            tmp.unlink(missing_ok=True)
        raise type(exc)(exc.errno, exc.strerror, str(target)) from None
    return target


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise the OSError a write to ``path`` would, now (not after minutes of work), changing
    nothing: the file is opened as a write would open it, and one made for the test is removed."""
    target = Path(path)
    if target.is_dir():
        raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
    if target.exists():
        target.open("a").close()
    else:
        target.open("x").close()
        target.unlink()


def read_file(path: str | os.PathLike[str]) -> Session:
    """Load a session saved by ``Session.save`` or ``Report.save``. A file that is no such
    session raises ``ValueError`` naming the file and what is wrong with it."""
    p = Path(path)
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"no such pipeprof file: {p}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{p} is not a pipeprof JSON file: it is not UTF-8 text ({exc})") from None
    except (ValueError, RecursionError) as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{p} is not a pipeprof JSON file ({exc})") from None
    if isinstance(data, dict) and "session" not in data and "schema" in data:
        raise ValueError(
            f"{p} is a report written as plain JSON, without the raw session a report is "
            "re-rendered from: save one with report.save(path) (or `pipeprof demo -o FILE.json`); "
            "`pipeprof compare` reads this file as it is"
        )
    if not isinstance(data, dict) or "session" not in data:
        raise ValueError(
            f"{p} holds no pipeprof session: pass a file written by report.save() or "
            "`pipeprof demo -o FILE.json`"
        )
    try:
        return Session.from_dict(data["session"])
    except _Malformed as exc:
        raise ValueError(
            f"{p} is a damaged pipeprof file: {exc}. Was it edited or cut short? Save the "
            "report again with report.save(path)"
        ) from None
    except ValueError as exc:  # a newer schema version
        raise ValueError(f"{p}: {exc}") from None


# ---- reading a saved session: light checks, so a malformed file fails on load, not later ----


class _Malformed(ValueError):
    """A part of a saved session is not what ``to_dict`` writes there."""


_INT = "a whole number"
_INT_OR_NULL = "a whole number or null"
_STAT_INTS = ("count", "total_ns", "min_ns", "max_ns")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_int_or_none(v: Any) -> bool:
    return v is None or _is_int(v)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _is_dict(v: Any) -> bool:
    return isinstance(v, dict)


def _is_int_values(v: Any) -> bool:
    return isinstance(v, dict) and all(_is_int(x) for x in v.values())


def _is_dict_or_none(v: Any) -> bool:
    return v is None or isinstance(v, dict)


def _is_list(v: Any) -> bool:
    return isinstance(v, list)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_dict_of_dicts(v: Any) -> bool:
    return isinstance(v, dict) and all(isinstance(x, dict) for x in v.values())


def _is_strings(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


_BATCH_ROW = (_is_int, _is_str, _is_int, _is_int, _is_int, _is_int)
_SPAN_ROW = (_is_str, _is_str, _is_int, _is_int)
_STEP_ROW = (_is_int, _is_int, _is_int, _is_int, lambda v: isinstance(v, int))  # int or bool


def _shown(v: Any) -> str:
    """A JSON value as a message names it: its JSON type and a short excerpt."""
    if v is None:
        return "null"
    kind = {bool: "true/false", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(v), type(v).__name__)  # fmt: skip
    text = json.dumps(v) if isinstance(v, (bool, int, float, str)) else repr(v)
    return f"{kind} ({text if len(text) <= 40 else text[:37] + '...'})"


def _need(ok: bool, where: str, what: str, value: Any) -> None:
    if not ok:
        raise _Malformed(f"{where} should be {what}, not {_shown(value)}")


def _get(data: dict[str, Any], key: str, where: str, check: Any, what: str, default: Any) -> Any:
    value = data.get(key, default)
    _need(check(value), f"{where}.{key}", what, value)
    return value


def _is_bucket(b: Any) -> bool:
    return _is_int(b) or (isinstance(b, str) and b.removeprefix("-").isdecimal())


def _untag(d: Any) -> Any:
    """A Stat as files from before LoopRecord tagged it: ``{"__stat__": {...}}``."""
    return d.get("__stat__", d) if isinstance(d, dict) else d


def _stat(d: Any, where: str) -> Stat:
    _need(isinstance(d, dict), where, "an object of statistics (count, total_ns, ...)", d)
    for key in _STAT_INTS:
        _get(d, key, where, _is_int, _INT, 0)
    _get(d, "sum_sq", where, _is_number, "a number", 0.0)
    hist = _get(d, "hist", where, _is_dict, "an object", {})
    for b, c in hist.items():
        _need(_is_bucket(b), f"{where}.hist", "keyed by bucket numbers", b)
        _need(_is_int(c), f"{where}.hist.{b}", _INT, c)
    return Stat.from_dict(d)


def _worker(d: Any, where: str) -> WorkerRecord:
    _need(isinstance(d, dict), where, "an object", d)
    ids = _get(d, "ids", where, lambda v: isinstance(v, list) and all(map(_is_int, v)),
               "a list of integers", [])  # fmt: skip
    sketch = _get(d, "sketch", where, lambda v: isinstance(v, list) and all(map(_is_int, v)),
                  "a list of integers", [])  # fmt: skip
    return WorkerRecord(**{k: _get(d, k, where, _is_int, _INT, 0) for k in WORKER_KEYS}, ids=ids,
                        sketch=sketch)  # fmt: skip


def _rows(rows: list[Any], where: str, kinds: tuple[Any, ...], shape: str) -> list[list[Any]]:
    """The rows of a ring, checked: each a list of ``len(kinds)`` values that pass their check."""
    for i, row in enumerate(rows):
        ok = isinstance(row, list) and len(row) == len(kinds)
        _need(ok and all(check(v) for check, v in zip(kinds, row)), f"{where}[{i}]", shape, row)
    return rows
