"""Held-out script 3: a training loop the user does not own: a small trainer class with
callbacks and logging (as a framework has), iterating a training and a validation loader."""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model, callbacks, val_every=10):
        self.model, self.callbacks, self.val_every = model, callbacks, val_every
        self.opt = torch.optim.SGD(model.parameters(), lr=0.05)
        self.log = []

    def fit(self, train, val, epochs):
        for _ in range(epochs):
            for i, (x, y) in enumerate(train):
                loss = nn.functional.cross_entropy(self.model(x), y)
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                for cb in self.callbacks:
                    cb(self, loss)
                if (i + 1) % self.val_every == 0:
                    self.validate(val)

    @torch.no_grad()
    def validate(self, val):
        correct = sum(int((self.model(x).argmax(1) == y).sum()) for x, y in val)
        self.log.append(correct)


def slow_logger(trainer, loss):
    trainer.log.append(float(loss))
    time.sleep(0.002)  # a logger that writes to a remote service


class Augmented(TensorDataset):
    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        time.sleep(0.0015)  # reading from a network file system
        return x + 0.01 * torch.randn_like(x), y


p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=1)
args = p.parse_args()
xs, ys = torch.randn(1024, 32), torch.randint(0, 4, (1024,))
train_loader = DataLoader(Augmented(xs, ys), batch_size=32, shuffle=True, num_workers=args.workers)
val_loader = DataLoader(TensorDataset(xs[:256], ys[:256]), batch_size=64)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
Trainer(model, [slow_logger]).fit(train_loader, val_loader, epochs=2)
print("done")
