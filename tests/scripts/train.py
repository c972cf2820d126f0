"""A small training script for the tests of ``pipeprof run`` (tests/test_run.py): run as it is,
no pipeprof in it unless ``--profiler`` asks for the hand-written way."""

import argparse
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Sleepy(Dataset):
    """Each sample costs ``ms`` of waiting (storage-like) and is an 8-vector."""

    def __init__(self, n, ms):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.ms / 1000)
        return torch.full((8,), float(i % 7)), i % 2


def child_loop():
    it = iter(DataLoader(Sleepy(32, 0), batch_size=8))
    n = sum(len(x) for x, _ in it)
    print("child saw", n, "through", type(it).__name__, flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--samples", type=int, default=128)
    p.add_argument("--load-ms", type=float, default=1.0)
    p.add_argument("--step-ms", type=float, default=2.0)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--context", default=None)
    p.add_argument("--val-every", type=int, default=0)
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--forever", action="store_true")
    p.add_argument("--zip", action="store_true")
    p.add_argument("--exit", type=int, default=0)
    p.add_argument("--profiler", default=None, help="profile by hand, save the report here")
    p.add_argument("--layers", type=int, default=1, help="hidden layers of the model")
    p.add_argument("--time", action="store_true", help="print the training loop's seconds")
    p.add_argument("--fork", action="store_true", help="a forked child iterates a loader too")
    p.add_argument("--new-loader", action="store_true", help="a new DataLoader every epoch")
    args = p.parse_args()
    print("argv", sys.argv[1:], flush=True)
    if args.fork:
        import multiprocessing

        child = multiprocessing.get_context("fork").Process(target=child_loop)
        child.start()
        child.join()
        print("child exit", child.exitcode, flush=True)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # steadier step times on a small shared machine
    train_loader = DataLoader(
        Sleepy(args.samples, args.load_ms),
        batch_size=16,
        num_workers=args.workers,
        multiprocessing_context=args.context,
    )
    val_loader = DataLoader(
        Sleepy(32, args.load_ms),
        batch_size=16,
        num_workers=min(1, args.workers),
        multiprocessing_context=args.context,
    )
    hidden = [m for _ in range(args.layers) for m in (nn.Linear(16, 16), nn.ReLU())]
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), *hidden, nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = train_loader
    if args.profiler:
        import pipeprof

        prof = pipeprof.Profiler()
        data = prof.wrap(train_loader)
    if args.zip:
        data = zip(train_loader, val_loader)
    step = epoch = 0
    t0 = time.perf_counter()
    while epoch < args.epochs or args.forever:
        if args.new_loader:
            data = DataLoader(
                Sleepy(args.samples, args.load_ms), batch_size=16, num_workers=args.workers
            )
        for batch in data:
            x, y = batch[0] if args.zip else batch
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(args.step_ms / 1000)
            step += 1
            if step == args.raise_at:
                raise RuntimeError(f"boom at step {step}")
            if args.val_every and step % args.val_every == 0:
                with torch.no_grad():
                    for xv, _ in val_loader:
                        model(xv)
            if args.forever and step == 3:
                print("running", flush=True)
        print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)
        epoch += 1
    if args.time:
        print(f"loop_s {time.perf_counter() - t0:.6f} steps {step}", flush=True)
    if args.profiler:
        prof.stop()
        prof.report().save(args.profiler)
    sys.exit(args.exit)


if __name__ == "__main__":
    main()
