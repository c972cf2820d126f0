"""A training script whose dataset's transforms are ``nn.Module``s (torchvision's are), read
with ``num_workers=0``: the transforms run in the training process, inside the loader's
``next()``; only the model's calls are ``Forward`` (tests/test_run.py)."""

import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


class Slow(nn.Module):
    """A transform that is a Module and costs ``ms`` a sample."""

    def __init__(self, ms):
        super().__init__()
        self.ms = ms

    def forward(self, x):
        time.sleep(self.ms / 1000)
        return x


class Images(Dataset):
    def __init__(self, n, transform):
        self.n, self.transform = n, transform

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = torch.full((1, 4, 4), float(i % 5))
        return self.transform(x), i % 2


def main():
    samples = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tf = transforms.Compose([transforms.Normalize(mean=[0.5], std=[0.5]), Slow(2.0)])
    loader = DataLoader(Images(samples, tf), batch_size=8, num_workers=0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    steps = 0
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    print("steps", steps, flush=True)


if __name__ == "__main__":
    main()
