"""Held-out script 7: data-parallel training under torchrun, as the ImageNet example writes it.

Two ranks (``torchrun --nproc_per_node=2``), gloo on the CPU, DistributedDataParallel, a
DistributedSampler over .npy files on disk (written once, here), a random crop and flip in
numpy, and the example's own meters: the time each step waited for data and the time per step.
Rank 0 prints them as METERS (samples/s over all ranks).
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=1)
p.add_argument("--epochs", type=int, default=2)
p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "pipeprof-heldout-npy"))
args = p.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if rank == 0 and not os.path.isdir(args.data):
    os.makedirs(args.data + ".tmp", exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(1024):
        np.save(f"{args.data}.tmp/{i:05d}.npy", rng.random((3, 40, 40), dtype=np.float32))
    os.rename(args.data + ".tmp", args.data)
dist.barrier()


class Arrays(Dataset):
    def __init__(self, root):
        self.files = sorted(os.path.join(root, f) for f in os.listdir(root))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        x = np.load(self.files[i])
        r = np.random.default_rng(i)
        top, left = r.integers(0, 9, 2)
        x = x[:, top:top + 32, left:left + 32]
        if r.random() < 0.5:
            x = x[:, :, ::-1]
        return torch.from_numpy(np.ascontiguousarray(x)), i % 10


data = Arrays(args.data)
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=32, sampler=sampler, num_workers=args.workers)
model = DistributedDataParallel(nn.Sequential(
    nn.Flatten(), nn.Linear(3 * 32 * 32, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
    nn.Linear(1024, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data_s = batch_s = 0.0
samples = 0
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    end = time.perf_counter()
    for x, y in loader:
        data_s += time.perf_counter() - end
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        samples += len(y) * world
        batch_s += time.perf_counter() - end
        end = time.perf_counter()
if rank == 0:
    print("METERS", json.dumps({"samples_per_s": samples / batch_s,
                                "data_fraction": data_s / batch_s}))
dist.destroy_process_group()
