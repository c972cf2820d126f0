"""PyTorch DataLoader collector: stage timings from inside the worker processes.

NOTE [ Worker timing transport ]
The profiled loader is a new ``DataLoader`` built with the user's arguments (a DataLoader refuses
to have its dataset replaced, and the user's objects are never mutated) around the dataset (or a
copy of it whose transforms are timed stand-ins, one stage each: dataset.py) and two picklable
wrappers, ``collate_fn`` and ``worker_init_fn``; ``load`` per sample is timed by a reader that
only torch's fetcher sees (NOTE [ The user's own dataset ]). The collate wrapper runs last in a
worker for every batch: it drains the worker's recorder and returns ``Carrier(batch, records)``.
The carrier travels through the loader's own result queue, is pinned by the pin-memory thread
(which calls ``Carrier.pin_memory``, where pin time is measured) and is unwrapped by the iterator
before the user sees the batch. There is no second channel, nothing to deadlock, and every record
belongs exactly to the batch it came with. The records travel packed as bytes and are folded into
the session later, off the loop's path (NOTE [ Deferred aggregation ] in core/session.py): inside
``next()`` the main process pays an unpickled copy, a queue append and the split of the batch's
wait, and measures that (``costs["main_ns"]``) to leave it out of the wait it reports; the rest
of the batch's bookkeeping (``_book``) runs at the pass's end, for all its batches at once.
What a worker does after a batch is ready (packing its records, a few µs) lands in that batch's
hand-over.

NOTE [ Wait, split ]
A worker stamps the moment its batch is ready (``end_ns``, right after ``collate_fn``;
``perf_counter_ns`` is CLOCK_MONOTONIC, one time base for every process). The loop asked at
``t0`` and got the batch at ``t1``. Its wait ``t1 - t0`` splits into *starved*, ``ready - t0``
when positive (the pipeline had not finished the batch: too slow), and *hand-over*, the rest
(moving a finished batch: the result queue, unpickling, shared memory, the pin-memory thread).
With ``num_workers=0`` the batch is made inside ``next()``, so the wait is starved. The first
batches of an epoch, until every worker has delivered one, are start-up and kept apart.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import linecache
import multiprocessing
import os
import resource
import statistics
import sys
import threading
import time
import weakref
from array import array
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info
from torch.utils.data._utils.collate import default_collate, default_convert

from pipeprof.collect import fetch as netreads
from pipeprof.collect import hdf5, ranks, tokenizer
from pipeprof.collect.loop import HANG_S
from pipeprof.collect.torch import epochs, hangs, hfstream, memory, shm
from pipeprof.collect.torch.dataset import (
    SHARDS,
    apply_marks,
    class_swaps,
    instrument_dataset,
    steps_timed,
    stream_facts,
    timed_pipeline,
)
from pipeprof.core.batch import (
    Sketch,
    batch_nbytes,
    batch_size,
    fingerprints,
    sample_kinds,
    samples_to_collate,
)
from pipeprof.core.recorder import (
    PROBE_CAP_NS,
    STAGE_EVERY,
    clock,
    counts,
    probe,
    probe_base,
    recorder,
    set_probe_base,
    timed_call1,
)
from pipeprof.core.session import IDS_KEPT, Session

# Named like torch.profiler's own span so that traces line up.
WAIT_SPAN = "enumerate(DataLoader)#{}.__next__"
BYTES_EVERY = 16  # batches between two measurements of a batch's size in bytes
# NOTE [ Unprofiled batches ]: in a map-style pass of at least SAMPLE_MIN_BATCHES batches, the
# loader's stages are timed in the profile's first TIMED_FIRST batches (counted over its passes:
# ``seen``), then in one batch in ``stage_every`` (STAGE_EVERY unless the user says; 1: every
# batch); the others are fetched with the recorder off and the dataset copy's transforms set back
# to the user's own, so they run none of pipeprof's frames and have no stage records. Timing a
# sample of the batches is what keeps pipeprof near 1 % of the CPU of a pipeline whose samples
# cost about a millisecond (docs/validation/overhead.md); timing the first TIMED_FIRST in full is
# what holds a short profile's stages to a 5 % error: 1 in 8 of a 20-batch profile is 2 or 3
# batches, and a stage's figure from those was seen 8.3 % off the truth. The report says how many
# batches were timed (``meta["timed_batches"]``, analyze/analysis.py).
# - The stages' totals are scaled to every sample (analyze/stages.py) in two strata: the first
#   batches stand for themselves, the later timed ones for the later batches. The first batches'
#   stage time is kept apart for that (``meta["first_batches"]``: batches, samples, ns per track
#   and path; ``_first_add``). Scaled as one sample, the first batches, a worker's cold one among
#   them, would weigh as much as the 1 in ``stage_every`` (a cold batch weighing 8 times once put
#   ``load/decode`` 36 % over on the JPEG pipeline, docs/validation/overhead.md).
# - The CPU per sample of the unprofiled batches against the profiled ones among them is what the
#   timed regions and their wrappers cost (analyze/stages.py: ``overhead``). Outside that
#   comparison: a pass's first batch, or a worker's (cold), and the profile's first TIMED_FIRST
#   batches. Those are all profiled and all come before any unprofiled one: counted as profiled
#   they would charge the profile's warm-up (first allocations, page faults, cold caches) and any
#   drift to pipeprof's regions; the arms are only the later batches, where one profiled batch in
#   ``stage_every`` is interleaved with the unprofiled ones.
# - num_workers=0: the process's CPU around ``next()`` (the process's: torch's intra-op threads
#   spin while pipeprof's code runs between their ops); costs ``ab_*``.
# - Workers: each worker decides for its own batches (``MapDataset._off_batch``), counting its
#   batches from its start: its first ``first`` are profiled (arm FIRST: the TIMED_FIRST still to
#   time when it started, shared out, rounded up: workers take a pass's batches in turn), then
#   one in ``stage_every``; its CPU per batch (``cpu_ns``, which every payload carries) is
#   compared; costs ``abw_*``. Also from the second pass of a loop over a shorter loader's
#   epochs; workers that persist keep the rule they were started with. An unprofiled batch still
#   travels in a Carrier, with no records and its figures in a tuple (``Collate``), so its wait
#   splits and its worker's busy time counts as a profiled one's do.
#
# NOTE [ The short path ]
# In the training process (num_workers=0) the CPU comparison needs only as many unprofiled
# batches as profiled ones: the batch just before a profiled one is compared with it (arm
# "off"). And it needs only so many pairs: each reads the process's CPU clock four times, which
# right after a training step cost 8-53 µs a read on this project's VM (NOTE [ CPU training
# shares the cores ] in profiler.py), so the pairs are the first AB_PAIRS_FIRST cycles of
# ``stage_every`` batches and then one cycle in AB_PAIRS_EVERY. The stages are timed in those
# cycles only: from batch ``meta["stage_every_from"]`` on, one in ``meta["stage_every_later"]``
# (32 by default). Every batch profiled here costs the training step itself (issue 38's tiny
# step: 10 µs a step at 1 in 8), and by then the stages have 24 timed batches. Every other
# unprofiled batch takes a short path in ``ProfiledLoader._pass``: the recorder off, the user's
# transforms back, and the classes of those timed in place set back to their own method for the
# batch (``class_swaps``: a sample runs no frame of pipeprof's), two clock reads around
# ``next()`` and the batch's wait queued in a row with the next ones like it
# (``Session.defer_batch``); no recorder sink, no CPU clock, no merge.
# They count as unprofiled in ``ab_lean_batches`` / ``ab_lean_samples`` (analyze/stages.py),
# their bookkeeping in ``main_ns``. Not with NVTX ranges or a copy to the device to time.
#
# NOTE [ Workers' batches, past the generators ]
# With workers, every batch comes in a Carrier and is unpacked and booked in the training
# process; its stages were timed (or not) in its worker. Through the pass it went through three
# generators and the step's bookkeeping: on a loop of 1 ms steps with 2 workers, 91 µs more of
# the training thread's CPU in ``next()`` than plain, and the loop 7.4 % longer; 53 µs and
# 5.4 % this way (docs/validation/run-cost.md). So, past the first ``warmup_steps`` batches of
# a pass (steps until every worker delivered: the epoch's start-up), a worker loader's pass
# says the next SHORT_RUN_MOST batches take the fast path (NOTE [ The fast path ] in
# attach/run.py), under ``pipeprof run`` with no NVTX ranges and no copy to the device to time:
# ``_short_worker`` fetches the Carrier, unpacks it and queues its bookkeeping as the pass does
# (``_unpack``: the wait's starved part, the worker's records or figures), and the step's row
# keeps the starved part (``StepLog.settle``). Its own time goes to ``main_ns`` at the pass's
# end. ``Profiler.wrap`` by hand keeps its generators for worker loaders.
#
# NOTE [ A suspended pass holds no batch ]
# The pass's generators (``_pass``, the Profiler's steps, ``pipeprof run``'s pass) yield a batch
# and stay suspended until the next one is asked, through the fast path for up to
# SHORT_RUN_MOST batches. A local still naming the batch kept it alive all that time: with
# workers, one batch of /dev/shm more than plain, and a loader that fits a 64 MB /dev/shm plain
# failed in a worker under ``pipeprof run`` (tests/test_shm.py). So each drops its names for
# the batch before it yields it.
SHORT_RUN_MOST = 256  # NOTE [ The fast path ] in attach/run.py: batches said ahead at most
AB_PAIRS_FIRST = 8  # analyze/stages.py's AB_MIN_OFF: the comparison is used from 8 pairs on
AB_PAIRS_EVERY = 4
SAMPLE_MIN_BATCHES = 16
TIMED_FIRST = 16  # the profile's first batches, all timed (at least 16, or all of a shorter one)
IDS_BATCHES = 16  # NOTE [ Sample fingerprints ] in core/batch.py: a worker's batches fingerprinted
FIRST = "first"  # a worker's batch's arm: one of the profile's first, profiled, compared with none
_AB_PARTS = ("batches", "samples", "ns", "q", "qq")
_AB_KEYS: dict[str, tuple[str, ...]] = {}  # arm -> its keys in ``costs``, one per part


# A worker's unprofiled batch's figures (NOTE [ Unprofiled batches ]): its track, pid, when its
# fetch began and when it was ready, its samples, its arm and its CPU since the previous batch
OffFigures = tuple[str, int, int, int, int, "str | None", "int | None"]


class ShortPass:
    """A pass's short path (NOTE [ The short path ]) as its caller may take it past the pass's
    generator (NOTE [ The fast path ] in attach/run.py): what fetches a batch, whether the dataset
    copy has stand-ins to set back, the wait's span name; ``left``: how many of the next batches
    take it (the pass says, at each batch it yields); ``ended``: the batches are over; ``t0`` and
    ``t1``: the last one's fetch; ``starved``: how much of it (None: all); ``own``: the
    bookkeeping after it. ``workers``: the batches come from workers, each with its records
    (NOTE [ Workers' batches, past the generators ])."""

    __slots__ = ("ended", "fetch", "left", "own", "span", "starved", "swaps", "t0", "t1",
                 "workers")  # fmt: skip

    def __init__(self, fetch: Any, swaps: list[Any], span: str, workers: bool = False) -> None:
        self.fetch, self.swaps, self.span, self.workers = fetch, swaps, span, workers
        self.left, self.ended, self.t0, self.t1, self.own = 0, False, 0, 0, 0
        self.starved: int | None = None


class Carrier:
    """A batch and the records of the process that made it (see NOTE above): a recorder's drain
    (a dict), or an unprofiled batch's figures alone (a tuple, cheaper to pickle)."""

    __slots__ = ("batch", "payload", "pin_ns")

    def __init__(self, batch: Any, payload: dict[str, Any] | OffFigures) -> None:
        self.batch = batch
        self.payload = payload
        self.pin_ns = 0

    def pin_memory(self, *args: Any) -> Carrier:
        from torch.utils.data._utils.pin_memory import pin_memory  # a function, not a patch

        nv = recorder().ranges  # NVTX (NOTE [ NVTX ranges ] in collect/ranges.py)
        if nv is not None:
            nv.open("transfer/pin")
        t0 = clock()
        self.batch = pin_memory(self.batch, *args)  # type: ignore[no-untyped-call]
        self.pin_ns = clock() - t0
        if nv is not None:
            nv.pop()
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self.batch, self.payload, self.pin_ns))


def _rebuild(batch: Any, payload: dict[str, Any] | OffFigures, pin_ns: int) -> Carrier:
    c = Carrier(batch, payload)
    c.pin_ns = pin_ns
    return c


class _Delegate:
    """What torch's fetcher reads in a profiled loader: the dataset as the loader holds it, with
    ``load`` timed (NOTE [ The user's own dataset ]). Attribute reads and writes go to it."""

    _inner: Any

    def __init__(self, dataset: Any) -> None:
        object.__setattr__(self, "_inner", dataset)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "_inner" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["_inner"], name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)

    def __len__(self) -> int:
        return len(self._inner)


# NOTE [ The user's own dataset ]
# The profiled DataLoader holds the dataset itself (the user's, or its copy with timed transforms:
# collect/torch/dataset.py), so what user code reaches (``get_worker_info().dataset``,
# ``loader.dataset``) has the user's type and its own ``__dict__``: a ``worker_init_fn`` that
# dispatches on ``type(ds)`` or writes ``vars(ds)`` acts as it does plain. ``load`` is timed by a
# reader that only torch's fetcher sees: ``_DatasetKind.create_fetcher``, patched once a process
# (``_install_fetcher``; a spawned worker's ``WorkerInit`` runs before its fetcher is made), hands
# the fetcher ``Collate.reader(dataset)`` for a loader whose ``collate_fn`` is pipeprof's
# ``Collate``, and torch's own arguments for any other loader. While the user's ``worker_init_fn``
# runs, the copy holds the user's own transforms, not their stand-ins (``WorkerInit``).
_FETCHER: list[Any] = [None]  # torch's create_fetcher, once patched
# The library reads timed where the pipeline runs, each installed in a worker for its life and in
# the training process for a pass (NOTE [ Counted class patches ] in collect/patch.py): h5py's
# reads, http.client's requests, WebDataset's shard streams, fsspec's async filesystems (s3fs's
# bodies through aiobotocore among them), Hugging Face tokenizer calls
READS = (hdf5.PATCH, netreads.PATCH, netreads.PIPES, netreads.SYNC, netreads.AIO, netreads.HTTP,
         netreads.BOTO, netreads.LOCAL, *hfstream.PATCHES, tokenizer.PATCH)  # fmt: skip


def _install_fetcher() -> None:
    """Patch ``_DatasetKind.create_fetcher`` in this process (once; see NOTE above)."""
    if _FETCHER[0] is not None:
        return
    from torch.utils.data.dataloader import _DatasetKind

    orig = _DatasetKind.__dict__["create_fetcher"]
    _FETCHER[0] = orig.__func__ if isinstance(orig, staticmethod) else orig
    _DatasetKind.create_fetcher = staticmethod(_create_fetcher)  # type: ignore[method-assign]


def _create_fetcher(kind: Any, dataset: Any, auto_collation: Any, collate_fn: Any,
                    *args: Any, **kwargs: Any) -> Any:  # fmt: skip
    if isinstance(collate_fn, Collate):
        dataset = collate_fn.reader(dataset)
    return _FETCHER[0](kind, dataset, auto_collation, collate_fn, *args, **kwargs)


def set_swaps(swaps: Any, plain: bool) -> list[Any]:
    """The dataset copy's transforms (and loader) set back to the user's own, or to their timed
    stand-ins again: an unprofiled batch runs none of pipeprof's frames. Only where the copy
    holds the one expected (a user's ``worker_init_fn`` may have set one of its own there,
    which then runs in every batch); returns the swaps made, the ones to undo."""
    done = []
    for swap in swaps:
        obj, attr, users, timed = swap
        if getattr(obj, attr, None) is (timed if plain else users):
            setattr(obj, attr, users if plain else timed)
            done.append(swap)
    return done


# NOTE [ Unprofiled batches ], in a worker: its batches so far; the batch in hand's arm ("on",
# "off", "cold": unprofiled but outside the comparison, or None: profiled, outside it); while an
# unprofiled batch is in hand, when its fetch began and the stand-ins to set again (all reset in
# ``WorkerInit``)
_WORKER_AB = [0]
_ARM: list[str | None] = [None]
_OFF: list[tuple[int, Any] | None] = [None]


def _end_off() -> None:
    """The unprofiled batch in hand is made (or failed): the stand-ins and the recorder back."""
    off, _OFF[0] = _OFF[0], None
    if off is not None:
        set_swaps(off[1], plain=False)
        recorder().enabled = True


class MapDataset(_Delegate, Dataset):  # type: ignore[type-arg]
    """Times ``dataset[i]`` as ``load`` (its transform, timed apart, is subtracted).

    A batch goes through ``__getitems__``: the DataLoader's fetcher calls it once per batch
    where it would call ``dataset[i]`` per sample, so the wrapper's own frame (0.5-0.8 µs a
    sample between cheap samples, docs/validation/overhead.md) is paid once a batch. The user's
    dataset has none (else ``MapDatasetItems``): each sample is still its own ``dataset[i]``, as
    plain.
    """

    def __getitem__(self, index: Any) -> Any:
        if not recorder().enabled:
            return self._inner[index]
        return timed_call1("load", self._inner.__getitem__, index)

    def __getitems__(self, indices: list[Any]) -> list[Any]:
        get = self._inner.__getitem__
        sketch = self.__dict__.get("_sketch")  # NOTE [ Index sketches ] in core/batch.py
        if sketch is not None:
            sketch.add(indices)
        if not recorder().enabled:
            return [get(i) for i in indices]
        if "_ab" in self.__dict__ and self._off_batch():
            try:
                return [get(i) for i in indices]
            except BaseException:
                _end_off()  # the stand-ins and the recorder back
                raise
        return [timed_call1("load", get, i) for i in indices]

    def _off_batch(self) -> bool:
        """NOTE [ Unprofiled batches ], in a worker: whether the batch now fetched is one of its
        unprofiled ones (after its first ``first``, all but one in ``stage_every``); if so the
        recorder is off and the user's transforms are back until ``Collate`` has made it."""
        ab = self.__dict__["_ab"]
        if ab is None or _OFF[0] is not None:
            _ARM[0] = None
            return False
        every, phase, first = ab
        k = _WORKER_AB[0]
        _WORKER_AB[0] = k + 1
        if k < first:  # one of the profile's first batches: profiled, outside the comparison
            _ARM[0] = FIRST
            return False
        if (k + phase) % every == every // 2:
            _ARM[0] = "on" if k else None  # its first batch is cold: compared with none
            return False
        _ARM[0] = "off" if k else "cold"
        recorder().enabled = False
        _OFF[0] = (clock(), set_swaps(self.__dict__.get("_swaps", ()), plain=True))
        return True


class MapDatasetItems(MapDataset):
    """For datasets with ``__getitems__`` (batched fetch): one ``load`` call covers the batch."""

    def __getitems__(self, indices: list[Any]) -> Any:
        rec = recorder()
        sketch = self.__dict__.get("_sketch")  # NOTE [ Index sketches ] in core/batch.py
        if sketch is not None:
            sketch.add(indices)
        if not rec.enabled:
            return self._inner.__getitems__(indices)
        if "_ab" in self.__dict__ and self._off_batch():
            try:
                return self._inner.__getitems__(indices)
            except BaseException:
                _end_off()  # the stand-ins and the recorder back
                raise
        frame = rec.open("load")
        try:
            return self._inner.__getitems__(indices)
        finally:
            rec.close(frame, max(1, len(indices)), detach=True)


class IterDataset(_Delegate, IterableDataset):  # type: ignore[type-arg]
    """Times every ``next()`` on the user's iterable as ``load`` (``iter()`` goes to the first).

    For a torchdata StatefulDataLoader (``stateful``) the iterator is made at once and its state
    stays reachable (NOTE [ A stateful loader, dressed ], case 5)."""

    def __init__(self, dataset: Any, stateful: bool = False) -> None:
        super().__init__(dataset)
        object.__setattr__(self, "_stateful", stateful)
        object.__setattr__(self, "_own_iter", False)  # the dataset is its own iterator

    def __getattr__(self, name: str) -> Any:
        if name in _STATE_METHODS and self.__dict__.get("_own_iter"):
            raise AttributeError(name)  # its state is the iterator's, saved once, as plain
        return super().__getattr__(name)

    def __iter__(self) -> Iterator[Any]:
        if not self.__dict__.get("_stateful"):
            return self._timed(None)
        # a WebDataset's steps timed on a copy (NOTE [ WebDataset pipelines ]), where the
        # snapshots keep no state of the dataset's that the copy would hold apart
        source = self._inner if _has_state(self._inner) else steps_timed(self._inner)
        it = iter(source)
        object.__setattr__(self, "_own_iter", it is self._inner)
        if timed_pipeline(source):  # its steps are timed: ``load`` is theirs
            return it  # type: ignore[no-any-return]
        return TimedState(it) if _has_state(it) else self._timed(it)

    def _timed(self, it: Iterator[Any] | None) -> Iterator[Any]:
        if it is None and timed_pipeline(self._inner):  # NOTE [ WebDataset pipelines ]
            yield from self._inner
            return
        rec = recorder()
        frame = rec.open("load") if rec.enabled else None
        if it is None:
            it = iter(self._inner)
        while True:
            if frame is None and rec.enabled:
                frame = rec.open("load")
            try:
                item = next(it)
            except BaseException:
                if frame is not None:
                    rec.discard(frame)
                if isinstance(sys.exc_info()[1], StopIteration):
                    return
                raise
            if frame is not None:
                rec.close(frame, 1, detach=True)
                frame = None
            yield item


_STATE_METHODS = ("state_dict", "load_state_dict")  # torchdata's ``Stateful``


def _has_state(it: Any) -> bool:
    """Whether torchdata would save ``it``'s state (its ``Stateful`` protocol)."""
    return all(callable(getattr(it, name, None)) for name in _STATE_METHODS)


class TimedState:
    """A stateful iterator's ``next()`` timed as ``load``; its ``state_dict()`` and
    ``load_state_dict()`` are its own (NOTE [ A stateful loader, dressed ], case 5)."""

    __slots__ = ("_it",)

    def __init__(self, it: Any) -> None:
        self._it = it

    def __iter__(self) -> TimedState:
        return self

    def __next__(self) -> Any:
        rec = recorder()
        if not rec.enabled:
            return next(self._it)
        frame = rec.open("load")
        try:
            item = next(self._it)
        except BaseException:
            rec.discard(frame)
            raise
        rec.close(frame, 1, detach=True)
        return item

    def state_dict(self) -> Any:
        return self._it.state_dict()

    def load_state_dict(self, state: Any) -> None:
        self._it.load_state_dict(state)


class Collate:
    """Times ``collate_fn`` and ships the process's records with the batch it made."""

    ab: tuple[int, int, int] | None  # set for workers only (``ProfiledLoader._arm_workers``)

    def __init__(
        self, fn: Callable[[Any], Any], per_sample: bool, swaps: list[Any] | None = None
    ) -> None:
        self.fn = fn
        self.per_sample = per_sample
        self.described = False  # what a sample holds was said (each worker has its own copy)
        # NOTE [ Unprofiled batches ]: the dataset copy's stand-ins and what they stand in for;
        # ``ab``, once set (``ProfiledLoader._arm_workers``), the workers' rule
        self.swaps = swaps if swaps is not None else []
        # a torchdata StatefulDataLoader's (NOTE [ A stateful loader, dressed ])
        self.stateful = False
        # NOTE [ Sample fingerprints ] in core/batch.py: the batches of an iterable dataset left
        # to fingerprint in this process (set as the fetcher is made: in each worker)
        self.ids_left = 0
        # NOTE [ Index sketches ] in core/batch.py: sketch the indices read (the first pass's),
        # and the sketch's version last shipped from this process
        self.sketch = False
        self.sketcher: Sketch | None = None
        self.shipped = -1

    def reader(self, dataset: Any) -> _Delegate:
        """What torch's fetcher reads ``dataset`` through (NOTE [ The user's own dataset ])."""
        if isinstance(dataset, IterableDataset):
            # workers' streams are compared, and in a distributed job each rank's
            if get_worker_info() is not None or self.sketch:
                self.ids_left = IDS_BATCHES
            return IterDataset(dataset, self.stateful)
        items = callable(getattr(dataset, "__getitems__", None))
        wrapped = (MapDatasetItems if items else MapDataset)(dataset)
        object.__setattr__(wrapped, "_swaps", self.swaps)
        if self.sketch:  # NOTE [ Index sketches ] in core/batch.py: one per process
            if self.sketcher is None:
                self.sketcher = Sketch()
            object.__setattr__(wrapped, "_sketch", self.sketcher)
        if "ab" in self.__dict__:
            object.__setattr__(wrapped, "_ab", self.ab)
        return wrapped

    def __call__(self, samples: Any) -> Any:
        rec = recorder()
        if not rec.enabled:  # an unprofiled batch's samples, counted as a profiled one's are
            n = 1 if self.per_sample else samples_to_collate(samples)
            off = _OFF[0]
            if off is None:  # in the training process: ``ProfiledLoader`` takes it from here
                _COLLATED[0] = n
                return self.fn(samples)
            try:  # in a worker: it travels as a profiled batch does, with no records
                batch = self.fn(samples)
            finally:
                _end_off()
            end = clock()
            arm, _ARM[0] = _ARM[0], None
            now = time.process_time_ns()  # _mark_cpu, inline: NOTE [ Unprofiled batches ]
            cpu = now - _CPU_MARK[0] if _CPU_MARK[0] else None
            _CPU_MARK[0] = now
            return Carrier(batch, (rec.track, rec.pid, off[0], end, n, arm, cpu))
        probe_ns, warm_ns = probe(samples)  # NOTE [ In-situ region cost ] in core/recorder.py
        batch = timed_call1("collate", self.fn, samples)
        done = clock()  # the batch is ready: what follows is hand-over (NOTE [ Wait, split ])
        _count_padding(batch, rec)
        # packing's CPU, not its wall time, in a worker: preempted here (all cores busy) it would
        # count another process's milliseconds as pipeprof's. In the training process the clock
        # it reads anyway: a CPU clock read there cost up to tens of µs (NOTE [ The short path ])
        took = time.thread_time_ns if _CPU_MARK[0] else clock
        cpu0 = took()
        payload = rec.drain()
        payload["end_ns"] = done
        payload["samples"] = 1 if self.per_sample else samples_to_collate(samples)
        _mark_cpu(payload)
        if _ARM[0] is not None:
            payload["ab"], _ARM[0] = _ARM[0], None
        payload["probe_ns"] = probe_ns
        payload["probe_warm_ns"] = warm_ns
        if SHARDS[0]:  # NOTE [ Shards a worker opened ] in collect/torch/dataset.py
            payload["shards"], payload["first_shard_ns"] = SHARDS
        sketch = self.sketcher  # NOTE [ Index sketches ] in core/batch.py: a worker's, shipped
        if sketch is not None and sketch.version != self.shipped and _CPU_MARK[0]:
            self.shipped = sketch.version
            payload["sketch"] = sketch.packed()
        if self.ids_left:  # NOTE [ Sample fingerprints ] in core/batch.py
            self.ids_left -= 1
            payload["ids"] = fingerprints(samples, self.per_sample)
        if not self.described and not self.per_sample:  # once a process: the collate finding
            self.described = True
            first = samples[0] if isinstance(samples, (list, tuple)) and samples else samples
            payload["sample_kinds"] = sample_kinds(first)
        payload["cost_ns"] = took() - cpu0  # packing the records: pipeprof's own
        return Carrier(batch, payload)


def _count_padding(batch: Any, rec: Any) -> None:
    """A token batch's padding (NOTE [ Padding ] in analyze/tokens.py): where the batch is a
    mapping with a 2-D ``attention_mask`` tensor (what Hugging Face collators make), its ones
    (real tokens) and its size, summed in the sink's ``tokens``; outside the collate's time."""
    if not isinstance(batch, Mapping):
        return
    mask: Any = batch.get("attention_mask")
    if getattr(mask, "ndim", None) != 2 or not hasattr(mask, "sum"):
        return
    try:
        real, total = int(mask.sum()), int(mask.numel())
    except Exception:  # counting must never break a batch
        return
    found = counts(rec.sink).setdefault("tokens", {"batches": 0, "real": 0, "total": 0})
    found["batches"] += 1
    found["real"] += real
    found["total"] += total


def _mark_cpu(payload: dict[str, Any]) -> None:
    """In a worker, its CPU time since its previous batch: all the pipeline's (idle costs none);
    and its full garbage collections since the last batch that carried them (NOTE [ A full
    collection after fork ])."""
    if _CPU_MARK[0]:
        cpu = time.process_time_ns()
        payload["cpu_ns"] = cpu - _CPU_MARK[0]
        _CPU_MARK[0] = cpu
        if _FULL_GC[1]:
            payload["gc"] = _FULL_GC[:3]
            _FULL_GC[:3] = [0, 0, 0]


# NOTE [ A full collection after fork ]
# A forked worker starts with its parent's heap, shared page by page until written, and with its
# parent's collector counters. Its collections of the oldest generation (full ones) write to the
# header of every tracked object of that heap: each copies the pages it touches, tens of
# megabytes of a training process's modules and dataset, in every worker of every epoch whose
# workers start afresh, wherever the counters line up (docs/validation/cost.md, "Why profiled
# loops with workers ran faster than plain": a loop of 160 px JPEGs ran 20 % faster when the
# parent had collected just before its workers forked).
# Each worker times its full collections (a ``gc.callbacks`` hook, generation 2 only: the young
# ones it ignores at a dict lookup each) with the page faults they took, and the next batch that
# carries records ships them: [ns, collections, faults, start ns, start faults].
_FULL_GC = [0, 0, 0, 0, 0]


def _on_collect(phase: str, info: dict[str, Any]) -> None:
    if info["generation"] != 2:
        return
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    if phase == "start":
        _FULL_GC[3], _FULL_GC[4] = clock(), faults
    elif _FULL_GC[3]:
        _FULL_GC[0] += clock() - _FULL_GC[3]
        _FULL_GC[1] += 1
        _FULL_GC[2] += faults - _FULL_GC[4]
        _FULL_GC[3] = 0


# This worker process's CPU time when it finished its previous batch (0 outside workers).
_CPU_MARK = [0]
# The samples of the last batch collated with the recorder off (NOTE [ Unprofiled batches ])
_COLLATED: list[int | None] = [None]


class WorkerInit:
    """Readies a worker's recorder, then runs the user's ``worker_init_fn``. With ``h5`` (the
    main process had imported h5py) h5py reads are timed in the worker too (NOTE [ Timing h5py
    reads ] in collect/hdf5.py); with ``nvtx`` its stages are NVTX ranges too (NOTE [ NVTX
    ranges ] in collect/ranges.py). ``probe_base``: the training process's ``probe_base()``,
    which the worker takes instead of measuring its own (spawned workers inherit nothing)."""

    def __init__(
        self,
        fn: Callable[[int], Any] | None,
        h5: bool = False,
        nvtx: bool = False,
        probe_base: int | None = None,
        swaps: list[Any] | None = None,
        marks: list[Any] | None = None,
    ) -> None:
        self.fn = fn
        self.h5 = h5
        self.nvtx = nvtx
        self.probe_base = probe_base
        self.swaps = swaps or []  # the same list as the Collate's (one pickle, spawned workers)
        # the transforms timed in place, with the dataset in that pickle (NOTE [ Transforms
        # timed in place ] in collect/torch/dataset.py)
        self.marks = marks or []
        self.stacks: str | None = None  # NOTE [ Hangs ] in hangs.py: the stack files' folder

    def __call__(self, worker_id: int) -> None:
        hangs.ready_stacks(self.stacks)
        _install_fetcher()  # a spawned worker: before torch makes its fetcher
        apply_marks(self.marks)  # a spawned worker's objects (a fork's are marked already)
        rec = recorder()
        rec.reset(f"worker{worker_id}")
        if self.probe_base is not None:
            set_probe_base(self.probe_base)
        rec.enabled = True
        _WORKER_AB[0] = 0  # NOTE [ Unprofiled batches ]: a fork inherits the parent's
        _ARM[0] = _OFF[0] = None
        _FULL_GC[:] = [0, 0, 0, 0, 0]  # NOTE [ A full collection after fork ]
        SHARDS[:] = [0, 0]  # NOTE [ Shards a worker opened ] in collect/torch/dataset.py
        if _on_collect not in gc.callbacks:
            gc.callbacks.append(_on_collect)
        if self.nvtx or rec.ranges is not None:  # asked for, or inherited through fork
            from pipeprof.collect import ranges

            ranges.in_worker(self.nvtx)
        if self.h5:
            try:
                import h5py  # noqa: F401  (a spawned worker may not have imported it yet)
            except ImportError:
                pass
        if "fsspec" in sys.modules:  # NOTE [ fsspec's async filesystems ] in collect/fetch.py
            import fsspec.asyn
            import fsspec.implementations.local  # noqa: F401  (its files: 8 there)
        netreads.LATE[0] = True
        for patch in READS:  # for the worker's life: the process is the profiled loader's own
            patch.install()
        if self.fn is not None:  # it sees the dataset's own transforms, not their stand-ins
            plain = set_swaps(self.swaps, plain=True)
            try:
                self.fn(worker_id)
            finally:
                set_swaps(plain, plain=False)
        _CPU_MARK[0] = time.process_time_ns()


_LOADER_ARGS = (
    "num_workers",
    "pin_memory",
    "timeout",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory_device",
    "in_order",
)


@functools.cache
def _loader_params() -> frozenset[str]:
    """What this torch's ``DataLoader()`` takes (asked once: a loader is rebuilt every epoch)."""
    return frozenset(inspect.signature(DataLoader.__init__).parameters)


def build_loader(loader: DataLoader, nvtx: bool = False) -> tuple[DataLoader, list[str]]:
    """A DataLoader equal to ``loader`` but with timed dataset, collate and worker init
    (``nvtx``: the workers emit NVTX ranges too)."""
    _install_fetcher()  # NOTE [ The user's own dataset ]
    swaps: list[Any] = []
    marks: list[Any] = []  # NOTE [ Transforms timed in place ] in collect/torch/dataset.py
    dataset, notes = instrument_dataset(loader.dataset, swaps, marks)
    if isinstance(loader.dataset, IterableDataset):
        kwargs: dict[str, Any] = {"batch_size": loader.batch_size, "drop_last": loader.drop_last}
    else:
        if loader.batch_sampler is not None:
            kwargs = {"batch_sampler": loader.batch_sampler}
        else:
            kwargs = {"sampler": loader.sampler, "batch_size": None}
    accepted = _loader_params()
    for name in _LOADER_ARGS:
        if name in accepted and hasattr(loader, name):
            kwargs[name] = getattr(loader, name)
    if not kwargs.get("num_workers"):
        kwargs.pop("prefetch_factor", None)
        kwargs.pop("persistent_workers", None)
    kwargs["collate_fn"], kwargs["worker_init_fn"] = timed_fns(loader, nvtx, swaps, marks)
    return DataLoader(dataset, **kwargs), notes


def timed_fns(loader: DataLoader, nvtx: bool, swaps: list[Any] | None = None,
              marks: list[Any] | None = None) -> tuple[Collate, WorkerInit]:  # fmt: skip
    """Pipeprof's ``collate_fn`` and ``worker_init_fn`` around ``loader``'s own."""
    per_sample = loader.batch_size is None and loader.batch_sampler is None
    base = probe_base() if loader.num_workers else None  # measured here, once a process
    if "fsspec" in sys.modules:  # once: forked workers inherit them (NOTE [ fsspec's async
        import fsspec.asyn  # filesystems ] in collect/fetch.py)
        import fsspec.implementations.local  # noqa: F401
    return (
        Collate(loader.collate_fn, per_sample, swaps),
        WorkerInit(loader.worker_init_fn, "h5py" in sys.modules, nvtx, base, swaps, marks),
    )


# NOTE [ A stateful loader, dressed ]
# torchdata's StatefulDataLoader iterates itself (its own ``__iter__`` and iterators), so no twin
# stands in for it: a rebuilt loader would not resume from its ``state_dict()`` as it does. It
# makes its batches as torch's loaders do, though: a fetcher from ``_DatasetKind.create_fetcher``
# over its dataset, its ``collate_fn``, its ``worker_init_fn`` in each worker. So while ``iter()``
# makes its iterator (and starts its workers), the loader holds pipeprof's ``Collate`` and
# ``WorkerInit`` around its own (``dressed``), then its own again:
# 1. the iterator, and the workers it started, keep pipeprof's, so each batch comes as a
#    ``Carrier`` with its ``load`` and ``collate`` timed where they ran. The dataset is the user's
#    own object (its snapshots save its state), so its transforms are inside ``load``;
# 2. user code sees the loader's own attributes at any other time;
# 3. an iterator made earlier, by a ``state_dict()`` before the first pass, started its workers
#    undressed: that pass's batches carry no stages, and its wait is not split (a note says so);
# 4. persistent workers go on packing carriers once profiling stopped: their batches are taken
#    out of them (``unwrapped``, NOTE [ Persistent workers past the profile ] in
#    attach/patches.py).
# 5. an iterable dataset's iterator is made when the fetcher is (torchdata restores its state
#    right after), not at the first ``next()``, so its ``iter()`` is in no stage. Where that
#    iterator has a state (``state_dict``/``load_state_dict``) it is timed by a ``TimedState``,
#    which forwards both, so the snapshots save and restore it as plain; where the dataset is
#    its own iterator, the dataset's reader hides its methods, so its state is saved once, as
#    plain. A WebDataset pipeline (no state of its own) is iterated through a copy whose steps
#    are timed (``steps_timed``), as a rebuilt loader's is.
# A subclass that overrides torchdata's iteration stays as it is: the wait per batch.
_TORCHDATA = "torchdata.stateful_dataloader."


def dressable(loader: DataLoader) -> bool:
    """A loader whose own iteration is all torchdata's (NOTE above)."""
    seen = False
    for cls in type(loader).__mro__:
        if cls is DataLoader:
            break
        own = any(name in vars(cls) for name in ("__iter__", "_get_iterator", "__len__"))
        if own and not cls.__module__.startswith(_TORCHDATA):
            return False
        seen = seen or own
    return seen


_DRESSED = ("collate_fn", "worker_init_fn")


@contextlib.contextmanager
def dressed(loader: DataLoader, fns: tuple[Any, Any] | None) -> Iterator[None]:
    """``loader`` holding ``fns`` (a ``collate_fn`` and a ``worker_init_fn``) inside the block,
    its own before and after (NOTE [ A stateful loader, dressed ]); ``fns`` None: as it is."""
    if fns is None:
        yield
        return
    own = vars(loader)
    saved = {k: own[k] for k in _DRESSED if k in own}
    own.update(zip(_DRESSED, fns))
    try:
        yield
    finally:
        for k in _DRESSED:
            if k in saved:
                own[k] = saved[k]
            else:
                own.pop(k, None)


def check_device(device: Any) -> torch.device | None:
    """``device`` as a torch.device, refusing one this machine cannot use."""
    if device is None:
        return None
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device={device!r} is not a torch device ({exc})") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"device={device!r} but CUDA is not available here: pass device=None (or 'cpu') "
            "to profile without a host-to-device copy"
        )
    return dev


def move_to(batch: Any, device: torch.device, non_blocking: bool) -> Any:
    """``batch`` with every tensor moved to ``device``, structure kept (as a training loop does)."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return type(batch)({k: move_to(v, device, non_blocking) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_to(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to(v, device, non_blocking) for v in batch)
    to = getattr(batch, "to", None)
    if callable(to):
        return to(device, non_blocking=non_blocking)
    return batch


class ProfiledLoader:
    """Iterates a profiled twin of ``loader`` and records into ``session``.

    Yields exactly the batches ``loader`` would (moved to ``device`` when one is given). With
    ``ranges`` (NVTX, collect/ranges.py) each wait and each copy is a range, and the workers
    emit their stages. ``limit``: the batches a pass will take, where the caller knows it.
    ``stage_every``: the loader's stages are timed in one batch in that many after the
    profile's first TIMED_FIRST, in a pass of at least SAMPLE_MIN_BATCHES batches (NOTE
    [ Unprofiled batches ]); 1 times every batch.
    """

    def __init__(
        self,
        loader: DataLoader,
        session: Session,
        device: Any = None,
        ranges: Any = None,
        limit: int | None = None,
        stage_every: int = STAGE_EVERY,
        hang_s: float | None = HANG_S,
    ) -> None:
        t0 = clock()
        self.user_loader = loader
        # NOTE [ Hangs ] in hangs.py: the watchdog's threshold, what it reads of the pass, and
        # what it calls once it has recorded a hang (the owner's snapshot)
        self.hang_s = hang_s
        self.thread_id: int | None = None
        self.on_hang: Callable[[], None] | None = None
        self._current: Any = None  # the pass's torch iterator, by a weak reference
        self._watchdog: hangs.Watchdog | None = None
        hangs.ready(hang_s)  # the watcher's thread, out of the pass's iter()
        self.stage_every = stage_every  # NOTE [ Unprofiled batches ]
        self.seen = 0  # batches yielded over all passes
        # NOTE [ The live view ] in collect/live.py: the loop's wait so far, and the part of it
        # during which the batch was not ready (read by the live view's thread)
        self.wait_ns = 0
        self.starved_ns = 0
        # the workers tell the profile's first batches (arm FIRST), else the count of them does;
        # those batches' stage time until ``_publish_first`` (NOTE [ Unprofiled batches ])
        self._ruled = False
        self._first: dict[str, Any] = {"batches": 0, "samples": 0, "ns": {}}
        self.opaque = own_iteration(loader)
        # NOTE [ A stateful loader, dressed ]: the pass's timed functions, and the iterators
        # made while the loader held them
        self.dressable = bool(self.opaque) and dressable(loader)
        self._dress: tuple[Collate, WorkerInit] | None = None
        self._dressed_its: weakref.WeakSet[Any] = weakref.WeakSet()
        if self.opaque:  # a rebuilt loader would not yield what this one does: time it as it is
            what = f"{type(loader).__name__} overrides {', '.join(self.opaque)}"
            note = (
                f"{what}: it runs as it is; its samples' load (with their transforms) and its "
                "collate are timed where it makes its batches"
                if self.dressable
                else f"{what}: it runs as it is, so pipeprof times the wait per batch, no stage "
                "in it"
            )
            self.loader, notes = loader, [note]
        else:
            self.loader, notes = build_loader(loader, ranges is not None)
        self.ranges = ranges
        self.passes = 0
        self.own_ns = 0  # pipeprof's own time on this thread, inside next() (not the user's)
        self.transfer_ns = 0  # time spent moving batches to ``device`` so far
        self.last_starved = 0  # the last batch's wait until it was ready (NOTE [ Wait, split ])
        self._samples = 0  # the last batch's samples
        self.limit = limit  # the batches a pass will take, where known beforehand
        self._sinks: tuple[dict[str, list[int]], bool] = ({}, False)
        self._swapped: list[Any] = []  # the stand-ins an unprofiled batch set aside
        self._lean = [0, 0, 0]  # NOTE [ The short path ]: its batches, samples, own ns so far
        self._fast_own = 0  # NOTE [ Workers' batches, past the generators ]: their own ns
        self._opened: Any = (None, None)  # a pass's torch iterator and short path, for ``open``
        self._starts: list[float] = []  # ms of ``iter()`` per worker it started, each pass
        self._ends = epochs.PassEnds(0)  # when each worker's batches of this pass came
        self._shm_free: tuple[float, float] | None = None  # NOTE [ Shared memory ] in shm.py
        self.session = session
        session.notes.extend(notes)
        self.device = check_device(device)
        self.h2d = H2DTimer(self.device) if self.device is not None else None
        self.non_blocking = bool(loader.pin_memory)
        session.meta.update(describe(loader, self.device))
        if self.h2d is not None:  # the GPU's copy time, or the CPU clock's (analyze/loop.py)
            session.meta["h2d_clock"] = "cuda" if self.h2d.cuda else "cpu"
        if not self.opaque or self.dressable:  # each batch comes stamped with when it was ready
            session.meta["wait_split"] = True
        session.add_cost("setup_ns", clock() - t0)

    def __len__(self) -> int:
        return len(self.loader)

    @property
    def warmup_steps(self) -> int:
        """Batches until every worker has delivered one: the start-up of an epoch."""
        return max(1, self.loader.num_workers)

    def __iter__(self) -> Iterator[Any]:
        return self.open()[0]

    def open(
        self, expose: bool = False, hand: bool = False
    ) -> tuple[Iterator[Any], Any, ShortPass | None]:
        """A pass begun (its workers started, as a plain ``iter()`` starts them): its batches;
        with ``expose`` the twin's own torch iterator where the pass can answer for it (else
        None: NOTE [ The user's own iterator ]), and then the pass's short way past it where it
        has one (``fast_next``: NOTE [ The fast path ] in attach/run.py), with ``expose`` or
        ``hand`` (``Profiler.wrap``'s passes, which keep torch's iterator to themselves)."""
        passes = self._pass(expose, hand)
        next(passes)  # the pass's start; closing it from here on ends the pass
        (it, short), self._opened = self._opened, (None, None)
        return passes, it, short

    def fast_next(self, short: ShortPass) -> Any:
        """One of ``short.left`` batches the pass said are next and take the short path,
        fetched past the pass's generator (NOTE [ The fast path ] in attach/run.py); when the
        pass's batches are over, StopIteration, and the pass ends when it is next asked."""
        short.left -= 1
        try:
            if short.workers:
                return self._short_worker(short)
            return self._short(short.fetch, short.swaps, short)
        except StopIteration:
            short.left, short.ended = 0, True
            raise
        except Exception as exc:
            self._failed(exc)
            raise

    def _short_swaps(self) -> list[Any]:
        """What a batch on the short path sets back to the user's own: the dataset copy's
        stand-ins and, in this process, the classes its transforms are timed through."""
        swaps = list(getattr(self._collate_fn(), "swaps", ()))
        if not self.loader.num_workers:
            init = self._dress[1] if self._dress is not None else self.loader.worker_init_fn
            swaps += class_swaps(getattr(init, "marks", ()))
        return swaps

    def _short(self, fetch: Any, swaps: list[Any], short: ShortPass) -> Any:
        """An unprofiled batch outside the comparison (NOTE [ The short path ]); its fetch's
        start and end in ``short.t0`` / ``t1``."""
        rec = recorder()
        rec.enabled = False
        done = set_swaps(swaps, plain=True) if swaps else swaps
        _COLLATED[0] = None
        t0 = clock()
        try:
            carrier = fetch()
        finally:
            if done:
                set_swaps(done, plain=False)
            rec.enabled = True
        t1 = clock()
        self.seen += 1
        n = _COLLATED[0]
        n = self._samples = n if n is not None else batch_size(carrier)
        self.session.defer_batch(t0, t1, n, short.span)  # all of its wait starved: not known
        self.last_starved = t1 - t0
        self.wait_ns += t1 - t0  # NOTE [ The live view ] in collect/live.py
        self.starved_ns += t1 - t0
        lean = self._lean
        lean[0] += 1
        lean[1] += n
        short.t0, short.t1 = t0, t1
        own = clock() - t1
        self.own_ns += own
        lean[2] += own
        short.own = own
        return carrier

    def _short_worker(self, short: ShortPass) -> Any:
        """A worker's batch fetched past the pass's generator (NOTE [ Workers' batches, past the
        generators ]): unpacked and booked as the pass would, its fetch's start and end and its
        starved part in ``short``."""
        t0 = clock()
        carrier = short.fetch()
        t1 = clock()
        self.seen += 1
        batch = self._unpack(carrier, t0, t1, None, short.span)
        self.wait_ns += t1 - t0  # NOTE [ The live view ] in collect/live.py
        self.starved_ns += self.last_starved
        short.t0, short.t1, short.starved = t0, t1, self.last_starved
        own = clock() - t1
        self.own_ns += own
        self._fast_own += own
        short.own = own
        return batch

    def _pass(self, expose: bool, hand: bool = False) -> Iterator[Any]:
        persistent = self.loader.persistent_workers and self.loader.num_workers
        if self.passes and not (persistent or self.opaque):
            # A new pass reads the dataset as it is now (``set_epoch`` and the like), as the plain
            # loader's fresh workers would; persistent workers keep theirs, as they do unprofiled.
            t0 = clock()
            self.loader = build_loader(self.user_loader, self.ranges is not None)[0]
            self.session.add_cost("setup_ns", clock() - t0)
        self.passes += 1
        self._check_fork()
        # NOTE [ An epoch's samples ] in collect/torch/epochs.py: the sampler as this pass starts
        epoch, samples0 = epochs.epoch_of(self.user_loader), self.session.samples
        # NOTE [ Shared memory ] in shm.py: what /dev/shm has free before the workers write
        self._shm_free = shm.free_mb() if self.loader.num_workers else None
        self._ends = epochs.PassEnds(clock())
        if self.passes == 1:
            if not self.loader.num_workers:  # NOTE [ Shards a worker opened ]: this profile's
                SHARDS[:] = [0, 0]
            self.session.meta["sampler"] = epochs.sampler_facts(self.user_loader)
            # NOTE [ Copy-on-read ] in collect/torch/memory.py: what forked workers would copy
            self.session.meta["py_containers"] = memory.python_containers(self.user_loader.dataset)
        rec = recorder()
        mine, first_profile = rec.begin()
        self._sinks = (mine, first_profile)
        patched: list[Any] = []
        try:
            # reads in this process (num_workers=0) are timed while the pass runs
            patched = [patch for patch in READS if patch.install()]
            self._dress_up()
            collate = self._collate_fn()
            if isinstance(collate, Collate):  # NOTE [ Index sketches ]
                collate.sketch = self.passes == 1 and ranks.from_env().distributed
            if self.loader.num_workers and (not self.opaque or self.dressable):
                self._arm_workers()
                if self.session.meta.get("multiprocessing_context") == "fork":
                    _cache_own_source()
            self._watch()  # NOTE [ Hangs ] in hangs.py
            t_iter = clock()
            prior = vars(self.loader).get("_iterator")  # NOTE [ A stateful loader, dressed ]
            before = rec.enter(mine)
            try:
                with dressed(self.loader, self._dress):
                    it = iter(self.loader)
            finally:
                rec.leave(before)
            self._dressed_now(it, prior)
            del prior
            self._current = weakref.ref(it)
            started_ns = clock() - t_iter  # the workers forked: noted at the first batch
            span = WAIT_SPAN.format(type(it).__name__)
            fetch = it.__next__
            nv = self.ranges
            plan = BatchPlan(self.stage_every, self._ab_eligible(), nv is None and self.h2d is None)
            swaps = self._short_swaps()
            # NOTE [ Workers' batches, past the generators ]
            workers = bool(self.loader.num_workers) and not self.opaque and plan.lean
            short = ShortPass(fetch, swaps, span, workers)
            warmup = self.warmup_steps
            fast = False  # batches fetched past this generator (NOTE [ The fast path ])
            if expose and not persistent and self.h2d is None and _answerable(it):
                # NOTE [ The user's own iterator ]: the user calls its __next__, which asks this
                # pass for the batch; the pass reads torch's own, by a weak reference
                short.fetch = fetch = functools.partial(_raw_next, weakref.ref(it))
                fast = (plan.sampled and plan.lean) or workers
                self._opened = (it, short if fast else None)
            elif hand and plan.sampled and plan.lean:  # Profiler.wrap's pass reads torch's own
                fast = True
                self._opened = (None, short)
            del it
            yield None  # begun: ``open`` returns
            first = True
            k = -1  # this pass's batch
            while True:
                k += 1
                if short.ended:  # the last asked for past this generator: none came
                    return
                short.left = 0  # asked here: the batches said to be next are this one's
                alone = rec.active == 1
                on_short, off, measure = plan.choose(self.seen, k, alone)
                if on_short:
                    try:
                        carrier = self._short(fetch, swaps, short)
                    except StopIteration:
                        return
                    if fast:
                        short.left = plan.short_run(self.seen, alone)
                    held, carrier = [carrier], None  # NOTE [ A suspended pass holds no batch ]
                    yield held.pop()
                    continue
                # This thread records into this iteration's sink while the pipeline runs on it
                # (NOTE [ Whose records ] in core/recorder.py): num_workers=0, the copy.
                t_pre = clock()  # what comes before the fetch is pipeprof's too (a CPU clock read)
                before = rec.enter(mine)
                try:
                    try:
                        carrier, t0, t1, cpu = self._fetch(fetch, off, measure, rec)
                    except StopIteration:
                        return
                    n = _COLLATED[0] if off else None
                    batch = self._unpack(carrier, t0, t1, t_iter if first else None, span, n)
                    self.wait_ns += t1 - t0  # NOTE [ The live view ] in collect/live.py
                    self.starved_ns += self.last_starved
                    if first:  # in this batch's bookkeeping, not in its wait
                        self._count_start(started_ns, persistent)
                    first = False
                    s = self.session
                    if measure or off:
                        arm = ("ab_off" if off else "ab_on") if measure else "ab_cold"
                        s.defer(self._ab_add, arm, cpu, self._samples)
                    batch, copy_ns = self._transfer(batch, rec)
                    self._merge_main(rec)
                    if fast:
                        short.left = (
                            (SHORT_RUN_MOST if alone and k + 1 >= warmup else 0)
                            if workers else plan.short_run(self.seen, alone)
                        )
                    own = clock() - t1 - copy_ns + t0 - t_pre  # pipeprof's, for this batch
                    self.own_ns += own
                    s.defer(s.add_cost, "main_ns", own)
                finally:
                    rec.leave(before)
                # NOTE [ A suspended pass holds no batch ]
                held, batch, carrier = [batch], None, None
                yield held.pop()
        finally:
            if sys is None:  # a pass left open until the interpreter's teardown: nothing left
                return  # noqa: B012 (its modules are gone; the report was made before, or never)
            failing = sys.exc_info()[1]  # the loop's own exception, if one is on its way out
            if failing is not None:
                self._failed(failing)
            try:
                self.flush()
                if failing is None:  # the pass ran to its end (a break closes it: GeneratorExit)
                    end = clock()
                    epochs.record_pass(self.session.meta, epoch, self.session.samples - samples0,
                                       self._ends.tail(end), end)  # fmt: skip
            except Exception as exc:
                if failing is None:
                    raise
                self.session.notes.append(f"pipeprof: the end of this pass failed too ({exc!r})")
            finally:
                rec.end()
                self.stop_watch()  # NOTE [ Hangs ] in hangs.py
                for patch in patched:
                    patch.uninstall()

    def _fetch(
        self, fetch: Any, off: bool, measure: bool, rec: Any
    ) -> tuple[Any, int, int, int]:
        """A batch fetched off the short path: ``(carrier, t0, t1, cpu)``, its fetch's start
        and end and, where ``measure``, the process's CPU in it (NOTE [ Unprofiled batches ]);
        with ``off`` the recorder off and the user's own transforms back. StopIteration: the
        pass is over."""
        nv = self.ranges
        if nv is not None:
            nv.open("wait")
        if off:
            rec.enabled = False
            self._swap(plain=True)
            _COLLATED[0] = None
        c0 = time.process_time_ns() if measure else 0
        t0 = clock()
        try:
            carrier = fetch()
            t1 = clock()
        finally:
            cpu = time.process_time_ns() - c0 if measure else 0
            if off:
                self._swap(plain=False)
                rec.enabled = True
            if nv is not None:
                nv.pop()
        self.seen += 1
        return carrier, t0, t1, cpu

    def _transfer(self, batch: Any, rec: Any) -> tuple[Any, int]:
        """The batch copied to the device where the user asked (``device=``), and the copy's
        ns (0: no copy)."""
        if self.h2d is None:
            return batch, 0
        nv = self.ranges
        if nv is not None:
            nv.open("transfer")
        t2 = clock()
        batch = self.h2d.move(batch, self.non_blocking, rec)
        copy_ns = clock() - t2
        if nv is not None:
            nv.pop()
        self.transfer_ns += copy_ns
        return batch, copy_ns

    def _count_start(self, ns: int, persistent: Any) -> None:
        """``iter()`` forks the workers one after the other before the first batch: its time
        per worker (``meta["worker_start_ms"]``, the median over the passes that started them)
        is what each more worker adds to an epoch's start-up (``workers-needed``)."""
        n = self.loader.num_workers
        if not n or self.opaque or (persistent and self.passes > 1):
            return
        self._starts.append(ns / 1e6 / n)
        self.session.meta["worker_start_ms"] = round(statistics.median(self._starts), 3)

    def _ab_eligible(self) -> bool:
        """NOTE [ Unprofiled batches ]: a pass made in this thread, long enough to sample; from
        batch ``stage_every_from`` on, one cycle in AB_PAIRS_EVERY is timed (NOTE [ The short
        path ])."""
        if self.loader.num_workers or not self._sampled():
            return False
        self.session.meta["stage_every_from"] = TIMED_FIRST + AB_PAIRS_FIRST * self.stage_every
        self.session.meta["stage_every_later"] = AB_PAIRS_EVERY * self.stage_every
        return True

    def _sampled(self) -> bool:
        """NOTE [ Unprofiled batches ]: whether this pass times its stages in a sample of its
        batches: a long one, or the second of a loop over a shorter loader's epochs (a short
        one-off keeps every record). Said in ``meta["stage_every"]`` once a pass does, with
        ``meta["timed_first"]``, the profile's first batches timed all the same."""
        if self.stage_every < 2 or not self._ab_long(SAMPLE_MIN_BATCHES if self.passes < 2 else 1):
            return False
        self.session.meta["stage_every"] = self.stage_every
        self.session.meta["timed_first"] = TIMED_FIRST
        return True

    def _ab_long(self, least: int) -> bool:
        """A map-style pass of at least ``least`` batches, with no NVTX ranges: it can spare
        some batches unprofiled (NOTE [ Unprofiled batches ])."""
        if (self.opaque and not (self.dressable and self.loader.num_workers)) or self.ranges:
            return False
        if isinstance(self.loader.dataset, IterableDataset):  # its length is a guess, if any
            return False
        try:
            n = len(self.loader)
        except Exception:  # a length the user's sampler cannot give
            return False
        return min(n, self.limit if self.limit is not None else n) >= least

    def _swap(self, plain: bool) -> None:
        if plain:
            # a twin's (a dressed loader's passes are all timed in process: ``_ab_long``)
            self._swapped = set_swaps(getattr(self.loader.collate_fn, "swaps", ()), True)
        else:
            set_swaps(self._swapped, False)

    def _collate_fn(self) -> Any:
        """The ``collate_fn`` the pass's batches are made with: pipeprof's, where the loader is
        dressed for it (NOTE [ A stateful loader, dressed ]), else the loader's."""
        return self._dress[0] if self._dress is not None else self.loader.collate_fn

    def _dress_up(self) -> None:
        """NOTE [ A stateful loader, dressed ]: the timed functions the loader holds while its
        iterator is made, around its own as they are now (kept while they are the same, so
        persistent workers and the pass agree on the one they hold)."""
        if not self.dressable:
            return
        dress, loader = self._dress, self.loader
        if dress is None or (dress[0].fn, dress[1].fn) != (loader.collate_fn,
                                                           loader.worker_init_fn):  # fmt: skip
            _install_fetcher()  # NOTE [ The user's own dataset ]
            self._dress = timed_fns(loader, self.ranges is not None)
            self._dress[0].stateful = True

    def _dressed_now(self, it: Any, prior: Any) -> None:
        """Whether the pass's iterator was made dressed (NOTE [ A stateful loader, dressed ]):
        made by this ``iter()`` (not ``prior``, the loader's before it), or dressed when it was
        made; one made undressed (case 3) carries no stages and no split of the wait."""
        if not self.dressable:
            return
        if it is not prior:
            self._dressed_its.add(it)
        elif it not in self._dressed_its:
            self.session.meta.pop("wait_split", None)
            note = (f"pass {self.passes} of {type(self.loader).__name__} went on with an iterator "
                    "made before it (a state_dict() before the pass): no stages in its batches")
            if note not in self.session.notes:
                self.session.notes.append(note)

    def _arm_workers(self) -> None:
        """NOTE [ Unprofiled batches ]: the workers' rule for this pass (workers that persist
        keep the one they started with)."""
        collate = self._collate_fn()
        if isinstance(self.loader.dataset, IterableDataset) or not isinstance(collate, Collate):
            return
        # each worker's count of batches goes on from the last pass's (``seen`` shared out), so
        # that workers started afresh for each of a short loader's epochs take their turn; of
        # the profile's first TIMED_FIRST batches, those still to come are each worker's first
        # (workers take a pass's batches in turn: rounded up, every one of them is timed)
        workers = self.loader.num_workers
        phase = self.seen // workers % self.stage_every
        first = -(-max(0, TIMED_FIRST - self.seen) // workers)
        ab = (self.stage_every, phase, first) if self._sampled() else None
        collate.ab = ab
        if self.passes < 2 or not self.loader.persistent_workers:  # the workers starting now
            self._ruled = ab is not None

    def _ab_add(self, arm: str, cpu_ns: int, samples: int) -> None:
        if samples <= 0:
            return
        per = cpu_ns // samples  # per-sample CPU of this batch, for the spread between batches
        keys = _AB_KEYS.get(arm)
        if keys is None:
            keys = _AB_KEYS[arm] = tuple(f"{arm}_{k}" for k in _AB_PARTS)
        self.session.add_costs(zip(keys, (1, samples, cpu_ns, per, per * per)))

    def _check_fork(self) -> None:
        """h5py handles the workers about to fork would inherit (docs/hdf5.md): in meta."""
        if self.opaque or not self.loader.num_workers or "h5py" not in sys.modules:
            return
        if self.session.meta.get("multiprocessing_context") != "fork":
            return  # spawn and forkserver pickle the dataset, which h5py refuses: no hazard
        t0 = clock()
        try:
            handles = hdf5.inherited_handles(self.user_loader.dataset)
        except Exception as exc:  # an object that breaks the walk: say so, profile on
            self.session.notes.append(f"pipeprof: h5py handles not checked ({exc!r})")
            handles = []
        found = self.session.meta.setdefault("h5_inherited", [])
        for handle in handles:
            if handle not in found:
                found.append(handle)
        self.session.add_cost("setup_ns", clock() - t0)

    def _merge_main(self, rec: Any) -> None:
        """The main process's records: this iteration's own and, for the first profile running,
        the shared ones (the loop's ``pipeprof.stage`` regions)."""
        mine, first_profile = self._sinks
        for sink in (mine, rec.raw) if first_profile else (mine,):
            if not any(sink.values()):  # most batches: nothing recorded here (packing costs µs)
                continue
            payload = rec.drain(sink)
            if payload["events"] or "counts" in payload:
                self.session.merge(payload)

    def flush(self) -> None:
        """Bring in what the main process recorded (transfers, the user's own stages), and the
        bookkeeping of this pass's batches (deferred: ``_unpack``). The
        queued records are folded when the profile stops, not at each pass's end (NOTE
        [ Deferred aggregation ] in core/session.py)."""
        rec = recorder()
        cpu0 = time.thread_time_ns()  # the batches' bookkeeping, deferred to here: a fold's
        batches, samples, own = self._lean
        if batches:  # NOTE [ The short path ]: counted unprofiled, their bookkeeping pipeprof's
            self._lean = [0, 0, 0]
            costs = (("ab_lean_batches", batches), ("ab_lean_samples", samples), ("main_ns", own))
            self.session.add_costs(costs)
        if self._fast_own:  # NOTE [ Workers' batches, past the generators ]
            self.session.add_cost("main_ns", self._fast_own)
            self._fast_own = 0
        self.session.run_deferred()
        self._publish_first()
        sketcher = getattr(self._collate_fn(), "sketcher", None)
        if sketcher is not None and not self.loader.num_workers:  # NOTE [ Index sketches ]
            self.session.worker("main", os.getpid()).sketch = sketcher.values()
        self.session.add_cost("settle_ns", time.thread_time_ns() - cpu0)
        if self.h2d is not None:
            before = rec.enter(self._sinks[0])
            try:
                self.h2d.flush(rec)
            finally:
                rec.leave(before)
        self._merge_main(rec)

    def _unpack(
        self,
        carrier: Any,
        t0: int,
        t1: int,
        t_iter: int | None,
        span: str,
        samples: int | None = None,
    ) -> Any:
        """The user's batch out of ``carrier``; what this batch says about the pipeline is queued
        (``_book``, deferred: NOTE [ Deferred aggregation ] in core/session.py), but for how long
        it kept the loop starved, which the step that gets it reads now."""
        s = self.session
        if not isinstance(carrier, Carrier):  # the user's own loader (see ``own_iteration``),
            # or a batch fetched unprofiled (``samples``: NOTE [ Unprofiled batches ])
            n = self._samples = samples if samples is not None else batch_size(carrier)
            s.defer(s.add_batch, t0, t1, n, t_iter, span)
            self.last_starved = t1 - t0  # not known: all of it, as the verdict read it before
            return carrier
        payload = carrier.payload
        if isinstance(payload, tuple):  # a worker's unprofiled batch: its figures, no records
            ready, self._samples = payload[3], payload[4]
            starved = min(max(0, ready - t0), t1 - t0)
            self.last_starved = starved
            s.defer(self._book_off, payload, t0, t1, t_iter, span, starved)
            if not (self.seen - 1) % BYTES_EVERY:  # ``seen`` counts this batch already
                self._bytes(carrier.batch)
            return carrier.batch
        if self.passes > 1:  # NOTE [ Index sketches ] in core/batch.py: the first pass's only
            payload.pop("sketch", None)
        s.merge(payload)  # a profiled batch's records
        # NOTE [ Wait, split ]: starved until the batch was ready, hand-over after
        starved = min(max(0, payload["end_ns"] - t0), t1 - t0)
        self.last_starved = starved
        self._samples = payload["samples"]
        # one of the profile's first batches (NOTE [ Unprofiled batches ]): as its worker says,
        # or where no worker has the rule, by the count (``seen`` counts this batch already)
        first = payload.get("ab") == FIRST if self._ruled else self.seen <= TIMED_FIRST
        s.defer(self._book, payload, t0, t1, t_iter, span, carrier.pin_ns, starved, first)
        if not (self.seen - 1) % BYTES_EVERY:  # ``seen`` counts this batch already
            self._bytes(carrier.batch)
        return carrier.batch

    def _bytes(self, batch: Any) -> None:
        """A batch's size in bytes, measured; at the profile's first, the shared memory the
        workers need against what /dev/shm had free (NOTE [ Shared memory ] in shm.py)."""
        n = batch_nbytes(batch)
        self.session.batch_bytes.add(n)
        if self.seen == 1 and self.loader.num_workers:
            facts = self.session.meta["shm"] = shm.need(self.user_loader, n, self._shm_free)
            if not facts["fits"]:
                shm.warn(facts, f"a DataLoader (batch_size={self.user_loader.batch_size})")

    def _watch(self) -> None:
        """NOTE [ Hangs ] in hangs.py: the training thread, the workers' stack files and the
        pass's watchdog."""
        self.thread_id = threading.get_ident()
        if not self.hang_s:
            return
        init = self._dress[1] if self._dress is not None else self.loader.worker_init_fn
        if self.loader.num_workers and isinstance(init, WorkerInit):
            init.stacks = hangs.stack_folder()
        self.stop_watch()
        self._watchdog = hangs.watch(self, self.hang_s, hangs.stack_folder())

    def stop_watch(self) -> None:
        """The pass is over: its hang watchdog stops (NOTE [ Hangs ] in hangs.py)."""
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None

    def current(self) -> Any:
        """The pass's torch iterator, while it lives (NOTE [ Hangs ] in hangs.py)."""
        return self._current() if self._current is not None else None

    def _failed(self, exc: BaseException) -> None:
        """An exception on its way to the user: a worker's shared-memory failure is noted
        (NOTE [ Shared memory ] in shm.py); the exception goes on unchanged."""
        said = shm.failure(exc) if self.loader.num_workers else None
        if said is not None:
            facts = self.session.meta.setdefault("shm", {"path": shm.SHM_PATH})
            facts.setdefault("failed", said)

    def _book(
        self,
        payload: dict[str, Any],
        t0: int,
        t1: int,
        t_iter: int | None,
        span: str,
        pin_ns: int,
        starved: int,
        first: bool = False,
    ) -> None:
        """A batch's bookkeeping, run when the session settles: its worker's busy time and CPU,
        pipeprof's costs, the probe, the unprofiled batches' comparison, the batch's wait and,
        for one of the profile's ``first`` batches, its stage time kept apart."""
        s = self.session
        arm = payload.get("ab")  # NOTE [ Unprofiled batches ], measured in a worker
        events = 0 if payload["track"] == "main" else payload["events"]
        w = s.worker(payload["track"], payload["pid"])
        ready = payload["end_ns"]
        busy = ready - (payload["first_ns"] or ready)
        w.busy_ns += busy
        w.cpu_ns += payload.get("cpu_ns", 0)
        full = payload.get("gc")  # NOTE [ A full collection after fork ]
        if full:
            w.gc_ns += full[0]
            w.gc_full += full[1]
            w.gc_faults += full[2]
        w.batches += 1
        w.samples += payload["samples"]
        w.shards = max(w.shards, payload.get("shards", 0))  # counted over the process's life
        if not w.first_ready_ns or ready < w.first_ready_ns:  # a track's first process's
            w.first_ready_ns = ready
        opened = payload.get("first_shard_ns", 0)
        if opened and (not w.first_shard_ns or opened < w.first_shard_ns):
            w.first_shard_ns = opened
        sketch = payload.get("sketch")  # NOTE [ Index sketches ] in core/batch.py
        if sketch is not None:
            got = array("I")
            got.frombytes(sketch)
            w.sketch = sorted(got)
        ids = payload.get("ids")  # NOTE [ Sample fingerprints ] in core/batch.py
        if ids is not None and len(w.ids) < IDS_KEPT:
            got = array("I")
            got.frombytes(ids)
            w.ids.extend(got[: IDS_KEPT - len(w.ids)])
        s.add_costs((("pack_ns", payload["cost_ns"]), ("worker_events", events)))
        if "sample_kinds" in payload:
            s.meta["sample_kinds"] = payload["sample_kinds"]
        probe_ns = payload.get("probe_ns")
        if probe_ns is not None and probe_ns < PROBE_CAP_NS:
            s.probe.add(probe_ns)
            warm_ns = payload.get("probe_warm_ns")
            if warm_ns is not None and warm_ns < PROBE_CAP_NS:
                s.probe_warm.add(warm_ns)
        if arm is not None and arm != FIRST and "cpu_ns" in payload:
            self._ab_add(f"abw_{arm}", payload["cpu_ns"], payload["samples"])
        if pin_ns:
            s.add("main", "transfer/pin", pin_ns)
        if first:
            self._first_add(payload, pin_ns)
        self._ends.add(payload["track"], t1)
        s.add_batch(t0, t1, payload["samples"], t_iter, span, payload["track"], busy, starved)

    def _first_add(self, payload: dict[str, Any], pin_ns: int) -> None:
        """NOTE [ Unprofiled batches ]: one of the profile's first batches, all timed: its stages'
        time per track and path, its samples (summed from the records as they travelled: 16
        batches a loader, at the pass's end)."""
        mine = self._first
        mine["batches"] += 1
        mine["samples"] += payload["samples"]
        ns = mine["ns"].setdefault(payload["track"], {})
        for key, packed in payload["raw"].items():  # key: a path, or (path, items each)
            path = key if isinstance(key, str) else key[0]
            flat = array("q")
            flat.frombytes(packed)
            ns[path] = ns.get(path, 0) + sum(flat[1::2])  # (start, self_ns) pairs
        if pin_ns:
            main = mine["ns"].setdefault("main", {})
            main["transfer/pin"] = main.get("transfer/pin", 0) + pin_ns
        self._publish_first()

    def _publish_first(self) -> None:
        """The first batches' stage time into ``meta["first_batches"]`` (added to another
        loader's there), once this profile times a sample of the batches: analyze/stages.py
        reads it where it scales the stages' totals. Kept back until then (a profile that times
        every batch needs none of it), and published at each pass's end too, for a pass that
        begins sampling after a short first one."""
        mine = self._first
        if not mine["batches"] or "stage_every" not in self.session.meta:
            return
        into = self.session.meta.setdefault("first_batches", {"batches": 0, "samples": 0, "ns": {}})
        into["batches"] += mine["batches"]
        into["samples"] += mine["samples"]
        for track, paths in mine["ns"].items():
            have = into["ns"].setdefault(track, {})
            for path, ns in paths.items():
                have[path] = have.get(path, 0) + ns
        self._first = {"batches": 0, "samples": 0, "ns": {}}

    def _book_off(
        self,
        payload: OffFigures,
        t0: int,
        t1: int,
        t_iter: int | None,
        span: str,
        starved: int,
    ) -> None:
        """``_book`` for a worker's unprofiled batch, whose figures travel as a tuple (``Collate``):
        its track, pid, first and ready stamps, samples, arm and CPU."""
        s = self.session
        track, pid, first_ns, ready, samples, arm, cpu = payload
        w = s.worker(track, pid)
        busy = ready - (first_ns or ready)
        w.busy_ns += busy
        w.batches += 1
        w.samples += samples
        if cpu is not None:
            w.cpu_ns += cpu
            if arm is not None:
                self._ab_add(f"abw_{arm}", cpu, samples)
        self._ends.add(track, t1)
        s.add_batch(t0, t1, samples, t_iter, span, track, busy, starved)


_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# NOTE [ The user's own iterator ]
# Under ``pipeprof run``, ``iter(loader)`` returns the twin DataLoader's own torch iterator (a
# ``_MultiProcessingDataLoaderIter`` or ``_SingleProcessDataLoaderIter``, as plain), its
# ``_next_data`` set, on the instance, to the pass's generator: torch's ``__next__`` (its
# ``_num_yielded``, its profiler range) runs as it does plain and asks the pass for the batch,
# which reads torch's own ``_next_data`` (``_raw_next``). The pass holds the iterator by a weak
# reference, so dropping it (a ``break``) frees it, shuts its workers down and ends the pass as
# dropping a generator did. Not with persistent workers (the twin keeps its iterator from pass
# to pass, so a pass left early would end only at the next one), nor with an iterator class
# whose ``__next__`` is not torch's: those passes are generators, as ``Profiler.wrap``'s are.
def _answerable(it: Any) -> bool:
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    cls = type(it)
    return cls.__next__ is _BaseDataLoaderIter.__next__ and callable(
        getattr(cls, "_next_data", None)
    )


class BatchPlan:
    """Which of a pass's batches in the training process are timed, compared or fetched on the
    short path (NOTE [ Unprofiled batches ], NOTE [ The short path ]): a function of the
    batch's index over the profile (``seen``), its index in the pass (``k``: a pass's first is
    cold, compared with none) and whether this profile is the only one recording (``alone``: a
    second profile in this process would lose its records). The rule runs on from pass to pass,
    so that each pass of a short loader's epochs takes its turn."""

    def __init__(self, every: int, sampled: bool, lean: bool) -> None:
        self.every = every
        self.sampled = sampled  # the pass times its stages in a sample of its batches
        self.lean = lean  # the short path is open to it: no NVTX ranges, no copy to time
        # of the later batches, the one just before each timed one is compared with it
        self.on_at, self.compared_at = every // 2, (every // 2 - 1) % every
        self._run = (0, -1)  # short_run's last look: no batch from [0] up to [1] is timed

    def choose(self, seen: int, k: int, alone: bool) -> tuple[bool, bool, bool]:
        """``(short, off, measure)`` for the batch: fetched on the short path; fetched with the
        recorder off (unprofiled); its process CPU measured for the comparison."""
        later = self.sampled and alone and seen >= TIMED_FIRST  # the profile's first all timed
        pos, paired = _place(seen, self.every)
        off = later and (pos != self.on_at or not paired)
        if off and self.lean and k >= 1 and not (paired and pos == self.compared_at):
            return True, True, False
        return False, off, later and k >= 1 and paired and (not off or pos == self.compared_at)

    def short_run(self, seen: int, alone: bool) -> int:
        """How many batches from ``seen`` on take the short path, one after the other (NOTE
        [ The fast path ] in attach/run.py): up to the next one timed or compared, past a
        pass's first."""
        if not (self.sampled and alone) or seen < TIMED_FIRST:
            return 0
        lo, stop = self._run
        if not lo <= seen <= stop:  # looked up once a run, not at each of its batches
            stop = seen
            while stop - seen < SHORT_RUN_MOST:
                pos, paired = _place(stop, self.every)
                if paired and pos in (self.on_at, self.compared_at):
                    self._run = (seen, stop)
                    break
                stop += 1
        return min(stop - seen, SHORT_RUN_MOST)


def _place(seen: int, every: int) -> tuple[int, bool]:
    """Where batch ``seen`` of the profile falls in its cycle of ``every`` (NOTE [ The short
    path ]), and whether that cycle is one whose pair is compared and whose batch is profiled
    (else all of it is unprofiled)."""
    pos = seen % every
    cycle = (seen + (every // 2 - pos) % every - TIMED_FIRST) // every
    return pos, cycle < AB_PAIRS_FIRST or not cycle % AB_PAIRS_EVERY


def short_frames_ns(calls: int = 2000) -> float:
    """Nanoseconds a short-path batch's frames inside its fetch cost (NOTE [ What the wrappers
    cost ] in attach/regions.py): torch's iterator reached through ``_raw_next``, the dataset read
    through ``MapDataset`` and ``Collate`` with the recorder off, against the same calls made
    directly, on an 8-sample batch that costs nothing; the median of three runs, measured once
    a process (a few ms)."""
    if _FRAMES_NS:
        return _FRAMES_NS[0]

    class Iter:
        def _next_data(self) -> Any:
            return None

    data, idx = [0] * 8, list(range(8))
    reader, collate = MapDataset(data), Collate(list, per_sample=False)
    it = Iter()
    fetch = functools.partial(_raw_next, weakref.ref(it))
    get = data.__getitem__
    rec = recorder()
    enabled, rec.enabled = rec.enabled, False
    results = []
    try:
        for _ in range(3):
            t0 = clock()
            for _ in range(calls):
                fetch()
                collate(reader.__getitems__(idx))
            t1 = clock()
            for _ in range(calls):
                it._next_data()
                list([get(i) for i in idx])
            results.append((2 * t1 - t0 - clock()) / calls)
    finally:
        rec.enabled = enabled
        _COLLATED[0] = None
    _FRAMES_NS.append(max(0.0, sorted(results)[1]))
    return _FRAMES_NS[0]


_FRAMES_NS: list[float] = []


def _raw_next(ref: Any) -> Any:
    it = ref()
    if it is None:  # gone: nothing asks any more
        raise StopIteration
    return type(it)._next_data(it)


def _cache_own_source() -> None:
    """NOTE [ The stack a forked worker formats ]
    A forked worker starts inside the training process's stack as it was at ``iter()``, and
    torch seeds it (``torch.manual_seed``) where CUDA is not initialised, which queues the seed
    with ``traceback.format_stack()``, twice (CUDA and XPU): every file on that stack is read
    and split into lines in each worker, unless the training process's ``linecache`` holds it
    already. pipeprof's frames (``Profiler``'s loop, this iterator) put two files of its own
    there: 0.34 ms and 48 page faults more at each worker's start, measured in the workers (a
    forked DataLoader's; 0.08 ms and 10 faults with them cached). So their lines are cached
    here, once per process, before the workers fork."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(_PACKAGE + os.sep) and name not in linecache.cache:
            linecache.getlines(name, frame.f_globals)
        frame = frame.f_back  # type: ignore[assignment]


def cache_sources(*modules: str) -> None:
    """The lines of pipeprof's ``modules`` (``pipeprof.profiler``...) that are on the stack at a
    pass's ``iter()``, cached before the loop, out of its time (``pipeprof run`` as torch loads:
    about 1 ms; NOTE [ The stack a forked worker formats ])."""
    for name in modules:
        path = getattr(sys.modules.get(name), "__file__", None)
        if path is not None and path not in linecache.cache:
            linecache.getlines(path)


def own_iteration(loader: DataLoader) -> list[str]:
    """What a DataLoader subclass overrides that decides what it yields (``__iter__``...):
    a plain DataLoader rebuilt from its arguments would yield something else."""
    found: list[str] = []
    for cls in type(loader).__mro__:
        if cls is DataLoader:
            break
        found += [name for name in ("__iter__", "_get_iterator", "__len__") if name in vars(cls)]
    return found


def unwrapped(it: Iterator[Any]) -> Iterator[Any]:
    """A pass once profiling stopped, over a twin's iterator or a dressed loader's own: its
    batches out of their carriers, nothing booked (NOTE [ Persistent workers past the profile ]
    in attach/patches.py)."""
    while True:
        try:
            carrier = next(it)
        except StopIteration:
            return
        # NOTE [ A suspended pass holds no batch ]
        held = [carrier.batch if isinstance(carrier, Carrier) else carrier]
        carrier = None
        yield held.pop()


class H2DTimer:
    """Moves batches to the device, timed as ``transfer/h2d``.

    On CUDA the copy is bracketed by CUDA events read back in groups of ``FLUSH_EVERY``, so the
    loop is not synchronised on every batch; elsewhere the wall clock times the (synchronous)
    copy. ``event_factory`` and ``copy`` default to ``torch.cuda.Event(enable_timing=True)`` and
    ``move_to``; tests pass stand-ins at that hardware boundary.
    """

    FLUSH_EVERY = 32

    def __init__(
        self,
        device: torch.device,
        event_factory: Callable[[], Any] | None = None,
        copy: Callable[[Any, torch.device, bool], Any] = move_to,
    ) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.copy = copy
        self.event = event_factory or (lambda: torch.cuda.Event(enable_timing=True))  # type: ignore[no-untyped-call]
        self.pending: list[tuple[Any, Any, int]] = []

    def move(self, batch: Any, non_blocking: bool, rec: Any) -> Any:
        if not self.cuda:
            t0 = clock()
            out = self.copy(batch, self.device, non_blocking)
            rec.add("transfer/h2d", clock() - t0, 1, t0)
            return out
        start, end = self.event(), self.event()
        t0 = clock()
        start.record()
        out = self.copy(batch, self.device, non_blocking)
        end.record()
        self.pending.append((start, end, t0))
        if len(self.pending) >= self.FLUSH_EVERY:
            self.flush(rec)
        return out

    def flush(self, rec: Any) -> None:
        for start, end, t0 in self.pending:
            end.synchronize()
            ns = int(start.elapsed_time(end) * 1e6)
            rec.add("transfer/h2d", ns, 1, t0)
        self.pending.clear()


def describe(loader: DataLoader, device: torch.device | None) -> dict[str, Any]:
    """The loader's configuration, for the report and for the findings."""
    ctx = loader.multiprocessing_context
    return {
        "loader": type(loader).__name__,
        "dataset": type(loader.dataset).__name__,
        "iterable": isinstance(loader.dataset, IterableDataset),
        "num_workers": loader.num_workers,
        "batch_size": loader.batch_size,
        "drop_last": bool(loader.drop_last),
        "pin_memory": bool(loader.pin_memory),
        "prefetch_factor": loader.prefetch_factor,
        "persistent_workers": bool(loader.persistent_workers),
        # torchdata's StatefulDataLoader (NOTE [ An epoch's samples ] in epochs.py); None else
        "snapshot_every_n_steps": getattr(loader, "snapshot_every_n_steps", None),
        # the collate finding's fix: torch's own collate, or the user's (its name)
        "collate_fn": _collate_name(loader.collate_fn),
        # the same-stream finding names it: a worker_init_fn meant to shard an IterableDataset
        "worker_init_fn": _collate_name(loader.worker_init_fn) if loader.worker_init_fn else None,
        "multiprocessing_context": ctx.get_start_method()
        if ctx is not None
        else (
            multiprocessing.get_start_method(allow_none=True)
            or multiprocessing.get_all_start_methods()[0]  # the platform default, not fixed
        ),
        "device": str(device) if device is not None else None,
        # how workers share tensors with this process (the hand-over finding reads it)
        "sharing_strategy": torch.multiprocessing.get_sharing_strategy(),  # type: ignore[no-untyped-call]
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "in_worker": get_worker_info() is not None,
        # a WebDataset's steps and sample shuffles (NOTE [ A shuffle buffer's start ]); else None
        "stream": stream_facts(loader.dataset),
    }


def _collate_name(fn: Any) -> str:
    """``default_collate`` for torch's own (``default_convert`` without batching), else the
    user's collate function by name (a callable object by its class)."""
    if fn is default_collate or fn is default_convert:
        return fn.__name__
    return getattr(fn, "__qualname__", None) or type(fn).__name__
