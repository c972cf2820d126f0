"""Tune proof pipeline: storage latency (3 ms a sample, a sleep: more workers overlap it), short
epochs (8 batches), one worker, a 6 ms step (an accelerator's kernels). No pipeprof in it."""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=1)
args = p.parse_args()


class Storage(Dataset):
    def __len__(self):
        return 128

    def __getitem__(self, i):
        time.sleep(0.003)
        return torch.full((32,), float(i)), i % 2


loader = DataLoader(Storage(), batch_size=16, shuffle=True, num_workers=args.workers)
for _epoch in range(1000):
    for _batch in loader:
        time.sleep(0.006)
