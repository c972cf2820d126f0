"""What pipeprof adds to a DataLoader worker's own CPU: at its start, and per batch.

Usage: python benchmarks/worker_start.py [--rounds 30] [--batches 4 160]

A loader of cheap samples (a 4-float tensor each, batch 32, 2 workers started afresh every
epoch) runs one epoch plain and one under ``pipeprof.Profiler(sample_hz=0).wrap(loader)`` per
round, in an order alternated from round to round, for each ``--batches`` count. Each worker
measures itself: its CPU (``time.process_time_ns``: its threads, the queue feeder's pickling
included) and minor page faults from the start of torch's ``_worker_loop`` to its end, so the
fork, the interpreter's exit and the training process are not in the figures.

With few batches an epoch, the difference is what a worker's start costs under pipeprof (its
worker init, the first calls into pipeprof's code, the pages of pipeprof's objects the worker
writes after the fork); the growth with more batches is pipeprof's per-batch cost in a worker
(the unprofiled batches' hand-over of the ready stamp and CPU, and one batch in 8 timed).
Prints medians over the workers and the per-round differences.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import statistics
import time
from typing import Any

import torch
import torch.utils.data._utils.worker as torch_worker
from torch.utils.data import DataLoader, Dataset

import pipeprof

_PIPE: list[Any] = []  # each worker sends its (CPU ns, faults) back through this pipe
_ORIGINAL = torch_worker._worker_loop


class Cheap(Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return torch.zeros(4), i


def _measured_worker_loop(*args: Any, **kwargs: Any) -> Any:
    cpu0 = time.process_time_ns()
    faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    try:
        return _ORIGINAL(*args, **kwargs)
    finally:
        cpu = time.process_time_ns() - cpu0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
        _PIPE[1].send((cpu, faults))


def epoch(batches: int, profiled: bool) -> list[tuple[int, int]]:
    recv, send = multiprocessing.get_context("fork").Pipe(duplex=False)
    _PIPE[:] = [recv, send]
    loader = DataLoader(
        Cheap(32 * batches), batch_size=32, num_workers=2, multiprocessing_context="fork"
    )
    if profiled:
        prof = pipeprof.Profiler(sample_hz=0)
        with prof:
            for _ in prof.wrap(loader):
                pass
    else:
        for _ in loader:
            pass
    out = []
    while len(out) < 2 and recv.poll(5.0):
        out.append(recv.recv())
    recv.close()
    send.close()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--batches", type=int, nargs="+", default=[4, 160])
    args = ap.parse_args(argv)
    torch_worker._worker_loop = _measured_worker_loop  # the loader's workers fork with this
    print(f"a worker's own CPU (ms) and minor faults, 2 workers, medians of {args.rounds} rounds")
    for batches in args.batches:
        runs: dict[bool, list[tuple[int, int]]] = {False: [], True: []}
        diffs = []
        for r in range(args.rounds + 1):
            got = {}
            for profiled in (False, True) if r % 2 else (True, False):
                got[profiled] = epoch(batches, profiled)
            if r:  # the first round warms up
                for profiled, workers in got.items():
                    runs[profiled] += workers
                plain = statistics.mean(w[0] for w in got[False])
                diffs.append((statistics.mean(w[0] for w in got[True]) - plain) / 1e6)
        cpu = {k: statistics.median(w[0] for w in v) / 1e6 for k, v in runs.items()}
        faults = {k: statistics.median(w[1] for w in v) for k, v in runs.items()}
        se = statistics.stdev(diffs) / len(diffs) ** 0.5
        print(
            f"{batches:4d} batches an epoch ({batches // 2} a worker): plain {cpu[False]:.2f} ms, "
            f"pipeprof {cpu[True]:.2f} ms; added per worker: median {statistics.median(diffs):+.2f}"
            f" ms, mean {statistics.mean(diffs):+.2f} ± {se:.2f}; faults {faults[False]:.0f} -> "
            f"{faults[True]:.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
