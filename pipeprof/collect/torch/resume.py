"""Whether a resumed stateful loader repeats or skips samples (docs/findings.md,
"resume-repeats"): torchdata's ``StatefulDataLoader`` under ``pipeprof run``.

NOTE [ Resumes ]
A ``StatefulDataLoader`` resumes an epoch from a ``state_dict()`` in one of two ways. Where its
sampler keeps a state (torchdata's own samplers, such as the ``RandomSampler`` it puts in place
of ``shuffle=True``'s, or one with ``state_dict``/``load_state_dict``), the sampler is put back
where it was. Where it does not (torch's ``RandomSampler`` passed as ``sampler=``, a sampler of the
user's own), torchdata draws the sampler's order anew and skips as many indices as the snapshot
had read: right only if each ``iter(sampler)`` yields the same order. A shuffling sampler draws
another, and the rest of the epoch repeats samples read before the snapshot and never reads as
many others (24 and 24 of a 100-sample epoch resumed after 40; docs/validation/diagnosis.md).

1. Before any resume: ``restores`` says which of the two a loader's snapshots would get
   (``"state"`` or ``"fast-forward"``), and ``shuffles`` whether its sampler is one of torch's
   that draws a new order at each ``iter()`` without a generator of the user's (True), one that
   does not shuffle (False), or the user's own (None: not known). Read at its first pass.
2. Where the run covers a resume (a ``load_state_dict()`` of a snapshot the same run took, the
   same dict or one with the same dataset and position), it is measured: the index batches of
   each pass are recorded in the order the sampler gave them (``Pass``; torch hands them to the
   loop in that order), a snapshot keeps its pass and its position (batches read), and the
   resumed pass, once its sampler is exhausted, is compared with what was read before the
   snapshot: ``repeated`` (indices read on both sides) and ``skipped`` (of the sampler's
   length, indices read on neither). Recording costs one call and a list append a batch, for
   stateful loaders only (about 1 µs a batch, timed in isolation on the project's 2-core
   machine); a pass records at most INDICES_KEPT indices, 8 bytes each.
"""

from __future__ import annotations

import itertools
import weakref
from array import array
from collections import OrderedDict
from typing import Any

from torch.utils.data import IterableDataset

INDICES_KEPT = 1 << 21  # a pass's indices recorded at most, 16 MB (NOTE [ Resumes ], case 2)
SNAPSHOTS_KEPT = 8  # the latest snapshots a resume can be matched to
# torch's samplers that draw a new order at each iter() unless given a generator
_SHUFFLING = ("RandomSampler", "SubsetRandomSampler", "WeightedRandomSampler")
_FIXED = ("SequentialSampler", "DistributedSampler")


def restore_facts(loader: Any) -> dict[str, Any]:
    """How a resume of ``loader`` would put its sampler back (NOTE [ Resumes ], case 1)."""
    batch = getattr(loader, "batch_sampler", None)
    sampler = getattr(batch, "sampler", None) if batch is not None else None
    sampler = sampler if sampler is not None else loader.sampler
    name, module = type(sampler).__name__, type(sampler).__module__
    # torchdata's own samplers keep their state in their iterators
    kept = module.startswith("torchdata.") or all(
        hasattr(sampler, m) for m in ("state_dict", "load_state_dict")
    )
    shuffles: bool | None = None
    if module.startswith("torch.utils.data"):
        if name in _SHUFFLING:
            shuffles = True if getattr(sampler, "generator", None) is None else None
        elif name in _FIXED:
            shuffles = False
    return {"restores": "state" if kept else "fast-forward", "sampler": name,
            "shuffles": shuffles}  # fmt: skip


def position(state: Any) -> int | None:
    """The batches a ``state_dict()`` had read of its pass: torchdata's single-process
    ``_num_yielded``, or its workers' snapshot step and the steps since."""
    if not isinstance(state, dict):
        return None
    if "_num_yielded" in state:
        return int(state["_num_yielded"])
    snap = state.get("_snapshot")
    if isinstance(snap, dict) and "_snapshot_step" in snap:
        return int(snap["_snapshot_step"]) + int(state.get("_steps_since_snapshot", 0))
    return None


class Pass:
    """One pass's index batches, in the order the sampler gave them (NOTE [ Resumes ])."""

    __slots__ = ("after", "base", "batches", "count", "full", "loader", "sampler_len")

    def __init__(self, loader: Any, base: int, after: Snapshot | None) -> None:
        self.batches: list[Any] = []
        self.count = 0
        self.base = base  # batches the pass began past (a resumed one: its snapshot's)
        self.after = after  # the snapshot it resumed from
        self.loader = weakref.ref(loader)
        self.full = False  # more than INDICES_KEPT: no longer recorded
        try:
            self.sampler_len: int | None = len(loader.sampler)
        except TypeError:
            self.sampler_len = None

    def add(self, batch: Any) -> None:
        if self.full:
            return
        if not isinstance(batch, list):  # batch_size=None: one index a batch
            batch = [batch]
        try:
            self.batches.append(array("q", batch))  # 8 bytes an index
        except (TypeError, OverflowError):  # indices that are not integers
            self.batches.append(tuple(batch))
        self.count += len(batch)
        self.full = self.count > INDICES_KEPT

    def read(self, upto: int) -> set[Any] | None:
        """The indices read before batch ``upto`` of the epoch, this pass's and, for a resumed
        one, those before its snapshot; None where they were not all recorded."""
        own = upto - self.base
        if self.full or own > len(self.batches) or own < 0:
            return None
        got = set(_flat(self.batches[:own]))
        if self.after is None:
            return got
        earlier = self.after.read()
        return None if earlier is None else got | earlier


class Snapshot:
    """A ``state_dict()`` a pass gave: the pass and its position."""

    __slots__ = ("at", "of", "state")

    def __init__(self, of: Pass, at: int, state: Any) -> None:
        self.of, self.at, self.state = of, at, state  # the dict kept: its id stays its own

    def read(self) -> set[Any] | None:
        return self.of.read(self.at)


class Resumes:
    """The run's record of stateful loaders' passes, snapshots and resumes (NOTE [ Resumes ]):
    passes by their index sampler's id (what torch's iterator holds), snapshots by the dict's
    id and by (dataset id, position)."""

    def __init__(self) -> None:
        self.passes: dict[int, Pass] = {}
        self.pending: dict[int, Snapshot] = {}  # by loader id: resumed at its next pass
        self.taken: OrderedDict[Any, Snapshot] = OrderedDict()

    def begin(self, loader: Any) -> None:
        """A pass of ``loader`` begins: record its index batches (a map-style dataset's)."""
        snap = self.pending.pop(id(loader), None)
        if isinstance(loader.dataset, IterableDataset):  # no indices: nothing to compare
            return
        self.passes[id(loader._index_sampler)] = Pass(loader, snap.at if snap else 0, snap)

    def next_index(self, it: Any, batch: Any) -> None:
        got = self.passes.get(id(it._index_sampler))
        if got is not None:
            got.add(batch)

    def snapshot(self, loader: Any, state: Any) -> None:
        got = self.passes.get(id(loader._index_sampler))
        at, data = position(state), id(loader.dataset)
        if got is None or at is None or got.loader() is not loader:
            return
        snap = Snapshot(got, at, state)
        for key in (id(state), (data, at)):
            self.taken.pop(key, None)
            self.taken[key] = snap
        while len(self.taken) > 2 * SNAPSHOTS_KEPT:
            self.taken.popitem(last=False)

    def load(self, loader: Any, state: Any) -> None:
        """``loader.load_state_dict(state)``: its next pass resumes from ``state``."""
        snap = self.taken.get(id(state))
        if snap is None or snap.state is not state:
            snap = self.taken.get((id(loader.dataset), position(state)))
        if snap is not None:
            self.pending[id(loader)] = snap
        else:
            self.pending.pop(id(loader), None)

    def ended(self, it: Any) -> dict[str, Any] | None:
        """The sampler of ``it``'s pass is exhausted: for a resumed pass, what it read against
        what was read before its snapshot (NOTE [ Resumes ], case 2); None for others."""
        got = self.passes.pop(id(it._index_sampler), None)
        if got is None or got.after is None or got.full:
            return None
        before = got.after.read()
        if before is None:
            return None
        after = set(_flat(got.batches))
        both = len(before & after)
        n = got.sampler_len
        return {
            "at": got.after.at,
            "before": len(before),
            "after": len(after),
            "repeated": both,
            "skipped": max(0, n - len(before | after)) if n is not None else None,
        }


def _flat(batches: list[Any]) -> Any:
    return itertools.chain.from_iterable(batches)
