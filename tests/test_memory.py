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
