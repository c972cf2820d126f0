"""What each pass over a DataLoader was meant to read, and what it read (docs/findings.md,
"Every sample accounted for"): the sampler's epoch and shuffle at each pass's start, the samples
a full pass delivered, and those ``drop_last`` leaves out.

NOTE [ An epoch's samples ]
Read in the training process, at a pass's start and end, from the user's own loader: nothing
runs per batch.
1. ``DistributedSampler`` orders an epoch by ``seed + epoch``; its ``epoch`` moves only when the
   user calls ``set_epoch``. A shuffling one whose epoch stays put reads every epoch in the same
   order (and ``RandomSampler``'s generator moves on by itself, so it is not judged).
2. With ``drop_last=True`` the last ``len(sampler) % batch_size`` indices of each epoch never
   reach the loop. A sampler that does not shuffle drops the same samples every epoch: the model
   never sees them.
3. A dataset that states its length (``__len__``) is held to it: an iterable one whose full pass
   yielded another count does not hold what it says (torch only warns when it yields more).
4. Workers whose shares of a pass differ finish apart: after the first worker's last batch the
   others make the rest alone. When each worker's batches reached the loop (their last
   TAIL_KEPT, as the batches are booked at the pass's end: ``PassEnds``) gives which worker
   delivered the pass's last batch, how long after each other worker's last, and how many
   batches came after the first worker was done (the tail).
5. torchdata's ``StatefulDataLoader`` has its workers snapshot their state every
   ``snapshot_every_n_steps`` batches (1 by default), each snapshot a copy of the dataset's and
   sampler's state that travels with a batch; the loop reads one with ``state_dict()``. Under
   ``pipeprof run`` each ``state_dict()`` call is timed, with the step it came at
   (``note_snapshot``: ``meta["state_dicts"]``); a loop that reads one every K steps while the
   workers snapshot every step copies the state K times for each one it uses.
Each pass that ran to its end adds ``{"epoch", "samples", "tail", "end_ns"}`` to
``meta["epochs"]`` (the first EPOCHS_KEPT; ``end_ns`` on the profile's clock, which the memory
readings share: analyze/memory.py); ``meta["sampler"]`` holds what the rules need of the sampler.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

EPOCHS_KEPT = 64  # NOTE [ An epoch's samples ]: the passes recorded
TAIL_KEPT = 64  # a worker's last batches' arrival times kept (case 4)


def sampler_facts(loader: DataLoader) -> dict[str, Any]:  # type: ignore[type-arg]
    """The sampler's kind, whether it shuffles, the dataset's stated length and the indices
    ``drop_last`` leaves out of an epoch (NOTE [ An epoch's samples ])."""
    facts: dict[str, Any] = {"dataset_len": _length(loader.dataset)}
    if isinstance(loader.dataset, IterableDataset):
        return {**facts, "kind": None, "shuffle": None, "dropped": 0,
                "shards": _shards(loader.dataset)}  # fmt: skip
    sampler = loader.sampler
    kind = type(sampler).__name__
    if isinstance(sampler, DistributedSampler):
        shuffle: bool | None = bool(sampler.shuffle)
    elif isinstance(sampler, (SequentialSampler, RandomSampler)):
        shuffle = isinstance(sampler, RandomSampler)
    else:
        shuffle = None  # the user's own: not known
    n, size = _length(sampler), loader.batch_size
    dropped = n % size if loader.drop_last and n is not None and size else 0
    return {**facts, "kind": kind, "shuffle": shuffle, "sampler_len": n, "dropped": dropped}


def epoch_of(loader: DataLoader) -> int | None:  # type: ignore[type-arg]
    """The epoch a ``DistributedSampler`` will order the next pass by; None for others."""
    sampler = loader.sampler
    if isinstance(sampler, DistributedSampler):
        return int(sampler.epoch)
    return None


class PassEnds:
    """When each worker's batches of one pass reached the loop (NOTE [ An epoch's samples ],
    case 4): the last TAIL_KEPT of each worker's, by track."""

    def __init__(self, start_ns: int) -> None:
        self.start_ns = start_ns
        self.times: dict[str, deque[int]] = {}

    def add(self, track: str, t1: int) -> None:
        times = self.times.get(track)
        if times is None:
            times = self.times[track] = deque(maxlen=TAIL_KEPT)
        times.append(t1)

    def tail(self, end_ns: int) -> dict[str, Any] | None:
        """Which worker delivered the pass's last batch, how long after each other worker's last
        (``waited_s``, by worker id), the batches after the first worker was done, and the
        pass's time; None with fewer than 2 workers delivering."""
        lasts = {int(t[6:]): q[-1] for t, q in self.times.items() if t.startswith("worker")}
        if len(lasts) < 2:
            return None
        done, end = min(lasts.values()), max(lasts.values())
        after = sum(t > done for q in self.times.values() for t in q)
        return {
            "last": max(lasts, key=lambda w: lasts[w]),
            "waited_s": {str(w): round((end - t) / 1e9, 6) for w, t in sorted(lasts.items())},
            "batches": after,
            "wall_s": round((end_ns - self.start_ns) / 1e9, 6),
        }


def record_pass(
    meta: dict[str, Any], epoch: int | None, samples: int, tail: dict[str, Any] | None,
    end_ns: int = 0,
) -> None:
    """A pass that ran to its end: its sampler epoch, samples, tail and when it ended (the
    profile's clock: the memory readings are held against it, analyze/memory.py) (NOTE [ An
    epoch's samples ])."""
    kept = meta.setdefault("epochs", [])
    if len(kept) < EPOCHS_KEPT:
        kept.append({"epoch": epoch, "samples": samples, "tail": tail, "end_ns": end_ns})


def note_snapshot(meta: dict[str, Any], step: int, ns: int) -> None:
    """A ``state_dict()`` call of a stateful loader, at ``step`` of its loop, that took ``ns``
    (NOTE [ An epoch's samples ], case 5)."""
    got = meta.setdefault("state_dicts", {"calls": 0, "total_ns": 0, "steps": []})
    got["calls"] += 1
    got["total_ns"] += ns
    if len(got["steps"]) < EPOCHS_KEPT:
        got["steps"].append(step)


def _shards(dataset: Any) -> int | None:
    """The shards a stream says it has (Hugging Face's ``IterableDataset.num_shards``, a
    WebDataset's shard list): the most workers it can feed; None where it does not say."""
    steps = getattr(dataset, "__dict__", {}).get("pipeline")
    if type(dataset).__module__.split(".")[0] == "webdataset" and isinstance(steps, list):
        source = steps[0] if steps else None  # ResampledShards: drawn at random, no end
        urls = getattr(source, "urls", None)
        if type(source).__name__ != "SimpleShardList" or not isinstance(urls, list):
            return None
        return len(urls)
    for name in ("num_shards", "n_shards"):
        got = getattr(type(dataset), name, None)
        if isinstance(got, property):
            try:
                value = getattr(dataset, name)
            except Exception:
                return None
            return value if isinstance(value, int) else None
    return None


def _length(obj: Any) -> int | None:
    try:
        return len(obj)
    except (TypeError, NotImplementedError):
        return None
