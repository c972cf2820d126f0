"""A tiny real Lightning training script for tests/test_integrations_frameworks.py: each sample
costs ``--load-ms`` to load, each training step ``--step-ms`` of compute (known, injected costs).
Without ``--callback`` it has no pipeprof in it (``pipeprof run`` adds the callback itself)."""

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


class Model(L.LightningModule):
    def __init__(self, step_ms):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        self.step_ms = step_ms
        self.seen = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append(x[:, 0].tolist())
        time.sleep(self.step_ms / 1000)  # the step's known compute
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--val-samples", type=int, default=32)
    p.add_argument("--load-ms", type=float, default=1.0)
    p.add_argument("--step-ms", type=float, default=2.0)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--callback", default=None, help="add pipeprof's callback; save its report here")
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--callback-ms", type=float, default=0.0, help="a callback's cost per step")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train_loader = DataLoader(
        Sleepy(args.samples, args.load_ms), batch_size=8, shuffle=True, num_workers=args.workers
    )
    val_loader = DataLoader(
        Sleepy(args.val_samples, args.load_ms), batch_size=8, num_workers=args.workers
    )
    model = Model(args.step_ms)
    callbacks = []
    if args.callback:
        from pipeprof.integrations.lightning import PipeprofCallback

        callbacks.append(PipeprofCallback(save=args.callback))
    if args.callback_ms:

        class Slow(L.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                time.sleep(args.callback_ms / 1000)

        callbacks.append(Slow())
    if args.raise_at >= 0:

        class Boom(L.Callback):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                if batch_idx == args.raise_at:
                    raise RuntimeError(f"boom at step {batch_idx}")

        callbacks.append(Boom())
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        callbacks=callbacks,
    )
    trainer.fit(model, train_loader, val_loader)
    print("steps", trainer.global_step, "first", model.seen[0][:4], flush=True)


if __name__ == "__main__":
    main()
