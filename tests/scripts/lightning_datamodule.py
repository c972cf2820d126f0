"""A Lightning script with a LightningDataModule, for tests/test_integrations_frameworks.py:
``fit`` (validation at each epoch's end, or ``--val-every`` training steps), then ``test`` and
``predict`` on the DataModule's own loaders. No pipeprof in it: ``pipeprof run`` adds it."""

import argparse
import time
import warnings

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

warnings.filterwarnings("ignore")  # Lightning's advice on num_workers, logging intervals...


class Sleepy(Dataset):
    def __init__(self, n, ms):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.ms / 1000)
        return torch.full((8,), float(i % 7)), i % 2


class Data(L.LightningDataModule):
    def __init__(self, samples, val_samples, load_ms):
        super().__init__()
        self.samples, self.val_samples, self.ms = samples, val_samples, load_ms

    def train_dataloader(self):
        return DataLoader(Sleepy(self.samples, self.ms), batch_size=8)

    def val_dataloader(self):
        return DataLoader(Sleepy(self.val_samples, self.ms), batch_size=8)

    def test_dataloader(self):
        return DataLoader(Sleepy(16, self.ms), batch_size=8)

    def predict_dataloader(self):
        return DataLoader(Sleepy(24, self.ms), batch_size=8)


class Model(L.LightningModule):
    def __init__(self, step_ms):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.step_ms = step_ms

    def training_step(self, batch, batch_idx):
        x, y = batch
        time.sleep(self.step_ms / 1000)
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.cross_entropy(self.net(x), y))

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0]).argmax(1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--val-samples", type=int, default=32)
    p.add_argument("--load-ms", type=float, default=2.0)
    p.add_argument("--step-ms", type=float, default=4.0)
    p.add_argument("--val-every", type=int, default=0, help="validate every N training steps")
    p.add_argument("--test", action="store_true", help="test and predict after fit")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = Data(args.samples, args.val_samples, args.load_ms)
    model = Model(args.step_ms)
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        val_check_interval=args.val_every or 1.0,
    )
    trainer.fit(model, datamodule=data)
    print("steps", trainer.global_step, flush=True)
    if args.test:
        trainer.test(model, datamodule=data, verbose=False)
        predictions = trainer.predict(model, datamodule=data)
        print("predicted", sum(len(p) for p in predictions), flush=True)


if __name__ == "__main__":
    main()
