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
Each pass that ran to its end adds ``{"epoch", "samples"}`` to ``meta["epochs"]`` (the first
EPOCHS_KEPT); ``meta["sampler"]`` holds what the rules need of the sampler.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
)

EPOCHS_KEPT = 64  # NOTE [ An epoch's samples ]: the passes recorded


def sampler_facts(loader: DataLoader) -> dict[str, Any]:  # type: ignore[type-arg]
    """The sampler's kind, whether it shuffles, the dataset's stated length and the indices
    ``drop_last`` leaves out of an epoch (NOTE [ An epoch's samples ])."""
    facts: dict[str, Any] = {"dataset_len": _length(loader.dataset)}
    if isinstance(loader.dataset, IterableDataset):
        return {**facts, "kind": None, "shuffle": None, "dropped": 0}
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


def record_pass(meta: dict[str, Any], epoch: int | None, samples: int) -> None:
    """A pass that ran to its end: its sampler epoch and samples (NOTE [ An epoch's samples ])."""
    kept = meta.setdefault("epochs", [])
    if len(kept) < EPOCHS_KEPT:
        kept.append({"epoch": epoch, "samples": samples})


def _length(obj: Any) -> int | None:
    try:
        return len(obj)
    except (TypeError, NotImplementedError):
        return None
