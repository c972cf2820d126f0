"""A small data-parallel training script for tests/test_distributed.py: plain torch, no pipeprof.

Run it as any DDP script: ``torchrun --nproc_per_node=2 ddp_train.py --slow-rank 1``. Every
rank trains a small model under DistributedDataParallel (gloo, CPU) on its shard of the data
(DistributedSampler); the slow rank's dataset sleeps ``--slow-ms`` per sample (its input
pipeline is the straggler). With ``--truth FILE`` each rank writes what it injected and how
long its loop took to ``FILE.rank<N>.json``: the truth the tests compare pipeprof with.
"""

import argparse
import json
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Samples(Dataset):
    """32-vectors; each sample sleeps ``ms`` (storage-like) and counts it."""

    def __init__(self, n, ms):
        self.n, self.ms = n, ms
        self.slept = 0.0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.ms:
            t0 = time.perf_counter()
            time.sleep(self.ms / 1000)
            self.slept += time.perf_counter() - t0
        return torch.full((32,), float(i % 5)), i % 3


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--slow-rank", type=int, default=1)
    p.add_argument("--slow-ms", type=float, default=2.0)
    p.add_argument("--step-ms", type=float, default=10.0, help="compute per step (a sleep)")
    p.add_argument("--collective", action="store_true", help="an explicit all_reduce per step")
    p.add_argument("--crash-rank", type=int, default=-1, help="this rank raises after 5 steps")
    p.add_argument("--truth", default=None)
    p.add_argument("--no-sampler", action="store_true", help="every rank reads the whole dataset")
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--stuck-rank", type=int, default=-1,
                   help="this rank sleeps --stuck-s before its 6th step's all-reduce")
    p.add_argument("--stuck-s", type=float, default=300.0)
    p.add_argument("--timeout-s", type=float, default=1800.0, help="the collectives' timeout")
    args = p.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.timeout_s))
    rank = dist.get_rank()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    data = Samples(args.samples, args.slow_ms if rank == args.slow_rank else 0.0)
    if args.no_sampler:  # the bug: each rank reads all of it
        loader = DataLoader(data, batch_size=args.batch, shuffle=args.shuffle,
                            num_workers=args.workers)  # fmt: skip
    else:
        sampler = DistributedSampler(data, shuffle=args.shuffle)
        loader = DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=args.workers)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 3)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps, waited = 0, 0.0
    t0 = time.perf_counter()
    it = iter(loader)
    while True:
        t_ask = time.perf_counter()
        try:
            x, y = next(it)
        except StopIteration:
            break
        waited += time.perf_counter() - t_ask
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_ms / 1000)  # the model's compute, made known
        if steps == 5 and rank == args.stuck_rank:
            time.sleep(args.stuck_s)  # never reaches the all-reduce below (in time)
        if args.collective:
            dist.all_reduce(loss.detach().clone())
        steps += 1
        if steps == 5 and rank == args.crash_rank:
            raise RuntimeError(f"rank {rank} crashed")
    loop_s = time.perf_counter() - t0
    if args.truth:
        with open(f"{args.truth}.rank{rank}.json", "w") as f:
            weights = float(sum(p.detach().sum() for p in model.parameters()))
            json.dump({"rank": rank, "steps": steps, "injected_s": data.slept, "waited_s": waited,
                       "loop_s": loop_s, "weight_sum": weights}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
