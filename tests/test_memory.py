"""Issue 41: worker memory. Forked workers that copy the dataset's Python objects as they read
them (NOTE [ Copy-on-read ] in collect/torch/memory.py): a dataset of about 270 MB of Python
strings read at random by 2 fork workers is named, with the attribute; the same texts held in
one numpy array are not. Real DataLoaders, the workers' USS read from /proc (the sampler's
budget widened so that a 3 s run gets several readings a worker)."""

from __future__ import annotations

import random
import sys
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import pipeprof
from pipeprof.collect.samplers import host

N_TEXTS = 2_500_000


class Captions(Dataset):  # type: ignore[type-arg]
    """2,048 samples, each the length of 256 captions drawn at random from ``N_TEXTS``: a list
    of Python strings, or (``as_array``) the same bytes in one numpy array."""

    def __init__(self, as_array: bool) -> None:
        texts = [f"caption number {i:>9} of the dataset, a line".encode() for i in range(N_TEXTS)]
        self.texts = np.array(texts, dtype="S48") if as_array else texts

    def __len__(self) -> int:
        return 2048

    def __getitem__(self, i: int) -> torch.Tensor:
        draw = random.Random(i)
        n = len(self.texts)
        total = sum(len(self.texts[draw.randrange(n)]) for _ in range(256))
        time.sleep(0.002)
        return torch.tensor(total)


@pytest.mark.skipif(sys.platform != "linux", reason="fork, and USS from /proc")
@pytest.mark.parametrize("as_array", [False, True])
def test_workers_that_copy_a_list_of_strings_are_named(monkeypatch, as_array):
    monkeypatch.setattr(host, "MEMORY_SHARE", 1.0)
    monkeypatch.setattr(host, "MEMORY_EVERY_NS", 100_000_000)
    monkeypatch.setattr(host, "MEMORY_FIRST_NS", 0)
    data = Captions(as_array)
    loader = DataLoader(data, batch_size=32, num_workers=2, multiprocessing_context="fork")
    plain = [b.clone() for b in loader]
    prof = pipeprof.Profiler(sample_hz=20)
    with prof:
        got = [b.clone() for b in prof.wrap(loader)]
    assert len(got) == len(plain) and all(torch.equal(a, b) for a, b in zip(plain, got))
    report = prof.report().to_dict()
    found = [f for f in report["findings"] if f["id"] == "copy-on-read"]
    held = report["meta"]["py_containers"]
    if as_array:
        assert held == [] and not found
        return
    assert held[0]["name"] == "dataset.texts" and held[0]["kind"] == "list of bytes"
    assert held[0]["items"] == N_TEXTS and 150 < held[0]["mb"] < 400
    assert found, [p["uss_max_mb"] for p in report["host"]["per_process"]]
    assert "dataset.texts (list of bytes, 2,500,000 items" in found[0]["message"]
    assert "numpy" in found[0]["fix"] and found[0]["severity"] == "warning"


class Kept(Dataset):  # type: ignore[type-arg]
    """Each read keeps 512 kB in its worker: in a list that grows for ever (a leak), or
    (``cached``) in a cache keyed by the index, full after the first epoch."""

    def __init__(self, cached: bool) -> None:
        self.cached = cached
        self.kept: list[bytearray] = []
        self.cache: dict[int, bytearray] = {}

    def __len__(self) -> int:
        return 240

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.cached:
            self.cache.setdefault(i, bytearray(512 * 1024))
        else:
            self.kept.append(bytearray(512 * 1024))
        time.sleep(0.01)
        return torch.tensor(i)


@pytest.mark.skipif(sys.platform != "linux", reason="USS from /proc")
@pytest.mark.parametrize("cached", [False, True])
def test_memory_that_keeps_growing_after_the_first_epoch_is_named(monkeypatch, cached):
    """NOTE [ Memory that keeps growing ] in analyze/memory.py: persistent workers that keep
    512 kB a read grow 60 MB an epoch each, after the first as in it: named, with the growth per
    1,000 batches and the time left; a cache that is full after the first epoch is not."""
    monkeypatch.setattr(host, "MEMORY_SHARE", 1.0)
    monkeypatch.setattr(host, "MEMORY_EVERY_NS", 100_000_000)
    monkeypatch.setattr(host, "MEMORY_FIRST_NS", 0)
    loader = DataLoader(Kept(cached), batch_size=8, num_workers=2, persistent_workers=True)
    prof = pipeprof.Profiler(sample_hz=20)
    with prof:
        wrapped = prof.wrap(loader)
        for _ in range(3):
            for _batch in wrapped:
                pass
    report = prof.report().to_dict()
    assert len(report["timeline"]["epoch_ends_s"]) == 3
    found = [f for f in report["findings"] if f["id"] == "memory-growth"]
    if cached:
        assert not found
        return
    assert found, report["timeline"]["memory"]
    ev = found[0]["evidence"]
    assert {p["role"] for p in ev["processes"]} == {"child"} and len(ev["processes"]) == 2
    # 60 MB an epoch of 15 batches a worker, 30 batches an epoch: about 4,000 MB / 1,000 batches
    assert 1500 < ev["mb_per_1000_batches"] < 8000
    assert ev["hours_left"] is not None and "run out in" in found[0]["message"]
