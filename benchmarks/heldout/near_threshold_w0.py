"""Held-out script 2: a loop with num_workers=0 whose wait sits near the 5 % threshold: a small
MLP on CPU, samples made by a per-sample transform in the training process."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=0)
p.add_argument("--samples", type=int, default=2048)
args = p.parse_args()
torch.set_num_threads(1)


class Noisy(Dataset):
    def __len__(self):
        return args.samples

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(784, generator=g)
        return (x - x.mean()) / x.std(), i % 10


model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 10))  # fmt: skip
opt = torch.optim.Adam(model.parameters())
for x, y in DataLoader(Noisy(), batch_size=64, shuffle=True, num_workers=args.workers):
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("loss", round(float(loss), 3) > 0)
