"""A training script for the tests of ``pipeprof tune`` (tests/test_tune.py): storage-like
loading (a sleep per sample, which more workers overlap) and a step that sleeps (an accelerator's
kernels). No pipeprof in it."""

import argparse
import os
import signal
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Storage(Dataset):
    def __init__(self, n, ms):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.ms / 1000)
        return torch.full((8,), float(i % 7)), i % 2


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--load-ms", type=float, default=4.0)
    p.add_argument("--step-ms", type=float, default=8.0)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--context", default=None)
    p.add_argument("--epochs", type=int, default=100)
    p.add_argument("--crash-workers", type=int, default=-1, help="fail with this many workers")
    p.add_argument("--kill-workers", type=int, default=-1, help="SIGKILL with this many")
    p.add_argument("--sharing", default=None, help="torch's tensor sharing strategy")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.sharing:
        torch.multiprocessing.set_sharing_strategy(args.sharing)
    loader = DataLoader(
        Storage(args.samples, args.load_ms),
        batch_size=8,
        shuffle=True,
        num_workers=args.workers,
        multiprocessing_context=args.context,
    )
    if loader.num_workers == args.crash_workers:
        raise MemoryError(f"out of memory with {loader.num_workers} workers")
    if loader.num_workers == args.kill_workers:  # as the OOM killer ends a process
        os.kill(os.getpid(), signal.SIGKILL)
    for epoch in range(args.epochs):
        for _x, _y in loader:  # unpacked: a batch of None would fail here
            time.sleep(args.step_ms / 1000)
        print(f"epoch {epoch}", flush=True)


if __name__ == "__main__":
    main()
