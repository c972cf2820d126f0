"""What sketching a distributed rank's indices costs a loader read in the training process
(NOTE [ Index sketches ] in pipeprof/core/batch.py; docs/findings.md#same-samples-in-ranks).

A rank's environment (``RANK=0``, ``WORLD_SIZE=2``) makes pipeprof sketch; ``Profiler.wrap``
over a ``TensorDataset`` of 24,000 samples, batches of 8, no workers: each ``next()`` timed,
with the sketch's ``add`` real and made a no-op, in alternating rounds. Medians of the rounds'
median and mean ``next()``.

    .venv/bin/python benchmarks/sketch_cost.py --rounds 8   # ~30 s
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import pipeprof
from pipeprof.core import batch


def one(data: TensorDataset) -> tuple[float, float]:
    prof = pipeprof.Profiler(sample_hz=0)
    it = iter(prof.wrap(DataLoader(data, batch_size=8)))
    took = []
    while True:
        t0 = time.perf_counter_ns()
        try:
            next(it)
        except StopIteration:
            break
        took.append(time.perf_counter_ns() - t0)
    return statistics.median(took) / 1e3, statistics.mean(took) / 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=8)
    args = p.parse_args()
    os.environ.update({"RANK": "0", "WORLD_SIZE": "2"})
    data = TensorDataset(torch.randn(24000, 4), torch.randint(0, 2, (24000,)))
    real = batch.Sketch.add
    got: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for k in range(args.rounds):
        for on in (True, False) if k % 2 else (False, True):
            batch.Sketch.add = real if on else (lambda self, indices: None)  # type: ignore[method-assign]
            got[on].append(one(data))
    batch.Sketch.add = real  # type: ignore[method-assign]
    for on in (False, True):
        med = statistics.median(r[0] for r in got[on])
        mean = statistics.median(r[1] for r in got[on])
        print(f"{'sketched' if on else 'not sketched'}: next() {med:.2f} µs by the median, "
              f"{mean:.2f} by the mean")


if __name__ == "__main__":
    main()
