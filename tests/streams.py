"""Iterable datasets whose sharding is known by construction (tests/test_accounting.py): importable,
so that spawned workers can rebuild them."""

from __future__ import annotations

import time

import torch
from torch.utils.data import IterableDataset, get_worker_info


class Stream(IterableDataset):
    """``n`` samples ``(tensor, label)``; ``shard``: split by worker (the correct way), else every
    worker yields all of them. ``noise``: each worker adds its own random noise to the tensor (a
    random crop of the same image), the label unchanged. ``text``: dicts of a string alone.
    ``value``: every tensor the same and the label ``i % 2`` (content that cannot tell samples
    apart)."""

    def __init__(self, n: int, shard: bool, noise: bool = False, text: bool = False,
                 value: bool = False) -> None:  # fmt: skip
        self.n, self.shard, self.noise, self.text, self.value = n, shard, noise, text, value

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        for i in range(self.n):
            if self.shard and info is not None and i % info.num_workers != info.id:
                continue
            if self.text:
                yield {"text": f"sample number {i}"}  # the text alone tells them apart
                continue
            x = torch.zeros(4) if self.value else torch.full((4,), float(i))
            if self.noise:
                x = x + torch.rand(4)
            yield x, (i % 2 if self.value else i % 10)


class Shards(IterableDataset):
    """A source of shards (lists of sample numbers), each read by one worker: shard ``s`` goes to
    worker ``s % num_workers``, as a streaming library hands them out; ``cost``: seconds a
    sample takes to read (a sleep)."""

    def __init__(self, sizes: list[int], cost: float = 0.0) -> None:
        self.sizes, self.cost = sizes, cost

    def __iter__(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        start = 0
        for s, size in enumerate(self.sizes):
            if info is None or s % info.num_workers == info.id:
                for i in range(start, start + size):
                    if self.cost:
                        time.sleep(self.cost)
                    yield torch.full((4,), float(i)), i % 10
            start += size


class Ranged(IterableDataset):
    """Samples ``start`` to ``end``: sharded, as torch's IterableDataset example does, by a
    ``worker_init_fn`` that gives each worker its part (``shard_range``); ``seed_only`` sets a
    seed and leaves every worker the whole range."""

    def __init__(self, n: int) -> None:
        self.start, self.end = 0, n

    def __iter__(self):  # type: ignore[no-untyped-def]
        for i in range(self.start, self.end):
            yield torch.full((4,), float(i)), i % 10


def shard_range(worker_id: int) -> None:
    info = get_worker_info()
    data = info.dataset
    per = (data.end - data.start) // info.num_workers
    data.start, data.end = data.start + worker_id * per, data.start + (worker_id + 1) * per


def seed_only(worker_id: int) -> None:
    torch.manual_seed(worker_id)
