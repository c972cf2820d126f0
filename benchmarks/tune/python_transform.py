"""Tune proof pipeline: a transform in pure Python (about 1.5 ms of CPU a sample, holding the
GIL) in 4 workers on a 2-core machine, a 10 ms step that sleeps (an accelerator's kernels).
No pipeprof in it."""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=4)
args = p.parse_args()


class Augment(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        acc = 0
        for k in range(2_500):  # Python work, as a hand-written augmentation
            acc = (acc * 31 + k + i) % 1_000_003
        return torch.full((64,), float(acc % 97)), i % 2


loader = DataLoader(Augment(), batch_size=16, num_workers=args.workers)
for _batch in loader:
    time.sleep(0.010)
