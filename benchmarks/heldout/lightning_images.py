"""Held-out script 6: a Lightning image classifier, as its tutorials write one.

A LightningDataModule over in-memory uint8 images with torchvision's v2 augmentations, a small
CNN, a validation loader checked each epoch, on the CPU. Its own meter is a callback that times
each epoch and the gap before each training batch (data time, as the ImageNet example meters
it), printed as METERS.
"""

import argparse
import json
import time
import warnings

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

warnings.filterwarnings("ignore")
p = argparse.ArgumentParser()
p.add_argument("--workers", type=int, default=1)
p.add_argument("--epochs", type=int, default=2)
args = p.parse_args()
torch.set_num_threads(1)


class Pictures(Dataset):
    def __init__(self, n, train):
        g = torch.Generator().manual_seed(n)
        self.images = torch.randint(0, 256, (n, 3, 72, 72), dtype=torch.uint8, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)
        aug = [v2.RandomResizedCrop(64, antialias=True), v2.RandomHorizontalFlip(),
               v2.ColorJitter(0.3, 0.3, 0.3)] if train else [v2.CenterCrop(64)]
        self.tf = v2.Compose([*aug, v2.ToDtype(torch.float32, scale=True),
                              v2.Normalize([0.5] * 3, [0.25] * 3)])

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.tf(self.images[i]), self.labels[i]


class Data(L.LightningDataModule):
    def setup(self, stage):
        self.train, self.val = Pictures(1536, True), Pictures(256, False)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=32, shuffle=True, num_workers=args.workers)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=64, num_workers=args.workers)


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
            nn.Linear(32, 10))

    def training_step(self, batch, _):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, _):
        x, y = batch
        self.log("val_acc", (self.net(x).argmax(1) == y).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Meter(L.Callback):
    def __init__(self):
        self.epoch_s = self.data_s = 0.0
        self.samples, self.last = 0, None

    def on_train_epoch_start(self, trainer, module):
        self.t0 = self.last = time.perf_counter()

    def on_train_batch_start(self, trainer, module, batch, i):
        self.data_s += time.perf_counter() - self.last
        self.samples += len(batch[1])

    def on_train_batch_end(self, trainer, module, outputs, batch, i):
        self.last = time.perf_counter()

    def on_train_epoch_end(self, trainer, module):
        self.epoch_s += self.last - self.t0  # up to the last batch: validation apart


meter = Meter()
trainer = L.Trainer(max_epochs=args.epochs, accelerator="cpu", logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, callbacks=[meter])
trainer.fit(Net(), datamodule=Data())
print("METERS", json.dumps({"samples_per_s": meter.samples / meter.epoch_s,
                            "data_fraction": meter.data_s / meter.epoch_s}))
